"""The machinery under ckptio.torch, ckptio.manager, ckptio.dcp and
ckptio.torch_slice: dtypes, devices, a save's plan and its SaveHandle, and
the reader that makes torch tensors. Internal: users call ckptio.torch.

Tensor memory goes to the library by pointer (Tensor.data_ptr()); Python
copies nothing, except that a tensor which is not a plain contiguous strided
tensor (non-contiguous, or a lazily conjugated / negated view) is first made
one, and that copy costs the tensor's size on its device. Loads allocate the
destinations on the requested device (on the CPU in one mapping, placed for
O_DIRECT: _placer.Placer) and fill them in one parallel ckptio_reader_load_many, with the
CRC32s checked.

CUDA tensors are saved from the GPU by the library (device =
CKPTIO_DEVICE_CUDA(index)); the snapshot is ordered after the work queued on
each device's current stream (torch.cuda.current_stream) when the save starts.
"""

from __future__ import annotations

import atexit
import collections.abc
import ctypes
import os
import sys
import threading
import weakref
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence,
                    Tuple, Union)

import torch

from . import _lib, _mapped, _placer
from ._core import PathLike, Reader, ctx, dtype_code, options
from .errors import CkptioError, CkptioTypeError, check, from_code

if TYPE_CHECKING:
    from ._group import Group

__all__ = ["TORCH_DTYPES", "NAME_OF", "PACKED", "torch_layout", "file_shape", "overlapping", "Device", "code_of",
           "cuda_unavailable", "load_device",
           "before_device_writes", "as_saveable", "WriterOps", "SaveHandle", "Plan", "plan",
           "start", "fill_and_commit", "TorchReader"]

Device = Union[str, int, torch.device]

# safetensors dtype name -> torch dtype, for every dtype both have element for
# element. F6 has no torch dtype; F4's, float4_e2m1fn_x2, packs two values per
# element, so its shape is not the file's (PACKED); torch's complex32 /
# complex128 have no safetensors dtype.
_TORCH_NAMES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
    "I32": "int32", "U32": "uint32", "I64": "int64", "U64": "uint64",
    "F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
    "C64": "complex64", "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn",
    "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu",
}
# Older torch lacks some (uint16/32/64 came in 2.3, float8_e8m0fnu in 2.7).
TORCH_DTYPES: Dict[str, torch.dtype] = {
    st: getattr(torch, name) for st, name in _TORCH_NAMES.items()
    if isinstance(getattr(torch, name, None), torch.dtype)}
NAME_OF: Dict[torch.dtype, str] = {dt: name for name, dt in TORCH_DTYPES.items()}

# safetensors dtype name -> (torch dtype, values per torch element), for the
# dtypes torch packs: a file's F4 [..., 2n] is a float4_e2m1fn_x2 [..., n]
# (torch 2.8 on), as safetensors writes and reads it. Only whole-tensor
# saves and loads take them (save_file, load_file, get_tensor, load_model);
# slices, group loads and DCP refuse them as before.
_FLOAT4 = getattr(torch, "float4_e2m1fn_x2", None)
PACKED: Dict[str, Tuple[torch.dtype, int]] = {"F4": (_FLOAT4, 2)} if isinstance(_FLOAT4, torch.dtype) else {}
_PACKED_NAME: Dict[torch.dtype, str] = {dt: name for name, (dt, _) in PACKED.items()}


def torch_layout(dtype_name: str, shape: Tuple[int, ...]) -> Optional[Tuple[torch.dtype, Tuple[int, ...]]]:
    """The torch dtype and shape of a file's tensor of safetensors dtype
    `dtype_name` and shape `shape`; None when torch cannot hold it (F6, or
    an F4 whose last dimension is not whole bytes)."""
    dtype = TORCH_DTYPES.get(dtype_name)
    if dtype is not None:
        return dtype, shape
    packed = PACKED.get(dtype_name)
    if packed is None or not shape or shape[-1] % packed[1]:
        return None
    return packed[0], shape[:-1] + (shape[-1] // packed[1],)


def file_shape(t: torch.Tensor, dtype_name: str) -> Tuple[int, ...]:
    """The shape a file records for tensor t saved as `dtype_name`: t's,
    with the last dimension counting values for a packed dtype."""
    shape = tuple(t.shape)
    packed = PACKED.get(dtype_name)
    return shape if packed is None else shape[:-1] + (shape[-1] * packed[1],)


def code_of(name: str) -> int:
    """enum ckptio_dtype of a safetensors dtype name (from the library)."""
    return dtype_code(name)


def _memory_span(t: torch.Tensor) -> Tuple[int, int]:
    """[first byte, end) of the memory t's elements lie in: as far as its
    strides reach, not only numel's bytes (a non-contiguous view's do)."""
    begin = t.data_ptr()
    if not t.nelement():
        return begin, begin
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return begin, begin + (last + 1) * t.element_size()


def overlapping(tensors: Iterable[Tuple[str, torch.Tensor]]) -> List[List[str]]:
    """Names of the tensors whose memory overlaps, in groups of two or more
    (what safetensors calls tensors that share memory; views of distinct
    parts of one storage do not). Meta and empty tensors have no memory."""
    spans = sorted((str(t.device), *_memory_span(t), name) for name, t in tensors if not t.is_meta and t.nelement())
    groups: List[List[str]] = []
    reach: Tuple[str, int] = ("", 0)  # the furthest end so far in the current group: device, end
    for device, begin, end, name in spans:
        if groups and device == reach[0] and begin < reach[1]:
            groups[-1].append(name)
            reach = (device, max(end, reach[1]))
        else:
            groups.append([name])
            reach = (device, end)
    return [sorted(g) for g in groups if len(g) > 1]


# ------------------------------------------------------------------ devices

def cuda_unavailable(device: torch.device) -> Optional[str]:
    """Why tensors of `device` (a cuda torch.device) cannot be moved by ckptio
    here, or None. Both sides must see the GPU: ckptio copies, torch allocates."""
    why = ctypes.c_char_p()
    if not _lib.lib().ckptio_ctx_cuda(ctx(), ctypes.byref(why)):
        return (why.value or b"CUDA unavailable").decode(errors="replace")
    if not torch.cuda.is_available():
        return "CUDA unavailable: torch.cuda.is_available() is False"
    n = torch.cuda.device_count()
    if device.index is not None and device.index >= n:
        return f"CUDA device {device.index} does not exist (torch sees {n})"
    return None


def load_device(device: Device) -> Tuple[torch.device, int]:
    """The torch.device and the ckptio device code of a load destination."""
    if isinstance(device, int):
        device = torch.device("cuda", device)
    device = torch.device(device)
    if device.type == "cpu":
        return device, _lib.DEVICE_HOST
    if device.type != "cuda":
        raise ValueError(f"device must be cpu or cuda[:N], got {device}")
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device()
                              if torch.cuda.is_available() else 0)
    why = cuda_unavailable(device)
    if why:
        raise from_code(_lib.ERRORS["DEVICE"], f"cannot load to {device}: {why}")
    return device, _lib.device_cuda(device.index or 0)


def before_device_writes(device: torch.device) -> None:
    """ckptio writes a GPU destination on its own streams. Memory torch.empty
    just handed out may have been freed by a tensor that kernels queued on the
    current stream still read (the caching allocator reuses it at once on the
    same stream), so that stream must drain before ckptio writes over it."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


# --------------------------------------------------------------------- save

def as_saveable(name: str, t: Any, packed: bool = True) -> Tuple[torch.Tensor, str, int]:
    """(tensor whose memory is saved, dtype name, device code). packed:
    take the PACKED dtypes (the writer is given file_shape's shape)."""
    if not isinstance(t, torch.Tensor):
        raise CkptioTypeError(f"tensor {name!r} is invalid: expected a torch.Tensor, received "
                              f"{type(t).__name__}")
    if t.layout != torch.strided:
        raise CkptioTypeError(f"tensor {name!r}: {t.layout} tensors are not supported (sparse and other "
                              "layouts); convert to a dense tensor first (.to_dense())")
    if t.is_quantized or t.is_nested:
        raise TypeError(f"tensor {name!r}: quantized and nested tensors are not supported")
    dtype = NAME_OF.get(t.dtype) or (_PACKED_NAME.get(t.dtype) if packed else None)
    if dtype in PACKED and t.dim() == 0:
        raise from_code(_lib.ERRORS["SHAPE"], f"tensor {name!r}: a 0-d {t.dtype} has no last dimension "
                        "to count its packed values in (safetensors refuses it too)")
    if dtype is None:
        raise TypeError(f"tensor {name!r}: torch dtype {t.dtype} has no safetensors dtype "
                        f"(supported: {', '.join(str(d) for d in [*NAME_OF, *_PACKED_NAME])})")
    if t.device.type == "cpu":
        device = _lib.DEVICE_HOST
    elif t.device.type == "cuda":
        device = _lib.device_cuda(t.device.index or 0)
    else:
        # (meta included: it has no bytes to save; safetensors fails on it too)
        raise TypeError(f"tensor {name!r}: device {t.device} is not supported (cpu or cuda)")
    if t.dim() > _lib.MAX_DIMS:
        raise ValueError(f"tensor {name!r}: {t.dim()} dims, at most {_lib.MAX_DIMS}")
    # The library reads raw memory: lazy conjugate / negative bits and strides
    # must be materialised (a copy, on the tensor's device).
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    return t, dtype, device


WriterFn = Callable[..., Any]


class WriterOps:
    """The ckptio_writer_* calls a SaveHandle makes: the same for one file
    and for a set of shards (one writer API). A managed save replaces close
    (and close_detail) with its own (ckptio.manager)."""

    NAMES = ("set_metadata", "set_stream", "add", "commit_async", "wait_snapshot",
             "wait_durable", "poll_snapshot", "poll_durable", "progress", "stats",
             "last_error")

    def __init__(self) -> None:
        lib = _lib.lib()
        self.set_metadata: WriterFn = lib.ckptio_writer_set_metadata
        self.set_stream: WriterFn = lib.ckptio_writer_set_stream
        self.add: WriterFn = lib.ckptio_writer_add
        self.commit_async: WriterFn = lib.ckptio_writer_commit_async
        self.wait_snapshot: WriterFn = lib.ckptio_writer_wait_snapshot
        self.wait_durable: WriterFn = lib.ckptio_writer_wait_durable
        self.poll_snapshot: WriterFn = lib.ckptio_writer_poll_snapshot
        self.poll_durable: WriterFn = lib.ckptio_writer_poll_durable
        self.progress: WriterFn = lib.ckptio_writer_progress
        self.stats: WriterFn = lib.ckptio_writer_stats
        self.last_error: WriterFn = lib.ckptio_writer_last_error
        self._close: WriterFn = lib.ckptio_writer_close

    def close(self, w: ctypes.c_void_p) -> int:
        """Ends the writer: its save's outcome (0 or a negative code)."""
        return int(self._close(w))

    def close_detail(self, w: ctypes.c_void_p) -> Optional[bytes]:
        """The detail of a failed close (read before the writer is freed:
        ckptio_writer_close frees it, so there is none to read after)."""
        return None


_ops: Optional[WriterOps] = None


def writer_ops() -> WriterOps:
    """The WriterOps of plain (unmanaged) saves, made once."""
    global _ops
    if _ops is None:
        _ops = WriterOps()
    return _ops


class SaveHandle:
    """A save running in the background (ckptio.torch.save_file_async, a set
    of shards from save_torch_state_dict_async, or a checkpoint of
    ckptio.manager). It holds the tensors until the save is durable.

    wait_snapshot(): returns once every byte has been copied out of the
        tensors (into staging or onto disk); from then on they may be modified.
    wait_durable(): returns once the file is complete, synced and renamed into
        place, then frees the writer and drops the tensors.
    done(): True once the save has finished, successfully or not (then
        wait_durable() returns or raises at once).
    Both waits raise the save's CkptioError (an OSError for a disk error)
    if it failed, every time they are called.
    Any thread may call these methods, also concurrently. A handle dropped
    before the save ended waits for it when collected (or at exit)."""

    def __init__(self, writer: ctypes.c_void_p, keep: List[torch.Tensor], filename: str,
                 ops: Optional[WriterOps] = None) -> None:
        self.filename = filename
        self._ops = ops or writer_ops()  # the ckptio_writer_* calls
        self._w: Optional[ctypes.c_void_p] = writer
        self._keep: Optional[List[torch.Tensor]] = keep
        self._cv = threading.Condition()
        self._active = 0                   # C calls on the writer in flight
        self._closing = False              # close() began: no new C calls
        self._closed = threading.Event()   # close() ended: writer freed
        self._error: Optional[CkptioError] = None  # the save's failure, once known
        self._final_progress = (0, 0)
        self._final_stats: Optional[Dict[str, Any]] = None
        _live.add(self)

    def _call(self, fn: Callable[[Optional[ctypes.c_void_p]], Optional[int]],
              block: bool = True) -> Optional[int]:
        """fn(writer) -> rc on the open writer, recording a failure. None once
        the writer is being closed (after waiting for that, if block)."""
        with self._cv:
            closing = self._closing
            if not closing:
                self._active += 1
        if closing:
            if block:
                self._closed.wait()
            return None
        try:
            rc = fn(self._w)
            if rc is not None and rc < 0:
                self._record(rc, self._ops.last_error(self._w))
            return rc
        finally:
            with self._cv:
                self._active -= 1
                self._cv.notify_all()

    def _record(self, rc: int, detail: Optional[bytes] = None) -> None:
        try:
            check(rc, f"cannot save {self.filename}", detail, self.filename)
        except CkptioError as e:
            with self._cv:
                if self._error is None:
                    self._error = e

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def wait_snapshot(self) -> None:
        """Blocks until the tensors may be modified. Raises the save's
        CkptioError."""
        self._call(self._ops.wait_snapshot)
        self._raise()

    def wait_durable(self) -> None:
        """Blocks until the file is durable, then releases the writer and the
        tensors. Raises the save's CkptioError."""
        self._call(self._ops.wait_durable)
        self.close()
        self._raise()

    def done(self) -> bool:
        """True when the save has finished (durable, or failed). Never blocks."""
        rc = self._call(self._ops.poll_durable, block=False)
        return self._closed.is_set() if rc is None else rc != 0

    def snapshot_done(self) -> bool:
        """True when wait_snapshot() would return at once. Never blocks."""
        rc = self._call(self._ops.poll_snapshot, block=False)
        return self._closed.is_set() if rc is None else rc != 0

    def progress(self) -> Tuple[int, int]:
        """(bytes of tensor data written so far, bytes in all)."""
        done, total = ctypes.c_uint64(), ctypes.c_uint64()

        def get(w: Optional[ctypes.c_void_p]) -> int:
            self._ops.progress(w, ctypes.byref(done), ctypes.byref(total))
            return 0
        rc = self._call(get)
        return self._final_progress if rc is None else (done.value, total.value)

    def stats(self) -> Optional[Dict[str, Any]]:
        """Where the save's time went (ckptio_writer_stats; for a set of
        shards, summed over the shards) as a dict: bytes,
        seconds (wall, commit to durable), snapshot_seconds, and the busy
        seconds of each stage summed over the workers (device, copy, write,
        commit), threads, staging_bytes. While the save runs, the figures so
        far; after close, those of the whole save."""
        box: List[Optional[Dict[str, Any]]] = []

        def get(w: Optional[ctypes.c_void_p]) -> int:
            box.append(_lib.Stats.read(self._ops.stats, w))
            return 0
        rc = self._call(get)
        return self._final_stats if rc is None else box[0]

    def close(self) -> None:
        """Waits for the save, frees the writer, drops the tensors. Idempotent;
        raises nothing (wait_durable reports the outcome)."""
        with self._cv:
            first = not self._closing
            self._closing = True
            while first and self._active:  # calls in flight end by durable at the latest
                self._cv.wait()
        if not first:
            self._closed.wait()
            return
        ops, w = self._ops, self._w
        assert w is not None
        done, total = ctypes.c_uint64(), ctypes.c_uint64()
        ops.progress(w, ctypes.byref(done), ctypes.byref(total))
        self._final_progress = (done.value, total.value)
        ops.wait_durable(w)  # the stats of the whole save
        self._final_stats = _lib.Stats.read(ops.stats, w)
        rc = ops.close(w)  # the save's outcome
        if rc < 0:
            self._record(rc, ops.close_detail(w))
        self._w = None
        self._keep = None
        _live.discard(self)
        self._closed.set()

    def __enter__(self) -> "SaveHandle":
        return self

    def __exit__(self, exc_type: Optional[type], *exc: object) -> None:
        if exc_type is None:
            self.wait_durable()
        else:
            self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing to report to in a finalizer
            pass

    def __repr__(self) -> str:
        state = "closed" if self._closed.is_set() else "open"
        return f"<ckptio.torch.SaveHandle {self.filename!r} {state}>"

    def _leave_to_parent(self) -> None:
        """In a forked child: the save runs in the parent, whose threads the
        child has not; the handle ends here as closed, its calls raise at
        once, and the writer is never touched."""
        self._cv = threading.Condition()
        self._closing = True
        self._closed = threading.Event()
        self._closed.set()
        self._w = None
        self._keep = None
        self._error = from_code(_lib.ERRORS["STATE"], f"{self.filename}: this save runs in the process "
                                f"{os.getppid()} that forked this one; only it can wait for the save")


# Handles whose writer is open: the context must not be freed under them at
# exit. Registered after the context's own atexit hook, so it runs before it.
_live: "weakref.WeakSet[SaveHandle]" = weakref.WeakSet()
_atexit_lock = threading.Lock()
_atexit_done = False


def _close_live() -> None:
    for h in list(_live):
        h.close()


def _leave_live_to_parent() -> None:
    global _atexit_lock
    _atexit_lock = threading.Lock()
    for h in list(_live):
        h._leave_to_parent()
    _live.clear()


os.register_at_fork(after_in_child=_leave_live_to_parent)


def _register_atexit() -> None:
    global _atexit_done
    with _atexit_lock:
        if not _atexit_done:
            atexit.register(_close_live)
            _atexit_done = True


class Plan(NamedTuple):
    """A checked save: [(name, tensor, dtype name, device code)],
    [(key, value)], {device code: the CUDA stream to order after}."""
    tensors: List[Tuple[str, torch.Tensor, str, int]]
    meta: List[Tuple[str, str]]
    streams: Dict[int, int]


def plan(tensors: Mapping[str, torch.Tensor], metadata: Optional[Mapping[str, str]]) -> Plan:
    """Checks everything (and copies non-contiguous tensors) before a writer
    exists, so a bad input costs no file work."""
    if sys.byteorder != "little":
        raise NotImplementedError("ckptio.torch needs a little-endian host")
    if not isinstance(tensors, collections.abc.Mapping):
        raise CkptioTypeError("tensors must be a mapping (a dict) of str -> torch.Tensor, "
                              f"got {type(tensors).__name__}")
    if metadata is not None and not isinstance(metadata, collections.abc.Mapping):
        raise TypeError(f"metadata must be a mapping (a dict) of str -> str, got {type(metadata).__name__}")
    items = []
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, got {name!r}")
        items.append((name, *as_saveable(name, t)))
    meta = []
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"metadata must map str to str, got {key!r}: {value!r}")
        meta.append((key, value))
    # The stream each device's tensors were produced on, read now: it is the
    # caller's current stream at the time of the save call.
    streams: Dict[int, int] = {}
    for name, t, dtype, device in items:
        if device != _lib.DEVICE_HOST and device not in streams:
            streams[device] = torch.cuda.current_stream(t.device).cuda_stream
    return Plan(items, meta, streams)


def start(opener: Callable[..., int], path: PathLike, crc: bool, open_args: Iterable[Any],
          p: Plan, prepare: Optional[Callable[[ctypes.c_void_p], int]] = None) -> SaveHandle:
    """Opens a writer with `opener` (ckptio_writer_open or
    ckptio_writer_open_sharded, called as opener(ctx, path, *open_args, opts,
    &w)), calls prepare(w) if given (a ckptio_writer_* call before the
    tensors: its code is checked), fills it and starts its commit: a
    SaveHandle. On failure the writer is closed (uncommitted: nothing
    written)."""
    lib = _lib.lib()
    context = ctx()
    fspath = os.fsencode(os.fspath(path))
    shown = os.fsdecode(fspath)
    opts = options(context, crc)
    w = ctypes.c_void_p()
    check(opener(context, fspath, *open_args, ctypes.byref(opts), ctypes.byref(w)),
          f"cannot save {shown}", lib.ckptio_last_open_error(), shown)
    ops = writer_ops()
    if prepare is not None:
        try:
            check(prepare(w), f"cannot save {shown}", ops.last_error(w), shown)
        except BaseException:
            ops.close(w)
            raise
    return fill_and_commit(w, shown, p, ops)


def tensor_desc(name: str, t: torch.Tensor, dtype: str, device: int) -> "_lib.Tensor_":
    """The ckptio_tensor of an as_saveable tensor (its memory borrowed)."""
    shape = file_shape(t, dtype)
    return _lib.Tensor_(name.encode(), code_of(dtype), len(shape), (ctypes.c_int64 * _lib.MAX_DIMS)(*shape),
                        t.data_ptr(), device)


def fill_and_commit(w: ctypes.c_void_p, shown: str, p: Plan, ops: WriterOps) -> SaveHandle:
    """Fills the open writer `w` from a Plan and starts its commit: a
    SaveHandle making its calls through `ops` (writer_ops(), or one whose
    close also ends a managed save; see ckptio/manager.py). On failure the
    writer is closed with ops.close (uncommitted: nothing written)."""
    _register_atexit()
    try:
        for key, value in p.meta:
            check(ops.set_metadata(w, key.encode(), value.encode()),
                  f"{shown}: metadata {key!r}", ops.last_error(w))
        for device, stream in p.streams.items():
            check(ops.set_stream(w, device, stream),
                  f"{shown}: CUDA stream of device {device - 1}", ops.last_error(w))
        for name, t, dtype, device in p.tensors:
            desc = tensor_desc(name, t, dtype, device)
            check(ops.add(w, ctypes.byref(desc)), f"{shown}: tensor {name!r}",
                  ops.last_error(w))
        check(ops.commit_async(w), f"cannot save {shown}", ops.last_error(w), shown)
    except BaseException:
        ops.close(w)
        raise
    # The tensors (and the contiguous copies made by plan) stay referenced by
    # the handle until the save is durable.
    return SaveHandle(w, [t for _, t, _, _ in p.tensors], shown, ops)


# --------------------------------------------------------------------- load

def numel_size(shape: Tuple[int, ...], dtype: torch.dtype) -> Tuple[int, int]:
    """Elements of `shape` and bytes of one `dtype` element."""
    numel = 1
    for d in shape:
        numel *= d
    return numel, torch.empty((), dtype=dtype).element_size()


class TorchReader(Reader):
    """A Reader whose loads make torch tensors on one device."""

    def __init__(self, path: PathLike, device: Device, mmap: Optional[bool] = False,
                 direct: bool = False, open_flags: int = 0) -> None:
        """mmap as Reader's mapped (None: map a resident file), on the CPU
        only; direct and open_flags as Reader's."""
        self.device, self.code = load_device(device)
        super().__init__(path, crc=True, mapped=mmap if self.device.type == "cpu" else False, direct=direct,
                         open_flags=open_flags)
        self.entries: List[_lib.TensorInfo] = []
        self.by_name: Dict[str, int] = {}
        self._indexed = False

    def index(self) -> List[_lib.TensorInfo]:
        """The tensors' infos (read once); by_name maps names to indices."""
        if not self._indexed:
            self.entries = self.infos()
            self.by_name = {info.name.decode(): i for i, info in enumerate(self.entries)}
            self._indexed = True
        return self.entries

    def torch_dtype(self, i: int) -> torch.dtype:
        """The torch dtype of tensor i element for element (group loads'
        boxes); CkptioValueError (DTYPE) naming it when torch has none (F6)
        or packs it (F4: see layout)."""
        info = self.entries[i]
        dtype_name = self.dtype_name(info)
        dtype = TORCH_DTYPES.get(dtype_name)
        if dtype is None:
            raise from_code(_lib.ERRORS["DTYPE"],
                            f"{self.shown}: tensor {info.name.decode()!r} is {dtype_name}, which "
                            "has no torch dtype; ckptio.load_file (numpy) returns its raw bytes")
        return dtype

    def layout(self, i: int) -> Tuple[torch.dtype, Tuple[int, ...]]:
        """The torch dtype and shape of tensor i (torch_layout's);
        CkptioValueError (DTYPE) naming it when torch cannot hold it."""
        info = self.entries[i]
        dtype_name = self.dtype_name(info)
        layout = torch_layout(dtype_name, tuple(info.shape[:info.ndim]))
        if layout is None:
            raise from_code(_lib.ERRORS["DTYPE"],
                            f"{self.shown}: tensor {info.name.decode()!r} is {dtype_name} "
                            f"{list(info.shape[:info.ndim])}, which has no torch dtype; ckptio.load_file "
                            "(numpy) returns its raw bytes")
        return layout

    def empty(self, i: int, placer: Optional[_placer.Placer] = None
              ) -> Tuple[str, torch.Tensor, _lib.LoadRequest]:
        """A destination for tensor i (in placer's mapping when it places
        it), and its load request."""
        info = self.entries[i]
        name = info.name.decode()
        dtype, shape = self.layout(i)
        numel, size = numel_size(shape, dtype)
        if numel * size != info.nbytes:
            raise from_code(_lib.ERRORS["TENSOR_INFO"],
                            f"{self.shown}: tensor {name!r}: {self.dtype_name(info)} "
                            f"{list(info.shape[:info.ndim])} is {numel * size} bytes, the file says {info.nbytes}")
        place = placer.placed(i, size) if placer is not None else None
        if place is not None:
            t = torch.frombuffer(place[0], dtype=dtype, count=numel,
                                 offset=place[1]).view(shape)
        else:
            t = torch.empty(shape, dtype=dtype, device=self.device)
        return name, t, _lib.LoadRequest(i, t.data_ptr(), info.nbytes, self.code)

    def load(self, indices: Iterable[int], mmap: bool = False,
             arenas: Optional[_placer.Arenas] = None) -> Dict[str, torch.Tensor]:
        """New tensors for `indices`; with mmap (CPU only), views of a private
        mapping of the file where possible (see load_file), the rest copied
        (the large ones into a mapping from `arenas` when given)."""
        indices = list(indices)
        mapping = None
        if mmap and indices and self.device.type == "cpu":
            mapping = _mapped.map_file(self)
        out: Dict[str, torch.Tensor] = {}
        reqs = (_lib.LoadRequest * max(len(indices), 1))()
        n = 0
        views = {i: self.view(i, mapping) for i in indices} if mapping is not None else {}
        placer = (_placer.Placer(self.entries, (i for i in indices if views.get(i) is None), arenas)
                  if self.device.type == "cpu" else None)
        for i in indices:
            view = views.get(i)
            if view is not None:
                out[self.entries[i].name.decode()] = view
                continue
            name, t, reqs[n] = self.empty(i, placer)
            out[name] = t
            n += 1
        if n:
            before_device_writes(self.device)
            self.check(self.lib.ckptio_reader_load_many(self.handle, reqs, n), "load")
        return out

    def load_into(self, targets: Mapping[int, torch.Tensor]) -> None:
        """Reads tensor i straight into targets[i], each contiguous, of the
        file's dtype and shape, on the CPU or a GPU ckptio can write (see
        fits_in_place), in one parallel load; every CRC checked. The memory
        is written before the CRCs are compared, so on an error a target may
        hold part of the file."""
        if not targets:
            return
        for device in {t.device for t in targets.values()}:
            before_device_writes(device)
        reqs = (_lib.LoadRequest * len(targets))()
        for n, (i, t) in enumerate(targets.items()):
            reqs[n] = _lib.LoadRequest(i, t.data_ptr(), self.entries[i].nbytes, load_device(t.device)[1])
        self.check(self.lib.ckptio_reader_load_many(self.handle, reqs, len(targets)), "load")
        # As copy_ would: autograd sees the tensors changed (by the public
        # call where this torch has it).
        bump = getattr(torch.autograd.graph, "increment_version", None) or torch._C._increment_version
        for t in targets.values():
            bump(t)

    def load_group(self, boxes: Sequence[Tuple[int, Sequence[int], Sequence[int], Optional[torch.Tensor]]],
                   group: "Group", staging_bytes: Optional[int], exchange: bool = False) -> List[torch.Tensor]:
        """Collective over `group`: box (i, start, stop, into) of each entry,
        into `into` (contiguous, of the box's dtype and shape) or a new
        tensor on this reader's device, read once per group
        (ckptio_reader_load_boxes_group; exchange: CKPTIO_GROUP_EXCHANGE).
        Raises the group's failure (the communicator's own error chained)."""
        out: List[torch.Tensor] = []
        reqs = (_lib.BoxRequest * max(len(boxes), 1))()
        for n, (i, start, stop, into) in enumerate(boxes):
            shape = tuple(b - a for a, b in zip(start, stop))
            t = into if into is not None else torch.empty(shape, dtype=self.torch_dtype(i), device=self.device)
            q = reqs[n]
            q.index = i
            for d, (a, b) in enumerate(zip(start, stop)):
                q.start[d], q.stop[d] = a, b
            q.dst, q.dst_bytes, q.device = t.data_ptr(), t.nelement() * t.element_size(), load_device(t.device)[1]
            out.append(t)
        for device in {t.device for t in out}:
            before_device_writes(device)
        rc = self.lib.ckptio_reader_load_boxes_group(self.handle, ctypes.byref(group.comm), reqs, len(boxes),
                                                     staging_bytes or 0, _lib.GROUP_EXCHANGE if exchange else 0)
        if rc < 0 and group.error is not None:
            detail = self.lib.ckptio_reader_last_error(self.handle).decode(errors="replace")
            raise from_code(rc, f"{detail}: {group.error}", detail, self.shown) from group.error
        self.check(rc, "group load")
        return out

    def fits_in_place(self, i: int, t: torch.Tensor) -> bool:
        """Whether tensor i of the file can be read straight into t."""
        if not t.is_contiguous() or t.device.type not in ("cpu", "cuda"):
            return False
        if t.device.type == "cuda" and cuda_unavailable(t.device):
            return False
        info = self.entries[i]
        return (torch_layout(self.dtype_name(info), tuple(info.shape[:info.ndim])) == (t.dtype, tuple(t.shape))
                and t.nelement() * t.element_size() == info.nbytes)

    def view(self, i: int, mapping: "ctypes.Array[ctypes.c_uint8]") -> Optional[torch.Tensor]:
        """Tensor i as a view of the mapping, or None when it must be copied."""
        info = self.entries[i]
        layout = torch_layout(self.dtype_name(info), tuple(info.shape[:info.ndim]))
        if layout is None:
            return None  # empty() names the missing dtype
        dtype, shape = layout
        numel, size = numel_size(shape, dtype)
        if numel * size != info.nbytes or not _mapped.viewable(self, i, info, size):
            return None
        # torch.frombuffer keeps `mapping` alive for as long as the tensor (or
        # any view of it) lives. A writable buffer: no read-only warning.
        return torch.frombuffer(mapping, dtype=dtype, count=numel,
                                offset=info.offset).view(shape)
