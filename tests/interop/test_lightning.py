"""ckptio.lightning under the real Lightning (scripts/setup.sh installs it):
a Trainer.fit that saves through ckptio's CheckpointIO, then a fresh Trainer
resuming from that file, ends with weights bit for bit equal to an
uninterrupted run of the same length; the same with ckptio's
AsyncCheckpointIO and with Lightning's own AsyncCheckpointIO wrapped around
ckptio's. Tiny model, CPU, a few steps."""

import argparse
import os
import warnings

import pytest

pl = pytest.importorskip("lightning.pytorch", reason="lightning is not installed: run scripts/setup.sh")
import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import ckptio.torch as ct  # noqa: E402
from ckptio.lightning import AsyncCheckpointIO, CheckpointIO  # noqa: E402
from lightning.pytorch.plugins.io import AsyncCheckpointIO as LightningAsync  # noqa: E402

EPOCHS = 4
STEPS_PER_EPOCH = 6

warnings.filterwarnings("ignore", module="lightning")


class Net(pl.LightningModule):
    def __init__(self, lr: float = 0.05, extra=None):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def data():
    g = torch.Generator().manual_seed(1)
    ds = TensorDataset(torch.randn(4 * STEPS_PER_EPOCH, 4, generator=g), torch.randn(4 * STEPS_PER_EPOCH, 2, generator=g))
    return DataLoader(ds, batch_size=4, shuffle=False)


def model(**kw):
    torch.manual_seed(0)
    return Net(**kw)


def trainer(root, epochs, plugins=None, checkpointing=True):
    return pl.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, deterministic=True,
                      enable_checkpointing=checkpointing, default_root_dir=str(root), plugins=plugins)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    m = model()
    trainer(tmp_path_factory.mktemp("ref"), EPOCHS, checkpointing=False).fit(m, data())
    return {k: v.clone() for k, v in m.state_dict().items()}


PLUGINS = {
    "sync": lambda: CheckpointIO(),
    "ckptio_async": lambda: AsyncCheckpointIO(),
    "lightning_async": lambda: LightningAsync(CheckpointIO()),
}


@pytest.mark.parametrize("kind", sorted(PLUGINS))
def test_resume_is_bit_exact(tmp_path, uninterrupted, kind):
    first = model()
    t1 = trainer(tmp_path / "a", EPOCHS // 2, plugins=[PLUGINS[kind]()])
    t1.fit(first, data())
    ckpts = sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir())
    last = f"epoch={EPOCHS // 2 - 1}-step={EPOCHS // 2 * STEPS_PER_EPOCH}.ckpt"
    if kind == "lightning_async":
        # Lightning's wrapper queues the save in a thread but removes the
        # previous file at once: the remove can run before the queued save
        # of that file has created it, which then stays. Lightning's race,
        # not ours: only the newest file is certain.
        assert last in ckpts
    else:
        # ModelCheckpoint kept the last epoch's file only: the first one went
        # through remove_checkpoint, which waited for its save.
        assert ckpts == [last]
    path = str(tmp_path / "a" / "checkpoints" / last)

    saved = ct.load_checkpoint(path)
    assert saved["global_step"] == EPOCHS // 2 * STEPS_PER_EPOCH
    for k, v in first.state_dict().items():
        assert torch.equal(saved["state_dict"][k], v)
    # The file is torch.save's archive: torch.load reads it, with weights_only too.
    theirs = torch.load(path, weights_only=True)
    assert theirs.keys() == saved.keys()
    assert torch.equal(theirs["optimizer_states"][0]["state"][0]["exp_avg"],
                       saved["optimizer_states"][0]["state"][0]["exp_avg"])

    resumed = model()
    with torch.no_grad():  # the checkpoint must bring the weights, not the seed
        for p in resumed.parameters():
            p.add_(1.0)
    t2 = trainer(tmp_path / "b", EPOCHS, plugins=[PLUGINS[kind]()])
    t2.fit(resumed, data(), ckpt_path=path)
    assert t2.global_step == EPOCHS * STEPS_PER_EPOCH
    state = resumed.state_dict()
    assert state.keys() == uninterrupted.keys()
    for k in state:
        assert torch.equal(state[k], uninterrupted[k]), k


def test_async_save_returns_before_durable_and_waits_on_teardown(tmp_path):
    io = AsyncCheckpointIO()
    big = {"state_dict": {"w": torch.randn(1 << 20)}, "global_step": 3}
    expect = big["state_dict"]["w"].clone()
    path = tmp_path / "x" / "a.ckpt"
    io.save_checkpoint(big, path)
    big["state_dict"]["w"].zero_()  # after the snapshot: the file keeps the old values
    io.teardown()
    got = io.load_checkpoint(path)
    assert torch.equal(got["state_dict"]["w"], expect) and got["global_step"] == 3
    io.remove_checkpoint(path)
    assert not path.exists()


def test_hyper_parameters_outside_the_allowlist_are_refused(tmp_path):
    m = model(extra=argparse.Namespace(depth=3))
    t = pl.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                   enable_model_summary=False, enable_checkpointing=False, default_root_dir=str(tmp_path),
                   plugins=[CheckpointIO()])
    t.fit(m, data())
    path = tmp_path / "h.ckpt"
    with pytest.raises(TypeError, match=r"hyper_parameters\.extra.*Namespace"):
        t.save_checkpoint(path)
    assert not path.exists() and os.listdir(tmp_path) == []


def test_storage_options_and_safetensors(tmp_path):
    io = CheckpointIO()
    ck = {"state_dict": {"w": torch.arange(6.0)}, "epoch": 1, "hyper_parameters": {"lr": 0.1}}
    io.save_checkpoint(ck, tmp_path / "m.ckpt", storage_options={"format": "safetensors"})
    from safetensors.torch import load_file
    assert torch.equal(load_file(str(tmp_path / "m.ckpt"))["state_dict.w"], ck["state_dict"]["w"])
    got = io.load_checkpoint(tmp_path / "m.ckpt")
    assert got["epoch"] == 1 and got["hyper_parameters"] == {"lr": 0.1}
    with pytest.raises(TypeError, match="storage_options"):
        io.save_checkpoint(ck, tmp_path / "n.ckpt", storage_options={"compress": True})
    with pytest.raises(FileNotFoundError):
        io.load_checkpoint(tmp_path / "missing.ckpt")


FAILING_SAVE = r"""
import os, sys, torch
import ckptio, ckptio.torch as ct
d = sys.argv[1]
if sys.argv[2] == "probe":
    # The integrations' packages are imported only by their modules.
    print("LOADED", [m for m in ("lightning", "accelerate", "transformers") if m in sys.modules])
    try:
        ct.save_checkpoint({"w": torch.ones(4)}, os.path.join(d, "probe.ckpt"))
    except OSError:
        print("FAULT")
    sys.exit(0)
from ckptio.lightning import AsyncCheckpointIO
io = AsyncCheckpointIO()
path = os.path.join(d, "a.ckpt")
where = None
try:
    io.save_checkpoint({"state_dict": {"w": torch.randn(1 << 16)}}, path)
    where = "teardown"
    io.teardown()
    where = None
except OSError as e:
    print("RAISED", where or "save", type(e).__name__, e)
print("EXISTS" if os.path.exists(path) else "ABSENT", sorted(os.listdir(d)))
"""


def test_async_failure_is_raised_not_lost(tmp_path):
    """A save failing on the disk (fsync EIO from the fault-injection build)
    raises from save_checkpoint or, once in the background, from teardown;
    no file is left at the path."""
    import subprocess
    import sys
    env = dict(os.environ, CKPTIO_FAULT="fsync:1:EIO")

    def run(what, d):
        d.mkdir()
        out = subprocess.run([sys.executable, "-c", FAILING_SAVE, str(d), what], env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out

    probe = run("probe", tmp_path / "probe").stdout
    assert "LOADED []" in probe, probe
    if "FAULT" not in probe:
        pytest.skip("this libckptio ignores CKPTIO_FAULT (build it with -DCKPTIO_FAULT_INJECTION=ON, "
                    "as scripts/build.sh does)")
    out = run("save", tmp_path / "save")
    print(out.stdout)
    assert "RAISED" in out.stdout and "ABSENT []" in out.stdout, out.stdout
