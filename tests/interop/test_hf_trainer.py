"""ckptio.transformers under the real transformers Trainer (and accelerate,
which it needs): a run with ckptio.transformers.Trainer writes its
checkpoint-N folders through ckptio, and the stock transformers.Trainer's
resume_from_checkpoint continues from one to the same weights, bit for bit,
as the uninterrupted run; each piece (weights, optimizer state, scheduler,
RNG, global step) is checked too. A tiny GPT-2 from a config (tied
embeddings, dropout on), CPU, offline."""

import os

import pytest

transformers = pytest.importorskip("transformers", reason="transformers is not installed: run scripts/setup.sh")
pytest.importorskip("accelerate", reason="accelerate (the Trainer needs it) is not installed: run scripts/setup.sh")
import torch  # noqa: E402

import ckptio  # noqa: E402
import ckptio.torch as ct  # noqa: E402
from ckptio.transformers import Trainer as CkptioTrainer  # noqa: E402

STEPS, SAVE_AT = 6, 3


class Data(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(3)
        self.ids = torch.randint(0, 64, (16, 8), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_model(seed=0):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=64, n_positions=8, n_embd=16, n_layer=1, n_head=2,
                                     resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    return transformers.GPT2LMHeadModel(config)


def args(out, **kw):
    return transformers.TrainingArguments(
        output_dir=str(out), max_steps=STEPS, save_steps=SAVE_AT, save_strategy="steps",
        per_device_train_batch_size=4, learning_rate=1e-2, lr_scheduler_type="linear", warmup_steps=2,
        seed=42, report_to=[], use_cpu=True, logging_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0, **kw)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    saved_by_torch = []
    real_save = torch.save

    def spy(obj, f, *a, **kw):
        saved_by_torch.append(os.path.basename(str(f)))
        return real_save(obj, f, *a, **kw)

    torch.save = spy
    try:
        trainer = CkptioTrainer(model=tiny_model(), args=args(out), train_dataset=Data())
        trainer.train()
    finally:
        torch.save = real_save
    final = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    return out, final, saved_by_torch


def test_checkpoint_files_are_written_by_ckptio(full_run):
    out, _, saved_by_torch = full_run
    ckpt = out / f"checkpoint-{SAVE_AT}"
    names = set(os.listdir(ckpt))
    assert {"model.safetensors", "config.json", "optimizer.pt", "scheduler.pt", "rng_state.pth",
            "trainer_state.json"} <= names
    # Only the TrainingArguments object went through torch.save.
    assert set(saved_by_torch) == {"training_args.bin"}
    with ct.safe_open(str(ckpt / "model.safetensors")) as f:
        meta = f.metadata()   # (ckptio's own version key hidden, as load_metadata shows it)
        assert meta["format"] == "pt" and "ckptio.version" in ckptio.load_metadata(ckpt / "model.safetensors")
        # The tied lm_head is saved once, as save_pretrained does.
        assert "lm_head.weight" not in f.keys() and "transformer.wte.weight" in f.keys()
    opt = torch.load(ckpt / "optimizer.pt", weights_only=True)
    assert opt["state"][0]["step"].item() == SAVE_AT
    assert torch.load(ckpt / "scheduler.pt", weights_only=True)["last_epoch"] == SAVE_AT


def test_stock_trainer_resumes_bit_exact(full_run, tmp_path):
    out, final, _ = full_run
    ckpt = out / f"checkpoint-{SAVE_AT}"
    seen = {}

    class Probe(transformers.TrainerCallback):
        def on_train_begin(self, a, state, control, model=None, optimizer=None, lr_scheduler=None, **kw):
            # Called after the checkpoint's model, optimizer and scheduler are loaded.
            seen["step"] = state.global_step
            seen["weights"] = {k: v.clone() for k, v in model.state_dict().items()}
            seen["exp_avg"] = optimizer.state_dict()["state"][0]["exp_avg"].clone()
            seen["last_epoch"] = lr_scheduler.last_epoch

    resumed = transformers.Trainer(model=tiny_model(seed=1), args=args(tmp_path), train_dataset=Data(),
                                   callbacks=[Probe()])
    resumed.train(resume_from_checkpoint=str(ckpt))
    assert seen["step"] == SAVE_AT and seen["last_epoch"] == SAVE_AT
    weights = ct.load_file(str(ckpt / "model.safetensors"))
    for k, v in weights.items():
        assert torch.equal(seen["weights"][k], v), k
    opt = ct.load_checkpoint(ckpt / "optimizer.pt")
    assert torch.equal(seen["exp_avg"], opt["state"][0]["exp_avg"])
    assert resumed.state.global_step == STEPS
    for k, v in resumed.model.state_dict().items():
        assert torch.equal(v, final[k]), k
