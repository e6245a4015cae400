"""Partial loads for ckptio.torch: safe_open(...).get_slice(name) returns a
TorchSlice, as safetensors' get_slice does, that reads only the bytes of the
slice asked for (ckptio_reader_load_slices) and plans tensor-parallel reads
(ckptio_reader_plan_rank).

    with ckptio.torch.safe_open("m.safetensors", framework="pt") as f:
        s = f.get_slice("w")          # nothing read yet
        s.get_shape(), s.get_dtype()  # [4096, 4096], "BF16"
        part = s[:, 1024:2048]        # reads 4096 runs of 2 KiB

A key slices at most ONE dimension, with step 1: integers (that dimension
dropped, as in torch), start:stop slices (clamped like Python's), ':' and
'...' for the others. A partial slice cannot be checked against the
tensor's CRC32; `verified` says whether the last one was (only a slice
that is the whole tensor is)."""

from __future__ import annotations

import ctypes
from typing import Any, List, Optional, Tuple

import torch

from . import _lib
from ._core import parse_slice_key
from ._torch_io import TORCH_DTYPES, TorchReader, before_device_writes
from .errors import from_code

__all__ = ["TorchSlice"]


class TorchSlice:
    """One tensor of an open file, loaded a slice at a time. Valid while the
    safe_open it came from is open."""

    def __init__(self, reader: TorchReader, index: int) -> None:
        self._r = reader
        self._i = index
        info = reader.entries[index]
        self.name = info.name.decode()
        self._shape: Tuple[int, ...] = tuple(info.shape[:info.ndim])
        self._dtype_name = reader.dtype_name(info)
        self.verified: Optional[bool] = None   # of the last load; None before any
        self.bytes_read: Optional[int] = None  # of the last load: bytes taken from the file

    def get_shape(self) -> List[int]:
        """The tensor's shape, as a list (safetensors' get_slice API)."""
        return list(self._shape)

    def get_dtype(self) -> str:
        """The safetensors dtype name ("F32", "BF16", ...)."""
        return self._dtype_name

    @property
    def shape(self) -> torch.Size:
        """The tensor's shape."""
        return torch.Size(self._shape)

    @property
    def dtype(self) -> Optional[torch.dtype]:
        """The torch dtype, or None when torch has none (F4, F6)."""
        return TORCH_DTYPES.get(self._dtype_name)

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    def _where(self) -> str:
        return f"{self._r.shown}: tensor {self.name!r}"

    def _parse(self, key: Any) -> Tuple[Optional[int], int, int, bool]:
        """(dim, start, stop, drop) of a key; dim None for the whole tensor."""
        return parse_slice_key(self._shape, key, self._where())

    def __getitem__(self, key: Any) -> torch.Tensor:
        """The slice `key` of the tensor, read from the file (see the
        module's docstring for the keys)."""
        r = self._r
        if r.handle is None:
            raise ValueError("get_slice: the file is closed")
        dtype = TORCH_DTYPES.get(self._dtype_name)
        if dtype is None:
            raise from_code(_lib.ERRORS["DTYPE"], f"{self._where()} is {self._dtype_name}, which has "
                              "no torch dtype")
        dim, start, stop, drop = self._parse(key)
        if dim is None:  # the whole tensor, through dim 0 so the CRC is checked
            if not self._shape:
                return r.load([self._i])[self.name]
            dim, start, stop = 0, 0, self._shape[0]
        shape = list(self._shape)
        shape[dim] = stop - start
        out = torch.empty(shape, dtype=dtype, device=r.device)
        nbytes = r.check(r.lib.ckptio_reader_slice_nbytes(r.handle, self._i, dim, start, stop),
                         f"slice of {self.name!r}")
        if nbytes != out.numel() * out.element_size():
            raise from_code(_lib.ERRORS["TENSOR_INFO"], f"{self._where()}: slice is {nbytes} bytes, "
                              f"torch says {out.numel() * out.element_size()}")
        req = _lib.SliceRequest(self._i, dim, start, stop, out.data_ptr() if nbytes else None,
                                nbytes, r.code, 0, 0)
        before_device_writes(r.device)
        r.check(r.lib.ckptio_reader_load_slices(r.handle, ctypes.byref(req), 1),
                f"slice {start}:{stop} of dim {dim} of {self.name!r}")
        self.verified = bool(req.verified)
        self.bytes_read = req.bytes_read
        return out.squeeze(dim) if drop else out

    def plan(self, dim: int, rank: int, nranks: int) -> Tuple[int, int, List[Tuple[int, int, int]]]:
        """What rank `rank` of `nranks` reads when the tensor is split on
        `dim` by torch.chunk's rule: (start, stop, [(file, offset, length)])."""
        r = self._r
        start, stop = ctypes.c_int64(), ctypes.c_int64()
        n = r.check(r.lib.ckptio_reader_plan_rank(r.handle, self._i, dim, rank, nranks,
                                                  ctypes.byref(start), ctypes.byref(stop),
                                                  None, 0), f"plan of {self.name!r}")
        ranges = (_lib.ByteRange * max(n, 1))()
        r.check(r.lib.ckptio_reader_plan_rank(r.handle, self._i, dim, rank, nranks, None, None,
                                              ranges, n), f"plan of {self.name!r}")
        return start.value, stop.value, [(x.file, x.offset, x.length) for x in ranges[:n]]

    def __repr__(self) -> str:
        return f"<ckptio.torch.TorchSlice {self.name!r} {self._dtype_name} {list(self._shape)}>"
