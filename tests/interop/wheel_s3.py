#!/usr/bin/env python3
"""The installed wheel on s3:// (a step of tests/interop/test_wheel.sh).

Run by the project venv's python: starts a real S3 server (SeaweedFS,
tests/s3/weed_server.py) on 127.0.0.1, uploads with boto3 a safetensors
object that the safetensors package wrote, then runs CMD (the fresh venv's
python, inside test_wheel.sh's mount namespace when it has one) with the
server's AWS_* settings. In there the wheel loads the object with
ckptio.numpy.load_file("s3://...") through the system's libcurl (the wheel
carries none), checks every value and the metadata, saves an object of its
own through s3:// and loads it back; boto3 and safetensors then read that
object here. CKPTIO_FAULT_LIBCURL is set to a missing file for the child:
a production build must ignore it.

Exit 0, 1 on a failure, 77 (skip, saying why) when the server cannot start
or the project venv lacks boto3 or safetensors.

usage: wheel_s3.py SCRATCH -- CMD...
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "s3"))
from weed_server import Unavailable, WeedServer  # noqa: E402

SKIP = 77
BUCKET = "ckptio-wheel"
KEY_IN = "boto3/model.safetensors"
KEY_OUT = "wheel/model.safetensors"

# What the fresh venv runs: only the wheel's ckptio and numpy are there.
CHILD = r'''
import os, pathlib, sys
import numpy as np
import ckptio.numpy as cn

url_in, url_out, expected = sys.argv[1:4]
assert os.environ.get("CKPTIO_FAULT_LIBCURL"), "the driver sets CKPTIO_FAULT_LIBCURL"
exp = dict(np.load(expected))

got = cn.load_file(url_in)
assert sorted(got) == sorted(exp), (sorted(got), sorted(exp))
for k, v in exp.items():
    assert got[k].dtype == v.dtype and got[k].shape == v.shape, (k, got[k].dtype, got[k].shape)
    assert np.array_equal(got[k], v), k
meta = cn.load_metadata(url_in)
assert meta.get("origin") == "boto3" and meta.get("step") == "11", meta

# libcurl is the system's: the wheel has no copy of it.
maps = pathlib.Path("/proc/self/maps").read_text()
curl = {l.split()[-1] for l in maps.splitlines() if "/libcurl" in l}
assert curl and not any("/ckptio.libs/" in p for p in curl), curl
print(f"wheel s3: loaded {url_in} ({len(got)} tensors, values checked) through {sorted(curl)}")

# The wheel writes through s3:// as well, and reads back what it wrote.
out = {k: (v[::-1] if v.ndim == 1 else v.T).copy() for k, v in exp.items()}
cn.save_file(out, url_out, metadata={"origin": "ckptio-wheel"})
back = cn.load_file(url_out)
assert sorted(back) == sorted(out)
for k, v in out.items():
    assert back[k].dtype == v.dtype and np.array_equal(back[k], v), k

# A missing object is a FileNotFoundError naming it.
try:
    cn.load_file(url_in + ".missing")
except FileNotFoundError as e:
    assert "model.safetensors.missing" in str(e), str(e)
else:
    raise AssertionError("a missing object loaded")
print(f"wheel s3: saved and reloaded {url_out}")
'''


def tensors():
    import numpy as np
    return {"w": (np.arange(512 * 512, dtype=np.float32).reshape(512, 512) * 0.25 - 9.5),
            "ids": np.arange(-50, 50, dtype=np.int64),
            "half": np.linspace(-1, 1, 999).astype(np.float16),
            "flag": np.array([True, False, True])}


def main():
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit("usage: wheel_s3.py SCRATCH -- CMD...")
    scratch, cmd = sys.argv[1], sys.argv[3:]
    try:
        import numpy as np
        from safetensors.numpy import load as st_load, save as st_save
    except ImportError as e:
        print(f"SKIP wheel s3: the project venv lacks numpy or safetensors ({e}); run scripts/setup.sh")
        return SKIP
    os.makedirs(scratch, exist_ok=True)
    try:
        server = WeedServer(bucket=BUCKET, workdir=scratch)
        server.start()
    except (Unavailable, RuntimeError) as e:
        print(f"SKIP wheel s3: no S3 server: {e}")
        return SKIP
    try:
        print(f"wheel s3: SeaweedFS on {server.endpoint} (bucket {BUCKET}) in {server.startup_seconds:.1f} s")
        client = server.client()
        exp = tensors()
        client.put_object(Bucket=BUCKET, Key=KEY_IN, Body=st_save(exp, metadata={"origin": "boto3", "step": "11"}))
        expected = os.path.join(scratch, "expected.npz")
        np.savez(expected, **exp)
        env = server.env()
        env["CKPTIO_FAULT_LIBCURL"] = os.path.join(scratch, "no-such-dir", "libcurl.so.4")
        rc = subprocess.run(cmd + ["-c", CHILD, f"s3://{BUCKET}/{KEY_IN}", f"s3://{BUCKET}/{KEY_OUT}", expected],
                            env=env).returncode
        if rc != 0:
            print(f"FAIL wheel s3: the fresh venv's s3:// load and save exited {rc}")
            return 1
        # What the wheel wrote, as another client sees it.
        body = client.get_object(Bucket=BUCKET, Key=KEY_OUT)["Body"].read()
        got = st_load(body)
        want = {k: (v[::-1] if v.ndim == 1 else v.T).copy() for k, v in exp.items()}
        assert sorted(got) == sorted(want), sorted(got)
        for k, v in want.items():
            assert got[k].dtype == v.dtype and np.array_equal(got[k], v), k
        n = int.from_bytes(body[:8], "little")
        meta = json.loads(body[8:8 + n]).get("__metadata__", {})
        assert meta.get("origin") == "ckptio-wheel", meta
        print(f"wheel s3: boto3 + safetensors read s3://{BUCKET}/{KEY_OUT} ({len(body)} bytes) as written")
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
