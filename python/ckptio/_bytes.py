"""save()'s bytes (ckptio.numpy.save, ckptio.torch.save): a safetensors file
built in memory, byte for byte what safetensors' own save() returns for the
same tensors and metadata.

Not the library's writer: it pads the header to 4 KiB, so that O_DIRECT
loads read every tensor straight into place, and records ckptio.version
(and the CRCs) in the metadata; bytes held in memory need neither, and code
that compares, hashes or caches save()'s bytes (as safetensors' tests and
users do) expects safetensors' bytes. save(..., crc=True) and the other
formats still go through the library.

The layout safetensors writes (its format's description, checked against
the installed package by tests/interop/test_py_compat.py):
  - 8 bytes: the header's length, little-endian;
  - the header: JSON without spaces, UTF-8 (non-ASCII characters as they
    are, control characters escaped), padded with spaces to a multiple of 8
    bytes. "__metadata__" first when metadata is given ({} too), then one
    entry per tensor, {"dtype", "shape", "data_offsets"}, in the order of
    their bytes;
  - the tensors' bytes back to back: ordered by dtype, from the last dtype
    of the format's list to the first (safetensors sorts by its dtype
    enum, descending: 8-byte types first), then by name.
One thing is not reproducible: safetensors keeps the metadata in a hash map,
whose order changes from process to process when there are two keys or
more; ckptio keeps the caller's order.
"""

from __future__ import annotations

import ctypes
import json
from typing import Any, Dict, Mapping, NamedTuple, Optional, Sequence, Tuple

from . import _lib
from ._core import dtype_code
from .errors import from_code

__all__ = ["Entry", "serialize"]

METADATA_KEY = "__metadata__"


class Entry(NamedTuple):
    """One tensor to serialize: its bytes are `nbytes` at `address` (host
    memory the caller keeps alive during serialize)."""
    name: str
    dtype: str  # the safetensors name ("F32")
    shape: Tuple[int, ...]
    address: int
    nbytes: int


def _layout_key(e: Entry) -> Tuple[int, str]:
    # enum ckptio_dtype lists the format's dtypes in the format's own order,
    # the one safetensors' serializer sorts by (descending).
    return -dtype_code(e.dtype), e.name


def header(entries: Sequence[Entry], metadata: Optional[Mapping[str, str]]) -> Tuple[bytes, Sequence[Entry]]:
    """The padded header JSON, and the entries in the order of their bytes."""
    order = sorted(entries, key=_layout_key)
    table: Dict[str, Any] = {} if metadata is None else {METADATA_KEY: dict(metadata)}
    offset = 0
    for e in order:
        if e.name == METADATA_KEY:
            raise from_code(_lib.ERRORS["INVALID_ARG"],
                            f"tensor {e.name!r}: the name is reserved for the file's metadata")
        table[e.name] = {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    text = json.dumps(table, ensure_ascii=False, separators=(",", ":")).encode()
    return text + b" " * (-len(text) % 8), order


def serialize(entries: Sequence[Entry], metadata: Optional[Mapping[str, str]]) -> bytes:
    """The bytes of a safetensors file of `entries` and `metadata` (None:
    no "__metadata__" entry), as safetensors' serializer writes them."""
    text, order = header(entries, metadata)
    start = 8 + len(text)
    out = ctypes.create_string_buffer(start + sum(e.nbytes for e in order))
    ctypes.memmove(out, len(text).to_bytes(8, "little") + text, start)
    at = ctypes.addressof(out) + start
    for e in order:
        if e.nbytes:
            ctypes.memmove(at, e.address, e.nbytes)
        at += e.nbytes
    return out.raw
