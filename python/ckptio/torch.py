"""ckptio for PyTorch: save_file / load_file / safe_open as in safetensors.torch,
on libckptio through ctypes (no compiled extension).

Tensor memory goes to the library by pointer (Tensor.data_ptr()); Python
copies nothing, except that a tensor which is not a plain contiguous strided
tensor (non-contiguous, or a lazily conjugated / negated view) is first made
one, and that copy costs the tensor's size on its device. Loads allocate the
destinations on the requested device (on the CPU placed for O_DIRECT, see
_mapped.placed) and fill them in one parallel ckptio_reader_load_many, with the
CRC32s checked.

CUDA tensors are saved from the GPU by the library (device =
CKPTIO_DEVICE_CUDA(index)); the snapshot is ordered after the work queued on
each device's current stream (torch.cuda.current_stream) when the save starts.
"""

import atexit
import ctypes
import os
import re
import sys
import threading
import weakref

import torch

from . import _lib, _mapped
from . import CkptioError, ERRORS, _check, _ctx, _options, _dtype_code, _Reader
from .errors import from_code

__all__ = ["save_file", "save_file_async", "save_torch_state_dict",
           "save_torch_state_dict_async", "load_file", "safe_open", "SaveHandle",
           "CkptioError", "TORCH_DTYPES"]

# safetensors dtype name -> torch dtype, for every dtype both have. F4 / F6 have
# no torch dtype (float4_e2m1fn_x2 packs two values per element, so its shape
# is not the tensor's), and torch's complex32 / complex128 have no safetensors one.
_TORCH_NAMES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
    "I32": "int32", "U32": "uint32", "I64": "int64", "U64": "uint64",
    "F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
    "C64": "complex64", "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn",
    "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu",
}
# Older torch lacks some (uint16/32/64 came in 2.3, float8_e8m0fnu in 2.7).
TORCH_DTYPES = {st: getattr(torch, name) for st, name in _TORCH_NAMES.items()
                if hasattr(torch, name)}
_NAME_OF = {dt: name for name, dt in TORCH_DTYPES.items()}

_FORMATS = {"safetensors": _lib.FORMAT_SAFETENSORS, "pt": _lib.FORMAT_PYTORCH}


def _code_of(name, cache={}):  # noqa: B006 - a per-process cache of enum values
    # The enum values come from the library (ckptio_dtype_parse), not a copy.
    if name not in cache:
        cache[name] = _dtype_code(name)
    return cache[name]


# ------------------------------------------------------------------ devices

def _cuda_unavailable(device):
    """Why tensors of `device` (a cuda torch.device) cannot be moved by ckptio
    here, or None. Both sides must see the GPU: ckptio copies, torch allocates."""
    why = ctypes.c_char_p()
    if not _lib.lib().ckptio_ctx_cuda(_ctx(), ctypes.byref(why)):
        return (why.value or b"CUDA unavailable").decode(errors="replace")
    if not torch.cuda.is_available():
        return "CUDA unavailable: torch.cuda.is_available() is False"
    n = torch.cuda.device_count()
    if device.index >= n:
        return f"CUDA device {device.index} does not exist (torch sees {n})"
    return None


def _load_device(device):
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
    why = _cuda_unavailable(device)
    if why:
        raise from_code(ERRORS["DEVICE"], f"cannot load to {device}: {why}")
    return device, _lib.device_cuda(device.index)


def _before_device_writes(device):
    """ckptio writes a GPU destination on its own streams. Memory torch.empty
    just handed out may have been freed by a tensor that kernels queued on the
    current stream still read (the caching allocator reuses it at once on the
    same stream), so that stream must drain before ckptio writes over it."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


# --------------------------------------------------------------------- save

def _as_saveable(name, t):
    """(tensor whose memory is saved, dtype name, device code)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"tensor {name!r}: expected a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise TypeError(f"tensor {name!r}: {t.layout} tensors are not supported; "
                        "convert to a dense tensor first")
    if t.is_quantized or t.is_nested:
        raise TypeError(f"tensor {name!r}: quantized and nested tensors are not supported")
    dtype = _NAME_OF.get(t.dtype)
    if dtype is None:
        raise TypeError(f"tensor {name!r}: torch dtype {t.dtype} has no safetensors dtype "
                        f"(supported: {', '.join(str(d) for d in _NAME_OF)})")
    if t.device.type == "cpu":
        device = _lib.DEVICE_HOST
    elif t.device.type == "cuda":
        device = _lib.device_cuda(t.device.index)
    else:
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


class _Ops:
    """The ckptio_writer_* calls a SaveHandle makes: the same for one file
    and for a set of shards (one writer API)."""

    NAMES = ("set_metadata", "set_stream", "add", "commit_async", "wait_snapshot",
             "wait_durable", "poll_snapshot", "poll_durable", "progress", "stats", "close",
             "last_error")
    _the = None

    def __init__(self):
        lib = _lib.lib()
        for name in self.NAMES:
            setattr(self, name, getattr(lib, f"ckptio_writer_{name}"))

    @classmethod
    def get(cls):
        if cls._the is None:
            cls._the = cls()
        return cls._the


class SaveHandle:
    """A save running in the background (save_file_async, or a set of shards
    from save_torch_state_dict_async). It holds the tensors until the save is
    durable.

    wait_snapshot(): returns once every byte has been copied out of the
        tensors (into staging or onto disk); from then on they may be modified.
    wait_durable(): returns once the file is complete, synced and renamed into
        place, then frees the writer and drops the tensors.
    done(): True once the save has finished, successfully or not (then
        wait_durable() returns or raises at once).
    Both waits raise CkptioError if the save failed, every time they are called.
    Any thread may call these methods, also concurrently. A handle dropped
    before the save ended waits for it when collected (or at exit)."""

    def __init__(self, writer, keep, filename, ops=None):
        self.filename = filename
        self._ops = ops or _Ops.get()  # the ckptio_writer_* calls
        self._w = writer
        self._keep = keep
        self._cv = threading.Condition()
        self._active = 0                   # C calls on the writer in flight
        self._closing = False              # close() began: no new C calls
        self._closed = threading.Event()   # close() ended: writer freed
        self._error = None                 # the save's CkptioError, once known
        self._final_progress = (0, 0)
        self._final_stats = None
        _live.add(self)

    def _call(self, fn, block=True):
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

    def _record(self, rc, detail=None):
        try:
            _check(rc, f"cannot save {self.filename}", detail)
        except CkptioError as e:
            with self._cv:
                if self._error is None:
                    self._error = e

    def _raise(self):
        if self._error is not None:
            raise self._error

    def wait_snapshot(self):
        """Blocks until the tensors may be modified. Raises CkptioError."""
        self._call(self._ops.wait_snapshot)
        self._raise()

    def wait_durable(self):
        """Blocks until the file is durable, then releases the writer and the
        tensors. Raises CkptioError."""
        self._call(self._ops.wait_durable)
        self.close()
        self._raise()

    def done(self):
        """True when the save has finished (durable, or failed). Never blocks."""
        rc = self._call(self._ops.poll_durable, block=False)
        return self._closed.is_set() if rc is None else rc != 0

    def snapshot_done(self):
        """True when wait_snapshot() would return at once. Never blocks."""
        rc = self._call(self._ops.poll_snapshot, block=False)
        return self._closed.is_set() if rc is None else rc != 0

    def progress(self):
        """(bytes of tensor data written so far, bytes in all)."""
        done, total = ctypes.c_uint64(), ctypes.c_uint64()
        rc = self._call(lambda w: self._ops.progress(
            w, ctypes.byref(done), ctypes.byref(total)) or 0)
        return self._final_progress if rc is None else (done.value, total.value)

    def stats(self):
        """Where the save's time went (ckptio_writer_stats; for a set of
        shards, summed over the shards) as a dict: bytes,
        seconds (wall, commit to durable), snapshot_seconds, and the busy
        seconds of each stage summed over the workers (device, copy, write,
        commit), threads, staging_bytes. While the save runs, the figures so
        far; after close, those of the whole save."""
        box = []

        def get(w):
            box.append(_mapped.stats(_lib.lib(), self._ops.stats, w))
            return 0
        rc = self._call(get)
        return self._final_stats if rc is None else box[0]

    def close(self):
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
        ops = self._ops
        done, total = ctypes.c_uint64(), ctypes.c_uint64()
        ops.progress(self._w, ctypes.byref(done), ctypes.byref(total))
        self._final_progress = (done.value, total.value)
        ops.wait_durable(self._w)  # the stats of the whole save
        self._final_stats = _mapped.stats(_lib.lib(), ops.stats, self._w)
        rc = ops.close(self._w)  # the save's outcome
        if rc < 0:
            self._record(rc, ops.close_detail() if hasattr(ops, "close_detail") else None)
        self._w = None
        self._keep = None
        _live.discard(self)
        self._closed.set()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.wait_durable()
        else:
            self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing to report to in a finalizer
            pass

    def __repr__(self):
        state = "closed" if self._closed.is_set() else "open"
        return f"<ckptio.torch.SaveHandle {self.filename!r} {state}>"


# Handles whose writer is open: the context must not be freed under them at
# exit. Registered after the context's own atexit hook, so it runs before it.
_live = weakref.WeakSet()
_atexit_lock = threading.Lock()
_atexit_done = False


def _close_live():
    for h in list(_live):
        h.close()


def _register_atexit():
    global _atexit_done
    with _atexit_lock:
        if not _atexit_done:
            atexit.register(_close_live)
            _atexit_done = True


def _plan(tensors, metadata):
    """Checks everything (and copies non-contiguous tensors) before a writer
    exists, so a bad input costs no file work: [(name, tensor, dtype name,
    device code)], [(key, value)], {device code: the CUDA stream to order
    after}."""
    if sys.byteorder != "little":
        raise NotImplementedError("ckptio.torch needs a little-endian host")
    if not isinstance(tensors, dict):
        raise TypeError("tensors must be a dict of str -> torch.Tensor, "
                        f"got {type(tensors).__name__}")
    if metadata is not None and not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict of str -> str, got {type(metadata).__name__}")
    plan = []
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, got {name!r}")
        plan.append((name, *_as_saveable(name, t)))
    meta = []
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"metadata must map str to str, got {key!r}: {value!r}")
        meta.append((key, value))
    # The stream each device's tensors were produced on, read now: it is the
    # caller's current stream at the time of the save call.
    streams = {}
    for name, t, dtype, device in plan:
        if device != _lib.DEVICE_HOST and device not in streams:
            streams[device] = torch.cuda.current_stream(t.device).cuda_stream
    return plan, meta, streams


def _start(opener, path, crc, open_args, plan, meta, streams):
    """Opens a writer with `opener` ("open" or "open_sharded":
    ckptio_writer_<opener>(ctx, path, *open_args, opts, &w)), fills it and
    starts its commit: a SaveHandle. On failure the writer is closed
    (uncommitted: nothing written)."""
    lib = _lib.lib()
    ctx = _ctx()
    _register_atexit()
    ops = _Ops.get()
    fspath = os.fsencode(os.fspath(path))
    shown = os.fsdecode(fspath)
    opts = _options(ctx, crc)
    w = ctypes.c_void_p()
    _check(getattr(lib, f"ckptio_writer_{opener}")(ctx, fspath, *open_args, ctypes.byref(opts),
                                                    ctypes.byref(w)),
           f"cannot save {shown}", lib.ckptio_last_open_error(), shown)
    return _fill_and_commit(w, shown, plan, meta, streams, ops)


def _fill_and_commit(w, shown, plan, meta, streams, ops):
    """Fills the open writer `w` from _plan's output and starts its commit: a
    SaveHandle making its calls through `ops` (an _Ops, or one whose close
    also ends a managed save; see ckptio/manager.py). On failure the writer
    is closed with ops.close (uncommitted: nothing written)."""
    _register_atexit()
    try:
        for key, value in meta:
            _check(ops.set_metadata(w, key.encode(), value.encode()),
                   f"{shown}: metadata {key!r}", ops.last_error(w))
        for device, stream in streams.items():
            _check(ops.set_stream(w, device, stream),
                   f"{shown}: CUDA stream of device {device - 1}", ops.last_error(w))
        for name, t, dtype, device in plan:
            shape = tuple(t.shape)
            desc = _lib.Tensor_(name.encode(), _code_of(dtype), len(shape),
                                (ctypes.c_int64 * _lib.MAX_DIMS)(*shape), t.data_ptr(), device)
            _check(ops.add(w, ctypes.byref(desc)), f"{shown}: tensor {name!r}",
                   ops.last_error(w))
        _check(ops.commit_async(w), f"cannot save {shown}", ops.last_error(w))
    except BaseException:
        ops.close(w)
        raise
    # The tensors (and the contiguous copies made by _plan) stay referenced by
    # the handle until the save is durable.
    return SaveHandle(w, [t for _, t, _, _ in plan], shown, ops)


def save_file_async(tensors, filename, metadata=None, format="safetensors", crc=True):
    """Starts saving `tensors` (a dict of str -> torch.Tensor) at `filename`
    and returns a SaveHandle at once; see save_file for the arguments. Do not
    modify the tensors until handle.wait_snapshot() returns; the file exists
    (atomically) once handle.wait_durable() returns."""
    if format not in _FORMATS:
        raise ValueError(f"format must be one of {sorted(_FORMATS)}, got {format!r}")
    plan, meta, streams = _plan(tensors, metadata)
    return _start("open", filename, crc, (_FORMATS[format],), plan, meta, streams)


def save_file(tensors, filename, metadata=None, format="safetensors", crc=True):
    """Saves a dict of str -> torch.Tensor at `filename`, atomically (nothing
    appears there unless the whole save succeeds).

    format: "safetensors", or "pt" for a torch.save zip archive that
        torch.load(weights_only=True) opens (a dict of the tensors).
    metadata: dict of str -> str (safetensors __metadata__; in "pt" files a
        separate record that torch.load ignores).
    crc: record a CRC32 of every tensor (checked by load_file).
    Tensors on CPU or CUDA devices, any dtype in TORCH_DTYPES, up to 8 dims.
    Contiguous tensors are read in place; others are first copied by
    .contiguous() (and conjugate / negative views resolved)."""
    handle = save_file_async(tensors, filename, metadata=metadata, format=format, crc=crc)
    handle.wait_durable()


# ------------------------------------------------------------ sharded save

# huggingface_hub's units (powers of 1000), and transformers' binary ones.
_SIZE_UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SIZE_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([KMGT]I?B)\s*", re.IGNORECASE)


def parse_size(size):
    """Bytes from an int or a string such as "5GB" / "500MB" / "2GiB": KB, MB,
    GB, TB are powers of 1000 and a value may have a fraction ("1.5GB" =
    1500000000), as huggingface_hub's parse_size_to_int; KiB, MiB, GiB, TiB
    powers of 1024. Units are case-insensitive. ValueError for anything else
    or a size under 1 byte."""
    if isinstance(size, bool) or not isinstance(size, (int, str)):
        raise TypeError(f"max_shard_size must be an int (bytes) or a str such as '5GB', "
                        f"got {type(size).__name__}")
    if isinstance(size, str):
        m = _SIZE_RE.fullmatch(size)
        if not m:
            raise ValueError(f"max_shard_size {size!r} is not a size: use an int (bytes) or "
                             "a number with a unit, KB / MB / GB / TB (powers of 1000) or "
                             "KiB / MiB / GiB / TiB (powers of 1024), e.g. '5GB' or '500MiB'")
        value = int(float(m[1]) * _SIZE_UNITS[m[2].upper()])
    else:
        value = size
    if value < 1:
        raise ValueError(f"max_shard_size must be at least 1 byte, got {size!r}")
    if value >= 2**64:
        raise ValueError(f"max_shard_size {size!r} is too large (>= 2**64 bytes)")
    return value


def save_torch_state_dict_async(tensors, save_directory, max_shard_size="5GB", metadata=None,
                                prefix="model", crc=True):
    """Starts a sharded save of `tensors` into the existing directory
    `save_directory` and returns a SaveHandle at once (the same methods as
    save_file_async's; handle.filename is the directory). See
    save_torch_state_dict."""
    limit = parse_size(max_shard_size)
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    plan, meta, streams = _plan(tensors, metadata)
    # As huggingface_hub: every shard says format=pt (transformers requires
    # it); the caller's metadata may set another.
    if all(key != "format" for key, _ in meta):
        meta.insert(0, ("format", "pt"))
    # The shards huggingface_hub's split_torch_state_dict_into_shards cuts:
    # the library's CKPTIO_SHARD_ORDER_HF over the dict's order.
    return _start("open_sharded", save_directory, crc,
                  (prefix.encode(), _lib.FORMAT_SAFETENSORS, limit, _lib.SHARD_ORDER_HF),
                  plan, meta, streams)


def save_torch_state_dict(tensors, save_directory, max_shard_size="5GB", metadata=None,
                          prefix="model", crc=True):
    """Saves a dict of str -> torch.Tensor into `save_directory` (which must
    exist) as a Hugging Face sharded set, like huggingface_hub's
    save_torch_state_dict: {prefix}-00001-of-0000N.safetensors ... each
    holding at most max_shard_size bytes of tensor data (a larger tensor gets
    a shard of its own), split as huggingface_hub splits, and
    {prefix}.safetensors.index.json mapping every tensor to its shard.

    max_shard_size: int bytes, or a str such as "5GB" / "500MB" (powers of
        1000) or "2GiB" (powers of 1024); see parse_size.
    metadata: dict of str -> str, written into every shard's __metadata__,
        with "format": "pt" unless it sets "format".
    crc: record a CRC32 of every tensor (checked by load_file).
    The set is committed atomically (see README "Sharded checkpoints"): a
    failed save leaves the directory's files as they were and no temp file.
    ct.load_file(save_directory) loads it back; transformers and safetensors
    open it as they are. Tensors as for save_file (CPU or CUDA)."""
    handle = save_torch_state_dict_async(tensors, save_directory, max_shard_size=max_shard_size,
                                         metadata=metadata, prefix=prefix, crc=crc)
    handle.wait_durable()


# --------------------------------------------------------------------- load

def _numel_size(shape, dtype):
    """Elements of `shape` and bytes of one `dtype` element."""
    numel = 1
    for d in shape:
        numel *= d
    return numel, torch.empty((), dtype=dtype).element_size()


class _TorchReader(_Reader):
    def __init__(self, path, device, mmap=False):
        self.device, self.code = _load_device(device)
        super().__init__(path, crc=True, mapped=mmap and self.device.type == "cpu")
        self.entries = None

    def index(self):
        if self.entries is None:
            self.entries = self.infos()
            self.by_name = {info.name.decode(): i for i, info in enumerate(self.entries)}
        return self.entries

    def empty(self, i):
        """A torch.empty destination for tensor i, and its load request."""
        info = self.entries[i]
        name = info.name.decode()
        dtype_name = self.lib.ckptio_dtype_name(info.dtype).decode()
        dtype = TORCH_DTYPES.get(dtype_name)
        where = os.fsdecode(self.path)
        if dtype is None:
            raise from_code(ERRORS["DTYPE"],
                              f"{where}: tensor {name!r} is {dtype_name}, which has no torch "
                              "dtype; ckptio.load_file (numpy) returns its raw bytes")
        shape = tuple(info.shape[:info.ndim])
        numel, size = _numel_size(shape, dtype)
        if numel * size != info.nbytes:
            raise from_code(ERRORS["TENSOR_INFO"],
                              f"{where}: tensor {name!r}: {dtype_name} "
                              f"{list(shape)} is {numel * size} bytes, the file says {info.nbytes}")
        place = _mapped.placed(info.nbytes, info.offset, size) if self.device.type == "cpu" else None
        if place is not None:
            t = torch.frombuffer(place[0], dtype=dtype, count=numel, offset=place[1]).view(shape)
        else:
            t = torch.empty(shape, dtype=dtype, device=self.device)
        return name, t, _lib.LoadRequest(i, t.data_ptr(), info.nbytes, self.code)

    def load(self, indices, mmap=False):
        """New tensors for `indices`; with mmap (CPU only), views of a private
        mapping of the file where possible (see load_file), the rest copied."""
        mapping = None
        if mmap and indices and self.device.type == "cpu":
            mapping = _mapped.map_file(self)
        out, reqs, n = {}, (_lib.LoadRequest * max(len(indices), 1))(), 0
        for i in indices:
            view = self.view(i, mapping) if mapping is not None else None
            if view is not None:
                out[self.entries[i].name.decode()] = view
                continue
            name, t, reqs[n] = self.empty(i)
            out[name] = t
            n += 1
        if n:
            _before_device_writes(self.device)
            self.check(self.lib.ckptio_reader_load_many(self.handle, reqs, n), "load")
        return out

    def view(self, i, mapping):
        """Tensor i as a view of the mapping, or None when it must be copied."""
        info = self.entries[i]
        dtype = TORCH_DTYPES.get(self.lib.ckptio_dtype_name(info.dtype).decode())
        if dtype is None:
            return None  # empty() names the missing dtype
        shape = tuple(info.shape[:info.ndim])
        numel, size = _numel_size(shape, dtype)
        if numel * size != info.nbytes or not _mapped.viewable(self, i, info, size):
            return None
        # torch.frombuffer keeps `mapping` alive for as long as the tensor (or
        # any view of it) lives. A writable buffer: no read-only warning.
        return torch.frombuffer(mapping, dtype=dtype, count=numel, offset=info.offset).view(shape)

    def metadata(self):
        out = {}
        for i in range(self.lib.ckptio_reader_metadata_count(self.handle)):
            key, value = ctypes.c_char_p(), ctypes.c_char_p()
            self.check(self.lib.ckptio_reader_metadata_at(
                self.handle, i, ctypes.byref(key), ctypes.byref(value)), f"metadata {i}")
            out[key.value.decode()] = value.value.decode()
        return out


def load_file(filename, device="cpu", mmap=True):
    """Loads every tensor of a safetensors or torch.save (.pt) file onto
    `device` ("cpu", "cuda", "cuda:N", an int N, or a torch.device): a dict
    of str -> torch.Tensor in file order. Recorded CRC32s are checked before
    anything is returned; a mismatch raises CkptioError (code
    ERRORS["CHECKSUM"]).

    On the CPU with mmap=True (the default, as safetensors.torch.load_file):
    the tensors are views of one private copy-on-write mapping of the file
    (MAP_PRIVATE), no bytes copied. They may be written (writes never reach
    the file); a file saved over the path later by an atomic rename (every
    ckptio save) does not change them; the mapping is unmapped when the last
    tensor goes, the reader is closed at once. The price, shared with
    safetensors' and torch.load(mmap=True)'s results: another program that
    truncates or rewrites the file in place (torch.save or
    safetensors.torch.save_file to the same path) while the tensors live
    makes reading them raise SIGBUS or see the new bytes. Pass mmap=False for
    tensors in fresh memory, independent of the file (parallel preads, about
    half the speed from a warm cache). Strided views and big-endian entries of
    .pt files, and misaligned tensors, are always copied. A sharded set (an
    index or its directory) maps each shard on its own; a compressed file is
    always copied. mmap has no effect for a CUDA device."""
    with _TorchReader(filename, device, mmap) as r:
        shards = r.shards() if mmap and r.device.type == "cpu" else []
        if not shards:
            return r.load(range(len(r.index())), mmap=mmap)
    # A sharded set, checked as a set on open: each shard mapped on its own.
    out = {}
    for shard in shards:
        out.update(load_file(shard, device, mmap))
    return out


class safe_open:
    """A checkpoint opened for lazy access, like safetensors.safe_open:

        with ckptio.torch.safe_open("m.safetensors", framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)   # loaded (and CRC-checked) on demand

    framework must be "pt" (or "torch"). get_slice(name) reads parts of a
    tensor (one dimension's start:stop; see ckptio/torch_slice.py)."""

    def __init__(self, filename, framework="pt", device="cpu"):
        if framework not in ("pt", "torch", "pytorch"):
            raise ValueError(f"ckptio.torch.safe_open only supports framework='pt', "
                             f"got {framework!r} (ckptio.load_file serves numpy)")
        self._r = None
        r = _TorchReader(filename, device)
        try:
            r.index()
        except BaseException:
            r.__exit__(None, None, None)
            raise
        self._r = r

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if self._r is not None:
            self._r.__exit__(None, None, None)
            self._r = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    def _reader(self):
        if self._r is None:
            raise ValueError("safe_open: the file is closed")
        return self._r

    def keys(self):
        """Tensor names, sorted (as safetensors returns them)."""
        return sorted(self._reader().by_name)

    def offset_keys(self):
        """Tensor names in file order."""
        return [info.name.decode() for info in self._reader().entries]

    def metadata(self):
        """The file's metadata (str -> str), or None when it has none. ckptio's
        CRC entries are not included."""
        return self._reader().metadata() or None

    def format(self):
        """"safetensors", "pytorch", or "safetensors-sharded" (an index or
        a directory of shards)."""
        return self._reader().lib.ckptio_reader_format(self._reader().handle).decode()

    def get_tensor(self, name):
        """Loads one tensor (CRC-checked) into a new tensor on the device."""
        r = self._reader()
        i = r.by_name.get(name)
        if i is None:
            raise from_code(ERRORS["NOT_FOUND"],
                              f"{os.fsdecode(r.path)}: no tensor named {name!r}")
        return r.load([i])[name]

    def stats(self):
        """Stage timings of the last get_tensor (ckptio_reader_stats) as a
        dict: bytes, seconds (wall), copy_seconds / device_seconds (busy,
        summed over the workers), threads, staging_bytes."""
        r = self._reader()
        return _mapped.stats(r.lib, r.lib.ckptio_reader_stats, r.handle)

    def get_slice(self, name):
        """A TorchSlice of the tensor (ckptio/torch_slice.py): get_shape(),
        get_dtype(), and [...] reading only one dimension's start:stop."""
        from .torch_slice import TorchSlice
        r = self._reader()
        i = r.by_name.get(name)
        if i is None:
            raise from_code(ERRORS["NOT_FOUND"],
                              f"{os.fsdecode(r.path)}: no tensor named {name!r}")
        return TorchSlice(r, i)
