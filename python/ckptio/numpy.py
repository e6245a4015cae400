"""ckptio for numpy, call-compatible with safetensors.numpy: save, save_file,
load, load_file and safe_open take the same arguments (same names, same
defaults) and return the same types; ckptio's own options are keyword-only.

    save_file({"w": np.ones((2, 3), np.float32)}, "m.safetensors", metadata={"step": "7"})
    tensors = load_file("m.safetensors")      # {"w": array(...)}, CRCs checked, zero-copy
    data = save({"w": np.ones(3)})            # bytes of a safetensors file
    verify("m.safetensors")                   # raises ChecksumError on a bad CRC

numpy arrays are passed to the library by pointer (a copy is made only for a
non-contiguous or big-endian array). dtypes numpy cannot represent (BF16, the
F8 / F6 / F4 types) travel as Tensor(dtype_name, shape, buffer) holding the raw
little-endian bytes; the loads return those as Tensor too.

Every function is also ckptio.<name> (import ckptio is this module's API).
"""

from __future__ import annotations

import ctypes
import os
import tempfile
from types import TracebackType
from typing import Any, Dict, Iterator, List, Mapping, NamedTuple, Optional, Tuple, Type, Union, cast

import numpy as np
import numpy.typing as npt

from . import _lib, _mapped, _placer
from . import _bytes
from ._core import (MemoryFile, OpenReader, PathLike, ReadAhead, Reader, backend_choice, check_framework, ctx,
                    deprecated_mmap, dtype_code, options, parse_slice_key, scratch_dir)
from .errors import CkptioTypeError, check, from_code

__all__ = ["save", "save_file", "load", "load_file", "load_metadata", "verify", "safe_open",
           "Tensor", "NUMPY_DTYPES"]

# safetensors dtype name -> numpy dtype, for every dtype numpy has.
NUMPY_DTYPES: Dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_), "U8": np.dtype(np.uint8), "I8": np.dtype(np.int8),
    "I16": np.dtype("<i2"), "U16": np.dtype("<u2"), "F16": np.dtype("<f2"),
    "I32": np.dtype("<i4"), "U32": np.dtype("<u4"), "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"), "I64": np.dtype("<i8"), "U64": np.dtype("<u8"),
    "C64": np.dtype("<c8"),
}

Buffer = Union[bytes, bytearray, memoryview, "npt.NDArray[Any]"]
Array = Union["npt.NDArray[Any]", "Tensor"]


class Tensor:
    """A tensor of any safetensors dtype as raw bytes: `dtype` is the
    safetensors name ("BF16", "F8_E4M3", ...), `shape` counts elements, and
    `buffer` (bytes, bytearray, memoryview or a contiguous numpy array) holds
    exactly the tensor's bytes, little-endian, row-major."""

    __slots__ = ("dtype", "shape", "buffer")

    def __init__(self, dtype: str, shape: Tuple[int, ...], buffer: Buffer) -> None:
        self.dtype = str(dtype)
        self.shape: Tuple[int, ...] = tuple(int(d) for d in shape)
        self.buffer = buffer

    def tobytes(self) -> bytes:
        """The tensor's bytes (a copy)."""
        return _byte_view(self.buffer).tobytes()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tensor):
            return NotImplemented
        return (self.dtype, self.shape, self.tobytes()) == \
               (other.dtype, other.shape, other.tobytes())

    __hash__ = None  # type: ignore[assignment]  # mutable buffer: not hashable

    def __repr__(self) -> str:
        return f"Tensor({self.dtype!r}, {self.shape}, <{_byte_view(self.buffer).nbytes} bytes>)"


def _byte_view(buffer: Buffer) -> npt.NDArray[np.uint8]:
    """The buffer's bytes as a flat uint8 array, without copying."""
    if isinstance(buffer, np.ndarray):
        if not buffer.flags.c_contiguous:
            raise ValueError("Tensor buffer must be C-contiguous")
        return buffer.reshape(-1).view(np.uint8)
    return np.frombuffer(buffer, dtype=np.uint8)


def _describe(name: str, value: Any) -> Tuple[str, Tuple[int, ...], npt.NDArray[np.uint8]]:
    """(dtype name, shape, flat uint8 view of the bytes) of one tensor to save."""
    if isinstance(value, Tensor):
        data = _byte_view(value.buffer)
        shape = value.shape
        dtype: Optional[str] = value.dtype
    else:
        if isinstance(value, Mapping):
            # (np.asarray would make it a 0-d object array)
            raise CkptioTypeError(f"tensor {name!r} is invalid: expected a numpy array or a ckptio.Tensor, "
                                  f"received {type(value).__name__}")
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
        shape = tuple(arr.shape)
        data = arr.reshape(-1).view(np.uint8)
    if len(shape) > _lib.MAX_DIMS:
        raise ValueError(f"tensor {name!r}: {len(shape)} dims, at most {_lib.MAX_DIMS}")
    return str(dtype), tuple(shape), data


class _Saved(NamedTuple):
    """A tensor of a save, checked: its dtype's code, and `data`, the flat
    bytes (which the save must keep alive until its end)."""
    name: str
    dtype: str
    code: int
    shape: Tuple[int, ...]
    data: npt.NDArray[np.uint8]


def _checked(tensor_dict: Mapping[str, Array], metadata: Optional[Dict[str, str]],
             shown: str) -> List[_Saved]:
    """Every check of a save before anything is written (`shown`: the file,
    for messages): metadata str -> str, names str, each value an array of a
    safetensors dtype (or a Tensor) whose bytes fit its shape."""
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"metadata must map str to str, got {key!r}: {value!r}")
    out = []
    lib = _lib.lib()
    for name, tensor in tensor_dict.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, got {name!r}")
        dtype, shape, data = _describe(name, tensor)
        where = f"{shown}: tensor {name!r}"
        code = dtype_code(dtype, where)
        c_shape = (ctypes.c_int64 * _lib.MAX_DIMS)(*shape)
        nbytes = check(lib.ckptio_tensor_nbytes(code, len(shape), c_shape), f"{where} ({dtype} {list(shape)})")
        if data.nbytes != nbytes:
            raise ValueError(f"{where}: {dtype} {list(shape)} is {nbytes} bytes, the buffer has {data.nbytes}")
        out.append(_Saved(name, dtype, code, shape, data))
    return out


def save_file(tensor_dict: Mapping[str, Array], filename: PathLike,
              metadata: Optional[Dict[str, str]] = None, *, crc: bool = True,
              format: str = "safetensors", compress: int = 0, shuffle: bool = False) -> None:
    """Saves a dict of name -> numpy array (or Tensor) at `filename`,
    atomically (nothing appears there unless the whole save succeeds), as
    safetensors.numpy.save_file does.

    metadata: dict of str -> str (the safetensors __metadata__).
    Keyword-only, ckptio's own:
    crc: record every tensor's CRC32 (safetensors: in the metadata as
        ckptio.crc32.<name>; pt: in the zip records), checked on load.
    format: "safetensors", or "pt" for a torch.save zip archive that
        torch.load(weights_only=True) opens.
    compress: N > 0 (safetensors only) wraps the file in the zstd seekable
        format at zstd level N, which `zstd -d` and load_file undo.
    shuffle: adds the byte-shuffle filter to compress, which only ckptio undoes."""
    code = _lib.format_code(format)
    fspath = os.fsencode(os.fspath(filename))
    shown = os.fsdecode(fspath)
    saved = _checked(tensor_dict, metadata, shown)  # (the data must outlive the commit)
    lib = _lib.lib()
    context = ctx()
    opts = options(context, crc)
    opts.compress_level = int(compress)
    opts.shuffle = 1 if shuffle else 0
    w = ctypes.c_void_p()
    check(lib.ckptio_writer_open(context, fspath, code, ctypes.byref(opts), ctypes.byref(w)),
          f"cannot save {shown}", lib.ckptio_last_open_error(), shown)
    try:
        for key, value in (metadata or {}).items():
            check(lib.ckptio_writer_set_metadata(w, key.encode(), value.encode()),
                  f"{shown}: metadata {key!r}", lib.ckptio_writer_last_error(w))
        for t in saved:
            desc = _lib.Tensor_(t.name.encode(), t.code, len(t.shape), (ctypes.c_int64 * _lib.MAX_DIMS)(*t.shape),
                                t.data.ctypes.data, _lib.DEVICE_HOST)
            check(lib.ckptio_writer_add(w, ctypes.byref(desc)), f"{shown}: tensor {t.name!r}",
                  lib.ckptio_writer_last_error(w))
        check(lib.ckptio_writer_commit(w), f"cannot save {shown}",
              lib.ckptio_writer_last_error(w), shown)
    finally:
        lib.ckptio_writer_close(w)  # after a failure it only repeats it
    del saved


def save(tensor_dict: Mapping[str, Array], metadata: Optional[Dict[str, str]] = None, *,
         crc: bool = False, format: str = "safetensors", compress: int = 0,
         shuffle: bool = False) -> bytes:
    """The bytes of a safetensors file of the tensors, as
    safetensors.numpy.save: the very bytes it returns (ckptio._bytes),
    built in memory. Keyword-only: crc=True, format="pt", compress or
    shuffle (as save_file's) give instead the bytes of the file save_file
    would write with them (its header padded to 4 KiB, ckptio's metadata)."""
    if format == "safetensors" and not crc and not compress and not shuffle:
        saved = _checked(tensor_dict, metadata, "save")
        return _bytes.serialize([_bytes.Entry(t.name, t.dtype, t.shape, t.data.ctypes.data, t.data.nbytes)
                                 for t in saved], metadata)
    with tempfile.TemporaryDirectory(prefix="ckptio-save-", dir=scratch_dir()) as tmp:
        path = os.path.join(tmp, "m")
        save_file(tensor_dict, path, metadata, crc=crc, format=format, compress=compress,
                  shuffle=shuffle)
        with open(path, "rb") as f:
            return f.read()


def load(data: bytes, *, crc: bool = True) -> Dict[str, Array]:
    """Loads the tensors of a safetensors (or .pt) file held in `data`, as
    safetensors.numpy.load: a dict of name -> numpy array (Tensor for the
    dtypes numpy lacks), independent of `data`. crc (keyword-only): check
    the recorded CRC32s (ChecksumError on a mismatch)."""
    with MemoryFile(data) as mem:
        return load_file(mem.path, crc=crc)


def load_file(filename: PathLike, *, backend: str = "auto", crc: bool = True,
              mmap: Optional[bool] = None) -> Dict[str, Array]:
    """Loads every tensor of a safetensors or .pt file (or a sharded set: its
    index or directory), as safetensors.numpy.load_file: a dict of name ->
    numpy array, or Tensor for the dtypes numpy lacks. With crc, each
    recorded CRC32 is checked before anything is returned and a mismatch
    raises ChecksumError.

    backend="mmap": the arrays are views of one private copy-on-write
    mapping of the file, no bytes copied. They are writable, and writes
    never reach the file; a file saved over the path later (ckptio and
    safetensors-style atomic renames) does not change them; the mapping is
    freed when the last array goes. A program that truncates the file in
    place while arrays live makes reading them raise SIGBUS (as with
    safetensors' and torch.load(mmap=True)'s results; ckptio never writes
    in place). Strided or big-endian .pt entries and misaligned tensors are
    copied; a sharded set maps each shard on its own; a compressed file is
    always copied.
    backend="pread": every tensor is copied into fresh memory (parallel
    reads, through the page cache where the file fits in memory, which then
    keeps it for the next load; O_DIRECT where it does not); the arrays are
    independent of the file (the large ones share one anonymous mapping in
    2 MiB pages, unmapped when the last of them goes). backend="direct": as
    "pread", always by O_DIRECT, leaving the page cache as it was.
    backend="auto" (the default): "mmap" when the page cache holds the file
    or it fits in memory, else a copy by O_DIRECT (see
    ckptio.torch.load_file). mmap (keyword-only, deprecated: ckptio's
    spelling before 1.0, True is "mmap", False "pread") overrides backend
    when given, with a DeprecationWarning."""
    mapped = backend_choice(backend, deprecated_mmap(mmap, "ckptio.numpy.load_file"))
    return _load_path(filename, crc, mapped, backend == "direct")


def _load_path(filename: PathLike, crc: bool, mapped: Optional[bool], direct: bool) -> Dict[str, Array]:
    """load_file with its backend as Reader's mapped and direct."""
    with Reader(filename, crc, mapped=mapped, direct=direct) as r:
        shards = r.shards() if r.mapped else []
        if not shards:
            return _load_one(r, r.mapped)
    # A sharded set, checked as a set on open: each shard loaded on its own.
    out: Dict[str, Array] = {}
    for shard in shards:
        out.update(_load_path(shard, crc, mapped, False))
    return out


def _array_of(r: Reader, i: int, info: _lib.TensorInfo,
              view_of: Optional["ctypes.Array[ctypes.c_uint8]"],
              reqs: List[_lib.LoadRequest], placer: _placer.Placer) -> Array:
    """Tensor i as an array (or Tensor): a view of the file's mapping
    `view_of` (given only for a viewable tensor), else fresh memory
    (placer's, when it places it) with its load request appended to reqs."""
    name = info.name.decode()
    dtype = r.dtype_name(info)
    shape = tuple(info.shape[:info.ndim])
    np_dtype = NUMPY_DTYPES.get(dtype)
    if np_dtype is not None:
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        nbytes = count * np_dtype.itemsize
    else:
        count, nbytes = info.nbytes, info.nbytes
    if nbytes != info.nbytes:
        raise from_code(_lib.ERRORS["TENSOR_INFO"],
                        f"{r.shown}: tensor {name!r}: {dtype} {list(shape)} is {nbytes} bytes, "
                        f"the file says {info.nbytes}")
    element = np_dtype if np_dtype is not None else np.dtype(np.uint8)
    itemsize = element.itemsize
    flat: npt.NDArray[Any]
    if view_of is not None:
        # (numpy's stubs do not list ctypes arrays, which export the buffer protocol)
        flat = np.frombuffer(cast(Any, view_of), element, count, info.offset)
    else:
        place = placer.placed(i, itemsize)
        if place is not None:
            flat = np.frombuffer(place[0], element, count, place[1])
        else:
            flat = np.empty(count, element)
        if nbytes:
            reqs.append(_lib.LoadRequest(i, flat.ctypes.data, nbytes, _lib.DEVICE_HOST))
    return flat.reshape(shape) if np_dtype is not None else Tensor(dtype, shape, flat)


def _itemsize(r: Reader, info: _lib.TensorInfo) -> int:
    """The bytes of one element of the tensor's array (1 for raw bytes)."""
    np_dtype = NUMPY_DTYPES.get(r.dtype_name(info))
    return np_dtype.itemsize if np_dtype is not None else 1


def _load_many(r: Reader, reqs: List[_lib.LoadRequest]) -> None:
    if reqs:
        arr = (_lib.LoadRequest * len(reqs))(*reqs)
        r.check(r.lib.ckptio_reader_load_many(r.handle, arr, len(reqs)), "load")


def _load_one(r: Reader, mmap: bool) -> Dict[str, Array]:
    """load_file of one file, open in r."""
    infos = r.infos()
    mapping = _mapped.map_file(r) if mmap and infos else None
    out: Dict[str, Array] = {}
    reqs: List[_lib.LoadRequest] = []
    views = {i for i, info in enumerate(infos)
             if mapping is not None and _mapped.viewable(r, i, info, _itemsize(r, info))}
    placer = _placer.Placer(infos, (i for i in range(len(infos)) if i not in views))
    for i, info in enumerate(infos):
        out[info.name.decode()] = _array_of(r, i, info, mapping if i in views else None, reqs, placer)
    _load_many(r, reqs)
    return out


def load_metadata(filename: PathLike) -> Dict[str, str]:
    """The file's __metadata__ as a dict, without ckptio's CRC keys."""
    with Reader(filename) as r:
        return r.metadata()


def verify(filename: PathLike) -> int:
    """Checks every recorded CRC32 of the file. Raises ChecksumError on a
    mismatch; returns the number of tensors that have no recorded CRC."""
    with Reader(filename) as r:
        unchecked = ctypes.c_size_t()
        r.check(r.lib.ckptio_reader_verify(r.handle, ctypes.byref(unchecked)), "verify")
        return unchecked.value


class NumpySlice:
    """safe_open(...).get_slice(name) for numpy: get_shape(), get_dtype(),
    and [key]. A key that slices one dimension with step 1 (integers,
    start:stop, ':' and '...', as ckptio.torch's slices) reads only that
    slice's bytes from the file (ckptio_reader_load_slices); any other numpy
    key reads the whole tensor, then indexes it in memory. `verified` says
    whether the last read was checked against the tensor's CRC32 (only a
    whole tensor can be)."""

    def __init__(self, owner: "safe_open", name: str) -> None:
        self._owner = owner
        self._name = name
        info = owner._info(name)
        self._index = owner._by_name[name]
        self._shape = tuple(int(d) for d in info.shape[:info.ndim])
        self._dtype = owner._reader().dtype_name(info)
        self.verified: Optional[bool] = None

    def get_shape(self) -> List[int]:
        """The tensor's shape, as a list."""
        return list(self._shape)

    def get_dtype(self) -> str:
        """The safetensors dtype name ("F32", "BF16", ...)."""
        return self._dtype

    def _read(self, dim: int, start: int, stop: int) -> npt.NDArray[Any]:
        """start:stop of dimension dim (the whole tensor: 0, 0, shape[0]),
        read from the file; sets verified (the library checks the CRC32 of a
        read that covers the whole tensor)."""
        r = self._owner._reader()
        where = f"{r.shown}: tensor {self._name!r}"
        np_dtype = NUMPY_DTYPES.get(self._dtype)
        if np_dtype is None:
            raise TypeError(f"{where} is {self._dtype}, which numpy lacks: get_tensor returns "
                            "its bytes")
        shape = list(self._shape)
        shape[dim] = stop - start
        out = np.empty(shape, np_dtype)
        nbytes = r.check(int(r.lib.ckptio_reader_slice_nbytes(r.handle, self._index, dim, start,
                                                               stop)), f"slice of {self._name!r}")
        if nbytes != out.nbytes:
            raise from_code(_lib.ERRORS["TENSOR_INFO"],
                            f"{where}: slice is {nbytes} bytes, numpy says {out.nbytes}")
        req = _lib.SliceRequest(self._index, dim, start, stop, out.ctypes.data if nbytes else None,
                                nbytes, _lib.DEVICE_HOST, 0, 0)
        r.check(r.lib.ckptio_reader_load_slices(r.handle, ctypes.byref(req), 1),
                f"slice {start}:{stop} of dim {dim} of {self._name!r}")
        self.verified = bool(req.verified)
        return out

    def __getitem__(self, key: Any) -> Any:
        """The slice `key` of the tensor (see the class's docstring)."""
        r = self._owner._reader()
        where = f"{r.shown}: tensor {self._name!r}"
        if not self._shape:  # 0-d: numpy indexes the scalar array
            whole = self._owner.get_tensor(self._name)
            if isinstance(whole, Tensor):
                raise TypeError(f"{where} is {self._dtype}, which numpy lacks")
            self.verified = None
            return whole[key]
        try:
            dim, start, stop, drop = parse_slice_key(self._shape, key, where)
        except (ValueError, TypeError):  # any other numpy key, on the whole tensor
            return self._read(0, 0, self._shape[0])[key]
        if dim is None:
            return self._read(0, 0, self._shape[0])[key]
        out = self._read(dim, start, stop)
        return out.squeeze(dim) if drop else out


class safe_open(OpenReader[Reader]):
    """A checkpoint opened for lazy access, as safetensors.safe_open with
    framework="numpy":

        with ckptio.numpy.safe_open("m.safetensors", framework="numpy") as f:
            for name in f.keys():
                a = f.get_tensor(name)   # loaded (and CRC-checked) on demand

    framework must be "numpy" or "np" (ckptio.torch.safe_open serves
    torch); device must be "cpu". backend as load_file's."""

    def __init__(self, filename: PathLike, framework: str = "numpy", device: str = "cpu", *,
                 backend: str = "auto") -> None:
        check_framework(framework, "numpy", device)
        self._mmap = backend_choice(backend, None)
        r = Reader(filename, direct=backend == "direct")
        try:
            self._infos = r.infos()
        except BaseException:
            r.close()
            raise
        self._by_name = {info.name.decode(): i for i, info in enumerate(self._infos)}
        self._sizes: List[Optional[int]] = [x.nbytes for x in self._infos]
        self._r = r
        self._arenas = _placer.Arenas()  # a stream's windows reuse their mappings
        self._ahead = ReadAhead(self._load, list(self._by_name))

    def _info(self, name: str) -> _lib.TensorInfo:
        r = self._reader(settle=False)
        i = self._by_name.get(name)
        if i is None:
            raise from_code(_lib.ERRORS["NOT_FOUND"], f"{r.shown}: no tensor named {name!r}")
        return self._infos[i]

    def keys(self) -> List[str]:
        """Tensor names, sorted (as safetensors returns them)."""
        self._reader(settle=False)
        return sorted(self._by_name)

    def offset_keys(self) -> List[str]:
        """Tensor names in file order."""
        self._reader(settle=False)
        return [info.name.decode() for info in self._infos]

    def get_tensor(self, name: str) -> Array:
        """Loads one tensor (CRC-checked) into a new array;
        TensorNotFoundError (a KeyError) when the file has none of that name.
        From a cold file, the tensors after it are read with it (up to 256
        MiB, and the next 256 MiB in the background while they are asked
        for in file order or in keys() order: ckptio._core.ReadAhead)."""
        self._info(name)
        array: Array = self._read_ahead(name, self._by_name[name], self._sizes)
        return array

    def _load(self, indices: List[int]) -> Dict[str, Array]:
        """New arrays for the tensors at indices, loaded (ReadAhead's load)."""
        r = self._r
        assert r is not None
        reqs: List[_lib.LoadRequest] = []
        placer = _placer.Placer(self._infos, indices, self._arenas)
        loaded = {self._infos[k].name.decode(): _array_of(r, k, self._infos[k], None, reqs, placer)
                  for k in indices}
        _load_many(r, reqs)
        return loaded

    def get_tensors(self) -> Dict[str, Array]:
        """Every tensor, in file order (as load_file, with this file's
        backend)."""
        r = self._reader()
        return _load_one(r, r.maps(self._mmap))

    def get_slice(self, name: str) -> NumpySlice:
        """A NumpySlice of the tensor: get_shape(), get_dtype(), [key]."""
        self._info(name)
        return NumpySlice(self, name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())
