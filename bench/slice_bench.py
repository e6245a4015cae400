"""Slices against whole loads, side by side in one run (bench/RESULTS_SLICE.md).

    PYTHONPATH=python .venv/bin/python bench/slice_bench.py [DIR] [--mib 256] [--runs 5]

Writes one BF16 tensor of --mib MiB (8192 rows) with ckptio, then, warm
(page cache) and cold (posix_fadvise DONTNEED before each read), times:
the whole tensor, rank 0 of 4 on dim 0 (one run), rank 0 of 4 on dim 1
(8192 runs of a quarter row); and reports GB/s of the bytes each moves,
each slice's ratio to the whole load of the same run, and bytes_read.
Median of --runs, interleaved whole / dim0 / dim1."""

import argparse
import ctypes
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import ckptio  # noqa: E402
from ckptio import _lib  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", nargs="?", default="build/bench-tmp")
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    path = os.path.join(a.dir, "slice-bench.safetensors")
    rows = 8192
    cols = a.mib * (1 << 20) // 2 // rows
    data = np.random.default_rng(0).integers(0, 1 << 16, rows * cols, dtype=np.uint16)
    ckptio.save_file({"w": ckptio.Tensor("BF16", (rows, cols), data)}, path)
    lib = _lib.lib()
    ctx = ckptio._core.ctx()
    cases = [("whole", 0, 0, rows), ("rank0/4 dim0", 0, 0, rows // 4), ("rank0/4 dim1", 1, 0, cols // 4)]
    bufs = {name: np.ones(rows * cols * 2 if name == "whole" else rows * cols // 2, np.uint8)
            for name, *_ in cases}  # touched once: no page faults in the timings
    out = {}
    for method, mname in [(_lib.AUTO + 1, "auto"), (1, "pread"), (3, "direct")]:
        for cold in (False, True):
            times = {name: [] for name, *_ in cases}
            read = {}
            if not cold:
                # The save wrote with O_DIRECT and O_DIRECT loads do not fill
                # the page cache: read the file once so "warm" is warm.
                with open(path, "rb") as f:
                    while f.read(16 << 20):
                        pass
            for _ in range(a.runs):
                for name, dim, start, stop in cases:
                    opts = ckptio._core.options(ctx, True)
                    opts.load_method = method
                    h = ctypes.c_void_p()
                    ckptio.errors.check(lib.ckptio_reader_open(ctx, path.encode(), ctypes.byref(opts),
                                                         ctypes.byref(h)), "open")
                    if cold:
                        fd = os.open(path, os.O_RDONLY)
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                        os.close(fd)
                    buf = bufs[name]
                    req = _lib.SliceRequest(0, dim, start, stop, buf.ctypes.data, buf.nbytes,
                                            _lib.DEVICE_HOST, 0, 0)
                    t = time.perf_counter()
                    ckptio.errors.check(lib.ckptio_reader_load_slices(h, ctypes.byref(req), 1), name)
                    times[name].append(time.perf_counter() - t)
                    read[name] = (req.bytes_read, req.verified)
                    lib.ckptio_reader_close(h)
            key = f"{mname} {'cold' if cold else 'warm'}"
            whole = statistics.median(times["whole"])
            for name, dim, start, stop in cases:
                med = statistics.median(times[name])
                nbytes = rows * cols * 2 * (stop - start) // (rows if dim == 0 else cols)
                out[(key, name)] = (nbytes / med / 1e9, whole / med, read[name], min(times[name]),
                                    max(times[name]))
    print(f"# {sys.executable} bench/slice_bench.py {a.dir} --mib {a.mib} --runs {a.runs}")
    print(f"# tensor BF16 [{rows}, {cols}] = {rows * cols * 2 >> 20} MiB; median of {a.runs}, "
          f"interleaved; machine: {os.cpu_count()} CPUs")
    print("| method | load | GB/s of its bytes | time vs whole load | bytes_read | verified |")
    print("|---|---|---|---|---|---|")
    for (key, name), (gbps, ratio, (nread, ver), lo, hi) in out.items():
        print(f"| {key} | {name} | {gbps:.2f} | {1 / ratio:.3f}x | {nread} | {ver} |")
    os.unlink(path)


if __name__ == "__main__":
    main()
