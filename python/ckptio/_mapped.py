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
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

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
    m, pad, _ = _anon(shift + nbytes)
    return m, pad + shift


Placer = Callable[[int, int, int], Optional[Tuple[Any, int]]]  # placed's signature


class Recycler:
    """placed() for safe_open's read-ahead windows, reusing the memory of the
    tensors it made once the caller has dropped them. A stream through a
    cold file (each tensor used, then dropped) would otherwise take new
    memory for every window: each of its pages zeroed by the kernel as it
    faults in, and where the kernel must compact memory to find free 2 MiB
    blocks, far more (bench/RESULTS_PEERS.md: a streaming loader reading into
    the same ring of huge pages ran at 1.5-2x ckptio's stream on a busy
    machine). Destinations are handed out in sizes rounded to their pages
    (2 MiB from 2 MiB up, else 4 KiB); what comes
    back (a tensor's memory returns when the last array, tensor or view of it
    goes) is kept by size, at most keep bytes, the rest unmapped. clear()
    drops what is kept and keeps nothing more (the safe_open closed)."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._kept = 0
        self.reused = 0  # bytes handed out again
        self._free: Dict[int, List[Tuple[mmap.mmap, int]]] = {}
        # Re-entrant: a collection inside placed() may return memory.
        self._lock = threading.RLock()

    def placed(self, nbytes: int, file_offset: int, elem_size: int) -> Optional[Tuple[Any, int]]:
        """As placed(): (buffer, offset) or None."""
        shift = file_offset % _PAGE
        if nbytes < _PLACED_MIN or shift % elem_size:
            return None
        unit = _HUGE if shift + nbytes >= _HUGE else _PAGE
        size = -(-(shift + nbytes) // unit) * unit
        with self._lock:
            spare = self._free.get(size)
            if spare:
                m, base = spare.pop()
                self._kept -= size
                self.reused += size
            else:
                m, _, base = _anon(size)
        buf = (ctypes.c_uint8 * (shift + nbytes)).from_address(base)
        # m travels with the finalizer: the mapping lives while buf does.
        weakref.finalize(buf, self._give_back, size, m, base).atexit = False
        return buf, shift

    def _give_back(self, size: int, m: mmap.mmap, base: int) -> None:
        with self._lock:
            if self._kept + size <= self._keep:
                self._free.setdefault(size, []).append((m, base))
                self._kept += size
        # else m goes with this call: unmapped

    def clear(self) -> None:
        with self._lock:
            self._keep = 0
            self._free.clear()
            self._kept = 0


def _anon(size: int) -> Tuple[mmap.mmap, int, int]:
    """Memory for a destination of size bytes: (an anonymous mapping, the
    offset in it where the destination starts, that address). Private, as
    torch.empty's memory is: the module's default for -1 is a shared mapping,
    which a forked child (a DataLoader worker) would write through into the
    parent's tensor. A large destination in 2 MiB pages, from a 2 MiB
    boundary: a cold load into fresh 4 KiB pages faults each one in (262,000
    faults a GiB) and ran at 0.6-0.7x the raw read, into 2 MiB pages at 1.6x
    it, which is how runai-model-streamer's ring reads (4,300 faults a GiB;
    bench/RESULTS_PEERS.md). Only whole 2 MiB pages inside the mapping become
    huge; the extra 2 MiB of address space is never touched."""
    huge = size >= _HUGE and hasattr(mmap, "MADV_HUGEPAGE")
    m = mmap.mmap(-1, size + (_HUGE if huge else 0), flags=mmap.MAP_PRIVATE)
    view = ctypes.c_char.from_buffer(m)
    start = ctypes.addressof(view)
    del view  # (a live export would pin the mapping open)
    if not huge:
        return m, 0, start
    m.madvise(mmap.MADV_HUGEPAGE)
    pad = -start % _HUGE
    return m, pad, start + pad


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
