"""ckptio for Python: save and load safetensors and PyTorch checkpoints
through libckptio (ctypes, no compiled extension).

    import ckptio, numpy as np
    ckptio.save_file({"w": np.ones((2, 3), np.float32)}, "m.safetensors", metadata={"step": "7"})
    tensors = ckptio.load_file("m.safetensors")      # {"w": array(...)}, CRCs checked
    ckptio.verify("m.safetensors")                   # raises ckptio.CkptioChecksumError on a bad CRC

The functions here are ckptio.numpy's (call-compatible with
safetensors.numpy), but safe_open, which serves torch or numpy by its
framework as safetensors.safe_open does; torch tensors (CPU and CUDA,
safetensors.torch's API, async and sharded saves) are ckptio.torch's; a
directory of checkpoints for a training loop is
ckptio.manager.CheckpointManager. Failures raise the classes of
ckptio.errors, rooted at CkptioError and each also the builtin Python code
catches (FileNotFoundError, KeyError, ValueError, ...); those that are no
OSError are also ckptio.SafetensorError, as safetensors raises them.
ckptio.__version__ is the library's version.

The library is the path in the environment variable CKPTIO_LIB, else the
copy inside the package (the wheel), else build/libckptio.so of this
repository, else libckptio.so.1 from the loader's path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Union, overload

from . import _lib
from . import numpy as _numpy
from ._core import FRAMEWORKS, SNAPSHOT_AUTO, PathLike, configure, prepare
from ._lib import ERRORS
from .errors import (ChecksumError, CkptioChecksumError, CkptioError, CkptioFileExistsError,
                     CkptioFileNotFoundError, CkptioFormatError, CkptioIsADirectoryError,
                     CkptioNotADirectoryError, CkptioOSError, CkptioPermissionError, CkptioRuntimeError,
                     CkptioSafetensorError, CkptioTensorNotFoundError, CkptioTypeError, CkptioValueError,
                     FormatError, SafetensorError, TensorNotFoundError)
from .numpy import NUMPY_DTYPES, Tensor, load, load_file, load_metadata, save, save_file, verify

if TYPE_CHECKING:
    from ._torch_io import Device
    from .torch import safe_open as TorchSafeOpen

__all__ = ["save", "save_file", "load", "load_file", "load_metadata", "verify", "safe_open",
           "Tensor", "configure", "prepare", "SNAPSHOT_AUTO", "E_CHECKSUM", "ERRORS", "NUMPY_DTYPES",
           "version", "__version__", "CkptioError", "CkptioOSError", "CkptioFileNotFoundError",
           "CkptioPermissionError", "CkptioFileExistsError", "CkptioIsADirectoryError",
           "CkptioNotADirectoryError", "CkptioSafetensorError", "CkptioTensorNotFoundError",
           "CkptioValueError", "CkptioFormatError", "CkptioChecksumError", "CkptioRuntimeError",
           "CkptioTypeError", "SafetensorError", "TensorNotFoundError", "FormatError", "ChecksumError"]

# Read from the library when first asked for (see __getattr__).
__version__: str
E_CHECKSUM: int


def version() -> str:
    """The loaded library's version ("1.1.0"); ckptio.__version__ is the same."""
    return str(_lib.lib().ckptio_version_string().decode())


@overload
def safe_open(filename: PathLike, framework: Literal["pt", "torch", "pytorch"], device: "Device" = "cpu", *,
              backend: str = "auto") -> "TorchSafeOpen": ...
@overload
def safe_open(filename: PathLike, framework: Literal["numpy", "np"] = "numpy", device: str = "cpu", *,
              backend: str = "auto") -> _numpy.safe_open: ...
@overload
def safe_open(filename: PathLike, framework: str, device: "Device" = "cpu", *,
              backend: str = "auto") -> Union[_numpy.safe_open, "TorchSafeOpen"]: ...


def safe_open(filename: PathLike, framework: str = "numpy", device: "Device" = "cpu", *,
              backend: str = "auto") -> Union[_numpy.safe_open, "TorchSafeOpen"]:
    """A checkpoint opened for lazy access, as safetensors.safe_open: its
    framework says what get_tensor returns, "pt" (or "torch", "pytorch")
    torch tensors (ckptio.torch.safe_open, on `device`), "numpy" (or "np",
    the default) numpy arrays (ckptio.numpy.safe_open). Another framework
    raises CkptioValueError (a SafetensorError and a ValueError)."""
    if FRAMEWORKS.get(framework) == "pt":
        from .torch import safe_open as torch_safe_open  # (torch imported only when asked for)
        return torch_safe_open(filename, framework, device, backend=backend)
    if not isinstance(device, str):
        device = str(device)
    return _numpy.safe_open(filename, framework, device, backend=backend)


def _version() -> str:
    """__version__: the loaded library's, else (no library loads) the
    installed package's, which the wheel takes from the same source
    (CMakeLists.txt's project version)."""
    try:
        return version()
    except OSError as e:
        import importlib.metadata
        try:
            return importlib.metadata.version("ckptio")
        except importlib.metadata.PackageNotFoundError:
            raise AttributeError(f"ckptio.__version__: no library loads ({e}) and no installed package") from e


def __getattr__(name: str) -> Union[int, str]:
    # E_CHECKSUM and __version__ are read from the library when first asked
    # for (see ERRORS), so that importing ckptio loads nothing.
    if name == "E_CHECKSUM":
        return _lib.ERRORS["CHECKSUM"]
    if name == "__version__":
        value = globals()["__version__"] = _version()
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
