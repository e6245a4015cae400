"""Python saves against the disk, in the form issue 44 measured them: a fresh
process saves 2 GiB of numpy arrays with ckptio.numpy.save_file (CRC on,
durable), or the same bytes as a nested training checkpoint with
ckptio.torch.save_checkpoint, against a raw O_DIRECT write of the same byte
count from distinct, touched memory (16 writers, 8 MiB pieces, then
fdatasync). Each step in its own interpreter, the three interleaved (the
order rotates every round); ratios are medians of per-round ratios, so the
disk's drift between minutes cancels.

    PYTHONPATH=python CKPTIO_LIB=build/libckptio.so .venv/bin/python bench/training/save_vs_raw.py \\
        --dir /work/exp/savevsraw --gib 2 --rounds 5
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

PIECE = 8 << 20
WRITERS = 16


def arrays(nbytes):
    """64 MiB fp32 arrays, every page touched (distinct memory per array),
    each in its own anonymous mapping: page-aligned, as O_DIRECT needs."""
    import mmap
    import numpy as np
    out, each = {}, 64 << 20
    for i in range(nbytes // each):
        a = np.frombuffer(mmap.mmap(-1, each), dtype=np.float32)
        a.fill(i + 0.5)
        out[f"layer{i}.weight"] = a
    return out


def raw_write(path, tensors):
    """The ceiling: every array's bytes written by O_DIRECT from the arrays
    themselves, 16 writers."""
    jobs, off = [], 0
    for a in tensors.values():
        mv = memoryview(a).cast("B")
        for p in range(0, len(mv), PIECE):
            jobs.append((off + p, mv[p:p + PIECE]))
        off += len(mv)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                if not jobs:
                    return
                at, buf = jobs.pop()
            os.pwritev(fd, [buf], at)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker) for _ in range(WRITERS)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    os.fdatasync(fd)
    seconds = time.perf_counter() - t0
    os.close(fd)
    os.unlink(path)
    return seconds


def child(step, path, nbytes):
    tensors = arrays(nbytes)
    if step == "raw":
        seconds = raw_write(path, tensors)
    elif step == "save_file":
        import ckptio.numpy as cn
        t0 = time.perf_counter()
        cn.save_file(tensors, path)
        seconds = time.perf_counter() - t0
    else:  # save_checkpoint: the same arrays as torch tensors inside a nested state
        import torch
        import ckptio.torch as ct
        state = {"model": {k: torch.from_numpy(v) for k, v in tensors.items()}, "step": 7,
                 "optim": {"param_groups": [{"lr": 1e-4, "betas": (0.9, 0.999)}]}}
        t0 = time.perf_counter()
        ct.save_checkpoint(state, path)
        seconds = time.perf_counter() - t0
    print("RESULT " + json.dumps({"seconds": seconds, "bytes": nbytes}), flush=True)


def run(step, path, nbytes):
    os.sync()
    p = subprocess.run([sys.executable, __file__, "--child", step, "--path", path, "--bytes", str(nbytes)],
                       capture_output=True, text=True)
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode != 0 or not line:
        raise SystemExit(f"{step} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return json.loads(line[0][7:])["seconds"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--path")
    ap.add_argument("--bytes", type=int)
    ap.add_argument("--dir", default="/work/exp/savevsraw")
    ap.add_argument("--gib", type=float, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.path, a.bytes)
    os.makedirs(a.dir, exist_ok=True)
    nbytes = int(a.gib * 2**30) // (64 << 20) * (64 << 20)
    steps = ["raw", "save_file", "save_checkpoint"]
    rows = []
    for r in range(a.rounds):
        order = steps[r % 3:] + steps[:r % 3]
        row = {s: run(s, os.path.join(a.dir, s + (".pt" if s == "save_checkpoint" else ".bin")), nbytes)
               for s in order}
        rows.append(row)
        print(f"round {r + 1}: " + ", ".join(f"{s} {row[s]:.2f} s ({nbytes / row[s] / 1e9:.2f} GB/s)"
                                             for s in steps), flush=True)
    for s in steps[1:]:
        ratios = [w["raw"] / w[s] for w in rows]
        print(f"{s} / raw O_DIRECT write: {' '.join(f'{x:.2f}' for x in ratios)}  median {statistics.median(ratios):.2f}")
    for s in steps:
        os.path.exists(os.path.join(a.dir, s)) and os.unlink(os.path.join(a.dir, s))


if __name__ == "__main__":
    main()
