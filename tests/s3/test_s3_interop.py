"""The S3 client (src/s3, through tests/s3/test_s3's tool commands) against
the real AWS SDK (boto3) on a real S3 server (SeaweedFS, tests/s3/
weed_server.py): what one writes the other reads, byte for byte; and the
server refuses requests that are not signed or signed with a wrong secret,
so the client's successes prove its signing.

Needs CKPTIO_TEST_S3 (the test_s3 binary); skips with the reason when weed,
boto3 or the binary are missing.
"""
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import weed_server  # noqa: E402

BIN = os.environ.get("CKPTIO_TEST_S3")


@pytest.fixture(scope="module")
def s3():
    if not BIN or not os.access(BIN, os.X_OK):
        pytest.skip("CKPTIO_TEST_S3 does not name the test_s3 binary")
    pytest.importorskip("boto3", reason="boto3 is not installed (scripts/setup.sh puts it in .venv)")
    try:  # ctest runs this under weed_server.py: attached to, not started again
        server = weed_server.WeedServer.attach_or_start(bucket="interop")
    except weed_server.Unavailable as e:
        pytest.skip(str(e))
    with server:
        print("weed ready in %.1f s" % server.startup_seconds)
        yield server


def tool(s3, *args, **kw):
    r = subprocess.run([BIN, *args], env=s3.env(), capture_output=True, timeout=60, **kw)
    if r.returncode == 77:
        pytest.skip("test_s3: %s" % r.stdout.decode(errors="replace").strip())
    assert r.returncode == 0, "test_s3 %s: %s" % (" ".join(args), r.stderr.decode(errors="replace"))
    return r.stdout


def data(n, seed):
    return bytes((i * 131 + seed * 7 + (i >> 9)) & 0xFF for i in range(n))


def test_put_read_by_boto3(s3, tmp_path):
    blob = data(70001, 1)
    (tmp_path / "small").write_bytes(blob)
    tool(s3, "put", "from-ckptio/small index.json", str(tmp_path / "small"))
    got = s3.client().get_object(Bucket=s3.bucket, Key="from-ckptio/small index.json")["Body"].read()
    assert got == blob


def test_multipart_read_by_boto3(s3, tmp_path):
    # 3 parts of 5 MiB and a short last one, from 3 threads.
    blob = os.urandom(3 * (5 << 20) + 777)
    (tmp_path / "big").write_bytes(blob)
    tool(s3, "upload", "from-ckptio/model.safetensors", str(tmp_path / "big"), "3")
    c = s3.client()
    head = c.head_object(Bucket=s3.bucket, Key="from-ckptio/model.safetensors")
    assert head["ContentLength"] == len(blob)
    assert head["ETag"].strip('"').endswith("-4"), head["ETag"]  # a 4-part multipart object
    assert c.get_object(Bucket=s3.bucket, Key="from-ckptio/model.safetensors")["Body"].read() == blob
    # No upload left open behind the completed one.
    assert not c.list_multipart_uploads(Bucket=s3.bucket, Prefix="from-ckptio/").get("Uploads")


def test_boto3_upload_read_by_ckptio(s3):
    from boto3.s3.transfer import TransferConfig
    blob = os.urandom(12 << 20)
    c = s3.client()
    # boto3's own multipart (8 MiB parts) and a plain put of a small object.
    import io
    c.upload_fileobj(io.BytesIO(blob), s3.bucket, "from-boto3/weights.bin",
                     Config=TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20))
    c.put_object(Bucket=s3.bucket, Key="from-boto3/a b+c.json", Body=b'{"step": 7}')
    assert tool(s3, "cat", "from-boto3/weights.bin") == blob
    assert tool(s3, "cat", "from-boto3/a b+c.json") == b'{"step": 7}'


def test_unsigned_and_badly_signed_requests_are_refused(s3):
    c = s3.client()
    c.put_object(Bucket=s3.bucket, Key="secret", Body=b"x")
    # Plain HTTP without credentials: refused, so signing is what opens it.
    for method in ("GET", "PUT"):
        req = urllib.request.Request(s3.endpoint + "/%s/secret" % s3.bucket, method=method,
                                     data=b"y" if method == "PUT" else None)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 403, (method, e.value.code)
        assert b"AccessDenied" in e.value.read()
    assert c.get_object(Bucket=s3.bucket, Key="secret")["Body"].read() == b"x"
    # The client with a wrong secret: refused, naming the reason.
    env = s3.env()
    env["AWS_SECRET_ACCESS_KEY"] = "wrong"
    r = subprocess.run([BIN, "cat", "secret"], env=env, capture_output=True, timeout=60)
    assert r.returncode == 1
    assert b"HTTP 403 SignatureDoesNotMatch" in r.stderr, r.stderr
