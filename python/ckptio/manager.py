"""A checkpoint directory for a training loop (ckptio_manager_* in ckptio.h):
one step directory per checkpoint, published only once durable, a "latest"
record, keep-last-K / keep-every-N, and resume from the newest complete one.
The directory may be an object storage prefix ("s3://bucket/ckpts"), with
the same guarantees (the manager section of ckptio.h, "On a storage").

    mgr = CheckpointManager("ckpts", keep_last=3)
    step, _ = mgr.load_latest(into=model)          # (None, None) on a fresh run
    for step in range(step + 1 if step is not None else 0, steps):
        ...
        if step % 1000 == 0:
            handle = mgr.save_async(model.state_dict(), step)
            ...                                    # forward / backward
            handle.wait_snapshot()                 # before the next optimizer.step
    mgr.close()                                    # waits for the last save

The saves are ckptio.torch's (save_file_async / save_torch_state_dict_async):
the same SaveHandle, tensors on CPU or CUDA. The ctypes prototypes of the
manager calls live here, set on the library handle the first time a manager
is made.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import threading
import warnings
import weakref
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple, Union

import torch

from . import _lib
from ._core import PathLike, ctx, options
from ._torch_io import Device, SaveHandle, WriterOps, fill_and_commit, plan
from .errors import check
from .torch import load_file, parse_size

__all__ = ["CheckpointManager", "CheckpointInfo", "CheckpointWarning"]


class CheckpointWarning(UserWarning):
    """A checkpoint skipped on resume (incomplete or corrupt, named in the
    message), a stale or missing "latest" record, or a step directory that
    retention could not remove."""


class CheckpointInfo(NamedTuple):
    """One checkpoint of the directory (CheckpointManager.list): step; path
    (what ckptio.torch.load_file takes: the file, or a set's index); dir (its
    step directory); bytes and files on disk; complete (it opens: every
    header checked, every shard present); verified (list(verify=True): every
    CRC32 checked); error (why not complete / verified, else "")."""
    step: int
    path: str
    dir: str
    bytes: int
    files: int
    complete: bool
    verified: bool
    error: str


# Managers still open at exit are closed (their last save waited for) before
# the context goes: registered after ckptio's own exit hook, so it runs first.
_live: "weakref.WeakSet[CheckpointManager]" = weakref.WeakSet()
_exit_lock = threading.Lock()
_exit_done = False


def _close_live() -> None:
    for m in list(_live):
        m.close()


class _ManagedOps(WriterOps):
    """ckptio.torch's writer calls, except that closing the writer ends the
    managed save (ckptio_manager_save_end: wait durable, publish, latest,
    retention), so SaveHandle.wait_durable returns once it is published."""

    def __init__(self, mgr: "CheckpointManager") -> None:
        super().__init__()
        self._mgr = mgr

    def close(self, w: ctypes.c_void_p) -> int:
        return self._mgr._end(w)

    def close_detail(self, w: ctypes.c_void_p) -> Optional[bytes]:
        """The detail of a failed close (SaveHandle puts it in its error)."""
        return self._mgr._end_detail


class CheckpointManager:
    """A directory of checkpoints, one per step (see the module docstring and
    the manager section of ckptio.h for the crash-safety rules).

    directory: created (one level) when missing; or an object storage
        prefix, "s3://bucket/ckpts" (nothing created; a missing bucket or
        wrong credentials fail here, naming the URL).
    keep_last: keep this many newest complete checkpoints; None keeps all.
        Older ones are removed only after a new one is durable, never the
        newest complete one.
    keep_every: also keep every checkpoint whose step is a multiple of this.
    max_shard_size: None for one safetensors file per checkpoint, else a
        Hugging Face sharded set with shards of at most this (int bytes, or
        "5GB" / "500MiB" as ckptio.torch.parse_size).
    format: "safetensors" or "pt" (single-file checkpoints only).
    verify: latest() / load_latest() also check every CRC32 of the
        checkpoint they pick (a full read) and fall back past a failing one.
    crc: record CRC32s on save.

    Warnings (CheckpointWarning) name every checkpoint skipped on resume.
    One thread at a time; the SaveHandle's methods from any thread. One
    saving process per directory (a second one gets -EBUSY on save; on a
    storage there is no lock, and keeping to one is the caller's)."""

    def __init__(self, directory: PathLike, keep_last: Optional[int] = 3,
                 keep_every: Optional[int] = None,
                 max_shard_size: Union[int, str, None] = None, format: str = "safetensors",
                 verify: bool = False, crc: bool = True) -> None:
        if keep_last is not None and (not isinstance(keep_last, int) or keep_last < 1):
            raise ValueError(f"keep_last must be an int >= 1 or None, got {keep_last!r}")
        if keep_every is not None and (not isinstance(keep_every, int) or keep_every < 1):
            raise ValueError(f"keep_every must be an int >= 1 or None, got {keep_every!r}")
        code = _lib.format_code(format)
        self.directory = os.fsdecode(os.fspath(directory))
        self._lock = threading.RLock()
        self._m: Optional[ctypes.c_void_p] = None
        self._pending: Optional[SaveHandle] = None
        self._warnings: List[str] = []
        self._end_detail: Optional[bytes] = None
        lib = _lib.lib()
        context = ctx()
        mo = _lib.ManagerOptions(ctypes.sizeof(_lib.ManagerOptions), keep_last or 0,
                                 keep_every or 0, code,
                                 0 if max_shard_size is None else parse_size(max_shard_size),
                                 1 if verify else 0)
        opts = options(context, crc)
        m = ctypes.c_void_p()
        check(lib.ckptio_manager_open(context, os.fsencode(self.directory), ctypes.byref(mo),
                                      ctypes.byref(opts), ctypes.byref(m)),
              f"cannot open the checkpoint directory {self.directory}",
              lib.ckptio_last_open_error(), self.directory)
        self._m = m
        self._lib: Any = lib
        # Warnings are collected in C's callback and raised by Python after
        # the call returns (an exception cannot cross the ctypes callback).
        self._warn_cb = _lib.WARN_FN(lambda arg, step, code, msg: self._warnings.append(
            msg.decode(errors="replace")))
        lib.ckptio_manager_set_warning(m, self._warn_cb, None)
        global _exit_done
        with _exit_lock:
            if not _exit_done:
                atexit.register(_close_live)
                _exit_done = True
        _live.add(self)

    # ------------------------------------------------------------ internals

    def _handle(self) -> ctypes.c_void_p:
        if self._m is None:
            raise ValueError("CheckpointManager: closed")
        return self._m

    def _flush_warnings(self) -> None:
        pending, self._warnings = self._warnings, []
        for msg in pending:
            warnings.warn(msg, CheckpointWarning, stacklevel=3)

    def _fail(self, rc: int, what: str) -> None:
        check(rc, what, self._lib.ckptio_manager_last_error(self._m))

    def _end(self, w: ctypes.c_void_p) -> int:
        """ops.close of a managed SaveHandle: ends the save (any thread)."""
        with self._lock:
            rc = int(self._lib.ckptio_manager_save_end(self._m, w))
            self._end_detail = self._lib.ckptio_manager_last_error(self._m) if rc < 0 else None
            return rc

    # ---------------------------------------------------------------- saves

    def save_async(self, state_dict: Mapping[str, torch.Tensor], step: int,
                   metadata: Optional[Dict[str, str]] = None) -> SaveHandle:
        """Starts the checkpoint of `step` (an int >= 0) and returns a
        ckptio.torch.SaveHandle: wait_snapshot() once the tensors may change
        (call it before the next optimizer.step), wait_durable() once the
        checkpoint is durable and published (then "latest" names it and
        retention has run). A save still running from an earlier call is
        waited for first (its error, if any, is raised here)."""
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        self.wait()
        p = plan(state_dict, metadata)
        with self._lock:
            m = self._handle()
            w = ctypes.c_void_p()
            self._fail(self._lib.ckptio_manager_save_begin(m, step, ctypes.byref(w)),
                       f"cannot start the checkpoint of step {step} in {self.directory}")
            shown = os.path.join(self.directory, f"step-{step:08d}")
            handle = fill_and_commit(w, shown, p, _ManagedOps(self))
            self._pending = handle
        return handle

    def save(self, state_dict: Mapping[str, torch.Tensor], step: int,
             metadata: Optional[Dict[str, str]] = None) -> None:
        """save_async, then wait_durable: returns once published."""
        self.save_async(state_dict, step, metadata).wait_durable()

    def wait(self) -> None:
        """Waits for the running save (if any) to be published; raises its
        CkptioError if it failed."""
        handle, self._pending = self._pending, None
        if handle is not None:
            try:
                handle.wait_durable()
            finally:
                self._flush_warnings()

    # --------------------------------------------------------------- resume

    def latest_path(self) -> Tuple[Optional[int], Optional[str]]:
        """(step, path) of the newest complete checkpoint (with verify, also
        CRC-verified), or (None, None). Skipped ones are named in a
        CheckpointWarning."""
        with self._lock:
            m = self._handle()
            step = ctypes.c_uint64()
            buf = ctypes.create_string_buffer(4096 + len(os.fsencode(self.directory)))
            rc = self._lib.ckptio_manager_latest(m, ctypes.byref(step), buf, len(buf))
            try:
                self._fail(rc, f"cannot find the latest checkpoint in {self.directory}")
            finally:
                self._flush_warnings()
        if rc == 0:
            return None, None
        return step.value, os.fsdecode(buf.value)

    def latest(self) -> Optional[int]:
        """The step of the newest complete checkpoint, or None."""
        return self.latest_path()[0]

    def load_latest(self, into: Union[torch.nn.Module, Dict[str, torch.Tensor], None] = None,
                    device: Device = "cpu", strict: bool = True,
                    mmap: bool = False) -> Tuple[Optional[int], Optional[Dict[str, torch.Tensor]]]:
        """Loads the newest complete checkpoint: (step, state_dict), or
        (None, None) when there is none. With `into`, a torch.nn.Module
        (load_state_dict(strict=strict)) or a dict of tensors (each copied in
        place; with strict the names must match exactly), which is filled as
        well. device / mmap as ckptio.torch.load_file (mmap off by default:
        a training loop usually writes the loaded tensors)."""
        step, path = self.latest_path()
        if step is None or path is None:
            return None, None
        sd = load_file(path, device=device, backend="mmap" if mmap else "pread")
        if into is not None:
            if isinstance(into, torch.nn.Module):
                into.load_state_dict(sd, strict=strict)
            elif isinstance(into, dict):
                if strict and set(into) != set(sd):
                    missing, extra = sorted(set(into) - set(sd)), sorted(set(sd) - set(into))
                    raise KeyError(f"checkpoint of step {step} ({path}) does not match: "
                                   f"missing {missing}, unexpected {extra}")
                for name, t in sd.items():
                    if name in into:
                        into[name].copy_(t)
            else:
                raise TypeError("into must be a torch.nn.Module or a dict of tensors, "
                                f"got {type(into).__name__}")
        return step, sd

    def list(self, verify: bool = False) -> List[CheckpointInfo]:
        """Every checkpoint of the directory, oldest first, as CheckpointInfo;
        verify=True reads each whole and checks its CRC32s."""
        with self._lock:
            m = self._handle()
            n = int(self._lib.ckptio_manager_list(m, 1 if verify else 0))
            self._fail(n, f"cannot list {self.directory}")
            out = []
            for i in range(n):
                info = _lib.CheckpointInfo_(ctypes.sizeof(_lib.CheckpointInfo_))
                self._fail(self._lib.ckptio_manager_checkpoint(m, i, ctypes.byref(info)),
                           f"checkpoint {i}")
                out.append(CheckpointInfo(info.step, os.fsdecode(info.path), os.fsdecode(info.dir),
                                          info.bytes, info.files, bool(info.complete),
                                          bool(info.verified),
                                          info.detail.decode(errors="replace") if info.error
                                          else ""))
            return out

    # ---------------------------------------------------------------- close

    def close(self) -> None:
        """Waits for the running save (publishing it), then releases the
        directory. Idempotent; a failed last save is raised here."""
        try:
            self.wait()
        finally:
            with self._lock:
                if self._m is not None:
                    self._lib.ckptio_manager_close(self._m)
                    self._m = None
                    _live.discard(self)

    def __enter__(self) -> "CheckpointManager":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing to report to in a finalizer
            pass

    def __repr__(self) -> str:
        return f"<ckptio.manager.CheckpointManager {self.directory!r}>"
