"""The real transformers against ckptio, on small models built here from
configs (no download: HF_HUB_OFFLINE=1): a GPT-2 (its lm_head tied to the
token embedding) and a Llama (untied, grouped-query attention, in bfloat16).

- save_pretrained's sharded set (2-3 shards) loads in ckptio.torch.load_file,
  from the directory and from the index, every tensor equal to the model's;
  safe_open on the directory reads the same keys, slices of every matrix and
  torch.chunk's tensor-parallel parts.
- A state dict saved by ckptio, as one model.safetensors (metadata
  format=pt) and as save_torch_state_dict's sharded set, loads with
  from_pretrained: no missing, unexpected or mismatched key, every parameter
  and buffer equal.

Tied weights: save_pretrained leaves out the tied copy (lm_head.weight of
GPT-2), and from_pretrained ties it again, so ckptio saves what transformers
would: the state dict less the keys of model._tied_weights_keys that share
storage with a kept tensor (the test checks that set is save_pretrained's).

What is the same: both cut shards by huggingface_hub's
split_torch_state_dict_into_shards (transformers 5 calls it), so for one
max_shard_size the shard names and the weight_map are identical (checked).
What differs (checked below, none stops a load):
- The index: transformers writes metadata.total_parameters besides
  total_size; ckptio writes total_size and ckptio.save_id.
- Shard metadata: both write format=pt; ckptio adds ckptio.version and a
  CRC32 per tensor, which transformers ignores.
- save_pretrained also writes config.json and generation_config.json;
  ckptio writes only weights (the test writes config.json with
  config.save_pretrained, and from_pretrained does without the generation
  config).
- ckptio stores the names it is given. transformers 5 reverts its weight
  conversions on save (models whose in-memory layout differs from their
  checkpoints', e.g. fused MoE experts), so for such models a ckptio save
  of model.state_dict() is not what save_pretrained writes; GPT-2 and Llama
  have none (their key sets are checked equal).
Needs torch and transformers (run_pytest.sh, CKPTIO_PYTEST_NEEDS)."""

import json
import os
import pathlib
import sys

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never reach a hub
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest  # noqa: E402

torch = pytest.importorskip("torch", reason="ckptio.torch needs torch")
transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed: run scripts/setup.sh")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
import ckptio.torch as ct  # noqa: E402

transformers.logging.set_verbosity_error()  # the tiny configs' warnings are expected


def make_gpt2():
    cfg = transformers.GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                  bos_token_id=0, eos_token_id=1)
    return transformers.GPT2LMHeadModel(cfg)


def make_llama():
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=32,
                                   bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)
    # bfloat16: from_pretrained must keep the file's dtype (transformers 5's
    # default dtype="auto"; 4.x loaded float32 unless asked).
    return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)


MODELS = {"gpt2": make_gpt2, "llama": make_llama}


@pytest.fixture(params=sorted(MODELS))
def model(request):
    torch.manual_seed(14)
    m = MODELS[request.param]().eval()
    # Weights that are not their initial values, so a load that skipped a
    # tensor and left it initialised would not pass.
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape).to(p.dtype))
    return m


def shard_size(m):
    """A max_shard_size (bytes) over half the weights: 2 or 3 shards with a
    greedy cut (any two neighbouring shards hold more than it)."""
    total = sum(t.numel() * t.element_size() for t in saved_state_dict(m).values())
    return total // 2 + 1


def saved_state_dict(m):
    """What save_pretrained stores: the state dict less the tied copies, the
    keys of _tied_weights_keys (a {tied: source} dict in transformers 5, a
    list before) whose tensor shares storage with another key's."""
    sd = m.state_dict()
    out = dict(sd)
    for key in getattr(m, "_tied_weights_keys", None) or ():
        if key in sd and any(other != key and sd[other].data_ptr() == sd[key].data_ptr()
                             for other in sd):
            del out[key]
    return out


def same(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, \
        (what, got.dtype, got.shape, want.dtype, want.shape)
    assert torch.equal(got, want), what


def shards_of(directory):
    return sorted(p.name for p in directory.glob("*.safetensors"))


def test_save_pretrained_loads_in_ckptio(model, tmp_path):
    model.save_pretrained(tmp_path, max_shard_size=shard_size(model))
    assert 2 <= len(shards_of(tmp_path)) <= 3, shards_of(tmp_path)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    want = saved_state_dict(model)
    assert set(index["weight_map"]) == set(want), "tied keys differ from save_pretrained's"

    for source in (tmp_path, tmp_path / "model.safetensors.index.json"):
        for backend in ("mmap", "pread"):
            got = ct.load_file(source, backend=backend)
            assert set(got) == set(want), source
            for name, t in want.items():
                same(got[name], t, f"{name} from {source.name} backend={backend}")


def test_save_pretrained_slices_in_ckptio(model, tmp_path):
    model.save_pretrained(tmp_path, max_shard_size=shard_size(model))
    want = saved_state_dict(model)
    with ct.safe_open(tmp_path, framework="pt") as f:
        assert f.format() == "safetensors-sharded"
        assert f.keys() == sorted(want)
        matrices = 0
        for name in f.keys():
            t = want[name]
            s = f.get_slice(name)
            assert s.get_shape() == list(t.shape), name
            if t.dim() != 2:
                same(s[:], t, name)
                continue
            matrices += 1
            rows, cols = t.shape
            same(s[1:rows - 1], t[1:rows - 1], f"{name}[1:-1]")
            same(s[:, cols // 4:cols // 2], t[:, cols // 4:cols // 2], f"{name}[:, a:b]")
            same(s[rows - 1], t[rows - 1], f"{name}[-1]")
            # Tensor parallelism: each of 4 ranks' torch.chunk part, both ways.
            for dim in (0, 1):
                for rank, part in enumerate(torch.chunk(t, 4, dim)):
                    start, stop, ranges = s.plan(dim, rank, 4)
                    key = (slice(None),) * dim + (slice(start, stop),)
                    same(s[key], part, f"{name} dim {dim} rank {rank}")
                    assert sum(n for _, _, n in ranges) == part.numel() * part.element_size()
        assert matrices >= 4


def from_pretrained(model, directory):
    """model's class loaded from `directory`, checked to have taken every key."""
    loaded, info = type(model).from_pretrained(directory, output_loading_info=True)
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(kind), (kind, info[kind])
    return loaded.eval()


def check_equal(loaded, model):
    want = model.state_dict()
    got = loaded.state_dict()
    assert set(got) == set(want)
    for name, t in want.items():
        same(got[name], t, name)  # tied copies too: from_pretrained ties them again


def test_ckptio_file_loads_with_from_pretrained(model, tmp_path):
    model.config.save_pretrained(tmp_path)
    ct.save_file(saved_state_dict(model), tmp_path / "model.safetensors",
                 metadata={"format": "pt"})
    check_equal(from_pretrained(model, tmp_path), model)


def test_ckptio_set_loads_with_from_pretrained(model, tmp_path):
    model.config.save_pretrained(tmp_path)
    ct.save_torch_state_dict(saved_state_dict(model), tmp_path,
                             max_shard_size=shard_size(model))
    assert 2 <= len(shards_of(tmp_path)) <= 3, shards_of(tmp_path)
    check_equal(from_pretrained(model, tmp_path), model)


def test_set_layout_against_save_pretrained(model, tmp_path):
    """What the docstring says is the same and what differs, so a change in
    either writer is seen."""
    hf, ck = tmp_path / "hf", tmp_path / "ck"
    hf.mkdir()
    ck.mkdir()
    model.save_pretrained(hf, max_shard_size=shard_size(model))
    ct.save_torch_state_dict(saved_state_dict(model), ck, max_shard_size=shard_size(model))
    hf_index = json.loads((hf / "model.safetensors.index.json").read_text())
    ck_index = json.loads((ck / "model.safetensors.index.json").read_text())
    assert hf_index["metadata"]["total_size"] == ck_index["metadata"]["total_size"]
    assert "ckptio.save_id" in ck_index["metadata"]
    for directory in (hf, ck):
        for shard in shards_of(directory):
            with ct.safe_open(directory / shard, framework="pt") as f:
                assert f.metadata()["format"] == "pt", (directory, shard)
    others = lambda d: {p.name for p in d.iterdir() if not p.name.endswith(".safetensors")}  # noqa: E731
    assert others(hf) - others(ck) == {"config.json", "generation_config.json"}
    # The same split rule: the same shards, each tensor in the same one.
    assert shards_of(hf) == shards_of(ck)
    assert hf_index["weight_map"] == ck_index["weight_map"]
    assert "total_parameters" in hf_index["metadata"]
