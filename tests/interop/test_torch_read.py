"""ckptio's PyTorch reader against the real torch: files torch.save writes (every
dtype, views sharing storages, nested checkpoints, other archive names, big-endian
records, no-CRC mode) are indexed by ckptio_torch_parse exactly as torch sees them,
and what torch's own weights_only loader refuses (hostile pickles, legacy files,
TorchScript, protocol 4) ckptio refuses too, with a message naming it.

The C side is tests/interop/torch_dump.c (prints the index as JSON). Give its
path in CKPTIO_TORCH_DUMP, or let this test build it from CKPTIO_STATIC_LIB (the
static libckptio.a; default build/libckptio.a). Without torch this exits 77,
loudly: it is a skip, never a pass."""

import io
import json
import os
import pathlib
import pickle
import shutil
import subprocess
import sys
import zipfile
import zlib

import pytest

try:
    import numpy as np
    import torch
except Exception as e:  # noqa: BLE001 - any import failure means: cannot run here
    print(f"SKIP test_torch_read: the real torch (and numpy) cannot be imported: {e!r}",
          file=sys.stderr)
    pytest.exit(f"SKIP test_torch_read: torch cannot be imported ({e!r})", returncode=77)

ROOT = pathlib.Path(__file__).resolve().parents[2]

# torch dtype -> ckptio dtype name, for every dtype ckptio can hold.
DTYPES = {
    torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL", torch.complex64: "C64",
    torch.float8_e5m2: "F8_E5M2", torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2fnuz: "F8_E5M2FNUZ", torch.float8_e4m3fnuz: "F8_E4M3FNUZ",
    torch.uint16: "U16", torch.uint32: "U32", torch.uint64: "U64",
}
if hasattr(torch, "float8_e8m0fnu"):
    DTYPES[torch.float8_e8m0fnu] = "F8_E8M0"


# ------------------------------------------------------------ the C side

@pytest.fixture(scope="session")
def dump_bin(tmp_path_factory):
    given = os.environ.get("CKPTIO_TORCH_DUMP")
    if given:
        return given
    lib = pathlib.Path(os.environ.get("CKPTIO_STATIC_LIB", ROOT / "build" / "libckptio.a"))
    if not lib.exists():
        pytest.fail(f"no {lib}: build ckptio_static or set CKPTIO_TORCH_DUMP / CKPTIO_STATIC_LIB")
    out = tmp_path_factory.mktemp("bin") / "torch_dump"
    libs = subprocess.run(["pkg-config", "--libs", "libisal", "hwloc"], check=True,
                          capture_output=True, text=True).stdout.split()
    cc = os.environ.get("CC", "cc")
    cmd = [cc, "-std=gnu11", "-O1", "-I", str(ROOT / "include"), "-I", str(ROOT / "src"),
           str(ROOT / "tests/interop/torch_dump.c"), str(lib), *libs, "-lpthread", "-ldl", "-lm",
           "-o", str(out)]
    if "asan" in str(lib):
        cmd[1:1] = ["-fsanitize=address,undefined"]
    subprocess.run(cmd, check=True)
    return str(out)


def dump(dump_bin, path):
    r = subprocess.run([dump_bin, str(path)], capture_output=True, text=True)
    assert r.returncode in (0, 1), f"torch_dump crashed ({r.returncode}): {r.stderr}"
    out = json.loads(r.stdout)
    assert out["ok"] == (r.returncode == 0)
    return out


def ok(dump_bin, path):
    out = dump(dump_bin, path)
    assert out["ok"], out
    return out


def refused(dump_bin, path, code_name, needle):
    out = dump(dump_bin, path)
    assert not out["ok"], f"ckptio accepted {path}"
    assert out["code_name"] == code_name, out
    assert needle in out["error"], out["error"]
    return out["error"]


def torch_refuses(path):
    with pytest.raises(Exception):
        torch.load(path, weights_only=True)


# ------------------------------------------------------------ comparing

def raw(t):
    """The bytes of a tensor in row-major order, as torch holds them."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def flatten(obj, prefix=""):
    """torch's loaded object flattened the way ckptio names things: dict keys
    and list indices joined with '.'; tensors and scalar leaves."""
    tensors, meta = {}, {}

    def walk(v, path):
        if isinstance(v, torch.Tensor):
            tensors[path] = v
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(x, f"{path}.{k}" if path else str(k))
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                walk(x, f"{path}.{i}" if path else str(i))
        elif isinstance(v, bool) or v is None or isinstance(v, int):
            meta[path] = str(v)
        elif isinstance(v, float):
            meta[path] = repr(v)
        elif isinstance(v, str):
            meta[path] = v
    walk(obj, prefix)
    return tensors, meta


def check_against_torch(dump_bin, path, expect_byteswap=False, truth=None):
    """Every tensor torch.load sees (or `truth` holds) is in the index with its
    dtype and shape; the index's bytes are the tensor's; scalars are the
    metadata."""
    idx = ok(dump_bin, path)
    loaded = truth if truth is not None else torch.load(path, weights_only=True)
    tensors, meta = flatten(loaded)
    entries = {e["name"]: e for e in idx["tensors"]}
    assert sorted(entries) == sorted(tensors)
    assert dict((k, v) for k, v in idx["metadata"]) == meta
    offsets = [e["offset"] for e in idx["tensors"]]
    assert offsets == sorted(offsets)
    blob = pathlib.Path(path).read_bytes()
    with zipfile.ZipFile(path) as z:
        # Each record by where its data starts: after the local header's name and extra.
        records = {}
        for i in z.infolist():
            h = i.header_offset
            n, m = int.from_bytes(blob[h + 26:h + 28], "little"), int.from_bytes(blob[h + 28:h + 30], "little")
            records[h + 30 + n + m] = i
    for name, t in tensors.items():
        e = entries[name]
        assert e["dtype"] == DTYPES[t.dtype], name
        assert e["shape"] == list(t.shape), name
        data = blob[e["offset"]:e["offset"] + e["nbytes"]]
        el = swap_unit(t.dtype)
        if e["byteswap"]:
            data = b"".join(data[i:i + el][::-1] for i in range(0, len(data), el))
        assert e["byteswap"] == (expect_byteswap and el > 1), name
        if not e["strided"]:
            assert t.is_contiguous() or t.numel() <= 1, name
            assert data == raw(t), name
        else:
            # Rebuild the view from the whole record with the index's strides.
            u8 = np.frombuffer(data, np.uint8)
            flat = torch.from_numpy(u8.copy()).view(t.dtype)
            view = torch.as_strided(flat, list(t.shape), e["stride"], e["elem_offset"])
            assert raw(view) == raw(t), name
        if e["has_crc"]:
            rec = records[e["offset"]]
            assert rec.file_size == e["nbytes"]
            assert e["crc"] == rec.CRC == zlib.crc32(blob[e["offset"]:e["offset"] + e["nbytes"]])
    return idx, loaded


# ------------------------------------------------------------ what torch writes

def every_dtype():
    g = torch.Generator().manual_seed(5)
    sd = {}
    for dt in DTYPES:
        base = torch.randn(3, 5, generator=g) * 4
        if dt.is_floating_point or dt.is_complex:
            t = base.to(dt) if dt != torch.complex64 else torch.complex(base, -base)
        elif dt == torch.bool:
            t = base > 0
        else:
            t = base.abs().to(torch.int64).to(dt)
        name = str(dt).replace("torch.", "")
        sd[name] = t
        sd[name + "_scalar"] = t[1, 2].clone()
        sd[name + "_empty"] = t[:0].clone()
    return sd


def test_every_dtype(dump_bin, tmp_path):
    path = tmp_path / "model.pt"
    torch.save(every_dtype(), path)
    idx, _ = check_against_torch(dump_bin, path)
    assert len(idx["tensors"]) == 3 * len(DTYPES)
    assert all(e["has_crc"] for e in idx["tensors"])


def test_archive_name_is_not_assumed(dump_bin, tmp_path):
    path = tmp_path / "weights.pt"
    torch.save({"w": torch.ones(4)}, path)
    with zipfile.ZipFile(path) as z:
        assert z.namelist()[0].startswith("weights/")
    check_against_torch(dump_bin, path)
    buf = io.BytesIO()
    torch.save({"w": torch.ones(4)}, buf)
    (tmp_path / "from_buffer.bin").write_bytes(buf.getvalue())
    with zipfile.ZipFile(tmp_path / "from_buffer.bin") as z:
        assert z.namelist()[0].startswith("archive/")
    check_against_torch(dump_bin, tmp_path / "from_buffer.bin")


def test_views_share_storages(dump_bin, tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    sd = {"base": base, "row": base[1], "col": base[:, 2], "t": base.t(), "narrow": base[1:3, 2:5],
          "scalar": base[2, 3], "tail": base.reshape(-1)[20:], "i64": torch.arange(5)[1:4]}
    path = tmp_path / "views.pt"
    torch.save(sd, path)
    idx, _ = check_against_torch(dump_bin, path)
    e = {x["name"]: x for x in idx["tensors"]}
    assert e["row"]["strided"] == 0 and e["row"]["offset"] == e["base"]["offset"] + 24
    assert not e["row"]["has_crc"] and e["base"]["has_crc"]
    assert e["t"]["strided"] == 1 and e["t"]["stride"] == [1, 6]
    assert e["narrow"]["strided"] == 1 and e["narrow"]["elem_offset"] == 8
    assert e["col"]["strided"] == 1 and e["col"]["nbytes"] == 96
    with zipfile.ZipFile(path) as z:
        assert sum(n.split("/")[1] == "data" for n in z.namelist()) == 2  # one storage each


def test_nested_checkpoint_with_optimizer(dump_bin, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 10, "lr": 0.1,
            "name": "run-7 ✓", "ema": None, "done": False, "seed": 2**64 - 5, "neg": -(2**70),
            "tiny": 1e-05, "huge": 1e16, "params": [torch.nn.Parameter(torch.ones(2))]}
    path = tmp_path / "ckpt.pt"
    torch.save(ckpt, path)
    idx, _ = check_against_torch(dump_bin, path)
    names = {e["name"] for e in idx["tensors"]}
    assert {"model.0.weight", "model.2.bias", "optimizer.state.0.exp_avg", "optimizer.state.3.exp_avg_sq",
            "optimizer.state.0.step", "params.0"} <= names
    meta = dict(idx["metadata"])
    assert meta["optimizer.param_groups.0.lr"] == "0.1"
    assert meta["optimizer.param_groups.0.params.3"] == "3"
    assert meta["optimizer.param_groups.0.betas.1"] == "0.999"
    assert meta["seed"] == "18446744073709551611" and meta["neg"] == str(-(2**70))
    assert meta["name"] == "run-7 ✓" and meta["ema"] == "None" and meta["done"] == "False"


def test_scalars_read_as_python_prints_them(dump_bin, tmp_path):
    import random
    rnd = random.Random(3)
    floats = [0.1, 0.2 + 0.1, 1.0, -0.0, 1e-05, 1e-4, 0.00012345, 123456789.0, 1e15, 1e16, 9.999999999999998e15,
              1.7976931348623157e308, 5e-324, 2.2250738585072014e-308, float("inf"), float("-inf"), 3.0e-7]
    floats += [rnd.uniform(-1, 1) * 10 ** rnd.randint(-30, 30) for _ in range(300)]
    ints = [0, 1, -1, 255, 256, 65535, 65536, 2**31 - 1, -2**31, 2**31, 2**63 - 1, -2**63, 2**63, 2**64,
            -(2**64) - 1, 10**40, -(10**40), 2**2000]
    obj = {"f": floats, "i": ints, "s": ["", "a.b", "ünï ✓", "tab\t nl\n"], "b": [True, False, None],
           "t": torch.zeros(1)}
    path = tmp_path / "scalars.pt"
    torch.save(obj, path)
    idx, _ = check_against_torch(dump_bin, path)
    assert len(idx["metadata"]) == len(floats) + len(ints) + 7


def test_many_tensors_and_memo_past_255(dump_bin, tmp_path):
    sd = {f"layers.{i}.w": torch.full((2,), float(i)) for i in range(2500)}
    path = tmp_path / "many.pt"
    torch.save(sd, path)
    idx, _ = check_against_torch(dump_bin, path)
    assert len(idx["tensors"]) == 2500


def test_no_crc_mode(dump_bin, tmp_path):
    from torch.utils.serialization import config
    path = tmp_path / "nocrc.pt"
    old = config.save.compute_crc32
    config.save.compute_crc32 = False
    try:
        torch.save({"w": torch.randn(3, 3), "e": torch.zeros(0)}, path)
    finally:
        config.save.compute_crc32 = old
    idx, _ = check_against_torch(dump_bin, path)
    e = {x["name"]: x for x in idx["tensors"]}
    assert not e["w"]["has_crc"], "crc 0 over data is 'not recorded'"


def rewrite(src, dst, change):
    """Copies a torch archive record by record with Python's zipfile (stored),
    letting change(name, data) replace records (None drops one)."""
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zo:
        for info in zi.infolist():
            data = change(info.filename, zi.read(info.filename))
            if data is not None:
                zo.writestr(info.filename, data)


def swap_unit(dtype):
    """What torch swaps for a big-endian record: each element, or each half of
    a complex one (storage.byteswap). A ckptio loader must do the same."""
    el = torch.empty(0, dtype=dtype).element_size()
    return el // 2 if dtype.is_complex else el


def test_big_endian_records(dump_bin, tmp_path):
    sd = {k: v for k, v in every_dtype().items() if not k.endswith("_empty")}
    src, dst = tmp_path / "le.pt", tmp_path / "be.pt"
    torch.save(sd, src)
    # torch.save numbers storages in order of first appearance: one per tensor here.
    unit = {str(i): swap_unit(t.dtype) for i, t in enumerate(sd.values())}

    def to_big(name, data):
        parts = name.split("/")
        if parts[1] == "byteorder":
            return b"big"
        if parts[1] == "data":
            n = unit[parts[2]]
            return b"".join(data[i:i + n][::-1] for i in range(0, len(data), n))
        return data
    rewrite(src, dst, to_big)
    # torch reads the typed storages back to the original values on this
    # little-endian machine. It does not swap the dtypes it saves over an
    # UntypedStorage (uint16/32/64, float8: persistent_load swaps as uint8);
    # ckptio does, so the index is checked against the original tensors.
    back = torch.load(dst, weights_only=True)
    v3 = set(torch.storage._new_dtypes())
    for k, t in sd.items():
        assert (raw(back[k]) == raw(t)) == (t.dtype not in v3 or swap_unit(t.dtype) == 1), k
    check_against_torch(dump_bin, dst, expect_byteswap=True, truth=sd)
    # No byteorder record at all: little-endian, as torch assumes by default.
    torch.save(sd, tmp_path / "nobo.pt", _disable_byteorder_record=True)
    check_against_torch(dump_bin, tmp_path / "nobo.pt")


# ------------------------------------------------------------ what is refused

class Evil:
    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


def first_global(path):
    """The global a pickle names first after the allowed ones, as torch names
    it (protocol 2 spells builtins as __builtin__)."""
    import pickletools
    from torch._weights_only_unpickler import _get_allowed_globals
    with zipfile.ZipFile(path) as z:
        pkl = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
    for op, arg, _ in pickletools.genops(pkl):
        if op.name == "GLOBAL":
            mod, name = arg.split(" ")
            mod = "builtins" if mod == "__builtin__" else mod
            if f"{mod}.{name}" not in _get_allowed_globals():
                return f"{mod}.{name}"
    raise AssertionError("no foreign global")


@pytest.mark.parametrize("fn,args", [
    (os.system, ("echo pwned",)),
    (eval, ("__import__('os').system('echo pwned')",)),
    (exec, ("print('pwned')",)),
    (__import__, ("os",)),
    (subprocess.Popen, (["true"],)),
    (shutil.rmtree, ("/nonexistent",)),
    (torch.load, ("/nonexistent",)),
])
def test_hostile_pickles(dump_bin, tmp_path, fn, args):
    path = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(2), "x": Evil(fn, *args)}, path)
    torch_refuses(path)
    refused(dump_bin, path, "pickle refused", f"pickle global '{first_global(path)}' is not allowed")
    # The same object as a bare pickle file: not even a zip.
    bare = tmp_path / "evil.pkl"
    bare.write_bytes(pickle.dumps(Evil(fn, *args), protocol=2))
    refused(dump_bin, bare, "unsupported format", "not a zip archive")


def test_protocol_4_is_refused_like_torch(dump_bin, tmp_path):
    path = tmp_path / "p4.pt"
    torch.save({"w": torch.ones(2)}, path, pickle_protocol=4)
    torch_refuses(path)
    refused(dump_bin, path, "pickle refused", "pickle opcode 0x95 (FRAME) at byte 2 is not allowed")


def test_legacy_and_other_formats(dump_bin, tmp_path):
    sd = {"w": torch.ones(2)}
    for proto in (2, 4):
        path = tmp_path / f"legacy{proto}.pt"
        torch.save(sd, path, _use_new_zipfile_serialization=False, pickle_protocol=proto)
        if proto == 2:  # torch still reads these; ckptio does not
            assert torch.equal(torch.load(path, weights_only=True)["w"], sd["w"])
        refused(dump_bin, path, "unsupported format", "legacy (pre-1.6) torch.save format is not supported")
    ts = tmp_path / "script.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), ts)
    refused(dump_bin, ts, "unsupported format", "TorchScript archive")
    # A torch archive re-zipped with deflate: torch.load inflates it; ckptio
    # reads only stored entries (it maps the file and never copies).
    src, dst = tmp_path / "plain.pt", tmp_path / "deflated.pt"
    torch.save(sd, src)
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zo:
        for info in zi.infolist():
            zo.writestr(info.filename, zi.read(info.filename))
    refused(dump_bin, dst, "unsupported format", "compressed entry 'plain/data.pkl' (method 8) is not supported")


def test_damaged_records(dump_bin, tmp_path):
    src = tmp_path / "ok.pt"
    torch.save({"w": torch.randn(4, 4), "v": torch.randn(3)}, src)
    drop = tmp_path / "missing.pt"
    rewrite(src, drop, lambda n, d: None if n.endswith("/data/1") else d)
    torch_refuses(drop)
    refused(dump_bin, drop, "not found", "storage '1' has no record 'ok/data/1'")
    short = tmp_path / "short.pt"
    rewrite(src, short, lambda n, d: d[:-4] if n.endswith("/data/0") else d)
    refused(dump_bin, short, "tensor invalid info", "holds 60 bytes but storage '0' of 16 x float32 needs 64")
    blob = bytearray(src.read_bytes())
    cut = tmp_path / "cut.pt"
    cut.write_bytes(blob[:len(blob) // 2])
    torch_refuses(cut)
    refused(dump_bin, cut, "corrupt zip archive", "no end of central directory")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
