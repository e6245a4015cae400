"""ckptio's torch.save writer (src/formats/torch_write.c) against the real
torch: files written through ckptio_torch_layout by torch_write_driver load
with torch.load(weights_only=True), with mmap=True, and through torch's
calculate_storage_offsets fast path with its debug asserts; zipfile finds
every CRC right; and the bytes equal torch.save's own output for the same
state dict, except the 40-digit serialization id.

Usage: python test_torch_write.py [DRIVER]   (or CKPTIO_TORCH_DRIVER=...)
Exit 0 pass, 1 fail, 77 skip (torch cannot be imported). Set
CKPTIO_TEST_SLOW=1 to also write and load a file with a 4 GiB + 100 B
tensor (zip64 records and descriptors, about 9 GB of disk)."""

import collections
import json
import os
import pathlib
import struct
import subprocess
import sys
import tempfile
import traceback
import zipfile

# torch.load asserts its computed storage offsets against the zip's own when
# this is set (read at load time); it must be set before loading.
os.environ["TORCH_SERIALIZATION_DEBUG"] = "1"

try:
    import torch
    import torch.utils.serialization
except Exception as e:  # noqa: BLE001 - any import failure is a skip
    print(f"SKIP torch_write interop: cannot import torch ({type(e).__name__}: {e}); "
          "install torch into the venv to run this test")
    sys.exit(77)

DRIVER = os.environ.get("CKPTIO_TORCH_DRIVER") or (sys.argv[1] if len(sys.argv) > 1 else "")
if not DRIVER or not os.access(DRIVER, os.X_OK):
    # The driver is built with the library: its absence is a broken build, not a skip.
    print(f"FAIL torch_write interop: no torch_write_driver binary ({DRIVER!r}); pass its "
          "path as the first argument or in CKPTIO_TORCH_DRIVER")
    sys.exit(1)

CKPTIO_NAMES = {
    torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16",
    torch.int32: "I32", torch.int64: "I64", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.float32: "F32", torch.float64: "F64", torch.complex64: "C64",
}
for attr, name in [("float8_e5m2", "F8_E5M2"), ("float8_e4m3fn", "F8_E4M3"),
                   ("float8_e4m3fnuz", "F8_E4M3FNUZ"), ("float8_e5m2fnuz", "F8_E5M2FNUZ"),
                   ("float8_e8m0fnu", "F8_E8M0"), ("uint16", "U16"), ("uint32", "U32"),
                   ("uint64", "U64")]:
    if hasattr(torch, attr):
        CKPTIO_NAMES[getattr(torch, attr)] = name
    else:
        print(f"note: this torch ({torch.__version__}) has no torch.{attr}: not tested")


def raw(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def random_tensor(gen, dtype, shape):
    """Random bytes reinterpreted: every bit pattern, NaNs included."""
    n = 1
    for d in shape:
        n *= d
    size = torch.empty((), dtype=dtype).element_size()
    b = torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=gen)
    if dtype == torch.bool:
        b = b & 1
    return b.view(dtype).reshape(shape)


def all_dtypes_state():
    gen = torch.Generator().manual_seed(20250101)
    sd = collections.OrderedDict()
    for dtype in CKPTIO_NAMES:
        name = str(dtype).replace("torch.", "")
        sd[name] = random_tensor(gen, dtype, (3, 5))
        sd[name + ".scalar"] = random_tensor(gen, dtype, ())
        sd[name + ".empty"] = random_tensor(gen, dtype, (2, 0, 3))
    sd["big.f32"] = random_tensor(gen, torch.float32, (257, 1031))
    sd["4d.bf16"] = random_tensor(gen, torch.bfloat16, (2, 3, 4, 5))
    sd["odd"] = random_tensor(gen, torch.uint8, (1,))
    sd["grüße ✓ 模型"] = random_tensor(gen, torch.int16, (7,))
    sd["with space/and.dots"] = random_tensor(gen, torch.float64, (2,))
    return sd


def write(tmp, sd, stem, meta=None, crc=True, zeros=()):
    """Writes sd through the driver; returns (path, {name: offset})."""
    spec, data = [f"A {stem}", f"C {1 if crc else 0}"], bytearray()
    for k, v in (meta or {}).items():
        spec.append(f"M {k.encode().hex()} {v.encode().hex()}")
    for name, t in sd.items():
        off = -1
        if name not in zeros:
            off = len(data)
            data += raw(t)
        dims = " ".join(str(d) for d in t.shape)
        spec.append(f"T {name.encode().hex()} {CKPTIO_NAMES[t.dtype]} {off} {t.dim()} {dims}")
    spec_path, data_path = tmp / f"{stem}.spec", tmp / f"{stem}.bin"
    spec_path.write_text("\n".join(spec) + "\n")
    data_path.write_bytes(bytes(data))
    out = tmp / f"{stem}.pt"
    r = subprocess.run([DRIVER, str(spec_path), str(data_path), str(out)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"driver failed: {r.stderr.strip()}")
    offsets = {}
    names = list(sd)
    for line in r.stdout.splitlines():
        f = line.split()
        if f[0] == "tensor":
            offsets[names[int(f[1])]] = int(f[2])
    return out, offsets


def same(a, b, what):
    assert list(a) == list(b), f"{what}: keys {list(a)[:5]}... != {list(b)[:5]}..."
    for k in a:
        x, y = a[k], b[k]
        assert isinstance(y, torch.Tensor), f"{what}: {k} is {type(y)}"
        assert x.dtype == y.dtype, f"{what}: {k}: dtype {y.dtype} != {x.dtype}"
        assert x.shape == y.shape, f"{what}: {k}: shape {tuple(y.shape)} != {tuple(x.shape)}"
        assert y.is_contiguous() and y.storage_offset() == 0, f"{what}: {k}: not contiguous"
        assert raw(x) == raw(y), f"{what}: {k}: values differ"


def load_all_ways(path, sd, what):
    cfg = torch.utils.serialization.config.load
    same(sd, torch.load(path, weights_only=True), f"{what} weights_only")
    same(sd, torch.load(path, weights_only=True, mmap=True), f"{what} mmap")
    old = cfg.calculate_storage_offsets
    cfg.calculate_storage_offsets = True
    try:
        same(sd, torch.load(path, weights_only=True, mmap=True), f"{what} mmap+offsets")
    finally:
        cfg.calculate_storage_offsets = old


def check_zip_structure(path, offsets, stem):
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None, f"{path}: testzip found a bad CRC"
        infos = z.infolist()
        names = [i.filename for i in infos]
        n = len(offsets)
        want = ([f"{stem}/data.pkl", f"{stem}/.format_version", f"{stem}/.storage_alignment",
                 f"{stem}/byteorder"] + [f"{stem}/data/{k}" for k in range(n)] +
                [f"{stem}/version", f"{stem}/.data/serialization_id"])
        assert names[:len(want)] == want, f"record order {names}"
        raw_file = path.read_bytes()
        for i in infos:
            lh = raw_file[i.header_offset:i.header_offset + 30]
            nl, el = struct.unpack("<HH", lh[26:30])
            start = i.header_offset + 30 + nl + el
            assert start % 64 == 0, f"{i.filename} data at {start}"
            assert i.compress_type == 0
        for k, (name, off) in enumerate(offsets.items()):
            i = z.getinfo(f"{stem}/data/{k}")
            lh = raw_file[i.header_offset:i.header_offset + 30]
            nl, el = struct.unpack("<HH", lh[26:30])
            assert i.header_offset + 30 + nl + el == off, f"{name}: driver offset {off}"
        sid = z.read(f"{stem}/.data/serialization_id")
        assert len(sid) == 40 and sid.isdigit(), sid
        return z.read(f"{stem}/data.pkl"), sid


def diff_outside_sid(ours, theirs, stem):
    """Byte ranges where the files may differ: the serialization id's 40
    digits and its CRC in the data descriptor and the central directory."""
    a, b = ours.read_bytes(), theirs.read_bytes()
    assert len(a) == len(b), f"size {len(a)} != torch.save's {len(b)}"
    with zipfile.ZipFile(theirs) as z:
        i = z.getinfo(f"{stem}/.data/serialization_id")
        lh = b[i.header_offset:i.header_offset + 30]
        nl, el = struct.unpack("<HH", lh[26:30])
        d = i.header_offset + 30 + nl + el
        allowed = set(range(d, d + 40)) | set(range(d + 44, d + 48))
        cd = b.rfind(b"PK\x01\x02" + b"\x00" * 4 + b"\x08\x08", 0, len(b))
        name = f"{stem}/.data/serialization_id".encode()
        pos = b.find(name, cd) - 46
        assert b[pos:pos + 4] == b"PK\x01\x02"
        allowed |= set(range(pos + 16, pos + 20))
    bad = [k for k in range(len(a)) if a[k] != b[k] and k not in allowed]
    assert not bad, f"{len(bad)} bytes differ from torch.save, first at {bad[0]}"


# ------------------------------------------------------------------ cases

def test_all_dtypes(tmp):
    sd = all_dtypes_state()
    path, offsets = write(tmp, sd, "alldt")
    load_all_ways(path, sd, "all dtypes")
    ours_pkl, _ = check_zip_structure(path, offsets, "alldt")
    ref = tmp / "ref" / "alldt.pt"
    ref.parent.mkdir(exist_ok=True)
    torch.save(sd, ref)
    with zipfile.ZipFile(ref) as z:
        assert ours_pkl == z.read("alldt/data.pkl"), "data.pkl differs from torch.save's"
    diff_outside_sid(path, ref, "alldt")
    # Deterministic: the same input writes the same bytes.
    again, _ = write(tmp, sd, "alldt")
    assert again.read_bytes() == path.read_bytes()


def test_many_tensors(tmp):
    """More than one SETITEMS batch (1000) and memo indices past 255."""
    gen = torch.Generator().manual_seed(7)
    sd = collections.OrderedDict(
        (f"layer{k}.w", random_tensor(gen, [torch.float32, torch.float8_e4m3fn][k % 2], (k % 3 + 1,)))
        for k in range(2001))
    path, offsets = write(tmp, sd, "many")
    load_all_ways(path, sd, "2001 tensors")
    check_zip_structure(path, offsets, "many")
    ref = tmp / "ref" / "many.pt"
    ref.parent.mkdir(exist_ok=True)
    torch.save(sd, ref)
    diff_outside_sid(path, ref, "many")


def test_single_and_empty(tmp):
    for stem, sd in [("one", collections.OrderedDict(x=torch.arange(3, dtype=torch.int64))),
                     ("none", collections.OrderedDict())]:
        path, offsets = write(tmp, sd, stem)
        load_all_ways(path, sd, stem)
        check_zip_structure(path, offsets, stem)
        ref = tmp / "ref" / f"{stem}.pt"
        ref.parent.mkdir(exist_ok=True)
        torch.save(sd, ref)
        diff_outside_sid(path, ref, stem)


def test_no_crc(tmp):
    sd = all_dtypes_state()
    path, _ = write(tmp, sd, "nocrc", crc=False)
    load_all_ways(path, sd, "no crc")
    with zipfile.ZipFile(path) as z:
        crcs = {i.filename: i.CRC for i in z.infolist()}
    assert all(c == 0 for n, c in crcs.items() if "/data/" in n), "tensor CRCs should be 0"
    assert crcs["nocrc/data.pkl"] != 0, "small records keep their CRCs"


def test_metadata(tmp):
    sd = all_dtypes_state()
    meta = {"framework": "ckptio", "step": "1234", "unicode": "grüße ✓ 模型",
            "escapes": 'a\nb "q" \\ \t'}
    path, offsets = write(tmp, sd, "meta", meta=meta)
    load_all_ways(path, sd, "metadata")
    check_zip_structure(path, offsets, "meta")
    with zipfile.ZipFile(path) as z:
        names = [i.filename for i in z.infolist()]
        assert names[-1] == "meta/ckptio_metadata.json", names[-3:]
        got = json.loads(z.read("meta/ckptio_metadata.json"), object_pairs_hook=collections.OrderedDict)
    assert list(got.items()) == list(meta.items()), got


def test_unsupported_dtypes(tmp):
    for dt in ["F4", "F6_E2M3", "F6_E3M2"]:
        spec = tmp / "bad.spec"
        spec.write_text(f"T {'bad.weight'.encode().hex()} {dt} -1 1 8\n")
        r = subprocess.run([DRIVER, str(spec), str(tmp / "none.bin"), str(tmp / "bad.pt")],
                           capture_output=True, text=True)
        assert r.returncode != 0, f"{dt} was accepted"
        assert "bad.weight" in r.stderr and dt in r.stderr, r.stderr


def test_zip64(tmp):
    """A tensor of 4 GiB + 100 bytes: zip64 extras, 24-byte descriptors,
    and every later record past the 4 GiB offset."""
    if os.environ.get("CKPTIO_TEST_SLOW") != "1":
        print("  (skipped: set CKPTIO_TEST_SLOW=1 to write two 4 GiB files)")
        return
    sd = collections.OrderedDict()
    sd["a"] = torch.arange(5, dtype=torch.int32)
    sd["big"] = torch.zeros(2**32 + 100, dtype=torch.uint8)
    sd["c"] = torch.arange(3, dtype=torch.float32)
    sd["e"] = torch.zeros(0, dtype=torch.float32)
    path, offsets = write(tmp, sd, "big", zeros={"big"})
    got = torch.load(path, weights_only=True, mmap=True)
    assert list(got) == list(sd)
    assert got["big"].shape == sd["big"].shape and not got["big"][::4096].any()
    for k in "ace":
        assert torch.equal(got[k], sd[k]), k
    cfg = torch.utils.serialization.config.load
    cfg.calculate_storage_offsets = True
    try:
        got = torch.load(path, weights_only=True, mmap=True)
        assert torch.equal(got["c"], sd["c"])
    finally:
        cfg.calculate_storage_offsets = False
    check_zip_structure(path, offsets, "big")
    ref = tmp / "ref" / "big.pt"
    ref.parent.mkdir(exist_ok=True)
    torch.save(sd, ref)
    del sd, got
    assert path.stat().st_size == ref.stat().st_size, "size differs from torch.save's"
    # Everything outside the big tensor's data, minus the serialization id.
    head = offsets["big"]
    tail = head + 2**32 + 100
    with open(path, "rb") as fa, open(ref, "rb") as fb:
        assert fa.read(head) == fb.read(head), "headers before the big tensor differ"
        fa.seek(tail)
        fb.seek(tail)
        ta, tb = fa.read(), fb.read()
    diffs = [k for k in range(len(ta)) if ta[k] != tb[k]]
    assert len(diffs) <= 48, f"{len(diffs)} bytes differ after the big tensor"


def main():
    failed = 0
    print(f"torch {torch.__version__}, driver {DRIVER}")
    with tempfile.TemporaryDirectory(dir=os.environ.get("CKPTIO_TEST_TMPDIR")) as d:
        for name, fn in list(globals().items()):
            if not name.startswith("test_"):
                continue
            tmp = pathlib.Path(d) / name
            tmp.mkdir()
            try:
                fn(tmp)
                print(f"PASS {name}")
            except Exception:  # noqa: BLE001 - report every failure, keep going
                failed += 1
                print(f"FAIL {name}")
                traceback.print_exc()
    print(f"{'FAILED' if failed else 'OK'}: {failed} failing")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
