"""Zero-copy loads: results that are views of one private, copy-on-write
mapping of the file (ckptio_reader_map_private), CRC-checked by the library
over that mapping before any view is made.

Lifetime: the mapping is a ctypes array over its address; every numpy
array (np.frombuffer) and torch tensor (torch.frombuffer) made from it holds
a reference to that array, and a finalizer unmaps it when the last of them
goes. The reader can be closed at once: the mapping does not depend on it.

What cannot be a view is copied by the caller (load_many, into memory
_placer.Placer places): strided PyTorch views and big-endian entries
(ckptio_reader_view refuses them), and tensors whose offset is not a
multiple of their element size (torch and numpy kernels may assume aligned
elements).
"""

from __future__ import annotations

import ctypes
import weakref
from typing import TYPE_CHECKING, Optional

from . import _lib

if TYPE_CHECKING:
    from ._core import Reader


def map_file(reader: "Reader") -> Optional["ctypes.Array[ctypes.c_uint8]"]:
    """The reader's file, privately mapped and CRC-checked (with the reader's
    crc option): a ctypes uint8 array over the mapping, or None for an empty
    file or a checkpoint no single mapping holds (a sharded set or a
    compressed file: the caller copies). Raises CkptioError on a bad CRC or a failed mmap."""
    lib = reader.lib
    base, size = ctypes.c_void_p(), ctypes.c_uint64()
    rc = lib.ckptio_reader_map_private(reader.handle, ctypes.byref(base), ctypes.byref(size))
    if rc == _lib.ERRORS["FORMAT"]:
        return None
    reader.check(rc, "zero-copy map")
    if not base.value:
        return None
    try:
        mapping = (ctypes.c_uint8 * size.value).from_address(base.value)
        # Not at exit: arrays may still be in use by other finalizers then,
        # and the process unmapping is the same release.
        weakref.finalize(mapping, lib.ckptio_map_free, base.value, size.value).atexit = False
    except BaseException:
        lib.ckptio_map_free(base.value, size.value)
        raise
    return mapping


def viewable(reader: "Reader", index: int, info: _lib.TensorInfo, elem_size: int) -> bool:
    """Whether tensor `index` can be returned as a view of the mapping."""
    if info.strided or info.nbytes == 0 or info.offset % max(elem_size, 1):
        return False
    p, n = ctypes.c_void_p(), ctypes.c_uint64()
    # The library's own rule (strided or big-endian: no view); its refusal
    # only sets the reader's message, which the next failure overwrites.
    return bool(reader.lib.ckptio_reader_view(reader.handle, index, ctypes.byref(p),
                                              ctypes.byref(n)) == 0)
