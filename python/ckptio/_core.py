"""The machinery both front ends share (ckptio.numpy and ckptio.torch): the
process's library context, its options, and an open reader. Internal: the
package's modules use these names; users use configure() through ckptio."""

from __future__ import annotations

import atexit
import ctypes
import operator
import os
import threading
import warnings
from types import TracebackType
from typing import Any, Callable, Dict, Generic, List, Optional, SupportsIndex, Tuple, Type, TypeVar, Union

from . import _lib
from .errors import check, from_code

__all__ = ["SNAPSHOT_AUTO", "configure", "ctx", "map_ctx", "options", "dtype_code", "Reader",
           "OpenReader", "PathLike", "MemoryFile", "scratch_dir", "parse_slice_key",
           "backend_choice", "deprecated_mmap", "check_framework", "VERSION_KEY"]

_R = TypeVar("_R", bound="Reader")
PathLike = Union[str, "os.PathLike[str]", bytes, "os.PathLike[bytes]"]

# One context per process, created at first use: a context allocates and
# touches its staging ring once, which is too costly to repeat per call.
_ctx_lock = threading.Lock()
_ctx_handle: Optional[ctypes.c_void_p] = None
_map_ctx_handle: Optional[ctypes.c_void_p] = None
_ctx_settings: Dict[str, int] = {}
SNAPSHOT_AUTO = "auto"


def configure(*, snapshot_bytes: Union[int, str, None] = None,
              staging_bytes: Optional[int] = None, chunk_bytes: Optional[int] = None,
              threads: Optional[int] = None) -> None:
    """Sets the options of the process's context (its worker pool and pinned
    memory) before its first save or load; afterwards it raises
    CkptioRuntimeError (code ERRORS["STATE"]).

    snapshot_bytes: pinned memory that holds whole snapshots, beyond the
        staging ring: a save whose file fits in both reaches its snapshot
        point (SaveHandle.wait_snapshot) as soon as its bytes are copied, and
        is written behind it. ckptio.SNAPSHOT_AUTO takes a quarter of
        physical memory; 0 (the default) keeps memory bounded by the 256 MiB
        ring. The memory is allocated once, at the first save or load (the
        context's creation), faulted in by a thread of the library in the
        background from then on (a save that starts meanwhile faults in
        what it uses itself), and reused by every save.
    staging_bytes, chunk_bytes: the staging ring and its pieces (0: the
        library's defaults).
    threads: worker threads, each holding one read or write in flight (0:
        the library's default, 32)."""
    values: Dict[str, Union[int, str, None]] = {
        "snapshot_bytes": snapshot_bytes, "staging_bytes": staging_bytes,
        "chunk_bytes": chunk_bytes, "threads": threads}
    with _ctx_lock:
        if _ctx_handle is not None:
            raise from_code(_lib.ERRORS["STATE"],
                            "ckptio.configure: the context already exists (call it before the "
                            "first save or load)")
        for key, value in values.items():
            if value is None:
                continue
            if key == "snapshot_bytes" and value == SNAPSHOT_AUTO:
                value = ctypes.c_size_t(-1).value
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"ckptio.configure: {key} must be a non-negative int, "
                                 f"not {value!r}")
            _ctx_settings[key] = value


def prepare() -> None:
    """Makes the process's context now, with the options configure() set,
    instead of at the first save or load. With snapshot_bytes its memory is
    then faulted in by a library thread while the program goes on, so the
    first checkpoint finds it ready: a loop that saves early would
    otherwise pay for faulting it in within its first save's stall (3.5 s
    for 3.5 GiB on this project's VM, bench/RESULTS_TRAINING.md). configure()
    raises afterwards, as after a first save."""
    ctx()


def ctx() -> ctypes.c_void_p:
    """The process's context (ckptio_ctx), created at the first call."""
    global _ctx_handle
    with _ctx_lock:
        if _ctx_handle is None:
            lib = _lib.lib()
            handle = ctypes.c_void_p()
            opts = _lib.Options.init()
            for key, value in _ctx_settings.items():
                setattr(opts, key, value)
            check(lib.ckptio_ctx_create(ctypes.byref(opts), ctypes.byref(handle)),
                  "ckptio_ctx_create", lib.ckptio_last_open_error())
            _ctx_handle = handle
            atexit.register(_ctx_free)
        return _ctx_handle


def _ctx_free() -> None:
    global _ctx_handle, _map_ctx_handle
    with _ctx_lock:
        for handle in (_ctx_handle, _map_ctx_handle):
            if handle is not None:
                _lib.lib().ckptio_ctx_free(handle)
        _ctx_handle = _map_ctx_handle = None


def _forget_in_child() -> None:
    """After os.fork, in the child (DataLoader workers, multiprocessing's
    fork, preforking servers): the parent's contexts have none of their
    worker threads here, so the child makes its own at its first call; the
    parent's are left alone (freeing them would wait for those threads).
    configure()'s settings carry over; the lock is new, since another
    thread of the parent may have held it at the fork."""
    global _ctx_lock, _ctx_handle, _map_ctx_handle
    _ctx_lock = threading.Lock()
    _ctx_handle = _map_ctx_handle = None


os.register_at_fork(after_in_child=_forget_in_child)


def map_ctx() -> ctypes.c_void_p:
    """The context for zero-copy loads: the process's context once it exists
    (its staging ring is paid for), else a light one whose ring is two
    chunks and which never starts CUDA. A mapped load checks its CRCs in the
    mapping and needs no staging, and a process that only loads (inference)
    should not hold the 256 MiB ring of a context made for saves."""
    global _map_ctx_handle
    with _ctx_lock:
        if _ctx_handle is not None:
            return _ctx_handle
        if _map_ctx_handle is None:
            lib = _lib.lib()
            opts = _lib.Options.init()
            # 2 MiB pieces check as fast as 8 MiB ones (measured) and keep
            # the ring at 4 MiB.
            opts.chunk_bytes = 2 << 20
            opts.staging_bytes = 2 * opts.chunk_bytes
            opts.cuda = 0
            opts.numa = 0
            handle = ctypes.c_void_p()
            check(lib.ckptio_ctx_create(ctypes.byref(opts), ctypes.byref(handle)),
                  "ckptio_ctx_create", lib.ckptio_last_open_error())
            _map_ctx_handle = handle
            atexit.register(_ctx_free)
        return _map_ctx_handle


def options(context: ctypes.c_void_p, crc: bool) -> _lib.Options:
    """The context's options with the crc switch set, for one open."""
    opts = _lib.Options.init()
    check(_lib.lib().ckptio_ctx_options(context, ctypes.byref(opts)), "ckptio_ctx_options")
    opts.crc = 1 if crc else 0
    return opts


_dtype_codes: Dict[str, int] = {}


def dtype_code(name: str, where: str = "") -> int:
    """enum ckptio_dtype of a safetensors dtype name (from the library's
    ckptio_dtype_parse, cached); CkptioValueError for an unknown name, its
    message beginning with `where` ("<file>: tensor 'w'") when given."""
    code = _dtype_codes.get(name)
    if code is None:
        out = ctypes.c_int()
        check(_lib.lib().ckptio_dtype_parse(name.encode(), ctypes.byref(out)),
              f"{where}: dtype {name!r}" if where else f"dtype {name!r}")
        code = _dtype_codes[name] = out.value
    return code


# A file at least this resident is mapped by the "auto" backend, as
# CKPTIO_LOAD_AUTO reads it by pread (through the page cache) rather than by
# O_DIRECT; so is a cold one that fits in memory (Reader.cacheable).
MAP_RESIDENT = 0.5


def deprecated_mmap(mmap: Optional[bool], where: str) -> Optional[bool]:
    """`mmap` as given; when it is (not None), a DeprecationWarning naming
    `where` (the public function) and pointing at the caller's line:
    load_file's mmap= is the keyword of ckptio before 1.0, kept working
    beside backend=, which safetensors also takes."""
    if mmap is not None:
        warnings.warn(f"{where}: mmap= is deprecated and will be removed; use backend='mmap' "
                      f"(mmap=True) or backend='pread' (mmap=False)", DeprecationWarning, stacklevel=3)
    return mmap


def backend_choice(backend: str, mmap: Optional[bool]) -> Optional[bool]:
    """A load's backend ("auto", "mmap", "pread" or "direct"; mmap,
    ckptio's older keyword, overrides it when given) as Reader's mapped:
    None, True, False ("direct" is a copying load: Reader's direct)."""
    if backend not in ("auto", "mmap", "pread", "direct"):
        raise ValueError(f"backend must be 'auto', 'mmap', 'pread' or 'direct', got {backend!r}")
    # (mmap, when given, was warned of by the public function: deprecated_mmap)
    if mmap is not None:
        return bool(mmap)
    return None if backend == "auto" else backend == "mmap"


# The key the library writes into every file's metadata (the writer's
# version): ckptio's own, so safe_open().metadata() leaves it out, as a
# file saved without metadata has None there in safetensors.
VERSION_KEY = "ckptio.version"

# safe_open's framework names, as safetensors takes them.
FRAMEWORKS = {"pt": "pt", "torch": "pt", "pytorch": "pt", "np": "numpy", "numpy": "numpy"}


def check_framework(framework: str, serves: str, device: object) -> None:
    """Refuses a safe_open `framework` that is not `serves` ("pt" or
    "numpy"), or a device numpy cannot hold, as safetensors refuses them
    (its SafetensorError: CkptioValueError here, also a ValueError)."""
    if FRAMEWORKS.get(framework) != serves:
        other = "ckptio.numpy" if serves == "pt" else "ckptio.torch"
        raise from_code(_lib.ERRORS["INVALID_ARG"],
                        f"framework {framework!r} is invalid here: this safe_open serves "
                        f"{serves!r} ({other}.safe_open, or ckptio.safe_open, serves the other)")
    if serves == "numpy" and device != "cpu":
        raise from_code(_lib.ERRORS["INVALID_ARG"],
                        f"device {device!r} is not supported for framework numpy (its arrays live on the cpu)")


class Reader:
    """An open ckptio_reader (a context manager closing it)."""

    def __init__(self, path: PathLike, crc: bool = True, mapped: Optional[bool] = False,
                 direct: bool = False, open_flags: int = 0) -> None:
        """mapped: True, the caller wants a zero-copy load, which runs on the
        light context of map_ctx(); None, a zero-copy load if the file is in
        the page cache or fits in memory (cacheable()), else a copying one;
        False, a copying load. A cold file that fits is mapped because its
        pages land in the page cache either way: the mapping's parallel
        fill ran as fast as an O_DIRECT copy here and needs no memory of its
        own, and the next load (a restarted process's) finds it cached; a
        copy through the cache paid both (bench/RESULTS_PEERS.md, issue
        45). A compressed file cannot be mapped, and one that does not fit
        is copied by O_DIRECT (CKPTIO_LOAD_AUTO), both on the full context
        whose staging ring copies need. direct: copying loads by O_DIRECT
        (CKPTIO_LOAD_DIRECT), which leave the page cache as it was.
        self.mapped says which it is. (A sharded set is mapped shard by
        shard: shards().)"""
        self.lib: Any = _lib.lib()
        self.path: bytes = os.fsencode(os.fspath(path))
        self.handle: Optional[ctypes.c_void_p] = None
        self.direct = direct
        self.open_flags = open_flags
        if direct:
            mapped = False
        # An object of a storage ("s3://...") is never mapped: "auto" copies
        # it without opening it twice.
        self.mapped = mapped is True or (mapped is None and not _lib.is_storage_path(self.path))
        self._open(map_ctx() if self.mapped else ctx(), crc)
        if self.mapped and (
                self.lib.ckptio_reader_compression(self.handle, None, None, None) == 1
                or (mapped is None and not self.shards() and not self.cacheable())):
            self.mapped = False
            self.lib.ckptio_reader_close(self.handle)
            self._open(ctx(), crc)

    def maps(self, mapped: Optional[bool]) -> bool:
        """Whether a load of all the tensors through this open reader is a
        zero-copy one: for mapped None ("auto"), when the page cache holds
        the file. A set is never mapped as a whole."""
        if mapped is False or self.shards():
            return False
        return mapped is True or self.cacheable()

    def cacheable(self) -> bool:
        """Whether a load through the page cache is the right one for this
        file now: it is mostly there already (resident()), or it fits in
        memory by CKPTIO_LOAD_AUTO's rule (ckptio_reader_fits_cache)."""
        if self.resident() >= MAP_RESIDENT:
            return True
        fits = int(self.lib.ckptio_reader_fits_cache(self.handle))
        self.check(min(fits, 0), "fits_cache")
        return fits == 1

    def resident(self) -> float:
        """The share (0 to 1) of the tensors' stored bytes the page cache
        holds (ckptio_reader_resident: a sample, no I/O)."""
        share = ctypes.c_double()
        self.check(self.lib.ckptio_reader_resident(self.handle, ctypes.byref(share)), "resident")
        return share.value

    @property
    def shown(self) -> str:
        """The path as text, for messages."""
        return os.fsdecode(self.path)

    def _open(self, context: ctypes.c_void_p, crc: bool) -> None:
        opts = options(context, crc)
        if self.direct:
            opts.load_method = _lib.LOAD_METHODS.index("direct")
        opts.open_flags = self.open_flags
        handle = ctypes.c_void_p()
        check(self.lib.ckptio_reader_open(context, self.path, ctypes.byref(opts),
                                          ctypes.byref(handle)),
              f"cannot open {self.shown}", self.lib.ckptio_last_open_error(), self.shown)
        self.handle = handle

    def shards(self) -> List[bytes]:
        """The shard files of a sharded set (validated together when it was
        opened: names, tensors, save ids), in order; [] for a single file."""
        out = []
        for k in range(self.lib.ckptio_reader_shard_count(self.handle)):
            p = ctypes.c_char_p()
            self.check(self.lib.ckptio_reader_shard(self.handle, k, ctypes.byref(p), None, None),
                       f"shard {k}")
            out.append(p.value or b"")
        return out

    def __enter__(self: _R) -> _R:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.handle is not None:
            self.lib.ckptio_reader_close(self.handle)
            self.handle = None

    def check(self, rc: int, what: str) -> int:
        """rc, or raises the failure with the reader's detail."""
        return check(rc, f"{self.shown}: {what}",
                     self.lib.ckptio_reader_last_error(self.handle), self.shown)

    def stats(self) -> Optional[Dict[str, Any]]:
        """Stage timings of the last load / verify (ckptio_reader_stats) as a
        dict: bytes, seconds (wall), copy_seconds (busy, summed over the
        workers), threads, staging_bytes, ..."""
        return _lib.Stats.read(self.lib.ckptio_reader_stats, self.handle)

    def infos(self) -> List[_lib.TensorInfo]:
        """Every tensor's ckptio_tensor_info, in file order."""
        out = []
        for i in range(self.lib.ckptio_reader_count(self.handle)):
            info = _lib.TensorInfo()
            self.check(self.lib.ckptio_reader_info(self.handle, i, ctypes.byref(info)),
                       f"tensor {i}")
            out.append(info)
        return out

    def find(self, name: str) -> int:
        """The index of tensor `name`; TensorNotFoundError (a KeyError)."""
        return self.check(int(self.lib.ckptio_reader_find(self.handle, name.encode())),
                          f"tensor {name!r}")

    def dtype_name(self, info: _lib.TensorInfo) -> str:
        """The safetensors dtype name of a tensor."""
        return str(self.lib.ckptio_dtype_name(info.dtype).decode())

    def metadata(self) -> Dict[str, str]:
        """The file's __metadata__, without ckptio's CRC keys."""
        out = {}
        for i in range(self.lib.ckptio_reader_metadata_count(self.handle)):
            key, value = ctypes.c_char_p(), ctypes.c_char_p()
            self.check(self.lib.ckptio_reader_metadata_at(self.handle, i, ctypes.byref(key),
                                                          ctypes.byref(value)), f"metadata {i}")
            out[(key.value or b"").decode()] = (value.value or b"").decode()
        return out

    def format(self) -> str:
        """"safetensors", "pytorch", or "safetensors-sharded"."""
        return str(self.lib.ckptio_reader_format(self.handle).decode())


_H = TypeVar("_H", bound="OpenReader[Any]")


class OpenReader(Generic[_R]):
    """What both safe_open classes (numpy and torch) share: the reader they
    hold, closed on leaving a with block, by close(), or when collected, and
    the read-ahead of their get_tensor."""

    _r: Optional[_R] = None  # set by the subclass once its reader is open
    _ahead: Optional["ReadAhead"] = None

    def __enter__(self: _H) -> _H:
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()

    def close(self) -> None:
        """Closes the file (also on leaving the with block)."""
        if self._ahead is not None:
            self._ahead.settle()
        if self._r is not None:
            self._r.close()
            self._r = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing to report to in a finalizer
            pass

    def metadata(self) -> Optional[Dict[str, str]]:
        """The file's metadata (str -> str), or None when it has none, as
        safetensors returns it. ckptio's own entries (CRCs, and the
        version every ckptio file records) are not included:
        ckptio.load_metadata shows the version."""
        meta = self._reader().metadata()
        meta.pop(VERSION_KEY, None)
        return meta or None

    def _reader(self, settle: bool = True) -> _R:
        """The open reader. A reader serves one thread at a time, so unless
        the caller only reads what the open left in Python (names, shapes),
        a window the read-ahead is loading is waited for first."""
        if self._r is None:
            # safetensors' "File is closed" is its SafetensorError; ckptio's
            # was a ValueError: CkptioValueError is both.
            raise from_code(_lib.ERRORS["INVALID_ARG"], "safe_open: the file is closed")
        if settle and self._ahead is not None:
            self._ahead.settle()
        return self._r

    def _read_ahead(self, name: str, i: int, sizes: List[Optional[int]]) -> Any:
        """get_tensor's tensor i, through the read-ahead (ReadAhead.get)."""
        assert self._ahead is not None, "set by the subclass with its reader"
        return self._ahead.get(self._reader(settle=False), name, i, sizes)


# How much a cold file's get_tensor reads at once (ReadAhead); two such
# windows are held at most, the one being handed out and the next. A window
# is all the reads one load has in flight (32 x 8 MiB at 256 MiB): 128 MiB
# windows streamed 4 GiB at 0.86x runai-model-streamer's stream, 256 MiB ones
# at 0.91x, and steadier (8 rotated rounds; bench/RESULTS_PEERS.md).
READ_AHEAD_BYTES = 256 << 20


class ReadAhead:
    """safe_open's get_tensor on a cold file. One tensor per call would have
    one or two reads in flight (its pieces), a fraction of what the disk
    takes; a miss instead loads the tensor and those after it in the order
    the caller follows, up to READ_AHEAD_BYTES, in one parallel load, and
    hands the others out when they are asked for (each once: every call
    still returns a tensor of its own). While the caller works through that
    window, the next one is loaded on a thread of its own, so the disk does
    not wait for the caller between windows (as a streaming loader's ring
    does not); that happens only while the caller keeps to its order. What a
    miss finds not asked for is dropped, so memory stays within two windows.
    A resident file is read a tensor per call (a copy from the page cache,
    nothing to wait for).

    The orders followed: the file's (offset_keys()) and the names' (keys(),
    sorted as safetensors sorts them: `for k in f.keys(): f.get_tensor(k)`
    is the usual loop). A miss takes the order in which it comes right after
    the tensor asked for before it, the current one when both or neither
    do (at the start the file's, read behind only once a call confirms it),
    and keeps what is loaded already of its window. With file order only,
    that loop over a file whose names are not in file order loaded a window
    for nearly every call and dropped most of it: 0.37 GB/s from a cold
    1 GiB model whose stream in file order ran at 2.2 (bench/RESULTS_PEERS.md).

    load(indices) -> {name: tensor} is the owner's load of those tensors;
    it runs on the caller's thread or on the read-ahead's, never on both at
    once (settle() waits for the latter). names: every tensor's name in
    file order."""

    def __init__(self, load: Callable[[List[int]], Dict[str, Any]], names: List[str]) -> None:
        self._load = load
        self._held: Dict[str, Any] = {}
        self._cold: Optional[bool] = None
        file_order = list(range(len(names)))
        by_name = sorted(file_order, key=names.__getitem__)
        self._orders = [file_order] + ([by_name] if by_name != file_order else [])
        # _where[o][i]: the position of tensor i in order o.
        self._where = [[0] * len(names) for _ in self._orders]
        for where, order in zip(self._where, self._orders):
            for position, k in enumerate(order):
                where[k] = position
        self._names = names
        self._order = 0  # the order being followed (an index into _orders)
        self._unsure = False  # whether that order is a guess not yet confirmed
        self._last: Optional[int] = None  # the tensor asked for last
        self._after: Optional[int] = None  # the position after the last window loaded
        # The window after the last one: its indices, the thread loading it
        # (None once joined) and [what it loaded] (empty if it failed).
        self._next: Optional[Tuple[List[int], Optional[threading.Thread], List[Dict[str, Any]]]] = None

    def get(self, reader: "Reader", name: str, i: int, sizes: List[Optional[int]]) -> Any:
        """Tensor i (named name) as a tensor of its own (sizes: every
        tensor's bytes in file order, None for one the caller cannot make,
        which a window passes over)."""
        held = self._held.pop(name, None)
        if held is not None:
            if self._unsure and self._follows(self._order, i, sizes):
                self._unsure = False  # the order guessed at the start is the caller's
                self._start(reader, sizes)
            self._last = i
            return held
        self.settle()
        window, _, loaded = self._next or ([], None, [])
        self._next = None
        if i in window and loaded:
            self._held, in_order = loaded[0], True
        else:
            # The order i comes next in, the current one first.
            orders = [o for o in sorted(range(len(self._orders)), key=lambda o: o != self._order)
                      if self._follows(o, i, sizes)]
            self._order = orders[0] if orders else self._order
            in_order = bool(orders)
            # At the start both orders may begin with i: the window's is a
            # guess, and nothing is read behind it until a call confirms it.
            self._unsure = len(orders) > 1 and self._last is None
            window = self.window(reader, i, sizes)
            # What is loaded already and in this window is kept, not read again.
            have = dict(self._held, **(loaded[0] if loaded else {}))
            kept = {self._names[k]: have[self._names[k]] for k in window if self._names[k] in have}
            # A tensor's error is raised here, on its call.
            self._held = dict(kept, **self._load([k for k in window if self._names[k] not in kept]))
        self._after = self._where[self._order][window[-1]] + 1
        self._last = i
        if in_order and not self._unsure:
            self._start(reader, sizes)
        return self._held.pop(name)

    def _following(self, order: int, position: int, sizes: List[Optional[int]]) -> Optional[int]:
        """The first tensor the caller can make at or after position in order."""
        return next((k for k in self._orders[order][position:] if sizes[k] is not None), None)

    def _follows(self, order: int, i: int, sizes: List[Optional[int]]) -> bool:
        """Whether tensor i comes right after the last one asked for in
        order (at the start: comes first)."""
        start = 0 if self._last is None else self._where[order][self._last] + 1
        return self._following(order, start, sizes) == i

    def window(self, reader: "Reader", i: int, sizes: List[Optional[int]]) -> List[int]:
        """The indices a miss of tensor i loads: i, then on a cold file the
        tensors after it in the order followed."""
        if self._cold is None:
            self._cold = not reader.shards() and reader.resident() < MAP_RESIDENT
        out, total = [i], sizes[i] or 0
        order = self._orders[self._order]
        start = self._where[self._order][i] + 1
        for k in order[start:] if self._cold else ():
            size = sizes[k]
            if size is None:
                continue
            if total + size > READ_AHEAD_BYTES:
                break
            out.append(k)
            total += size
        return out

    def _start(self, reader: "Reader", sizes: List[Optional[int]]) -> None:
        """Loads the window after the last one on a thread, on a cold file.
        Its failure is dropped: the miss that wanted it loads again on the
        caller's thread and raises the tensor's own error there."""
        first = self._following(self._order, self._after or 0, sizes)
        if not self._cold or first is None:
            return
        window = self.window(reader, first, sizes)
        box: List[Dict[str, Any]] = []

        def run() -> None:
            try:
                box.append(self._load(window))
            except Exception:  # noqa: BLE001 - raised again by the caller's own load
                pass

        thread = threading.Thread(target=run, name="ckptio-read-ahead")
        thread.start()
        self._next = (window, thread, box)

    def settle(self) -> None:
        """Waits for the window loading on the read-ahead's thread, if any
        (what it loaded stays for the get that asks for it)."""
        if self._next is not None and self._next[1] is not None:
            self._next[1].join()
            self._next = (self._next[0], None, self._next[2])


def scratch_dir() -> Optional[str]:
    """Where save() writes before reading its bytes back: memory (/dev/shm)
    when the machine has it, else the default temporary directory."""
    return "/dev/shm" if os.access("/dev/shm", os.W_OK | os.X_OK) else None


class MemoryFile:
    """`data` in an anonymous memory file (memfd) the library opens by path
    (/proc/self/fd/N), for loads from bytes; a context manager closing it."""

    def __init__(self, data: bytes) -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data must be bytes, got {type(data).__name__}")
        self.fd = os.memfd_create("ckptio-load", os.MFD_CLOEXEC)
        try:
            view = memoryview(data).cast("B")
            while view:
                view = view[os.write(self.fd, view):]
        except BaseException:
            os.close(self.fd)
            raise
        self.path = f"/proc/self/fd/{self.fd}"

    def __enter__(self) -> "MemoryFile":
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def parse_slice_key(shape: Tuple[int, ...], key: Any,
                    where: str) -> Tuple[Optional[int], int, int, bool]:
    """The one-dimension read a get_slice key asks for: (dim, start, stop,
    drop), dim None when the key takes the whole tensor, drop when an integer
    index removes that dimension. Keys: integers, start:stop slices with step
    1 (clamped like Python's), ':' and '...'. A step or a second sliced
    dimension raises ValueError, another kind of key TypeError (`where`
    names the tensor), an index out of range IndexError."""
    keys = key if isinstance(key, tuple) else (key,)
    nd = len(shape)
    if sum(k is Ellipsis for k in keys) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if Ellipsis in keys:
        at = keys.index(Ellipsis)
        fill = nd - (len(keys) - 1)
        if fill < 0:
            raise IndexError(f"too many indices for tensor of dimension {nd}")
        keys = keys[:at] + (slice(None),) * fill + keys[at + 1:]
    if len(keys) > nd:
        raise IndexError(f"too many indices for tensor of dimension {nd}")
    cut: Optional[Tuple[int, int, int, bool]] = None
    for d, k in enumerate(keys):
        size = shape[d]
        if isinstance(k, slice):
            start, stop, step = k.indices(size)
            if step != 1:
                raise ValueError(f"{where}: slices with a step ({k}) are not "
                                 "supported: ckptio reads start:stop ranges")
            stop = max(stop, start)
            if (start, stop) == (0, size):
                continue
            part = (d, start, stop, False)
        elif not isinstance(k, bool) and isinstance(k, (int, SupportsIndex)):
            i = operator.index(k)
            if not -size <= i < size:
                raise IndexError(f"index {i} is out of bounds for dimension {d} with size {size}")
            i %= size
            part = (d, i, i + 1, True)
        else:
            raise TypeError(f"{where}: only integers, start:stop slices, ':' and "
                            f"'...' index a slice, not {type(k).__name__}")
        if cut is not None:
            raise ValueError(f"{where}: ckptio slices one dimension per read "
                             f"(dims {cut[0]} and {d} asked); read one, then slice the result")
        cut = part
    return cut if cut is not None else (None, 0, 0, False)
