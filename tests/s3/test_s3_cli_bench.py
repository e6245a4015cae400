"""`ckptio bench --dir s3://bucket/prefix` against a real S3 server
(SeaweedFS, tests/s3/weed_server.py): a tiny model, one run. The report
must carry the storage's own limits of the same run (a plain multipart
upload, parallel ranged GETs) and the save's and loads' ratios to them;
afterwards nothing of the bench's is left under the prefix (no object, no
open multipart upload), and what was there before is untouched. What is
on the server is read back with boto3.

Skips with the reason when weed or boto3 is missing."""
import json
import os
import re
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import weed_server  # noqa: E402

boto3 = pytest.importorskip("boto3", reason="boto3 is not installed (scripts/setup.sh puts it in .venv)")
CLI = os.environ.get("CKPTIO_TEST_CLI")
PREFIX = "clibench"


@pytest.fixture(scope="module")
def s3():
    if not CLI:
        pytest.fail("CKPTIO_TEST_CLI: the built ckptio command (ctest sets it)")
    try:
        server = weed_server.WeedServer.attach_or_start(bucket="ckptio-clibench")
    except weed_server.Unavailable as e:
        pytest.skip(str(e))
    with server:
        yield server


def bench(s3, *args):
    return subprocess.run([CLI, "bench", "--size", "12MiB", "--runs", "1", *args], env=s3.env(),
                          capture_output=True, text=True, timeout=120)


def left(s3):
    c = s3.client()
    objs = [o["Key"] for o in c.list_objects_v2(Bucket=s3.bucket, Prefix=PREFIX + "/").get("Contents", [])]
    ups = [u["Key"] for u in c.list_multipart_uploads(Bucket=s3.bucket, Prefix=PREFIX + "/").get("Uploads", [])]
    return sorted(objs), ups


def test_table_reports_limits_and_ratios_then_cleans_up(s3):
    s3.client().put_object(Bucket=s3.bucket, Key=PREFIX + "/keep.txt", Body=b"not the bench's")
    p = bench(s3, "--verify", "--dir", f"s3://{s3.bucket}/{PREFIX}/")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert f"storage   s3://{s3.bucket}/{PREFIX} (endpoint {s3.endpoint})" in out
    assert "through the library's storage client" in out
    rows = {}
    for line in out.splitlines():
        m = re.match(r"  (\S.*?)\s+(GB/s|s)?\s+([0-9.]+)x?\s+([0-9.]+)x?\s+([0-9.]+)x?$", line)
        if m:
            rows[m.group(1)] = float(m.group(3))
    for name in ("save", "raw upload 16x8M", "raw upload 32x8M", "raw upload (best)", "cold load (first fetch)",
                 "raw GET 16x8M", "raw GET 32x8M", "raw GET 32x16M", "raw GET (best)", "warm load (again)"):
        assert rows.get(name, 0) > 0, f"no rate for {name!r} in:\n{out}"
    for name, rate, limit in (("save / raw upload", "save", "raw upload (best)"),
                              ("cold load / raw GET", "cold load (first fetch)", "raw GET (best)"),
                              ("warm load / raw GET", "warm load (again)", "raw GET (best)")):
        # The ratio is the run's own (one run: its median is it), rates in
        # GB/s of tensor bytes over the limit's bytes (4 KiB-rounded).
        assert rows[name] == pytest.approx(rows[rate] / rows[limit], rel=0.1, abs=0.011), out
    assert left(s3) == ([PREFIX + "/keep.txt"], [])


def test_json_names_the_limits(s3):
    p = bench(s3, "--json", "--dir", f"s3://{s3.bucket}/{PREFIX}")
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert j["storage"] == f"s3://{s3.bucket}/{PREFIX}" and j["depths"] == [16, 32]
    assert [(w["depth"], w["range_bytes"]) for w in j["get_ways"]] == [(16, 8 << 20), (32, 8 << 20), (32, 16 << 20)]
    assert j["model"]["object_bytes"] > j["model"]["bytes"] > 0
    run = j["runs"][0]
    assert run["save_s"] > 0 and min(run["raw_upload_s"]) > 0 and min(run["raw_get_s"]) > 0
    assert len(run["raw_get_s"]) == 3 and j["raw_get_32x16m_gbps"]["median"] > 0
    assert j["save_vs_raw_upload"]["median"] > 0 and j["cold_load_vs_raw_get"]["median"] > 0
    assert left(s3) == ([PREFIX + "/keep.txt"], [])


def test_missing_bucket_is_a_clear_error(s3):
    p = bench(s3, "--dir", "s3://no-such-bucket-here/x")
    assert p.returncode == 2
    assert "no-such-bucket-here" in p.stderr and "NoSuchBucket" in p.stderr, p.stderr
