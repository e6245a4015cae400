"""Zero-copy loads (ckptio.load_file / ckptio.torch.load_file, backend="mmap",
which the default "auto" picks for a file the page cache holds) against the real torch and safetensors: every dtype comes
back equal and as a view of one private mapping of the file; a flipped byte
is refused before anything is returned; writes to the results never reach the
file; a file saved over the path does not change them; they outlive the
reader, and the mapping goes with the last of them; RSS stays near the file
size; what cannot be a view (strided and big-endian .pt entries, misaligned
tensors) is copied; truncating the file in place raises SIGBUS, the
documented price of any file mapping.
Needs torch: ctest runs it through run_pytest.sh with CKPTIO_PYTEST_NEEDS=torch."""

import gc
import hashlib
import json
import os
import pathlib
import signal
import struct
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest
import safetensors.torch
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
import ckptio  # noqa: E402
import ckptio.torch as ct  # noqa: E402

DTYPES = list(ct.TORCH_DTYPES.values())
FORMATS = ["safetensors", "pt"]


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


def raw(t):
    """The tensor's values as little-endian bytes, row-major (bit-exact)."""
    t = t.detach().cpu().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def every_dtype():
    t = {}
    for i, dt in enumerate(DTYPES):
        d = str(dt).replace("torch.", "")
        t[f"{d}.matrix"] = random_tensor(dt, (3, 5), seed=i)
        t[f"{d}.scalar"] = random_tensor(dt, (), seed=100 + i)
        t[f"{d}.empty"] = random_tensor(dt, (2, 0, 3))
    t["big"] = torch.randn(9 * 262144 + 1)  # more than one pipeline piece
    return t


def mappings(path):
    """[(start, end)] of this process's mappings of `path` (also once unlinked)."""
    real = os.path.realpath(path)
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].rstrip("\n").removesuffix(" (deleted)") == real:
                a, b = (int(x, 16) for x in parts[0].split("-"))
                out.append((a, b))
    return out


def mapped(t, path):
    ptr = t.data_ptr() if isinstance(t, torch.Tensor) else t.ctypes.data
    return any(a <= ptr < b for a, b in mappings(path))


def info(path, name):
    """ckptio's index entry of one tensor (offset, nbytes, ...)."""
    with ckptio._core.Reader(path) as r:
        for i in r.infos():
            if i.name.decode() == name:
                return i
    raise KeyError(name)


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x5A]))


def digest(path):
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def assert_equal(got, want):
    assert sorted(got) == sorted(want)
    for k, t in want.items():
        assert got[k].dtype == t.dtype, k
        assert tuple(got[k].shape) == tuple(t.shape), k
        assert raw(got[k]) == raw(t), k


def save(sd, path, fmt):
    ct.save_file(sd, path, format=fmt)
    return path


# ------------------------------------------------------------ equal and mapped

@pytest.mark.parametrize("fmt", FORMATS)
def test_every_dtype_is_equal_and_a_view_of_the_file(tmp_path, fmt):
    sd = every_dtype()
    path = save(sd, tmp_path / f"m.{fmt}", fmt)
    got = ct.load_file(path, backend="mmap")
    assert_equal(got, sd)
    assert len(mappings(path)) == 1, "one mapping for the whole file"
    for k, t in got.items():
        if t.numel():
            assert mapped(t, path), f"{k} was copied"
        assert t.is_contiguous() and t.device.type == "cpu", k
    # numpy: the same bytes, views too; dtypes numpy lacks come as ckptio.Tensor.
    arrays = ckptio.load_file(path, backend="mmap")
    for k, t in sd.items():
        a = arrays[k]
        if isinstance(a, ckptio.Tensor):
            assert a.tobytes() == raw(t) and a.shape == tuple(t.shape), k
            a = a.buffer
        else:
            assert a.tobytes() == raw(t) and a.shape == tuple(t.shape), k
        assert a.flags.writeable, k
        if a.size:
            assert mapped(a, path), f"{k} was copied"


def test_a_sharded_set_loads_as_views_of_each_shard(tmp_path):
    sd = every_dtype()
    ct.save_torch_state_dict(sd, tmp_path, max_shard_size=1 << 20)
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 1
    for where in (tmp_path, tmp_path / "model.safetensors.index.json"):
        got = ct.load_file(where, backend="mmap")
        assert_equal(got, sd)
        assert list(got) == list(ct.load_file(where, backend="pread")), "the set's order"
        for k, t in got.items():
            if t.numel():
                assert any(mapped(t, s) for s in shards), f"{k} was copied"
        arrays = ckptio.load_file(where, backend="mmap")
        assert sorted(arrays) == sorted(sd)
    # A shard corrupted after the set was written is still caught.
    victim = shards[-1]
    with ckptio._core.Reader(victim) as r:
        first = next(i for i in r.infos() if i.nbytes)
    flip_byte(victim, first.offset)
    with pytest.raises(ckptio.CkptioError) as e:
        ct.load_file(tmp_path, backend="mmap")
    assert e.value.code == ckptio.ERRORS["CHECKSUM"], e.value


def test_files_of_the_peers_load_as_views(tmp_path):
    sd = {k: v for k, v in every_dtype().items() if v.dtype in (
        torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8, torch.bool)}
    st = tmp_path / "peer.safetensors"
    safetensors.torch.save_file(sd, st)
    pt = tmp_path / "peer.pt"
    torch.save(sd, pt)
    for path in (st, pt):
        got = ct.load_file(path, backend="mmap")
        assert_equal(got, sd)
        for k, t in got.items():
            assert not t.numel() or mapped(t, path), (path.name, k)
    # torch.save records real CRC-32s: a flipped byte in its file is caught.
    i = info(pt, "big")
    flip_byte(pt, i.offset + 5)
    with pytest.raises(ckptio.CkptioError) as e:
        ct.load_file(pt, backend="mmap")
    assert e.value.code == ckptio.E_CHECKSUM and "'big'" in str(e.value)


def test_views_and_big_endian_entries_are_copied(tmp_path):
    base = torch.randn(6, 8)
    sd = {"base": base, "row": base[2], "t": base.t(), "cols": base[:, ::2],
          "bytes": torch.arange(7, dtype=torch.uint8)}
    path = tmp_path / "views.pt"
    torch.save(sd, path)
    got = ct.load_file(path, backend="mmap")
    assert_equal(got, sd)
    assert mapped(got["base"], path) and mapped(got["row"], path)  # contiguous: views
    assert not mapped(got["t"], path) and not mapped(got["cols"], path)  # strided: copies
    got["t"].fill_(0)
    assert torch.equal(got["base"], base)  # copies do not alias the mapping
    got["base"][2].fill_(5)  # contiguous views of one storage share it, as torch.load's
    assert torch.equal(got["row"], torch.full((8,), 5.0))
    assert torch.equal(got["cols"], base[:, ::2])

    # Big-endian records (rewritten with zipfile): every multi-byte tensor is
    # swapped into fresh memory; single bytes need no swap and stay views.
    sd = {"f": torch.randn(4, 3), "i": torch.arange(5, dtype=torch.int64),
          "u8": torch.arange(9, dtype=torch.uint8)}
    le, be = tmp_path / "le.pt", tmp_path / "be.pt"
    torch.save(sd, le)
    with zipfile.ZipFile(le) as zi, zipfile.ZipFile(be, "w", zipfile.ZIP_STORED) as zo:
        for rec in zi.infolist():
            data, parts = zi.read(rec.filename), rec.filename.split("/")
            if parts[1] == "byteorder":
                data = b"big"
            elif parts[1] == "data":
                n = list(sd.values())[int(parts[2])].element_size()
                data = b"".join(data[i:i + n][::-1] for i in range(0, len(data), n))
            zo.writestr(rec.filename, data)
    got = ct.load_file(be, backend="mmap")
    assert_equal(got, sd)
    assert not mapped(got["f"], be) and not mapped(got["i"], be)
    assert mapped(got["u8"], be)


def test_misaligned_tensor_is_copied(tmp_path):
    # A hand-made safetensors file whose F32 tensor starts one byte into the
    # buffer (legal for the format; safetensors' own writer never does it).
    header = {"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
              "b": {"dtype": "F32", "shape": [2], "data_offsets": [1, 9]}}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    data = b"\x07" + np.array([1.5, -2.0], "<f4").tobytes()
    path = tmp_path / "odd.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    got = ct.load_file(path, backend="mmap")
    assert got["a"].tolist() == [7] and got["b"].tolist() == [1.5, -2.0]
    assert mapped(got["a"], path) and not mapped(got["b"], path)
    arrays = ckptio.load_file(path, backend="mmap")
    assert arrays["b"].tolist() == [1.5, -2.0] and arrays["b"].flags.aligned


# ------------------------------------------------------------ integrity

@pytest.mark.parametrize("fmt", FORMATS)
def test_a_flipped_byte_is_refused_before_anything_is_returned(tmp_path, fmt):
    sd = {"a": torch.randn(1000), "victim": torch.randn(300, 7), "z": torch.ones(3)}
    path = save(sd, tmp_path / f"m.{fmt}", fmt)
    flip_byte(path, info(path, "victim").offset + 4 * 1234)
    for load in (lambda: ct.load_file(path, backend="mmap"), lambda: ckptio.load_file(path, backend="mmap"),
                 lambda: ct.load_file(path, backend="pread")):
        with pytest.raises(ckptio.CkptioError) as e:
            load()
        assert e.value.code == ckptio.E_CHECKSUM
        msg = str(e.value)
        assert "'victim'" in msg and "checksum mismatch" in msg and str(path) in msg, msg
    gc.collect()
    assert mappings(path) == [], "a refused load leaves no mapping behind"
    # crc=False (numpy binding) hands out the bytes as they are.
    got = ckptio.load_file(path, crc=False, backend="mmap")
    assert got["victim"].tobytes() != raw(sd["victim"])


@pytest.mark.parametrize("fmt", FORMATS)
def test_writes_to_results_never_reach_the_file(tmp_path, fmt):
    sd = {"w": torch.randn(4096, 3), "b": torch.arange(100, dtype=torch.int32)}
    path = save(sd, tmp_path / f"m.{fmt}", fmt)
    before = digest(path)
    got = ct.load_file(path, backend="mmap")
    got["w"].mul_(3).add_(1)
    got["b"][::2] = -5
    arrays = ckptio.load_file(path, backend="mmap")
    arrays["w"][:] = 0
    assert digest(path) == before
    assert_equal(ct.load_file(path, backend="mmap"), sd)  # a new load sees the file
    assert torch.equal(got["w"], sd["w"] * 3 + 1)  # each keeps its own writes
    assert not arrays["w"].any()
    ckptio.verify(path)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_file_saved_over_the_path_does_not_change_results(tmp_path, fmt):
    old = {"w": torch.randn(512, 512), "n": torch.arange(10)}
    new = {"w": torch.zeros(512, 512), "n": torch.arange(10) + 1}
    path = save(old, tmp_path / f"m.{fmt}", fmt)
    got = ct.load_file(path, backend="mmap")
    arrays = ckptio.load_file(path, backend="mmap")
    save(new, path, fmt)  # ckptio: temp file + rename, the old inode lives on
    assert_equal(got, old)
    assert arrays["w"].tobytes() == raw(old["w"])
    assert_equal(ct.load_file(path, backend="mmap"), new)
    # Another writer's rename (os.replace of a finished file), then an unlink.
    tmp = tmp_path / "other.tmp"
    torch.save(new, tmp)
    os.replace(tmp, path)
    os.unlink(path)
    assert_equal(got, old)
    assert mappings(path), "the mapping of the old inode is still there"


# ------------------------------------------------------------ lifetime

def test_results_outlive_the_reader_and_the_mapping_goes_with_the_last(tmp_path):
    sd = {"a": torch.randn(100_000), "b": torch.randn(3, 3), "c": torch.arange(8)}
    path = save(sd, tmp_path / "m.safetensors", "safetensors")
    got = ct.load_file(path, backend="mmap")
    arrays = ckptio.load_file(path, backend="mmap")
    gc.collect()
    readers = [o for o in gc.get_objects() if type(o) in (ckptio._core.Reader, ckptio._torch_io.TorchReader)]
    assert readers == [], "no reader survives load_file"
    assert len(mappings(path)) == 2  # one per load
    assert_equal(got, sd)
    # Views of views (and numpy conversions) keep the mapping too.
    tail = got["a"][50_000:]
    as_np = got["b"].numpy()
    del got["a"], got["b"]
    del arrays
    gc.collect()
    assert len(mappings(path)) == 1
    assert raw(tail) == raw(sd["a"][50_000:]) and as_np.tobytes() == raw(sd["b"])
    del tail
    gc.collect()
    assert len(mappings(path)) == 1  # as_np and got["c"] still use it
    del as_np, got
    gc.collect()
    assert mappings(path) == [], "the last tensor took the mapping with it"


def test_mmap_false_copies_into_fresh_memory(tmp_path):
    sd = {"w": torch.randn(1000, 10)}
    path = save(sd, tmp_path / "m.safetensors", "safetensors")
    got = ct.load_file(path, backend="pread")
    arrays = ckptio.load_file(path, backend="pread")
    gc.collect()
    assert mappings(path) == []
    flip_byte(path, info(path, "w").offset)  # in place: copies do not see it
    assert_equal(got, sd)
    assert arrays["w"].tobytes() == raw(sd["w"])


# ------------------------------------------------------------ memory and faults

def run_child(code, *args):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(pathlib.Path(__file__).resolve().parents[2] / "python")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=300)


def test_rss_stays_near_the_file_size(tmp_path):
    size = 256 << 20
    path = save({f"w{i}": torch.randn(size // 4 // 8) for i in range(8)},
                tmp_path / "big.safetensors", "safetensors")
    child = run_child("""
        import gc, sys, torch, ckptio, ckptio.torch as ct
        def status(key):
            for line in open("/proc/self/status"):
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
        with open(sys.argv[1], "rb") as f:  # warm the page cache, not the process
            while f.read(1 << 20):
                pass
        ckptio._lib.lib()
        gc.collect()
        base = status("VmRSS:")  # no ckptio context yet: the load makes its own
        open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
        got = ct.load_file(sys.argv[1], backend="mmap")
        s = sum(float(t.sum()) for t in got.values())  # touch every byte
        peak = status("VmHWM:") - base
        del got
        gc.collect()
        print(peak, status("VmRSS:") - base)
        """, path)
    assert child.returncode == 0, child.stderr
    peak, after = map(int, child.stdout.split())
    nbytes = os.path.getsize(path)
    assert nbytes * 0.95 <= peak <= nbytes + (64 << 20), (peak, nbytes)
    # What stays is the context (two 2 MiB staging chunks, no 256 MiB ring).
    assert after <= 64 << 20, f"{after} bytes still resident after the tensors went"


def test_truncation_in_place_raises_sigbus(tmp_path):
    # The documented price of every mapping (safetensors and
    # torch.load(mmap=True) results too): ckptio never truncates in place.
    path = save({"w": torch.randn(1 << 20)}, tmp_path / "m.safetensors", "safetensors")
    child = run_child("""
        import os, sys, ckptio.torch as ct
        got = ct.load_file(sys.argv[1], backend="mmap")
        os.truncate(sys.argv[1], 4096)
        print(float(got["w"].sum()))
        """, path)
    assert child.returncode == -signal.SIGBUS, (child.returncode, child.stderr)


# ------------------------------------------------------------ stats (ckptio_stats)

def test_stats_of_saves_and_loads(tmp_path):
    sd = {"w": torch.randn(300_000), "b": torch.arange(1000, dtype=torch.int16)}
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    h = ct.save_file_async(sd, tmp_path / "m.safetensors")
    running = h.stats()
    assert running is not None and running["threads"] >= 1
    h.wait_durable()
    s = h.stats()  # after close: the whole save's
    assert s["bytes"] == nbytes and s["seconds"] > 0, s
    assert 0 < s["snapshot_seconds"] <= s["seconds"] and s["commit_seconds"] > 0, s
    assert s["staging_bytes"] > 0 and s["device_seconds"] == 0, s
    with ct.safe_open(tmp_path / "m.safetensors") as f:
        assert f.stats()["bytes"] == 0  # nothing loaded yet
        f.get_tensor("w")
        s = f.stats()
        # (a cold file: get_tensor reads the tensors after it too, ReadAhead)
        assert s["bytes"] >= 300_000 * 4 and s["copy_seconds"] > 0 and s["seconds"] > 0, s
