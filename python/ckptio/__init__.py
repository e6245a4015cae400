"""ckptio for Python: save and load safetensors checkpoints through libckptio.

A minimal ctypes binding (a later issue grows it into the full one):

    save_file({"w": np.ones((2, 3), np.float32)}, "m.safetensors", metadata={"step": "7"})
    tensors = load_file("m.safetensors")      # {"w": array(...)}
    verify("m.safetensors")                   # raises CkptioError on a bad CRC

numpy arrays are passed to the library by pointer (a copy is made only for a
non-contiguous or big-endian array). dtypes numpy cannot represent (BF16, the
F8 / F6 / F4 types) travel as Tensor(dtype_name, shape, buffer) holding the raw
little-endian bytes; load_file returns those as Tensor too.

The library is the path in the environment variable CKPTIO_LIB, else the
copy inside the package (the wheel), else build/libckptio.so of this
repository (see _lib._candidates).

torch tensors (CPU and CUDA, safetensors.torch's API, async saves): ckptio.torch.
"""

import atexit
import ctypes
import os
import threading

import numpy as np

from . import _lib, _mapped
from ._lib import ERRORS
from .errors import *  # noqa: F401,F403 - the exception classes are ckptio's too
from .errors import __all__ as _errors_all, check as _check, from_code

__all__ = ["save_file", "load_file", "load_metadata", "verify", "Tensor", "configure",
           "SNAPSHOT_AUTO", "E_CHECKSUM", "ERRORS", "NUMPY_DTYPES",
           *[n for n in _errors_all if n[0].isupper()]]

# safetensors dtype name -> numpy dtype, for every dtype numpy has.
NUMPY_DTYPES = {
    "BOOL": np.dtype(np.bool_), "U8": np.dtype(np.uint8), "I8": np.dtype(np.int8),
    "I16": np.dtype("<i2"), "U16": np.dtype("<u2"), "F16": np.dtype("<f2"),
    "I32": np.dtype("<i4"), "U32": np.dtype("<u4"), "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"), "I64": np.dtype("<i8"), "U64": np.dtype("<u8"),
    "C64": np.dtype("<c8"),
}


def __getattr__(name):
    # E_CHECKSUM is read from the library when first asked for (see ERRORS).
    if name == "E_CHECKSUM":
        return _lib.ERRORS["CHECKSUM"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Tensor:
    """A tensor of any safetensors dtype as raw bytes: `dtype` is the
    safetensors name ("BF16", "F8_E4M3", ...), `shape` counts elements, and
    `buffer` (bytes, bytearray, memoryview or a contiguous numpy array) holds
    exactly the tensor's bytes, little-endian, row-major."""

    __slots__ = ("dtype", "shape", "buffer")

    def __init__(self, dtype, shape, buffer):
        self.dtype = str(dtype)
        self.shape = tuple(int(d) for d in shape)
        self.buffer = buffer

    def tobytes(self):
        return _byte_view(self.buffer).tobytes()

    def __eq__(self, other):
        if not isinstance(other, Tensor):
            return NotImplemented
        return (self.dtype, self.shape, self.tobytes()) == \
               (other.dtype, other.shape, other.tobytes())

    def __repr__(self):
        return f"Tensor({self.dtype!r}, {self.shape}, <{_byte_view(self.buffer).nbytes} bytes>)"


def _byte_view(buffer):
    """The buffer's bytes as a flat uint8 array, without copying."""
    if isinstance(buffer, np.ndarray):
        if not buffer.flags.c_contiguous:
            raise ValueError("Tensor buffer must be C-contiguous")
        return buffer.reshape(-1).view(np.uint8)
    return np.frombuffer(buffer, dtype=np.uint8)


# One context per process, created at first use: a context allocates and
# touches its staging ring once, which is too costly to repeat per call.
_ctx_lock = threading.Lock()
_ctx_handle = None
_ctx_settings = {}
SNAPSHOT_AUTO = "auto"


def configure(*, snapshot_bytes=None, staging_bytes=None, chunk_bytes=None, threads=None):
    """Sets the options of the process's context (its worker pool and pinned
    memory) before its first save or load; afterwards it raises.

    snapshot_bytes: pinned memory that holds whole snapshots, beyond the
    staging ring: a save whose file fits in both reaches its snapshot point
    (SaveHandle.wait_snapshot) as soon as its bytes are copied, and is
    written behind it. ckptio.SNAPSHOT_AUTO takes a quarter of physical
    memory; 0 (the default) keeps memory bounded by the 256 MiB ring. The
    memory is allocated and touched once, here, and reused by every save."""
    values = {"snapshot_bytes": snapshot_bytes, "staging_bytes": staging_bytes,
              "chunk_bytes": chunk_bytes, "threads": threads}
    with _ctx_lock:
        if _ctx_handle is not None:
            raise from_code(ERRORS["STATE"],
                            "ckptio.configure: the context already exists (call it before the first save or load)")
        for key, value in values.items():
            if value is None:
                continue
            if key == "snapshot_bytes" and value == SNAPSHOT_AUTO:
                value = ctypes.c_size_t(-1).value
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"ckptio.configure: {key} must be a non-negative int, not {value!r}")
            _ctx_settings[key] = value


def _ctx():
    global _ctx_handle
    with _ctx_lock:
        if _ctx_handle is None:
            lib = _lib.lib()
            handle = ctypes.c_void_p()
            opts = _lib.Options.init()
            for key, value in _ctx_settings.items():
                setattr(opts, key, value)
            _check(lib.ckptio_ctx_create(ctypes.byref(opts), ctypes.byref(handle)), "ckptio_ctx_create",
                   lib.ckptio_last_open_error())
            _ctx_handle = handle
            atexit.register(_ctx_free)
        return _ctx_handle


def _ctx_free():
    global _ctx_handle, _map_ctx_handle
    with _ctx_lock:
        for handle in (_ctx_handle, _map_ctx_handle):
            if handle is not None:
                _lib.lib().ckptio_ctx_free(handle)
        _ctx_handle = _map_ctx_handle = None


_map_ctx_handle = None


def _map_ctx():
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
            _check(lib.ckptio_ctx_create(ctypes.byref(opts), ctypes.byref(handle)),
                   "ckptio_ctx_create", lib.ckptio_last_open_error())
            _map_ctx_handle = handle
            atexit.register(_ctx_free)
        return _map_ctx_handle


def _options(ctx, crc):
    opts = _lib.Options.init()
    _lib.lib().ckptio_ctx_options(ctx, ctypes.byref(opts))
    opts.crc = 1 if crc else 0
    return opts


def _dtype_code(name):
    code = ctypes.c_int()
    _check(_lib.lib().ckptio_dtype_parse(name.encode(), ctypes.byref(code)),
           f"dtype {name!r}")
    return code.value


def _describe(name, value):
    """(dtype name, shape, flat uint8 view of the bytes) of one tensor to save."""
    if isinstance(value, Tensor):
        data = _byte_view(value.buffer)
        shape = value.shape
        dtype = value.dtype
    else:
        arr = np.asarray(value)
        dtype = None
        for st_name, np_dtype in NUMPY_DTYPES.items():
            if arr.dtype == np_dtype:
                dtype = st_name
                break
            if arr.dtype.newbyteorder("<") == np_dtype:  # big-endian: swap once
                arr = arr.astype(np_dtype)
                dtype = st_name
                break
        if dtype is None:
            raise TypeError(f"tensor {name!r}: numpy dtype {arr.dtype} has no safetensors "
                            "dtype; pass a ckptio.Tensor for raw bytes")
        if not arr.flags.c_contiguous:  # (np.ascontiguousarray would make 0-d 1-d)
            arr = arr.copy(order="C")
        shape = arr.shape
        data = arr.reshape(-1).view(np.uint8)
    if len(shape) > _lib.MAX_DIMS:
        raise ValueError(f"tensor {name!r}: {len(shape)} dims, at most {_lib.MAX_DIMS}")
    return dtype, tuple(shape), data


def save_file(tensors, path, metadata=None, crc=True, format="safetensors", compress=0,
              shuffle=False):
    """Saves a dict of name -> numpy array (or Tensor) at `path`, atomically,
    as safetensors or, with format="pt", as a torch.save zip archive that
    torch.load(weights_only=True) opens. `metadata` is a dict of str -> str.
    With crc, every tensor's CRC32 is recorded (safetensors: in the metadata
    as ckptio.crc32.<name>; pt: in the zip records). compress=N (safetensors
    only) wraps the file in the zstd seekable format at zstd level N, which
    `zstd -d` and load_file undo; shuffle=True adds the byte-shuffle filter,
    which only ckptio undoes."""
    formats = {"safetensors": _lib.FORMAT_SAFETENSORS, "pt": _lib.FORMAT_PYTORCH}
    if format not in formats:
        raise ValueError(f"format must be one of {sorted(formats)}, got {format!r}")
    lib = _lib.lib()
    ctx = _ctx()
    opts = _options(ctx, crc)
    opts.compress_level = int(compress)
    opts.shuffle = 1 if shuffle else 0
    fspath = os.fsencode(os.fspath(path))
    w = ctypes.c_void_p()
    _check(lib.ckptio_writer_open(ctx, fspath, formats[format], ctypes.byref(opts),
                                  ctypes.byref(w)), f"cannot save {os.fsdecode(fspath)}",
           lib.ckptio_last_open_error(), os.fsdecode(fspath))
    keep = []  # the data must outlive the commit
    try:
        for key, value in (metadata or {}).items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TypeError(f"metadata must map str to str, got {key!r}: {value!r}")
            _check(lib.ckptio_writer_set_metadata(w, key.encode(), value.encode()),
                   f"metadata {key!r}", lib.ckptio_writer_last_error(w))
        for name, value in tensors.items():
            if not isinstance(name, str):
                raise TypeError(f"tensor names must be str, got {name!r}")
            dtype, shape, data = _describe(name, value)
            code = _dtype_code(dtype)
            c_shape = (ctypes.c_int64 * _lib.MAX_DIMS)(*shape)
            nbytes = _check(lib.ckptio_tensor_nbytes(code, len(shape), c_shape),
                            f"tensor {name!r} ({dtype} {list(shape)})")
            if data.nbytes != nbytes:
                raise ValueError(f"tensor {name!r}: {dtype} {list(shape)} is {nbytes} bytes, "
                                 f"the buffer has {data.nbytes}")
            keep.append(data)
            desc = _lib.Tensor_(name.encode(), code, len(shape), c_shape,
                                data.ctypes.data, _lib.DEVICE_HOST)
            _check(lib.ckptio_writer_add(w, ctypes.byref(desc)), f"tensor {name!r}",
                   lib.ckptio_writer_last_error(w))
        _check(lib.ckptio_writer_commit(w), f"cannot save {os.fsdecode(fspath)}",
               lib.ckptio_writer_last_error(w))
    finally:
        lib.ckptio_writer_close(w)  # after a failure it only repeats it
    del keep


class _Reader:
    def __init__(self, path, crc=True, mapped=False):
        """mapped: the caller wants a zero-copy load, which runs on the light
        context of _map_ctx(). A compressed file cannot be mapped and is
        copied instead, so it is reopened on the full context: copies need
        its staging ring. (A sharded set is mapped shard by shard: shards().)"""
        self.lib = _lib.lib()
        self.path = os.fsencode(os.fspath(path))
        self._open(_map_ctx() if mapped else _ctx(), crc)
        if mapped and self.lib.ckptio_reader_compression(self.handle, None, None, None) == 1:
            self.lib.ckptio_reader_close(self.handle)
            self._open(_ctx(), crc)

    def _open(self, ctx, crc):
        opts = _options(ctx, crc)
        self.handle = ctypes.c_void_p()
        _check(self.lib.ckptio_reader_open(ctx, self.path, ctypes.byref(opts),
                                           ctypes.byref(self.handle)),
               f"cannot open {os.fsdecode(self.path)}", self.lib.ckptio_last_open_error(),
               os.fsdecode(self.path))

    def shards(self):
        """The shard files of a sharded set (validated together when it was
        opened: names, tensors, save ids), in order; [] for a single file."""
        out = []
        for k in range(self.lib.ckptio_reader_shard_count(self.handle)):
            p = ctypes.c_char_p()
            self.check(self.lib.ckptio_reader_shard(self.handle, k, ctypes.byref(p), None, None),
                       f"shard {k}")
            out.append(p.value)
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.lib.ckptio_reader_close(self.handle)
        self.handle = None

    def check(self, rc, what):
        return _check(rc, f"{os.fsdecode(self.path)}: {what}",
                      self.lib.ckptio_reader_last_error(self.handle), os.fsdecode(self.path))

    def stats(self):
        """Stage timings of the last load / verify (ckptio_reader_stats) as a
        dict: bytes, seconds (wall), copy_seconds (busy, summed over the
        workers), threads, staging_bytes, ..."""
        return _mapped.stats(self.lib, self.lib.ckptio_reader_stats, self.handle)

    def infos(self):
        out = []
        for i in range(self.lib.ckptio_reader_count(self.handle)):
            info = _lib.TensorInfo()
            self.check(self.lib.ckptio_reader_info(self.handle, i, ctypes.byref(info)),
                       f"tensor {i}")
            out.append(info)
        return out


def load_file(path, crc=True, mmap=True):
    """Loads every tensor of a safetensors or .pt file: a dict of name ->
    numpy array, or Tensor for the dtypes numpy lacks. With crc, each recorded
    CRC32 is checked before anything is returned and a mismatch raises
    CkptioError (code E_CHECKSUM).

    mmap=True (the default, as safetensors' load_file): the arrays are views
    of one private copy-on-write mapping of the file, no bytes copied. They
    are writable, and writes never reach the file; a file saved over the
    path later (ckptio and safetensors-style atomic renames) does not change
    them; the mapping is freed when the last array goes. A program that
    truncates the file in place while arrays live makes reading them raise
    SIGBUS (as with safetensors' and torch.load(mmap=True)'s results; ckptio
    never writes in place). Strided or big-endian .pt entries and misaligned
    tensors are copied; a sharded set maps each shard on its own; a
    compressed file is always copied.
    mmap=False: every tensor is copied into fresh memory (parallel preads);
    the arrays are independent of the file."""
    with _Reader(path, crc, mapped=mmap) as r:
        shards = r.shards() if mmap else []
        if not shards:
            return _load_one(r, mmap)
    # A sharded set, checked as a set on open: each shard mapped on its own.
    out = {}
    for shard in shards:
        out.update(load_file(shard, crc, mmap))
    return out


def _load_one(r, mmap):
    """load_file of one file, open in r."""
    infos = r.infos()
    mapping = _mapped.map_file(r) if mmap and infos else None
    out = {}
    reqs = (_lib.LoadRequest * max(len(infos), 1))()
    n = 0
    for i, info in enumerate(infos):
        name = info.name.decode()
        dtype = r.lib.ckptio_dtype_name(info.dtype).decode()
        shape = tuple(info.shape[:info.ndim])
        np_dtype = NUMPY_DTYPES.get(dtype)
        if np_dtype is not None:
            count = int(np.prod(shape, dtype=np.int64)) if shape else 1
            nbytes = count * np_dtype.itemsize
        else:
            count, nbytes = info.nbytes, info.nbytes
        if nbytes != info.nbytes:
            raise from_code(ERRORS["TENSOR_INFO"],
                              f"{os.fsdecode(r.path)}: tensor {name!r}: {dtype} "
                              f"{list(shape)} is {nbytes} bytes, the file says "
                              f"{info.nbytes}")
        itemsize = np_dtype.itemsize if np_dtype is not None else 1
        if mapping is not None and _mapped.viewable(r, i, info, itemsize):
            flat = np.frombuffer(mapping, np_dtype or np.uint8, count, info.offset)
        else:
            place = _mapped.placed(nbytes, info.offset, itemsize)
            if place is not None:
                flat = np.frombuffer(place[0], np_dtype or np.uint8, count, place[1])
            else:
                flat = np.empty(count, np_dtype or np.uint8)
            if nbytes:
                reqs[n] = _lib.LoadRequest(i, flat.ctypes.data, nbytes, _lib.DEVICE_HOST)
                n += 1
        out[name] = flat.reshape(shape) if np_dtype is not None else Tensor(dtype, shape, flat)
    if n:
        r.check(r.lib.ckptio_reader_load_many(r.handle, reqs, n), "load")
    return out


def load_metadata(path):
    """The file's __metadata__ as a dict, without ckptio's CRC keys."""
    with _Reader(path) as r:
        out = {}
        for i in range(r.lib.ckptio_reader_metadata_count(r.handle)):
            key, value = ctypes.c_char_p(), ctypes.c_char_p()
            r.check(r.lib.ckptio_reader_metadata_at(r.handle, i, ctypes.byref(key),
                                                    ctypes.byref(value)), f"metadata {i}")
            out[key.value.decode()] = value.value.decode()
        return out


def verify(path):
    """Checks every recorded CRC32 of the file. Raises CkptioError on a
    mismatch; returns the number of tensors that have no recorded CRC."""
    with _Reader(path) as r:
        unchecked = ctypes.c_size_t()
        r.check(r.lib.ckptio_reader_verify(r.handle, ctypes.byref(unchecked)), "verify")
        return unchecked.value
