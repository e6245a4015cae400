"""ckptio.torch.load_model into a model built on the meta device (issue 44):
torch.device("meta"), accelerate's init_empty_weights and transformers'
low_cpu_mem_usage build models whose tensors have a shape and a dtype but
no memory, and load them afterwards. load_model used to leave every such
tensor on meta and return as if it had loaded. Now:

- each meta parameter and persistent buffer the file holds is made on the
  requested device and loaded (in place or through load_state_dict, and by
  a group load), equal to the saved model's; parameters stay nn.Parameter
  with their requires_grad, the model's dtype is kept, and tied weights
  (saved once by save_model) stay one Parameter;
- whatever is still on meta afterwards (non-persistent buffers, such as
  Llama's rotary inv_freq, which no checkpoint holds; keys the file lacks
  with strict=False) is named in a UserWarning;
- a load that raises (strict's missing key, a checksum mismatch) puts
  every meta tensor back: the model is as before the call, never half in
  uninitialised memory;
- a tiny GPT-2 and a tiny Llama (2 layers, hidden 64, tied embeddings),
  saved with save_model and loaded into their meta-built twins, give the
  original's logits on a fixed input.
The transformers tests need transformers (ctest runs this file through
run_pytest.sh with CKPTIO_PYTEST_NEEDS="torch transformers", which skips
loudly, 77, without it; run by hand, they alone are skipped, with the
reason)."""

import os
import pathlib
import sys
import warnings

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never reach a hub
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest  # noqa: E402

torch = pytest.importorskip("torch", reason="ckptio.torch needs torch")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
import ckptio  # noqa: E402
import ckptio.torch as ct  # noqa: E402


class Tied(torch.nn.Module):
    """An embedding tied to the output layer, a frozen parameter, a
    persistent buffer and a non-persistent one (as a rotary inv_freq)."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.emb = torch.nn.Embedding(24, 8, dtype=dtype)
        self.mid = torch.nn.Linear(8, 8, dtype=dtype)
        self.head = torch.nn.Linear(8, 24, dtype=dtype)
        self.head.weight = self.emb.weight
        self.mid.bias.requires_grad_(False)
        self.register_buffer("steps", torch.arange(3, dtype=torch.int64))
        self.register_buffer("inv_freq", torch.linspace(0, 1, 4, dtype=dtype), persistent=False)


def saved_tied(tmp_path):
    torch.manual_seed(0)
    src = Tied()
    with torch.no_grad():
        src.steps += 5  # not what a fresh model holds: the file's values must arrive
    path = tmp_path / "tied.safetensors"
    ct.save_model(src, path)
    return src, path


def meta_twin(cls=Tied, **kw):
    with torch.device("meta"):
        return cls(**kw)


def load_warned(model, path, **kw):
    """load_model's result and the messages of the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = ct.load_model(model, path, **kw)
    return result, [str(w.message) for w in caught]


def on_meta(model):
    return [n for n, t in list(model.named_parameters(remove_duplicate=False))
            + list(model.named_buffers(remove_duplicate=False)) if t.is_meta]


# ------------------------------------------------------------ a plain module

@pytest.mark.parametrize("in_place", [True, False])
def test_a_meta_module_loads_for_real_and_its_tie_holds(tmp_path, in_place):
    src, path = saved_tied(tmp_path)
    assert "head.weight" not in ct.load_file(path)  # save_model kept the tie's one copy
    dst = meta_twin()
    assert dst.mid.bias.requires_grad is False
    result, said = load_warned(dst, path, device="cpu", in_place=in_place)
    assert result == ([], [])
    # Every state tensor is on the CPU with the saved values.
    for name, t in dst.state_dict().items():
        assert t.device == torch.device("cpu"), name
        assert torch.equal(t, src.state_dict()[name]), name
    # Parameters stay Parameters with their requires_grad; the tie is one Parameter.
    assert all(type(p) is torch.nn.Parameter for p in dst.parameters())
    assert dst.head.weight is dst.emb.weight
    assert dst.mid.bias.requires_grad is False and dst.mid.weight.requires_grad is True
    # The non-persistent buffer is in no file: it stays on meta, and the warning says so.
    assert on_meta(dst) == ["inv_freq"]
    assert len(said) == 1 and "still on the meta device" in said[0] and "inv_freq" in said[0], said
    # The tie works as a tie: a step on the head moves the embedding.
    with torch.no_grad():
        dst.head.weight[0, 0] += 1
    assert dst.emb.weight[0, 0] == src.emb.weight[0, 0] + 1


def test_the_models_dtype_is_kept_as_for_a_built_model(tmp_path):
    """The file holds float32; a bfloat16 meta model gets bfloat16 tensors
    (what load_model gives a bfloat16 model built on the CPU), not the
    file's dtype."""
    src, path = saved_tied(tmp_path)
    built = Tied(dtype=torch.bfloat16)
    dst = meta_twin(dtype=torch.bfloat16)
    assert load_warned(built, path)[0] == ([], [])
    assert load_warned(dst, path, device="cpu")[0] == ([], [])
    for name, t in dst.state_dict().items():
        assert t.dtype == built.state_dict()[name].dtype, name
        assert torch.equal(t, built.state_dict()[name]), name
    assert dst.head.weight is dst.emb.weight


def test_strict_with_a_missing_key_raises_and_leaves_the_model_on_meta(tmp_path):
    src, _ = saved_tied(tmp_path)
    path = tmp_path / "no_mid_bias.safetensors"
    state = {k: v for k, v in src.state_dict().items() if k not in ("mid.bias", "head.weight")}
    ct.save_file(state, path)
    dst = meta_twin()
    before = {n: p for n, p in dst.named_parameters(remove_duplicate=False)}
    for in_place in (True, False):
        with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "mid.bias"') as info:
            ct.load_model(dst, path, in_place=in_place)
        if sys.version_info >= (3, 11):
            assert any("put back on meta" in note for note in info.value.__notes__)
        # Nothing half-made: the same meta Parameters, the tie as it was.
        assert all(getattr_path(dst, n) is p for n, p in before.items())
        assert sorted(on_meta(dst)) == sorted(list(before) + ["inv_freq", "steps"])
    # Not strict: the rest loads, the missing one stays on meta, named in the result and the warning.
    result, said = load_warned(dst, path, strict=False)
    assert result == (["mid.bias"], [])
    assert sorted(on_meta(dst)) == ["inv_freq", "mid.bias"]
    assert torch.equal(dst.mid.weight, src.mid.weight) and dst.head.weight is dst.emb.weight
    assert len(said) == 1 and "mid.bias" in said[0] and "inv_freq" in said[0], said


def getattr_path(model, name):
    *parents, leaf = name.split(".")
    for p in parents:
        model = getattr(model, p)
    return getattr(model, leaf)


def test_a_failed_read_puts_the_meta_tensors_back(tmp_path):
    """In place, the file's bytes go into the new tensors before the CRCs
    are checked; a mismatch must not leave them in the model."""
    _, path = saved_tied(tmp_path)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x40  # in the last tensor's bytes
    path.write_bytes(bytes(data))
    dst = meta_twin()
    emb = dst.emb.weight
    for in_place in (True, False):
        with pytest.raises(ckptio.ChecksumError):
            ct.load_model(dst, path, in_place=in_place)
        assert dst.emb.weight is emb and dst.head.weight is emb
        everything = [n for n, _ in dst.named_parameters(remove_duplicate=False)] + ["inv_freq", "steps"]
        assert sorted(on_meta(dst)) == sorted(everything)


def test_a_model_off_meta_loads_as_before_without_a_warning(tmp_path):
    src, path = saved_tied(tmp_path)
    dst = Tied()
    weight = dst.emb.weight
    result, said = load_warned(dst, path)
    assert result == ([], []) and said == []
    assert dst.emb.weight is weight and dst.head.weight is weight  # loaded into, not replaced
    assert torch.equal(dst.emb.weight, src.emb.weight)


def test_a_group_load_makes_the_meta_tensors_too(tmp_path):
    """load_model(group=...) in a one-rank gloo group: the group load's own
    path (no shared page cache with one rank), into the made tensors."""
    import torch.distributed as dist
    src, path = saved_tied(tmp_path)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        dst = meta_twin()
        result, said = load_warned(dst, path, group=dist.group.WORLD)
    finally:
        dist.destroy_process_group()
    assert result == ([], [])
    assert on_meta(dst) == ["inv_freq"] and len(said) == 1
    for name, t in dst.state_dict().items():
        assert torch.equal(t, src.state_dict()[name]), name
    assert dst.head.weight is dst.emb.weight


# ------------------------------------------------------------ transformers

def _transformers():
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed: run scripts/setup.sh")
    transformers.logging.set_verbosity_error()  # the tiny configs' warnings are expected
    return transformers


def _gpt2_config(transformers):
    return transformers.GPT2Config(vocab_size=96, n_positions=32, n_embd=64, n_layer=2, n_head=4,
                                   bos_token_id=0, eos_token_id=1, tie_word_embeddings=True)


def _llama_config(transformers):
    return transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                    bos_token_id=0, eos_token_id=1, tie_word_embeddings=True)


def _build(transformers, cfg):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.device("meta"):
        twin = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    return model, twin


def _logits(model):
    ids = torch.arange(12).reshape(2, 6) % 96
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_a_meta_built_gpt2_loads_and_gives_the_originals_logits(tmp_path):
    transformers = _transformers()
    model, twin = _build(transformers, _gpt2_config(transformers))
    assert twin.lm_head.weight is twin.transformer.wte.weight and twin.lm_head.weight.is_meta
    path = tmp_path / "gpt2.safetensors"
    ct.save_model(model, path)
    result, said = load_warned(twin, path, device="cpu")
    assert result == ([], []) and said == []
    assert on_meta(twin) == []
    assert twin.lm_head.weight is twin.transformer.wte.weight
    assert torch.equal(_logits(twin), _logits(model))


def test_a_meta_built_llama_loads_and_names_its_rotary_buffers(tmp_path):
    """Llama's rotary inv_freq is a non-persistent buffer: no checkpoint
    holds it, so a meta-built Llama keeps it on meta and load_model says
    so; re-created on the device, the model gives the original's logits."""
    transformers = _transformers()
    cfg = _llama_config(transformers)
    model, twin = _build(transformers, cfg)
    assert twin.lm_head.weight is twin.model.embed_tokens.weight
    path = tmp_path / "llama.safetensors"
    ct.save_model(model, path)
    result, said = load_warned(twin, path, device="cpu")
    assert result == ([], [])
    left = on_meta(twin)
    assert left and all(name.startswith("model.rotary_emb.") for name in left), left
    assert len(said) == 1 and all(name in said[0] for name in left), said
    assert twin.lm_head.weight is twin.model.embed_tokens.weight
    # What the warning asks for: the buffers recomputed on the device.
    twin.model.rotary_emb = type(model.model.rotary_emb)(config=cfg)
    assert on_meta(twin) == []
    assert torch.equal(_logits(twin), _logits(model))
