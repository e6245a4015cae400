"""The checkpoint manager on S3 (issue 27 item 3): a prefix s3://bucket/ckpts
as the checkpoint directory of ckptio.manager.CheckpointManager, of
`ckptio checkpoints`, and of a C save loop killed with SIGKILL mid-upload,
against a real S3 server (SeaweedFS, tests/s3/weed_server.py). What each
test sees on the server is read back with boto3 (the real AWS SDK): the
objects under the prefix and the multipart uploads left open.

Skips with the reason when weed, boto3 or torch are missing."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "s3"))  # s3_env
import s3_env  # noqa: E402

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/setup.sh puts it in .venv)")
boto3 = pytest.importorskip("boto3", reason="boto3 is not installed (scripts/setup.sh puts it in .venv)")
import ckptio.torch as ct  # noqa: E402
from ckptio.errors import CkptioError  # noqa: E402
from ckptio.manager import CheckpointManager, CheckpointWarning  # noqa: E402

CLI = os.environ.get("CKPTIO_TEST_CLI")
DRIVER = os.environ.get("CKPTIO_TEST_CRASH_DRIVER")
GTESTS = os.environ.get("CKPTIO_TEST_MANAGE_STORAGE")


@pytest.fixture(scope="module")
def s3():
    yield from s3_env.serve("managed")


def keys(s3, prefix):
    """Every object under prefix/, named below it."""
    out = []
    for page in s3.client().get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix + "/"):
        out += [o["Key"][len(prefix) + 1:] for o in page.get("Contents", [])]
    return sorted(out)


def open_uploads(s3, prefix):
    r = s3.client().list_multipart_uploads(Bucket=s3.bucket, Prefix=prefix + "/")
    return [u["Key"] for u in r.get("Uploads", [])]


def latest_record(s3, prefix):
    return s3.client().get_object(Bucket=s3.bucket, Key=prefix + "/latest")["Body"].read().decode()


def state(step):
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(300, 257, generator=g), "b": torch.randn(257, generator=g).to(torch.bfloat16),
            "step": torch.tensor([step], dtype=torch.int64)}


def same(a, b):
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.skipif(not GTESTS, reason="CKPTIO_TEST_MANAGE_STORAGE (tests/manage's gtests) is not set")
def test_the_c_manager_tests_on_s3(s3):
    """tests/manage/test_manage_storage.cc's S3 instance, on this server
    (its in-memory instance runs alone, as manage_storage)."""
    env = dict(os.environ, CKPTIO_S3_BUCKET=s3.bucket)
    # (less the one whose failure only the in-memory storage can inject)
    r = subprocess.run([GTESTS, "--gtest_filter=*/s3-*NetworksSake*"], capture_output=True, text=True, timeout=120,
                       env=env)
    ok = r.returncode == 0 and "[  PASSED  ]" in r.stdout and "[  SKIPPED ]" not in r.stdout
    assert ok, r.stdout[-4000:] + r.stderr[-2000:]


def test_python_manager_saves_retains_and_resumes(s3):
    prefix = f"py-{os.getpid()}"
    url = f"s3://{s3.bucket}/{prefix}"
    with CheckpointManager(url, keep_last=2) as mgr:
        assert mgr.load_latest() == (None, None)
        for step in (100, 200, 300):
            mgr.save_async(state(step), step).wait_durable()
        assert [c.step for c in mgr.list()] == [200, 300]
        assert keys(s3, prefix) == ["latest", "step-00000200/model.safetensors",
                                    "step-00000300/model.safetensors"]
        assert latest_record(s3, prefix) == "step-00000300\n"
        step, path = mgr.latest_path()
        assert (step, path) == (300, f"{url}/step-00000300/model.safetensors")
        into = {k: torch.zeros_like(v) for k, v in state(0).items()}
        step, sd = mgr.load_latest(into=into)
        assert step == 300 and same(sd, state(300)) and same(into, state(300))
        info = mgr.list(verify=True)[-1]
        assert info.complete and info.verified and info.files == 1 and info.dir == f"{url}/step-00000300"
    assert open_uploads(s3, prefix) == []
    # A `latest` naming a step that is not there: reported, and the scan wins.
    s3.client().put_object(Bucket=s3.bucket, Key=prefix + "/latest", Body=b"step-00000999\n")
    with CheckpointManager(url) as mgr:
        with pytest.warns(CheckpointWarning, match="step-00000999"):
            assert mgr.latest() == 300


def test_python_manager_sharded_sets(s3):
    prefix = f"py-sharded-{os.getpid()}"
    url = f"s3://{s3.bucket}/{prefix}"
    with CheckpointManager(url, keep_last=1, max_shard_size="200KiB") as mgr:
        for step in (1, 2):
            mgr.save(state(step), step)
        step, sd = mgr.load_latest()
        assert step == 2 and same(sd, state(2))
        assert mgr.latest_path()[1] == f"{url}/step-00000002/model.safetensors.index.json"
    objs = keys(s3, prefix)
    assert all(k == "latest" or k.startswith("step-00000002/") for k in objs), objs
    assert len(objs) >= 4, objs  # latest, the index and at least two shards


def test_python_manager_errors_name_the_url(s3):
    with pytest.raises(CkptioError, match="no-such-bucket-ckptio"):
        CheckpointManager("s3://no-such-bucket-ckptio/ckpts")


@pytest.mark.skipif(not CLI, reason="CKPTIO_TEST_CLI (the ckptio command) is not set")
def test_cli_lists_a_prefix(s3):
    prefix = f"cli-{os.getpid()}"
    url = f"s3://{s3.bucket}/{prefix}"
    with CheckpointManager(url, keep_last=None) as mgr:
        for step in (1, 2):
            mgr.save(state(step), step)
    # Step 3: a set that lost a shard, so incomplete.
    with CheckpointManager(url, keep_last=None, max_shard_size="200KiB") as mgr:
        mgr.save(state(3), 3)
    shard = next(k for k in keys(s3, prefix) if k.startswith("step-00000003/model-"))
    s3.client().delete_object(Bucket=s3.bucket, Key=f"{prefix}/{shard}")

    r = subprocess.run([CLI, "checkpoints", url, "--verify", "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr  # one checkpoint is not complete
    got = json.loads(r.stdout)
    assert [(c["step"], c["complete"], c["verified"]) for c in got["checkpoints"]] == \
        [(1, True, True), (2, True, True), (3, False, False)]
    assert shard.split("/")[1] in got["checkpoints"][2]["error"]
    assert got["resume"] == {"step": 2, "path": f"{url}/step-00000002/model.safetensors"}
    r = subprocess.run([CLI, "checkpoints", url], capture_output=True, text=True, timeout=60)
    assert "INCOMPLETE" in r.stdout and f"resume: step 2 ({url}/step-00000002/model.safetensors)" in r.stdout

    r = subprocess.run([CLI, "checkpoints", "s3://no-such-bucket-ckptio/x"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "no-such-bucket-ckptio" in r.stderr, r.stderr
    # A wrong secret: refused by the server at open, the URL and S3's answer named.
    env = dict(os.environ, AWS_SECRET_ACCESS_KEY="not-the-secret")
    r = subprocess.run([CLI, "checkpoints", url], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2 and url in r.stderr and "403" in r.stderr, r.stderr


def driver(*args, **kw):
    return subprocess.run([DRIVER, *args], capture_output=True, text=True, timeout=120, **kw)


def check(url):
    r = driver("check", url)
    assert r.returncode == 0, r.stdout + r.stderr
    fields = dict(f.split("=") for f in r.stdout.split()[-3:])
    return int(fields["complete"]), int(fields["latest"])


@pytest.mark.skipif(not DRIVER, reason="CKPTIO_TEST_CRASH_DRIVER (tests/crash/manager_driver.c) is not set")
@pytest.mark.parametrize("kind", ["single", "sharded"])
def test_a_save_killed_mid_upload_is_swept_and_resumed(s3, kind):
    """A save loop SIGKILLed while its upload is open: the published steps
    stay whole, resume finds the newest, the upload stays open until the
    next save, which aborts it and leaves no object no step uses."""
    prefix = f"kill-{kind}-{os.getpid()}"
    url = f"s3://{s3.bucket}/{prefix}"
    extra = ["--sharded"] if kind == "sharded" else []
    r = driver("save", url, "--keep", "2", "--steps", "2", *extra)
    assert r.returncode == 0, r.stderr
    assert check(url) == (2, 2)

    # Step 3, 16 times larger (43 MiB: parts of 5 MiB), killed once an
    # upload of it is open.
    p = subprocess.Popen([DRIVER, "save", url, "--keep", "2", "--scale", "16", *extra],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not open_uploads(s3, prefix):
        assert p.poll() is None, f"the save loop ended by itself: {p.stderr.read()}"
        assert time.monotonic() < deadline, "no upload was seen open"
        time.sleep(0.005)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    p.stderr.close()
    left = open_uploads(s3, prefix)
    assert left and all(k.startswith(prefix + "/step-00000003/") for k in left), left
    assert check(url) == (2, 2), "the killed step is not a step; step 2 is the newest"
    s3.client().delete_object(Bucket=s3.bucket, Key=prefix + "/latest")
    assert check(url) == (2, 2), "resume does not need the latest record"

    r = driver("save", url, "--keep", "2", "--steps", "1", *extra)
    assert r.returncode == 0, r.stderr
    assert check(url) == (2, 3)
    assert open_uploads(s3, prefix) == [], "the killed save's upload is still open"
    assert latest_record(s3, prefix) == "step-00000003\n"
    steps = sorted({k.split("/")[0] for k in keys(s3, prefix) if k != "latest"})
    assert steps == ["step-00000002", "step-00000003"]
    if kind == "single":
        assert keys(s3, prefix) == ["latest", "step-00000002/model.safetensors", "step-00000003/model.safetensors"]
    else:  # the index and the shards it names, nothing of the killed save
        for step in ("step-00000002", "step-00000003"):
            index = f"{prefix}/{step}/model.safetensors.index.json"
            body = s3.client().get_object(Bucket=s3.bucket, Key=index)["Body"].read()
            named = {f"{step}/{f}" for f in json.loads(body)["weight_map"].values()}
            have = {k for k in keys(s3, prefix) if k.startswith(step + "/")}
            assert have == named | {f"{step}/model.safetensors.index.json"}
