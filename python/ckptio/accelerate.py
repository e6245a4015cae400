"""Hugging Face accelerate's save_state / load_state through ckptio.

    from accelerate import Accelerator
    import ckptio.accelerate as ca

    accelerator = Accelerator()
    model, optimizer, scheduler, data = accelerator.prepare(model, optimizer, scheduler, data)
    ca.save_state(accelerator, "ckpt/step-100")     # instead of accelerator.save_state(...)
    ca.load_state(accelerator, "ckpt/step-100")     # instead of accelerator.load_state(...)

The same folder as Accelerator.save_state writes, file for file: the models
(model.safetensors, or pytorch_model.bin with safe_serialization=False; then
model_1..., for a second model), optimizer.bin, scheduler.bin, scaler.pt,
random_states_<process>.pkl (step, Python's, numpy's, torch's CPU RNG and
each accelerator device's), custom_checkpoint_<i>.pkl (objects registered
with register_for_checkpointing), dl_state_dict.bin (stateful dataloaders).
Each is written by ckptio (atomically, with CRC32s, all of them at once) and
in the format accelerate reads: accelerator.load_state reads a folder this
wrote, and load_state here reads one accelerate wrote (ckptio never unpickles
beyond torch.load(weights_only=True)'s allowlist plus numpy arrays, as
accelerate's own load). The hooks of register_save_state_pre_hook and
register_load_state_pre_hook run as in accelerate, and
ProjectConfiguration(automatic_checkpoint_naming=True) picks the folders.

Accelerate's save_state cannot be pointed at another writer, so this module
does what it does for the plain cases: one process or DDP (MULTI_GPU,
MULTI_CPU, ...), where every state is a regular state_dict. FSDP, DeepSpeed,
Megatron-LM and XLA save their own way: those raise NotImplementedError
(use accelerator.save_state there), as does an IterableDataset's
SeedableRandomSampler, which accelerate pickles as an object. Imported only
when used: `import ckptio` does not import accelerate.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from . import torch as _ct
from ._torch_io import SaveHandle

__all__ = ["save_state", "load_state"]

# The devices whose RNG accelerate saves as <key>: torch.<module>.get_rng_state_all().
_DEVICE_RNGS = [("torch_xpu_manual_seed", "xpu", "is_xpu_available"),
                ("torch_mlu_manual_seed", "mlu", "is_mlu_available"),
                ("torch_sdaa_manual_seed", "sdaa", "is_sdaa_available"),
                ("torch_musa_manual_seed", "musa", "is_musa_available"),
                ("torch_hpu_manual_seed", "hpu", "is_hpu_available"),
                ("torch_neuron_manual_seed", "neuron", "is_neuron_available"),
                ("torch_cuda_manual_seed", "cuda", "is_cuda_available")]


def _names() -> Any:
    from accelerate import utils  # type: ignore[import-untyped]
    return utils


def _check_supported(accelerator: Any) -> None:
    kinds = _names().DistributedType
    own = {kinds.FSDP: "FSDP", kinds.DEEPSPEED: "DeepSpeed", kinds.MEGATRON_LM: "Megatron-LM", kinds.XLA: "XLA"}
    kind = own.get(accelerator.distributed_type)
    if kind is not None:
        raise NotImplementedError(f"ckptio.accelerate does not save {kind} states (they are saved their own "
                                  "way, not as state dicts): use accelerator.save_state / load_state")


def _available(check: str) -> bool:
    fn = getattr(_names(), check, None)
    return bool(fn()) if fn is not None else False


def _device_rng_states() -> Dict[str, Any]:
    # The order of accelerate's checkpointing.save_accelerator_state (mlu,
    # sdaa and musa are alternatives there).
    out: Dict[str, Any] = {}
    picked_alt = False
    for key, module, check in _DEVICE_RNGS:
        if module in ("mlu", "sdaa", "musa"):
            if picked_alt or not _available(check):
                continue
            picked_alt = True
        elif not _available(check):
            continue
        out[key] = getattr(torch, module).get_rng_state_all()
    return out


def _checkpoint_number(folder: str) -> int:
    found = re.findall(r"[\/]?([0-9]+)(?=[^\/]*$)", folder)
    if not found:
        raise ValueError(f"{folder} is not a checkpoint_<n> folder")
    return int(found[0])


def _auto_output_dir(accelerator: Any) -> str:
    """Accelerate's automatic_checkpoint_naming: project_dir/checkpoints/
    checkpoint_<iteration>, the oldest removed beyond total_limit."""
    config = accelerator.project_configuration
    root = os.path.join(accelerator.project_dir, "checkpoints")
    os.makedirs(root, exist_ok=True)
    folders = [os.path.join(root, f) for f in os.listdir(root)]
    if (config.total_limit is not None and len(folders) + 1 > config.total_limit
            and accelerator.is_main_process):
        folders.sort(key=_checkpoint_number)
        for folder in folders[: len(folders) + 1 - config.total_limit]:
            shutil.rmtree(folder)
    out = os.path.join(root, f"checkpoint_{accelerator.save_iteration}")
    if os.path.exists(out):
        raise ValueError(f"Checkpoint directory {out} ({accelerator.save_iteration}) already exists. "
                         "Please manually override `self.save_iteration` with what iteration to start with.")
    accelerator.wait_for_everyone()
    return out


def _indexed(name: str, i: int) -> str:
    """model.safetensors, model_1.safetensors, ...: accelerate's names."""
    if i == 0:
        return name
    stem, dot, ext = name.partition(".")
    return f"{stem}_{i}{dot}{ext}"


def _sampler_to_pickle(dataloader: Any) -> bool:
    from accelerate.data_loader import IterableDatasetShard, SeedableRandomSampler  # type: ignore[import-untyped]
    return (isinstance(dataloader.dataset, IterableDatasetShard)
            and isinstance(dataloader.get_sampler(), SeedableRandomSampler))


def save_state(accelerator: Any, output_dir: Optional[str] = None, *, safe_serialization: bool = True,
               crc: bool = True) -> Path:
    """Saves the states accelerator.save_state(output_dir,
    safe_serialization) saves, into the same files, through ckptio; returns
    the folder. output_dir None: accelerate's automatic checkpoint naming
    (which must then be on). crc: record CRC32s (checked on load).
    Only the main process (each node's with save_on_each_node) writes the
    models, optimizers, schedulers and custom objects; every process writes
    its RNG states, as accelerate does."""
    _check_supported(accelerator)
    if any(_sampler_to_pickle(dl) for dl in accelerator._dataloaders):
        raise NotImplementedError("ckptio.accelerate cannot save the SeedableRandomSampler of an "
                                  "IterableDataset (accelerate pickles the sampler object): use "
                                  "accelerator.save_state")
    names = _names()
    config = accelerator.project_configuration
    if config.automatic_checkpoint_naming:
        output_dir = _auto_output_dir(accelerator)
    elif output_dir is None:
        raise ValueError("output_dir is required unless ProjectConfiguration(automatic_checkpoint_naming=True)")
    os.makedirs(output_dir, exist_ok=True)
    out = Path(output_dir)
    writes = accelerator.is_local_main_process if config.save_on_each_node else accelerator.is_main_process

    weights = [accelerator.get_state_dict(m, unwrap=False) for m in accelerator._models]
    for hook in accelerator._save_model_state_pre_hook.values():
        hook(accelerator._models, weights, output_dir)

    files: List[Tuple[Any, str, str]] = []  # (object, file name, format)
    if writes:
        from accelerate.utils.other import clean_state_dict_for_safetensors  # type: ignore[import-untyped]
        for i, state in enumerate(weights):
            if safe_serialization:
                files.append((clean_state_dict_for_safetensors(state), _indexed(names.SAFE_WEIGHTS_NAME, i),
                              "safetensors-file"))
            else:
                files.append((state, _indexed(names.WEIGHTS_NAME, i), "pt"))
        for i, opt in enumerate(accelerator._optimizers):
            files.append((opt.state_dict(), _indexed(f"{names.OPTIMIZER_NAME}.bin", i), "pt"))
        for i, sched in enumerate(accelerator._schedulers):
            files.append((sched.state_dict(), _indexed(f"{names.SCHEDULER_NAME}.bin", i), "pt"))
        for i, dl in enumerate(accelerator._dataloaders):
            if getattr(dl, "use_stateful_dataloader", False):
                files.append((dl.state_dict(), "dl_state_dict.bin" if i == 0 else f"dl_state_dict_{i}.bin",
                              "pt"))
        if accelerator.scaler is not None:
            files.append((accelerator.scaler.state_dict(), names.SCALER_NAME, "pt"))
        for i, obj in enumerate(accelerator._custom_objects):
            files.append((obj.state_dict(), f"custom_checkpoint_{i}.pkl", "pt"))
    rng: Dict[str, Any] = {"step": accelerator.step, "random_state": random.getstate(),
                           "numpy_random_seed": np.random.get_state(),
                           "torch_manual_seed": torch.get_rng_state()}
    rng.update(_device_rng_states())
    files.append((rng, f"{names.RNG_STATE_NAME}_{accelerator.state.process_index}.pkl", "pt"))

    _save_all(files, out, crc)
    config.iteration += 1
    return out


def _save_all(files: List[Tuple[Any, str, str]], out: Path, crc: bool) -> None:
    """Starts every save, then waits for them all; raises the first error
    (after every started save has ended)."""
    handles: List[SaveHandle] = []
    error: Optional[BaseException] = None
    try:
        for obj, name, fmt in files:
            path = out / name
            if fmt == "safetensors-file":  # accelerate's model file: a flat safetensors state dict
                handles.append(_ct.save_file_async(obj, path, metadata={"format": "pt"}, crc=crc))
            else:
                handles.append(_ct.save_checkpoint_async(obj, path, format=fmt, crc=crc))
    except BaseException as e:  # noqa: BLE001 - reraised below, after the started saves ended
        error = e
    for h in handles:
        try:
            h.wait_durable()
        except BaseException as e:  # noqa: BLE001 - the first is reraised
            error = error or e
    if error is not None:
        raise error


def _latest_auto_dir(accelerator: Any) -> str:
    root = os.path.join(accelerator.project_dir, "checkpoints")
    folders = [os.path.join(root, f) for f in os.listdir(root)]
    if not folders:
        raise FileNotFoundError(f"no checkpoint_<n> folder in {root}")
    folders.sort(key=_checkpoint_number)
    return folders[-1]


def load_state(accelerator: Any, input_dir: Optional[str] = None, *, map_location: Optional[str] = None,
               strict: bool = True) -> None:
    """Restores what save_state (or accelerator.save_state) saved in
    input_dir, as accelerator.load_state does, reading through ckptio:
    models, optimizers, schedulers, stateful dataloaders, the GradScaler,
    the RNG states (and accelerator.step) and registered objects.
    input_dir None: the latest folder of automatic checkpoint naming.
    map_location: where the model and optimizer states go, accelerate's
        choices: None (the CPU, or each process's device when several
        processes share a machine's devices), "cpu" or "on_device".
    strict: as model.load_state_dict's.
    Unlike accelerate (which logs and goes on), a missing or unreadable
    random_states file raises."""
    _check_supported(accelerator)
    names = _names()
    if input_dir is not None:
        input_dir = os.path.expanduser(input_dir)
        if not os.path.isdir(input_dir):
            raise ValueError(f"Tried to find {input_dir} but folder does not exist")
    elif accelerator.project_configuration.automatic_checkpoint_naming:
        input_dir = _latest_auto_dir(accelerator)
    else:
        raise ValueError("input_dir is required unless ProjectConfiguration(automatic_checkpoint_naming=True)")
    folder = Path(input_dir)

    models = list(accelerator._models)
    for hook in accelerator._load_model_state_pre_hook.values():
        hook(models, input_dir)

    if map_location not in (None, "cpu", "on_device"):
        raise TypeError("map_location must be None, 'cpu' or 'on_device'")
    if map_location is None:
        several = (accelerator.num_processes > 1 and accelerator.multi_device
                   and accelerator.distributed_type != names.DistributedType.MULTI_XPU)
        map_location = "on_device" if several else "cpu"
    device: Any = accelerator.state.device if map_location == "on_device" else "cpu"

    for i, model in enumerate(models):
        safe = folder / _indexed(names.SAFE_WEIGHTS_NAME, i)
        if safe.exists():
            _ct.load_model(model, safe, strict=strict, device=device)
        else:
            state = _ct.load_checkpoint(folder / _indexed(names.WEIGHTS_NAME, i), map_location=device)
            model.load_state_dict(state, strict=strict)

    for i, opt in enumerate(accelerator._optimizers):
        opt.load_state_dict(_ct.load_checkpoint(folder / _indexed(f"{names.OPTIMIZER_NAME}.bin", i),
                                                map_location=device))
    for i, sched in enumerate(accelerator._schedulers):
        sched.load_state_dict(_ct.load_checkpoint(folder / _indexed(f"{names.SCHEDULER_NAME}.bin", i)))
    for i, dl in enumerate(accelerator._dataloaders):
        if _sampler_to_pickle(dl):
            raise NotImplementedError("ckptio.accelerate cannot load the SeedableRandomSampler of an "
                                      "IterableDataset (accelerate pickles the sampler object): use "
                                      "accelerator.load_state")
        state_file = folder / ("dl_state_dict.bin" if i == 0 else f"dl_state_dict_{i}.bin")
        if getattr(dl, "use_stateful_dataloader", False) and state_file.exists():
            dl.load_state_dict(_ct.load_checkpoint(state_file))
    if accelerator.scaler is not None:
        accelerator.scaler.load_state_dict(_ct.load_checkpoint(folder / names.SCALER_NAME))

    states = _ct.load_checkpoint(folder / f"{names.RNG_STATE_NAME}_{accelerator.state.process_index}.pkl",
                                 map_location="cpu")
    random.setstate(states["random_state"])
    np.random.set_state(states["numpy_random_seed"])
    torch.set_rng_state(states["torch_manual_seed"])
    for key, module, _ in _DEVICE_RNGS:
        if key in states and getattr(torch, module, None) is not None and _available(_DEVICE_RNGS_CHECK[key]):
            getattr(torch, module).set_rng_state_all(states[key])
        elif key not in states and _available(_DEVICE_RNGS_CHECK[key]):
            warnings.warn(f"{folder}: no {key} RNG state saved (saved without that device); "
                          "its RNG is left as it is", stacklevel=2)
    if "step" in states:
        accelerator.step = states["step"]

    customs = [f for f in os.listdir(folder) if re.search(r"^custom_checkpoint_\d+\.pkl$", f)]
    if len(customs) != len(accelerator._custom_objects):
        raise RuntimeError(f"Number of custom checkpoints in folder {input_dir} does not match the number of "
                           f"registered objects: found {len(customs)} checkpoints, "
                           f"{len(accelerator._custom_objects)} registered objects")
    for i, obj in enumerate(accelerator._custom_objects):
        obj.load_state_dict(_ct.load_checkpoint(folder / f"custom_checkpoint_{i}.pkl", map_location="cpu"))


_DEVICE_RNGS_CHECK = {key: check for key, _, check in _DEVICE_RNGS}
