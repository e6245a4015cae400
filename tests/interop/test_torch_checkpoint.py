"""ckptio.torch.save_checkpoint / load_checkpoint against the real torch:
nested training state (model, optimizer, scheduler, scaler, RNG states)
round-trips through both formats into equal structures (torch's own
comparison, and type for type), torch.load(weights_only=True) reads the .pt
files, torch.save's own files load, shared storages stay shared, views stay
views, a selected part reads only its tensors, async saves keep their
snapshot, and bad structures, hostile pickles and damaged bytes are refused
before anything is written or loaded.
Needs torch: ctest runs it with CKPTIO_PYTEST_NEEDS=torch (skips loudly)."""

import collections
import json
import os
import pathlib
import pickle
import random
import struct
import sys
import zipfile

import numpy as np
import pytest
import torch
from safetensors import safe_open as st_safe_open

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
import ckptio  # noqa: E402
import ckptio.torch as ct  # noqa: E402

FORMATS = ["pt", "safetensors"]
NUMPY_GLOBALS = [np._core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype("uint32"))]


def assert_same(a, b, where="obj"):
    """Equal values of identical types all the way down (tuples stay tuples,
    OrderedDicts stay OrderedDicts), tensors bit for bit with their dtype,
    shape, device and class."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device, where
        assert a.requires_grad == b.requires_grad, where
        assert torch.equal(a.detach().cpu(), b.detach().cpu()), where
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b), where
    elif isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and a != a:
        assert b != b, where
    else:
        assert a == b, where


def trained(model, opt, steps=3):
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 6)).square().mean().backward()
        opt.step() if not isinstance(opt, torch.optim.LBFGS) else opt.step(
            lambda: model(torch.randn(8, 6)).square().mean())


def zoo():
    """Real optimizer, scheduler and scaler states and RNG states."""
    torch.manual_seed(0)
    out = {}
    for name, make in [("sgd", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
                       ("adam", lambda p: torch.optim.Adam(p, lr=1e-3)),
                       ("adamw", lambda p: torch.optim.AdamW(p, lr=1e-3, betas=(0.8, 0.99))),
                       ("adagrad", lambda p: torch.optim.Adagrad(p)),
                       ("lbfgs", lambda p: torch.optim.LBFGS(p, history_size=3, max_iter=2))]:
        model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
        opt = make(model.parameters())
        trained(model, opt)
        out[name] = {"model": model.state_dict(), "optim": opt.state_dict()}
    opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=20)
    for _ in range(4):
        opt.step()
        sched.step()
    out["onecycle"] = sched.state_dict()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    out["scaler"] = scaler.state_dict()
    out["rng"] = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    out.update(epoch=3, name="run1", note=None, flag=True, lr=float("inf"), nan=float("nan"),
               raw=b"\x00\xffbytes", shape=torch.Size([2, 3]), dtype=torch.bfloat16,
               device=torch.device("cpu"), big=2 ** 80, pair=(1, "a"),
               od=collections.OrderedDict([("b", 1), ("a", 2)]), ints={0: "zero", 7: "seven"})
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_zoo_round_trip(tmp_path, fmt):
    obj = zoo()
    path = tmp_path / f"ckpt.{fmt}"
    ct.save_checkpoint(obj, path, format=fmt)
    back = ct.load_checkpoint(path)
    assert_same(obj, back)
    torch.testing.assert_close(back["adamw"], obj["adamw"])  # torch's own comparison
    # The states restore: an optimizer and a scheduler take them back.
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    model.load_state_dict(back["adamw"]["model"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.8, 0.99))
    opt.load_state_dict(back["adamw"]["optim"])
    assert opt.param_groups[0]["betas"] == (0.8, 0.99)
    np.random.set_state(back["rng"]["numpy"])
    a = np.random.rand(3)
    np.random.set_state(obj["rng"]["numpy"])
    assert np.array_equal(a, np.random.rand(3))
    random.setstate(back["rng"]["python"])


def test_pt_opens_in_torch_load_weights_only(tmp_path):
    obj = zoo()
    path = tmp_path / "ckpt.pt"
    ct.save_checkpoint(obj, path)
    with torch.serialization.safe_globals(NUMPY_GLOBALS):
        theirs = torch.load(path, weights_only=True)
    assert_same(obj, theirs)
    no_numpy = {k: v for k, v in obj.items() if k != "rng"}
    ct.save_checkpoint(no_numpy, tmp_path / "plain.pt")
    assert_same(no_numpy, torch.load(tmp_path / "plain.pt", weights_only=True))


def test_torch_save_files_load(tmp_path):
    obj = zoo()
    path = tmp_path / "theirs.pt"
    torch.save(obj, path)
    with torch.serialization.safe_globals(NUMPY_GLOBALS):
        expect = torch.load(path, weights_only=True)
    assert_same(expect, ct.load_checkpoint(path))
    assert_same(expect["adam"], ct.load_checkpoint(path, select="adam"))
    assert_same(expect, ct.load_checkpoint(path, mmap=True))


def test_shared_storages_and_views(tmp_path):
    """Tied weights (distinct tensors over one storage, as state_dict gives
    them), one tensor twice, and views: in .pt all stay shared as torch.load
    gives them; in safetensors one tensor twice stays one object."""
    lin = torch.nn.Linear(4, 4, bias=False)
    emb = torch.nn.Embedding(4, 4)
    emb.weight = lin.weight
    sd = torch.nn.ModuleDict({"emb": emb, "head": lin}).state_dict()
    w = torch.arange(12.0).reshape(3, 4)
    obj = {"sd": sd, "same": [w, w], "views": {"w": w, "t": w.t(), "row": w[1], "cols": w[:, 1:3]}}
    for fmt in FORMATS:
        path = tmp_path / f"s.{fmt}"
        ct.save_checkpoint(obj, path, format=fmt)
        back = ct.load_checkpoint(path)
        assert_same(obj, back)
        assert back["same"][0] is back["same"][1]
        if fmt == "pt":
            ptr = back["sd"]["emb.weight"].untyped_storage().data_ptr()
            assert back["sd"]["head.weight"].untyped_storage().data_ptr() == ptr
            v = back["views"]
            assert v["t"].untyped_storage().data_ptr() == v["w"].untyped_storage().data_ptr()
            assert v["t"].stride() == (1, 4) and v["cols"].stride() == (4, 1)
            v["w"][1, 2] = -1.0  # one storage: every view sees it
            assert v["row"][2] == -1.0 and v["t"][2, 1] == -1.0 and v["cols"][1, 1] == -1.0
    # Each storage is written once: the file holds w's 48 bytes once.
    with zipfile.ZipFile(tmp_path / "s.pt") as z:
        sizes = sorted(i.file_size for i in z.infolist() if "/data/" in i.filename)
    assert sizes == [48, 64]


def test_safetensors_readers_get_every_tensor(tmp_path):
    obj = zoo()["adamw"]
    path = tmp_path / "c.safetensors"
    ct.save_checkpoint(obj, path)  # the suffix picks the format
    with st_safe_open(str(path), framework="pt") as f:
        keys = set(f.keys())
        meta = f.metadata()
        assert torch.equal(f.get_tensor("optim.state.0.exp_avg"), obj["optim"]["state"][0]["exp_avg"])
    assert "model.0.weight" in keys and len(keys) == 4 + 4 * 3
    doc = json.loads(meta["checkpoint.structure"])
    assert doc["version"] == 1
    # A plain safetensors file (no structure) loads as its dict of tensors.
    ct.save_file({"a": torch.ones(2)}, tmp_path / "plain.safetensors")
    assert_same({"a": torch.ones(2)}, ct.load_checkpoint(tmp_path / "plain.safetensors"))


@pytest.mark.parametrize("fmt", FORMATS)
def test_select_reads_only_its_part(tmp_path, fmt):
    """A selected part loads although another part's bytes are damaged: only
    the selected tensors are read (and their CRCs checked)."""
    obj = {"model": {"w": torch.full((256,), 1.0)}, "optim": {"m": torch.full((256,), 7.0)}, "step": 9}
    path = tmp_path / f"c.{fmt}"
    ct.save_checkpoint(obj, path, format=fmt)
    data = bytearray(path.read_bytes())
    at = data.find(struct.pack("<f", 7.0) * 64)
    assert at > 0
    data[at + 5] ^= 0x40
    path.write_bytes(bytes(data))
    assert_same(obj["model"], ct.load_checkpoint(path, select="model"))
    assert ct.load_checkpoint(path, select="step") == 9
    assert torch.equal(ct.load_checkpoint(path, select=("model", "w")), obj["model"]["w"])
    with pytest.raises(ckptio.CkptioError, match="(?i)crc|checksum"):
        ct.load_checkpoint(path)
    with pytest.raises(KeyError, match="nope"):
        ct.load_checkpoint(path, select="nope")


@pytest.mark.parametrize("fmt", FORMATS)
def test_map_location_and_mmap(tmp_path, fmt):
    obj = {"w": torch.randn(4, 4), "n": [torch.arange(5)]}
    path = tmp_path / f"c.{fmt}"
    ct.save_checkpoint(obj, path, format=fmt)
    assert_same(obj, ct.load_checkpoint(path, map_location="cpu"))
    assert_same(obj, ct.load_checkpoint(path, map_location={"cpu": "cpu"}))
    assert_same(obj, ct.load_checkpoint(path, mmap=True))
    with pytest.raises(TypeError, match="map_location"):
        ct.load_checkpoint(path, map_location=3.5)


@pytest.mark.parametrize("fmt", FORMATS)
def test_async_keeps_its_snapshot(tmp_path, fmt):
    w = torch.randn(1 << 16)
    expect = w.clone()
    path = tmp_path / f"c.{fmt}"
    h = ct.save_checkpoint_async({"w": w, "step": 1}, path, format=fmt)
    h.wait_snapshot()
    w.add_(1.0)  # the loop goes on
    h.wait_durable()
    assert torch.equal(ct.load_checkpoint(path)["w"], expect)


@pytest.mark.parametrize("fmt", FORMATS)
def test_refused_before_anything_is_written(tmp_path, fmt):
    path = tmp_path / f"c.{fmt}"

    class Foo:
        pass

    bad = {"optim": {"param_groups": [{"lr": 1.0, "foo": Foo()}]}}
    with pytest.raises(TypeError, match=r"optim\.param_groups\[0\]\.foo"):
        ct.save_checkpoint(bad, path, format=fmt)
    loop = {"a": []}
    loop["a"].append(loop)
    with pytest.raises(ValueError, match=r"a\[0\].*contains itself"):
        ct.save_checkpoint(loop, path, format=fmt)
    deep = None
    for _ in range(1_000_000):
        deep = [deep]
    with pytest.raises(ValueError, match="nested deeper"):
        ct.save_checkpoint({"deep": deep}, path, format=fmt)
    with pytest.raises(TypeError, match="meta"):
        ct.save_checkpoint({"m": torch.empty(3, device="meta")}, path, format=fmt)
    with pytest.raises(TypeError, match="object"):
        ct.save_checkpoint({"o": np.array([1, "x"], dtype=object)}, path, format=fmt)
    assert not path.exists()
    assert os.listdir(tmp_path) == []


def test_hostile_pickles_are_refused(tmp_path):
    """A torch.save archive whose pickle calls os.system: refused naming the
    global, nothing run."""
    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path}/pwned",))

    path = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(2), "x": Evil()}, path)
    with pytest.raises(ckptio.CkptioError, match="system"):
        ct.load_checkpoint(path)
    assert not (tmp_path / "pwned").exists()
    # A pickle of a bare list nested 10,000 deep, built by hand.
    body = b"\x80\x02" + b"]" * 10000 + b"a" * 9999 + b"."
    with zipfile.ZipFile(tmp_path / "deep.pt", "w") as z:
        z.writestr("deep/data.pkl", body)
        z.writestr("deep/byteorder", "little")
    with pytest.raises(ckptio.CkptioError):
        ct.load_checkpoint(tmp_path / "deep.pt")


def test_lying_structure_is_refused(tmp_path):
    path = tmp_path / "c.safetensors"
    ct.save_file({"w": torch.ones(2)}, path,
                 metadata={"checkpoint.structure": json.dumps({"version": 1, "root": {"tensor": "nope"}})})
    with pytest.raises(ckptio.CkptioError, match="nope"):
        ct.load_checkpoint(path)
    ct.save_file({"w": torch.ones(2)}, path, metadata={"checkpoint.structure": "{not json"})
    with pytest.raises(ckptio.CkptioError, match="not JSON"):
        ct.load_checkpoint(path)
    ct.save_file({"w": torch.ones(2)}, path,
                 metadata={"checkpoint.structure": json.dumps({"version": 1, "root": {"weird": 1}})})
    with pytest.raises(ckptio.CkptioError, match="weird"):
        ct.load_checkpoint(path)


def test_prepare_makes_the_context_before_the_first_save(tmp_path):
    """ckptio.prepare(): the context (and its snapshot memory) now; configure
    refuses afterwards, and an async save then snapshots and commits."""
    import subprocess
    code = f"""
import ckptio, ckptio.torch as ct, torch, time
ckptio.configure(snapshot_bytes=64 << 20)
ckptio.prepare()
try:
    ckptio.configure(threads=2)
    raise SystemExit("configure after prepare did not raise")
except ckptio.CkptioRuntimeError:
    pass
w = torch.randn(1 << 22)
h = ct.save_checkpoint_async({{"w": w}}, {str(tmp_path / "p.pt")!r})
h.wait_snapshot()
expect = w.clone()
w.zero_()
h.wait_durable()
assert torch.equal(ct.load_checkpoint({str(tmp_path / "p.pt")!r})["w"], expect)
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr
