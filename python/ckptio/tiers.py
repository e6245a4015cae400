"""Tiered checkpoints over a torch.distributed group (ckptio_tiers_* in
ckptio.h; docs/TIERS.md), experimental: every rank's state in its node's
memory, copies on ranks of other nodes, a durable directory and an object
storage (s3://) every few steps, and a restore from the fastest tier that
holds a whole step whose every CRC32 checks.

    tiers = TieredCheckpointManager(memory_dir=f"/dev/shm/{job}", peers=1,
                                    ranks_per_node=8, durable_dir="/ckpt/job",
                                    durable_every=10)
    step, state = tiers.restore()               # (None, {}) on a fresh start
    ...
    tiers.save(step, model.state_dict())        # collective, every rank

save and restore are collective over the group (every rank calls them, in
the same order). Each rank saves and restores its own tensors (its shard of
the model): the world size and ranks_per_node must be the save's. A save
given `places` (where each tensor lies in the job's global tensors) can
also be restored at another world size, from the durable tier:

    tiers.save(step, {"w": my_rows}, places={"w": ((4096, 1024), (r * 1024, 0))})
    ...                                         # restarted on 2 ranks:
    step, state = tiers.restore_global({"w": slice(r * 2048, (r + 1) * 2048)}) A tier
that fails warns (TierWarning) and training goes on, unless fatal=True; a
copy that fails its check on restore is skipped with a TierWarning naming
the rank, the step and the tier.
"""
from __future__ import annotations

import ctypes
import datetime
import errno
import os
import warnings
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
import torch.distributed as dist

from . import _lib
from ._core import PathLike, ctx
from ._group import Group
from ._torch_io import Device, plan, tensor_desc
from .errors import check
from .torch import load_boxes, load_file

__all__ = ["TieredCheckpointManager", "TierWarning"]


class TierWarning(UserWarning):
    """A tier's save that failed (the step is not published there), or a
    copy a restore skipped because it failed its check."""


def _dir(path: Optional[PathLike]) -> Optional[bytes]:
    return None if path is None else os.fsencode(os.fspath(path))


def _places(items: List[Any], places: Mapping[str, Tuple[Tuple[int, ...], Tuple[int, ...]]]) -> Any:
    """ckptio_tiers_place per tensor of a save, in its order: its place, or
    the whole tensor (offsets 0, global shape its own)."""
    out = (_lib.TiersPlace * max(1, len(items)))()
    for i, (name, t, _dtype, _device) in enumerate(items):
        shape, offsets = places.get(name, (tuple(t.shape), (0,) * t.dim()))
        if len(shape) != t.dim() or len(offsets) != t.dim():
            raise ValueError(f"places['{name}']: a global shape and offsets of {t.dim()} dims each, "
                             f"got {shape!r}, {offsets!r}")
        out[i].global_shape[:t.dim()] = [int(x) for x in shape]
        out[i].offsets[:t.dim()] = [int(x) for x in offsets]
    unknown = set(places) - {item[0] for item in items}
    if unknown:
        raise KeyError(f"places names tensors the state does not hold: {sorted(unknown)}")
    return out


class TieredCheckpointManager:
    """This rank's handle on the job's tiers (see the module docstring).

    memory_dir: a node-local directory (a tmpfs such as /dev/shm/JOB),
        shared by the node's ranks; None: no memory tier.
    peers: copies of each rank's state held by ranks on other nodes (over
        the group); needs memory_dir and more nodes than copies.
    ranks_per_node: ranks per machine (rank r's node is r // ranks_per_node);
        default: LOCAL_WORLD_SIZE (torchrun sets it), else 1.
    durable_dir: a local or shared directory (fsync'd); None: none.
    durable_every: a durable save when step % durable_every == 0.
    storage_dir: a storage's prefix ("s3://bucket/job"); None: none.
    storage_every: a storage save when step % storage_every == 0.
    memory_keep, durable_keep, storage_keep: steps kept per tier.
    fatal: a failing tier raises instead of warning.
    background: save returns at its snapshot point (one copy of the
        tensors when ckptio.configure(snapshot_bytes=...) covers a rank's
        state) and a thread fills the tiers while training goes on; the
        next save, restore, wait and close wait for it. The tiers then talk
        over a gloo group of their own, made here (collectively).
    group: the torch.distributed group (None: the default group, or this
        process alone when torch.distributed is not initialised).
    timeout: bounds each collective (a dead rank then fails the others)."""

    def __init__(self, memory_dir: Optional[PathLike] = None, durable_dir: Optional[PathLike] = None, *,
                 peers: int = 0, ranks_per_node: Optional[int] = None, memory_keep: int = 2,
                 durable_every: int = 1, durable_keep: int = 2, storage_dir: Optional[str] = None,
                 storage_every: int = 1, storage_keep: int = 2, fatal: bool = False,
                 background: bool = False, group: Any = None,
                 timeout: Optional[datetime.timedelta] = None) -> None:
        self._t: Optional[ctypes.c_void_p] = None  # until opened: close() and __del__ after a failed __init__
        if ranks_per_node is None:
            ranks_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if background and dist.is_available() and dist.is_initialized():
            # The finishing thread's collectives must not interleave with the
            # training loop's on one group.
            group = dist.new_group(ranks=dist.get_process_group_ranks(group) if group is not None else None,
                                   backend="gloo")
        self._group = Group(group, timeout)
        self._lib: Any = _lib.lib()
        self._warnings: List[str] = []
        o = _lib.TiersOptions(ctypes.sizeof(_lib.TiersOptions), _dir(memory_dir), memory_keep, peers,
                              ranks_per_node, _dir(durable_dir), durable_every, durable_keep, int(fatal),
                              int(background), _dir(storage_dir), storage_every, storage_keep)
        t = ctypes.c_void_p()
        check(self._lib.ckptio_tiers_open(ctx(), ctypes.byref(self._group.comm), ctypes.byref(o), ctypes.byref(t)),
              "cannot open the checkpoint tiers", self._lib.ckptio_last_open_error())
        self._t = t
        # Collected in C's callback, raised as warnings after the call returns.
        self._warn_cb = _lib.TIERS_WARN_FN(lambda arg, step, tier, code, msg: self._warnings.append(
            msg.decode(errors="replace")))
        self._lib.ckptio_tiers_set_warning(t, self._warn_cb, None)

    def _handle(self) -> ctypes.c_void_p:
        if self._t is None:
            raise ValueError("TieredCheckpointManager: closed")
        return self._t

    def _after(self, rc: int, what: str) -> None:
        pending, self._warnings = self._warnings, []
        for msg in pending:
            warnings.warn(msg, TierWarning, stacklevel=3)
        if rc < 0 and self._group.error is not None:
            raise RuntimeError(f"{what}: the group's collective failed: {self._group.error}") from self._group.error
        check(rc, what, self._lib.ckptio_tiers_last_error(self._t))

    def save(self, step: int, state_dict: Mapping[str, torch.Tensor],
             places: Optional[Mapping[str, Tuple[Tuple[int, ...], Tuple[int, ...]]]] = None) -> None:
        """Collective: this rank's tensors (CPU or CUDA) as its part of
        `step` (steps grow), into every tier due at this step; returns once
        they are published (or warned about), or in background mode once
        the tensors are copied.

        places: {name: (global_shape, offsets)}, where each tensor lies in
        the job's global tensor of its name (a tensor left out is whole:
        every rank holds it alike); the durable tier then keeps the step as
        a multi-rank checkpoint that restore_global reads at any world size."""
        t = self._handle()
        p = plan(state_dict, None)  # every check of a save_file, before any tier is touched
        if p.streams:
            torch.cuda.synchronize()  # the library copies on its own streams
        descs = (_lib.Tensor_ * max(1, len(p.tensors)))(*(tensor_desc(*item) for item in p.tensors))
        if places is None:
            rc = self._lib.ckptio_tiers_save(t, step, descs, len(p.tensors))
        else:
            rc = self._lib.ckptio_tiers_save_placed(t, step, descs, _places(p.tensors, places), len(p.tensors))
        self._after(rc, f"cannot save step {step}")

    def wait(self) -> None:
        """Collective in background mode: waits until the last save is
        published (or warned about); raises its failure with fatal=True."""
        self._after(self._lib.ckptio_tiers_wait(self._handle()), "the last save")

    def restore(self, device: Device = "cpu") -> Tuple[Optional[int], Dict[str, torch.Tensor]]:
        """Collective: (step, this rank's tensors on `device`) of the newest
        step whole and verified in some tier, or (None, {}) when there is
        none."""
        t = self._handle()
        step = ctypes.c_uint64()
        path = ctypes.create_string_buffer(4096)
        rc = self._lib.ckptio_tiers_restore(t, ctypes.byref(step), path, len(path))
        if rc == -errno.ENOENT:  # nothing whole anywhere
            self._after(0, "restore")
            return None, {}
        self._after(rc, "cannot restore")
        return int(step.value), load_file(os.fsdecode(path.value), device=device)

    def restore_into(self, state_dict: Mapping[str, torch.Tensor]) -> Optional[int]:
        """Collective: the newest step whole and verified in some tier,
        loaded straight into this rank's tensors (contiguous, CPU or CUDA,
        of the saved shapes and dtypes; a model's own parameters), each
        CRC32 checked as it lands: one pass where restore() checks the part
        and then loads it. Returns the step, or None when no step is whole
        (the tensors may then hold a skipped copy's bytes)."""
        t = self._handle()
        dests = (_lib.TiersDest * max(1, len(state_dict)))()
        for i, (name, x) in enumerate(state_dict.items()):
            if not isinstance(x, torch.Tensor) or not x.is_contiguous():
                raise ValueError(f"restore_into: {name!r} must be a contiguous torch.Tensor to load into")
            device = x.device.index + 1 if x.device.type == "cuda" else _lib.DEVICE_HOST
            dests[i] = _lib.TiersDest(name.encode(), x.data_ptr(), x.numel() * x.element_size(), device)
        step = ctypes.c_uint64()
        rc = self._lib.ckptio_tiers_restore_load(t, ctypes.byref(step), dests, len(state_dict))
        if rc == -errno.ENOENT:
            self._after(0, "restore_into")
            return None
        self._after(rc, "cannot restore")
        return int(step.value)

    def restore_global(self, boxes: Mapping[str, Any], device: Device = "cpu"
                       ) -> Tuple[Optional[int], Dict[str, torch.Tensor]]:
        """Collective, at any world size: (step, this rank's boxes) of the
        newest step saved with places, in the durable tier or the storage,
        whose every CRC32 checks, or (None, {}) when there is none. boxes is ckptio.torch.load_boxes'
        ({name: None for the whole tensor, or slices of its dimensions})."""
        t = self._handle()
        step = ctypes.c_uint64()
        path = ctypes.create_string_buffer(4096)
        rc = self._lib.ckptio_tiers_restore_global(t, ctypes.byref(step), path, len(path))
        if rc == -errno.ENOENT:
            self._after(0, "restore_global")
            return None, {}
        self._after(rc, "cannot restore at this world size")
        return int(step.value), load_boxes(os.fsdecode(path.value), boxes, device=device)

    def stats(self) -> Dict[str, Any]:
        """This rank's counters: bytes saved and restored per tier (memory,
        peers, durable, storage), copies skipped, tier saves that failed."""
        s = _lib.TiersStats(ctypes.sizeof(_lib.TiersStats))
        check(self._lib.ckptio_tiers_stats_get(self._handle(), ctypes.byref(s)), "stats")
        return {"saved_bytes": dict(zip(_lib.TIERS, s.saved_bytes)),
                "restored_bytes": dict(zip(_lib.TIERS, s.restored_bytes)),
                "skipped_copies": s.skipped_copies, "failed_tier_saves": s.failed_tier_saves}

    def close(self) -> None:
        """Waits for the last save (collective in background mode), then frees the handle."""
        if self._t is not None:
            self._lib.ckptio_tiers_close(self._t)
            self._t = None

    def __enter__(self) -> "TieredCheckpointManager":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
