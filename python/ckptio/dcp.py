"""ckptio as the storage layer of torch.distributed.checkpoint (DCP).

    import torch.distributed.checkpoint as dcp
    import ckptio.dcp
    dcp.save(state_dict, storage_writer=ckptio.dcp.Writer(path))
    dcp.load(state_dict, storage_reader=ckptio.dcp.Reader(path))

DCP plans which rank writes which chunk of which tensor (DTensor shards,
replicas deduplicated); ckptio writes each rank's chunks with its pipeline
(pinned staging, CRC32, O_DIRECT) as one multi-rank checkpoint
(ckptio_writer_open_ranks): one safetensors file per rank and the index,
committed as a whole through a communicator built on torch.distributed (a
gloo group of its own, so the collectives run on CPU tensors whatever the
training backend). The result opens in the C API, `ckptio inspect / verify /
convert`, safetensors (each file) and, when every tensor is whole,
transformers. A checkpoint written by the C API under MPI loads through the
Reader the same way.

Non-tensor values (DCP's BYTE_IO items: param groups, Python numbers) are
stored as U8 tensors named "__dcp_bytes__." + their key, each written once.
The Reader rebuilds DCP's Metadata from the checkpoint itself (global
tensors, their parts as chunks), so a checkpoint needs no other file.

Tensors are passed by pointer: CPU tensors are not copied in Python (a
non-contiguous one is made contiguous first, as ckptio.torch does); CUDA
tensors go through the library's device path, ordered after the current
stream of their device.
"""

from __future__ import annotations

import ctypes
import datetime
import io
import os
import threading
from typing import Any, Dict, Iterator, List, Optional, Tuple, TypeVar, Union

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                   MetadataIndex, StorageMeta, TensorProperties,
                                                   TensorStorageMetadata)
from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner, SavePlan,
                                                  SavePlanner, WriteItemType)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from . import _lib
from ._group import Group
from ._core import ctx, options
from ._torch_io import TORCH_DTYPES, as_saveable, tensor_desc
from .errors import check, from_code

__all__ = ["Writer", "Reader", "BYTES_PREFIX"]

BYTES_PREFIX = "__dcp_bytes__."
PREFIX = "model"
_T = TypeVar("_T")
CheckpointId = Union[str, "os.PathLike[str]"]


def _done(value: _T) -> Future[_T]:
    f: Future[_T] = Future()
    f.set_result(value)
    return f


# ------------------------------------------------------------ writing

class Writer(StorageWriter):
    """A DCP StorageWriter into `path` (a directory, created if missing):
    `{prefix}-KKKKK-of-MMMMM.safetensors` per rank with chunks to write and
    `{prefix}.safetensors.index.json`, committed as one (a rank's failure
    fails the save on every rank and leaves the previous checkpoint).

    process_group: the group DCP saves over (default: the default group)."""

    def __init__(self, path: CheckpointId, *, process_group: Optional[dist.ProcessGroup] = None,
                 crc: bool = True, prefix: str = PREFIX) -> None:
        super().__init__()
        self.path = os.fspath(path)
        self.process_group = process_group
        self.crc = crc
        self.prefix = prefix
        self._group: Optional[Group] = None

    def reset(self, checkpoint_id: Optional[CheckpointId] = None) -> None:
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        if self._group is None:
            self._group = Group(self.process_group)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        return plans

    def storage_meta(self) -> Optional[StorageMeta]:
        return StorageMeta(checkpoint_id=self.path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: CheckpointId) -> bool:
        """Whether DCP may pass checkpoint_id as the path: a str or a path."""
        return isinstance(checkpoint_id, (str, os.PathLike))

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[List[WriteResult]]:
        if self._group is None:
            self._group = Group(self.process_group)
        if not _lib.is_storage_path(self.path):  # a storage's prefix (s3://bucket/dir) has no directory to make
            os.makedirs(self.path, exist_ok=True)
        lib, context = _lib.lib(), ctx()
        opts = options(context, self.crc)
        w = ctypes.c_void_p()
        check(lib.ckptio_writer_open_ranks(context, ctypes.byref(self._group.comm), os.fsencode(self.path),
                                            self.prefix.encode(), ctypes.byref(opts), ctypes.byref(w)),
               f"cannot save {self.path}", lib.ckptio_last_open_error())
        keep: List[torch.Tensor] = []
        results: List[WriteResult] = []
        try:
            try:
                streams = self._add_items(lib, w, plan, planner, keep, results)
            except Exception as e:
                # Every other rank is about to wait for this one in the
                # commit: tell them instead, then raise here.
                lib.ckptio_writer_abort(w, _lib.ERRORS["RANK"], f"{type(e).__name__}: {e}".encode()[:400])
                raise
            for device, stream in streams.items():
                check(lib.ckptio_writer_set_stream(w, device, stream), f"{self.path}: CUDA stream",
                       lib.ckptio_writer_last_error(w))
            rc = lib.ckptio_writer_commit(w)
            if rc < 0 and self._group.error is not None:
                raise from_code(rc, f"cannot save {self.path}: torch.distributed failed: "
                                      f"{self._group.error}") from self._group.error
            check(rc, f"cannot save {self.path}", lib.ckptio_writer_last_error(w))
        finally:
            lib.ckptio_writer_close(w)
            del keep
        return _done(results)

    def _add_items(self, lib: Any, w: ctypes.c_void_p, plan: SavePlan, planner: SavePlanner,
                   keep: List[torch.Tensor], results: List[WriteResult]) -> Dict[int, int]:
        streams: Dict[int, int] = {}
        for item in plan.items:
            fqn = item.index.fqn
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                raw = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
                t = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
                name = BYTES_PREFIX + fqn
                offsets: Optional[List[int]] = None
                global_shape: Optional[List[int]] = None
            else:
                assert isinstance(data, torch.Tensor) and item.tensor_data is not None
                t = data.detach()
                name = fqn
                chunk = item.tensor_data.chunk
                offsets = list(chunk.offsets)
                global_shape = list(item.tensor_data.size)
            t, dtype, device = as_saveable(name, t, packed=False)  # (a part's offsets count elements)
            keep.append(t)
            if device != _lib.DEVICE_HOST and device not in streams:
                streams[device] = torch.cuda.current_stream(t.device).cuda_stream
            shape = tuple(t.shape)
            desc = tensor_desc(name, t, dtype, device)
            whole = offsets is None or (all(o == 0 for o in offsets) and list(shape) == global_shape)
            if whole or offsets is None or global_shape is None:
                rc = lib.ckptio_writer_add(w, ctypes.byref(desc))
            else:
                g = (ctypes.c_int64 * _lib.MAX_DIMS)(*global_shape)
                o = (ctypes.c_int64 * _lib.MAX_DIMS)(*offsets)
                rc = lib.ckptio_writer_add_part(w, ctypes.byref(desc), g, o)
            check(rc, f"{self.path}: {name!r}", lib.ckptio_writer_last_error(w))
            results.append(WriteResult(index=item.index, size_in_bytes=t.numel() * t.element_size(),
                                       storage_data=None))
        return streams

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        # The index is written by the commit (rank 0, last); DCP's own
        # metadata is rebuilt from it by the Reader.
        return None


# ------------------------------------------------------------ reading

class Reader(StorageReader):
    """A DCP StorageReader of a ckptio checkpoint at `path`: a multi-rank
    checkpoint (any number of ranks may load it, each reading only the bytes
    of the chunks it asks for), a sharded set or a single file. Every part a
    read covers whole has its CRC32 checked.

    group (a torch.distributed process group: dist.group.WORLD, or one per
    node): each load is a group load over it (ckptio.torch.load_boxes):
    the chunks every rank's plan asks for are read from storage once per
    group and exchanged, staging_bytes and timeout as there. Every rank of
    the group must load (DCP's load does)."""

    def __init__(self, path: CheckpointId, *, crc: bool = True, group: Optional[dist.ProcessGroup] = None,
                 staging_bytes: Optional[int] = None, timeout: Optional[datetime.timedelta] = None) -> None:
        super().__init__()
        self.path = os.fspath(path)
        self.crc = crc
        self.group, self.staging_bytes, self.timeout = group, staging_bytes, timeout
        self._r: Optional[ctypes.c_void_p] = None
        self._lock = threading.Lock()
        self.storage_data: Dict[MetadataIndex, int] = {}

    def reset(self, checkpoint_id: Optional[CheckpointId] = None) -> None:
        self._close()
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: CheckpointId) -> bool:
        """Whether DCP may pass checkpoint_id as the path: a str or a path."""
        return isinstance(checkpoint_id, (str, os.PathLike))

    def _reader(self) -> ctypes.c_void_p:
        with self._lock:
            if self._r is None:
                lib, context = _lib.lib(), ctx()
                opts = options(context, self.crc)
                r = ctypes.c_void_p()
                check(lib.ckptio_reader_open(context, os.fsencode(self.path), ctypes.byref(opts), ctypes.byref(r)),
                       f"cannot open {self.path}", lib.ckptio_last_open_error())
                self._r = r
            return self._r

    def _close(self) -> None:
        with self._lock:
            if self._r is not None:
                _lib.lib().ckptio_reader_close(self._r)
                self._r = None

    def __del__(self) -> None:
        try:
            self._close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def _infos(self) -> Iterator[Tuple[int, _lib.TensorInfo]]:
        lib, r = _lib.lib(), self._reader()
        for i in range(lib.ckptio_reader_count(r)):
            info = _lib.TensorInfo()
            check(lib.ckptio_reader_info(r, i, ctypes.byref(info)), f"{self.path}: tensor {i}")
            yield i, info

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        lib, r = _lib.lib(), self._reader()
        sd_meta: Dict[str, Union[TensorStorageMetadata, BytesStorageMetadata]] = {}
        storage: Dict[MetadataIndex, int] = {}
        for i, info in self._infos():
            name = info.name.decode()
            if name.startswith(BYTES_PREFIX):
                fqn = name[len(BYTES_PREFIX):]
                sd_meta[fqn] = BytesStorageMetadata()
                storage[MetadataIndex(fqn)] = i
                continue
            dtype_name = lib.ckptio_dtype_name(info.dtype).decode()
            if dtype_name not in TORCH_DTYPES:
                raise from_code(_lib.ERRORS["DTYPE"], f"{self.path}: tensor {name!r} is {dtype_name}, "
                                                        "which torch has no dtype for")
            chunks = []
            for k in range(lib.ckptio_reader_part_count(r, i)):
                off = (ctypes.c_int64 * _lib.MAX_DIMS)()
                size = (ctypes.c_int64 * _lib.MAX_DIMS)()
                check(lib.ckptio_reader_part(r, i, k, None, off, size), f"{self.path}: {name!r} part {k}")
                offsets = torch.Size(off[:info.ndim])
                chunks.append(ChunkStorageMetadata(offsets=offsets, sizes=torch.Size(size[:info.ndim])))
                storage[MetadataIndex(name, offsets)] = i
            sd_meta[name] = TensorStorageMetadata(properties=TensorProperties(dtype=TORCH_DTYPES[dtype_name]),
                                                  size=torch.Size(info.shape[:info.ndim]), chunks=chunks)
        return Metadata(state_dict_metadata=sd_meta, storage_data=storage, storage_meta=StorageMeta(
            checkpoint_id=self.path))

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        lib, r = _lib.lib(), self._reader()
        reqs, targets = [], []
        for item in plan.items:
            index = self.storage_data[item.storage_index] if item.storage_index in self.storage_data else \
                lib.ckptio_reader_find(r, (item.storage_index.fqn if item.type != LoadItemType.BYTE_IO
                                           else BYTES_PREFIX + item.storage_index.fqn).encode())
            if item.type == LoadItemType.BYTE_IO:
                info = _lib.TensorInfo()
                check(lib.ckptio_reader_info(r, index, ctypes.byref(info)), f"{self.path}: {item.storage_index}")
                buf = torch.empty(info.nbytes, dtype=torch.uint8)
                check(lib.ckptio_reader_load_many(r, ctypes.byref(_lib.LoadRequest(
                    index, buf.data_ptr(), info.nbytes, _lib.DEVICE_HOST)), 1),
                    f"cannot load {self.path}", lib.ckptio_reader_last_error(r))
                planner.load_bytes(item, io.BytesIO(buf.numpy().tobytes()))
                continue
            target = planner.resolve_tensor(item).detach()
            chunk = item.storage_index.offset or [0] * len(item.lengths)
            start = [c + o for c, o in zip(chunk, item.storage_offsets)]
            stop = [s + n for s, n in zip(start, item.lengths)]
            direct = target.is_contiguous() and target.device.type == "cpu"
            dst = target if direct else torch.empty(tuple(item.lengths), dtype=target.dtype)
            q = _lib.BoxRequest()
            q.index = index
            for d, (a, b) in enumerate(zip(start, stop)):
                q.start[d], q.stop[d] = a, b
            q.dst, q.dst_bytes, q.device = dst.data_ptr(), dst.numel() * dst.element_size(), _lib.DEVICE_HOST
            reqs.append(q)
            targets.append((item, target, dst, direct))
        arr = (_lib.BoxRequest * max(len(reqs), 1))(*reqs)
        if self.group is not None:  # collective: every rank, with chunks to read or not
            g = Group(self.group, self.timeout)
            rc = lib.ckptio_reader_load_boxes_group(r, ctypes.byref(g.comm), arr, len(reqs), self.staging_bytes or 0, 0)
            detail = lib.ckptio_reader_last_error(r)
            if rc < 0 and g.error is not None:
                detail += f": {g.error}".encode()
            check(rc, f"cannot load {self.path}", detail)
        elif reqs:
            check(lib.ckptio_reader_load_boxes(r, arr, len(reqs)), f"cannot load {self.path}",
                   lib.ckptio_reader_last_error(r))
        for item, target, dst, direct in targets:
            if not direct:
                target.copy_(dst.view(target.shape) if dst.shape != target.shape else dst)
            planner.commit_tensor(item, target)
        return _done(None)
