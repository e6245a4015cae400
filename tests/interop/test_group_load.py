"""Group loads over real torch.distributed gloo processes: load_file,
load_boxes and load_model with group= give every rank exactly what a
single-process load gives (files written by ckptio, by torch.save and by
safetensors), each stored byte read once per group; and every failure (a
missing tensor on one rank, another checkpoint on one rank, a damaged
byte, a rank killed mid-load) raises on every surviving rank, naming the
rank and the cause, within the timeout: nothing hangs."""

import json
import os
import signal
import sys
import time

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
mp = pytest.importorskip("torch.multiprocessing")
st = pytest.importorskip("safetensors.torch")

import ckptio.torch as ct  # noqa: E402
from ckptio import _group  # noqa: E402
import rendezvous  # noqa: E402

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)


def model():
    g = torch.Generator().manual_seed(7)
    return {
        "embed.weight": torch.randn(2000, 64, generator=g).to(torch.bfloat16),
        "layers.0.qkv.weight": torch.randn(64, 192, generator=g),
        "layers.0.out.weight": torch.randn(64, 64, generator=g),
        "layers.0.norm.weight": torch.randn(64, generator=g),
        "layers.0.mlp.weight": torch.randn(300, 64, generator=g).half(),
        "step": torch.tensor(12, dtype=torch.int64),
        "flags": torch.tensor([True, False, True]),
    }


def tp_boxes(rank, world):
    """A tensor-parallel rank's share: columns of qkv, rows of out and
    mlp, a vocabulary slice of embed, the rest replicated."""
    def part(n):
        return slice(n * rank // world, n * (rank + 1) // world)
    return {"layers.0.qkv.weight": (slice(None), part(192)), "layers.0.out.weight": part(64),
            "layers.0.mlp.weight": part(300), "embed.weight": part(2000), "layers.0.norm.weight": None,
            "step": None}


def read_bytes():
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def drop_cache(path):
    for root, _, files in os.walk(path) if os.path.isdir(path) else [(os.path.dirname(path), [], [path])]:
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def scenario(rank, world, name, path):
    """This rank's part of scenario `name` (ending in -x: exchange=True, the
    ranks exchange bytes although they share this machine's page cache);
    returns what the parent checks."""
    x = name.endswith("-x")
    name = name[:-2] if x else name
    group = dist.group.WORLD
    timeout = __import__("datetime").timedelta(seconds=20)
    if name == "whole":
        if rank == 0 and "://" not in path:
            drop_cache(path)
        dist.barrier()
        before = read_bytes()
        got = ct.load_file(path, group=group, staging_bytes=1 << 20, timeout=timeout, exchange=x)
        for t in got.values():  # a page of each 4 KiB: a mapped result is then held too
            b = t.reshape(-1).view(torch.uint8)
            int(b[::4096].sum()) if b.nelement() else 0
        read = read_bytes() - before
        want = ct.load_file(path)
        assert list(got) == list(want), (list(got), list(want))
        for k in want:
            assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k
        return {"read": read, "tensor_bytes": sum(t.nelement() * t.element_size() for t in want.values())}
    if name == "tp":
        boxes = tp_boxes(rank, world)
        got = ct.load_boxes(path, boxes, group=group, staging_bytes=1 << 20, timeout=timeout, exchange=x)
        want = ct.load_file(path)
        for k, sl in boxes.items():
            ref = want[k] if sl is None else want[k][sl]
            assert torch.equal(got[k], ref.contiguous()), k
        return {}
    if name == "model":
        m = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.LayerNorm(8))
        m2 = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.LayerNorm(8))
        missing, unexpected = ct.load_model(m2, path, group=group)
        ref = ct.load_file(path)
        for k, v in m2.state_dict().items():
            assert torch.equal(v, ref[k]), k
        return {"missing": missing, "unexpected": unexpected}
    if name == "dcp":  # saved row-sharded by ckptio.dcp.Writer, loaded column-sharded by group
        import torch.distributed.checkpoint as dcp
        import ckptio.dcp
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor
        mesh = init_device_mesh("cpu", (world,))
        full = model()
        del full["step"], full["flags"]
        sd = {k: distribute_tensor(v, mesh, [Shard(0)]) for k, v in full.items()}
        dcp.save(sd, storage_writer=ckptio.dcp.Writer(path))
        back = {k: distribute_tensor(torch.zeros_like(v), mesh, [Shard(v.dim() - 1) if v.dim() > 1 else Replicate()])
                for k, v in full.items()}
        dcp.load(back, storage_reader=ckptio.dcp.Reader(path, group=group, staging_bytes=1 << 20, timeout=timeout))
        for k, v in full.items():
            assert torch.equal(back[k].full_tensor(), v), k
        return {}
    if name == "missing":
        boxes = {"layers.0.norm.weight": None}
        if rank == 1:
            boxes["no.such.tensor"] = None
        ct.load_boxes(path, boxes, group=group, timeout=timeout)
    if name == "different":
        ct.load_file(path + ".other" if rank == world - 1 else path, group=group, timeout=timeout)
    if name == "damaged":
        ct.load_file(path, group=group, staging_bytes=1 << 20, timeout=timeout, exchange=x)
    if name == "killed":
        if rank == 1:  # dies in its third exchange
            calls = [0]
            real = _group.Group._alltoallv_cb

            def dying(self, *a):
                calls[0] += 1
                if calls[0] == 3:
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(self, *a)
            _group.Group._alltoallv_cb = dying
        ct.load_file(path, group=group, staging_bytes=1 << 20,
                     timeout=__import__("datetime").timedelta(seconds=5), exchange=True)
    return {}


def worker(rank, world, init_method, steps, out):
    """Runs the steps [(name, path)] in order in one process group (a
    spawn costs seconds: torch's import), each step's result in
    out/step{i}-rank{r}.json."""
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    for i, (name, path) in enumerate(steps):
        t0 = time.monotonic()
        try:
            res = {"ok": True, **scenario(rank, world, name, path)}
        except BaseException as e:  # noqa: BLE001 - the parent checks it
            res = {"ok": False, "type": type(e).__name__, "error": str(e)}
        res["seconds"] = time.monotonic() - t0
        with open(os.path.join(out, f"step{i}-rank{rank}.json"), "w") as f:
            json.dump(res, f)
        try:
            dist.barrier()  # every rank done with a step before any starts the next
        except Exception:  # noqa: BLE001 - a rank died (the killed step): no next step
            break
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # without the interpreter's teardown, nor the group's (a peer may be dead)


def run_steps(world, steps, tmp_path):
    """{(name, path): each rank's result (None: it died)} of the steps, run
    in order by one group of `world` processes."""
    out = tmp_path / f"out-{world}-{time.monotonic_ns()}"
    out.mkdir()
    steps = [(name, str(path)) for name, path in steps]
    ctx = mp.start_processes(worker, args=(world, rendezvous.init_method(), steps, str(out)), nprocs=world,
                             join=False, start_method="spawn")
    for p in ctx.processes:
        p.join(300)
        assert not p.is_alive(), f"{steps}: a rank still runs after 300 s: it hangs"
    results = {}
    for i, step in enumerate(steps):
        files = [out / f"step{i}-rank{r}.json" for r in range(world)]
        results[step] = [json.loads(f.read_text()) if f.exists() else None for f in files]
    return results


def run(world, name, path, tmp_path):
    """Each rank's result of one step in a group of its own."""
    return run_steps(world, [(name, path)], tmp_path)[(name, str(path))]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("group")
    m = model()
    paths = {"ckptio": d / "m.safetensors", "safetensors": d / "st.safetensors", "torch": d / "m.pt",
             "set": d / "set", "zstd": d / "m.safetensors.zst"}
    ct.save_file(m, paths["ckptio"])
    st.save_file(m, str(paths["safetensors"]))
    torch.save(m, paths["torch"])
    paths["set"].mkdir()
    ct.save_torch_state_dict(m, paths["set"], max_shard_size=100_000)
    # (ckptio.numpy writes the compressed kind; numpy has no bfloat16)
    import ckptio
    ckptio.save_file({k: (v.float() if v.dtype == torch.bfloat16 else v).numpy() for k, v in m.items()},
                     paths["zstd"], compress=3)
    return paths


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """24 MiB files written by ckptio and by safetensors, synced (safetensors
    does not: dirty pages would stay in the cache)."""
    d = tmp_path_factory.mktemp("big")
    g = torch.Generator().manual_seed(3)
    m = {f"w{i}": torch.randn(1024, 1024, generator=g) for i in range(6)}
    paths = {"ckptio": d / "ck.safetensors", "safetensors": d / "st.safetensors"}
    ct.save_file(m, paths["ckptio"])
    st.save_file(m, str(paths["safetensors"]))
    for p in paths.values():
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    return paths


@pytest.fixture(scope="module")
def bad(files, tmp_path_factory):
    """The ckptio file with a byte of embed.weight (the first rank's span)
    damaged, and another checkpoint beside it (.other: step 13)."""
    path = tmp_path_factory.mktemp("bad") / "bad.safetensors"
    data = bytearray(files["ckptio"].read_bytes())
    data[len(data) // 3] ^= 0x10
    path.write_bytes(bytes(data))
    m = model()
    m["step"] = torch.tensor(13, dtype=torch.int64)
    ct.save_file(m, str(files["ckptio"]) + ".other")
    return path


@pytest.fixture(scope="module")
def three(files, big, bad, tmp_path_factory):
    """Every three-rank step of this module, run by one group."""
    steps = [(how, files[kind]) for kind in files for how in ("whole", "whole-x")]
    steps += [(how, big[w]) for w in big for how in ("whole", "whole-x")]
    steps += [("tp", files["ckptio"]), ("tp-x", files["ckptio"]), ("missing", files["ckptio"]),
              ("different", files["ckptio"]), ("damaged-x", bad), ("damaged", bad)]
    return run_steps(3, steps, tmp_path_factory.mktemp("three"))


@pytest.mark.parametrize("kind", ["ckptio", "safetensors", "torch", "set", "zstd"])
@pytest.mark.parametrize("how", ["whole", "whole-x"])
def test_every_rank_gets_the_whole_file(three, files, kind, how):
    for r, x in enumerate(three[(how, str(files[kind]))]):
        assert x and x["ok"], (r, x)


@pytest.mark.parametrize("writer", ["ckptio", "safetensors"])
@pytest.mark.parametrize("how", ["whole", "whole-x"])
def test_the_group_reads_each_byte_once(three, big, writer, how):
    res = three[(how, str(big[writer]))]
    for r, x in enumerate(res):
        assert x and x["ok"], (r, x)
    total = sum(x["read"] for x in res)
    # Once by the group, where three loads alone would read it three times;
    # besides, each rank's header, and (exchanging: O_DIRECT reads) the 4 KiB
    # pages at the edges of its staged reads, which a file safetensors wrote
    # puts off page boundaries: at most 256 KiB a rank at this size.
    assert total <= 1.02 * res[0]["tensor_bytes"] + 3 * (256 << 10), res
    assert total >= 0.9 * res[0]["tensor_bytes"], ("the file was not read from the disk", res)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_tensor_parallel_shares(three, files, world, tmp_path):
    steps = [("tp", files["ckptio"]), ("tp-x", files["ckptio"])]
    res = ({s: three[(s[0], str(s[1]))] for s in steps} if world == 3
           else {s: v for s, v in zip(steps, run_steps(world, steps, tmp_path).values())})
    for step, ranks in res.items():
        for r, x in enumerate(ranks):
            assert x and x["ok"], (step, r, x)


def test_load_model_and_the_dcp_reader_with_a_group(tmp_path):
    m = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.LayerNorm(8))
    path = tmp_path / "model.safetensors"
    ct.save_model(m, path)
    res = run_steps(2, [("model", path), ("dcp", tmp_path / "ckpt")], tmp_path)
    for r, x in enumerate(res[("model", str(path))]):
        assert x and x["ok"] and x["missing"] == [] and x["unexpected"] == [], (r, x)
    for r, x in enumerate(res[("dcp", str(tmp_path / "ckpt"))]):
        assert x and x["ok"], (r, x)


@pytest.fixture(scope="module")
def s3():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "s3"))
    import s3_env
    yield from s3_env.serve("group")


def test_a_group_loads_an_s3_object(s3, files, tmp_path):
    s3.client().upload_file(str(files["ckptio"]), s3.bucket, "g/m.safetensors")
    url = f"s3://{s3.bucket}/g/m.safetensors"
    for step, ranks in run_steps(3, [("whole", url), ("tp", url)], tmp_path).items():
        for r, x in enumerate(ranks):
            assert x and x["ok"], (step, r, x)


def test_a_missing_tensor_on_one_rank_fails_every_rank(three, files):
    res = three[("missing", str(files["ckptio"]))]
    assert not res[1]["ok"] and "no.such.tensor" in res[1]["error"], res[1]
    for r in (0, 2):
        assert not res[r]["ok"] and "rank 1" in res[r]["error"] and "no.such.tensor" in res[r]["error"], res[r]


def test_another_checkpoint_on_one_rank_fails_every_rank(three, files):
    for r, x in enumerate(three[("different", str(files["ckptio"]))]):
        assert not x["ok"] and "rank 2 opened another checkpoint" in x["error"], (r, x)


def test_a_damaged_byte_fails_every_rank(three, bad):
    res = three[("damaged-x", str(bad))]
    kinds = sorted(x["type"] for x in res)
    assert all(not x["ok"] for x in res), res
    assert kinds.count("CkptioChecksumError") == 1, res
    for x in res:
        assert "checksum" in x["error"] or "embed.weight" in x["error"], x
    # Sharing the page cache, every rank reads the damaged part itself.
    res = three[("damaged", str(bad))]
    assert [x["type"] for x in res] == ["CkptioChecksumError"] * 3, res


def test_a_rank_killed_mid_load_fails_the_others_within_the_timeout(tmp_path):
    path = tmp_path / "big.safetensors"
    ct.save_file({f"w{i}": torch.ones(1024, 1024) * i for i in range(6)}, path)  # 24 rounds of 1 MiB
    res = run(3, "killed", path, tmp_path)
    assert res[1] is None, "rank 1 was to die"
    for r in (0, 2):
        x = res[r]
        assert x is not None and not x["ok"], (r, x)
        assert x["seconds"] < 60, x
        assert "the communicator's alltoallv failed" in x["error"], x
