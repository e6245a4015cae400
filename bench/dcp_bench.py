#!/usr/bin/env python3
"""torch.distributed.checkpoint with its own FileSystemWriter / Reader, its
Hugging Face safetensors writer / reader, and ckptio.dcp, side by side on
the same state dict at the same world size, next to the raw write and read
of the same bytes by as many writers (build/bench/dist_bench under mpirun),
every contender in fresh processes, all in the same rounds.

    bench/dcp_bench.py [--world 2] [--gib 1] [--rounds 3] [--dir DIR]
    (DIST_BENCH=path names the dist_bench for the raw limit)

Each round, for each contender (in a rotating order): a gloo group of
--world processes builds the state dict (8 F32 tensors [rows, 4096],
DTensor Shard(0), filled before any timing), then
  save   dcp.save, durable (FileSystemWriter sync_files=True; ckptio fsyncs
         its files, the directory and the index), barrier to barrier: the
         first save of the processes, then a second one into a fresh
         directory ("warm": what every later save of a training loop pays)
  async  dcp.async_save: the time until it returns (training may go on),
         then its future is waited for
  load   dcp.load into a fresh state dict of the same placements, page cache
         dropped first, barrier to barrier (ckptio checks every CRC)
  peak   the largest rise of a rank's peak RSS over the save and the load
The raw write / read: dist_bench raw-write / raw-read with --world ranks
(O_DIRECT, 16 requests of 8 MiB in flight per rank, fdatasync).
Needs the venv's torch; prints a markdown table.
"""

import argparse
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

COLS = 4096


def contenders():
    import ckptio.dcp
    out = {
        "DCP FileSystemWriter": (lambda p: dcp.FileSystemWriter(p, sync_files=True),
                                 lambda p: dcp.FileSystemReader(p)),
        "ckptio.dcp": (lambda p: ckptio.dcp.Writer(p), lambda p: ckptio.dcp.Reader(p)),
    }
    if hasattr(dcp, "HuggingFaceStorageWriter"):
        out["DCP HuggingFaceStorageWriter"] = (
            lambda p: dcp.HuggingFaceStorageWriter(p, save_distributed=True),
            lambda p: dcp.HuggingFaceStorageReader(p))
    return out


def drop_cache():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
    except OSError:
        pass


def state_dict(world, gib, fill):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (world,))
    rows = int(gib * (1 << 30) / 8 / COLS / 4)
    sd = {}
    for k in range(8):
        t = torch.empty(rows, COLS)
        if fill:
            t.uniform_()
        else:
            t.zero_()
        sd[f"layers.{k}.weight"] = distribute_tensor(t, mesh, [Shard(0)])
    return sd


def maxrss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(rank, world, port, name, gib, path, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    make_writer, make_reader = contenders()[name]
    sd = state_dict(world, gib, True)
    res = {}
    # save, durable
    shutil.rmtree(path, ignore_errors=True) if rank == 0 else None
    dist.barrier()
    base = maxrss()
    t0 = time.perf_counter()
    dcp.save(sd, storage_writer=make_writer(path))
    dist.barrier()
    res["save"] = time.perf_counter() - t0
    res["save_peak"] = maxrss() - base
    # the same save again, warm, into a fresh directory
    if rank == 0:
        shutil.rmtree(path + ".warm", ignore_errors=True)
    dist.barrier()
    t0 = time.perf_counter()
    dcp.save(sd, storage_writer=make_writer(path + ".warm"))
    dist.barrier()
    res["save_warm"] = time.perf_counter() - t0
    if rank == 0:
        shutil.rmtree(path + ".warm", ignore_errors=True)
    # async: until training may go on
    if rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    dist.barrier()
    t0 = time.perf_counter()
    fut = dcp.async_save(sd, storage_writer=make_writer(path))
    res["async"] = time.perf_counter() - t0
    fut.result()
    dist.barrier()
    # load, cold
    target = state_dict(world, gib, False)
    if rank == 0:
        drop_cache()
    dist.barrier()
    base = maxrss()
    t0 = time.perf_counter()
    dcp.load(target, storage_reader=make_reader(path))
    dist.barrier()
    res["load"] = time.perf_counter() - t0
    res["load_peak"] = maxrss() - base
    for k, v in sd.items():
        assert torch.equal(v.to_local(), target[k].to_local()), k
    gathered = [None] * world
    dist.all_gather_object(gathered, res)
    if rank == 0:
        with open(out, "w") as f:
            f.write(repr({k: max(g[k] for g in gathered) for k in res}))
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raw(world, gib, d):
    exe = os.environ.get("DIST_BENCH") or os.path.join(ROOT, "build", "bench", "dist_bench")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    got = {}
    for mode in ("raw-write", "raw-read"):
        if mode == "raw-read":
            drop_cache()
        args = ["mpirun", "-np", str(world), "--oversubscribe", "--bind-to", "none", exe, mode, d]
        r = subprocess.run(args + ([str(gib)] if mode == "raw-write" else []), capture_output=True, text=True,
                           env=env, check=True)
        fields = dict(x.split("=") for x in r.stdout.split()[1:])
        got[mode] = float(fields["seconds"])
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=os.path.join(ROOT, "build", "bench-tmp", "dcp"))
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    names = list(contenders())
    rows = {n: [] for n in names}
    raws = []
    nbytes = int(a.gib * (1 << 30) / 8 / COLS / 4) * COLS * 4 * 8
    for rnd in range(a.rounds):
        raws.append(raw(a.world, a.gib, a.dir))
        order = names[rnd % len(names):] + names[:rnd % len(names)]
        for name in order:
            out = os.path.join(a.dir, "result")
            mp.start_processes(worker, args=(a.world, free_port(), name, a.gib, os.path.join(a.dir, "ckpt"), out),
                               nprocs=a.world, start_method="spawn")
            with open(out) as f:
                rows[name].append(eval(f.read()))  # noqa: S307 - our own repr of a dict of floats
        print(f"round {rnd + 1}: raw write {nbytes / raws[-1]['raw-write'] / 1e9:.3f} GB/s, raw read "
              f"{nbytes / raws[-1]['raw-read'] / 1e9:.3f} GB/s; " + "; ".join(
                  f"{n}: save {rows[n][-1]['save']:.2f} s ({raws[-1]['raw-write'] / rows[n][-1]['save']:.2f}x) "
                  f"warm {rows[n][-1]['save_warm']:.2f} s ({raws[-1]['raw-write'] / rows[n][-1]['save_warm']:.2f}x) "
                  f"load {rows[n][-1]['load']:.2f} s" for n in names),
              flush=True)
    med = statistics.median
    fs = rows["DCP FileSystemWriter"]
    print(f"\nworld {a.world}, {nbytes / 1e9:.2f} GB state dict, {a.rounds} rounds, medians "
          "(ratios taken per round, then the median)\n")
    print("| writer / reader | first save (durable) | first save / raw write | warm save | warm save / raw write | "
          "save speed-up over FileSystemWriter | "
          "async_save returns after | load (cold) | load / raw read | peak RSS rise per rank (save / load) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in names:
        r = rows[n]
        print(f"| {n} | {med(x['save'] for x in r):.2f} s ({nbytes / med(x['save'] for x in r) / 1e9:.2f} GB/s) | "
              f"{med(raws[i]['raw-write'] / r[i]['save'] for i in range(len(r))):.2f}x | "
              f"{med(x['save_warm'] for x in r):.2f} s | "
              f"{med(raws[i]['raw-write'] / r[i]['save_warm'] for i in range(len(r))):.2f}x | "
              f"{med(fs[i]['save'] / r[i]['save'] for i in range(len(r))):.2f}x | "
              f"{med(x['async'] for x in r):.2f} s | "
              f"{med(x['load'] for x in r):.2f} s ({nbytes / med(x['load'] for x in r) / 1e9:.2f} GB/s) | "
              f"{med(raws[i]['raw-read'] / r[i]['load'] for i in range(len(r))):.2f}x | "
              f"{med(x['save_peak'] for x in r) / 2**20:.0f} / {med(x['load_peak'] for x in r) / 2**20:.0f} MiB |")
    print(f"| raw ({a.world} writers / readers) | {med(x['raw-write'] for x in raws):.2f} s | 1.00x | | | | | "
          f"{med(x['raw-read'] for x in raws):.2f} s | 1.00x | |")


if __name__ == "__main__":
    main()
