#!/usr/bin/env python3
"""One-shot saves in fresh interpreters (issue 16 item 1): what a script
that saves once pays. Each round runs, in fresh processes, ckptio.torch's
save_file (one build per --lib, A/B), safetensors' save_file followed by
fsync of the file and its directory, and, for --size of 64 MiB or more, the
raw O_DIRECT write of the same bytes (build/bench/dist_bench raw-write, 1
rank); only the save call is timed (imports and the tensor's allocation are
not).

    bench/oneshot.py --size 16 --rounds 6 [--lib build/libckptio.so ...]
    bench/oneshot.py --size 1GiB --rounds 3
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(kind, path, size):
    import torch
    t = torch.ones(max(size // 4, 1), dtype=torch.float32)
    t += 1
    if kind == "ckptio":
        import ckptio.torch
        t0 = time.perf_counter()
        ckptio.torch.save_file({"x": t}, path)
    else:
        from safetensors.torch import save_file
        t0 = time.perf_counter()
        save_file({"x": t}, path)
        for p, flags in ((path, os.O_RDONLY), (os.path.dirname(path), os.O_RDONLY)):
            fd = os.open(p, flags)
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


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="16")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--lib", action="append", default=None, help="libckptio.so to measure (repeatable)")
    ap.add_argument("--dir", default=os.path.join(ROOT, "build", "bench-tmp", "oneshot"))
    a = ap.parse_args()
    size, libs = parse_size(a.size), a.lib or [os.path.join(ROOT, "build", "libckptio.so")]
    os.makedirs(a.dir, exist_ok=True)
    py = sys.executable
    res = {k: [] for k in [*libs, "safetensors", "raw"]}
    for _ in range(a.rounds):
        if size >= 64 << 20:
            env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
            out = subprocess.run(["mpirun", "-np", "1", os.path.join(ROOT, "build", "bench", "dist_bench"),
                                  "raw-write", a.dir, str(size / (1 << 30))], capture_output=True, text=True,
                                 check=True, env=env).stdout
            res["raw"].append(float(out.split("seconds=")[1].split()[0]))
        for lib in libs:
            env = dict(os.environ, CKPTIO_LIB=lib, PYTHONPATH=os.path.join(ROOT, "python"))
            res[lib].append(run([py, __file__, "--child", "ckptio", os.path.join(a.dir, "c.safetensors"), str(size)],
                                env))
        res["safetensors"].append(run([py, __file__, "--child", "st", os.path.join(a.dir, "s.safetensors"),
                                       str(size)]))
        print("  ".join(f"{os.path.relpath(k, ROOT) if os.sep in k else k} {v[-1]:.4f} s" for k, v in res.items() if v),
              flush=True)
    for f in os.listdir(a.dir):
        os.unlink(os.path.join(a.dir, f))
    n = len(res["safetensors"])
    for lib in libs:
        ratio = statistics.median(res[lib][i] / res["safetensors"][i] for i in range(n))
        line = f"{os.path.relpath(lib, ROOT)}: median {statistics.median(res[lib]):.4f} s, {ratio:.2f}x safetensors+fsync"
        if res["raw"]:
            line += f", {statistics.median(res['raw'][i] / res[lib][i] for i in range(n)):.2f}x the raw write"
        print(line)


if __name__ == "__main__":
    main()
