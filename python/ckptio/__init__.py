"""ckptio for Python: save and load safetensors and PyTorch checkpoints
through libckptio (ctypes, no compiled extension).

    import ckptio, numpy as np
    ckptio.save_file({"w": np.ones((2, 3), np.float32)}, "m.safetensors", metadata={"step": "7"})
    tensors = ckptio.load_file("m.safetensors")      # {"w": array(...)}, CRCs checked
    ckptio.verify("m.safetensors")                   # raises ckptio.ChecksumError on a bad CRC

The functions here are ckptio.numpy's (call-compatible with
safetensors.numpy); torch tensors (CPU and CUDA, safetensors.torch's API,
async and sharded saves) are ckptio.torch's; a directory of checkpoints for
a training loop is ckptio.manager.CheckpointManager. Failures raise the
classes of ckptio.errors, rooted at CkptioError and each also the builtin
Python code catches (FileNotFoundError, KeyError, ValueError, ...).

The library is the path in the environment variable CKPTIO_LIB, else the
copy inside the package (the wheel), else build/libckptio.so of this
repository, else libckptio.so.1 from the loader's path.
"""

from __future__ import annotations

from . import _lib
from ._core import SNAPSHOT_AUTO, configure, prepare
from ._lib import ERRORS
from .errors import (ChecksumError, CkptioError, CkptioFileExistsError, CkptioFileNotFoundError,
                     CkptioIsADirectoryError, CkptioNotADirectoryError, CkptioOSError,
                     CkptioPermissionError, CkptioRuntimeError, CkptioValueError, FormatError,
                     TensorNotFoundError)
from .numpy import (NUMPY_DTYPES, Tensor, load, load_file, load_metadata, safe_open, save,
                    save_file, verify)

__all__ = ["save", "save_file", "load", "load_file", "load_metadata", "verify", "safe_open",
           "Tensor", "configure", "prepare", "SNAPSHOT_AUTO", "E_CHECKSUM", "ERRORS", "NUMPY_DTYPES",
           "version", "CkptioError", "CkptioOSError", "CkptioFileNotFoundError",
           "CkptioPermissionError", "CkptioFileExistsError", "CkptioIsADirectoryError",
           "CkptioNotADirectoryError", "TensorNotFoundError", "CkptioValueError", "FormatError",
           "ChecksumError", "CkptioRuntimeError"]


def version() -> str:
    """The loaded library's version ("1.0.0")."""
    return str(_lib.lib().ckptio_version_string().decode())


def __getattr__(name: str) -> int:
    # E_CHECKSUM is read from the library when first asked for (see ERRORS).
    if name == "E_CHECKSUM":
        return _lib.ERRORS["CHECKSUM"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
