#!/usr/bin/env python3
"""One-shot saves in fresh interpreters (issue 16 item 1, issue 26 item 4):
what a script that saves once pays. Each round runs, in fresh processes:
the raw O_DIRECT write of the same bytes (dist_bench raw-write, 1 rank:
fallocate, 16 x 8 MiB in flight, fdatasync), then ckptio's save_file (one
process per --lib, and per --snapshot-bytes value), then safetensors'
save_file followed by fsync of the file and its directory, then the raw
write again. Only the save call is timed (imports and the arrays'
allocation are not; the library's context is created inside the first
save, as a script's is). The raw write runs for --size of 64 MiB or more;
each round's ratio is taken to the mean of that round's two raw writes
(the disk drifts 2x from minute to minute here) and, stricter, to the
faster of them; the medians are over rounds.

    bench/oneshot.py --size 16 --rounds 6 [--lib build/libckptio.so ...]
    bench/oneshot.py --size 1GiB --rounds 5 --api numpy --arrays 8
    bench/oneshot.py --size 256MiB --rounds 5 --snapshot-bytes 0 --snapshot-bytes 1GiB

--api torch saves one float32 tensor (ckptio.torch.save_file against
safetensors.torch.save_file); --api numpy saves --arrays float32 arrays of
--size in all (ckptio.numpy.save_file, the ckptio.save_file of the package,
against safetensors.numpy.save_file).
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(api, kind, path, size, arrays, snapshot):
    if api == "torch":
        import torch
        t = torch.ones(max(size // 4, 1), dtype=torch.float32)
        t += 1
        state = {"x": t}
    else:
        import numpy as np
        each = max(size // arrays // 4, 1)
        state = {f"layer.{i}": np.full(each, i + 1, dtype=np.float32) for i in range(arrays)}
    if kind == "ckptio":
        import ckptio
        if snapshot:
            ckptio.configure(snapshot_bytes=snapshot)
        if api == "torch":
            import ckptio.torch as mod
        else:
            import ckptio.numpy as mod
        t0 = time.perf_counter()
        mod.save_file(state, path)
    else:
        if api == "torch":
            from safetensors.torch import save_file
        else:
            from safetensors.numpy import save_file
        t0 = time.perf_counter()
        save_file(state, path)
        for p in (path, os.path.dirname(path)):
            fd = os.open(p, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
    print(f"{time.perf_counter() - t0:.6f}")


def parse_size(s):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if s.endswith(u):
            return int(float(s[:-len(u)]) * m)
    return int(s)


def run(args, env=None):
    return float(subprocess.run(args, capture_output=True, text=True, check=True, env=env).stdout.split()[-1])


def raw_write(raw_bin, d, size):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    out = subprocess.run(["mpirun", "-np", "1", raw_bin, "raw-write", d, str(size / (1 << 30))],
                         capture_output=True, text=True, check=True, env=env).stdout
    return float(out.split("seconds=")[1].split()[0])


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]))
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="16")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--api", choices=["torch", "numpy"], default="torch")
    ap.add_argument("--arrays", type=int, default=8, help="--api numpy: how many arrays (default 8)")
    ap.add_argument("--lib", action="append", default=None, help="libckptio.so to measure (repeatable)")
    ap.add_argument("--snapshot-bytes", action="append", default=None,
                    help="ckptio.configure(snapshot_bytes=) before the save (repeatable; default 0)")
    ap.add_argument("--raw-bin", default=os.path.join(ROOT, "build", "bench", "dist_bench"),
                    help="dist_bench for the raw write (default build/bench/dist_bench)")
    ap.add_argument("--dir", default=os.path.join(ROOT, "build", "bench-tmp", "oneshot"))
    a = ap.parse_args()
    size, libs = parse_size(a.size), a.lib or [os.path.join(ROOT, "build", "libckptio.so")]
    snaps = [parse_size(s) for s in (a.snapshot_bytes or ["0"])]
    arms = [(lib, s) for lib in libs for s in snaps]

    def label(arm):
        lib, s = arm
        name = os.path.relpath(lib, ROOT) if lib.startswith(ROOT) else lib
        return name + (f" snapshot={s >> 20}MiB" if len(snaps) > 1 or s else "")

    print(f"# {' '.join(sys.argv)}  ({os.cpu_count()} cores, {a.api}, {size} bytes)", flush=True)
    os.makedirs(a.dir, exist_ok=True)
    py = sys.executable
    raw_on = size >= 64 << 20
    res = {k: [] for k in [*arms, "safetensors", "raw before", "raw after"]}
    for _ in range(a.rounds):
        if raw_on:
            res["raw before"].append(raw_write(a.raw_bin, a.dir, size))
        for arm in arms:
            env = dict(os.environ, CKPTIO_LIB=arm[0], PYTHONPATH=os.path.join(ROOT, "python"))
            res[arm].append(run([py, __file__, "--child", a.api, "ckptio", os.path.join(a.dir, "c.safetensors"),
                                 str(size), str(a.arrays), str(arm[1])], env))
        res["safetensors"].append(run([py, __file__, "--child", a.api, "st", os.path.join(a.dir, "s.safetensors"),
                                       str(size), str(a.arrays), "0"]))
        if raw_on:
            res["raw after"].append(raw_write(a.raw_bin, a.dir, size))
        print("  ".join(f"{label(k) if isinstance(k, tuple) else k} {v[-1]:.4f} s" for k, v in res.items() if v),
              flush=True)
    for f in os.listdir(a.dir):
        os.unlink(os.path.join(a.dir, f))
    n = len(res["safetensors"])
    for arm in arms:
        t = res[arm]
        ratio = statistics.median(t[i] / res["safetensors"][i] for i in range(n))
        line = f"{label(arm)}: median {statistics.median(t):.4f} s, {ratio:.2f}x safetensors+fsync"
        if raw_on:
            mean = [(res["raw before"][i] + res["raw after"][i]) / 2 / t[i] for i in range(n)]
            best = [min(res["raw before"][i], res["raw after"][i]) / t[i] for i in range(n)]
            line += (f"; the raw write (mean of before and after) / save per round: "
                     f"{' '.join(f'{r:.2f}' for r in mean)}, median {statistics.median(mean):.2f}x; "
                     f"to the faster raw write: median {statistics.median(best):.2f}x")
        print(line)


if __name__ == "__main__":
    main()
