"""Destinations of copying loads: memory placed so that the library's
O_DIRECT load reads the file straight into it (Placer), and the pool of
such mappings a stream of loads reuses (Arenas). The zero-copy loads, whose
results are views of the file's own mapping, are _mapped's.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import threading
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from . import _lib

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
