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
import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

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


class Arenas:
    """The mappings of a stream of loads (safe_open's read-ahead windows),
    reused once nothing made from them is left: a stream whose caller drops
    each tensor after using it reads every window into pages faulted in
    already (a cold 4 GiB stream into new mappings faults 4 GiB of fresh
    pages), and holds at most `keep` windows' mappings. A mapping still
    used by any tensor or array (each holds a reference to it) is never
    handed out; beyond `keep` the pool forgets the oldest, which is then
    unmapped when its last tensor goes."""

    def __init__(self, keep: int = 3) -> None:
        self.keep = keep
        self.made = 0  # mappings made so far
        self._pool: List[mmap.mmap] = []  # oldest first
        self._lock = threading.Lock()

    def take(self, size: int) -> mmap.mmap:
        """A private anonymous mapping of at least size bytes."""
        with self._lock:
            for k in range(len(self._pool)):
                m = self._pool[k]
                # Referenced by the pool, `m` and getrefcount's argument only: free.
                if len(m) >= size and sys.getrefcount(m) <= 3:
                    self._pool.append(self._pool.pop(k))  # the most recently used last
                    return m
            m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
            self.made += 1
            self._pool.append(m)
            del self._pool[:-self.keep]
            return m


class Placer:
    """Memory for the destinations of one copying load: every tensor of
    at least _PLACED_MIN bytes in one anonymous mapping of their sizes
    summed, each starting at its file offset's place within a page (so the
    library's O_DIRECT load reads the file straight into it), the mapping's
    whole 2 MiB pages advised as huge pages. A cold load into fresh 4 KiB
    pages faults each one in (262,000 faults a GiB) and ran at 0.6-0.7x
    the raw read, into 2 MiB pages at 1.6x it (bench/RESULTS_PEERS.md); a
    mapping per tensor left each one's tail in 4 KiB pages (28,000-33,000
    faults a GiB of an LLM's tensors, about 20 us each on these VMs), and advising
    those tails too cost up to 2 MiB of memory per tensor. Private, as
    torch.empty's memory is: the module's default for -1 is a shared
    mapping, which a forked child (a DataLoader worker) would write through
    into the parent's tensor.

    Lifetime: each tensor or array made with frombuffer holds the mapping;
    it is unmapped when the last of them goes (as the zero-copy load's
    views of one mapping). Each one's storage is its own bytes only."""

    def __init__(self, infos: Sequence[_lib.TensorInfo], indices: Iterable[int],
                 arenas: Optional[Arenas] = None) -> None:
        """infos: the file's tensors; indices: those this load copies;
        arenas: where the mapping comes from (None: a new one)."""
        self.at: Dict[int, int] = {}
        end = 0
        for i in indices:
            nbytes, file_offset = infos[i].nbytes, infos[i].offset
            if nbytes < _PLACED_MIN:
                continue
            end = -(-end // _PAGE) * _PAGE + file_offset % _PAGE
            self.at[i] = end
            end += nbytes
        self.map: Optional[mmap.mmap] = None
        self.base = 0
        if not end:
            return
        huge = end >= _HUGE and hasattr(mmap, "MADV_HUGEPAGE")
        size = end + (_HUGE if huge else 0)
        self.map = arenas.take(size) if arenas is not None else mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
        if huge:
            view = ctypes.c_char.from_buffer(self.map)
            self.base = -ctypes.addressof(view) % _HUGE
            del view  # (a live export would pin the mapping open)
            self.map.madvise(mmap.MADV_HUGEPAGE, self.base, end // _HUGE * _HUGE)

    def placed(self, i: int, elem_size: int) -> Optional[Tuple[mmap.mmap, int]]:
        """(buffer, offset) of tensor i's destination, or None for a tensor
        not placed (small) or whose offset is not a multiple of its element
        size (torch and numpy kernels may assume aligned elements): allocate
        as usual."""
        at = self.at.get(i)
        if at is None or self.map is None or (self.base + at) % max(elem_size, 1):
            return None
        return self.map, self.base + at


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
