"""Loads from S3 through the storage interface (issue 27): s3://bucket/key
wherever a local path is read, against a real S3 server (SeaweedFS, tests/s3/
weed_server.py). A safetensors file uploaded by boto3 (the real AWS SDK) is
loaded by ckptio.torch / ckptio.numpy bit for bit with every CRC checked,
slices fetch their rows, and what is not a checkpoint or not there fails
with a message naming the object and what the server said (.pt archives and
compressed files: test_s3_formats.py).

Skips with the reason when weed, boto3 or torch are missing."""
import os
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


@pytest.fixture(scope="module")
def s3():
    yield from s3_env.serve("loads")


def state():
    g = torch.Generator().manual_seed(7)
    t = {f"layer{k}.weight": torch.randn(700 + k, 1100, generator=g) for k in range(5)}
    t["embed"] = torch.randn(3000, 512, generator=g).to(torch.bfloat16)  # > 1 chunk of reads
    t["norm"] = torch.ones(17, dtype=torch.float16)
    t["steps"] = torch.tensor([3, 1, 4], dtype=torch.int64)
    return t


def upload(s3, tmp_path, key, t):
    path = tmp_path / "m.safetensors"
    ct.save_file(t, path)
    s3.client().upload_file(str(path), s3.bucket, key)
    return f"s3://{s3.bucket}/{key}"


def test_load_file_from_s3_bit_for_bit(s3, tmp_path):
    t = state()
    url = upload(s3, tmp_path, "runs/a/model.safetensors", t)
    got = ct.load_file(url)
    assert sorted(got) == sorted(t)
    for name in t:
        assert torch.equal(got[name], t[name]), name
    arrays = cn.load_file(url)
    assert np.array_equal(arrays["layer2.weight"], t["layer2.weight"].numpy())
    assert ckptio.verify(url) == 0  # every tensor has a CRC, every one checked


def test_load_model_from_s3_in_place(s3, tmp_path):
    """load_model from s3:// writes the model's own memory, every byte by
    GETs; what the model lacks or the file lacks is reported as locally."""
    t = {name.replace(".", "_"): v for name, v in state().items()}
    url = upload(s3, tmp_path, "runs/model/model.safetensors", t)
    model = torch.nn.Module()
    for name, v in t.items():
        model.register_buffer(name, torch.zeros_like(v))
    ptrs = {n: b.data_ptr() for n, b in model.named_buffers()}
    assert ct.load_model(model, url) == ([], [])
    for name, b in model.named_buffers():
        assert b.data_ptr() == ptrs[name] and torch.equal(b, t[name]), name
    model.register_buffer("extra", torch.zeros(3))
    missing, unexpected = ct.load_model(model, url, strict=False)
    assert (missing, unexpected) == (["extra"], [])


def test_slices_and_stats(s3, tmp_path):
    t = state()
    url = upload(s3, tmp_path, "runs/b/model.safetensors", t)
    with ct.safe_open(url, "pt") as f:
        assert sorted(f.keys()) == sorted(t)
        rows = f.get_slice("layer3.weight")[100:164]
        assert torch.equal(rows, t["layer3.weight"][100:164])
        assert f.stats()["load_methods"] == ["pread"], "an object is read through the storage, never mapped"
        assert torch.equal(f.get_tensor("embed"), t["embed"])
        assert f.metadata() is None  # saved without metadata: None, as safetensors says
    # The header's own keys, read through the storage.
    assert "ckptio.version" in ckptio.load_metadata(url)


def test_a_crc_mismatch_in_s3_is_caught(s3, tmp_path):
    t = state()
    path = tmp_path / "m.safetensors"
    ct.save_file(t, path)
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x40  # a byte of the last tensor's data
    s3.client().put_object(Bucket=s3.bucket, Key="bad/model.safetensors", Body=bytes(data))
    with pytest.raises(ckptio.ChecksumError, match="checksum mismatch"):
        ct.load_file(f"s3://{s3.bucket}/bad/model.safetensors")


def test_missing_objects_and_unsupported_kinds_say_why(s3, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nothere\.safetensors.*404"):
        ct.load_file(f"s3://{s3.bucket}/nothere.safetensors")
    with pytest.raises(CkptioError, match="bucket names"):
        ct.load_file("s3://Not_A_Bucket/x")
    (tmp_path / "m.bin").write_bytes(b"neither a zip nor safetensors")
    s3.client().upload_file(str(tmp_path / "m.bin"), s3.bucket, "m.bin")
    with pytest.raises(CkptioError, match=rf"s3://{s3.bucket}/m\.bin"):
        ct.load_file(f"s3://{s3.bucket}/m.bin")


def test_wrong_secret_is_refused_with_the_servers_code(s3, tmp_path):
    url = upload(s3, tmp_path, "runs/c/model.safetensors", {"w": torch.ones(4)})
    script = ("import sys, ckptio.torch as ct\n"
              "try:\n    ct.load_file(sys.argv[1])\nexcept Exception as e:\n    print(e)\n")
    import subprocess
    env = dict(os.environ, AWS_SECRET_ACCESS_KEY="wrong-secret")
    out = subprocess.run([sys.executable, "-c", script, url], env=env, capture_output=True, text=True,
                         timeout=120).stdout
    assert "403" in out and url.split("//")[1].split("/")[0] in out, out


def test_saves_to_s3_read_by_boto3_safetensors_and_runai(s3, tmp_path):
    """ckptio.torch.save_file to s3:// publishes an object that the real
    safetensors (after a boto3 download) and runai-model-streamer (reading
    S3 itself) load bit for bit; no multipart upload stays open."""
    t = state()
    url = f"s3://{s3.bucket}/saved/model.safetensors"
    ct.save_file(t, url, metadata={"step": "7"})
    c = s3.client()
    assert not c.list_multipart_uploads(Bucket=s3.bucket, Prefix="saved/").get("Uploads")
    c.download_file(s3.bucket, "saved/model.safetensors", str(tmp_path / "dl.safetensors"))
    import safetensors.torch
    sd = safetensors.torch.load_file(str(tmp_path / "dl.safetensors"))
    for name in t:
        assert torch.equal(sd[name], t[name]), name
    with ct.safe_open(url, "pt") as f:
        assert f.metadata()["step"] == "7"
    try:
        from runai_model_streamer import SafetensorsStreamer
    except ImportError:
        pytest.skip("runai-model-streamer is not installed (scripts/setup.sh puts it in .venv)")
    import subprocess
    script = ("import sys, torch\nfrom runai_model_streamer import SafetensorsStreamer\n"
              "out = {}\nwith SafetensorsStreamer() as s:\n    s.stream_file(sys.argv[1])\n"
              "    for k, v in s.get_tensors():\n        out[k] = v.clone()\n"
              "torch.save(out, sys.argv[2])\n")
    env = dict(os.environ, RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING="0", AWS_EC2_METADATA_DISABLED="true")
    r = subprocess.run([sys.executable, "-c", script, url, str(tmp_path / "runai.pt")], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = torch.load(tmp_path / "runai.pt")
    for name in t:
        assert torch.equal(got[name], t[name]), name


def test_sharded_set_in_s3_loads_as_a_set(s3, tmp_path):
    """A Hugging Face sharded set uploaded as objects: its index URL loads
    every shard's tensors, checked as one set (names, save ids)."""
    t = state()
    local = tmp_path / "set"
    local.mkdir()
    ct.save_torch_state_dict(t, local, max_shard_size=4 << 20)
    files = sorted(p.name for p in local.iterdir())
    assert len([f for f in files if f.endswith(".safetensors")]) > 1, files
    c = s3.client()
    for f in files:
        c.upload_file(str(local / f), s3.bucket, f"sets/a/{f}")
    index = [f for f in files if f.endswith(".index.json")][0]
    got = ct.load_file(f"s3://{s3.bucket}/sets/a/{index}")
    assert sorted(got) == sorted(t)
    for name in t:
        assert torch.equal(got[name], t[name]), name
    c.delete_object(Bucket=s3.bucket, Key=f"sets/a/{files[0] if files[0] != index else files[1]}")
    with pytest.raises(FileNotFoundError, match="shard"):
        ct.load_file(f"s3://{s3.bucket}/sets/a/{index}")


def test_dcp_saves_to_and_loads_from_s3(s3):
    """torch.distributed.checkpoint through ckptio.dcp on an s3:// prefix
    (one process: rank 0 of 1): the Writer uploads the rank's object and
    the index, the Reader opens the prefix as a directory and DCP loads it
    into other tensors, bit for bit; a second save replaces the first."""
    import torch.distributed.checkpoint as dcp
    from ckptio.dcp import Reader, Writer
    url = f"s3://{s3.bucket}/dcp/step1"
    for seed in (1, 2):
        g = torch.Generator().manual_seed(seed)
        sd = {"w": torch.randn(300, 1024, generator=g), "b": torch.randn(77, generator=g).to(torch.bfloat16)}
        dcp.save(sd, storage_writer=Writer(url))
        got = {k: torch.zeros_like(v) for k, v in sd.items()}
        dcp.load(got, storage_reader=Reader(url))
        for k in sd:
            assert torch.equal(got[k], sd[k]), (seed, k)
    keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket=s3.bucket, Prefix="dcp/step1/")["Contents"]]
    assert len(keys) == 2 and any(k.endswith(".safetensors.index.json") for k in keys), keys


def test_sharded_saves_to_s3_replace_the_set_whole(s3, tmp_path):
    """save_torch_state_dict to an s3:// prefix: shards named after the save
    (the old index's shards are never written over), the index last; a
    second save with another shard count replaces the set, its older shards
    are removed, and transformers-style loading through the index (boto3
    downloads + safetensors) reads every tensor."""
    c = s3.client()
    prefix = f"s3://{s3.bucket}/sets/saved"
    first = state()
    ct.save_torch_state_dict(first, prefix, max_shard_size=3 << 20)
    keys1 = sorted(o["Key"] for o in c.list_objects_v2(Bucket=s3.bucket, Prefix="sets/saved/")["Contents"])
    assert len(keys1) > 3 and "sets/saved/model.safetensors.index.json" in keys1, keys1
    got = ct.load_file(f"{prefix}/model.safetensors.index.json")
    for name in first:
        assert torch.equal(got[name], first[name]), name
    second = {k: v + 1 if v.is_floating_point() else v for k, v in first.items()}
    ct.save_torch_state_dict(second, prefix, max_shard_size=8 << 20)
    keys2 = sorted(o["Key"] for o in c.list_objects_v2(Bucket=s3.bucket, Prefix="sets/saved/")["Contents"])
    assert not set(keys2) & (set(keys1) - {"sets/saved/model.safetensors.index.json"}), "old shards removed"
    assert not c.list_multipart_uploads(Bucket=s3.bucket, Prefix="sets/saved/").get("Uploads")
    import json
    import safetensors.torch
    body = c.get_object(Bucket=s3.bucket, Key="sets/saved/model.safetensors.index.json")["Body"].read()
    weight_map = json.loads(body)["weight_map"]
    loaded = {}
    for f in sorted(set(weight_map.values())):
        c.download_file(s3.bucket, f"sets/saved/{f}", str(tmp_path / f))
        loaded.update(safetensors.torch.load_file(str(tmp_path / f)))
    for name in second:
        assert torch.equal(loaded[name], second[name]), name


def test_an_object_replaced_under_a_reader_fails_not_mixes(s3, tmp_path):
    """A reader reads only the object it opened: a save over the key
    meanwhile makes its next load fail (the server's 412 on the ETag it
    opened), never a mix of the two versions."""
    url = upload(s3, tmp_path, "replaced/model.safetensors", state())
    with ct.safe_open(url, "pt") as f:
        ct.save_file({k: v + 1 for k, v in state().items() if v.is_floating_point()}, url)
        with pytest.raises(CkptioError, match="412|Precondition"):
            f.get_tensor("layer0.weight")
