"""Sharded checkpoints against the real safetensors package and the Hugging
Face convention: a set built the way huggingface_hub / transformers write one
(save_file per shard with {"format": "pt"} metadata, then json.dump of
{"metadata": {"total_size"}, "weight_map"} with indent=2, sort_keys=True)
opens in ckptio through its index and its directory with every tensor equal;
a set ckptio writes (`ckptio convert --max-shard-size`) opens shard by shard
in safetensors and through the index with the loop transformers runs
(read weight_map, safe_open each file). Run by ctest through run_pytest.sh."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import safetensors.numpy
from safetensors import safe_open

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
import ckptio  # noqa: E402

CLI = os.environ.get("CKPTIO_CLI")


def model(seed=0):
    rng = np.random.default_rng(seed)
    t = {}
    for i in range(6):
        t[f"model.layers.{i}.self_attn.q_proj.weight"] = rng.standard_normal((64, 64)).astype(np.float32)
        t[f"model.layers.{i}.mlp.up_proj.weight"] = rng.standard_normal((128, 64)).astype(np.float16)
        t[f"model.layers.{i}.input_layernorm.weight"] = rng.standard_normal(64).astype(np.float32)
    t["model.embed_tokens.weight"] = rng.standard_normal((500, 64)).astype(np.float32)  # > one shard
    t["lm_head.weight"] = rng.integers(-100, 100, (100, 64), dtype=np.int64)
    t["model.norm.step"] = np.array(7, dtype=np.int32)
    return t


def hf_save_sharded(tensors, directory, max_shard_size, prefix="model"):
    """What huggingface_hub.split_torch_state_dict_into_shards + save_file +
    the index json.dump produce: shards filled in order, a tensor larger than
    the limit alone, 1-based 5-digit names, sorted-key indented index."""
    shards, cur, size = [], {}, 0
    for name, arr in tensors.items():
        if cur and size + arr.nbytes > max_shard_size:
            shards.append(cur)
            cur, size = {}, 0
        cur[name] = arr
        size += arr.nbytes
    shards.append(cur)
    weight_map = {}
    for k, shard in enumerate(shards):
        fname = f"{prefix}-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        safetensors.numpy.save_file(shard, os.path.join(directory, fname), metadata={"format": "pt"})
        weight_map.update({name: fname for name in shard})
    index = {"metadata": {"total_size": sum(a.nbytes for a in tensors.values())}, "weight_map": weight_map}
    with open(os.path.join(directory, f"{prefix}.safetensors.index.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return len(shards)


def transformers_like_load(index_path):
    """transformers' sharded loading: the index's weight_map, each shard
    opened with safe_open, every tensor taken from the file it names."""
    with open(index_path, encoding="utf-8") as f:
        index = json.load(f)
    directory = os.path.dirname(index_path)
    out = {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(os.path.join(directory, shard), framework="np") as f:
            assert f.metadata().get("format") == "pt" or "ckptio.save_id" in f.metadata()
            for name in f.keys():
                assert index["weight_map"][name] == shard
                out[name] = f.get_tensor(name)
    assert set(out) == set(index["weight_map"])
    return out


def assert_same(got, want):
    assert sorted(got) == sorted(want)
    for name, arr in want.items():
        assert got[name].dtype == arr.dtype, name
        assert got[name].shape == arr.shape, name
        np.testing.assert_array_equal(got[name], arr, err_msg=name)


def test_hf_written_set_opens_in_ckptio(tmp_path):
    want = model(1)
    n = hf_save_sharded(want, tmp_path, 40000)
    assert n >= 4
    index = tmp_path / "model.safetensors.index.json"
    assert_same(ckptio.load_file(index), want)
    assert_same(ckptio.load_file(tmp_path), want)
    meta = ckptio.load_metadata(index)
    assert meta["total_size"] == str(sum(a.nbytes for a in want.values()))
    assert meta["format"] == "pt"
    assert ckptio.verify(index) == len(want)  # safetensors records no CRC: all unchecked


def test_hf_written_set_with_a_missing_tensor_is_refused(tmp_path):
    want = model(2)
    hf_save_sharded(want, tmp_path, 40000)
    index = tmp_path / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    doc["weight_map"]["ghost.weight"] = sorted(doc["weight_map"].values())[0]
    index.write_text(json.dumps(doc, indent=2, sort_keys=True))
    with pytest.raises(ckptio.CkptioError) as e:
        ckptio.load_file(index)
    assert e.value.code == ckptio.ERRORS["SHARD"]
    assert "ghost.weight" in str(e.value)


@pytest.mark.skipif(not CLI, reason="CKPTIO_CLI not set")
def test_ckptio_written_set_opens_in_safetensors(tmp_path):
    want = model(3)
    single = tmp_path / "model.safetensors"
    ckptio.save_file(want, single, metadata={"format": "pt"})
    out = tmp_path / "set"
    subprocess.run([CLI, "convert", str(single), str(out), "--max-shard-size", "40000B"], check=True,
                   capture_output=True)
    index_path = out / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in want.values())
    assert isinstance(index["metadata"]["ckptio.save_id"], str)
    files = sorted(set(index["weight_map"].values()))
    assert files == sorted(p.name for p in out.iterdir() if p.name.endswith(".safetensors"))
    assert len(files) >= 4
    # Each shard on its own in the real package, with its place in the set.
    for k, fname in enumerate(files):
        assert fname == f"model-{k + 1:05d}-of-{len(files):05d}.safetensors"
        got = safetensors.numpy.load_file(out / fname)
        for name, arr in got.items():
            np.testing.assert_array_equal(arr, want[name])
        with safe_open(out / fname, framework="np") as f:
            assert f.metadata()["ckptio.shard"] == f"{k + 1}/{len(files)}"
            assert f.metadata()["ckptio.save_id"] == index["metadata"]["ckptio.save_id"]
    assert_same(transformers_like_load(str(index_path)), want)
    # And through ckptio, with its CRCs checked.
    assert_same(ckptio.load_file(index_path), want)
    assert ckptio.verify(out) == 0


def test_torch_written_set_opens_in_ckptio(tmp_path):
    torch = pytest.importorskip("torch")
    import safetensors.torch
    g = torch.Generator().manual_seed(0)
    state = {"a.weight": torch.randn(300, 100, generator=g, dtype=torch.float32).to(torch.bfloat16),
             "b.weight": torch.randn(200, 100, generator=g), "c.bias": torch.arange(10)}
    weight_map = {}
    for k, names in enumerate([["a.weight"], ["b.weight", "c.bias"]]):
        fname = f"model-{k + 1:05d}-of-00002.safetensors"
        safetensors.torch.save_file({n: state[n] for n in names}, tmp_path / fname, metadata={"format": "pt"})
        weight_map.update({n: fname for n in names})
    total = sum(t.numel() * t.element_size() for t in state.values())
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2, sort_keys=True))
    got = ckptio.load_file(tmp_path)
    assert got["a.weight"].dtype == "BF16"
    assert got["a.weight"].tobytes() == state["a.weight"].view(torch.int16).numpy().tobytes()
    np.testing.assert_array_equal(got["b.weight"], state["b.weight"].numpy())
    np.testing.assert_array_equal(got["c.bias"], state["c.bias"].numpy())
