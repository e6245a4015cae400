"""End to end with the real torch: files real torch.save writes load through
ckptio's pipeline (python/ckptio over libckptio.so) with equal values, views
and transposed views included; files ckptio writes as .pt load in
torch.load(weights_only=True, mmap=True); a .pt converted to safetensors and
back by `ckptio convert` keeps every tensor. Needs torch in the venv
(run_pytest.sh skips loudly when it is missing)."""

import os
import subprocess

import numpy as np
import pytest
import torch

import ckptio

NUMPY_OF = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
            torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16,
            torch.int8: np.int8, torch.uint8: np.uint8, torch.bool: np.bool_}


def as_numpy(value):
    """ckptio's loaded value as numpy bytes-equivalent for comparison."""
    if isinstance(value, ckptio.Tensor):
        return np.frombuffer(bytes(value.buffer), np.uint8)
    return value


def torch_bytes(t):
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(np.uint8).reshape(-1)
    return t.contiguous().numpy()


def checkpoint():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 48, generator=g)
    return {
        "model": {"w": w, "w_t": w.t(), "row": w[3], "cols": w[:, 5:9],
                  "bf": torch.randn(33, generator=g).to(torch.bfloat16),
                  "i64": torch.arange(10), "flag": torch.tensor([True, False, True]),
                  "scalar": torch.tensor(2.5, dtype=torch.float64)},
        "optimizer": {"state": {0: {"exp_avg": torch.zeros(4, 4)}},
                      "param_groups": [{"lr": 0.001, "params": [0]}]},
        "step": 120,
    }


def flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, name + "."))
        elif isinstance(v, torch.Tensor):
            out[name] = v
    return out


def test_real_torch_save_loads_through_the_pipeline(tmp_path):
    path = tmp_path / "real.pt"
    ckpt = checkpoint()
    torch.save(ckpt, path)
    got = ckptio.load_file(path)
    want = flatten(ckpt)
    assert set(got) == set(want)
    for name, t in want.items():
        g = as_numpy(got[name])
        if t.dtype == torch.bfloat16:
            assert bytes(g) == torch_bytes(t).tobytes(), name
        else:
            np.testing.assert_array_equal(g, t.numpy(), err_msg=name)
    meta = ckptio.load_metadata(path)
    assert meta["step"] == "120"
    assert meta["optimizer.param_groups.0.lr"] == "0.001"


@pytest.mark.parametrize("crc", [True, False])
def test_ckptio_pt_opens_in_torch_load(tmp_path, crc):
    rng = np.random.default_rng(1)
    tensors = {"layers.0.w": rng.standard_normal((128, 64)).astype(np.float32),
               "layers.0.b": rng.standard_normal(64).astype(np.float16),
               "ids": np.arange(7, dtype=np.int64), "mask": np.array([True, False]),
               "empty": np.zeros((0, 3), np.float32), "scalar": np.array(3, np.int32)}
    path = tmp_path / "ours.pt"
    ckptio.save_file(tensors, path, crc=crc, format="pt")
    for mmap in (False, True):
        loaded = torch.load(path, weights_only=True, mmap=mmap)
        assert list(loaded) == list(tensors)
        for name, arr in tensors.items():
            np.testing.assert_array_equal(loaded[name].numpy(), arr, err_msg=name)
    import zipfile
    # Without CRCs the records say 0, PyTorch's own "no crc" mode: torch
    # loads it, zipfile's CRC check rightly does not pass it.
    bad = zipfile.ZipFile(path).testzip()
    assert bad is None if crc else bad is not None


def test_convert_round_trip_keeps_every_tensor(tmp_path):
    cli = os.environ.get("CKPTIO_CLI")
    if not cli:
        pytest.fail("CKPTIO_CLI (the ckptio command) is not set")
    src = tmp_path / "src.pt"
    ckpt = checkpoint()
    torch.save(ckpt, src)
    st, back = tmp_path / "mid.safetensors", tmp_path / "back.pt"
    subprocess.run([cli, "convert", str(src), str(st)], check=True)
    subprocess.run([cli, "convert", str(st), str(back)], check=True)
    from safetensors.torch import load_file
    mid = load_file(st)
    again = torch.load(back, weights_only=True, mmap=True)
    for name, t in flatten(ckpt).items():
        assert torch.equal(mid[name], t.contiguous()), name
        assert torch.equal(again[name], t.contiguous()), name


def test_hostile_pickle_is_refused_by_load(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned > " + str(tmp_path / "pwned"),))

    path = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(2), "x": Evil()}, path)
    with pytest.raises(ckptio.CkptioError) as e:
        ckptio.load_file(path)
    assert "system" in str(e.value)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.skipif(os.environ.get("CKPTIO_TEST_SLOW") != "1", reason="slow: set CKPTIO_TEST_SLOW=1")
def test_zip64_past_four_gib(tmp_path):
    """A tensor over 4 GiB and one after it: zip64 sizes and offsets, written
    through the pipeline, loaded by torch with mmap (nothing is read but the
    pages looked at). The big source is untouched calloc memory: zero pages
    that cost no RAM."""
    big = np.zeros((4 << 30) + 100, np.uint8)
    tail = np.arange(1000, dtype=np.float32)
    path = tmp_path / "big.pt"
    ckptio.save_file({"big": big, "tail": tail}, path, format="pt")
    loaded = torch.load(path, weights_only=True, mmap=True)
    assert loaded["big"].shape == (big.size,)
    assert int(loaded["big"][-100:].sum()) == 0
    np.testing.assert_array_equal(loaded["tail"].numpy(), tail)
    import zipfile
    info = {i.filename.split("/", 1)[1]: i for i in zipfile.ZipFile(path).infolist()}
    assert info["data/0"].file_size == big.size
    assert info["data/1"].header_offset > 0xFFFFFFFF
    # ckptio reads it back too, checking both CRCs (the big one over 4 GiB).
    got = ckptio.load_file(path)
    np.testing.assert_array_equal(got["tail"], tail)
