"""Group loads for ckptio.torch (load_file, load_boxes and load_model with
group=): every rank of a torch.distributed group asks for its own boxes of
one checkpoint, each stored byte any of them needs is read once by one
rank, and the ranks exchange exactly what each asked for
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


def run(filename: PathLike, device: Device, boxes_of: Callable[[TorchReader], List[Box]],
        group: Optional[dist.ProcessGroup], staging_bytes: Optional[int],
        timeout: Optional[datetime.timedelta], exchange: bool = False) -> Tuple[TorchReader, List[torch.Tensor]]:
    """Collective: opens filename, asks boxes_of(reader) for this rank's
    boxes and loads them as one group. A rank that cannot open the file or
    name its boxes fails every rank, naming it, before any byte is read
    (the others would otherwise wait for it). group None: this process
    alone."""
    g = Group(group, timeout, alone=group is None)
    r: Optional[TorchReader] = None
    boxes: List[Box] = []
    why: Optional[str] = None
    try:
        r = TorchReader(filename, device, False)
        r.index()
        boxes = boxes_of(r)
    except Exception as e:  # noqa: BLE001 - every rank learns it below
        why = f"{type(e).__name__}: {e}"
        failure: BaseException = e
    if g.size > 1:
        seen: List[Optional[str]] = [None] * g.size
        dist.all_gather_object(seen, why, group=g.group)
        for rank, w in enumerate(seen):
            if w is not None and why is None:
                if r is not None:
                    r.close()
                raise from_code(_lib.ERRORS["RANK"],
                                f"{os.fsdecode(filename)}: group load: rank {rank} of {g.size} failed: {w}")
    if why is not None or r is None:
        raise failure
    try:
        return r, r.load_group(boxes, g, staging_bytes, exchange)
    finally:
        r.close()


def named(filename: PathLike, device: Device, wants: Optional[Mapping[str, Want]],
          group: Optional[dist.ProcessGroup], staging_bytes: Optional[int],
          timeout: Optional[datetime.timedelta], exchange: bool = False) -> "dict[str, torch.Tensor]":
    """{name: tensor} of the boxes `wants` names (None: every tensor whole,
    in file order)."""
    names: List[str] = []

    def boxes_of(r: TorchReader) -> List[Box]:
        chosen = wants if wants is not None else {info.name.decode(): None for info in r.entries}
        names.extend(chosen)
        return [box_of(r, name, want) for name, want in chosen.items()]

    _, tensors = run(filename, device, boxes_of, group, staging_bytes, timeout, exchange)
    return dict(zip(names, tensors))
