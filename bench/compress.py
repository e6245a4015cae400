"""Compressed saves and loads beside plain ones, in the same run.

For three synthetic checkpoints that look like the real thing (normally
distributed values, not random bytes or zeros): bf16 and fp32 LLM-shaped
weights (LLaMA-like layers: q/k/v/o h x h, gate/up inter x h, down h x inter,
two norms of ones, values N(0, 0.02)), and an Adam optimizer state (fp32
exp_avg ~ N(0, 1e-4), exp_avg_sq = smoothed squares of such gradients),
it saves each through ckptio plain, at zstd levels 1 and 3, with and without
the byte-shuffle filter, interleaved run by run (A B C D E, A B C D E, ...),
and loads each back (warm page cache, into touched buffers, CRCs checked),
then again after evicting the file from the page cache (cold: the disk).
Reports medians, the spread, the ratio (plain bytes / file bytes), each
throughput as a fraction of the plain save / load measured in the same run,
and the CPU seconds per GB (all threads): on a shared 2-CPU machine the wall
times follow the neighbours' load, the CPU cost does not.

Usage: bench/compress.sh [--mib 256] [--runs 3] [--dir DIR]
"""

import argparse
import ctypes
import os
import pathlib
import platform
import resource
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
import ckptio  # noqa: E402
from ckptio import _lib  # noqa: E402

H, INTER = 2048, 5632


def layer_shapes(i):
    p = f"model.layers.{i}."
    return [(p + "self_attn.q_proj.weight", (H, H)), (p + "self_attn.k_proj.weight", (H, H)),
            (p + "self_attn.v_proj.weight", (H, H)), (p + "self_attn.o_proj.weight", (H, H)),
            (p + "mlp.gate_proj.weight", (INTER, H)), (p + "mlp.up_proj.weight", (INTER, H)),
            (p + "mlp.down_proj.weight", (H, INTER)),
            (p + "input_layernorm.weight", (H,)), (p + "post_attention_layernorm.weight", (H,))]


def shapes_for(target_bytes, elem):
    out, i = [], 0
    while True:
        layer = layer_shapes(i)
        size = sum(int(np.prod(s)) for _, s in layer) * elem
        if out and sum(int(np.prod(s)) for _, s in out) * elem + size > target_bytes:
            return out
        out += layer
        i += 1


def to_bf16(f32):
    u = f32.view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def make(kind, target, rng):
    t = {}
    if kind == "bf16 weights":
        for name, shape in shapes_for(target, 2):
            v = np.ones(shape, np.float32) if "norm" in name else \
                rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
            t[name] = ckptio.Tensor("BF16", shape, to_bf16(v.reshape(-1)))
    elif kind == "fp32 weights":
        for name, shape in shapes_for(target, 4):
            t[name] = np.ones(shape, np.float32) if "norm" in name else \
                rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
    else:  # Adam state of fp32 weights: two tensors per parameter
        for name, shape in shapes_for(target // 2, 4):
            g = rng.standard_normal(shape, dtype=np.float32) * np.float32(1e-4)
            t["state." + name + ".exp_avg"] = g
            sq = rng.standard_normal(shape, dtype=np.float32) * np.float32(1e-4)
            t["state." + name + ".exp_avg_sq"] = (np.float32(0.5) * g * g + np.float32(0.5) * sq * sq)
    return t


def nbytes(t):
    return sum(v.buffer.nbytes if isinstance(v, ckptio.Tensor) else v.nbytes for v in t.values())


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)  # every thread of the process
    return r.ru_utime + r.ru_stime


def drop_cache(path):
    """Evicts the file's (clean, synced) pages from the page cache: the next
    load reads the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm_cache(path):
    """Reads the file once so the page cache holds it: a plain save writes
    with O_DIRECT and leaves nothing cached, a compressed one goes through
    the cache; a warm load must start from the same place for both."""
    with open(path, "rb", buffering=0) as f:
        while f.read(8 << 20):
            pass


def load_into(path, dsts):
    """Loads every tensor into the touched buffers of dsts, in one load_many."""
    with ckptio._core.Reader(path) as r:
        infos = r.infos()
        reqs = (_lib.LoadRequest * len(infos))()
        for i, info in enumerate(infos):
            buf = dsts[info.name.decode()]
            reqs[i] = _lib.LoadRequest(i, buf.ctypes.data, info.nbytes, _lib.DEVICE_HOST)
        t0, c0 = time.perf_counter(), cpu()
        r.check(r.lib.ckptio_reader_load_many(r.handle, reqs, len(infos)), "load")
        return time.perf_counter() - t0, cpu() - c0


CONFIGS = [("plain", 0, False), ("zstd 1", 1, False), ("zstd 1 + shuffle", 1, True),
           ("zstd 3", 3, False), ("zstd 3 + shuffle", 3, True)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256, help="bytes of each checkpoint, MiB (<= 512)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default=os.environ.get("TMPDIR", "/tmp"))
    a = ap.parse_args()
    target = min(a.mib, 512) << 20
    rng = np.random.default_rng(2026)
    print(f"command: bench/compress.sh --mib {a.mib} --runs {a.runs} --dir {a.dir}")
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}; "
          f"ckptio context defaults (8 threads, 8 MiB chunks = frames), fsync on\n")
    for kind in ["bf16 weights", "fp32 weights", "Adam state (fp32 exp_avg, exp_avg_sq)"]:
        t = make(kind, target, rng)
        total = nbytes(t)
        dsts = {k: np.ones(v.buffer.nbytes if isinstance(v, ckptio.Tensor) else v.nbytes, np.uint8)
                for k, v in t.items()}  # touched once, reused by every load
        res = {c[0]: {"save": [], "load": [], "cold": [], "scpu": [], "lcpu": [], "size": 0} for c in CONFIGS}
        for run in range(a.runs):
            for name, level, shuffle in CONFIGS:
                path = pathlib.Path(a.dir) / f"ckptio-compress-bench-{os.getpid()}.st"
                t0, c0 = time.perf_counter(), cpu()
                ckptio.save_file(t, path, compress=level, shuffle=shuffle)
                res[name]["save"].append(time.perf_counter() - t0)
                res[name]["scpu"].append(cpu() - c0)
                res[name]["size"] = path.stat().st_size
                warm_cache(path)
                wall, c = load_into(path, dsts)
                res[name]["load"].append(wall)
                res[name]["lcpu"].append(c)
                drop_cache(path)
                res[name]["cold"].append(load_into(path, dsts)[0])
                path.unlink()
        print(f"### {kind}: {len(t)} tensors, {total / 2**20:.0f} MiB, median of {a.runs} runs (min-max); "
              f"load average {os.getloadavg()[0]:.1f}\n")
        print("| save | file MiB | ratio | save s | save GB/s | vs plain save | save CPU s/GB | load s | load GB/s "
              "| vs plain load | load CPU s/GB | cold load s | vs plain cold |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        ps = statistics.median(res["plain"]["save"])
        pl = statistics.median(res["plain"]["load"])
        pc = statistics.median(res["plain"]["cold"])
        for name, _, _ in CONFIGS:
            r = res[name]
            s, l = statistics.median(r["save"]), statistics.median(r["load"])
            sc = statistics.median(r["scpu"]) / (total / 1e9)
            lc = statistics.median(r["lcpu"]) / (total / 1e9)
            print(f"| {name} | {r['size'] / 2**20:.1f} | {total / r['size']:.3f} | {s:.3f} "
                  f"({min(r['save']):.3f}-{max(r['save']):.3f}) | {total / s / 1e9:.2f} | {ps / s:.2f}x | {sc:.2f} | "
                  f"{l:.3f} ({min(r['load']):.3f}-{max(r['load']):.3f}) | {total / l / 1e9:.2f} | {pl / l:.2f}x | "
                  f"{lc:.2f} | {statistics.median(r['cold']):.3f} ({min(r['cold']):.3f}-{max(r['cold']):.3f}) | "
                  f"{pc / statistics.median(r['cold']):.2f}x |")
        print()
        del t, dsts


if __name__ == "__main__":
    main()
