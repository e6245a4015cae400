"""Compressed checkpoints against the real tools: the `zstd` command turns a
ckptio compressed file back into the plain safetensors file ckptio writes,
which the safetensors package opens with the same values; the binding and
the CLI (convert --compress, inspect, verify) round-trip both filters."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import safetensors.numpy

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
import ckptio  # noqa: E402

ZSTD = shutil.which("zstd")
CLI = os.environ.get("CKPTIO_CLI")


def weights():
    rng = np.random.default_rng(7)
    return {
        "embed.weight": (rng.standard_normal((512, 320)) * 0.02).astype(np.float32),
        "layers.0.norm.weight": np.ones(320, np.float32),
        "layers.0.mlp.weight": (rng.standard_normal((640, 320)) * 0.02).astype(np.float16),
        "layers.0.mlp.bias": rng.standard_normal(641).astype(np.float64),
        "step": np.array(12345, np.int64),
        "mask": rng.integers(0, 2, 999).astype(np.bool_),
        "empty": np.zeros((0, 4), np.float32),
    }


def same(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert np.array_equal(a[k], b[k]), k


@pytest.mark.skipif(ZSTD is None, reason="the zstd command is not installed")
@pytest.mark.parametrize("level", [1, 3, 19])
def test_zstd_cli_restores_the_plain_file(tmp_path, level):
    w = weights()
    ckptio.save_file(w, tmp_path / "plain.safetensors", metadata={"k": "v"})
    ckptio.save_file(w, tmp_path / "c.zst", metadata={"k": "v"}, compress=level)
    assert (tmp_path / "c.zst").stat().st_size < (tmp_path / "plain.safetensors").stat().st_size
    subprocess.run([ZSTD, "-q", "-d", "-f", str(tmp_path / "c.zst"), "-o", str(tmp_path / "d.safetensors")],
                   check=True)
    assert (tmp_path / "d.safetensors").read_bytes() == (tmp_path / "plain.safetensors").read_bytes()
    same(safetensors.numpy.load_file(tmp_path / "d.safetensors"), w)
    same(ckptio.load_file(tmp_path / "c.zst"), w)
    assert ckptio.load_metadata(tmp_path / "c.zst")["k"] == "v"
    assert ckptio.verify(tmp_path / "c.zst") == 0


def test_shuffle_is_undone_by_ckptio_only(tmp_path):
    w = weights()
    ckptio.save_file(w, tmp_path / "s.zst", compress=1, shuffle=True)
    same(ckptio.load_file(tmp_path / "s.zst"), w)
    assert ckptio.load_metadata(tmp_path / "s.zst")["ckptio.filter"] == "shuffle"
    if ZSTD:  # still a valid zstd stream, of the shuffled bytes
        out = subprocess.run([ZSTD, "-q", "-d", "-c", str(tmp_path / "s.zst")], check=True,
                             capture_output=True).stdout
        ckptio.save_file(w, tmp_path / "plain.safetensors")
        plain = (tmp_path / "plain.safetensors").read_bytes()
        assert len(out) == len(plain) and out != plain


def test_refusals(tmp_path):
    with pytest.raises(ckptio.CkptioError) as e:
        ckptio.save_file(weights(), tmp_path / "x.pt", format="pt", compress=3)
    assert e.value.code == ckptio.ERRORS["FORMAT"]
    with pytest.raises(ckptio.CkptioError) as e:
        ckptio.save_file(weights(), tmp_path / "x", shuffle=True)
    assert e.value.code == ckptio.ERRORS["INVALID_ARG"]
    (tmp_path / "bad.zst").write_bytes(b"\x28\xb5\x2f\xfd" + b"\0" * 64)
    with pytest.raises(ckptio.CkptioError) as e:
        ckptio.load_file(tmp_path / "bad.zst")
    assert e.value.code == ckptio.ERRORS["ZSTD"]
    assert not list(tmp_path.glob(".*ckptio-tmp*"))


@pytest.mark.skipif(not CLI, reason="CKPTIO_CLI not set")
def test_cli_convert_inspect_verify(tmp_path):
    w = weights()
    safetensors.numpy.save_file(w, tmp_path / "in.safetensors")
    run = lambda *a: subprocess.run([CLI, *map(str, a)], check=True, capture_output=True, text=True).stdout
    run("convert", "--compress", "3", "--shuffle", tmp_path / "in.safetensors", tmp_path / "c.zst")
    info = json.loads(run("inspect", "--json", tmp_path / "c.zst"))
    comp = info["compression"]
    assert comp["codec"] == "zstd-seekable" and comp["filter"] == "shuffle" and comp["frames"] >= 2
    assert comp["compressed_bytes"] == (tmp_path / "c.zst").stat().st_size
    assert comp["ratio"] > 1.0
    assert "zstd seekable" in run("inspect", tmp_path / "c.zst")
    assert run("verify", tmp_path / "c.zst").startswith("OK")
    run("convert", tmp_path / "c.zst", tmp_path / "back.safetensors")
    same(safetensors.numpy.load_file(tmp_path / "back.safetensors"), w)
    # The decompressed tensors were pulled as the output was written: no temp file.
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ckptio-convert-")]
    bad = subprocess.run([CLI, "convert", "--compress", "3", tmp_path / "in.safetensors", tmp_path / "x.pt"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "only safetensors" in bad.stderr
    # A corrupt seek table: exit 1 (invalid file), the rule named.
    data = bytearray((tmp_path / "c.zst").read_bytes())
    data[-5] |= 0x04
    (tmp_path / "bad.zst").write_bytes(bytes(data))
    bad = subprocess.run([CLI, "verify", tmp_path / "bad.zst"], capture_output=True, text=True)
    assert bad.returncode == 1 and "reserved" in bad.stderr + bad.stdout


@pytest.mark.skipif(not CLI, reason="CKPTIO_CLI not set")
def test_cli_convert_pulls_large_tensors_bit_exact(tmp_path):
    """Tensors bigger than the 8 MiB pipeline chunk, of 1 to 4 dimensions:
    converting a compressed file (no views) pulls each output chunk's bytes
    as boxes of rows, partial rows at its ends; into a compressed output the
    frames may end inside an element. Every byte must come back."""
    rng = np.random.default_rng(3)
    w = {
        "cube": rng.standard_normal((5, 1000, 1001)).astype(np.float32),
        "four": rng.standard_normal((3, 7, 333, 1111)).astype(np.float16),
        "flat": rng.integers(-128, 127, 9_000_007).astype(np.int8),
        "wide": rng.standard_normal((1, 2_500_001)).astype(np.float64),
        "small": np.arange(10, dtype=np.int32),
    }
    safetensors.numpy.save_file(w, tmp_path / "in.safetensors")
    run = lambda *a: subprocess.run([CLI, *map(str, a)], check=True, capture_output=True, text=True).stdout
    run("convert", "--compress", "1", tmp_path / "in.safetensors", tmp_path / "a.zst")
    run("convert", tmp_path / "a.zst", tmp_path / "b.safetensors")
    run("convert", "--compress", "1", "--shuffle", tmp_path / "a.zst", tmp_path / "c.zst")
    run("convert", tmp_path / "c.zst", tmp_path / "d.safetensors")
    for name in ("b.safetensors", "d.safetensors"):
        got = safetensors.numpy.load_file(tmp_path / name)
        for k in w:
            assert got[k].dtype == w[k].dtype and np.array_equal(got[k], w[k]), (name, k)
