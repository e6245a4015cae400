"""Nested training checkpoints (ckptio.torch.save_checkpoint and
load_checkpoint): any state made of containers, scalars and tensors, as
torch.save writes it, saved by the library at the disk's speed and loaded
without running anything but torch's and numpy's own rebuild functions.

Two formats:
- "pt": torch.save's archive. The object is pickled here as torch.save
  pickles it (protocol 2, each storage once by persistent id, views as
  views), and the library writes data.pkl and the storages (from the GPU
  when they are there), checks the pickle on its safe reader first, adds
  CRCs and commits atomically. Loads open the archive as its records
  (CKPTIO_OPEN_TORCH_RECORDS: every check of a plain open), read the
  storages the wanted part of the object needs, and unpickle data.pkl
  with a closed allowlist of globals (torch.load(weights_only=True)'s,
  plus numpy arrays and scalars).
- "safetensors": every tensor under its path in the object ("model.w",
  "optim.state.0.exp_avg"), and the rest of the structure as JSON in the
  metadata key STRUCTURE_KEY (docs/FORMATS.md), so any safetensors reader
  still gets every tensor.
"""

from __future__ import annotations

import base64
import codecs
import collections
import io
import json
import math
import os
import pickle
import warnings
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Set, Tuple, Union

import numpy as np
import torch

from . import _lib
from ._core import PathLike
from ._torch_io import SaveHandle, TorchReader, plan
from ._torch_io import start as start_writer
from .errors import from_code

STRUCTURE_KEY = "checkpoint.structure"
STRUCTURE_VERSION = 1
# Deeper than this is refused on save: ckptio's pickle reader takes 128
# nested MARKs, and no training state nests like that.
MAX_DEPTH = 100
# Loads take what torch.save can write (Python's recursion limit).
LOAD_MAX_DEPTH = 1000

MapLocation = Union[None, str, torch.device, int, Mapping[str, Any]]
Select = Union[None, Any, Tuple[Any, ...]]


# --------------------------------------------------------------- the check

_SCALARS = (type(None), bool, int, float, str, bytes, torch.dtype, torch.device)


def _component(key: Any) -> str:
    return f".{key}" if isinstance(key, str) else f"[{key!r}]"


def _shown(path: str) -> str:
    return path.lstrip(".") or "the object"


_DICTS = (dict, collections.OrderedDict, collections.Counter)
_SEQUENCES = (list, tuple, set, torch.Size)


def walk(obj: Any, max_depth: int) -> Iterator[Tuple[Any, str]]:
    """Every value in obj with its path ("optim.param_groups[0].lr"), dict
    keys included, depth first. ValueError for a container inside itself or
    containers nested deeper than max_depth. Iterative: a hostile depth
    cannot exhaust the stack."""
    stack: List[Tuple[Any, str, int, bool]] = [(obj, "", 0, False)]
    open_ids: Set[int] = set()  # containers on the current path
    while stack:
        value, path, depth, leaving = stack.pop()
        if leaving:
            open_ids.discard(id(value))
            continue
        yield value, path
        if type(value) not in _DICTS and type(value) not in _SEQUENCES:
            continue
        if depth >= max_depth:
            raise ValueError(f"{_shown(path)}: containers nested deeper than {max_depth} levels")
        if id(value) in open_ids:
            raise ValueError(f"{_shown(path)}: a container that contains itself")
        open_ids.add(id(value))
        stack.append((value, path, depth, True))
        if type(value) in _DICTS:
            items = [(k, v) for k, v in value.items()]
            stack.extend((k, path, depth + 1, False) for k, _ in reversed(items))
        else:
            items = list(enumerate(value))
        stack.extend((v, path + _component(k), depth + 1, False) for k, v in reversed(items))


def check_structure(obj: Any) -> None:
    """Refuses (TypeError, ValueError) what save_checkpoint cannot write,
    naming its path in the object ("optim.param_groups[0].foo"): a type
    outside the allowlist, a container inside itself, nesting deeper than
    MAX_DEPTH."""
    for value, path in walk(obj, MAX_DEPTH):
        if isinstance(value, torch.Tensor):
            _check_tensor(value, path)
        elif isinstance(value, (np.ndarray, np.generic)):
            if value.dtype.hasobject:
                raise TypeError(f"{_shown(path)}: a numpy array of Python objects cannot be saved")
        elif type(value) not in _SCALARS and type(value) not in (dict, collections.OrderedDict, list,
                                                                 tuple, set, torch.Size):
            raise TypeError(f"{_shown(path)}: a {type(value).__module__}.{type(value).__qualname__} "
                            "cannot be saved; a checkpoint holds dicts, lists, tuples, sets, str, int, "
                            "float, bool, None, bytes, torch.Size/dtype/device, tensors and numpy arrays")


def _check_tensor(t: torch.Tensor, path: str) -> None:
    if type(t) not in (torch.Tensor, torch.nn.Parameter):
        raise TypeError(f"{_shown(path)}: a tensor subclass {type(t).__name__} cannot be saved")
    if t.layout != torch.strided or t.is_quantized or t.is_nested:
        raise TypeError(f"{_shown(path)}: {t.layout} / quantized / nested tensors cannot be saved")
    if t.device.type not in ("cpu", "cuda"):
        raise TypeError(f"{_shown(path)}: a tensor on {t.device} cannot be saved (cpu or cuda)")


# ---------------------------------------------------------------- .pt save

class _Pickler(pickle.Pickler):
    """torch.save's pickling: each storage once, by persistent id
    ('storage', class, key, location, numel), its bytes kept aside."""

    def __init__(self, buf: io.BytesIO) -> None:
        super().__init__(buf, protocol=2)
        self.storages: List[torch.Tensor] = []  # key i: the storage's bytes as a flat uint8 tensor
        self.keys: Dict[int, str] = {}
        self.dtypes: Dict[int, torch.dtype] = {}

    def persistent_id(self, obj: Any) -> Optional[Tuple[Any, ...]]:
        if isinstance(obj, torch.storage.TypedStorage):
            typed: Any = obj  # torch leaves these private calls untyped
            storage, dtype = typed._untyped_storage, typed.dtype
            cls: Any = getattr(torch, typed._pickle_storage_type())
            numel = typed._size()
        elif isinstance(obj, torch.UntypedStorage):
            storage, dtype, cls, numel = obj, torch.uint8, torch.UntypedStorage, obj.nbytes()
        else:
            return None
        if storage.device.type == "meta" or (storage.data_ptr() == 0 and storage.nbytes()):
            raise TypeError("a meta tensor has no data to save; materialise it first")
        ptr = storage.data_ptr()
        if ptr and self.dtypes.setdefault(ptr, dtype) != dtype:
            raise TypeError("two tensors view the same storage as different dtypes "
                            f"({self.dtypes[ptr]} and {dtype}); torch.save refuses it too")
        key = self.keys.get(storage._cdata)
        if key is None:
            key = self.keys[storage._cdata] = str(len(self.storages))
            flat = torch.empty(0, dtype=torch.uint8, device=storage.device)
            flat.set_(storage, 0, (storage.nbytes(),), (1,))
            self.storages.append(flat)
        location = "cpu" if storage.device.type == "cpu" else str(storage.device)
        return ("storage", cls, key, location, numel)


def _pickle_pt(obj: Any) -> Tuple[bytes, List[torch.Tensor]]:
    buf = io.BytesIO()
    p = _Pickler(buf)
    p.dump(obj)
    return buf.getvalue(), p.storages


def _start_pt(obj: Any, path: PathLike, crc: bool) -> SaveHandle:
    data_pkl, storages = _pickle_pt(obj)
    lib = _lib.lib()
    return start_writer(lib.ckptio_writer_open, path, crc, (_lib.format_code("pt"),),
                        plan({str(i): s for i, s in enumerate(storages)}, None),
                        lambda w: int(lib.ckptio_writer_set_torch_pickle(w, data_pkl, len(data_pkl))))


# ------------------------------------------------------- safetensors save

class _Flattener:
    """The structure as tagged JSON, each tensor (and numpy array) replaced
    by the name it is saved under: its path, dots between the parts. A
    tensor met twice (tied weights: one object, or one storage seen the same
    way) is saved once and named again."""

    def __init__(self) -> None:
        self.tensors: Dict[str, torch.Tensor] = {}
        self.seen: Dict[Tuple[Any, ...], str] = {}

    def name_for(self, path: List[str]) -> str:
        base = ".".join(path) or "tensor"
        name, k = base, 1
        while name in self.tensors:
            name, k = f"{base}~{k}", k + 1
        return name

    def tensor(self, t: torch.Tensor, path: List[str]) -> Dict[str, Any]:
        ptr = t.untyped_storage().data_ptr()
        key = (t.device, ptr, t.storage_offset(), tuple(t.shape), t.stride(), t.dtype) if ptr else ("object", id(t))
        name = self.seen.get(key)
        if name is None:
            name = self.seen[key] = self.name_for(path)
            self.tensors[name] = t.detach()
        out: Dict[str, Any] = {"tensor": name}
        if t.device.type != "cpu":
            out["device"] = str(t.device)
        if type(t) is torch.nn.Parameter:
            out["parameter"] = bool(t.requires_grad)
        elif t.requires_grad:
            out["requires_grad"] = True
        return out

    def encode(self, v: Any, path: List[str]) -> Any:
        if v is None or type(v) in (bool, int, str):
            return v
        if type(v) is float:
            return v if math.isfinite(v) else {"float": repr(v)}
        if isinstance(v, torch.Tensor):
            return self.tensor(v, path)
        if isinstance(v, np.ndarray):
            out = self.tensor(torch.from_numpy(np.ascontiguousarray(v)), path)
            return {"ndarray": out["tensor"], "dtype": v.dtype.str}
        if isinstance(v, np.generic):
            return {"npscalar": v.dtype.str, "bytes": base64.b64encode(v.tobytes()).decode()}
        t = type(v)
        if t is bytes:
            return {"bytes": base64.b64encode(v).decode()}
        if t is torch.Size:
            return {"size": list(v)}
        if t is torch.dtype:
            return {"dtype": str(v).replace("torch.", "")}
        if t is torch.device:
            return {"device": str(v)}
        if t is list:
            return [self.encode(x, path + [str(i)]) for i, x in enumerate(v)]
        if t is tuple:
            return {"tuple": [self.encode(x, path + [str(i)]) for i, x in enumerate(v)]}
        if t is set:
            return {"set": [self.encode(x, path) for x in v]}
        tag = "odict" if t is collections.OrderedDict else "dict"
        return {tag: [[self.encode(k, path), self.encode(x, path + [str(k)])] for k, x in v.items()]}


def _start_safetensors(obj: Any, path: PathLike, crc: bool) -> SaveHandle:
    f = _Flattener()
    structure = {"version": STRUCTURE_VERSION, "root": f.encode(obj, [])}
    meta = {STRUCTURE_KEY: json.dumps(structure, separators=(",", ":"), allow_nan=False)}
    return start_writer(_lib.lib().ckptio_writer_open, path, crc, (_lib.format_code("safetensors"),),
                        plan(f.tensors, meta))


def format_of(path: PathLike, format: Optional[str]) -> str:
    if format is None:
        return "safetensors" if os.fsdecode(os.fspath(path)).endswith(".safetensors") else "pt"
    if format not in ("pt", "safetensors"):
        raise ValueError(f"format must be 'pt' or 'safetensors', got {format!r}")
    return format


def start(obj: Any, path: PathLike, format: Optional[str], crc: bool) -> SaveHandle:
    """Checks obj whole, then starts its save (a SaveHandle)."""
    check_structure(obj)
    if format_of(path, format) == "pt":
        return _start_pt(obj, path, crc)
    return _start_safetensors(obj, path, crc)


# ------------------------------------------------------------------- load

def _target(map_location: MapLocation, location: str) -> torch.device:
    """Where a storage saved at `location` goes, as torch.load's map_location."""
    if map_location is None:
        return torch.device(location)
    if isinstance(map_location, Mapping):
        return torch.device(map_location.get(location, location))
    if isinstance(map_location, (str, torch.device, int)):
        return torch.device("cuda", map_location) if isinstance(map_location, int) else torch.device(map_location)
    raise TypeError("map_location must be None, a device (str, torch.device, int) or a dict of "
                    f"location -> device, got {type(map_location).__name__}")


def _select(obj: Any, select: Select, shown: str) -> Any:
    if select is None:
        return obj
    for key in select if isinstance(select, tuple) else (select,):
        try:
            obj = obj[key]
        except (KeyError, IndexError, TypeError):
            raise KeyError(f"{shown}: the checkpoint has no {key!r} where select={select!r} leads") from None
    return obj


def _latin1(text: str, encoding: str = "latin1") -> bytes:
    """_codecs.encode as protocol 2 uses it (bytes spelled as latin-1 text),
    and no other codec."""
    if not isinstance(text, str) or codecs.lookup(encoding).name != "iso8859-1":
        raise pickle.UnpicklingError(f"_codecs.encode with {encoding!r}: only latin1 spells bytes")
    return codecs.encode(text, "latin1")


# Globals a checkpoint's data.pkl may name: torch.load(weights_only=True)'s
# allowlist as ckptio's C reader has it, plus numpy arrays and scalars. No
# other global is looked up.
def _allowed_globals() -> Dict[Tuple[str, str], Any]:
    import torch._utils as tu
    allowed: Dict[Tuple[str, str], Any] = {
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("collections", "Counter"): collections.Counter,
        ("torch._utils", "_rebuild_tensor"): tu._rebuild_tensor,
        ("torch._utils", "_rebuild_tensor_v2"): tu._rebuild_tensor_v2,
        ("torch._utils", "_rebuild_tensor_v3"): tu._rebuild_tensor_v3,
        ("torch._utils", "_rebuild_parameter"): tu._rebuild_parameter,
        ("torch._utils", "_rebuild_parameter_with_state"): tu._rebuild_parameter_with_state,
        ("torch", "Size"): torch.Size,
        ("torch", "device"): torch.device,
        ("torch", "UntypedStorage"): torch.UntypedStorage,
        ("torch.storage", "UntypedStorage"): torch.UntypedStorage,
        ("_codecs", "encode"): _latin1,
        ("builtins", "set"): set,
        ("builtins", "bytearray"): bytearray,
        ("builtins", "complex"): complex,
    }
    with warnings.catch_warnings():  # the legacy storage classes warn when touched
        warnings.simplefilter("ignore")
        for name in dir(torch):
            value = getattr(torch, name, None)
            if isinstance(value, torch.dtype) or (name.endswith("Storage") and isinstance(value, type)
                                                  and issubclass(value, torch.storage._LegacyStorage)):
                allowed[("torch", name)] = value
    multiarray: Any = np._core.multiarray if hasattr(np, "_core") else getattr(np, "core").multiarray
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):
        allowed[(module, "_reconstruct")] = multiarray._reconstruct
        allowed[(module, "scalar")] = multiarray.scalar
    allowed[("numpy", "ndarray")] = np.ndarray
    allowed[("numpy", "dtype")] = np.dtype
    return allowed


_ALLOWED: Optional[Dict[Tuple[str, str], Any]] = None


class _Unpickler(pickle.Unpickler):
    """data.pkl under the allowlist; storages from `storage(key, dtype,
    location, numel)`."""

    def __init__(self, data: bytes, storage: Callable[[str, torch.dtype, str, int], Any], shown: str) -> None:
        super().__init__(io.BytesIO(data))
        self.storage = storage
        self.shown = shown
        self.cache: Dict[str, Any] = {}

    def find_class(self, module: str, name: str) -> Any:
        global _ALLOWED
        if _ALLOWED is None:
            _ALLOWED = _allowed_globals()
        # Protocol 2 spells builtins as Python 2 did (torch.save's pickles too).
        found = _ALLOWED.get(("builtins" if module == "__builtin__" else module, name))
        if found is None:
            raise from_code(_lib.ERRORS["PICKLE"], f"{self.shown}: the pickle uses the global "
                            f"{module}.{name}, which is not allowed (torch.load(weights_only=True)'s "
                            "allowlist, and numpy arrays)")
        return found

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise from_code(_lib.ERRORS["PICKLE"], f"{self.shown}: a persistent id that is not a storage")
        _, cls, key, location, numel = pid
        if cls is torch.UntypedStorage:
            dtype = torch.uint8
        else:
            with warnings.catch_warnings():  # a legacy storage class warns when asked its dtype
                warnings.simplefilter("ignore")
                dtype = cls.dtype
        if key not in self.cache:
            self.cache[key] = self.storage(key, dtype, location, numel)
        return self.cache[key]


class _Storage:
    """torch's storage constructors, which its stubs leave untyped."""
    untyped: Any = torch.UntypedStorage
    typed: Any = torch.storage.TypedStorage


def _load_named(path: PathLike, r: TorchReader, wanted: Mapping[str, torch.device],
                shown: str) -> Dict[str, torch.Tensor]:
    """The entries `wanted` (name -> device), each device's in one load: on
    r's device through r, elsewhere through another reader of the file."""
    r.index()
    missing = [n for n in wanted if n not in r.by_name]
    if missing:
        raise from_code(_lib.ERRORS["NOT_FOUND"], f"{shown}: the checkpoint names {missing[0]!r}, "
                        "which the file does not hold")
    got: Dict[str, torch.Tensor] = {}
    for device in dict.fromkeys(wanted.values()):
        names = [n for n, d in wanted.items() if d == device]
        if device == r.device:
            got.update(r.load([r.by_name[n] for n in names], mmap=r.mapped))
            continue
        with TorchReader(path, device, open_flags=r.open_flags) as other:
            other.index()
            got.update(other.load([other.by_name[n] for n in names]))
    return got


def _load_pt(path: PathLike, r: TorchReader, map_location: MapLocation, select: Select, shown: str) -> Any:
    data = _load_named(path, r, {"data.pkl": r.device}, shown)["data.pkl"].cpu().numpy().tobytes()
    # First pass: every storage a meta one, to learn which the wanted part uses.
    where: Dict[str, Tuple[torch.dtype, str]] = {}
    by_cdata: Dict[int, str] = {}

    def meta_storage(key: str, dtype: torch.dtype, location: str, numel: int) -> Any:
        where[key] = (dtype, location)
        s = _Storage.untyped(numel * torch.empty((), dtype=dtype).element_size(), device="meta")
        by_cdata[s._cdata] = key
        return _Storage.typed(wrap_storage=s, dtype=dtype, _internal=True)

    part = _select(_checked(_Unpickler(data, meta_storage, shown).load(), shown), select, shown)
    keys = ({by_cdata[v.untyped_storage()._cdata] for v, _ in walk(part, LOAD_MAX_DEPTH)
             if isinstance(v, torch.Tensor)} if select is not None else set(where))
    flat = _load_named(path, r, {f"data/{k}": _target(map_location, where[k][1]) for k in sorted(keys)},
                       shown)

    def real_storage(key: str, dtype: torch.dtype, location: str, numel: int) -> Any:
        u8 = flat.get(f"data/{key}")
        if u8 is None:  # outside the selected part: never returned
            return meta_storage(key, dtype, location, numel)
        return _Storage.typed(wrap_storage=u8.untyped_storage(), dtype=dtype, _internal=True)

    return _select(_Unpickler(data, real_storage, shown).load(), select, shown)


def _checked(obj: Any, shown: str) -> Any:
    """A loaded object no deeper than LOAD_MAX_DEPTH and without a
    container inside itself (what a pickle can build and torch.save cannot
    write), so that walking it cannot loop or exhaust the stack."""
    try:
        for _ in walk(obj, LOAD_MAX_DEPTH):
            pass
    except ValueError as e:
        raise from_code(_lib.ERRORS["PICKLE"], f"{shown}: data.pkl builds {e}") from None
    return obj


class _Rebuilder:
    """A safetensors checkpoint's structure back into objects."""

    def __init__(self, tensors: Callable[[str, Optional[str]], torch.Tensor], shown: str) -> None:
        self.tensors = tensors
        self.shown = shown

    def bad(self, why: str) -> Exception:
        return from_code(_lib.ERRORS["HEADER_JSON"], f"{self.shown}: {STRUCTURE_KEY}: {why}")

    def decode(self, v: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise self.bad(f"nested deeper than {MAX_DEPTH} levels")
        if v is None or type(v) in (bool, int, float, str):
            return v
        if type(v) is list:
            return [self.decode(x, depth + 1) for x in v]
        if type(v) is not dict or len(v) == 0:
            raise self.bad(f"a value of type {type(v).__name__}")
        if "tensor" in v:
            t = self.tensors(v["tensor"], v.get("device"))
            if "parameter" in v:
                return torch.nn.Parameter(t, requires_grad=bool(v["parameter"]))
            return t.requires_grad_() if v.get("requires_grad") else t
        if "ndarray" in v:
            return self.tensors(v["ndarray"], None).numpy().view(np.dtype(v["dtype"]))
        (tag, x), = v.items()
        if tag in ("dict", "odict"):
            out = {} if tag == "dict" else collections.OrderedDict()
            for pair in x:
                if type(pair) is not list or len(pair) != 2:
                    raise self.bad("a dict item that is not a [key, value] pair")
                out[self.decode(pair[0], depth + 1)] = self.decode(pair[1], depth + 1)
            return out
        if tag == "tuple":
            return tuple(self.decode(i, depth + 1) for i in x)
        if tag == "set":
            return {self.decode(i, depth + 1) for i in x}
        if tag == "float":
            return float(x)
        if tag == "bytes":
            return base64.b64decode(x)
        if tag == "npscalar":
            return np.frombuffer(base64.b64decode(v["bytes"]), dtype=np.dtype(x))[0]
        if tag == "size":
            return torch.Size(x)
        if tag == "dtype":
            dtype = getattr(torch, x, None)
            if not isinstance(dtype, torch.dtype):
                raise self.bad(f"no torch dtype {x!r}")
            return dtype
        if tag == "device":
            return torch.device(x)
        raise self.bad(f"an unknown tag {tag!r}")


def _load_safetensors(path: PathLike, r: TorchReader, structure: str, map_location: MapLocation,
                      select: Select, shown: str) -> Any:
    try:
        doc = json.loads(structure)
    except ValueError as e:
        raise from_code(_lib.ERRORS["HEADER_JSON"], f"{shown}: {STRUCTURE_KEY} is not JSON: {e}") from None
    if type(doc) is not dict or doc.get("version") != STRUCTURE_VERSION or "root" not in doc:
        raise from_code(_lib.ERRORS["HEADER_JSON"], f"{shown}: {STRUCTURE_KEY} is not version "
                        f"{STRUCTURE_VERSION} of ckptio's checkpoint structure")
    root = _select_json(doc["root"], select, shown)
    wanted: Dict[str, torch.device] = {}

    def note(name: str, device: Optional[str]) -> torch.Tensor:
        wanted[name] = _target(map_location, device or "cpu")
        return torch.empty(0)

    _Rebuilder(note, shown).decode(root)
    got = _load_named(path, r, wanted, shown)
    return _Rebuilder(lambda name, _: got[name], shown).decode(root)


def _select_json(root: Any, select: Select, shown: str) -> Any:
    if select is None:
        return root
    for key in select if isinstance(select, tuple) else (select,):
        node = None
        if type(root) is dict and len(root) == 1:
            (tag, items), = root.items()
            if tag in ("dict", "odict"):
                node = next((v for k, v in items if k == key), None)
            elif tag == "tuple" and type(key) is int and -len(items) <= key < len(items):
                node = items[key]
        elif type(root) is list and type(key) is int and -len(root) <= key < len(root):
            node = root[key]
        if node is None:
            raise KeyError(f"{shown}: the checkpoint has no {key!r} where select={select!r} leads")
        root = node
    return root


def load(path: PathLike, map_location: MapLocation, select: Select, mmap: Optional[bool]) -> Any:
    """ckptio.torch.load_checkpoint's body."""
    shown = os.fsdecode(os.fsencode(os.fspath(path)))
    first = torch.device("cpu") if isinstance(map_location, Mapping) else _target(map_location, "cpu")
    if select is not None and mmap is None:
        mmap = False  # a mapping is checked whole: a selected part is read alone
    with TorchReader(path, first, mmap=mmap if first.type == "cpu" else False,
                     open_flags=_lib.OPEN_TORCH_RECORDS) as r:
        if r.format() == "pytorch":
            return _load_pt(path, r, map_location, select, shown)
        structure = r.metadata().get(STRUCTURE_KEY)
        if structure is not None:
            return _load_safetensors(path, r, structure, map_location, select, shown)
        r.index()
        return _select(r.load(range(len(r.entries)), mmap=r.mapped), select, shown)
