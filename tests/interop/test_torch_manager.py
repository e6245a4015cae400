"""ckptio.manager.CheckpointManager against the real torch: a training loop's
saves (single file and sharded) published one per step, keep_last /
keep_every, latest() and load_latest() into a module and into a dict, the
async handle's two points (the snapshot keeps the values of the save call),
a corrupt newest checkpoint skipped with a CheckpointWarning naming it, a
second saver refused, save errors raised, close waiting for the last save.
Run by ctest through run_pytest.sh (CKPTIO_PYTEST_NEEDS=torch)."""

import ctypes
import json
import os
import pathlib
import subprocess
import sys
import warnings

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
import ckptio  # noqa: E402
import ckptio.manager as cm  # noqa: E402
from ckptio.manager import CheckpointManager, CheckpointWarning  # noqa: E402


def model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def state(m):
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def steps_of(mgr):
    return [c.step for c in mgr.list()]


def test_training_loop_resume_into_module(tmp_path):
    d = tmp_path / "ckpts"
    net = model(0)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    saved = {}
    with CheckpointManager(d, keep_last=2) as mgr:
        assert mgr.latest() is None
        assert mgr.load_latest() == (None, None)
        for step in range(1, 6):
            loss = net(torch.randn(8, 16)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            h = mgr.save_async(net.state_dict(), step)
            h.wait_snapshot()
            saved[step] = state(net)
        # close() waits for (and publishes) the last save
    assert sorted(os.listdir(d)) == ["latest", "step-00000004", "step-00000005"]
    assert (d / "latest").read_text() == "step-00000005\n"

    fresh = model(1)
    mgr = CheckpointManager(d, keep_last=2)
    step, sd = mgr.load_latest(into=fresh)
    assert step == 5
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, saved[5][k]), k
        assert torch.equal(sd[k], saved[5][k]), k
    infos = mgr.list(verify=True)
    assert [(c.step, c.complete, c.verified, c.files) for c in infos] == [(4, True, True, 1),
                                                                         (5, True, True, 1)]
    assert infos[1].path == str(d / "step-00000005" / "model.safetensors")
    assert infos[1].bytes == os.path.getsize(infos[1].path)
    mgr.close()
    mgr.close()  # idempotent


def test_snapshot_keeps_values_of_the_call(tmp_path):
    t = torch.arange(1 << 16, dtype=torch.float32)
    want = t.clone()
    with CheckpointManager(tmp_path / "c") as mgr:
        h = mgr.save_async({"t": t}, 7)
        h.wait_snapshot()
        t.add_(1)  # after the snapshot point: must not reach the file
        h.wait_durable()
        assert h.done()
        step, sd = mgr.load_latest()
    assert step == 7 and torch.equal(sd["t"], want)


def test_sharded_keep_every_and_dict_target(tmp_path):
    d = tmp_path / "s"
    tensors = {f"w{i}": torch.full((1024,), float(i)) for i in range(6)}
    with CheckpointManager(d, keep_last=1, keep_every=3, max_shard_size="8KiB") as mgr:
        for step in range(1, 8):
            mgr.save({k: v + step for k, v in tensors.items()}, step)
        assert steps_of(mgr) == [3, 6, 7]
        c = mgr.list()[-1]
        assert c.path.endswith("model.safetensors.index.json") and c.files > 2
        into = {k: torch.zeros(1024) for k in tensors}
        step, _ = mgr.load_latest(into=into)
        assert step == 7
        assert all(torch.equal(into[k], v + 7) for k, v in tensors.items())
        with pytest.raises(KeyError):
            mgr.load_latest(into={"other": torch.zeros(1)})


def test_corrupt_newest_is_skipped_with_warning(tmp_path):
    d = tmp_path / "c"
    with CheckpointManager(d, keep_last=3, verify=True) as mgr:
        mgr.save({"a": torch.ones(4096)}, 1)
        mgr.save({"a": torch.ones(4096) * 2}, 2)
        f = d / "step-00000002" / "model.safetensors"
        b = bytearray(f.read_bytes())
        b[-3] ^= 0x10
        f.write_bytes(bytes(b))
        with pytest.warns(CheckpointWarning, match="step-00000002"):
            step, sd = mgr.load_latest()
        assert step == 1 and torch.equal(sd["a"], torch.ones(4096))
        infos = mgr.list(verify=True)
        assert infos[1].complete and not infos[1].verified and "a" in infos[1].error
    # Without verify the structural check accepts it, and the stale record
    # case (a record naming an older step) warns and scans.
    (d / "latest").write_text("step-00000001\n")
    with CheckpointManager(d) as mgr, warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert mgr.latest() == 2
        assert any("step-00000001" in str(x.message) for x in w)


def test_second_saver_refused_and_errors_raised(tmp_path):
    d = tmp_path / "c"
    a = CheckpointManager(d)
    b = CheckpointManager(d)
    h = a.save_async({"x": torch.ones(1 << 20)}, 1)
    # a's save holds the directory until its handle is closed
    with pytest.raises(ckptio.CkptioError, match="lock"):
        b.save({"x": torch.ones(4)}, 2)
    h.wait_durable()
    b.save({"x": torch.ones(4)}, 2)
    with pytest.raises(TypeError):
        a.save({"x": [1, 2]}, 3)
    with pytest.raises(ValueError):
        a.save({"x": torch.ones(1)}, -1)
    a.close()
    b.close()
    assert steps_of(CheckpointManager(d)) == [1, 2]
    assert not [n for n in os.listdir(d) if n.startswith(".ckptio-mgr-")]
    with pytest.raises(ValueError):
        CheckpointManager(d, keep_last=0)
    with pytest.raises(ckptio.CkptioError, match="safetensors only"):
        CheckpointManager(d, format="pt", max_shard_size="1MB")


def test_pt_format(tmp_path):
    with CheckpointManager(tmp_path / "p", format="pt") as mgr:
        mgr.save({"x": torch.arange(10)}, 3)
        assert mgr.list()[0].path.endswith("model.pt")
        loaded = torch.load(mgr.latest_path()[1], weights_only=True)
        assert torch.equal(loaded["x"], torch.arange(10))


def test_binding_matches_header_layout():
    # tests/interop/abi_layout.c prints the header's layouts as the compiler sees them.
    exe = os.environ.get("CKPTIO_ABI_LAYOUT")
    if not exe:
        pytest.skip("CKPTIO_ABI_LAYOUT not set: run through ctest")
    layout = json.loads(subprocess.run([exe], check=True, capture_output=True, text=True).stdout)
    for cname, cls in {"ckptio_manager_options": ckptio._lib.ManagerOptions,
                       "ckptio_checkpoint_info": ckptio._lib.CheckpointInfo_}.items():
        assert ctypes.sizeof(cls) == layout["sizeof"][cname], cname
        c_fields = {k.split(".", 1)[1]: v for k, v in layout["fields"].items()
                    if k.startswith(cname + ".")}
        assert [f[0] for f in cls._fields_] == list(c_fields), cname
        for name, (offset, size) in c_fields.items():
            field = getattr(cls, name)
            assert (field.offset, field.size) == (offset, size), f"{cname}.{name}"
