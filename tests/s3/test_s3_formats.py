"""PyTorch archives (.pt) and compressed (zstd seekable) safetensors files on
S3 (a real server: SeaweedFS, tests/s3/weed_server.py), both ways: saved by
ckptio and read by the real tools (a boto3 download opened by torch.load),
written by the real tools (torch.save, uploaded by boto3) and loaded by
ckptio, round trips through ckptio.torch / ckptio.numpy, objects cut short
or damaged failing with the URL named, and `ckptio convert` between local
files and s3:// for both formats.

Skips with the reason when weed, boto3 or torch are missing."""
import os
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import s3_env  # noqa: E402

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/setup.sh puts it in .venv)")
boto3 = pytest.importorskip("boto3", reason="boto3 is not installed (scripts/setup.sh puts it in .venv)")
import ckptio  # noqa: E402
import ckptio.numpy as cn  # noqa: E402
import ckptio.torch as ct  # noqa: E402
from ckptio.errors import CkptioError  # noqa: E402

CLI = os.environ.get("CKPTIO_TEST_CLI")


@pytest.fixture(scope="module")
def s3():
    yield from s3_env.serve("formats")


def state():
    g = torch.Generator().manual_seed(11)
    t = {f"layer{k}.weight": torch.randn(600 + k, 1024, generator=g) for k in range(6)}  # ~15 MiB: parts
    t["embed"] = torch.randn(2000, 512, generator=g).to(torch.bfloat16)
    t["norm"] = torch.ones(17, dtype=torch.float16)
    t["steps"] = torch.tensor([3, 1, 4], dtype=torch.int64)
    return t


def same(got, want):
    assert sorted(got) == sorted(want)
    for name in want:
        assert torch.equal(got[name], want[name]), name


def no_uploads(s3, prefix):
    assert not s3.client().list_multipart_uploads(Bucket=s3.bucket, Prefix=prefix).get("Uploads")


def test_pt_saved_to_s3_opens_in_torch_load(s3, tmp_path):
    """ckptio.torch.save_file(format="pt") to s3://: torch.load opens the
    object boto3 downloads (weights_only, no pickle code run), and ckptio
    loads it back from S3, every CRC checked."""
    t = state()
    url = f"s3://{s3.bucket}/pt/model.pt"
    ct.save_file(t, url, format="pt")
    no_uploads(s3, "pt/")
    s3.client().download_file(s3.bucket, "pt/model.pt", str(tmp_path / "dl.pt"))
    same(torch.load(tmp_path / "dl.pt", weights_only=True), t)
    same(ct.load_file(url), t)
    assert ckptio.verify(url) == 0


def test_torch_save_uploaded_by_boto3_loads_from_s3(s3, tmp_path):
    """A file of the real torch.save (with a transposed view, stored
    strided: gathered from the object) uploaded by boto3; its slices fetch
    their rows; an archive cut short or with a changed byte fails with the
    URL in the message."""
    t = state()
    t["transposed"] = torch.arange(64 * 48, dtype=torch.float32).reshape(64, 48).t()
    torch.save(t, tmp_path / "m.pt")
    c = s3.client()
    c.upload_file(str(tmp_path / "m.pt"), s3.bucket, "pt/torch.pt")
    url = f"s3://{s3.bucket}/pt/torch.pt"
    same(ct.load_file(url), t)
    with ct.safe_open(url, "pt") as f:
        assert torch.equal(f.get_slice("layer2.weight")[100:140], t["layer2.weight"][100:140])
    data = (tmp_path / "m.pt").read_bytes()
    bad = {"cut.pt": data[: len(data) - 40], "half.pt": data[: len(data) // 2]}
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x20  # inside a tensor: its CRC catches it
    bad["flipped.pt"] = bytes(flipped)
    for key, body in bad.items():
        c.put_object(Bucket=s3.bucket, Key=f"pt/{key}", Body=body)
        with pytest.raises(CkptioError, match=rf"s3://{s3.bucket}/pt/{key}"):
            ct.load_file(f"s3://{s3.bucket}/pt/{key}")


def test_compressed_files_round_trip_through_s3(s3, tmp_path):
    """ckptio.numpy.save_file(compress=N, shuffle) to s3:// (a multipart
    upload whose size is known only at its end); loads through torch and
    numpy, slices, and `zstd -d`-compatible bytes: the downloaded object
    loads as a local compressed file too. A cut-short object fails naming
    the URL."""
    t = state()
    arrays = {k: v.numpy() for k, v in t.items() if v.dtype != torch.bfloat16}
    for shuffle in (False, True):
        url = f"s3://{s3.bucket}/zst/model-{int(shuffle)}.safetensors"
        cn.save_file(arrays, url, compress=3, shuffle=shuffle)
        no_uploads(s3, "zst/")
        got = cn.load_file(url)
        assert sorted(got) == sorted(arrays)
        for k in arrays:
            assert np.array_equal(got[k], arrays[k]), k
        with ct.safe_open(url, "pt") as f:
            assert torch.equal(f.get_slice("layer1.weight")[7:19], t["layer1.weight"][7:19])
        key = url.split("/", 3)[3]
        s3.client().download_file(s3.bucket, key, str(tmp_path / "dl.safetensors"))
        local = cn.load_file(str(tmp_path / "dl.safetensors"))
        assert np.array_equal(local["layer5.weight"], arrays["layer5.weight"])
    data = (tmp_path / "dl.safetensors").read_bytes()
    s3.client().put_object(Bucket=s3.bucket, Key="zst/cut.safetensors", Body=data[:-5])
    with pytest.raises(CkptioError, match=rf"s3://{s3.bucket}/zst/cut\.safetensors"):
        cn.load_file(f"s3://{s3.bucket}/zst/cut.safetensors")


@pytest.mark.skipif(not CLI, reason="CKPTIO_TEST_CLI (the ckptio command) is not set")
def test_cli_converts_pt_and_compressed_files_to_and_from_s3(s3, tmp_path):
    """`ckptio convert`: a local .pt to an s3:// .pt, that to an s3://
    compressed safetensors file, that back to a local .pt; `ckptio verify`
    of each object; the last file holds the first's tensors."""
    t = state()
    torch.save(t, tmp_path / "in.pt")
    env = dict(os.environ)
    b = s3.bucket

    def run(*args):
        r = subprocess.run([CLI, *args], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        return r.stdout

    run("convert", str(tmp_path / "in.pt"), f"s3://{b}/cli/a.pt")
    run("convert", "--compress", "3", f"s3://{b}/cli/a.pt", f"s3://{b}/cli/b.safetensors")
    run("convert", f"s3://{b}/cli/b.safetensors", str(tmp_path / "out.pt"))
    run("verify", f"s3://{b}/cli/a.pt")
    run("verify", f"s3://{b}/cli/b.safetensors")
    no_uploads(s3, "cli/")
    same(torch.load(tmp_path / "out.pt", weights_only=True), t)
    head = s3.client().get_object(Bucket=b, Key="cli/b.safetensors", Range="bytes=0-3")["Body"].read()
    assert head == b"\x28\xb5\x2f\xfd", "a zstd frame first: the object is compressed"
    assert s3.client().get_object(Bucket=b, Key="cli/a.pt", Range="bytes=0-3")["Body"].read() == b"PK\x03\x04"
