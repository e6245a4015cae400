"""ctypes view of include/ckptio.h: the structs, the function signatures, and
finding libckptio.so. Mirrors the header exactly; a change there must be made
here too (the interop tests catch a mismatch). Internal: the other modules
of the package use these names; users use ckptio / ckptio.torch."""

from __future__ import annotations

import collections.abc
import ctypes
import os
import pathlib
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

MAX_DIMS = 8
DEVICE_HOST = 0  # CKPTIO_DEVICE_HOST; GPU n is n + 1
AUTO = -1
FORMAT_SAFETENSORS = 0
FORMAT_PYTORCH = 1
SHARD_ORDER_ADDED = 0  # enum ckptio_shard_order
SHARD_ORDER_HF = 1

# The one table of file formats: the name the Python API takes (format=...)
# -> enum ckptio_format.
FORMATS: Dict[str, int] = {"safetensors": FORMAT_SAFETENSORS, "pt": FORMAT_PYTORCH}


def format_code(name: str) -> int:
    """enum ckptio_format of a format name; ValueError naming the choices."""
    try:
        return FORMATS[name]
    except (KeyError, TypeError):
        raise ValueError(f"format must be one of {sorted(FORMATS)}, got {name!r}") from None


def device_cuda(ordinal: int) -> int:
    """CKPTIO_DEVICE_CUDA(ordinal)."""
    return ordinal + 1


class _ErrorCodes(collections.abc.Mapping):  # type: ignore[type-arg]
    """enum ckptio_error as {name without "CKPTIO_E_": code}, read from the
    library (ckptio_error_name, from CKPTIO_E_INVALID_ARG down) the first
    time it is used, so the binding never holds a copy of the header's list."""

    def __init__(self) -> None:
        self._codes: Optional[Dict[str, int]] = None

    def _table(self) -> Dict[str, int]:
        if self._codes is None:
            handle, codes, code = lib(), {}, -1000
            name: Optional[bytes]
            while (name := handle.ckptio_error_name(code)) is not None:
                codes[name.decode()] = code
                code -= 1
            self._codes = codes
        return self._codes

    def __getitem__(self, name: str) -> int:
        return self._table()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def __repr__(self) -> str:
        return repr(self._table())


ERRORS = _ErrorCodes()


c_int64_p = ctypes.POINTER(ctypes.c_int64)


class Tensor_(ctypes.Structure):  # ckptio_tensor
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_int),  # ckptio_dtype: an int-sized C enum
        ("ndim", ctypes.c_int),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("data", ctypes.c_void_p),
        ("device", ctypes.c_int),
    ]


class TensorInfo(ctypes.Structure):  # ckptio_tensor_info
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("nbytes", ctypes.c_uint64),
        ("offset", ctypes.c_uint64),
        ("has_crc", ctypes.c_int),
        ("crc32", ctypes.c_uint32),
        ("strided", ctypes.c_int),
    ]


class Options(ctypes.Structure):  # ckptio_options
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("threads", ctypes.c_int),
        ("chunk_bytes", ctypes.c_size_t),
        ("staging_bytes", ctypes.c_size_t),
        ("crc", ctypes.c_int),
        ("direct_io", ctypes.c_int),
        ("fsync", ctypes.c_int),
        ("load_method", ctypes.c_int),
        ("cuda", ctypes.c_int),
        ("numa", ctypes.c_int),
        ("compress_level", ctypes.c_int),
        ("shuffle", ctypes.c_int),
        ("snapshot_bytes", ctypes.c_size_t),
        ("open_flags", ctypes.c_uint),
    ]

    @classmethod
    def init(cls) -> "Options":
        """CKPTIO_OPTIONS_INIT."""
        return cls(ctypes.sizeof(cls), 0, 0, 0, 1, AUTO, 1, 0, AUTO, AUTO, 0, 0, 0, 0)


# open_flags: a torch.save archive's records (data.pkl, data/<key>), not its tensors.
OPEN_TORCH_RECORDS = 1


# ckptio_load_method, by code.
LOAD_METHODS = ("auto", "pread", "mmap", "direct")


class Stats(ctypes.Structure):  # ckptio_stats
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("bytes", ctypes.c_uint64),
        ("seconds", ctypes.c_double),
        ("snapshot_seconds", ctypes.c_double),
        ("device_seconds", ctypes.c_double),
        ("copy_seconds", ctypes.c_double),
        ("write_seconds", ctypes.c_double),
        ("commit_seconds", ctypes.c_double),
        ("threads", ctypes.c_int),
        ("staging_bytes", ctypes.c_uint64),
        ("direct_bytes", ctypes.c_uint64),
        ("load_methods", ctypes.c_uint32),
    ]

    @classmethod
    def init(cls) -> "Stats":
        """CKPTIO_STATS_INIT."""
        return cls(ctypes.sizeof(cls))

    def as_dict(self) -> Dict[str, Any]:
        """The fields by name; load_methods as the list of the methods' names."""
        out = {f[0]: getattr(self, f[0]) for f in self._fields_ if f[0] != "size"}
        out["load_methods"] = [name for code, name in enumerate(LOAD_METHODS)
                               if self.load_methods >> code & 1]
        return out

    @classmethod
    def read(cls, fn: Callable[..., int], handle: Any) -> Optional[Dict[str, Any]]:
        """The ckptio_stats of `handle` (fn: ckptio_writer_stats or
        ckptio_reader_stats) as_dict: bytes, seconds, per-stage busy
        seconds, threads, staging_bytes; None when the call fails."""
        out = cls.init()
        return out.as_dict() if fn(handle, ctypes.byref(out)) >= 0 else None


class LoadRequest(ctypes.Structure):  # ckptio_load_request
    _fields_ = [
        ("index", ctypes.c_size_t),
        ("dst", ctypes.c_void_p),
        ("dst_bytes", ctypes.c_uint64),
        ("device", ctypes.c_int),
    ]


class SliceRequest(ctypes.Structure):  # ckptio_slice_request
    _fields_ = [
        ("index", ctypes.c_size_t),
        ("dim", ctypes.c_int),
        ("start", ctypes.c_int64),
        ("stop", ctypes.c_int64),
        ("dst", ctypes.c_void_p),
        ("dst_bytes", ctypes.c_uint64),
        ("device", ctypes.c_int),
        ("verified", ctypes.c_int),
        ("bytes_read", ctypes.c_uint64),
    ]


class ByteRange(ctypes.Structure):  # ckptio_byte_range
    _fields_ = [
        ("file", ctypes.c_uint32),
        ("offset", ctypes.c_uint64),
        ("length", ctypes.c_uint64),
    ]


class BoxRequest(ctypes.Structure):  # ckptio_box_request
    _fields_ = [
        ("index", ctypes.c_size_t),
        ("start", ctypes.c_int64 * MAX_DIMS),
        ("stop", ctypes.c_int64 * MAX_DIMS),
        ("dst", ctypes.c_void_p),
        ("dst_bytes", ctypes.c_uint64),
        ("device", ctypes.c_int),
        ("verified", ctypes.c_int),
        ("bytes_read", ctypes.c_uint64),
    ]


GROUP_EXCHANGE = 1  # CKPTIO_GROUP_EXCHANGE

# ckptio_comm's callbacks: allgather(user, send, recv, bytes), broadcast(user, buf, bytes, root),
# alltoallv(user, send, send_counts, recv, recv_counts)
ALLGATHER_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
BROADCAST_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
ALLTOALLV_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t))


class Comm(ctypes.Structure):  # ckptio_comm
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("rank", ctypes.c_int),
        ("nranks", ctypes.c_int),
        ("user", ctypes.c_void_p),
        ("allgather", ALLGATHER_FN),
        ("broadcast", BROADCAST_FN),
        ("alltoallv", ALLTOALLV_FN),
    ]


class ManagerOptions(ctypes.Structure):  # ckptio_manager_options
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("keep_last", ctypes.c_int),
        ("keep_every", ctypes.c_uint64),
        ("format", ctypes.c_int),
        ("max_shard_bytes", ctypes.c_uint64),
        ("verify", ctypes.c_int),
    ]


class CheckpointInfo_(ctypes.Structure):  # ckptio_checkpoint_info
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("step", ctypes.c_uint64),
        ("dir", ctypes.c_char_p),
        ("path", ctypes.c_char_p),
        ("bytes", ctypes.c_uint64),
        ("files", ctypes.c_uint32),
        ("complete", ctypes.c_int),
        ("verified", ctypes.c_int),
        ("error", ctypes.c_int),
        ("detail", ctypes.c_char_p),
    ]


# ckptio_manager_warn_fn(arg, step, code, message)
WARN_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p)
# ckptio_tiers_warn_fn(arg, step, tier, code, message)
TIERS_WARN_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_int, ctypes.c_char_p)
TIERS = ("memory", "peers", "durable", "storage")  # ckptio_tier, fastest first


class TiersOptions(ctypes.Structure):  # ckptio_tiers_options
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("memory_dir", ctypes.c_char_p),
        ("memory_keep", ctypes.c_int),
        ("peers", ctypes.c_int),
        ("ranks_per_node", ctypes.c_int),
        ("durable_dir", ctypes.c_char_p),
        ("durable_every", ctypes.c_int),
        ("durable_keep", ctypes.c_int),
        ("fatal", ctypes.c_int),
        ("background", ctypes.c_int),
        ("storage_dir", ctypes.c_char_p),
        ("storage_every", ctypes.c_int),
        ("storage_keep", ctypes.c_int),
    ]


class TiersPlace(ctypes.Structure):  # ckptio_tiers_place
    _fields_ = [
        ("global_shape", ctypes.c_int64 * MAX_DIMS),
        ("offsets", ctypes.c_int64 * MAX_DIMS),
    ]


class TiersDest(ctypes.Structure):  # ckptio_tiers_dest
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dst", ctypes.c_void_p),
        ("dst_bytes", ctypes.c_uint64),
        ("device", ctypes.c_int),
    ]


class TiersStats(ctypes.Structure):  # ckptio_tiers_stats
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("saved_bytes", ctypes.c_uint64 * len(TIERS)),
        ("restored_bytes", ctypes.c_uint64 * len(TIERS)),
        ("skipped_copies", ctypes.c_uint64),
        ("failed_tier_saves", ctypes.c_uint64),
    ]

_P = ctypes.c_void_p  # every opaque handle
_PP = ctypes.POINTER(ctypes.c_void_p)
_I = ctypes.c_int
_S = ctypes.c_char_p

# The one table of signatures: name -> (restype, argtypes). ctypes reads no
# header, so CKPTIO_EXPERIMENTAL means nothing here; the calls marked
# "experimental" below are those of ckptio.h's experimental section, which
# may change in a minor release (README, "The ABI"): the package ships with
# its library and moves with it.
_SIGNATURES: Dict[str, Tuple[Any, List[Any]]] = {
    "ckptio_version_number": (ctypes.c_uint, []),
    "ckptio_version_string": (_S, []),
    "ckptio_strerror": (_S, [_I]),
    "ckptio_error_name": (_S, [_I]),
    "ckptio_last_open_error": (_S, []),
    "ckptio_dtype_bits": (_I, [_I]),
    "ckptio_dtype_name": (_S, [_I]),
    "ckptio_dtype_parse": (_I, [_S, ctypes.POINTER(ctypes.c_int)]),
    "ckptio_tensor_nbytes": (ctypes.c_int64, [_I, _I, c_int64_p]),
    "ckptio_ctx_create": (_I, [ctypes.POINTER(Options), _PP]),
    "ckptio_ctx_free": (None, [_P]),
    "ckptio_ctx_options": (ctypes.c_int, [_P, ctypes.POINTER(Options)]),
    "ckptio_writer_open": (_I, [_P, _S, _I, ctypes.POINTER(Options), _PP]),
    "ckptio_writer_set_metadata": (_I, [_P, _S, _S]),
    "ckptio_writer_set_torch_pickle": (_I, [_P, ctypes.c_char_p, ctypes.c_size_t]),  # experimental
    "ckptio_writer_add": (_I, [_P, ctypes.POINTER(Tensor_)]),
    "ckptio_writer_commit": (_I, [_P]),
    "ckptio_writer_close": (_I, [_P]),
    "ckptio_writer_last_error": (_S, [_P]),
    "ckptio_reader_open": (_I, [_P, _S, ctypes.POINTER(Options), _PP]),
    "ckptio_reader_close": (None, [_P]),
    "ckptio_reader_count": (ctypes.c_size_t, [_P]),
    "ckptio_reader_info": (_I, [_P, ctypes.c_size_t, ctypes.POINTER(TensorInfo)]),
    "ckptio_reader_find": (ctypes.c_int64, [_P, _S]),
    "ckptio_reader_metadata_count": (ctypes.c_size_t, [_P]),
    "ckptio_reader_metadata_at": (_I, [_P, ctypes.c_size_t, ctypes.POINTER(_S),
                                       ctypes.POINTER(_S)]),
    "ckptio_reader_load_many": (_I, [_P, ctypes.POINTER(LoadRequest), ctypes.c_size_t]),
    "ckptio_reader_verify": (_I, [_P, ctypes.POINTER(ctypes.c_size_t)]),
    "ckptio_reader_compression": (_I, [_P, ctypes.POINTER(ctypes.c_uint64),
                                       ctypes.POINTER(ctypes.c_uint64),
                                       ctypes.POINTER(ctypes.c_uint64)]),
    "ckptio_reader_shard_count": (ctypes.c_size_t, [_P]),
    "ckptio_reader_shard": (_I, [_P, ctypes.c_size_t, ctypes.POINTER(_S),
                                 ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_uint64)]),
    "ckptio_reader_last_error": (_S, [_P]),
    # Added for ckptio.torch: asynchronous saves, CUDA streams, device checks.
    "ckptio_ctx_cuda": (_I, [_P, ctypes.POINTER(_S)]),
    "ckptio_writer_set_stream": (_I, [_P, _I, _P]),
    "ckptio_writer_commit_async": (_I, [_P]),
    "ckptio_writer_wait_snapshot": (_I, [_P]),
    "ckptio_writer_wait_durable": (_I, [_P]),
    "ckptio_writer_poll_snapshot": (_I, [_P]),
    "ckptio_writer_poll_durable": (_I, [_P]),
    "ckptio_writer_progress": (None, [_P, ctypes.POINTER(ctypes.c_uint64),
                                      ctypes.POINTER(ctypes.c_uint64)]),
    "ckptio_reader_format": (_S, [_P]),
    # Slices and tensor-parallel plans.
    "ckptio_reader_slice_nbytes": (ctypes.c_int64, [_P, ctypes.c_size_t, _I, ctypes.c_int64,
                                                    ctypes.c_int64]),
    "ckptio_reader_load_slices": (_I, [_P, ctypes.POINTER(SliceRequest), ctypes.c_size_t]),
    "ckptio_split_rank": (_I, [ctypes.c_int64, _I, _I, c_int64_p, c_int64_p]),
    # experimental: slice_ranges, plan_rank (and ByteRange)
    "ckptio_reader_slice_ranges": (ctypes.c_int64, [_P, ctypes.c_size_t, _I, ctypes.c_int64,
                                                    ctypes.c_int64, ctypes.POINTER(ByteRange),
                                                    ctypes.c_size_t]),
    "ckptio_reader_plan_rank": (ctypes.c_int64, [_P, ctypes.c_size_t, _I, _I, _I, c_int64_p,
                                                 c_int64_p, ctypes.POINTER(ByteRange),
                                                 ctypes.c_size_t]),
    # Zero-copy loads and stage timings.
    "ckptio_reader_view": (_I, [_P, ctypes.c_size_t, _PP, ctypes.POINTER(ctypes.c_uint64)]),
    # experimental: map_private, map_free, resident, fits_cache
    "ckptio_reader_map_private": (_I, [_P, _PP, ctypes.POINTER(ctypes.c_uint64)]),
    "ckptio_map_free": (_I, [_P, ctypes.c_uint64]),
    "ckptio_reader_resident": (_I, [_P, ctypes.POINTER(ctypes.c_double)]),
    "ckptio_reader_fits_cache": (_I, [_P]),
    "ckptio_path_scheme": (ctypes.c_size_t, [_S]),  # experimental
    "ckptio_writer_stats": (_I, [_P, ctypes.POINTER(Stats)]),
    "ckptio_reader_stats": (_I, [_P, ctypes.POINTER(Stats)]),
    # Sharded saves (ckptio.torch.save_torch_state_dict): a ckptio_writer
    # opened on a set of shards and its index; every ckptio_writer_* call above.
    "ckptio_writer_open_sharded": (_I, [_P, _S, _S, _I, ctypes.c_uint64, _I, ctypes.POINTER(Options),
                                        _PP]),
    "ckptio_writer_shard_count": (ctypes.c_size_t, [_P]),
    # Multi-rank checkpoints (ckptio.dcp): this rank's side of a save, boxes.
    "ckptio_writer_open_ranks": (_I, [_P, ctypes.POINTER(Comm), _S, _S, ctypes.POINTER(Options), _PP]),
    "ckptio_writer_add_part": (_I, [_P, ctypes.POINTER(Tensor_), c_int64_p, c_int64_p]),
    "ckptio_writer_abort": (_I, [_P, _I, _S]),
    "ckptio_reader_part_count": (ctypes.c_size_t, [_P, ctypes.c_size_t]),
    "ckptio_reader_part": (_I, [_P, ctypes.c_size_t, ctypes.c_size_t, ctypes.POINTER(_S), c_int64_p, c_int64_p]),
    "ckptio_reader_box_nbytes": (ctypes.c_int64, [_P, ctypes.c_size_t, c_int64_p, c_int64_p]),
    "ckptio_reader_load_boxes": (_I, [_P, ctypes.POINTER(BoxRequest), ctypes.c_size_t]),
    "ckptio_reader_load_boxes_group": (_I, [_P, ctypes.POINTER(Comm), ctypes.POINTER(BoxRequest), ctypes.c_size_t,
                                            ctypes.c_uint64, ctypes.c_uint]),
    # The checkpoint manager (ckptio.manager).
    "ckptio_manager_open": (_I, [_P, _S, ctypes.POINTER(ManagerOptions), ctypes.POINTER(Options),
                                 _PP]),
    "ckptio_manager_close": (None, [_P]),
    "ckptio_manager_set_warning": (None, [_P, WARN_FN, _P]),
    "ckptio_manager_save_begin": (_I, [_P, ctypes.c_uint64, _PP]),
    "ckptio_manager_save_end": (_I, [_P, _P]),
    "ckptio_manager_latest": (_I, [_P, ctypes.POINTER(ctypes.c_uint64), _S, ctypes.c_size_t]),
    "ckptio_manager_list": (ctypes.c_int64, [_P, _I]),
    "ckptio_manager_checkpoint": (_I, [_P, ctypes.c_size_t, ctypes.POINTER(CheckpointInfo_)]),
    "ckptio_manager_last_error": (_S, [_P]),
    # Tiered checkpoints (ckptio.tiers), experimental.
    "ckptio_tiers_open": (_I, [_P, ctypes.POINTER(Comm), ctypes.POINTER(TiersOptions), _PP]),
    "ckptio_tiers_set_warning": (None, [_P, TIERS_WARN_FN, _P]),
    "ckptio_tiers_save": (_I, [_P, ctypes.c_uint64, ctypes.POINTER(Tensor_), ctypes.c_size_t]),
    "ckptio_tiers_restore": (_I, [_P, ctypes.POINTER(ctypes.c_uint64), ctypes.c_char_p, ctypes.c_size_t]),
    "ckptio_tiers_save_placed": (_I, [_P, ctypes.c_uint64, ctypes.POINTER(Tensor_), ctypes.POINTER(TiersPlace),
                                      ctypes.c_size_t]),
    "ckptio_tiers_restore_load": (_I, [_P, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(TiersDest), ctypes.c_size_t]),
    "ckptio_tiers_restore_global": (_I, [_P, ctypes.POINTER(ctypes.c_uint64), ctypes.c_char_p, ctypes.c_size_t]),
    "ckptio_tiers_stats_get": (_I, [_P, ctypes.POINTER(TiersStats)]),
    "ckptio_tiers_wait": (_I, [_P]),
    "ckptio_tiers_last_error": (_S, [_P]),
    "ckptio_tiers_close": (None, [_P]),
}

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None


def _candidates() -> List[str]:
    env = os.environ.get("CKPTIO_LIB")
    if env:
        return [env]  # an explicit choice is never second-guessed
    here = pathlib.Path(__file__).resolve().parent
    # The wheel's copy inside the package (named by its SONAME, which the
    # wheel's ckptio command loads too: CMakeLists.txt), then the build of the
    # source tree the package sits in, then the loader path.
    return [str(here / "libckptio.so.1"), str(here.parent.parent / "build" / "libckptio.so"),
            "libckptio.so.1"]


def lib() -> Any:
    """The loaded library (a ctypes.CDLL) with every signature set; loaded
    once. Typed Any: its functions are looked up by name."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        errors = []
        for path in _candidates():
            try:
                handle = ctypes.CDLL(path)
                break
            except OSError as e:
                errors.append(f"{path}: {e}")
        else:
            raise OSError("libckptio not found (set CKPTIO_LIB, or build it with "
                          "scripts/build.sh): " + "; ".join(errors))
        for name, (restype, argtypes) in _SIGNATURES.items():
            try:
                fn = getattr(handle, name)
            except AttributeError:
                raise OSError(f"{handle._name} does not export {name}: "
                              "the library is older than this binding") from None
            fn.restype = restype
            fn.argtypes = argtypes
        _lib = handle
        return _lib


def is_storage_path(path: Any) -> bool:
    """Whether `path` names a storage's object or prefix ("s3://...") rather
    than a local file: the library's own rule (ckptio_path_scheme, RFC
    3986's scheme and "://"), so that Python never judges it otherwise."""
    text = os.fsencode(path) if not isinstance(path, bytes) else path
    return bool(lib().ckptio_path_scheme(text))
