"""Zero-copy loads: results that are views of one private, copy-on-write
mapping of the file (ckptio_reader_map_private), CRC-checked by the library
over that mapping before any view is made.

Lifetime: the mapping is a ctypes array over its address; every numpy
array (np.frombuffer) and torch tensor (torch.frombuffer) made from it holds
a reference to that array, and a finalizer unmaps it when the last of them
goes. The reader can be closed at once: the mapping does not depend on it.

What cannot be a view is copied by the caller (load_many): strided PyTorch
views and big-endian entries (ckptio_reader_view refuses them), and tensors
whose offset is not a multiple of their element size (torch and numpy
kernels may assume aligned elements).
"""

from __future__ import annotations

import ctypes
import mmap
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple

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


# Copying loads: where a destination starts within its page decides whether
# the library's O_DIRECT load reads the file straight into it or through its
# staging ring, one more copy of every byte (bench/RESULTS.md). numpy and
# torch put large arrays 16 or 64 bytes past a page, where no tensor of a
# file is.
_PAGE = 4096
_PLACED_MIN = 64 << 10  # the library reads smaller tensors through a slot
_HUGE = 2 << 20  # a transparent huge page


def placed(nbytes: int, file_offset: int, elem_size: int) -> Optional[Tuple[mmap.mmap, int]]:
    """Memory for a copying load's destination of nbytes whose bytes sit at
    file_offset: (buffer, offset), the destination starting at the file
    offset's place within the page of an anonymous mapping of its own
    (freed with the last array or tensor made from it by frombuffer; storage
    of exactly the tensor, not resizable, as the zero-copy load's). None for
    small tensors and offsets that are not a multiple of the element size:
    allocate as usual."""
    shift = file_offset % _PAGE
    if nbytes < _PLACED_MIN or shift % elem_size:
        return None
    # Private, as torch.empty's memory is: the module's default for -1 is a
    # shared mapping, which a forked child (a DataLoader worker) would write
    # through into the parent's tensor.
    if nbytes < _HUGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return mmap.mmap(-1, shift + nbytes, flags=mmap.MAP_PRIVATE), shift
    # A large destination in 2 MiB pages, from a 2 MiB boundary: a cold load
    # into fresh 4 KiB pages faults each one in (262,000 faults a GiB) and
    # ran at 0.6-0.7x the raw read, into 2 MiB pages at 1.6x it, which is
    # how runai-model-streamer's ring reads (4,300 faults a GiB;
    # bench/RESULTS_PEERS.md). Only the 2 MiB pages the tensor fills are
    # advised: advising the whole mapping made the page holding its tail a
    # whole huge page too, up to 2 MiB never used per tensor (94 MiB of
    # peak RSS at the 1 GiB load of bench/RESULTS_S3.md). The tail and the
    # rest of the extra 2 MiB of address space stay in 4 KiB pages.
    m = mmap.mmap(-1, _HUGE + shift + nbytes, flags=mmap.MAP_PRIVATE)
    view = ctypes.c_char.from_buffer(m)
    pad = -ctypes.addressof(view) % _HUGE
    del view  # (a live export would pin the mapping open)
    whole = (shift + nbytes) // _HUGE * _HUGE
    if whole:
        m.madvise(mmap.MADV_HUGEPAGE, pad, whole)
    return m, pad + shift


def viewable(reader: "Reader", index: int, info: _lib.TensorInfo, elem_size: int) -> bool:
    """Whether tensor `index` can be returned as a view of the mapping."""
    if info.strided or info.nbytes == 0 or info.offset % max(elem_size, 1):
        return False
    p, n = ctypes.c_void_p(), ctypes.c_uint64()
    # The library's own rule (strided or big-endian: no view); its refusal
    # only sets the reader's message, which the next failure overwrites.
    return bool(reader.lib.ckptio_reader_view(reader.handle, index, ctypes.byref(p),
                                              ctypes.byref(n)) == 0)


def stats(lib: Any, fn: Callable[..., int], handle: Any) -> Optional[Dict[str, Any]]:
    """A ckptio_stats of `handle` (fn: ckptio_writer_stats / _reader_stats)
    as a dict: bytes, seconds, per-stage busy seconds, threads, staging_bytes."""
    out = _lib.Stats.init()
    rc = fn(handle, ctypes.byref(out))
    if rc < 0:
        return None
    return out.as_dict()
