"""PyTorch Lightning checkpoints through ckptio: a CheckpointIO plugin.

    import lightning.pytorch as pl
    from ckptio.lightning import CheckpointIO, AsyncCheckpointIO

    trainer = pl.Trainer(plugins=[CheckpointIO()])        # or AsyncCheckpointIO()
    trainer.fit(model, data)                              # ModelCheckpoint saves through ckptio
    pl.Trainer(plugins=[CheckpointIO()]).fit(model, data, ckpt_path="epoch=1-step=8.ckpt")

Files are written by ckptio.torch.save_checkpoint: atomically, with CRC32s,
as torch.save's archive (.ckpt, .pt, ...: torch.load and Lightning's own
TorchCheckpointIO read them) or, for a path ending in .safetensors, as
safetensors with the structure in its metadata. Loads go through
ckptio.torch.load_checkpoint, which never runs pickled code.

Needs the `lightning` package (lightning.pytorch; the standalone
`pytorch_lightning` package has its own CheckpointIO class and is not
supported). Imported only when used: `import ckptio` does not import
Lightning.

Limitation: a checkpoint holds only what ckptio.torch.save_checkpoint can
write (dicts, lists, tuples, sets, str, int, float, bool, None, bytes,
torch.Size/dtype/device, tensors, numpy arrays). Lightning's own state is
all of that, but "hyper_parameters" holds whatever save_hyperparameters()
captured: an argparse.Namespace, an OmegaConf config, a module or any
other object makes the save raise TypeError naming its place (e.g.
"hyper_parameters.args"), before anything is written. Nothing is dropped
or converted: pass plain values, or leave such arguments out with
save_hyperparameters(ignore=[...]).
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Dict, Optional

from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO as _LightningCheckpointIO

from . import _lib
from . import torch as _ct
from ._torch_io import SaveHandle

__all__ = ["CheckpointIO", "AsyncCheckpointIO"]

_STORAGE_OPTIONS = ("format", "crc")


def _local(path: Any) -> str:
    text = str(os.fspath(path))
    if _lib.is_storage_path(text):
        raise ValueError(f"ckptio.lightning writes local paths only, got {text!r} "
                         "(remote fsspec paths need Lightning's TorchCheckpointIO)")
    return text


class CheckpointIO(_LightningCheckpointIO):
    """Lightning's CheckpointIO over ckptio.torch.save_checkpoint /
    load_checkpoint.

    format: "pt" or "safetensors"; None (the default) picks by the path's
        ending (".safetensors" is safetensors, anything else "pt").
    crc: record a CRC32 of every stored part (checked on load).
    map_location: where load_checkpoint puts tensors when Lightning does
        not say (it never does): "cpu" by default, as Lightning's
        TorchCheckpointIO (whose default keeps every storage on the CPU);
        Lightning then moves the states to the module's device.

    trainer.save_checkpoint(path, storage_options={"format": ..., "crc": ...})
    overrides format and crc for one save; any other option is refused.
    """

    def __init__(self, format: Optional[str] = None, crc: bool = True,
                 map_location: Any = "cpu") -> None:
        super().__init__()
        self.format = format
        self.crc = crc
        self.map_location = map_location

    def _options(self, storage_options: Optional[Any]) -> Dict[str, Any]:
        opts: Dict[str, Any] = {"format": self.format, "crc": self.crc}
        if storage_options is None:
            return opts
        if not isinstance(storage_options, dict) or any(k not in _STORAGE_OPTIONS for k in storage_options):
            raise TypeError(f"{type(self).__name__}: storage_options may only be a dict with the keys "
                            f"{', '.join(_STORAGE_OPTIONS)}, got {storage_options!r}")
        opts.update(storage_options)
        return opts

    @staticmethod
    def _refused(err: TypeError, path: str) -> TypeError:
        return TypeError(f"cannot save the Lightning checkpoint {path}: {err}. Nothing was written. "
                         "ckptio saves only plain values and tensors; if this is under "
                         "'hyper_parameters', pass plain values to the module or exclude the argument "
                         "with save_hyperparameters(ignore=[...])")

    def _start(self, checkpoint: Dict[str, Any], path: Any, storage_options: Optional[Any]) -> SaveHandle:
        text = _local(path)
        opts = self._options(storage_options)
        directory = os.path.dirname(text)
        if directory:
            os.makedirs(directory, exist_ok=True)
        try:
            return _ct.save_checkpoint_async(checkpoint, text, format=opts["format"], crc=opts["crc"])
        except TypeError as e:
            raise self._refused(e, text) from e

    def save_checkpoint(self, checkpoint: Dict[str, Any], path: Any,
                        storage_options: Optional[Any] = None) -> None:
        """Writes `checkpoint` at `path` (its directory made if missing),
        atomically; returns once the file is committed."""
        self._start(checkpoint, path, storage_options).wait_durable()

    def load_checkpoint(self, path: Any, map_location: Optional[Any] = None,
                        weights_only: Optional[bool] = None) -> Dict[str, Any]:
        """The checkpoint at `path`. map_location as torch.load's, except
        that a function is refused (a device, str, int or dict of location
        -> device); None is this plugin's map_location. weights_only is
        accepted and has no effect: ckptio never unpickles anything beyond
        torch.load(weights_only=True)'s allowlist (plus numpy arrays), so a
        checkpoint holding other objects (written by torch.save) is refused
        either way."""
        text = _local(path)
        if callable(map_location):
            raise TypeError("ckptio.lightning.CheckpointIO: map_location cannot be a function; "
                            "pass a device, a str, an int or a dict of location -> device")
        if not os.path.exists(text):
            raise FileNotFoundError(f"Checkpoint file not found: {text}")
        where = self.map_location if map_location is None else map_location
        loaded: Dict[str, Any] = _ct.load_checkpoint(text, map_location=where)
        return loaded

    def remove_checkpoint(self, path: Any) -> None:
        """Removes the file (or directory) at `path`, if there is one."""
        text = _local(path)
        if os.path.isdir(text) and not os.path.islink(text):
            shutil.rmtree(text)
        elif os.path.lexists(text):
            os.remove(text)


class AsyncCheckpointIO(CheckpointIO):
    """CheckpointIO whose saves run in the background: save_checkpoint
    returns once ckptio has snapshotted the tensors (training may then
    modify them), and the file is committed while training goes on.

    One save is in flight at a time. The next save_checkpoint, a
    load_checkpoint or remove_checkpoint, and teardown() (Lightning calls it
    when fit/validate/test end) first wait until the previous save is
    durable, and raise its error if it failed. Unlike Lightning's own
    AsyncCheckpointIO (a thread around any CheckpointIO, which clones every
    tensor first), no copy of the checkpoint is made in Python: ckptio's
    snapshot is the copy. wait() waits for the pending save explicitly.
    """

    def __init__(self, format: Optional[str] = None, crc: bool = True,
                 map_location: Any = "cpu") -> None:
        super().__init__(format=format, crc=crc, map_location=map_location)
        self._pending: Optional[SaveHandle] = None

    def wait(self) -> None:
        """Waits until the pending save (if any) is durable; raises its error."""
        handle, self._pending = self._pending, None
        if handle is not None:
            handle.wait_durable()  # frees the writer, raises the save's error

    def save_checkpoint(self, checkpoint: Dict[str, Any], path: Any,
                        storage_options: Optional[Any] = None) -> None:
        self.wait()
        handle = self._start(checkpoint, path, storage_options)
        try:
            handle.wait_snapshot()
        except BaseException:
            handle.close()  # the failed save's writer freed; its error is the one raised
            raise
        self._pending = handle

    def load_checkpoint(self, path: Any, map_location: Optional[Any] = None,
                        weights_only: Optional[bool] = None) -> Dict[str, Any]:
        self.wait()
        return super().load_checkpoint(path, map_location, weights_only)

    def remove_checkpoint(self, path: Any) -> None:
        self.wait()
        super().remove_checkpoint(path)

    def teardown(self) -> None:
        self.wait()
