"""ckptio in everyday process patterns (issue 45): a process that has loaded
and saved, then forks (multiprocessing's fork, os.fork: what DataLoader
workers and preforking servers do), and a child that loads, saves and
frees there; arrays the parent loaded stay valid in the child. Every child
runs under a timeout: a hang fails the test. numpy only, so it runs in the
sanitizer build too (the DataLoader case is in test_torch_binding.py)."""

import multiprocessing
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import ckptio
from ckptio import errors


def _tensors(seed):
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((512, 257)).astype(np.float32),
            "b": rng.integers(0, 1 << 16, (300,), dtype=np.uint16)}


def _equal(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _child_job(args):
    """Loads the parent's file and saves and reloads one of its own."""
    src, dst, seed = args
    got = ckptio.load_file(src)
    mine = _tensors(seed)
    ckptio.save_file(mine, dst)
    back = ckptio.load_file(dst, backend="pread")
    return _equal(got, _tensors(1)) and _equal(back, mine)


@pytest.fixture
def used_parent(tmp_path):
    """A file saved and loaded in this process, so its contexts exist."""
    path = str(tmp_path / "parent.safetensors")
    ckptio.save_file(_tensors(1), path)
    loaded = ckptio.load_file(path, backend="pread")
    assert _equal(loaded, _tensors(1))
    return path, loaded


def test_multiprocessing_fork_children_load_and_save(used_parent, tmp_path):
    path, _ = used_parent
    jobs = [(path, str(tmp_path / f"child{i}.safetensors"), 10 + i) for i in range(4)]
    with multiprocessing.get_context("fork").Pool(2) as pool:
        result = pool.map_async(_child_job, jobs)
        assert result.get(timeout=60) == [True] * 4
    for _, dst, seed in jobs:  # and the parent reads what the children wrote
        assert _equal(ckptio.load_file(dst), _tensors(seed))


def _forked(body):
    """body() in an os.fork child under a 30 s alarm; its exit status."""
    pid = os.fork()
    if pid == 0:
        signal.alarm(30)
        code = 99
        try:
            code = body()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_os_fork_child_keeps_the_parents_arrays_and_loads(used_parent, tmp_path):
    path, loaded = used_parent
    mapped = ckptio.load_file(path, backend="mmap")

    def body():
        if not (_equal(loaded, _tensors(1)) and _equal(mapped, _tensors(1))):
            return 1
        return 0 if _child_job((path, str(tmp_path / "c.safetensors"), 7)) else 2
    assert _forked(body) == 0
    assert _equal(ckptio.load_file(str(tmp_path / "c.safetensors")), _tensors(7))
    assert _equal(mapped, _tensors(1))


def test_parents_open_file_raises_in_the_child_instead_of_hanging(used_parent):
    path, _ = used_parent
    with ckptio.safe_open(path, framework="np", backend="pread") as f:

        def body():
            try:
                f.get_tensor("w")
            except errors.CkptioError as e:
                return 0 if "fork" in str(e) else 2
            return 1
        assert _forked(body) == 0
        assert np.array_equal(f.get_tensor("w"), _tensors(1)["w"])  # still the parent's to use


def _drop(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _resident(path):
    from ckptio._core import Reader
    with Reader(path) as r:
        return r.resident()


def _load_in_a_fresh_process(path, backend):
    code = ("import sys, ckptio; d = ckptio.load_file(sys.argv[1], backend=sys.argv[2]); "
            "print(sum(int(a.view('u1').sum()) for a in d.values()))")
    out = subprocess.run([sys.executable, "-c", code, path, backend], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return int(out)


@pytest.mark.parametrize("backend, cached", [("auto", True), ("pread", True), ("direct", False)])
def test_a_restart_finds_the_file_in_the_page_cache(tmp_path, backend, cached):
    """A cold load in a fresh process leaves the file in the page cache for
    the next process ("auto", "pread"), or leaves the cache as it was
    ("direct"); every byte arrives either way."""
    path = str(tmp_path / "m.safetensors")
    t = {f"w{i}": np.full((1 << 20,), i, np.uint32) for i in range(8)}
    ckptio.save_file(t, path)
    _drop(path)
    if _resident(path) > 0.1:
        pytest.skip(f"the page cache keeps {path} (tmpfs?): a cold file cannot be made here")
    want = sum(int(a.view(np.uint8).sum()) for a in t.values())
    assert _load_in_a_fresh_process(path, backend) == want
    if cached:
        assert _resident(path) > 0.9, "the next process would read the disk again"
    else:
        assert _resident(path) < 0.1, "backend='direct' filled the page cache"
