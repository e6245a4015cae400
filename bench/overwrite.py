#!/usr/bin/env python3
"""Saves in a training loop: one process saves the same state --saves times,
pausing --pause seconds between saves (the training steps), either over the
same file (ckptio.torch.save_file), as steps of a CheckpointManager with
keep_last=1 (manager), or as one step saved again and again (same-step: a
final save at the step of the last periodic one), where each save after
the first replaces or removes the previous checkpoint. Reports the saves after the first (the ones that
replace one) beside the raw O_DIRECT write of the same bytes
(build/bench/dist_bench raw-write, 1 rank) measured in each round; one
process per --lib and round, alternating (A/B).

    bench/overwrite.py --size 1GiB --rounds 2 [--mode file|manager|same-step]
                       [--lib build/libckptio.so --lib other/libckptio.so]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from oneshot import parse_size  # noqa: E402


def child(mode, where, size, saves, pause):
    import torch
    t = torch.ones(max(size // 4, 1), dtype=torch.float32)
    t += 1
    if mode == "file":
        import ckptio.torch

        def save(step):
            ckptio.torch.save_file({"x": t}, os.path.join(where, "model.safetensors"))
    else:
        from ckptio.manager import CheckpointManager
        mgr = CheckpointManager(where, keep_last=1)

        def save(step):
            mgr.save({"x": t}, step if mode == "manager" else 0)
    times = []
    for step in range(saves):
        t0 = time.perf_counter()
        save(step)
        times.append(time.perf_counter() - t0)
        time.sleep(pause)
    print(" ".join(f"{x:.4f}" for x in times))


def raw_write(d, size):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    out = subprocess.run(["mpirun", "-np", "1", os.path.join(ROOT, "build", "bench", "dist_bench"), "raw-write", d,
                          str(size / (1 << 30))], capture_output=True, text=True, check=True, env=env).stdout
    return float(out.split("seconds=")[1].split()[0])


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        a = sys.argv[2:]
        return child(a[0], a[1], int(a[2]), int(a[3]), float(a[4]))
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--saves", type=int, default=4)
    ap.add_argument("--pause", type=float, default=2.0)
    ap.add_argument("--mode", choices=["file", "manager", "same-step"], default="file")
    ap.add_argument("--lib", action="append", default=None, help="libckptio.so to measure (repeatable)")
    ap.add_argument("--dir", default=os.path.join(ROOT, "build", "bench-tmp", "overwrite"))
    a = ap.parse_args()
    size, libs = parse_size(a.size), a.lib or [os.path.join(ROOT, "build", "libckptio.so")]
    later = {lib: [] for lib in libs}  # per round: median of the saves after the first
    raw = []
    for _ in range(a.rounds):
        os.makedirs(a.dir, exist_ok=True)
        raw.append(raw_write(a.dir, size))
        for lib in libs:
            where = os.path.join(a.dir, "ckpt")
            shutil.rmtree(where, ignore_errors=True)
            os.makedirs(where)
            env = dict(os.environ, CKPTIO_LIB=lib, PYTHONPATH=os.path.join(ROOT, "python"))
            out = subprocess.run([sys.executable, __file__, "--child", a.mode, where, str(size), str(a.saves),
                                  str(a.pause)], capture_output=True, text=True, check=True, env=env).stdout
            times = [float(x) for x in out.split()]
            later[lib].append(statistics.median(times[1:]))
            print(f"{os.path.relpath(lib, ROOT)}: saves {' '.join(f'{x:.3f}' for x in times)} s; "
                  f"raw write {raw[-1]:.3f} s", flush=True)
            shutil.rmtree(where, ignore_errors=True)
    shutil.rmtree(a.dir, ignore_errors=True)
    for lib in libs:
        ratio = statistics.median(raw[i] / later[lib][i] for i in range(a.rounds))
        print(f"{os.path.relpath(lib, ROOT)} ({a.mode}): saves that replace a checkpoint, median "
              f"{statistics.median(later[lib]):.3f} s, {ratio:.2f}x the raw write")


if __name__ == "__main__":
    main()
