"""The transformers Trainer's checkpoints written through ckptio.

    from ckptio.transformers import Trainer          # a transformers.Trainer
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()                                  # checkpoint-N/ written by ckptio
    trainer.train(resume_from_checkpoint=True)       # read back by the Trainer itself

    # or, with a Trainer subclass of your own (Seq2SeqTrainer, trl's, ...):
    from ckptio.transformers import CkptioTrainerMixin
    class MyTrainer(CkptioTrainerMixin, Seq2SeqTrainer): ...

Each checkpoint-N folder holds the files the Trainer writes, in the formats
its own resume_from_checkpoint reads, but written by ckptio (atomically,
with CRC32s): the model's safetensors (model.safetensors, or shards and
their index, as save_pretrained cuts them: save_pretrained runs as usual,
only its safetensors writes go to ckptio.torch.save_file), optimizer.pt,
scheduler.pt, scaler.pt and rng_state.pth (rng_state_<rank>.pth) as
torch.save's archive (ckptio.torch.save_checkpoint, format "pt"), which
the Trainer opens with torch.load(weights_only=True). Resuming needs
nothing from ckptio; ckptio.torch.load_checkpoint reads the files too.

Not through ckptio: config.json, generation_config.json,
trainer_state.json, the tokenizer's files (small JSON and text files), and
training_args.bin (torch.save of the TrainingArguments object, which is
not plain data; the Trainer never reads it back). DeepSpeed, FSDP, XLA
(TPU) and SageMaker model parallelism save their own way, and devices
whose RNG is not CPU or CUDA (NPU, HPU, MLU, MUSA): for those the Trainer's
own code runs unchanged.

While a Trainer of this module saves the model, transformers.modeling_utils.
safe_save_file (the name save_pretrained writes each safetensors file
through) is ckptio.torch.save_file, under a lock; if transformers no longer
has that name, the save raises instead of silently writing another way.
Imported only when used: `import ckptio` does not import transformers.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import random
import threading
from typing import Any, Dict, Iterator, Optional

import numpy as np
import torch
import transformers
from transformers import modeling_utils as _modeling_utils
from transformers import trainer as _trainer

from . import torch as _ct

__all__ = ["Trainer", "CkptioTrainerMixin"]

_PATCH_LOCK = threading.RLock()


@contextlib.contextmanager
def _safetensors_through_ckptio(crc: bool) -> Iterator[None]:
    """save_pretrained's safetensors writes go to ckptio.torch.save_file."""
    if not hasattr(_modeling_utils, "safe_save_file"):
        raise RuntimeError(f"transformers {transformers.__version__}: modeling_utils has no safe_save_file, "
                           "through which ckptio.transformers routes save_pretrained's writes; "
                           "this version is not supported")

    def save_file(tensors: Dict[str, torch.Tensor], filename: Any,
                  metadata: Optional[Dict[str, str]] = None) -> None:
        _ct.save_file(tensors, filename, metadata, crc=crc)

    with _PATCH_LOCK:
        original = _modeling_utils.safe_save_file
        _modeling_utils.safe_save_file = save_file
        try:
            yield
        finally:
            _modeling_utils.safe_save_file = original


class CkptioTrainerMixin:
    """Mixed in before a transformers.Trainer class, writes its checkpoints'
    model, optimizer, scheduler, scaler and RNG files through ckptio (see
    the module's documentation). ckptio_crc (class attribute): record
    CRC32s."""

    ckptio_crc: bool = True

    def _ckptio_plain(self) -> bool:
        from transformers.utils import import_utils as iu
        t: Any = self
        return not (iu.is_torch_xla_available() or iu.is_sagemaker_mp_enabled() or t.is_deepspeed_enabled
                    or t.is_fsdp_enabled or iu.is_torch_npu_available() or iu.is_torch_hpu_available()
                    or iu.is_torch_mlu_available() or iu.is_torch_musa_available())

    def _save(self, output_dir: Optional[str] = None, state_dict: Optional[Dict[str, Any]] = None) -> None:
        t: Any = self
        if not self._ckptio_plain():
            return self._ckptio_next()._save(output_dir, state_dict)  # type: ignore[no-any-return]
        output_dir = output_dir if output_dir is not None else t.args.output_dir
        model = t.accelerator.unwrap_model(t.model, keep_torch_compile=False)
        if not isinstance(model, transformers.PreTrainedModel) and not _is_peft(model):
            # The Trainer's branch for a model that is not a PreTrainedModel:
            # its state dict as one safetensors file (tied weights once, as
            # ckptio.torch.save_model keeps them).
            if not t.args.should_save:
                return None
            os.makedirs(output_dir, exist_ok=True)
            path = os.path.join(output_dir, transformers.utils.SAFE_WEIGHTS_NAME)
            if state_dict is None:
                _ct.save_model(t.model, path, metadata={"format": "pt"}, crc=self.ckptio_crc)
            else:
                _ct.save_file(state_dict, path, metadata={"format": "pt"}, crc=self.ckptio_crc)
            if t.processing_class is not None:
                t.processing_class.save_pretrained(output_dir)
            torch.save(t.args, os.path.join(output_dir, _trainer.TRAINING_ARGS_NAME))
            return None
        with _safetensors_through_ckptio(self.ckptio_crc):
            return self._ckptio_next()._save(output_dir, state_dict)  # type: ignore[no-any-return]

    def _ckptio_next(self) -> Any:
        """The next class's methods (the Trainer this is mixed into)."""
        return super()

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        t: Any = self
        if not self._ckptio_plain():
            return self._ckptio_next()._save_optimizer_and_scheduler(output_dir)  # type: ignore[no-any-return]
        if t.args.should_save:
            os.makedirs(output_dir, exist_ok=True)
            self._ckptio_save_pt(t.optimizer.state_dict(), output_dir, _trainer.OPTIMIZER_NAME)
            self._ckptio_save_pt(t.lr_scheduler.state_dict(), output_dir, _trainer.SCHEDULER_NAME)
        return None

    def _ckptio_save_pt(self, obj: Any, output_dir: str, name: str) -> None:
        """One of the checkpoint's .pt files (the Trainer's own names), as
        torch.save's archive, which the Trainer's resume reads."""
        _ct.save_checkpoint(obj, os.path.join(output_dir, name), format="pt", crc=self.ckptio_crc)

    def _save_scaler(self, output_dir: str) -> None:
        t: Any = self
        if not self._ckptio_plain():
            return self._ckptio_next()._save_scaler(output_dir)  # type: ignore[no-any-return]
        scaler = getattr(t.accelerator, "scaler", None)
        if scaler is not None and t.args.should_save:
            self._ckptio_save_pt(scaler.state_dict(), output_dir, _trainer.SCALER_NAME)
        return None

    def _save_rng_state(self, output_dir: str) -> None:
        t: Any = self
        if not self._ckptio_plain():
            return self._ckptio_next()._save_rng_state(output_dir)  # type: ignore[no-any-return]
        from transformers.training_args import ParallelMode
        states: Dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                                  "cpu": torch.random.get_rng_state()}
        if torch.cuda.is_available():
            if t.args.parallel_mode == ParallelMode.DISTRIBUTED:
                states["cuda"] = torch.cuda.random.get_rng_state_all()
            else:
                states["cuda"] = torch.cuda.random.get_rng_state()
        os.makedirs(output_dir, exist_ok=True)
        name = "rng_state.pth" if t.args.world_size <= 1 else f"rng_state_{t.args.process_index}.pth"
        self._ckptio_save_pt(states, output_dir, name)
        return None


def _is_peft(model: Any) -> bool:
    try:
        peft = importlib.import_module("peft")
    except ImportError:
        return False
    return isinstance(model, peft.PeftModel)


class Trainer(CkptioTrainerMixin, transformers.Trainer):
    """transformers.Trainer whose checkpoints are written through ckptio
    (see the module's documentation); everything else is the Trainer's."""
