"""ckptio.torch and ckptio.numpy against the real safetensors.torch and
safetensors.numpy: every public function of safetensors' modules exists in
ckptio's with the same parameter names, kinds and defaults (ckptio's extras
keyword-only), and the same calls on both give the same results: bytes from
save read by the other's load, files from save_file read by the other's
load_file and safe_open (keys, offset_keys, metadata, get_tensor,
get_tensors, get_slice), save_model / load_model with tied weights,
storage_ptr / storage_size."""

import inspect
import json
import os
import re
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="ckptio.torch's half needs torch in the venv")
import safetensors  # noqa: E402
import safetensors.numpy as sn  # noqa: E402
import safetensors.torch as st  # noqa: E402

import ckptio  # noqa: E402
import ckptio.numpy as cn  # noqa: E402
import ckptio.torch as ct  # noqa: E402
import library_version  # noqa: E402 - tests/interop's own

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


def without_ckptio_keys(meta):
    """A file's metadata as safetensors shows it, less what ckptio's
    metadata() hides: its CRCs and the version of the writer."""
    return {k: v for k, v in meta.items() if not k.startswith("ckptio.crc32.") and k != "ckptio.version"}


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
        else:  # safetensors also shows ckptio's own keys (CRCs, version), which ckptio hides
            assert without_ckptio_keys(mb) == ma
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
    assert_same_torch(ct.load_file(tmp_path / "m.pt", backend="pread"), t)


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
        assert without_ckptio_keys(mb) == ma
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
    """The versions a run was judged against, checked: ckptio.__version__
    is the loaded library's, which is this tree's (library_version), and
    every version is a well-formed release number."""
    text = library_version.checked_library_version()
    assert ckptio.__version__ == ckptio.version() == text
    for name, v in (("safetensors", safetensors.__version__), ("torch", torch.__version__),
                    ("numpy", np.__version__), ("ckptio", ckptio.__version__)):
        assert re.fullmatch(r"[0-9]+\.[0-9]+(\.[0-9]+)?([.+a-z0-9]*)", v), (name, v)
    print(f"safetensors {safetensors.__version__} torch {torch.__version__} "
          f"numpy {np.__version__} ckptio {ckptio.__version__} python {sys.version.split()[0]}")


# ------------------------------------------------- ckptio 1.1: as safetensors

def theirs_raises(call):
    """The exception safetensors' call raises (it must raise one)."""
    with pytest.raises(Exception) as info:
        call()
    return info.value


@pytest.mark.parametrize("call", ["save", "save_file"])
def test_torch_refuses_what_safetensors_refuses(tmp_path, call):
    """Non-contiguous tensors (ValueError) and tensors sharing memory
    (RuntimeError, checked first) are refused by save and save_file with
    safetensors' classes and advice; nothing is written."""
    base = torch.arange(16.0).reshape(4, 4)
    cases = {"non-contiguous": {"t": base.t()},
             "same tensor twice": {"a": base, "b": base},
             "overlapping views": {"a": base, "b": base[1:]},
             "shared and non-contiguous": {"a": base, "b": base.t()}}
    path = tmp_path / "m.safetensors"
    for what, tensors in cases.items():
        theirs = theirs_raises(lambda: getattr(st, call)(tensors, *([path] if call == "save_file" else [])))
        with pytest.raises(type(theirs)) as ours:
            getattr(ct, call)(tensors, *([path] if call == "save_file" else []))
        assert type(ours.value) is type(theirs), what
        if what != "shared and non-contiguous":   # (there safetensors fails in its own check, still a RuntimeError)
            advice = ".contiguous()" if isinstance(theirs, ValueError) else "save_model"
            assert advice in str(ours.value) and advice in str(theirs), (what, str(ours.value))
        assert not path.exists(), what
    # Views of distinct parts of one storage share no memory: both save them.
    parts = {"top": base[:2], "bottom": base[2:]}
    assert ct.save(parts) == st.save(parts)
    # ckptio's own calls save by value, as documented (README, "Differences").
    ct.save_file_async(cases["shared and non-contiguous"], path).wait_durable()
    assert torch.equal(ct.load_file(path)["b"], base.t())


def test_torch_not_a_tensor_is_safetensors_error_class(tmp_path):
    """A dict (or any non-tensor) where a tensor belongs: ValueError as in
    safetensors, and still the TypeError ckptio 1.0 raised (CkptioTypeError)."""
    for bad in ({"a": {"x": torch.ones(2)}}, {"a": [1, 2]}, {"a": torch.ones(3).to_sparse()}):
        theirs = theirs_raises(lambda: st.save(bad))
        assert isinstance(theirs, ValueError)
        for call in (lambda: ct.save(bad), lambda: ct.save_file(bad, tmp_path / "m.safetensors")):
            with pytest.raises(ValueError) as ours:
                call()
            assert isinstance(ours.value, TypeError) and isinstance(ours.value, ckptio.CkptioTypeError)
            assert "'a'" in str(ours.value)
    assert isinstance(theirs_raises(lambda: st.save([torch.ones(1)])), ValueError)
    with pytest.raises(ValueError):
        ct.save([torch.ones(1)])


def test_numpy_dict_value_is_refused_before_writing(tmp_path):
    """safetensors.numpy fails on a dict value with an AttributeError from
    its code; ckptio.numpy refuses it as ckptio.torch does (a documented
    difference: ckptio.numpy takes array-likes, np.asarray's input)."""
    assert isinstance(theirs_raises(lambda: sn.save({"a": {"x": np.ones(2)}})), AttributeError)
    with pytest.raises(ckptio.CkptioTypeError, match="'a'"):
        cn.save({"a": {"x": np.ones(2)}})
    assert cn.load(cn.save({"a": [1, 2]}))["a"].tolist() == [1, 2]


def all_torch_dtypes():
    """One tensor of every dtype both torch and safetensors have, float4
    included, named so that names and dtypes sort differently."""
    out = {}
    for k, dt in enumerate([*ct.TORCH_DTYPES.values(), getattr(torch, "float4_e2m1fn_x2", None)]):
        if dt is None:
            continue
        raw = torch.arange(6, dtype=torch.uint8).reshape(2, 3)
        out[f"{k % 5}_{str(dt).split('.')[-1]}"] = raw.view(dt) if torch.empty((), dtype=dt).element_size() == 1 \
            else torch.arange(6).reshape(2, 3).to(dt)
    return out


@pytest.mark.parametrize("meta", [None, {}, {"k": "v"}, {"ünï": "\n\t\"\\\x01\x7f ✓"}])
def test_save_bytes_are_safetensors_bytes(meta):
    """save() returns safetensors' very bytes for the same tensors and
    metadata: every dtype (their order in the file is by dtype, then name),
    0-d and empty tensors, metadata absent, empty or with JSON escapes."""
    t = dict(all_torch_dtypes(), **torch_tensors())
    assert ct.save(t, metadata=meta) == st.save(t, metadata=meta)
    if meta == {}:
        # No tensors and empty metadata: safetensors 0.8 writes a header that
        # is no JSON ('{},"__metadata__":{}}'); ckptio writes the valid one.
        theirs, ours = st.save({}, metadata=meta), ct.save({}, metadata=meta)
        with pytest.raises(ValueError):
            json.loads(theirs[8:])
        assert json.loads(ours[8:]) == {"__metadata__": {}} and len(ours) % 8 == 0
    else:
        assert ct.save({}, metadata=meta) == st.save({}, metadata=meta)
    a = numpy_arrays()
    a["be"] = np.arange(5, dtype=">i4")   # big-endian: stored little-endian by both
    assert cn.save(a, metadata=meta) == sn.save(a, metadata=meta)
    assert ckptio.save(a, metadata=meta) == sn.save(a, metadata=meta)


def test_save_bytes_with_several_metadata_keys():
    """safetensors keeps metadata in a hash map: with two keys or more its
    order changes from process to process. ckptio keeps the caller's; the
    bytes are the same but for that order."""
    t = torch_tensors()
    meta = {f"k{i}": str(i) for i in range(6)}
    ours, theirs = ct.save(t, metadata=meta), st.save(t, metadata=meta)
    assert len(ours) == len(theirs) and ours[:8] == theirs[:8]
    n = int.from_bytes(ours[:8], "little")
    assert ours[8 + n:] == theirs[8 + n:]
    assert json.loads(ours[8:8 + n]) == json.loads(theirs[8:8 + n])
    assert list(json.loads(ours[8:8 + n])["__metadata__"]) == list(meta)


def test_save_with_crc_or_pt_goes_through_the_library():
    t = {"x": torch.arange(4.0)}
    data = ct.save(t, crc=True)
    assert data != st.save(t)
    with ct.safe_open(ckptio._core.MemoryFile(data).path, "pt") as f:
        assert f.metadata() is None   # the CRC and version keys are ckptio's own
    assert_same_torch(ct.load(data), t)
    assert_same_torch(ct.load(ct.save(t, format="pt")), t)


def test_float4_saved_and_loaded_as_safetensors_does(tmp_path):
    if not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip("this torch has no float4_e2m1fn_x2")
    f4 = torch.arange(6, dtype=torch.uint8).reshape(2, 3).view(torch.float4_e2m1fn_x2)
    path = tmp_path / "f4.safetensors"
    ct.save_file({"w": f4}, path)
    with safetensors.safe_open(path, "pt") as theirs, ct.safe_open(path, "pt") as ours:
        assert theirs.get_slice("w").get_dtype() == "F4" and theirs.get_slice("w").get_shape() == [2, 6]
        a, b = ours.get_tensor("w"), theirs.get_tensor("w")
        assert a.dtype == b.dtype == f4.dtype and a.shape == b.shape == f4.shape
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    assert torch.equal(ct.load_file(path)["w"].view(torch.uint8), f4.view(torch.uint8))
    # 0-d: safetensors cannot place two values either.
    assert isinstance(theirs_raises(lambda: st.save({"x": f4[0, 0]})), safetensors.SafetensorError)
    with pytest.raises(ckptio.SafetensorError):
        ct.save({"x": f4[0, 0]})


def test_meta_tensors_refused_by_both():
    """The installed safetensors cannot save meta tensors (torch refuses to
    copy out of one); ckptio refuses them before writing (documented)."""
    m = {"x": torch.empty(3, device="meta")}
    assert isinstance(theirs_raises(lambda: st.save(m)), (NotImplementedError, RuntimeError))
    with pytest.raises(TypeError, match="meta"):
        ct.save(m)


@pytest.mark.parametrize("writer", ["ckptio", "safetensors"])
def test_numpy_metadata_none_like_safetensors(tmp_path, writer):
    """A file saved without metadata: metadata() is None on both fronts,
    ckptio's version entry hidden (load_metadata still shows it)."""
    path = tmp_path / "m.safetensors"
    (cn.save_file if writer == "ckptio" else sn.save_file)({"x": np.ones(2)}, path)
    with cn.safe_open(path, "numpy") as a, safetensors.safe_open(path, "numpy") as b, \
            ct.safe_open(path, "pt") as c:
        assert a.metadata() is None and c.metadata() is None
        assert b.metadata() is None if writer == "safetensors" else "ckptio.version" in b.metadata()
    if writer == "ckptio":
        assert cn.load_metadata(path) == {"ckptio.version": ckptio.__version__}


@pytest.mark.parametrize("framework,kind", [("pt", "torch"), ("torch", "torch"), ("pytorch", "torch"),
                                            ("np", "numpy"), ("numpy", "numpy")])
def test_top_level_safe_open_dispatches_on_framework(tmp_path, framework, kind):
    path = tmp_path / "m.safetensors"
    st.save_file({"x": torch.arange(3.0)}, path)
    with ckptio.safe_open(path, framework) as ours, safetensors.safe_open(path, framework) as theirs:
        a, b = ours.get_tensor("x"), theirs.get_tensor("x")
        assert type(a) is type(b) and isinstance(a, torch.Tensor if kind == "torch" else np.ndarray)
        assert a.tolist() == b.tolist()


def closed(opener, path):
    """A safe_open of `path` by `opener`, closed."""
    f = opener(path, "pt")
    f.__exit__(None, None, None)
    return f


def test_safetensor_error_catches_what_safetensors_raises_it_for(tmp_path):
    """ckptio.SafetensorError: raised where safetensors raises
    safetensors.SafetensorError (a bad header, a missing tensor, an invalid
    framework, a closed file), each still the ckptio class and builtin it was."""
    good = tmp_path / "m.safetensors"
    st.save_file({"x": torch.ones(2)}, good)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\xff" * 64)
    # what: (safetensors' call, ckptio's, the class ckptio raised before)
    calls = {"header": (lambda: st.load_file(junk), lambda: ct.load_file(junk), ckptio.FormatError),
             "missing tensor": (lambda: safetensors.safe_open(good, "pt").get_tensor("nope"),
                                lambda: ct.safe_open(good, "pt").get_tensor("nope"), KeyError),
             "framework": (lambda: safetensors.safe_open(good, "jaxx"), lambda: ckptio.safe_open(good, "jaxx"),
                           ValueError),
             "closed": (lambda: closed(safetensors.safe_open, good).keys(),
                        lambda: closed(ct.safe_open, good).keys(), ValueError)}
    for what, (theirs, ours, old) in calls.items():
        assert isinstance(theirs_raises(theirs), safetensors.SafetensorError), what
        with pytest.raises(ckptio.SafetensorError) as info:
            ours()
        assert isinstance(info.value, old) and isinstance(info.value, ckptio.CkptioError), what
    assert ckptio.SafetensorError is ckptio.CkptioSafetensorError is ckptio.errors.SafetensorError
    with pytest.raises(FileNotFoundError) as info:   # an OSError, as in safetensors
        ct.load_file(tmp_path / "nope")
    assert not isinstance(info.value, ckptio.SafetensorError)


def test_error_names_follow_one_rule():
    """Every class ckptio.errors defines is Ckptio<what>Error; the other
    public names are aliases of those classes (1.0's names, safetensors')."""
    names = [n for n in ckptio.errors.__all__ if n[0].isupper()]
    for name in names:
        cls = getattr(ckptio.errors, name)
        assert cls.__name__.startswith("Ckptio") and cls.__name__.endswith("Error"), name
        assert getattr(ckptio, name) is cls, name
    aliases = {n: getattr(ckptio.errors, n).__name__ for n in names if getattr(ckptio.errors, n).__name__ != n}
    assert aliases == {"SafetensorError": "CkptioSafetensorError", "TensorNotFoundError": "CkptioTensorNotFoundError",
                       "FormatError": "CkptioFormatError", "ChecksumError": "CkptioChecksumError"}


@pytest.mark.parametrize("module", [cn, ct], ids=["numpy", "torch"])
def test_load_file_mmap_keyword_is_deprecated(tmp_path, module):
    path = tmp_path / "m.safetensors"
    st.save_file({"x": torch.arange(4.0)}, path)
    with pytest.warns(DeprecationWarning, match="backend=") as caught:
        old = module.load_file(path, mmap=False)
    assert caught[0].filename == __file__   # points at the caller's line
    new = module.load_file(path, backend="pread")
    assert old["x"].tolist() == new["x"].tolist()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module.load_file(path, backend="mmap")
