"""Group loads for ckptio.torch (load_file, load_boxes and load_model with
group=): every rank of a torch.distributed group asks for its own boxes of
one checkpoint, and each stored byte any of them needs is read once for
the group: ranks sharing one machine's page cache and one local file that
fits in it each load as they would alone (the kernel reads each page once
for all of them, and a mapped load copies nothing); otherwise one rank
reads each byte and the ranks exchange exactly what each asked for
(ckptio_reader_load_boxes_group)."""
from __future__ import annotations

import datetime
import os
from typing import Callable, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from . import _lib
from ._core import PathLike
from ._group import Group
from ._torch_io import Device, TorchReader
from .errors import from_code

# One box: tensor index, start, stop, and the tensor to read into (None: a new one).
Box = Tuple[int, Sequence[int], Sequence[int], Optional[torch.Tensor]]
# What a rank asks for by name: None for the whole tensor, else slices
# (start:stop, step 1) of its leading dimensions.
Want = Optional[Union[slice, Sequence[slice]]]


def box_of(r: TorchReader, name: str, want: Want) -> Box:
    """The box of tensor `name` that `want` selects."""
    i = r.by_name.get(name)
    if i is None:
        raise from_code(_lib.ERRORS["NOT_FOUND"], f"{r.shown}: no tensor {name!r}")
    info = r.entries[i]
    shape = list(info.shape[:info.ndim])
    start, stop = [0] * len(shape), list(shape)
    slices = [] if want is None else [want] if isinstance(want, slice) else list(want)
    if len(slices) > len(shape):
        raise from_code(_lib.ERRORS["INVALID_ARG"],
                        f"{r.shown}: tensor {name!r} has {len(shape)} dimensions, {len(slices)} slices given")
    for d, s in enumerate(slices):
        if not isinstance(s, slice):
            raise TypeError(f"tensor {name!r}: dimension {d}: expected a slice, got {type(s).__name__}")
        a, b, step = s.indices(shape[d])
        if step != 1:
            raise from_code(_lib.ERRORS["INVALID_ARG"], f"{r.shown}: tensor {name!r}: slices take step 1")
        start[d], stop[d] = a, max(a, b)
    return i, start, stop, None


def cache_key(r: TorchReader, filename: PathLike) -> Optional[Tuple[str, int, int]]:
    """What ranks sharing this machine's page cache and this local file
    agree on (the kernel's boot id, the file's device and inode), when the
    checkpoint fits in that cache; else None."""
    path = os.fsdecode(filename)
    if _lib.is_storage_path(path) or not r.cacheable():
        return None
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        st = os.stat(path)
    except OSError:
        return None
    return boot, st.st_dev, st.st_ino


def run(filename: PathLike, device: Device, boxes_of: Callable[[TorchReader], List[Box]],
        group: Optional[dist.ProcessGroup], staging_bytes: Optional[int],
        timeout: Optional[datetime.timedelta], exchange: bool = False
        ) -> Tuple[bool, List[torch.Tensor]]:
    """Collective: opens filename, asks boxes_of(reader) for this rank's
    boxes and loads them as one group. A rank that cannot open the file or
    name its boxes fails every rank, naming it, before any byte is read
    (the others would otherwise wait for it). group None: this process
    alone. Returns (shared, tensors): shared when every rank shares this
    machine's page cache and the file (and exchange is off): the caller
    may then load as it would alone (the kernel reads each page once for
    all), and tensors is empty."""
    g = Group(group, timeout, alone=group is None)
    r: Optional[TorchReader] = None
    boxes: List[Box] = []
    why: Optional[str] = None
    key: Optional[Tuple[str, int, int]] = None
    try:
        r = TorchReader(filename, device, False)
        r.index()
        boxes = boxes_of(r)
        key = cache_key(r, filename)
    except Exception as e:  # noqa: BLE001 - every rank learns it below
        why = f"{type(e).__name__}: {e}"
        failure: BaseException = e
    seen: List[Tuple[Optional[str], Optional[Tuple[str, int, int]]]] = [(why, key)]
    if g.size > 1:
        seen = [(None, None)] * g.size
        dist.all_gather_object(seen, (why, key), group=g.group)
        for rank, (w, _) in enumerate(seen):
            if w is not None and why is None:
                if r is not None:
                    r.close()
                raise from_code(_lib.ERRORS["RANK"],
                                f"{os.fsdecode(filename)}: group load: rank {rank} of {g.size} failed: {w}")
    if why is not None or r is None:
        raise failure
    try:
        if not exchange and g.size > 1 and key is not None and all(k == key for _, k in seen):
            return True, []
        return False, r.load_group(boxes, g, staging_bytes, exchange)
    finally:
        r.close()


def named(filename: PathLike, device: Device, wants: Optional[Mapping[str, Want]],
          group: Optional[dist.ProcessGroup], staging_bytes: Optional[int],
          timeout: Optional[datetime.timedelta], exchange: bool,
          alone: Callable[[], "dict[str, torch.Tensor]"]) -> "dict[str, torch.Tensor]":
    """{name: tensor} of the boxes `wants` names (None: every tensor whole,
    in file order); alone() where the ranks share the page cache."""
    names: List[str] = []

    def boxes_of(r: TorchReader) -> List[Box]:
        chosen = wants if wants is not None else {info.name.decode(): None for info in r.entries}
        names.extend(chosen)
        return [box_of(r, name, want) for name, want in chosen.items()]

    shared, tensors = run(filename, device, boxes_of, group, staging_bytes, timeout, exchange)
    return alone() if shared else dict(zip(names, tensors))
