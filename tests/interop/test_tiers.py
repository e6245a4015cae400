"""Tiered checkpoints (ckptio.tiers) over real torch.distributed gloo
processes: 4 ranks as 2 machines of 2, each machine's memory tier its own
directory (a machine lost is that directory wiped), one durable directory.
Each job is a fresh group of processes, as a restarted training job is."""

import json
import os
import socket
import time

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
mp = pytest.importorskip("torch.multiprocessing")

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

WORLD = 4


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def state(rank, step):
    """Rank's tensors at step: every value says whose and when."""
    w = torch.arange(64 * 1024, dtype=torch.float32) + rank * 1e6 + step * 1e3
    return {"w": w.reshape(64, 1024), "step": torch.tensor([rank, step], dtype=torch.int64)}


def worker(rank, port, base, job, durable, out):
    import warnings
    from ckptio.tiers import TieredCheckpointManager
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    result = {"warnings": []}
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            background = job[0] == "save-background"
            tiers = TieredCheckpointManager(memory_dir=os.path.join(base, f"node{rank // 2}", "shm"),
                                            durable_dir=durable, peers=1, ranks_per_node=2, durable_every=2,
                                            background=background)
            if job[0].startswith("save"):
                for s in range(job[1], job[2] + 1):
                    st = state(rank, s)
                    tiers.save(s, st)
                    if background:
                        st["w"].zero_()  # after the snapshot: the saved part keeps the values
                tiers.wait()
            else:
                step, got = tiers.restore()
                result["step"] = step
                if step is not None:
                    want = state(rank, step)
                    result["equal"] = got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
            result["stats"] = tiers.stats()
            tiers.close()
        result["warnings"] = [str(w.message) for w in caught if w.category.__name__ == "TierWarning"]
    except Exception as e:  # noqa: BLE001 - the parent shows it
        result["error"] = f"{type(e).__name__}: {e}"
    finally:
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
        dist.destroy_process_group()


def run(base, job, durable=None):
    """Each rank's result of one job, run by a fresh group of WORLD processes."""
    out = os.path.join(base, f"out-{time.monotonic_ns()}")
    os.makedirs(out)
    durable = durable or os.path.join(base, "durable")
    ctx = mp.start_processes(worker, args=(free_port(), str(base), job, durable, out), nprocs=WORLD, join=False,
                             start_method="spawn")
    for p in ctx.processes:
        p.join(300)
        assert not p.is_alive(), f"{job}: a rank still runs after 300 s: it hangs"
    files = [os.path.join(out, f"rank{r}.json") for r in range(WORLD)]
    results = [json.load(open(f)) if os.path.exists(f) else None for f in files]
    assert all(r is not None and "stats" in r for r in results), f"{job}: a rank failed: {results}"
    return results


def flip(path, back=100):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - back)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))


def tiers_used(r):
    return [t for t, n in r["stats"]["restored_bytes"].items() if n]


def test_restores_from_memory_peers_and_disk_never_a_bad_copy(tmp_path):
    import shutil
    run(tmp_path, ("save", 1, 3))
    # A restart: every part from its own memory, nothing from disk.
    for r in run(tmp_path, ("restore",)):
        assert r["step"] == 3 and r["equal"] and tiers_used(r) == ["memory"], r
    # Rank 0's part in memory damaged: its copy on machine 1 serves (and
    # replaces the damaged file), with a warning naming rank, step and tier.
    flip(tmp_path / "node0" / "shm" / "step-00000003" / "rank-00000.safetensors")
    rs = run(tmp_path, ("restore",))
    assert [r["step"] for r in rs] == [3] * 4 and all(r["equal"] for r in rs), rs
    assert [tiers_used(r) for r in rs] == [["peers"], ["memory"], ["memory"], ["memory"]], rs
    assert any("rank 0, step 3, memory: skipped" in w for w in rs[0]["warnings"]), rs[0]["warnings"]
    # Machine 1 lost: its ranks get their parts from the copies on machine 0.
    shutil.rmtree(tmp_path / "node1")
    rs = run(tmp_path, ("restore",))
    assert [r["step"] for r in rs] == [3] * 4 and all(r["equal"] for r in rs), rs
    assert [tiers_used(r) for r in rs] == [["memory"], ["memory"], ["peers"], ["peers"]], rs
    # Both machines' memory lost: the newest durable step (2), nothing newer.
    shutil.rmtree(tmp_path / "node0")
    shutil.rmtree(tmp_path / "node1")
    for r in run(tmp_path, ("restore",)):
        assert r["step"] == 2 and r["equal"] and tiers_used(r) == ["durable"], r
    # Nothing left anywhere: every rank says so.
    for d in ("durable", "node0", "node1"):
        shutil.rmtree(tmp_path / d, ignore_errors=True)
    assert [r["step"] for r in run(tmp_path, ("restore",))] == [None] * 4


def test_a_failing_tier_warns_and_training_goes_on(tmp_path):
    # The durable directory cannot be made (a file is in its way): every
    # save warns about the durable tier, returns, and memory still serves.
    blocker = tmp_path / "blocked"
    blocker.write_text("not a directory")
    rs = run(tmp_path, ("save", 1, 2), durable=str(blocker / "durable"))
    assert all(any("not saved to the durable tier" in w for w in r["warnings"]) for r in rs), rs
    assert all(r["stats"]["failed_tier_saves"] == 1 for r in rs), rs  # step 2 only: durable_every=2
    for r in run(tmp_path, ("restore",), durable=str(blocker / "durable")):
        assert r["step"] == 2 and r["equal"] and tiers_used(r) == ["memory"], r


def test_background_saves_return_at_the_snapshot_and_restore_alike(tmp_path):
    import shutil
    run(tmp_path, ("save-background", 1, 3))
    for r in run(tmp_path, ("restore",)):
        assert r["step"] == 3 and r["equal"] and tiers_used(r) == ["memory"], r
    shutil.rmtree(tmp_path / "node0")
    rs = run(tmp_path, ("restore",))
    assert [r["step"] for r in rs] == [3] * 4 and all(r["equal"] for r in rs), rs
    assert [tiers_used(r) for r in rs] == [["peers"], ["peers"], ["memory"], ["memory"]], rs
