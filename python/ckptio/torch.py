"""ckptio for PyTorch, call-compatible with safetensors.torch: save, save_file,
load, load_file, safe_open, save_model, load_model, storage_ptr and
storage_size take the same arguments (same names, same defaults) and return
the same types; ckptio's own options are keyword-only. Beyond safetensors:
.pt files (format="pt", and torch.save's files on load), CRC32s checked on
load, asynchronous saves (save_file_async -> SaveHandle), Hugging Face
sharded sets (save_torch_state_dict), CUDA tensors saved from and loaded to
the GPU by the library.

    import torch, ckptio.torch as ct
    ct.save_file({"w": torch.ones(2, 3)}, "m.safetensors", metadata={"step": "7"})
    tensors = ct.load_file("m.safetensors")            # zero-copy on the CPU
    with ct.safe_open("m.safetensors", framework="pt") as f:
        w = f.get_tensor("w")

Tensor memory goes to the library by pointer; CUDA snapshots are ordered
after each device's current stream when the save starts (see _torch_io).
"""

from __future__ import annotations

import re
import tempfile
import warnings
from types import TracebackType
import datetime
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple, Type, Union

import torch
import torch.distributed as dist

from . import _bytes, _checkpoint, _lib, _placer, _torch_group
from ._core import (MemoryFile, OpenReader, PathLike, ReadAhead, backend_choice, check_framework,
                    deprecated_mmap, scratch_dir)
from ._torch_io import (TORCH_DTYPES, Device, Plan, SaveHandle, TorchReader, file_shape, load_device, overlapping,
                        plan, start, torch_layout)
from .errors import CkptioError, from_code
from .torch_slice import TorchSlice

__all__ = ["save", "save_file", "load", "load_file", "load_boxes", "safe_open", "save_model", "load_model",
           "storage_ptr", "storage_size", "save_file_async", "save_torch_state_dict",
           "save_torch_state_dict_async", "save_checkpoint", "save_checkpoint_async", "load_checkpoint",
           "parse_size", "SaveHandle", "TorchSlice",
           "CkptioError", "TORCH_DTYPES"]


# ---------------------------------------------------------------- storages

def storage_ptr(tensor: torch.Tensor) -> int:
    """The address of the tensor's storage (0 when it has none, as a meta
    tensor), as safetensors.torch.storage_ptr: tensors sharing memory have
    the same one."""
    try:
        return int(tensor.untyped_storage().data_ptr())
    except (NotImplementedError, RuntimeError):
        return 0


def storage_size(tensor: torch.Tensor) -> int:
    """The bytes of the tensor's whole storage, as
    safetensors.torch.storage_size."""
    try:
        return int(tensor.untyped_storage().nbytes())
    except (NotImplementedError, RuntimeError):
        return tensor.nelement() * tensor.element_size()


# --------------------------------------------------------------------- save

def _refuse_what_safetensors_refuses(tensors: Mapping[str, torch.Tensor]) -> None:
    """safetensors.torch's save and save_file refuse tensors that share
    memory (RuntimeError) and non-contiguous tensors (ValueError): the file
    would hold the shared bytes once per tensor and load them as separate
    copies, and a view saved in place of its base is a mistake more often
    than not. ckptio's do the same, with the same classes, in the same
    order; what is not a dense tensor is plan()'s to refuse (as safetensors
    refuses it first)."""
    if not isinstance(tensors, Mapping) or not all(
            isinstance(t, torch.Tensor) and t.layout == torch.strided for t in tensors.values()):
        return
    shared = overlapping(tensors.items())
    if shared:
        raise RuntimeError(
            f"Some tensors share memory, which safetensors and ckptio.torch's save / save_file refuse: "
            f"{shared}. Saved, the shared memory would be stored once per tensor and load as separate "
            "copies. Save the model with save_model (tied weights stored once), or .clone() the tensors to "
            "store apart. More information at https://huggingface.co/docs/safetensors/torch_shared_tensors")
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(
                f"You are trying to save a non contiguous tensor: `{name}` which is not allowed (as in "
                "safetensors). It may be a view of another tensor, in which case save the whole tensor and "
                "slice it again at load time; otherwise call `.contiguous()` on it before saving.")


def _refuse_in_safetensors(tensors: Mapping[str, torch.Tensor], format: str) -> None:
    """save's and save_file's refusals: safetensors' (an unknown format
    first), for the safetensors format, the one safetensors writes."""
    if _lib.format_code(format) == _lib.FORMAT_SAFETENSORS:
        _refuse_what_safetensors_refuses(tensors)


def _start_save(p: Plan, filename: PathLike, format: str, crc: bool) -> SaveHandle:
    """A save of a checked plan into one file, started."""
    return start(_lib.lib().ckptio_writer_open, filename, crc, (_lib.format_code(format),), p)


def save_file_async(tensors: Mapping[str, torch.Tensor], filename: PathLike,
                    metadata: Optional[Dict[str, str]] = None, *, format: str = "safetensors",
                    crc: bool = True) -> SaveHandle:
    """Starts saving `tensors` (a dict of str -> torch.Tensor) at `filename`
    and returns a SaveHandle at once; see save_file for the arguments. Do not
    modify the tensors until handle.wait_snapshot() returns; the file exists
    (atomically) once handle.wait_durable() returns. Unlike save_file (and
    as save_model and save_torch_state_dict), ckptio's own call saves every
    tensor by value: a non-contiguous one or one sharing memory is copied
    as .contiguous() would."""
    return _start_save(plan(tensors, metadata), filename, format, crc)


def save_file(tensors: Mapping[str, torch.Tensor], filename: PathLike,
              metadata: Optional[Dict[str, str]] = None, *, format: str = "safetensors",
              crc: bool = True) -> None:
    """Saves a dict of str -> torch.Tensor at `filename`, atomically (nothing
    appears there unless the whole save succeeds), as
    safetensors.torch.save_file does.

    metadata: dict of str -> str (safetensors __metadata__; in "pt" files a
        separate record that torch.load ignores).
    Keyword-only, ckptio's own:
    format: "safetensors", or "pt" for a torch.save zip archive that
        torch.load(weights_only=True) opens (a dict of the tensors).
    crc: record a CRC32 of every tensor (checked by load_file).
    Tensors on CPU or CUDA devices, any dtype in TORCH_DTYPES or PACKED
    (float4_e2m1fn_x2, saved as F4 as safetensors saves it), up to 8 dims.
    In the safetensors format, as safetensors, tensors that share memory
    raise RuntimeError and non-contiguous ones ValueError (save_model saves
    tied weights once and makes tensors contiguous; save_file_async saves
    them by value); in "pt" (torch.save saves views) they are saved by
    value. Lazily conjugated or negated views are resolved (a copy)."""
    _refuse_in_safetensors(tensors, format)
    _start_save(plan(tensors, metadata), filename, format, crc).wait_durable()


def save_checkpoint_async(obj: Any, path: PathLike, *, format: Optional[str] = None,
                          crc: bool = True) -> SaveHandle:
    """Starts saving a nested training checkpoint and returns a SaveHandle
    at once (see save_checkpoint). Do not modify its tensors until
    handle.wait_snapshot() returns; the file exists (atomically) once
    handle.wait_durable() returns."""
    return _checkpoint.start(obj, path, format, crc)


def save_checkpoint(obj: Any, path: PathLike, *, format: Optional[str] = None, crc: bool = True) -> None:
    """Saves a training checkpoint as people write it, e.g.
    {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 3},
    atomically (nothing appears at `path` unless the whole save succeeds).

    obj: dicts (and OrderedDicts), lists, tuples, sets, str, int, float,
        bool, None, bytes, torch.Size, torch.dtype, torch.device, tensors
        (CPU or CUDA; nn.Parameter kept) and numpy arrays and scalars (RNG
        states), nested up to 100 levels. Anything else is refused before a
        byte is written (TypeError naming its place, e.g.
        "optim.param_groups[0].foo"), as is a container inside itself.
    format: "pt" (torch.save's archive: torch.load reads it, with
        weights_only=True too; numpy values need torch's
        serialization.safe_globals there, as for torch.save's own files;
        storages shared by several tensors are written once and views stay
        views), or "safetensors" (every tensor under its path, "optim.state.0.
        exp_avg", and the rest as JSON in the metadata key
        "checkpoint.structure", docs/FORMATS.md; one tensor met twice is
        saved once, views of one storage are saved each as its own). None:
        "safetensors" when `path` ends in .safetensors, else "pt".
    crc: record a CRC32 of every stored part (checked by load_checkpoint)."""
    save_checkpoint_async(obj, path, format=format, crc=crc).wait_durable()


def load_checkpoint(path: PathLike, *, map_location: Any = None, select: Any = None,
                    mmap: Optional[bool] = None) -> Any:
    """Loads a checkpoint back as the object that was saved: one written
    by save_checkpoint (either format) or by torch.save (its zip archives),
    without running any pickled code: data.pkl may name only the globals
    torch.load(weights_only=True) allows, and numpy's array and scalar
    rebuilders; any other is refused naming it (CkptioError, PICKLE).
    A safetensors file without a structure loads as its dict of tensors.

    map_location: as torch.load's: None (each tensor where it was saved),
        "cpu", "cuda:1", a torch.device or an int, or a dict of saved
        location -> device ({"cuda:0": "cpu"}).
    select: a key, or a tuple of keys, naming one part to load, e.g.
        "model" or ("optim", "state"): only the tensors of that part are
        read (copied, unless mmap=True, which maps and checks the whole
        file).
    mmap: True, CPU tensors are views of a private (copy-on-write) mapping
        of the file, as torch.load(mmap=True) gives them; None (the
        default), the same when the file is in the page cache or fits in
        memory (it then stays cached for the next load), else copies read
        by O_DIRECT, as load_file's backend="auto"; False, copies.
    Every CRC stored for what is read is checked."""
    return _checkpoint.load(path, map_location, select, mmap)


def save(tensors: Mapping[str, torch.Tensor], metadata: Optional[Dict[str, str]] = None, *,
         format: str = "safetensors", crc: bool = False) -> bytes:
    """The bytes of a safetensors file of the tensors, as
    safetensors.torch.save: the very bytes it returns (ckptio._bytes; CUDA
    tensors are copied to the CPU for it), with save_file's refusals. Keyword-only: crc=True or format="pt" give instead the
    bytes of the file save_file would write with them (written in memory,
    /dev/shm, and read back)."""
    _refuse_in_safetensors(tensors, format)
    p = plan(tensors, metadata)
    if format == "safetensors" and not crc:
        host = [(name, t if t.device.type == "cpu" else t.cpu(), dtype) for name, t, dtype, _ in p.tensors]
        return _bytes.serialize([_bytes.Entry(name, dtype, file_shape(t, dtype), t.data_ptr(),
                                              t.nelement() * t.element_size()) for name, t, dtype in host],
                                None if metadata is None else dict(p.meta))
    with tempfile.TemporaryDirectory(prefix="ckptio-save-", dir=scratch_dir()) as tmp:
        path = f"{tmp}/m"
        _start_save(p, path, format, crc).wait_durable()
        with open(path, "rb") as f:
            return f.read()


def _shared_groups(state: Mapping[str, torch.Tensor]) -> List[List[str]]:
    """Names of tensors that share one storage, in groups of two or more."""
    by_storage: Dict[Tuple[str, int], List[str]] = {}
    for name, t in state.items():
        ptr = storage_ptr(t)
        if ptr:
            by_storage.setdefault((str(t.device), ptr), []).append(name)
    return [sorted(group) for group in by_storage.values() if len(group) > 1]


def _covers_storage(t: torch.Tensor) -> bool:
    return (t.data_ptr() == storage_ptr(t)
            and t.nelement() * t.element_size() == storage_size(t))


def save_model(model: torch.nn.Module, filename: PathLike,
               metadata: Optional[Dict[str, str]] = None, force_contiguous: bool = True, *,
               format: str = "safetensors", crc: bool = True) -> None:
    """Saves model.state_dict() at `filename`, as safetensors.torch.save_model:
    of tensors that share one storage (tied weights) only one is saved, the
    first by name of those covering the whole storage, and each dropped name
    is recorded in the metadata as dropped name -> kept name (unless the
    caller's metadata has that key); load_model restores them. When none of
    a group covers its storage, all are saved (ckptio stores each tensor's
    own bytes; safetensors refuses such a model). force_contiguous: save
    .contiguous() copies (ckptio copies non-contiguous tensors anyway:
    save_model does not refuse what save_file refuses).
    format and crc as save_file's."""
    state = dict(model.state_dict())
    meta = dict(metadata or {})
    for group in _shared_groups(state):
        whole = [name for name in group if _covers_storage(state[name])]
        if not whole:
            continue
        keep = whole[0]
        for name in group:
            if name != keep:
                meta.setdefault(name, keep)
                del state[name]
    if force_contiguous:
        state = {k: v.contiguous() for k, v in state.items()}
    _start_save(plan(state, meta or metadata), filename, format, crc).wait_durable()


# ------------------------------------------------------------ sharded save

# huggingface_hub's units (powers of 1000), and transformers' binary ones.
_SIZE_UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SIZE_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([KMGT]I?B)\s*", re.IGNORECASE)


def parse_size(size: Union[int, str]) -> int:
    """Bytes from an int or a string such as "5GB" / "500MB" / "2GiB": KB, MB,
    GB, TB are powers of 1000 and a value may have a fraction ("1.5GB" =
    1500000000), as huggingface_hub's parse_size_to_int; KiB, MiB, GiB, TiB
    powers of 1024. Units are case-insensitive. ValueError for anything else
    or a size under 1 byte; TypeError for a float or None."""
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


def save_torch_state_dict_async(tensors: Mapping[str, torch.Tensor], save_directory: PathLike,
                                max_shard_size: Union[int, str] = "5GB",
                                metadata: Optional[Dict[str, str]] = None,
                                prefix: str = "model", crc: bool = True) -> SaveHandle:
    """Starts a sharded save of `tensors` into the existing directory
    `save_directory` and returns a SaveHandle at once (the same methods as
    save_file_async's; handle.filename is the directory). See
    save_torch_state_dict."""
    limit = parse_size(max_shard_size)
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    p = plan(tensors, metadata)
    # As huggingface_hub: every shard says format=pt (transformers requires
    # it); the caller's metadata may set another.
    if all(key != "format" for key, _ in p.meta):
        p.meta.insert(0, ("format", "pt"))
    # The shards huggingface_hub's split_torch_state_dict_into_shards cuts:
    # the library's CKPTIO_SHARD_ORDER_HF over the dict's order.
    return start(_lib.lib().ckptio_writer_open_sharded, save_directory, crc,
                 (prefix.encode(), _lib.FORMAT_SAFETENSORS, limit, _lib.SHARD_ORDER_HF), p)


def save_torch_state_dict(tensors: Mapping[str, torch.Tensor], save_directory: PathLike,
                          max_shard_size: Union[int, str] = "5GB",
                          metadata: Optional[Dict[str, str]] = None, prefix: str = "model",
                          crc: bool = True) -> None:
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

def load_file(filename: PathLike, device: Device = "cpu", *, backend: str = "auto",
              mmap: Optional[bool] = None, group: Optional[dist.ProcessGroup] = None,
              staging_bytes: Optional[int] = None, timeout: Optional[datetime.timedelta] = None,
              exchange: bool = False) -> Dict[str, torch.Tensor]:
    """Loads every tensor of a safetensors or torch.save (.pt) file (or a
    sharded set: its index or directory) onto `device` ("cpu", "cuda",
    "cuda:N", an int N, or a torch.device), as safetensors.torch.load_file:
    a dict of str -> torch.Tensor in file order. Recorded CRC32s are checked
    before anything is returned; a mismatch raises ChecksumError.

    On the CPU, backend="mmap" gives tensors that are views of one private
    copy-on-write mapping of the file (MAP_PRIVATE), no bytes copied. They
    may be written (writes never reach the file); a file saved over the
    path later by an atomic rename (every ckptio save) does not change
    them; the mapping is unmapped when the last tensor goes, the reader is
    closed at once. The price, shared with safetensors' and
    torch.load(mmap=True)'s results: another program that truncates or
    rewrites the file in place (torch.save or safetensors.torch.save_file to
    the same path) while the tensors live makes reading them raise SIGBUS or
    see the new bytes. backend="pread" gives tensors in fresh memory,
    independent of the file (the large ones share one anonymous mapping in
    2 MiB pages, unmapped when the last of them goes; parallel reads,
    about half the mapping's speed from a warm cache). A cold file that
    fits in memory (at most half of what this process can still take:
    MemAvailable, or its memory cgroup's limit less its usage) is read
    through the page cache, as fast as by O_DIRECT here, and stays there,
    so the next load of it, a restarted process's too, reads memory; one
    that does not fit is read by O_DIRECT. backend="direct" is "pread"
    always by O_DIRECT, leaving the page cache as it was (a file read once,
    memory kept for other work). backend="auto" (the default): "mmap" when
    the page cache holds the file (nothing to read) or when it fits in
    memory (its pages filled in parallel, as fast as the O_DIRECT copy
    here, with no memory of its own, and kept for the next load;
    bench/RESULTS_PEERS.md), else a copy by O_DIRECT; the tensors are views
    or copies accordingly. mmap (keyword-only, deprecated: ckptio's
    spelling before 1.0, True is "mmap", False "pread") overrides backend
    when given, with a DeprecationWarning. Strided views and big-endian entries of .pt files, and
    misaligned tensors, are always copied. A sharded set maps each shard on
    its own (and "auto" decides shard by shard); a compressed file is
    always copied. The backend has no effect for a CUDA device.

    group (a torch.distributed process group, e.g. dist.group.WORLD, or
    one per node): a group load, collective over the group. Every rank
    gets every tensor, and each stored byte is read once for the group:
    ranks of one machine that opened one local file that fits in memory
    share its page cache, each loading as it would alone (backend as
    given); otherwise each byte is read by one rank and sent to the others
    over the group (into fresh memory on `device`; a gloo twin of a group
    of another backend); see load_boxes, whose staging_bytes, timeout and
    exchange it takes."""
    mapped = backend_choice(backend, deprecated_mmap(mmap, "ckptio.torch.load_file"))
    direct = backend == "direct"
    if group is not None:
        return _torch_group.named(filename, device, None, group, staging_bytes, timeout, exchange,
                                  lambda: _load_path(filename, device, mapped, direct))
    return _load_path(filename, device, mapped, direct)


def _load_path(filename: PathLike, device: Device, mapped: Optional[bool], direct: bool) -> Dict[str, torch.Tensor]:
    """load_file alone, its backend as Reader's mapped and direct."""
    with TorchReader(filename, device, mapped, direct=direct) as r:
        shards = r.shards() if r.mapped else []
        if not shards:
            return r.load(range(len(r.index())), mmap=r.mapped)
    # A sharded set, checked as a set on open: each shard loaded on its own.
    out: Dict[str, torch.Tensor] = {}
    for shard in shards:
        out.update(_load_path(shard, device, mapped, False))
    return out


def load_boxes(filename: PathLike, boxes: Mapping[str, Any], device: Device = "cpu", *,
               group: Optional[dist.ProcessGroup] = None, staging_bytes: Optional[int] = None,
               timeout: Optional[datetime.timedelta] = None, exchange: bool = False) -> Dict[str, torch.Tensor]:
    """Loads parts of tensors: boxes maps a tensor's name to None (the whole
    tensor) or to slices of its leading dimensions (a slice, or a tuple of
    them: start:stop, step 1), e.g. a tensor-parallel rank's share

        {"qkv.weight": (slice(None), slice(r * n, (r + 1) * n)),  # columns
         "out.weight": slice(r * m, (r + 1) * m),                  # rows
         "norm.weight": None}                                      # replicated

    and returns {name: a new contiguous tensor of the box} on `device`.

    With group (a torch.distributed process group: dist.group.WORLD, or one
    per node for node-local disks), the call is collective and each rank
    passes its own boxes (any mix, different per rank, none at all), and
    every stored tensor byte that any rank needs is read from storage once
    for the group, every CRC32 checked. Ranks on one machine that opened
    one local file that fits in memory share its page cache: each reads its
    boxes through it, the kernel reading each page once for all. Otherwise
    (several machines, s3:// objects, a file larger than memory, or
    exchange=True), each byte is read by one rank (the ranks take
    contiguous, byte-balanced spans of the file) and each rank receives
    exactly the bytes of its boxes over the group (gloo; a group of
    another backend gets a gloo twin, made once and collectively). Reads
    and the exchange overlap in rounds, each rank holding at most about
    staging_bytes (default 256 MiB; the smallest of the ranks' values)
    besides its tensors. A failure on any rank (a
    missing file or tensor, another checkpoint opened, a checksum
    mismatch, a read error) raises on every rank, naming the rank and the
    cause; a rank that died makes the others' collective fail after
    `timeout` (a datetime.timedelta; None: the group's own) instead of
    waiting. Without group, one process loads its boxes alone."""
    return _torch_group.named(filename, device, boxes, group, staging_bytes, timeout, exchange,
                              lambda: load_boxes(filename, boxes, device))


def load(data: bytes) -> Dict[str, torch.Tensor]:
    """Loads the tensors of a safetensors (or .pt) file held in `data`, as
    safetensors.torch.load: a dict of str -> CPU torch.Tensor, independent of
    `data` (CRC32s checked)."""
    with MemoryFile(data) as mem:
        return load_file(mem.path)


def load_model(model: torch.nn.Module, filename: PathLike, strict: bool = True,
               device: Device = "cpu", *, backend: str = "auto",
               in_place: bool = True, group: Optional[dist.ProcessGroup] = None,
               staging_bytes: Optional[int] = None,
               timeout: Optional[datetime.timedelta] = None) -> Tuple[List[str], List[str]]:
    """Loads a file written by save_model (or any file of the model's
    tensors) into `model`, as safetensors.torch.load_model: a name dropped by
    save_model because it shares storage with a saved one counts as loaded.
    Returns (missing, unexpected): the model's names the file did not set,
    the file's names the model lacks; with strict, either raises
    RuntimeError naming them (as torch's load_state_dict).

    With in_place (the default), a tensor of the file that matches its
    parameter or buffer (dtype, shape, contiguous, on the CPU or a GPU) is
    read straight into it, on the GPU without a stop in host memory: no
    second copy of the model is made, and nothing is copied twice. Tensors
    that share memory with another, modules that load their state their own
    way (a _load_from_state_dict of their own, load_state_dict pre-hooks)
    and everything that does not match go through a state dict loaded onto
    `device` and model.load_state_dict, as with in_place=False. Every CRC is
    checked either way, but in place the model's memory is written before
    the check: after an error (a checksum mismatch, a read that failed) the
    model may hold part of the file. in_place=False loads the whole file
    first and leaves the model untouched by a failed load, at the cost of a
    second copy of the model in memory; backend is that load's (in place,
    everything is read as backend="pread" reads it, or "direct" when asked).

    A model built on the meta device (torch.device("meta"), accelerate's
    init_empty_weights, transformers' low_cpu_mem_usage) is loaded for
    real: each parameter and persistent buffer on meta that the file holds
    (under its own name or a tied one's) is made on `device` with the
    model's shape and dtype (a file's other dtype is cast, as for a model
    built on the device) and then loaded as above; parameters stay
    nn.Parameter with their requires_grad, and tied weights (one Parameter
    at several names) stay one Parameter. A tensor the file lacks stays on
    meta and is missing (strict raises). Non-persistent buffers (e.g. a
    rotary embedding's inv_freq) are in no checkpoint, so a meta one stays
    on meta. Whatever is still on meta after the load is named in a
    UserWarning (the model cannot run until it is set: recompute it, or
    build the model with buffers off meta, as accelerate's
    init_empty_weights does by default). A load that raises puts every
    meta tensor back as it was: the model is never left half in
    uninitialised memory.

    group: a group load (collective; see load_file), each stored byte read
    once per group; the tensors that match their parameter in place are
    received straight into it, the rest go through load_state_dict (ranks
    sharing one machine's page cache load as they would alone)."""
    meta = _MetaTensors(model)
    try:
        result = _load_model(model, meta, filename, strict, device, backend, in_place, group, staging_bytes, timeout)
    except BaseException as e:
        add_note = getattr(e, "add_note", None)  # Python 3.11+
        if meta.restore() and add_note is not None:
            add_note(f"ckptio.torch.load_model: {type(model).__name__}'s meta tensors were put back on meta, "
                     "as before the call")
        raise
    meta.warn_left_on_meta(model)
    return result


def _load_model(model: torch.nn.Module, meta: "_MetaTensors", filename: PathLike, strict: bool, device: Device,
                backend: str, in_place: bool, group: Optional[dist.ProcessGroup], staging_bytes: Optional[int],
                timeout: Optional[datetime.timedelta]) -> Tuple[List[str], List[str]]:
    """load_model's load; meta: the model's meta tensors, made on the
    device once the file's names are known (and before the model's state
    dict is taken: in-place reads go into them)."""
    if group is not None:
        backend_choice(backend, None)
        return _load_model_group(model, meta, filename, strict, device, backend, in_place, group, staging_bytes,
                                 timeout)
    if not in_place:
        state = load_file(filename, device, backend=backend)
        meta.materialise(state, device)
        return _apply(model, model.state_dict(), state, set(state), {}, strict)
    backend_choice(backend, None)  # refuses an unknown one, as load_file does
    with TorchReader(filename, device, False, direct=backend == "direct") as r:
        r.index()
        meta.materialise(r.by_name, device)
        current = model.state_dict()
        targets = _in_place_targets(model, current, r)
        r.load_into({r.by_name[name]: t for name, t in targets.items()})
        state = r.load(i for i, e in enumerate(r.entries) if e.name.decode() not in targets)
        return _apply(model, current, state, set(r.by_name), targets, strict)


def _load_model_group(model: torch.nn.Module, meta: "_MetaTensors", filename: PathLike,
                      strict: bool, device: Device, backend: str, in_place: bool, group: dist.ProcessGroup,
                      staging_bytes: Optional[int], timeout: Optional[datetime.timedelta]
                      ) -> Tuple[List[str], List[str]]:
    """load_model with a group: one group load of every tensor of the file,
    into the model's tensors where they fit (in_place), else new ones."""
    targets: Dict[str, torch.Tensor] = {}
    names: List[str] = []
    current: Dict[str, torch.Tensor] = {}

    def boxes_of(r: TorchReader) -> List[_torch_group.Box]:
        meta.materialise(r.by_name, device)  # raising here fails every rank before a byte is read
        current.update(model.state_dict())
        targets.update(_in_place_targets(model, current, r) if in_place else {})
        names.extend(info.name.decode() for info in r.entries)
        return [(i, [0] * info.ndim, list(info.shape[:info.ndim]), targets.get(names[i]))
                for i, info in enumerate(r.entries)]

    shared, tensors = _torch_group.run(filename, device, boxes_of, group, staging_bytes, timeout)
    if shared:  # each rank as alone: the page cache is the group's
        return _load_model(model, meta, filename, strict, device, backend, in_place, None, None, None)
    bump = getattr(torch.autograd.graph, "increment_version", None) or torch._C._increment_version
    for t in targets.values():
        bump(t)
    state = {name: t for name, t in zip(names, tensors) if name not in targets}
    return _apply(model, current, state, set(names), targets, strict)


class _MetaTensors:
    """A model's parameters and persistent buffers on the meta device, by
    tensor: each with every place it is registered at (tied weights are one
    Parameter at several names). A meta tensor has a shape and a dtype but
    no memory, and load_state_dict's copy into one does nothing (torch only
    warns), so load_model replaces them with tensors on the device first."""

    def __init__(self, model: torch.nn.Module) -> None:
        # id -> (tensor, [(module's _parameters or _buffers, attribute, full name)])
        self.tensors: Dict[int, Tuple[torch.Tensor, List[Tuple[Dict[str, Any], str, str]]]] = {}
        self.replaced: List[Tuple[Dict[str, Any], str, torch.Tensor]] = []
        for prefix, m in model.named_modules(remove_duplicate=False):
            for table in (m._parameters, m._buffers):
                for n, t in table.items():
                    # Non-persistent buffers are in no state dict: nothing to load them from.
                    if t is None or not t.is_meta or (table is m._buffers and n in m._non_persistent_buffers_set):
                        continue
                    place = (table, n, f"{prefix}.{n}" if prefix else n)
                    self.tensors.setdefault(id(t), (t, []))[1].append(place)

    def materialise(self, names: Mapping[str, Any], device: Device) -> None:
        """Replaces each meta tensor that has a name in `names` (the file's)
        by an uninitialised one of its shape and dtype on `device`, the same
        new tensor at every place the old one was, so that ties hold."""
        if not self.tensors:
            return
        dev, _ = load_device(device)
        for key, (t, places) in list(self.tensors.items()):
            if not any(full in names for _, _, full in places):
                continue  # stays on meta: missing
            if type(t) not in (torch.Tensor, torch.nn.Parameter):
                raise TypeError(f"load_model cannot make {places[0][2]} ({type(t).__name__} on meta) on {dev}: "
                                "only plain tensors and nn.Parameter; materialise it first (e.g. model.to_empty)")
            new = torch.empty(t.shape, dtype=t.dtype, device=dev)
            if isinstance(t, torch.nn.Parameter):
                new = torch.nn.Parameter(new, requires_grad=t.requires_grad)
            for table, n, _ in places:
                self.replaced.append((table, n, t))
                table[n] = new
            del self.tensors[key]  # made once (a shared group load may load again, as alone)

    def restore(self) -> bool:
        """Puts the meta tensors back (after a failed load); whether any was
        replaced."""
        for table, n, t in reversed(self.replaced):
            table[n] = t
        done = bool(self.replaced)
        self.replaced.clear()
        return done

    @staticmethod
    def warn_left_on_meta(model: torch.nn.Module) -> None:
        """Warns, naming them, of the model's tensors still on meta after a
        load (not in the file, or non-persistent buffers): the model looks
        loaded but cannot run."""
        left = [name for name, t in list(model.named_parameters(remove_duplicate=False))
                + list(model.named_buffers(remove_duplicate=False)) if t.is_meta]
        if left:
            shown = ", ".join(left[:8]) + (f" and {len(left) - 8} more" if len(left) > 8 else "")
            warnings.warn(f"ckptio.torch.load_model: {len(left)} tensor(s) of {type(model).__name__} are still on "
                          f"the meta device, with no values: {shown}. The file does not hold them "
                          "(non-persistent buffers, such as a rotary embedding's inv_freq, are in no "
                          "checkpoint); set them before using the model (recompute them on the device, or "
                          "build the model with buffers off meta, as accelerate's init_empty_weights does "
                          "by default)", UserWarning, stacklevel=3)


def _apply(model: torch.nn.Module, current: Mapping[str, torch.Tensor], state: Dict[str, torch.Tensor],
           names: Set[str], loaded: Mapping[str, torch.Tensor], strict: bool) -> Tuple[List[str], List[str]]:
    """load_model's end: state (the file's tensors not loaded in place)
    into the model, and its (missing, unexpected). current: the model's
    state dict; names: every tensor of the file; loaded: those read in
    place already."""
    shared = _shared_groups(current)
    result = model.load_state_dict(state, strict=False)
    missing: Set[str] = set(result.missing_keys) - set(loaded)
    unexpected: List[str] = list(result.unexpected_keys)
    for group in shared:
        if any(name in names for name in group):
            missing.difference_update(group)
    if strict and (missing or unexpected):
        error = f"Error(s) in loading state_dict for {type(model).__name__}:"
        if missing:
            error += "\n    Missing key(s) in state_dict: " + ", ".join(
                f'"{k}"' for k in sorted(missing))
        if unexpected:
            error += "\n    Unexpected key(s) in state_dict: " + ", ".join(
                f'"{k}"' for k in sorted(unexpected))
        raise RuntimeError(error)
    return sorted(missing), unexpected


def _in_place_targets(model: torch.nn.Module, current: Mapping[str, torch.Tensor],
                      r: TorchReader) -> Dict[str, torch.Tensor]:
    """The model's state tensors that load_model reads the file straight
    into, by name: those of modules that load their state as nn.Module
    does, that match the file's tensor of that name, and that share no
    memory with another tensor of current, the model's state dict (tied
    weights are written once, by load_state_dict, as torch does)."""
    modules = list(model.named_modules(remove_duplicate=False))
    if any(m._load_state_dict_pre_hooks for _, m in modules):
        return {}  # a hook may rename or change any name's tensor
    own = torch.nn.Module._load_from_state_dict
    candidates: Dict[str, torch.Tensor] = {}
    for prefix, m in modules:
        if type(m)._load_from_state_dict is not own:
            continue
        persistent = [(n, b) for n, b in m._buffers.items() if n not in m._non_persistent_buffers_set]
        for n, t in list(m._parameters.items()) + persistent:
            name = f"{prefix}.{n}" if prefix else n
            i = r.by_name.get(name)
            # Plain tensors only: a subclass (DTensor, a quantized wrapper)
            # may hold other bytes than its shape says at data_ptr().
            plain = type(t) in (torch.Tensor, torch.nn.Parameter)
            if plain and i is not None and t.nelement() and r.fits_in_place(i, t):
                candidates[name] = t.detach()
    # Whatever overlaps another state tensor in memory is left out.
    shared = {name for group in overlapping(current.items()) for name in group}
    return {name: t for name, t in candidates.items() if name not in shared}


class safe_open(OpenReader[TorchReader]):
    """A checkpoint opened for lazy access, like safetensors.safe_open:

        with ckptio.torch.safe_open("m.safetensors", framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)   # loaded (and CRC-checked) on demand

    framework must be "pt" (or "torch"); it defaults to "pt" (safetensors
    requires it). device as load_file's; backend is get_tensors'.
    get_slice(name) reads parts of a tensor (one dimension's start:stop; see
    ckptio/torch_slice.py)."""

    def __init__(self, filename: PathLike, framework: str = "pt", device: Device = "cpu", *,
                 backend: str = "auto") -> None:
        check_framework(framework, "pt", device)
        self._mmap = backend_choice(backend, None)
        r = TorchReader(filename, device, direct=backend == "direct")
        try:
            r.index()
        except BaseException:
            r.close()
            raise
        self._r = r
        # A stream's windows reuse their mappings once their tensors are gone.
        self._arenas = arenas = _placer.Arenas()
        self._ahead = ReadAhead(lambda indices: r.load(indices, arenas=arenas), [e.name.decode() for e in r.entries])
        self._makeable: Optional[List[Optional[int]]] = None

    def _index(self, name: str) -> int:
        r = self._reader(settle=False)
        i = r.by_name.get(name)
        if i is None:
            raise from_code(_lib.ERRORS["NOT_FOUND"], f"{r.shown}: no tensor named {name!r}")
        return i

    def keys(self) -> List[str]:
        """Tensor names, sorted (as safetensors returns them)."""
        return sorted(self._reader(settle=False).by_name)

    def offset_keys(self) -> List[str]:
        """Tensor names in file order."""
        return [info.name.decode() for info in self._reader(settle=False).entries]

    def format(self) -> str:
        """"safetensors", "pytorch", or "safetensors-sharded" (an index or
        a directory of shards)."""
        return self._reader().format()

    def get_tensor(self, name: str) -> torch.Tensor:
        """Loads one tensor (CRC-checked) into a new tensor on the device;
        TensorNotFoundError (a KeyError) when the file has none of that name.
        From a cold file, the tensors after it are read with it (up to 256
        MiB, and the next 256 MiB in the background while they are asked
        for in file order or in keys() order: ckptio._core.ReadAhead)."""
        i = self._index(name)
        r = self._reader(settle=False)
        if self._makeable is None:  # what a window passes over: dtypes torch lacks
            self._makeable = [info.nbytes if torch_layout(r.dtype_name(info), tuple(info.shape[:info.ndim]))
                              is not None else None for info in r.entries]
        tensor: torch.Tensor = self._read_ahead(name, i, self._makeable)
        return tensor

    def get_tensors(self) -> Dict[str, torch.Tensor]:
        """Every tensor, in file order, CRC-checked: as load_file with this
        file's device and backend (on the CPU with "mmap", or "auto" and a
        resident file, views of one mapping of a single file)."""
        r = self._reader()
        return r.load(range(len(r.entries)), mmap=r.maps(self._mmap))

    def stats(self) -> Optional[Dict[str, Any]]:
        """Stage timings of the last get_tensor (ckptio_reader_stats) as a
        dict: bytes, seconds (wall), copy_seconds / device_seconds (busy,
        summed over the workers), threads, staging_bytes."""
        r = self._reader()
        return _lib.Stats.read(r.lib.ckptio_reader_stats, r.handle)

    def get_slice(self, name: str) -> TorchSlice:
        """A TorchSlice of the tensor (ckptio/torch_slice.py): get_shape(),
        get_dtype(), and [...] reading only one dimension's start:stop."""
        return TorchSlice(self._reader(), self._index(name))
