"""ckptio.accelerate under the real accelerate (scripts/setup.sh installs it):
save_state / load_state restore the model, optimizer, scheduler, RNG states
(the next random numbers are the same) and registered objects, so a run
resumed from the folder ends bit for bit where the uninterrupted one does;
accelerate's own load_state reads the folder ckptio wrote, and ckptio's
load_state reads the one accelerate wrote. Tiny model, CPU."""

import copy
import os
import random

import numpy as np
import pytest

pytest.importorskip("accelerate", reason="accelerate is not installed: run scripts/setup.sh")
import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from accelerate.utils import ProjectConfiguration  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import ckptio.accelerate as ca  # noqa: E402
import ckptio.torch as ct  # noqa: E402

STEPS = 3  # one epoch


class Counter:
    """An object registered with register_for_checkpointing."""

    def __init__(self):
        self.n = 0

    def state_dict(self):
        return {"n": self.n, "t": torch.full((2,), float(self.n))}

    def load_state_dict(self, sd):
        self.n = sd["n"]
        assert torch.equal(sd["t"], torch.full((2,), float(self.n)))


def setup(seed=0, project_dir=None):
    torch.manual_seed(seed)
    # Dropout draws from torch's RNG: the resumed run matches only if it came back.
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    g = torch.Generator().manual_seed(5)
    data = DataLoader(TensorDataset(torch.randn(4 * STEPS, 4, generator=g), torch.randn(4 * STEPS, 2, generator=g)),
                      batch_size=4)
    config = ProjectConfiguration(project_dir=project_dir, automatic_checkpoint_naming=True) if project_dir else None
    acc = Accelerator(cpu=True, project_config=config)
    counter = Counter()
    acc.register_for_checkpointing(counter)
    model, opt, sched, data = acc.prepare(model, opt, sched, data)
    return acc, model, opt, sched, data, counter


def epoch(acc, model, opt, sched, data, counter):
    model.train()
    for x, y in data:
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        acc.step += 1
        counter.n += 1


def rng_draws():
    return random.random(), float(np.random.rand()), torch.rand(4)


def same_draws(a, b):
    return a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])


def weights(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("safe", [True, False])
def test_save_load_state_resumes_bit_exact(tmp_path, safe):
    run = setup()
    epoch(*run)
    ckpt = ca.save_state(run[0], str(tmp_path / "ckpt"), safe_serialization=safe)
    expected_files = {"model.safetensors" if safe else "pytorch_model.bin", "optimizer.bin", "scheduler.bin",
                      "random_states_0.pkl", "custom_checkpoint_0.pkl"}
    assert set(os.listdir(ckpt)) == expected_files
    rng_at_save = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    draws_after_save = rng_draws()
    random.setstate(rng_at_save[0]), np.random.set_state(rng_at_save[1]), torch.set_rng_state(rng_at_save[2])
    saved_opt = copy.deepcopy(run[2].state_dict())
    epoch(*run)
    final = weights(run[1])

    random.seed(123), np.random.seed(123), torch.manual_seed(123)  # away from the saved state
    again = setup(seed=1)  # other initial weights: the folder must bring them
    again[0].step = 0
    ca.load_state(again[0], str(ckpt))
    assert again[0].step == STEPS and again[5].n == STEPS
    loaded_opt = again[2].state_dict()
    for i, st in saved_opt["state"].items():
        for k, v in st.items():
            assert torch.equal(loaded_opt["state"][i][k], v), (i, k)
    assert loaded_opt["param_groups"] == saved_opt["param_groups"]
    assert again[3].scheduler.last_epoch == STEPS
    state = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    assert state[0] == rng_at_save[0] and torch.equal(state[2], rng_at_save[2])
    assert all(np.array_equal(a, b) for a, b in zip(state[1], rng_at_save[1]))
    assert same_draws(rng_draws(), draws_after_save)
    random.setstate(state[0]), np.random.set_state(state[1]), torch.set_rng_state(state[2])

    epoch(*again)
    for k, v in weights(again[1]).items():
        assert torch.equal(v, final[k]), k


def test_accelerate_reads_ckptio_folder_and_back(tmp_path):
    run = setup()
    epoch(*run)
    before = weights(run[1])
    opt_before = copy.deepcopy(run[2].state_dict())
    draws = rng_draws()
    ca.save_state(run[0], str(tmp_path / "ours"))
    run[0].save_state(str(tmp_path / "theirs"))
    # Both folders hold the same names.
    assert sorted(os.listdir(tmp_path / "ours")) == sorted(os.listdir(tmp_path / "theirs"))
    after_save = rng_draws()

    for loader, folder in ((lambda a, d: a.load_state(d), "ours"), (ca.load_state, "theirs")):
        other = setup(seed=7)
        other[0].step = 0
        loader(other[0], str(tmp_path / folder))
        assert other[0].step == STEPS and other[5].n == STEPS, folder
        for k, v in weights(other[1]).items():
            assert torch.equal(v, before[k]), (folder, k)
        got = other[2].state_dict()
        assert torch.equal(got["state"][0]["exp_avg"], opt_before["state"][0]["exp_avg"]), folder
        assert other[3].scheduler.last_epoch == STEPS, folder
        assert same_draws(rng_draws(), after_save), folder
    del draws


def test_automatic_checkpoint_naming(tmp_path):
    run = setup(project_dir=str(tmp_path))
    epoch(*run)
    first = ca.save_state(run[0])
    epoch(*run)
    second = ca.save_state(run[0])
    assert (first.name, second.name) == ("checkpoint_0", "checkpoint_1")
    final = weights(run[1])
    other = setup(seed=3, project_dir=str(tmp_path))
    ca.load_state(other[0])  # the latest
    for k, v in weights(other[1]).items():
        assert torch.equal(v, final[k]), k
    assert other[0].step == 2 * STEPS


def test_files_are_ckptio_checked(tmp_path):
    run = setup()
    epoch(*run)
    folder = ca.save_state(run[0], str(tmp_path / "c"))
    rng = ct.load_checkpoint(folder / "random_states_0.pkl")
    assert rng["step"] == STEPS and rng["numpy_random_seed"][0] == "MT19937"
    # A flipped byte in a stored tensor is caught by the CRC on load.
    path = folder / "optimizer.bin"
    data = bytearray(path.read_bytes())
    exp_avg = ct.load_checkpoint(path)["state"][0]["exp_avg"]
    raw = exp_avg.numpy().tobytes()
    at = bytes(data).find(raw)
    assert at > 0
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    other = setup(seed=2)
    with pytest.raises(Exception, match="(?i)crc|checksum"):
        ca.load_state(other[0], str(folder))
