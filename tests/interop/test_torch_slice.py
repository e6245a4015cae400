"""ckptio.torch.safe_open(...).get_slice against the real safetensors
get_slice on the same files (written by safetensors.torch itself): same
shapes, dtypes and bytes for every key form both accept; clear errors for
what ckptio refuses (steps, two sliced dims); CRC verification only for
whole slices; the tensor-parallel plan against torch.chunk; PyTorch views
from torch.save. Needs torch (run_pytest.sh with CKPTIO_PYTEST_NEEDS=torch)."""

import pathlib
import sys

import pytest
import safetensors.torch
import torch
from safetensors import safe_open as st_safe_open

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
import ckptio  # noqa: E402
import ckptio.torch as ct  # noqa: E402


def model():
    g = torch.Generator().manual_seed(6)
    return {
        "f32.1d": torch.randn(37, generator=g),
        "bf16.2d": torch.randn(48, 40, generator=g).to(torch.bfloat16),
        "f16.3d": torch.randn(3, 10, 7, generator=g).half(),
        "f64.4d": torch.randn(2, 3, 4, 5, generator=g).double(),
        "i8.2d": torch.randint(-100, 100, (9, 11), generator=g, dtype=torch.int8),
        "bool.2d": torch.randint(0, 2, (6, 5), generator=g).bool(),
        "i64.3d": torch.randint(0, 1 << 40, (4, 1, 6), generator=g),
        "empty": torch.zeros(3, 0, 2),
    }


def keys_for(shape):
    """Index keys both implementations take: one sliced dim, step 1."""
    out = [(), (slice(None),), Ellipsis]
    for d, size in enumerate(shape):
        lead = (slice(None),) * d
        for a, b in [(0, size), (1, size), (0, 1), (size // 3, 2 * size // 3 + 1), (size, size),
                     (2, 100), (-2, None), (None, -1)]:
            out.append(lead + (slice(a, b),))
        out.append((Ellipsis, slice(1, 3)) if d == len(shape) - 1 else lead + (slice(1, 3), Ellipsis))
        if size:
            out.append(lead + (size - 1,))
            out.append(lead + (-1,))
    return out


def same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
    flat = lambda x: x.reshape(-1).contiguous().view(torch.uint8)  # noqa: E731 - bit-exact
    assert torch.equal(flat(a), flat(b))


def chunk_of(t, n, dim, rank):
    """torch.chunk(t, n, dim)[rank], or the empty slice at the end for a rank
    past the chunks torch.chunk makes (it may make fewer than n)."""
    chunks = torch.chunk(t, n, dim) if t.shape[dim] else ()
    return chunks[rank] if rank < len(chunks) else t.narrow(dim, t.shape[dim], 0)


@pytest.fixture()
def st_file(tmp_path):
    path = tmp_path / "m.safetensors"
    tensors = model()
    safetensors.torch.save_file(tensors, str(path))  # theirs: no CRCs
    return path, tensors


def test_get_slice_matches_safetensors(st_file):
    path, tensors = st_file
    with st_safe_open(str(path), framework="pt") as theirs, ct.safe_open(path) as ours:
        for name, t in tensors.items():
            a, b = theirs.get_slice(name), ours.get_slice(name)
            assert a.get_shape() == b.get_shape() == list(t.shape)
            assert a.get_dtype() == b.get_dtype()
            assert b.shape == t.shape and b.dtype == t.dtype
            for key in keys_for(t.shape):
                got = b[key]
                same(got, t[key])
                if t.dtype != torch.bool or t[key].numel():
                    same(got, a[key])


def test_only_the_whole_tensor_is_verified(tmp_path):
    t = torch.arange(64 * 32, dtype=torch.float32).reshape(64, 32)
    path = tmp_path / "crc.safetensors"
    ct.save_file({"w": t}, path)  # ours: with CRCs
    with ct.safe_open(path) as f:
        s = f.get_slice("w")
        assert s.verified is None
        same(s[:], t)
        assert s.verified is True
        same(s[:, 3:9], t[:, 3:9])
        assert s.verified is False
        assert s.bytes_read == 64 * 6 * 4, "reads only the slice"
    # A flipped byte in row 40: whole loads fail, slices that skip it load.
    raw = bytearray(path.read_bytes())
    with ct.safe_open(path) as f:
        off = len(raw) - 64 * 32 * 4
    raw[off + 40 * 32 * 4] ^= 0x40
    path.write_bytes(bytes(raw))
    with ct.safe_open(path) as f:
        s = f.get_slice("w")
        with pytest.raises(ckptio.CkptioError) as e:
            s[...]
        assert e.value.code == ckptio.E_CHECKSUM
        same(s[:40], t[:40])
        assert s.verified is False


def test_refusals_are_clear(st_file):
    path, _ = st_file
    with ct.safe_open(path) as f:
        s = f.get_slice("f16.3d")
        with pytest.raises(ValueError, match="step"):
            s[::2]
        with pytest.raises(ValueError, match="one dimension per read"):
            s[1:2, 3:4]
        with pytest.raises(ValueError, match="one dimension per read"):
            s[0, 0]
        with pytest.raises(IndexError, match="too many indices"):
            s[:, :, :, 1]
        with pytest.raises(IndexError, match="out of bounds"):
            s[3]
        with pytest.raises(IndexError, match="single ellipsis"):
            s[..., ...]
        with pytest.raises(TypeError, match="only integers"):
            s[1.5]
        with pytest.raises(ckptio.CkptioError) as e:
            f.get_slice("nope")
        assert e.value.code == ckptio.ERRORS["NOT_FOUND"]
    with pytest.raises(ValueError, match="closed"):
        s[0:1]


@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 7])
def test_plan_follows_torch_chunk(st_file, nranks):
    path, tensors = st_file
    raw = path.read_bytes()
    with ct.safe_open(path) as f:
        for name, t in tensors.items():
            s = f.get_slice(name)
            for dim in range(t.dim()):
                covered = []
                for rank in range(nranks):
                    start, stop, ranges = s.plan(dim, rank, nranks)
                    want = chunk_of(t, nranks, dim, rank)
                    assert stop - start == want.shape[dim], (name, dim, rank)
                    part = s[(slice(None),) * dim + (slice(start, stop),)]
                    same(part, want)
                    data = b"".join(raw[o:o + n] for _, o, n in ranges)
                    assert data == part.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()
                    covered += [(o, n) for _, o, n in ranges]
                covered.sort()
                assert sum(n for _, n in covered) == t.numel() * t.element_size()
                for (o1, n1), (o2, _) in zip(covered, covered[1:]):
                    assert o1 + n1 <= o2, "ranks' ranges overlap"


def test_torch_save_views(tmp_path):
    base = torch.randn(6, 8)
    tensors = {"base": base, "t": base.t(), "block": base[1:5, 2:5], "step": base[:, ::2],
               "bcast": base[0].expand(5, 8)}
    path = tmp_path / "views.pt"
    torch.save(tensors, path)
    with ct.safe_open(path) as f:
        for name, t in tensors.items():
            s = f.get_slice(name)
            for key in keys_for(t.shape):
                same(s[key], t[key])
            for dim in range(t.dim()):
                for rank in range(3):
                    start, stop, _ = s.plan(dim, rank, 3)
                    part = s[(slice(None),) * dim + (slice(start, stop),)]
                    same(part, chunk_of(t, 3, dim, rank))
