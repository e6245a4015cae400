"""ckptio.torch and ckptio.numpy against the real safetensors.torch and
safetensors.numpy: every public function of safetensors' modules exists in
ckptio's with the same parameter names, kinds and defaults (ckptio's extras
keyword-only), and the same calls on both give the same results: bytes from
save read by the other's load, files from save_file read by the other's
load_file and safe_open (keys, offset_keys, metadata, get_tensor,
get_tensors, get_slice), save_model / load_model with tied weights,
storage_ptr / storage_size."""

import inspect
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="ckptio.torch's half needs torch in the venv")
import safetensors  # noqa: E402
import safetensors.numpy as sn  # noqa: E402
import safetensors.torch as st  # noqa: E402

import ckptio  # noqa: E402
import ckptio.numpy as cn  # noqa: E402
import ckptio.torch as ct  # noqa: E402

PAIRS = [(st, ct), (sn, cn)]


def public_functions(mod):
    """safetensors' public API of a module: its own functions, and safe_open."""
    names = sorted(n for n, f in vars(mod).items()
                   if not n.startswith("_") and inspect.isfunction(f)
                   and f.__module__ == mod.__name__)
    return names + ["safe_open"]


def params(obj):
    return list(inspect.signature(obj).parameters.values())


@pytest.mark.parametrize("theirs,ours", PAIRS, ids=["torch", "numpy"])
def test_same_functions_and_parameters(theirs, ours):
    names = public_functions(theirs)
    assert {"save", "save_file", "load", "load_file", "safe_open"} <= set(names), names
    for name in names:
        assert hasattr(ours, name), f"{ours.__name__} lacks {name}"
        want, have = params(getattr(theirs, name)), params(getattr(ours, name))
        if name == "safe_open":
            want = [p for p in want if p.name != "self"]
            have = [p for p in have if p.name != "self"]
        assert [p.name for p in have[:len(want)]] == [p.name for p in want], (name, have, want)
        for w, h in zip(want, have):
            assert h.kind == w.kind, (name, w, h)
            if w.default is inspect.Parameter.empty:
                # ckptio may default what safetensors requires (safe_open's
                # framework): every call written for safetensors still works.
                continue
            assert h.default is not inspect.Parameter.empty, (name, w, h)
            if w.name == "backend" and w.default == "mmap":
                # ckptio's default "auto" maps a resident file as "mmap" does
                # and copies a cold one (faster: O_DIRECT beats the page
                # cache's fill); the values are the same either way.
                assert h.default == "auto", (name, w, h)
            elif w.default is not Ellipsis:  # (a compiled signature that hides it)
                assert h.default == w.default, (name, w, h)
        if name == "safe_open":
            # safe_open(filename, framework, device="cpu", *, backend="mmap"),
            # whose backend default ckptio's "auto" replaces (above)
            assert inspect.signature(ours.safe_open).parameters["device"].default == "cpu"
            assert inspect.signature(ours.safe_open).parameters["backend"].default == "auto"
        for extra in have[len(want):]:
            assert extra.kind == inspect.Parameter.KEYWORD_ONLY, (name, extra)
            assert extra.default is not inspect.Parameter.empty, (name, extra)
    methods = [m for m in dir(safetensors.safe_open) if not m.startswith("_")]
    assert methods, "safetensors.safe_open has no public methods?"
    for m in methods + ["__enter__", "__exit__"]:
        assert callable(getattr(ours.safe_open, m, None)), f"{ours.__name__}.safe_open lacks {m}"


# ------------------------------------------------------------------ torch

def torch_tensors():
    g = torch.Generator().manual_seed(30)
    return {"w": torch.randn(6, 5, generator=g), "b": torch.arange(-3, 4, dtype=torch.int64),
            "h": torch.randn(4, 3, generator=g).to(torch.bfloat16),
            "f16": torch.randn(7, generator=g).to(torch.float16),
            "mask": torch.tensor([True, False, True]), "u": torch.arange(9, dtype=torch.uint8),
            "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3)}


def assert_same_torch(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), k


META = {"epoch": "3", "note": "ckptio vs safetensors"}


def test_torch_save_bytes_both_ways():
    t = torch_tensors()
    ours = ct.save(t, metadata=META)
    theirs = st.save(t, metadata=META)
    assert isinstance(ours, bytes) and isinstance(theirs, bytes)
    assert_same_torch(st.load(ours), t)
    assert_same_torch(ct.load(theirs), t)
    assert_same_torch(ct.load(ours), st.load(theirs))
    for k, v in ct.load(theirs).items():
        assert v.device.type == "cpu", k


@pytest.mark.parametrize("writer", ["ckptio", "safetensors"])
def test_torch_files_read_by_both(tmp_path, writer):
    t = torch_tensors()
    path = tmp_path / "m.safetensors"
    save = ct.save_file if writer == "ckptio" else st.save_file
    assert save(t, path, metadata=META) is None
    for backend in ("mmap", "pread"):
        assert_same_torch(ct.load_file(path, backend=backend), t)
        assert_same_torch(st.load_file(path, backend=backend), t)
    assert_same_torch(ct.load_file(str(path), "cpu"), st.load_file(str(path), "cpu"))
    with ct.safe_open(path, framework="pt", device="cpu") as a, \
         safetensors.safe_open(path, framework="pt", device="cpu") as b:
        assert a.keys() == b.keys() and isinstance(a.keys(), list)
        assert a.offset_keys() == b.offset_keys()
        ma, mb = a.metadata(), b.metadata()
        if writer == "safetensors":
            assert ma == mb
        else:  # safetensors also shows ckptio's CRC keys, which ckptio hides
            assert {k: v for k, v in mb.items() if not k.startswith("ckptio.crc32.")} == ma
        assert {k: ma[k] for k in META} == META
        for name in a.keys():
            assert torch.equal(a.get_tensor(name), b.get_tensor(name)), name
        assert_same_torch(a.get_tensors(), b.get_tensors())
        assert list(a.get_tensors()) == list(b.get_tensors())
        sa, sb = a.get_slice("w"), b.get_slice("w")
        assert sa.get_shape() == sb.get_shape() and sa.get_dtype() == sb.get_dtype()
        assert torch.equal(sa[:, 1:3], sb[:, 1:3])
        assert torch.equal(sa[2:5], sb[2:5])
        with pytest.raises(KeyError):
            a.get_tensor("nope")
        with pytest.raises(Exception):
            b.get_tensor("nope")


def test_torch_metadata_none_like_safetensors(tmp_path):
    path = tmp_path / "m.safetensors"
    st.save_file({"x": torch.ones(2)}, path)
    with ct.safe_open(path, "pt") as a, safetensors.safe_open(path, "pt") as b:
        assert a.metadata() is None and b.metadata() is None


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight      # tied, as language models do
        self.norm = torch.nn.LayerNorm(4)


@pytest.mark.parametrize("writer,reader", [(st, ct), (ct, st), (ct, ct)],
                         ids=["st-to-ckptio", "ckptio-to-st", "ckptio"])
def test_save_model_load_model_tied(tmp_path, writer, reader):
    torch.manual_seed(1)
    src = Tied()
    path = tmp_path / "model.safetensors"
    assert writer.save_model(src, path, metadata={"k": "v"}) is None
    names = set(st.load_file(path))
    assert names == {"embed.weight", "norm.weight", "norm.bias"}, names   # head.weight dropped
    with safetensors.safe_open(path, "pt") as f:
        assert f.metadata()["head.weight"] == "embed.weight" and f.metadata()["k"] == "v"
    torch.manual_seed(2)
    dst = Tied()
    result = reader.load_model(dst, path)
    assert isinstance(result, tuple) and len(result) == 2
    missing, unexpected = result
    assert sorted(missing) == [] and list(unexpected) == []
    for name, value in src.state_dict().items():
        assert torch.equal(dst.state_dict()[name], value), name
    # strict: a model with a parameter the file lacks raises, as torch does.
    dst.extra = torch.nn.Parameter(torch.zeros(1))
    with pytest.raises(RuntimeError, match="extra"):
        reader.load_model(dst, path)
    missing, unexpected = reader.load_model(dst, path, strict=False)
    assert sorted(missing) == ["extra"] and list(unexpected) == []
    ours = ct.load_model(dst, path, strict=False)
    theirs = st.load_model(dst, path, strict=False)
    assert (sorted(ours[0]), sorted(ours[1])) == (sorted(theirs[0]), sorted(theirs[1]))


def test_storage_ptr_and_size():
    base = torch.zeros(10, 10)
    for t in (base, base[2:], base.t(), torch.ones(3, dtype=torch.float16), torch.zeros(0)):
        assert ct.storage_ptr(t) == st.storage_ptr(t)
        assert ct.storage_size(t) == st.storage_size(t)
    assert ct.storage_ptr(base[3:]) == ct.storage_ptr(base)


def test_torch_extras_are_keyword_only(tmp_path):
    t = {"x": torch.arange(5)}
    with pytest.raises(TypeError):
        ct.save_file(t, tmp_path / "m.pt", None, "pt")   # format must be named
    ct.save_file(t, tmp_path / "m.pt", format="pt", crc=False)
    assert torch.equal(torch.load(tmp_path / "m.pt", weights_only=True)["x"], t["x"])
    assert_same_torch(ct.load_file(tmp_path / "m.pt", mmap=False), t)


# ------------------------------------------------------------------ numpy

def numpy_arrays():
    rng = np.random.default_rng(30)
    return {"w": rng.standard_normal((6, 5)).astype(np.float32),
            "b": np.arange(-3, 4, dtype=np.int64), "h": rng.standard_normal(7).astype(np.float16),
            "mask": np.array([True, False, True]), "u": np.arange(9, dtype=np.uint8),
            "d": rng.standard_normal((2, 2)), "scalar": np.array(2.5, np.float32)}


def assert_same_numpy(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert isinstance(a[k], np.ndarray) and isinstance(b[k], np.ndarray), k
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert np.array_equal(a[k], b[k]), k


def test_numpy_save_bytes_both_ways():
    t = numpy_arrays()
    ours, theirs = cn.save(t, metadata=META), sn.save(t, metadata=META)
    assert isinstance(ours, bytes) and isinstance(theirs, bytes)
    assert_same_numpy(sn.load(ours), t)
    assert_same_numpy(cn.load(theirs), t)
    assert_same_numpy(ckptio.load(theirs), t)   # the package's own names are numpy's


@pytest.mark.parametrize("writer", ["ckptio", "safetensors"])
def test_numpy_files_read_by_both(tmp_path, writer):
    t = numpy_arrays()
    path = tmp_path / "m.safetensors"
    save = cn.save_file if writer == "ckptio" else sn.save_file
    assert save(t, filename=path, metadata=META) is None     # keyword names as safetensors'
    assert_same_numpy(cn.load_file(filename=path), t)
    assert_same_numpy(sn.load_file(path), t)
    assert_same_numpy(cn.load_file(path, backend="pread"), sn.load_file(path, backend="pread"))
    with cn.safe_open(path, framework="numpy") as a, \
         safetensors.safe_open(path, framework="numpy") as b:
        assert a.keys() == b.keys()
        assert a.offset_keys() == b.offset_keys()
        ma, mb = a.metadata(), b.metadata()
        assert {k: v for k, v in mb.items() if not k.startswith("ckptio.crc32.")} == ma
        for name in a.keys():
            assert np.array_equal(a.get_tensor(name), b.get_tensor(name)), name
        assert_same_numpy(a.get_tensors(), b.get_tensors())
        sa, sb = a.get_slice("w"), b.get_slice("w")
        assert sa.get_shape() == sb.get_shape() and sa.get_dtype() == sb.get_dtype()
        assert np.array_equal(sa[1:4], sb[1:4])
        with pytest.raises(KeyError):
            a.get_tensor("nope")


NUMPY_KEYS = [np.s_[1:4], np.s_[:, 2:4], np.s_[2], np.s_[..., 1], np.s_[-1], np.s_[:],
              np.s_[...], np.s_[4:1], np.s_[1:3, 2], np.s_[::2], np.s_[[0, 2]], np.s_[:, -2:]]


@pytest.mark.parametrize("writer", ["ckptio", "safetensors"])
def test_numpy_get_slice_keys(tmp_path, writer):
    """get_slice(name)[key] against safetensors' where it answers, and
    against numpy's own indexing of the whole array for every key (ckptio
    reads one-dimension keys from the file, others through the whole)."""
    t = {"w": np.arange(6 * 5, dtype=np.float32).reshape(6, 5)}
    path = tmp_path / "m.safetensors"
    (cn.save_file if writer == "ckptio" else sn.save_file)(t, path)
    with cn.safe_open(path, framework="numpy") as a, \
         safetensors.safe_open(path, framework="numpy") as b:
        sa, sb = a.get_slice("w"), b.get_slice("w")
        compared = 0
        for key in NUMPY_KEYS:
            ours = sa[key]
            want = t["w"][key]
            assert ours.dtype == want.dtype and ours.shape == want.shape, key
            assert np.array_equal(ours, want), key
            try:
                theirs = sb[key]
            except Exception:  # noqa: BLE001 - keys safetensors does not take
                continue
            assert np.array_equal(ours, theirs) and ours.shape == theirs.shape, key
            compared += 1
        assert compared >= 6, compared
        # One-dimension keys read part of the file: no CRC over a part.
        sa[1:4]
        assert sa.verified is False
        sa[:]
        assert sa.verified is (writer == "ckptio")   # only ckptio's file has CRCs


def test_numpy_keyword_names_match(tmp_path):
    """Keyword calls written for safetensors.numpy run unchanged on ckptio."""
    t = numpy_arrays()
    for mod in (sn, cn):
        path = tmp_path / f"{mod.__name__}.safetensors"
        mod.save_file(tensor_dict=t, filename=path, metadata=None)
        assert_same_numpy(mod.load_file(filename=path), t)
        assert_same_numpy(mod.load(data=mod.save(tensor_dict=t, metadata=None)), t)


def test_versions_reported():
    lib = ckptio._lib.lib()  # the library's string says its number (major*10000 + minor*100 + patch)
    number = int(lib.ckptio_version_number())
    assert lib.ckptio_version_string().decode() == f"{number // 10000}.{number // 100 % 100}.{number % 100}"
    print(f"safetensors {safetensors.__version__} torch {torch.__version__} "
          f"numpy {np.__version__} ckptio {ckptio.version()} python {sys.version.split()[0]}")
