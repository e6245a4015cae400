"""ckptio.torch.save_torch_state_dict / _async (sharded saves, the Hugging
Face layout) against the real torch and safetensors: every shard opens alone
in safetensors and the set loads through its index the way transformers
loads one (weight_map, then safe_open per shard), bit for bit for several
dtypes; names, index and split follow huggingface_hub's
split_torch_state_dict_into_shards (compared with huggingface_hub itself
when it is importable, else with the rule written out); ct.load_file of the
directory returns the same tensors; max_shard_size parses like
huggingface_hub (decimal units) and transformers (binary units) and refuses
anything else with a ValueError; the async handle keeps the values of its
snapshot; a refused save raises and leaves the directory as it was, with
no temp file. Run by ctest through run_pytest.sh (CKPTIO_PYTEST_NEEDS=torch)."""

import json
import os
import pathlib
import re
import sys

import pytest
import safetensors.torch
import torch
from safetensors import safe_open as st_safe_open

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
import ckptio  # noqa: E402
import ckptio.torch as ct  # noqa: E402

INDEX = "model.safetensors.index.json"
SHARD_RE = re.compile(r"model-(\d{5})-of-(\d{5})\.safetensors")


def random_tensor(dtype, shape, seed):
    """Random bit patterns of any dtype (NaNs included), or 0/1 for bool."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    n = 1
    for d in shape:
        n *= d
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(shape)


def state_dict():
    """A small model of several dtypes: 16 KiB, 8 KiB and 1 KiB tensors, one
    of 40 KiB (over a 32 KiB limit), a scalar and an empty tensor."""
    sd = {}
    for i in range(4):
        sd[f"model.layers.{i}.q_proj.weight"] = random_tensor(torch.bfloat16, (64, 128), 10 * i)
        sd[f"model.layers.{i}.mlp.weight"] = random_tensor(torch.float32, (32, 64), 10 * i + 1)
        sd[f"model.layers.{i}.norm.weight"] = random_tensor(torch.float16, (512,), 10 * i + 2)
        if i == 1:
            sd["model.embed_tokens.weight"] = random_tensor(torch.float32, (80, 128), 99)
    sd["model.mask"] = random_tensor(torch.bool, (33,), 5)
    sd["model.ids"] = random_tensor(torch.int64, (7, 3), 6)
    sd["model.bytes"] = random_tensor(torch.uint8, (100,), 7)
    sd["model.f64"] = random_tensor(torch.float64, (), 8)
    sd["model.empty"] = torch.empty(0, 4, dtype=torch.int32)
    return sd


def bits(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_same(got, want):
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert bits(got[name]) == bits(t), name


def nbytes(t):
    return t.numel() * t.element_size()


def hf_split(sd, limit):
    """huggingface_hub's split_state_dict_into_shards_factory, written out:
    in dict order, a tensor over the limit gets a shard of its own appended
    when met, otherwise a new shard starts when the next tensor would push
    the open one over the limit. {file name: [tensor names]}."""
    shards, cur, fill = [], [], 0
    for name, t in sd.items():
        n = nbytes(t)
        if n > limit:
            shards.append([name])
            continue
        if fill + n > limit:
            shards.append(cur)
            cur, fill = [], 0
        cur.append(name)
        fill += n
    if cur:
        shards.append(cur)
    return {f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors": names
            for k, names in enumerate(shards)}


def transformers_like_load(directory):
    """transformers' sharded load: the index's weight_map, each shard opened
    with safe_open (whose metadata must say format=pt), every tensor taken
    from the file the index names."""
    with open(directory / INDEX, encoding="utf-8") as f:
        index = json.load(f)
    out = {}
    for shard in sorted(set(index["weight_map"].values())):
        with st_safe_open(directory / shard, framework="pt") as f:
            assert f.metadata()["format"] == "pt", shard
            for name in f.keys():
                assert index["weight_map"][name] == shard
                out[name] = f.get_tensor(name)
    assert set(out) == set(index["weight_map"])
    return index, out


def listing(directory):
    return sorted(os.listdir(directory))


# ------------------------------------------------------------ the set

def test_set_opens_in_safetensors_and_like_transformers(tmp_path):
    sd = state_dict()
    ct.save_torch_state_dict(sd, tmp_path, max_shard_size="32KiB", metadata={"step": "7"})

    split = hf_split(sd, 32 << 10)
    assert len(split) >= 4
    assert listing(tmp_path) == sorted(list(split) + [INDEX])
    # Shard by shard in safetensors: each holds the tensors of its part of
    # the split, with the caller's metadata and format=pt.
    for fname, names in split.items():
        got = safetensors.torch.load_file(tmp_path / fname)
        assert sorted(got) == sorted(names), fname
        assert_same(got, {n: sd[n] for n in names})
        with st_safe_open(tmp_path / fname, framework="pt") as f:
            meta = f.metadata()
        assert meta["format"] == "pt" and meta["step"] == "7", meta
        assert sum(nbytes(sd[n]) for n in names) <= 32 << 10 or len(names) == 1, fname
    # Through the index, as transformers does.
    index, got = transformers_like_load(tmp_path)
    assert_same(got, sd)
    assert index["metadata"]["total_size"] == sum(nbytes(t) for t in sd.values())
    assert index["weight_map"] == {n: f for f, names in split.items() for n in names}
    assert list(index["weight_map"]) == sorted(index["weight_map"])
    # And back through ckptio: the directory, the index, and safe_open.
    assert_same(ct.load_file(tmp_path), sd)
    assert_same(ct.load_file(tmp_path / INDEX, backend="pread"), sd)
    with ct.safe_open(tmp_path) as f:
        assert f.format() == "safetensors-sharded"
        assert f.keys() == sorted(sd)
        assert torch.equal(f.get_tensor("model.ids"), sd["model.ids"])


def test_a_tensor_over_the_limit_is_placed_as_huggingface_hub_places_it(tmp_path):
    # a, b fit together; big does not fit at all: huggingface_hub appends
    # big's own shard first and keeps filling {a, b, c}; then d overflows.
    sd = {"a": torch.zeros(100), "big": torch.zeros(1000), "b": torch.zeros(100),
          "c": torch.zeros(40), "d": torch.zeros(200)}
    ct.save_torch_state_dict(sd, tmp_path, max_shard_size=1000)
    index = json.loads((tmp_path / INDEX).read_text())
    shard = {n: int(SHARD_RE.fullmatch(f)[1]) for n, f in index["weight_map"].items()}
    assert shard == {"big": 1, "a": 2, "b": 2, "c": 2, "d": 3}
    assert hf_split(sd, 1000) == {f"model-{k:05d}-of-00003.safetensors": names for k, names in
                                  ((1, ["big"]), (2, ["a", "b", "c"]), (3, ["d"]))}


def test_layout_equals_huggingface_hub(tmp_path):
    hub = pytest.importorskip("huggingface_hub")
    sd = state_dict()
    for size in ("32KiB", "20KB", 5000, "1GB"):
        out = tmp_path / str(size)
        out.mkdir()
        ct.save_torch_state_dict(sd, out, max_shard_size=size)
        split = hub.split_torch_state_dict_into_shards(sd, max_shard_size=ct.parse_size(size))
        index = json.loads((out / INDEX).read_text())
        if split.is_sharded:  # one shard: huggingface_hub writes model.safetensors, no index
            assert index["weight_map"] == split.tensor_to_filename, size
            assert index["metadata"]["total_size"] == split.metadata["total_size"]


def test_prefix_and_a_single_shard(tmp_path):
    sd = {"w": torch.ones(3), "b": torch.zeros(2, dtype=torch.int16)}
    ct.save_torch_state_dict(sd, tmp_path, prefix="adapter")  # 5GB: one shard
    assert listing(tmp_path) == ["adapter-00001-of-00001.safetensors",
                                 "adapter.safetensors.index.json"]
    assert_same(ct.load_file(tmp_path / "adapter.safetensors.index.json"), sd)


def test_resave_replaces_the_set(tmp_path):
    first = state_dict()
    ct.save_torch_state_dict(first, tmp_path, max_shard_size="16KiB")
    second = {"only": torch.arange(10)}
    ct.save_torch_state_dict(second, tmp_path, max_shard_size="16KiB")
    # The old shards (another count) are gone, the new set loads alone.
    assert listing(tmp_path) == ["model-00001-of-00001.safetensors", INDEX]
    assert_same(ct.load_file(tmp_path), second)


# ------------------------------------------------------------ max_shard_size

@pytest.mark.parametrize("text,want", [
    (1, 1), (123456, 123456), ("5GB", 5 * 10**9), ("500MB", 500 * 10**6), ("10KB", 10**4),
    ("1TB", 10**12), ("1.5GB", 1_500_000_000), (" 5 gb ", 5 * 10**9), ("2GiB", 2 << 30),
    ("500MiB", 500 << 20), ("64kib", 64 << 10), ("1TiB", 1 << 40), (".5MB", 500_000),
])
def test_max_shard_size_parses(text, want):
    assert ct.parse_size(text) == want


@pytest.mark.parametrize("bad", ["5", "5G", "5 GBs", "GB", "five GB", "5PB", "-1GB", "1e3MB",
                                 "", "0.0000001KB", 0, -5, "0MB", 2**64, "1e30"])
def test_bad_max_shard_size_is_a_value_error(tmp_path, bad):
    with pytest.raises(ValueError, match="max_shard_size") as e:
        ct.save_torch_state_dict({"w": torch.ones(2)}, tmp_path, max_shard_size=bad)
    assert repr(bad) in str(e.value)
    assert listing(tmp_path) == []


@pytest.mark.parametrize("bad", [None, 5.0, True, b"5GB"])
def test_max_shard_size_of_another_type_is_a_type_error(tmp_path, bad):
    with pytest.raises(TypeError, match="max_shard_size"):
        ct.save_torch_state_dict({"w": torch.ones(2)}, tmp_path, max_shard_size=bad)


def test_size_message_names_the_units(tmp_path):
    with pytest.raises(ValueError) as e:
        ct.parse_size("5G")
    msg = str(e.value)
    assert "'5G'" in msg and "KB / MB / GB" in msg and "KiB / MiB / GiB" in msg, msg


# ------------------------------------------------------------ async

def test_async_handle_keeps_the_snapshot(tmp_path):
    tensors = {f"w{i}": torch.randn(2 << 20) for i in range(6)}  # 8 MiB each, 48 MiB
    tensors["nc"] = torch.randn(256, 512).t()  # saved from a private contiguous copy
    want = {k: v.clone() for k, v in tensors.items()}
    h = ct.save_torch_state_dict_async(tensors, tmp_path, max_shard_size="20MB")
    assert isinstance(h, ct.SaveHandle) and h.filename == str(tmp_path)
    h.wait_snapshot()
    assert h.snapshot_done()
    for t in tensors.values():  # the training step after the snapshot
        t.add_(1.0)
    h.wait_durable()
    assert h.done() and h.snapshot_done()
    total = sum(nbytes(v) for v in want.values())
    assert h.progress() == (total, total)
    st = h.stats()
    assert st["bytes"] == total and st["seconds"] > 0 and st["write_seconds"] > 0, st
    assert st["snapshot_seconds"] <= st["seconds"], st
    h.wait_durable()  # repeatable
    h.wait_snapshot()
    assert len([f for f in listing(tmp_path) if SHARD_RE.fullmatch(f)]) == 3
    assert_same(ct.load_file(tmp_path), want)
    _, got = transformers_like_load(tmp_path)
    assert_same(got, want)


def test_async_handle_as_a_context_manager_and_polls(tmp_path):
    sd = state_dict()
    with ct.save_torch_state_dict_async(sd, tmp_path, max_shard_size="32KiB") as h:
        while not h.done():
            h.snapshot_done()
            done, total = h.progress()
            assert 0 <= done <= total
        assert "open" in repr(h)
    assert "closed" in repr(h)
    assert h.done() and h.snapshot_done()
    assert h.stats()["bytes"] == sum(nbytes(t) for t in sd.values())
    assert_same(ct.load_file(tmp_path), sd)


# ------------------------------------------------------------ failures

def no_temp_files(directory):
    return [f for f in listing(directory) if "ckptio-tmp" in f] == []


def test_refused_saves_raise_and_change_nothing(tmp_path):
    old = state_dict()
    ct.save_torch_state_dict(old, tmp_path, max_shard_size="32KiB")
    before = {f: (tmp_path / f).read_bytes() for f in listing(tmp_path)}
    good = torch.ones(4)
    bad_inputs = [
        ({"x": torch.randn(2, dtype=torch.complex128)}, {}, TypeError, "complex128"),
        ({"x": torch.randn(2).to_sparse()}, {}, TypeError, "sparse"),
        ({"x": torch.empty(2, device="meta")}, {}, TypeError, "meta"),
        ({"x": good, "y": [1, 2]}, {}, TypeError, "torch.Tensor"),
        ({3: good}, {}, TypeError, "names must be str"),
        ([("x", good)], {}, TypeError, "dict"),
        ({"x": good}, {"metadata": {"step": 3}}, TypeError, "metadata"),
        ({"x": good}, {"metadata": "format=pt"}, TypeError, "metadata"),
        ({"x": good}, {"prefix": 7}, TypeError, "prefix"),
        # Refused by the library, after the writer was opened or by the open.
        ({"__metadata__": good}, {}, ckptio.CkptioError, "reserved"),
        ({"x": good}, {"metadata": {"ckptio.save_id": "x"}}, ckptio.CkptioError, "reserved"),
        ({"x": good}, {"prefix": "a/b"}, ckptio.CkptioError, "prefix"),
        ({}, {}, ckptio.CkptioError, "at least one tensor"),
    ]
    for tensors, kw, exc, match in bad_inputs:
        with pytest.raises(exc, match=match):
            ct.save_torch_state_dict(tensors, tmp_path, max_shard_size="32KiB", **kw)
        now = {f: (tmp_path / f).read_bytes() for f in listing(tmp_path)}
        assert now == before, match
    assert_same(ct.load_file(tmp_path), old)


def test_save_directory_must_be_a_directory(tmp_path):
    a_file = tmp_path / "weights"
    a_file.write_bytes(b"not a directory")
    with pytest.raises(ckptio.CkptioError, match="Not a directory") as e:
        ct.save_torch_state_dict({"w": torch.ones(2)}, a_file)
    assert e.value.code == -20  # -ENOTDIR
    with pytest.raises(ckptio.CkptioError, match="No such file") as e:
        ct.save_torch_state_dict_async({"w": torch.ones(2)}, tmp_path / "missing")
    assert e.value.code == -2  # -ENOENT
    assert listing(tmp_path) == ["weights"] and a_file.read_bytes() == b"not a directory"


def test_non_contiguous_tensors_are_saved_by_value(tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    sd = {"t": base.t(), "step": base[:, ::2], "conj": torch.randn(3, dtype=torch.complex64).conj()}
    ct.save_torch_state_dict(sd, tmp_path, max_shard_size=64)
    got = ct.load_file(tmp_path)
    for name, t in sd.items():
        assert torch.equal(got[name], t.resolve_conj()), name
    assert no_temp_files(tmp_path)
