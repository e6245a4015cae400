"""Tiered checkpoints (ckptio.tiers) over real torch.distributed gloo
processes: 4 ranks as 2 machines of 2, each machine's memory tier its own
directory (a machine lost is that directory wiped), one durable directory
and, in the storage test, an S3 prefix on a real SeaweedFS server.
A job runs a list of actions in one group: saves, restores (each through a
fresh TieredCheckpointManager, as a restarted job makes one), and between
them rank 0 damages or wipes what a failure would (the other ranks wait at
a barrier). Restarts in fresh processes are tests/dist/tiers.sh's (MPI)."""

import json
import os
import shutil
import time

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
mp = pytest.importorskip("torch.multiprocessing")

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import rendezvous  # noqa: E402

WORLD = 4


def state(rank, step):
    """Rank's tensors at step: every value says whose and when."""
    w = torch.arange(64 * 1024, dtype=torch.float32) + rank * 1e6 + step * 1e3
    return {"w": w.reshape(64, 1024), "step": torch.tensor([rank, step], dtype=torch.int64)}


def flip(path, back=100):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - back)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))


def global_state(step):
    """The job's global tensors when each of WORLD ranks held state(rank, step) as its part."""
    parts = [state(r, step) for r in range(WORLD)]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def act(rank, base, durable, storage, action):
    """One action of a job on this rank: what the parent checks."""
    import warnings
    from ckptio.tiers import TieredCheckpointManager
    kind = action[0]
    if kind in ("wipe", "flip"):
        dist.barrier()  # every rank is done with the previous action's files
        if rank == 0:
            for name in action[1:]:
                path = os.path.join(base, name)
                flip(path) if kind == "flip" else shutil.rmtree(path, ignore_errors=True)
        dist.barrier()
        return {}
    result = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        background = kind == "save-background"
        world = dist.get_world_size()
        tiers = TieredCheckpointManager(memory_dir=os.path.join(base, f"node{rank // 2}", "shm"),
                                        durable_dir=durable, peers=int(world > 2), ranks_per_node=2, durable_every=2,
                                        storage_dir=storage, storage_every=2, background=background)
        if kind.startswith("save"):
            for s in range(action[1], action[2] + 1):
                st = state(rank, s)
                rows = st["w"].shape[0]
                places = {"w": ((WORLD * rows, st["w"].shape[1]), (rank * rows, 0)), "step": ((2 * WORLD,), (2 * rank,))}
                tiers.save(s, st, places=places if kind == "save-placed" else None)
                if background:
                    st["w"].zero_()  # after the snapshot: the saved part keeps the values
            tiers.wait()
        elif kind == "restore-into":  # one pass into the rank's own (zeroed) tensors
            mine = {k: torch.zeros_like(v) for k, v in state(rank, 0).items()}
            step = tiers.restore_into(mine)
            result["step"] = step
            if step is not None:
                want = state(rank, step)
                result["equal"] = all(torch.equal(mine[k], want[k]) for k in want)
        elif kind == "restore-global":  # this rank's share of w's rows, all of step
            rows = WORLD * state(0, 0)["w"].shape[0]
            share = slice(rows * rank // world, rows * (rank + 1) // world)
            step, got = tiers.restore_global({"w": share, "step": None})
            result["step"] = step
            if step is not None:
                want = global_state(step)
                result["equal"] = torch.equal(got["w"], want["w"][share]) and torch.equal(got["step"], want["step"])
        else:
            step, got = tiers.restore()
            result["step"] = step
            if step is not None:
                want = state(rank, step)
                result["equal"] = got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
        result["stats"] = tiers.stats()
        tiers.close()
    result["warnings"] = [str(w.message) for w in caught if w.category.__name__ == "TierWarning"]
    return result


def worker(rank, init_method, base, actions, durable, storage, out, world):
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    results = []
    try:
        for action in actions:
            results.append(act(rank, base, durable, storage, action))
    except Exception as e:  # noqa: BLE001 - the parent shows it
        results.append({"error": f"{type(e).__name__}: {e}"})
    finally:
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
        dist.destroy_process_group()


def run(base, actions, durable=None, storage=None, world=WORLD):
    """[action][rank] results of one job of WORLD fresh processes (the
    storage tier, when given, every 2nd step as the durable one)."""
    out = os.path.join(base, f"out-{time.monotonic_ns()}")
    os.makedirs(out)
    durable = durable or os.path.join(base, "durable")
    ctx = mp.start_processes(worker, args=(rendezvous.init_method(), str(base), actions, durable, storage, out, world),
                             nprocs=world,
                             join=False, start_method="spawn")
    for p in ctx.processes:
        p.join(300)
        assert not p.is_alive(), f"{actions}: a rank still runs after 300 s: it hangs"
    per_rank = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(world)]
    for r, res in enumerate(per_rank):
        assert len(res) == len(actions) and all("error" not in x for x in res), f"rank {r} failed: {res}"
    return [[per_rank[r][i] for r in range(world)] for i in range(len(actions))]


def tiers_used(r):
    return [t for t, n in r["stats"]["restored_bytes"].items() if n]


def test_restores_from_memory_peers_and_disk_never_a_bad_copy(tmp_path):
    part0 = os.path.join("node0", "shm", "step-00000003", "rank-00000.safetensors")
    _, mem, _, damaged, repaired, _, lost, _, disk, _, nothing = run(tmp_path, [
        ("save", 1, 3),
        ("restore",),                      # every part from its own memory
        ("flip", part0),
        ("restore-into",),                 # one pass into the ranks' tensors: rank 0's copy on machine 1
                                           # serves, straight into the tensors (no file written)
        ("restore",),                      # two passes: the copy again, now written over the bad file
        ("wipe", "node1"),
        ("restore",),                      # machine 1 lost: its ranks get the copies on machine 0
        ("wipe", "node0", "node1"),
        ("restore",),                      # both machines' memory lost: the newest durable step, 2
        ("wipe", "durable"),
        ("restore",),                      # nothing left anywhere
    ])
    for r in mem:
        assert r["step"] == 3 and r["equal"] and tiers_used(r) == ["memory"], r
    assert [r["step"] for r in damaged] == [3] * 4 and all(r["equal"] for r in damaged), damaged
    assert [tiers_used(r) for r in damaged] == [["peers"], ["memory"], ["memory"], ["memory"]], damaged
    assert any("rank 0, step 3, memory: skipped" in w for w in damaged[0]["warnings"]), damaged[0]["warnings"]
    assert [tiers_used(r) for r in repaired] == [["peers"], ["memory"], ["memory"], ["memory"]], repaired
    assert any("rank 0, step 3, memory: skipped" in w for w in repaired[0]["warnings"]), repaired[0]["warnings"]
    assert [r["step"] for r in lost] == [3] * 4 and all(r["equal"] for r in lost), lost
    assert [tiers_used(r) for r in lost] == [["memory"], ["memory"], ["peers"], ["peers"]], lost
    for r in disk:
        assert r["step"] == 2 and r["equal"] and tiers_used(r) == ["durable"], r
    assert [r["step"] for r in nothing] == [None] * 4


def test_a_failing_tier_warns_and_training_goes_on(tmp_path):
    # The durable directory cannot be made (a file is in its way): step 2's
    # save warns about the durable tier, returns, and memory still serves.
    blocker = tmp_path / "blocked"
    blocker.write_text("not a directory")
    saved, restored = run(tmp_path, [("save", 1, 2), ("restore",)], durable=str(blocker / "durable"))
    assert all(any("not saved to the durable tier" in w for w in r["warnings"]) for r in saved), saved
    assert all(r["stats"]["failed_tier_saves"] == 1 for r in saved), saved  # step 2 only: durable_every=2
    for r in restored:
        assert r["step"] == 2 and r["equal"] and tiers_used(r) == ["memory"], r


def test_background_saves_return_at_the_snapshot_and_restore_alike(tmp_path):
    _, mem, _, lost = run(tmp_path, [("save-background", 1, 3), ("restore",), ("wipe", "node0"), ("restore",)])
    for r in mem:
        assert r["step"] == 3 and r["equal"] and tiers_used(r) == ["memory"], r
    assert [r["step"] for r in lost] == [3] * 4 and all(r["equal"] for r in lost), lost
    assert [tiers_used(r) for r in lost] == [["peers"], ["peers"], ["memory"], ["memory"]], lost


def test_a_save_with_places_restores_at_another_world_size(tmp_path):
    run(tmp_path, [("save-placed", 1, 2)])  # 4 ranks; the durable tier holds step 2
    (restored,) = run(tmp_path, [("restore-global",)], world=2)  # 3 and 1: tests/dist/tiers.sh
    for r in restored:
        assert r["step"] == 2 and r["equal"] and tiers_used(r) == ["durable"], r


@pytest.fixture(scope="module")
def s3():
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "s3"))
    import s3_env
    yield from s3_env.serve("tiers")


def test_a_save_with_places_restores_at_another_world_size_from_the_storage(s3, tmp_path):
    storage = f"s3://{s3.bucket}/placed"
    run(tmp_path, [("save-placed", 1, 2), ("wipe", "durable")], storage=storage)
    (restored,) = run(tmp_path, [("restore-global",)], storage=storage, world=2)
    for r in restored:  # this rank's boxes read from the storage's multi-rank checkpoint
        assert r["step"] == 2 and r["equal"] and tiers_used(r) == ["storage"], r


def test_the_storage_tier_restores_a_job_that_lost_every_machine_and_disk(s3, tmp_path):
    storage = f"s3://{s3.bucket}/job"
    saved, _, lost = run(tmp_path, [("save", 1, 3), ("wipe", "node0", "node1", "durable"), ("restore",)],
                         storage=storage)
    for r in saved:
        assert r["stats"]["saved_bytes"]["storage"] > 0 and r["stats"]["failed_tier_saves"] == 0, r
    for r in lost:  # step 2 (storage_every=2), downloaded into the memory directories
        assert r["step"] == 2 and r["equal"] and tiers_used(r) == ["storage"], r
    keys = sorted(o["Key"] for o in s3.client().list_objects_v2(Bucket=s3.bucket, Prefix="job/")["Contents"])
    assert keys == ["job/step-00000002/PUBLISHED"] + [f"job/step-00000002/rank-{r:05d}.safetensors"
                                                      for r in range(WORLD)], keys
    # A flipped byte in rank 2's object: never loaded; nothing else is whole.
    obj = s3.client().get_object(Bucket=s3.bucket, Key="job/step-00000002/rank-00002.safetensors")["Body"].read()
    bad = bytearray(obj)
    bad[-100] ^= 0xFF
    s3.client().put_object(Bucket=s3.bucket, Key="job/step-00000002/rank-00002.safetensors", Body=bytes(bad))
    _, damaged = run(tmp_path, [("wipe", "node0", "node1", "durable"), ("restore",)], storage=storage)
    assert [r["step"] for r in damaged] == [None] * WORLD, damaged
    assert any("rank 2, step 2, the storage: skipped" in w for w in damaged[2]["warnings"]), damaged[2]
