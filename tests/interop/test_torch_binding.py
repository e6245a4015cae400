"""ckptio.torch (python/ckptio/torch.py) against the real torch and safetensors:
every dtype both have round-trips bit for bit, files it writes open in
safetensors.torch and torch.load, files they write load through it, the CRCs
catch a flipped byte, an async save keeps the values of its snapshot, and a
contiguous tensor is saved from its own memory (no host copy).
Needs torch: ctest runs it through run_pytest.sh with CKPTIO_PYTEST_NEEDS=torch,
which skips loudly (77) when the venv lacks it."""

import ctypes
import gc
import json
import os
import pathlib
import sys
import threading
import time
import weakref

import numpy as np
import pytest
import safetensors
import safetensors.torch
import torch
from safetensors import safe_open as st_safe_open

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
import ckptio  # noqa: E402
import ckptio.torch as ct  # noqa: E402
import library_version  # noqa: E402 - tests/interop's own

# The pairs the binding promises; checked against its table below so a dtype
# dropped from the binding fails here rather than going untested.
EXPECTED = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
    "I32": "int32", "U32": "uint32", "I64": "int64", "U64": "uint64",
    "F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
    "C64": "complex64", "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn",
    "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
}
if hasattr(torch, "float8_e8m0fnu"):
    EXPECTED["F8_E8M0"] = "float8_e8m0fnu"
DTYPES = [getattr(torch, name) for name in EXPECTED.values()]


def dtype_id(dt):
    return str(dt).replace("torch.", "")


# ------------------------------------------------------------ helpers

def random_tensor(dtype, shape, seed=0):
    """Random bit patterns of any dtype (NaNs included), or 0/1 for bool."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(shape)


def raw_bytes(t):
    """The tensor's values as little-endian bytes, row-major (bit-exact)."""
    t = t.detach().cpu().resolve_conj().resolve_neg().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_same(got, want, name=""):
    assert isinstance(got, torch.Tensor), (name, type(got))
    assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
    assert tuple(got.shape) == tuple(want.shape), (name, got.shape, want.shape)
    assert got.device.type == "cpu", (name, got.device)
    assert got.is_contiguous(), name
    assert raw_bytes(got) == raw_bytes(want), name


def assert_same_dicts(got, want):
    assert sorted(got) == sorted(want)
    for name in want:
        assert_same(got[name], want[name], name)


def every_dtype_tensors():
    """Per dtype: a 2-d tensor, a 0-d scalar, an empty tensor and a
    non-contiguous view; plus names and shapes that stress the header."""
    t = {}
    for i, dt in enumerate(DTYPES):
        d = dtype_id(dt)
        t[f"{d}.matrix"] = random_tensor(dt, (3, 5), seed=i)
        t[f"{d}.scalar"] = random_tensor(dt, (), seed=100 + i)
        t[f"{d}.empty"] = random_tensor(dt, (2, 0, 3), seed=0)
        t[f"{d}.transposed"] = random_tensor(dt, (4, 6), seed=200 + i).t()
        t[f"{d}.strided"] = random_tensor(dt, (5, 8), seed=300 + i)[1:, ::3]
    t["layers.0.attn/q_proj.weight"] = torch.randn(3, 7)
    t["ünï cöde \"name\" \\"] = torch.arange(3, dtype=torch.int32)
    t["eight_dims"] = torch.randn(1, 2, 1, 2, 1, 2, 1, 3)
    # More than one 8 MiB pipeline chunk, with an odd tail.
    t["big"] = torch.randn(9 * 262144 + 1)
    return t


def data_range(path, name):
    """[begin, end) of a tensor's bytes in a safetensors file, from its header."""
    import json
    import struct
    raw = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8:8 + n])
    a, b = header[name]["data_offsets"]
    return 8 + n + a, 8 + n + b


def save_by_value(tensors, path, *args, **kwargs):
    """ckptio's own save of tensors by value (save_file_async): views and
    tensors sharing memory are copied, where save_file refuses them in the
    safetensors format as safetensors does."""
    ct.save_file_async(tensors, path, *args, **kwargs).wait_durable()


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x5A]))


# ------------------------------------------------------------ the dtype table

def test_dtype_table_matches_torch_and_the_library():
    assert {k: dtype_id(v) for k, v in ct.TORCH_DTYPES.items()} == EXPECTED
    lib = ckptio._lib.lib()
    for name, dt in ct.TORCH_DTYPES.items():
        code = ckptio._core.dtype_code(name)
        assert lib.ckptio_dtype_name(code).decode() == name
        assert lib.ckptio_dtype_bits(code) == 8 * torch.empty((), dtype=dt).element_size(), name


# ------------------------------------------------------------ round trips

@pytest.mark.parametrize("fmt", ["safetensors", "pt"])
def test_every_dtype_round_trips(tmp_path, fmt):
    tensors = every_dtype_tensors()
    path = tmp_path / f"all.{fmt}"
    save_by_value(tensors, path, metadata={"step": "7"}, format=fmt)
    got = ct.load_file(path)
    assert_same_dicts(got, tensors)
    with ct.safe_open(path) as f:
        assert f.metadata()["step"] == "7"
        assert f.format() == {"safetensors": "safetensors", "pt": "pytorch"}[fmt]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_each_dtype_alone(tmp_path, dtype):
    # One file per dtype: a failure names the dtype.
    t = {"x": random_tensor(dtype, (2, 3, 4), seed=5), "s": random_tensor(dtype, (), seed=6)}
    path = tmp_path / "one.safetensors"
    ct.save_file(t, path)
    assert_same_dicts(ct.load_file(path), t)
    assert_same_dicts(safetensors.torch.load_file(str(path)), t)


def test_views_parameters_and_lazy_bits_are_saved_by_value(tmp_path):
    base = torch.arange(40, dtype=torch.float32)
    c = torch.randn(6, dtype=torch.complex64)
    tensors = {
        "offset_view": base[7:19],                       # contiguous, storage offset
        "param": torch.nn.Parameter(torch.randn(3, 3)),  # requires_grad
        "conj": c.conj(),                                # lazy conjugate bit
        "neg": c.conj().imag,                            # lazy negative bit
        "expanded": torch.randn(3, 1).expand(3, 4),      # stride 0
        "channels_last": torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
    }
    assert tensors["conj"].is_conj() and tensors["neg"].is_neg()
    path = tmp_path / "views.safetensors"
    with pytest.raises(RuntimeError, match="share memory"):   # conj and neg: as safetensors' save_file
        ct.save_file(tensors, path)
    save_by_value(tensors, path)
    got = ct.load_file(path)
    want = {k: v.detach().resolve_conj().resolve_neg().contiguous() for k, v in tensors.items()}
    assert_same_dicts(got, want)
    assert torch.equal(got["conj"], torch.conj_physical(c))
    assert torch.equal(got["neg"], -c.imag)
    # Only the view's own bytes are stored, not the rest of its storage.
    assert data_range(path, "offset_view")[1] - data_range(path, "offset_view")[0] == 12 * 4


# ------------------------------------------------------------ interop

def test_ckptio_file_opens_in_safetensors(tmp_path):
    tensors = every_dtype_tensors()
    path = tmp_path / "ours.safetensors"
    save_by_value(tensors, path, metadata={"framework": "pt", "unicode": "grüße ✓"})
    assert_same_dicts(safetensors.torch.load_file(str(path)), tensors)
    with st_safe_open(str(path), framework="pt") as f:
        assert sorted(f.keys()) == sorted(tensors)
        meta = f.metadata()
        assert meta["framework"] == "pt" and meta["unicode"] == "grüße ✓"
        assert_same(f.get_tensor("bfloat16.matrix"), tensors["bfloat16.matrix"])


@pytest.mark.parametrize("mmap", [False, True])
def test_ckptio_pt_opens_in_torch_load(tmp_path, mmap):
    tensors = every_dtype_tensors()
    path = tmp_path / "ours.pt"
    ct.save_file(tensors, path, format="pt")
    got = torch.load(path, weights_only=True, mmap=mmap)
    assert list(got) == list(tensors)  # torch.load keeps the order they were given in
    assert_same_dicts({k: v.contiguous() for k, v in got.items()}, tensors)


def test_safetensors_file_loads_in_ckptio(tmp_path):
    tensors = {k: v.contiguous() for k, v in every_dtype_tensors().items()}
    path = tmp_path / "theirs.safetensors"
    safetensors.torch.save_file(tensors, str(path), metadata={"format": "pt"})
    assert_same_dicts(ct.load_file(path), tensors)
    with ct.safe_open(path, framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
        assert f.format() == "safetensors"


def test_torch_save_file_loads_in_ckptio(tmp_path):
    tensors = every_dtype_tensors()
    base = torch.arange(30, dtype=torch.float64)
    tensors["shared_a"] = base[3:9]             # two views of one storage
    tensors["shared_b"] = base.view(5, 6)[:, 2]  # ... one of them strided
    path = tmp_path / "theirs.pt"
    torch.save(tensors, path)
    got = ct.load_file(path)
    assert_same_dicts(got, tensors)
    with ct.safe_open(path) as f:
        assert f.format() == "pytorch"
        assert f.metadata() is None
        assert_same(f.get_tensor("shared_b"), tensors["shared_b"])


# ------------------------------------------------------------ safe_open

def test_safe_open_keys_metadata_get_tensor(tmp_path):
    tensors = {"b.weight": torch.randn(4, 3), "a.bias": torch.arange(5, dtype=torch.int16),
               "c": torch.tensor(True)}
    path = tmp_path / "m.safetensors"
    ct.save_file(tensors, path, metadata={"step": "12", "note": "x"})
    with ct.safe_open(path, framework="pt", device="cpu") as f:
        assert f.keys() == sorted(tensors)                  # sorted, as safetensors
        assert sorted(f.offset_keys()) == sorted(tensors)   # file order
        meta = f.metadata()
        assert meta["step"] == "12" and meta["note"] == "x"
        assert not any(k.startswith("ckptio.crc32.") for k in meta)
        for name in f.keys():
            assert_same(f.get_tensor(name), tensors[name], name)
        with pytest.raises(ckptio.CkptioError) as e:
            f.get_tensor("missing")
        assert e.value.code == ckptio.ERRORS["NOT_FOUND"] and "missing" in str(e.value)
        assert f.get_slice("c")[...].item() is True  # slices: test_torch_slice.py
    with pytest.raises(ValueError, match="closed"):
        f.keys()
    with pytest.raises(ValueError, match="framework"):
        ct.safe_open(path, framework="np")
    # Same answers as safetensors' own safe_open on the same file.
    with st_safe_open(str(path), framework="pt") as theirs, ct.safe_open(path) as ours:
        assert ours.keys() == sorted(theirs.keys())
        assert {k: v for k, v in theirs.metadata().items()
                if not k.startswith("ckptio.crc32.") and k != "ckptio.version"} == ours.metadata()


# ------------------------------------------------------------ integrity

@pytest.mark.parametrize("fmt", ["safetensors", "pt"])
def test_corrupted_byte_raises_checksum(tmp_path, fmt):
    tensors = {"keep": torch.randn(64), "victim": torch.randn(1000)}
    path = tmp_path / f"bad.{fmt}"
    ct.save_file(tensors, path, format=fmt)
    if fmt == "safetensors":
        a, b = data_range(path, "victim")
    else:  # the victim's storage record, found by its bytes
        raw = path.read_bytes()
        a = raw.index(raw_bytes(tensors["victim"]))
        b = a + 4000
    flip_byte(path, (a + b) // 2)
    with pytest.raises(ckptio.CkptioError) as e:
        ct.load_file(path)
    assert e.value.code == ckptio.E_CHECKSUM
    assert "checksum" in str(e.value).lower() and "victim" in str(e.value), e.value
    with ct.safe_open(path) as f:  # the other tensor is intact and loads
        assert_same(f.get_tensor("keep"), tensors["keep"])
        with pytest.raises(ckptio.CkptioError, match="(?i)checksum"):
            f.get_tensor("victim")


def test_crc_off_records_nothing(tmp_path):
    path = tmp_path / "nocrc.safetensors"
    ct.save_file({"x": torch.randn(10)}, path, crc=False)
    with st_safe_open(str(path), framework="pt") as f:
        assert not any(k.startswith("ckptio.crc32.") for k in (f.metadata() or {}))
    assert ckptio.verify(path) == 1  # one tensor without a recorded CRC


def test_failed_save_leaves_no_file_and_raises(tmp_path):
    path = tmp_path / "never.safetensors"
    bad_inputs = [
        ({"x": torch.randn(2, dtype=torch.complex128)}, TypeError, "complex128"),
        ({"x": torch.zeros((), dtype=torch.float4_e2m1fn_x2)}, ckptio.CkptioValueError, "0-d"),
        ({"x": torch.randn(2).to_sparse()}, TypeError, "sparse"),
        ({"x": torch.empty(2, device="meta")}, TypeError, "meta"),
        ({"x": torch.randn(*[1] * 9)}, ValueError, "9 dims"),
        ({3: torch.randn(2)}, TypeError, "names must be str"),
        ({"x": np.ones(2)}, TypeError, "torch.Tensor"),
        ({"__metadata__": torch.randn(2)}, ckptio.CkptioError, "reserved"),
    ]
    for tensors, exc, match in bad_inputs:
        with pytest.raises(exc, match=match):
            ct.save_file(tensors, path)
        assert not path.exists(), match
    with pytest.raises(TypeError, match="metadata"):
        ct.save_file({"x": torch.randn(2)}, path, metadata={"step": 3})
    with pytest.raises(ValueError, match="format"):
        ct.save_file({"x": torch.randn(2)}, path, format="npz")
    with pytest.raises(ckptio.CkptioError):
        ct.save_file({"x": torch.randn(2)}, tmp_path / "no" / "such" / "dir.safetensors")
    assert not path.exists()


def test_dtype_torch_lacks_is_a_clear_error(tmp_path):
    path = tmp_path / "f6.safetensors"
    ckptio.save_file({"f6": ckptio.Tensor("F6_E2M3", (4,), b"\x12\x34\x56"),
                      "ok": np.ones(2, np.float32)}, path)
    with pytest.raises(ckptio.CkptioError, match="F6_E2M3") as e:
        ct.load_file(path)
    assert e.value.code == ckptio.ERRORS["DTYPE"]
    with ct.safe_open(path) as f:  # the others still load one by one
        assert torch.equal(f.get_tensor("ok"), torch.ones(2))


# ------------------------------------------------------------ async saves

def test_async_save_keeps_snapshot_values(tmp_path):
    # Larger than the default 256 MiB staging ring would make the snapshot wait
    # for the disk; 96 MiB in several tensors keeps the test quick.
    tensors = {f"w{i}": torch.randn(4 << 20) for i in range(6)}
    tensors["nc"] = torch.randn(512, 1024).t()  # saved from a private contiguous copy
    want = {k: v.clone() for k, v in tensors.items()}
    path = tmp_path / "async.safetensors"
    h = ct.save_file_async(tensors, path, metadata={"step": "1"})
    h.wait_snapshot()
    assert h.snapshot_done()
    for t in tensors.values():  # the training step after the snapshot
        t.add_(1.0)
    h.wait_durable()
    assert h.done()
    done, total = h.progress()
    assert done == total == sum(v.numel() * 4 for v in want.values())
    h.wait_durable()  # repeatable
    h.wait_snapshot()
    assert_same_dicts(ct.load_file(path), want)


def test_async_handle_keeps_tensors_alive_until_durable(tmp_path):
    t = torch.randn(1 << 20)
    alive = weakref.ref(t)
    want = t.clone()
    path = tmp_path / "alive.safetensors"
    with ct.save_file_async({"t": t}, path) as h:
        del t
        gc.collect()
        assert alive() is not None  # the handle holds it
    assert h.done() and alive() is None  # dropped once durable
    assert_same(ct.load_file(path)["t"], want)


def test_dropped_handle_still_completes(tmp_path):
    path = tmp_path / "dropped.safetensors"
    want = torch.randn(1 << 20)
    ct.save_file_async({"t": want.clone()}, path)  # handle dropped at once
    gc.collect()
    assert_same(ct.load_file(path)["t"], want)


def test_async_waits_from_several_threads(tmp_path):
    path = tmp_path / "threads.safetensors"
    tensors = {f"w{i}": torch.randn(1 << 20) for i in range(8)}
    h = ct.save_file_async(tensors, path)
    errors = []

    def waiter(fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=waiter, args=(f,)) for f in
               [h.wait_snapshot, h.wait_durable, h.wait_durable, h.done, h.progress, h.close]]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors and h.done()
    assert_same_dicts(ct.load_file(path), tensors)


def test_async_failure_is_raised_by_every_wait(tmp_path):
    # A directory where the file should go: the rename at commit must fail.
    path = tmp_path / "is_a_dir.safetensors"
    (path / "inside").mkdir(parents=True)
    h = ct.save_file_async({"t": torch.randn(100)}, path)  # fails only at the rename
    with pytest.raises(ckptio.CkptioError) as e1:
        h.wait_durable()
    with pytest.raises(ckptio.CkptioError) as e2:
        h.wait_snapshot()
    assert e1.value is e2.value and h.done()
    assert str(path) in str(e1.value)


# ------------------------------------------------------------ CUDA

def cuda_usable():
    return torch.cuda.is_available() and ckptio._torch_io.cuda_unavailable(torch.device("cuda", 0)) is None


def test_cuda_device(tmp_path):
    # No skip: without a GPU the expected behaviour is a clear error naming
    # CUDA; with one, a real round trip ordered on a side stream.
    path = tmp_path / "gpu.safetensors"
    ct.save_file({"x": torch.arange(6.0)}, path)
    if not cuda_usable():
        for device in ["cuda:0", "cuda", 0, torch.device("cuda", 0)]:
            with pytest.raises(ckptio.CkptioError) as e:
                ct.load_file(path, device=device)
            assert "CUDA" in str(e.value), e.value
            assert e.value.code == ckptio.ERRORS["DEVICE"]
            with pytest.raises(ckptio.CkptioError, match="CUDA"):
                ct.safe_open(path, device=device)
        with pytest.raises(ValueError, match="cpu or cuda"):
            ct.load_file(path, device="meta")
        return
    got = ct.load_file(path, device="cuda:0")
    assert got["x"].device == torch.device("cuda", 0)
    assert torch.equal(got["x"].cpu(), torch.arange(6.0))
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.zeros(1 << 22, device="cuda:0")
        torch.cuda._sleep(200_000_000)  # the save must wait for this stream
        x.add_(3.0)
        path2 = tmp_path / "gpu2.safetensors"
        h = ct.save_file_async({"x": x, "nc": x.view(1024, -1).t()}, path2)
        h.wait_snapshot()
        x.add_(1.0)  # after the snapshot: not in the file
        h.wait_durable()
    got = ct.load_file(path2)
    assert torch.equal(got["x"], torch.full((1 << 22,), 3.0))
    assert torch.equal(got["nc"], torch.full((4096, 1024), 3.0))
    with ct.safe_open(path2, device="cuda:0") as f:
        assert f.get_tensor("nc").device.type == "cuda"


# ------------------------------------------------------------ zero copy

MiB = 1 << 20


def rss_kib(field):
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/self/status")


def peak_rss_growth(fn):
    """Bytes by which the resident set peaked above its level before fn().
    Resets the kernel's high-water mark (clear_refs 5) and, where that is not
    allowed, samples VmRSS from a thread every millisecond instead."""
    gc.collect()
    before = rss_kib("VmRSS")
    try:
        pathlib.Path("/proc/self/clear_refs").write_text("5")
    except OSError:  # not allowed here: sample instead (fn's own errors are not caught)
        pass
    else:
        fn()
        return (rss_kib("VmHWM") - before) * 1024
    peak, stop = [before], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], rss_kib("VmRSS"))
            time.sleep(0.001)

    th = threading.Thread(target=sample)
    th.start()
    try:
        fn()
    finally:
        stop.set()
        th.join()
    return (max(peak[0], rss_kib("VmRSS")) - before) * 1024


def test_save_makes_no_copy_of_contiguous_tensors(tmp_path):
    big = torch.empty(256 * MiB, dtype=torch.uint8)
    big.random_()  # every page resident before the measurement
    path = tmp_path / "big.safetensors"
    # The library reads the tensor's own memory (into its staging ring: torch
    # puts it 64 bytes past a page, where O_DIRECT cannot write from). Staging
    # is touched on first use and kept, so the measured save is the second;
    # it can still hold a few more ring slots at once than the first did
    # (that depends on timing), 8 MiB of new faults each: the bound leaves
    # room for those, and a copy of the tensor would show as 256.
    ct.save_file({"big": big}, path)
    growth = peak_rss_growth(lambda: ct.save_file({"big": big}, path))
    assert growth < 64 * MiB, f"saving a 256 MiB tensor grew the RSS by {growth / MiB:.0f} MiB"
    os.unlink(path)
    # The measurement can see a copy: a non-contiguous tensor of the same size
    # is copied (documented), and that shows.
    nc = big.view(16 * MiB, 16).t()
    growth_nc = peak_rss_growth(lambda: save_by_value({"big": nc}, path))
    assert growth_nc > 200 * MiB, f"the copy of a non-contiguous 256 MiB tensor showed as " \
                                  f"{growth_nc / MiB:.0f} MiB"
    print(f"peak RSS growth: contiguous {growth / MiB:.1f} MiB, "
          f"non-contiguous {growth_nc / MiB:.1f} MiB")


def test_load_allocates_only_the_destinations(tmp_path):
    # The library's own bound for a load is the data plus 64 MiB
    # (tests/unit/test_memory.cc); a copy on the Python side would add the
    # data again.
    path = tmp_path / "big.safetensors"
    ct.save_file({"big": torch.ones(256 * MiB, dtype=torch.uint8)}, path)
    holder = {}
    growth = peak_rss_growth(lambda: holder.update(ct.load_file(path)))
    assert int(holder["big"].sum()) == 256 * MiB
    assert growth < (256 + 64 + 16) * MiB, \
        f"loading 256 MiB grew the RSS by {growth / MiB:.0f} MiB"
    print(f"peak RSS growth of a 256 MiB load: {growth / MiB:.1f} MiB")


def test_copying_load_places_tensors_where_direct_reads_land(tmp_path):
    # A file in the reference writer's order (a small tensor first puts the
    # large ones off the page): each tensor of 64 KiB or more must start at
    # its file offset's place within the page, so the library's O_DIRECT
    # load reads into it with no staging copy, and still look like a plain
    # tensor: storage of exactly its bytes at offset 0, writable.
    tensors = {"a.norm": torch.arange(2752, dtype=torch.float32),
               "b.weight": torch.randn(512, 1024).to(torch.bfloat16),
               "c.odd": torch.randn(300001, dtype=torch.float32),
               "d.bytes": torch.arange(70001, dtype=torch.int64).to(torch.uint8)}
    path = tmp_path / "theirs.safetensors"
    safetensors.torch.save_file(tensors, str(path))
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    got = ct.load_file(path, mmap=False)
    assert_same_dicts(got, tensors)
    placed = 0
    for name, t in got.items():
        nbytes = t.numel() * t.element_size()
        assert t.storage_offset() == 0 and t.untyped_storage().nbytes() == nbytes, name
        offset = 8 + n + header[name]["data_offsets"][0]
        if nbytes >= 64 * 1024 and offset % t.element_size() == 0:
            assert t.data_ptr() % 4096 == offset % 4096, f"{name}: file offset {offset}"
            placed += 1
    assert placed == 3
    got["b.weight"].add_(1)  # writable memory of its own
    assert_same(got["c.odd"], tensors["c.odd"])
    # Private memory, as torch.empty's: a forked child's writes stay its own.
    pid = os.fork()
    if pid == 0:  # no torch op here: its thread pool does not survive a fork
        ctypes.memset(got["c.odd"].data_ptr(), 0x7F, 4096)
        os._exit(0)
    os.waitpid(pid, 0)
    assert_same(got["c.odd"], tensors["c.odd"])
    # The numpy binding's copying load places its arrays the same way.
    arrays = ckptio.load_file(path, mmap=False)
    for name in ("c.odd", "d.bytes"):
        a = arrays[name]
        assert a.flags.writeable and np.array_equal(a, tensors[name].numpy()), name
        assert a.ctypes.data % 4096 == (8 + n + header[name]["data_offsets"][0]) % 4096, name


def test_versions_reported():
    # The library's version: that of this tree (it asserts so), not of
    # another build or an installed copy.
    version = library_version.checked_library_version()
    # Printed with -rA / -s: which real packages this run was judged against.
    print(f"torch {torch.__version__} safetensors {safetensors.__version__} ckptio {version}")


def _cold(path):
    """Drops path from the page cache; skips the test where the filesystem
    keeps it cached anyway (tmpfs)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    with ckptio._core.Reader(path) as r:
        if r.resident() > 0.05:
            pytest.skip("this filesystem keeps files cached after POSIX_FADV_DONTNEED (tmpfs?)")


def _vma(addr):
    """(start, end, path, THPeligible) of the mapping of this process
    holding addr (path "" for an anonymous one), or None."""
    found = None
    with open("/proc/self/smaps") as fh:
        for line in fh:
            cols = line.split(maxsplit=5)
            if "-" in cols[0] and not cols[0].endswith(":"):
                lo, hi = (int(x, 16) for x in cols[0].split("-"))
                found = [lo, hi, cols[5].strip() if len(cols) > 5 else "", None] if lo <= addr < hi else None
            elif found and line.startswith("THPeligible:"):
                found[3] = int(line.split()[1])
                return tuple(found)
    return tuple(found) if found else None


def _views_of_one_mapping(sd, path):
    """Whether every tensor is a view of a mapping of the file itself (by
    /proc/self/smaps), not a copy: a copying load may put tensors at their
    file offsets from one base too (its destinations share one mapping)."""
    real = os.path.realpath(path)
    return all((_vma(t.data_ptr()) or (0, 0, "", 0))[2] == real for t in sd.values())


def test_default_load_maps_a_file_that_fits_and_direct_copies_it(tmp_path):
    """backend="auto": a cold file that fits in memory is mapped (its pages
    filled in parallel), and the page cache keeps it for the next load,
    which maps it too; backend="pread" copies; backend="direct" copies by
    O_DIRECT, leaving it cold. (A file that does not fit is copied by
    O_DIRECT: CKPTIO_LOAD_AUTO's rule, tests/unit/test_cache_policy.cc.)"""
    t = {f"w{k}": torch.arange(1 << 18, dtype=torch.float32) * k for k in range(8)}
    path = tmp_path / "m.safetensors"
    ct.save_file(t, path)
    _cold(path)
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
    except OSError:
        pytest.skip("this filesystem refuses O_DIRECT: a cold load reads through the page cache")
    with ckptio._core.Reader(path) as r:
        assert r.resident() < 0.2 and r.cacheable(), "a cold file that fits"
    cold = ct.load_file(path)
    assert _views_of_one_mapping(cold, path), "a cold file that fits is mapped"
    with ckptio._core.Reader(path) as r:
        assert r.resident() > 0.9, "the mapped load left the file out of the page cache"
    for name in t:
        assert torch.equal(cold[name], t[name])
    warm = ct.load_file(path)  # the next load, as a restarted process's
    assert _views_of_one_mapping(warm, path), "a resident file is mapped"
    for name in t:
        assert torch.equal(warm[name], t[name])
    assert _views_of_one_mapping(ct.load_file(path, backend="mmap"), path)
    assert not _views_of_one_mapping(ct.load_file(path, backend="pread"), path)
    _cold(path)
    direct = ct.load_file(path, backend="direct")
    assert not _views_of_one_mapping(direct, path)
    assert all(torch.equal(direct[name], t[name]) for name in t)
    with ckptio._core.Reader(path) as r:
        assert r.resident() < 0.2, "backend='direct' filled the page cache"
    with pytest.raises(ValueError, match="auto"):
        ct.load_file(path, backend="mapped")


def test_get_tensor_of_a_cold_file_reads_ahead(tmp_path):
    """safe_open.get_tensor on a cold file loads the tensor and those after
    it in one parallel load and hands them out as asked (each once, each a
    tensor of its own); a resident file is read a tensor per call."""
    t = {f"w{k:02d}": torch.full((1 << 18,), float(k)) for k in range(12)}  # 1 MiB each
    path = tmp_path / "m.safetensors"
    ct.save_file(t, path)
    _cold(path)
    with ct.safe_open(path, "pt") as f:
        names = f.offset_keys()
        first = f.get_tensor(names[0])
        read = f.stats()["bytes"]
        assert read == 12 << 20, "the whole 12 MiB window in the first load"
        second = f.get_tensor(names[1])
        assert f.stats()["bytes"] == read, "the second tensor came from the read-ahead"
        again = f.get_tensor(names[1])
        assert again.data_ptr() != second.data_ptr(), "a second call makes a new tensor"
        for name in names[2:]:
            assert torch.equal(f.get_tensor(name), t[name])
        assert torch.equal(first, t[names[0]]) and torch.equal(second, t[names[1]])
    with open(path, "rb") as fh:  # resident now: one tensor per call
        while fh.read(4 << 20):
            pass
    with ct.safe_open(path, "pt") as f:
        f.get_tensor("w03")
        assert f.stats()["bytes"] == 1 << 20


def test_get_tensor_loads_the_next_window_in_the_background(tmp_path, monkeypatch):
    """While the caller works through one read-ahead window in file order,
    the next is loaded on a thread: its tensors are the ones loaded then
    (bytes damaged on disk afterwards are never read). A call out of file
    order loads its own window and nothing in the background."""
    monkeypatch.setattr(ckptio._core, "READ_AHEAD_BYTES", 4 << 20)  # windows of 4 tensors
    t = {f"w{k:02d}": torch.full((1 << 18,), float(k)) for k in range(16)}  # 1 MiB each
    path = tmp_path / "m.safetensors"
    ct.save_file(t, path)
    with ckptio._core.Reader(path) as r:
        offset = {i.name.decode(): i.offset for i in r.infos()}
    _cold(path)
    with ct.safe_open(path, "pt") as f:
        names = f.offset_keys()
        assert torch.equal(f.get_tensor(names[0]), t[names[0]])
        assert f.stats()["bytes"] == 4 << 20, "the second window, loaded behind the first"
        with open(path, "r+b") as fh:  # damage the second window on disk
            for name in names[4:8]:
                fh.seek(offset[name])
                fh.write(b"\xff" * 64)
        for name in names[1:8]:
            assert torch.equal(f.get_tensor(name), t[name]), name
        f.get_tensor(names[13])  # out of order: its window (13-15) only
        assert f.stats()["bytes"] == 3 << 20
        f.get_tensor(names[9])  # out of order again: 9-12, no window behind it
        assert f.stats()["bytes"] == 4 << 20
        with pytest.raises(ckptio.ChecksumError):
            f.get_tensor(names[5])  # read again now: the damage is found


def test_a_stream_reuses_its_windows_memory_but_never_a_kept_tensors(tmp_path, monkeypatch):
    """A caller that drops each tensor after using it gets the next windows
    in the mappings of windows it is done with (pages faulted in already):
    at most three mappings for eight windows; a tensor it keeps keeps its
    window's mapping out of the pool, and its bytes stay its own."""
    monkeypatch.setattr(ckptio._core, "READ_AHEAD_BYTES", 4 << 20)  # windows of 4 tensors
    t = {f"w{k:02d}": torch.full((1 << 18,), float(k)) for k in range(32)}  # 1 MiB each: 8 windows
    path = tmp_path / "m.safetensors"
    ct.save_file(t, path)
    _cold(path)
    with ct.safe_open(path, "pt") as f:
        names = f.offset_keys()
        kept = f.get_tensor(names[0])
        for name in names[1:]:
            x = f.get_tensor(name)
            assert torch.equal(x, t[name]), name
            del x
        assert torch.equal(kept, t[names[0]]), "a kept tensor's window was reused"
        assert f._arenas.made <= 4, f"{f._arenas.made} mappings for 8 windows (1 kept + 3 in turn)"


def test_get_tensor_reads_ahead_in_the_order_of_keys(tmp_path, monkeypatch):
    """`for k in f.keys(): f.get_tensor(k)`, the usual loop, asks in sorted
    name order, which is not file order when dtypes are mixed (a file lays
    out its wider dtypes first). The read-ahead follows the caller's order,
    either one: a tensor is loaded once (one, at most twice, while the first
    calls tell the orders apart), in whole windows."""
    monkeypatch.setattr(ckptio._core, "READ_AHEAD_BYTES", 4 << 20)  # windows of 4 tensors
    t = {f"w{k:02d}": torch.full((1 << 18,) if k % 2 == 0 else (1 << 19,), float(k),
                                 dtype=torch.float32 if k % 2 == 0 else torch.float16)
         for k in range(16)}  # 1 MiB each
    path = tmp_path / "m.safetensors"
    ct.save_file(t, path)
    for order in ("keys", "offset_keys"):
        _cold(path)
        with ct.safe_open(path, "pt") as f:
            assert f.offset_keys() != f.keys(), "the layout this test needs"
            loaded = []
            load = f._ahead._load
            monkeypatch.setattr(f._ahead, "_load", lambda idx: loaded.append(len(idx)) or load(idx))
            for name in getattr(f, order)():
                assert torch.equal(f.get_tensor(name), t[name]), (order, name)
            f._ahead.settle()
        if order == "keys":  # 62 tensor loads, before
            assert sum(loaded) <= 17, f"{order}: tensors loaded per window: {loaded}"
        else:
            assert loaded == [4, 4, 4, 4], f"{order}: tensors loaded per window: {loaded}"


def test_copied_tensors_share_one_mapping_in_huge_pages(tmp_path):
    """A copying load puts its large tensors in one anonymous mapping (each
    at its file offset within the page, for O_DIRECT), whose whole 2 MiB
    pages are advised as huge pages: a mapping per tensor left each one's
    tail in 4 KiB pages, a fault each. Every tensor's storage is still its
    own bytes; the mapping goes with the last tensor."""
    t = {f"w{k}": torch.arange((1 << 20) + 1000 * k, dtype=torch.float32) for k in range(4)}
    path = tmp_path / "m.safetensors"
    ct.save_file(t, path)
    got = ct.load_file(path, backend="pread")
    assert_same_dicts(got, t)
    vmas = {_vma(v.data_ptr()) for v in got.values()}
    assert len(vmas) == 1, vmas
    lo, hi, _, eligible = vmas.pop()
    assert eligible == 1, "the mapping is not advised for huge pages"
    assert all(v.untyped_storage().nbytes() == v.numel() * v.element_size() for v in got.values())
    keep = got.pop("w3")
    del got
    gc.collect()
    assert _vma(keep.data_ptr())[:2] == (lo, hi), "a live tensor keeps the mapping"
    del keep
    gc.collect()
    assert _vma(lo) is None or _vma(lo)[:2] != (lo, hi), "the mapping outlived its tensors"


def test_large_copied_tensors_sit_in_huge_pages(tmp_path):
    """A copying load puts a large tensor at a 2 MiB boundary (plus its file
    offset within the page, for O_DIRECT), asking for transparent huge pages:
    a cold load into 4 KiB pages faults each one in."""
    t = {"big": torch.arange(3 << 20, dtype=torch.float32), "small": torch.ones(10)}
    path = tmp_path / "m.safetensors"
    ct.save_file(t, path)
    got = ct.load_file(path, backend="pread")
    with ckptio._core.Reader(path) as r:
        offset = {i.name.decode(): i.offset for i in r.infos()}["big"]
    assert (got["big"].data_ptr() - offset % 4096) % (2 << 20) == 0
    assert torch.equal(got["big"], t["big"]) and torch.equal(got["small"], t["small"])


# ------------------------------------------------------------ load_model

class Net(torch.nn.Module):
    """Linear layers, a LayerNorm, a BatchNorm (which loads its state its own
    way: _load_from_state_dict) and a tied pair, as models have them."""

    def __init__(self, width=64, big=0):
        super().__init__()
        self.embed = torch.nn.Embedding(32, width)
        self.fc = torch.nn.Linear(width, width)
        self.big = torch.nn.Linear(big, 1, bias=False) if big else None
        self.norm = torch.nn.LayerNorm(width)
        self.bn = torch.nn.BatchNorm1d(width)
        self.head = torch.nn.Linear(width, 32, bias=False)
        self.head.weight = self.embed.weight


def saved_net(tmp_path):
    """A Net of seed 1 and the file save_model wrote of it."""
    torch.manual_seed(1)
    src = Net()
    path = tmp_path / "net.safetensors"
    ct.save_model(src, path)
    return src, path


def _differ(model, state):
    """The names whose tensor in model differs from state's."""
    return [n for n, v in model.state_dict().items() if not torch.equal(v, state[n])]


def test_load_model_reads_into_the_models_own_memory(tmp_path, monkeypatch):
    torch.manual_seed(1)
    src = Net()
    src.bn.running_mean.normal_()
    path = tmp_path / "net.safetensors"
    ct.save_model(src, path)
    torch.manual_seed(2)
    dst = Net()
    before = {n: (t.data_ptr(), t._version) for n, t in dst.state_dict().items()}
    # What goes through a state dict (load_state_dict) rather than in place.
    through = []
    real_load = ct.TorchReader.load

    def load(self, indices, **kw):
        indices = list(indices)
        through.extend(self.entries[i].name.decode() for i in indices)
        return real_load(self, indices, **kw)
    monkeypatch.setattr(ct.TorchReader, "load", load)
    assert ct.load_model(dst, path) == ([], [])
    assert _differ(dst, src.state_dict()) == []
    # The tied pair (one memory, two names) and BatchNorm's state go through
    # load_state_dict; the rest was read in place.
    assert sorted(through) == ["bn.bias", "bn.num_batches_tracked", "bn.running_mean",
                               "bn.running_var", "bn.weight", "embed.weight"], through
    for name, (ptr, version) in before.items():
        t = dst.state_dict()[name]
        assert t.data_ptr() == ptr, name
        assert t._version > version, f"{name}: autograd was not told the tensor changed"
    # A tensor subclass (DTensor, a quantized wrapper) is never written
    # through its data_ptr(): it goes through load_state_dict.
    through.clear()

    class Sub(torch.Tensor):
        pass
    dst.fc.weight = torch.nn.Parameter(torch.zeros_like(dst.fc.weight).as_subclass(Sub))
    assert ct.load_model(dst, path) == ([], [])
    assert "fc.weight" in through and torch.equal(dst.fc.weight, src.fc.weight)
    # in_place=False loads everything through the state dict, same result.
    torch.manual_seed(3)
    again = Net()
    assert ct.load_model(again, path, in_place=False) == ([], [])
    assert _differ(again, src.state_dict()) == []


def test_load_model_in_place_makes_no_second_copy(tmp_path):
    src = Net(big=64 * MiB // 4)
    path = tmp_path / "big.safetensors"
    ct.save_model(src, path)
    dst = Net(big=64 * MiB // 4)
    dst.big.weight.data.zero_()  # resident before the measurement
    growth = peak_rss_growth(lambda: ct.load_model(dst, path))
    assert torch.equal(dst.big.weight, src.big.weight)
    assert growth < 24 * MiB, f"an in-place load of a 64 MiB model grew the RSS by {growth / MiB:.0f} MiB"
    # The measurement sees a copy: the state-dict load holds a second one.
    dst.big.weight.data.zero_()
    growth_copy = peak_rss_growth(lambda: ct.load_model(dst, path, in_place=False))
    assert torch.equal(dst.big.weight, src.big.weight)
    assert growth_copy > 56 * MiB, f"the state-dict load showed as {growth_copy / MiB:.0f} MiB"
    print(f"peak RSS growth of load_model, 64 MiB: in place {growth / MiB:.1f} MiB, "
          f"through a state dict {growth_copy / MiB:.1f} MiB")


def test_load_model_casts_and_reports_what_does_not_fit(tmp_path):
    src, path = saved_net(tmp_path)
    # A half-precision model: nothing fits in place, load_state_dict casts.
    half = Net().half()
    assert ct.load_model(half, path) == ([], [])
    for name, t in src.state_dict().items():
        assert torch.equal(half.state_dict()[name], t.to(half.state_dict()[name].dtype)), name
    # A wrong shape is torch's own error, as with safetensors.
    with pytest.raises(RuntimeError, match="size mismatch for fc.weight"):
        ct.load_model(Net(width=32), path)


def test_load_model_in_place_raises_on_a_flipped_byte(tmp_path):
    _, path = saved_net(tmp_path)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x40  # in the last tensor's bytes
    path.write_bytes(bytes(data))
    dst = Net()
    keep = {n: t.clone() for n, t in dst.state_dict().items()}
    with pytest.raises(ckptio.ChecksumError):
        ct.load_model(dst, path, in_place=False)
    assert _differ(dst, keep) == [], "a failed load_model(in_place=False) changed the model"
    with pytest.raises(ckptio.ChecksumError):
        ct.load_model(dst, path)


def test_load_model_onto_a_gpu_model(tmp_path):
    """A model on a GPU is loaded in place there (the real runtime; the
    fake's twin is test_load_into_gpu_tensors_in_place_after_their_streams),
    after the work queued on its current stream."""
    if not cuda_usable():
        pytest.skip("no usable CUDA GPU here: the in-place GPU load runs in "
                    "interop_torch_binding_cuda_fake on the fake runtime instead")
    src, path = saved_net(tmp_path)
    dst = Net().cuda()
    ptrs = {n: t.data_ptr() for n, t in dst.state_dict().items()}
    torch.cuda._sleep(100_000_000)  # queued before the load: the load must wait
    dst.fc.weight.data.fill_(7.0)
    assert ct.load_model(dst, path) == ([], [])
    for name, t in src.state_dict().items():
        assert dst.state_dict()[name].data_ptr() == ptrs[name], name
        assert torch.equal(dst.state_dict()[name].cpu(), t), name


class _ShardsDataset(torch.utils.data.Dataset):
    """Each item loads one file with ckptio in whichever process asks: a
    DataLoader worker, forked from a parent that has used ckptio."""

    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        out = ct.load_file(self.paths[i])
        ct.save_file(out, self.paths[i] + f".worker{os.getpid()}")
        return out["x"]


def test_dataloader_workers_forked_after_loads_and_an_async_save(tmp_path):
    paths = []
    for i in range(6):
        paths.append(str(tmp_path / f"s{i}.safetensors"))
        ct.save_file({"x": torch.full((1000,), float(i))}, paths[-1])
    assert torch.equal(ct.load_file(paths[0])["x"], torch.zeros(1000))
    # A save still running in the parent when the workers fork.
    handle = ct.save_file_async({"big": torch.ones(1 << 22)}, str(tmp_path / "big.safetensors"))
    loader = torch.utils.data.DataLoader(_ShardsDataset(paths), batch_size=None, num_workers=2,
                                         multiprocessing_context="fork", timeout=60)
    got = [int(x[0]) for x in loader]
    assert sorted(got) == list(range(6))
    handle.wait_durable()
    assert torch.equal(ct.load_file(str(tmp_path / "big.safetensors"))["big"], torch.ones(1 << 22))
    assert len([p for p in os.listdir(tmp_path) if ".worker" in p]) == 6
