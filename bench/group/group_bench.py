#!/usr/bin/env python3
"""Group loads timed against each rank loading alone and against
runai-model-streamer's distributed mode, in fresh processes, page cache
dropped before every run, contenders in a rotated order every round.

    bench/group/run.sh [--size 2GiB] [--ranks 4] [--rounds 5]
                       [--sources local,s3] [--contenders a,b,...] [--out DIR]

Sources: `local`, one safetensors file on this disk (dropped from the page
cache with posix_fadvise before each run); `s3`, the same file as an object
of SeaweedFS on 127.0.0.1 (tests/s3/weed_server.py; its volume files
dropped from the page cache before each run: the server's disk is the
shared resource). Contenders (each rank loads every tensor whole):

  mpi_alone / mpi_group / mpi_group_x   C over Open MPI
                             (build/bench/group_bench): ckptio_reader_load_boxes,
                             ckptio_reader_load_boxes_group (on one machine:
                             through the shared page cache for a local file,
                             windows of shared memory for s3://), and the same
                             with CKPTIO_GROUP_EXCHANGE (alltoallv)
  ckptio_alone / ckptio_group / ckptio_group_x   ckptio.torch.load_file,
                             without group=, with it, and with exchange=True
                             (gloo processes)
  runai_alone / runai_dist   runai-model-streamer SafetensorsStreamer,
                             alone and with is_distributed=True and
                             RUNAI_STREAMER_DIST=1 (gloo, device cpu)
  mpi_group_x_warm / ckptio_group_x_warm / ckptio_alone_warm   the local
                             file in the page cache first: what the exchange
                             itself costs (MPI's shared memory, gloo's TCP)

The time of a run is the group's: barrier, load, one byte of every page
touched, barrier (bench/group/worker.py, bench/group_bench.c). Reported per
round and as medians of per-round ratios; plus the bytes the ranks read
from storage (local: /proc/self/io read_bytes summed; s3: the bytes the
server sent, its /proc/PID/io wchar) and the largest peak RSS of a rank."""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
HERE = os.path.dirname(os.path.abspath(__file__))
ALL = ["mpi_alone", "mpi_group", "mpi_group_x", "ckptio_alone", "ckptio_group", "ckptio_group_x", "runai_alone",
       "runai_dist"]
WARM = ["mpi_group_x_warm", "ckptio_group_x_warm", "ckptio_alone_warm"]
RATIOS = [("mpi: alone / group", "mpi_alone", "mpi_group", 1.5),
          ("mpi: alone / group exchanging", "mpi_alone", "mpi_group_x", 1.5),
          ("torch: alone / group", "ckptio_alone", "ckptio_group", 1.5),
          ("torch: alone / group exchanging", "ckptio_alone", "ckptio_group_x", 1.5),
          ("runai dist / ckptio group", "runai_dist", "ckptio_group", 1.2),
          ("runai dist / ckptio group exchanging", "runai_dist", "ckptio_group_x", 1.2),
          ("runai alone / ckptio alone", "runai_alone", "ckptio_alone", None)]


def parse_size(s):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if s.endswith(u):
            return int(float(s[:-len(u)]) * m)
    return int(s)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_model(path, size):
    """bf16 matrices of 4096 x 4096 (32 MiB) and their fp32 norms, `size` in
    all, saved by ckptio (durable)."""
    import torch
    import ckptio.torch as ct
    g = torch.Generator().manual_seed(1)
    tensors, total, k = {}, 0, 0
    while total < size:
        rows = min(4096, max(1, (size - total) // (4096 * 2)))
        tensors[f"layers.{k}.weight"] = torch.randint(-30000, 30000, (rows, 4096), generator=g,
                                                      dtype=torch.int16).view(torch.bfloat16)
        tensors[f"layers.{k}.norm"] = torch.ones(4096)
        total += rows * 4096 * 2 + 4096 * 4
        k += 1
    ct.save_file(tensors, path)
    return total


def drop(paths):
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        except OSError:
            pass
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def prime(path):
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def served_bytes(pid):
    """Bytes the S3 server's process has written through system calls
    (/proc/PID/io wchar): what it sent to its clients, counted on the
    server's side (its logs and metadata writes are small beside them)."""
    if pid is None:
        return 0
    total = 0
    for p in [pid] + [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]:
        try:
            with open(f"/proc/{p}/io") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("wchar:"))
        except OSError:
            pass
    return total


def run_torch(contender, path, ranks, env, out):
    port = free_port()
    procs = []
    for r in range(ranks):
        e = dict(env, RANK=str(r), WORLD_SIZE=str(ranks), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=str(port))
        if contender == "runai_dist":
            e["RUNAI_STREAMER_DIST"] = "1"
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "worker.py"),
                                       contender.replace("_warm", ""), path, out], env=e))
    for p in procs:
        if p.wait(timeout=900) != 0:
            for q in procs:
                q.kill()
            raise RuntimeError(f"{contender}: a rank exited {p.returncode}")
    with open(out) as f:
        res = json.load(f)
    return {"seconds": res["seconds"], "read_bytes": sum(x["read_bytes"] for x in res["ranks"]),
            "maxrss_kib": max(x["maxrss_kib"] for x in res["ranks"]), "bytes_per_rank": res["bytes_per_rank"]}


def run_mpi(contender, path, ranks, env, bench):
    mode = contender.replace("_warm", "").split("_", 1)[1].replace("_", "-")  # alone, group, group-x
    cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none", bench, path, mode]
    e = dict(env, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    out = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{contender}: {out.stderr[-2000:]}")
    res = json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])
    return {k: res[k] for k in ("seconds", "read_bytes", "maxrss_kib", "bytes_per_rank")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2GiB")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sources", default="local,s3")
    ap.add_argument("--contenders", default=",".join(ALL + WARM))
    ap.add_argument("--dir", default=os.path.join(ROOT, "build", "bench-tmp", "group"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "bench", "group_bench"))
    a = ap.parse_args()
    size = parse_size(a.size)
    out_dir = a.out or os.path.join(HERE, f"results-{a.size}-{a.ranks}ranks")
    os.makedirs(out_dir, exist_ok=True)
    os.makedirs(a.dir, exist_ok=True)
    contenders = a.contenders.split(",")
    path = os.path.join(a.dir, "model.safetensors")
    total = make_model(path, size)
    env = dict(os.environ)
    sources = {"local": (path, [path])}
    server = None
    if "s3" in a.sources.split(","):
        sys.path.insert(0, os.path.join(ROOT, "tests", "s3"))
        import weed_server
        server = weed_server.WeedServer(bucket="group", workdir=os.path.join(a.dir, "weed"))
        server.__enter__()
        env.update(server.env({}), RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING="0")
        server.client().upload_file(path, "group", "model.safetensors")
        weed_files = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(a.dir, "weed")) for f in fs
                      if f.endswith((".dat", ".idx"))]
        sources["s3"] = ("s3://group/model.safetensors", weed_files)
    runs, failures = [], []
    try:
        for rnd in range(a.rounds):
            for src in [s for s in a.sources.split(",") if s in sources]:
                url, files = sources[src]
                order = contenders[rnd % len(contenders):] + contenders[:rnd % len(contenders)]
                for c in order:
                    if c.endswith("_warm") and src != "local":
                        continue
                    if c.endswith("_warm"):
                        prime(path)
                    else:
                        drop(files)
                    tmp = os.path.join(a.dir, "run.json")
                    served = served_bytes(server.pid if server is not None and src == "s3" else None)
                    try:
                        res = (run_mpi(c, url, a.ranks, env, a.bench) if c.startswith("mpi")
                               else run_torch(c, url, a.ranks, env, tmp))
                    except (RuntimeError, subprocess.TimeoutExpired) as e:  # a peer's failure is a result too
                        failures.append(f"round {rnd} {src} {c}: {e}")
                        print(f"round {rnd} {src:5} {c:18} FAILED: {e}", flush=True)
                        continue
                    res.update(contender=c, source=src, round=rnd)
                    if src == "s3":  # the server's count, in place of the processes' (their disk reads are 0)
                        res["read_bytes"] = served_bytes(server.pid) - served
                    runs.append(res)
                    print(f"round {rnd} {src:5} {c:18} {res['seconds']:7.3f} s  read {res['read_bytes'] / 2**30:6.2f} GiB"
                          f"  peak RSS {res['maxrss_kib'] / 2**20:5.2f} GiB", flush=True)
    finally:
        if server is not None:
            server.__exit__(None, None, None)
    report(runs, failures, a, total, out_dir)


def report(runs, failures, a, total, out_dir):
    lines = [f"# Group loads: {a.ranks} ranks, a {a.size} model ({total} tensor bytes), {a.rounds} rounds",
             "", f"Command: `bench/group/run.sh --size {a.size} --ranks {a.ranks} --rounds {a.rounds} "
             f"--sources {a.sources}`", ""]
    for src in a.sources.split(","):
        rows = [r for r in runs if r["source"] == src]
        if not rows:
            continue
        lines += [f"## {src}", "", "| contender | seconds per round | median s | GB/s per rank | "
                  "read GiB (median) | peak RSS GiB (max) |", "|---|---|---|---|---|---|"]
        for c in dict.fromkeys(r["contender"] for r in rows):
            mine = [r for r in rows if r["contender"] == c]
            secs = [r["seconds"] for r in mine]
            med = statistics.median(secs)
            lines.append(f"| {c} | {' '.join(f'{s:.2f}' for s in secs)} | {med:.3f} | "
                         f"{mine[0]['bytes_per_rank'] / med / 1e9:.2f} | "
                         f"{statistics.median(r['read_bytes'] for r in mine) / 2**30:.2f} | "
                         f"{max(r['maxrss_kib'] for r in mine) / 2**20:.2f} |")
        lines += ["", "| ratio (per round, then the median) | rounds | median | goal |", "|---|---|---|---|"]
        for label, slow, fast, goal in RATIOS:
            per = []
            for rnd in range(a.rounds):
                s = [r["seconds"] for r in rows if r["round"] == rnd and r["contender"] == slow]
                f = [r["seconds"] for r in rows if r["round"] == rnd and r["contender"] == fast]
                if s and f:
                    per.append(s[0] / f[0])
            if per:
                lines.append(f"| {label} | {' '.join(f'{x:.2f}' for x in per)} | {statistics.median(per):.2f} | "
                             f"{'>= ' + str(goal) if goal else ''} |")
        warm = {c: statistics.median(r["seconds"] for r in rows if r["contender"] == c)
                for c in WARM if any(r["contender"] == c for r in rows)}
        for c, how in (("mpi_group_x_warm", "MPI (shared memory)"), ("ckptio_group_x_warm", "gloo (TCP loopback)")):
            if c in warm:
                got = total * (a.ranks - 1) / a.ranks / 2**30  # what each rank receives from the others
                lines += ["", f"Exchange over {how}, the file in the page cache (no disk): every rank holds "
                          f"{total / 2**30:.2f} GiB after {warm[c]:.3f} s, {got:.2f} GiB of it received: "
                          f"{warm[c] / got:.3f} s per GiB received per rank"
                          + (f" (each rank alone from the cache: {warm['ckptio_alone_warm']:.3f} s)."
                             if "ckptio_alone_warm" in warm else ".")]
        lines.append("")
    if failures:
        lines += ["## Runs that failed", ""] + [f"- {f}" for f in failures] + [""]
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"args": vars(a), "total": total, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
