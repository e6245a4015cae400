"""Where the time of ckptio's Python save / load goes, next to torch's, for
the goals bench/peers/run.sh reports missed. Phases are timed one by one,
with the minor page faults of each (getrusage ru_minflt). It reaches into the
binding's private helpers (ckptio._ctx, _Reader, _options) and calls
library functions the binding does not wrap (ckptio_writer_stats,
ckptio_reader_stats, ckptio_reader_view): a profile, not a contender.

    bench/peers/profile.sh [--model llm|linear] [--size 1GiB] [--runs 3] [--dir DIR]
"""

import argparse
import ctypes
import gc
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402


def Stats():  # ckptio_stats, as the binding declares it (python/ckptio/_lib.py)
    return sys.modules["ckptio._lib"].Stats()


def lib_extras(lib):
    # The binding declares every function this profile calls (stats, view,
    # verify, map_private); nothing to add.
    pass


class ctx_swap:
    """Runs the binding's calls on another context (the binding keeps one
    per process, created with the default options)."""

    def __init__(self, ck, handle):
        self.ck, self.handle = ck, handle

    def __enter__(self):
        self.orig = self.ck._ctx
        self.ck._ctx = lambda: self.handle

    def __exit__(self, *exc):
        self.ck._ctx = self.orig


def make_ctx(ck, threads):
    lib = ck._lib.lib()
    opts = ck._lib.Options.init()
    opts.threads = threads
    h = ctypes.c_void_p()
    ck._check(lib.ckptio_ctx_create(ctypes.byref(opts), ctypes.byref(h)), "ctx_create",
              lib.ckptio_last_open_error())
    return h


def fresh_memory_probe(n=1 << 30):
    """First touch of n fresh bytes right after freeing the same amount, and
    after a pause: on this VM freed memory goes back to the host after a few
    seconds (virtio_balloon free page reporting), and touching it again then
    costs a host fault per page."""
    out = []
    for pause in (0, 0, 5, 0, 10, 0):
        time.sleep(pause)
        t0 = time.perf_counter()
        a = np.ones(n, np.uint8)
        out.append((pause, n / (time.perf_counter() - t0) / 1e9))
        del a
    return out


def flt():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def phase(log, name, nbytes, fn):
    gc.collect()
    f0 = flt()
    t0 = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t0
    f = flt() - f0
    log.setdefault(name, []).append((dt, f))
    return out


def ckptio_save_stats(ck, views, path, fmt):
    """save_file's steps, through the same calls, keeping the writer's stats."""
    lib = ck._lib.lib()
    ctx = ck._ctx()
    opts = ck._options(ctx, True)
    w = ctypes.c_void_p()
    fmt_code = {"safetensors": ck._lib.FORMAT_SAFETENSORS, "pt": ck._lib.FORMAT_PYTORCH}[fmt]
    ck._check(lib.ckptio_writer_open(ctx, os.fsencode(path), fmt_code, ctypes.byref(opts),
                                     ctypes.byref(w)), "open")
    keep = []
    try:
        for name, v in views.items():
            dtype, shape, data = ck._describe(name, v)
            code = ck._dtype_code(dtype)
            c_shape = (ctypes.c_int64 * ck._lib.MAX_DIMS)(*shape)
            keep.append(data)
            desc = ck._lib.Tensor_(name.encode(), code, len(shape), c_shape, data.ctypes.data,
                                   ck._lib.DEVICE_HOST)
            ck._check(lib.ckptio_writer_add(w, ctypes.byref(desc)), name)
        ck._check(lib.ckptio_writer_commit(w), "commit", lib.ckptio_writer_last_error(w))
        st = Stats()
        st.size = ctypes.sizeof(st)
        lib.ckptio_writer_stats(w, ctypes.byref(st))
        return st
    finally:
        lib.ckptio_writer_close(w)


def load_into(ck, path, bufs, method=None):
    """load_many into caller buffers (pre-touched), with the reader's stats."""
    ctx = ck._ctx()
    orig = ck._options
    if method is not None:
        def opts(ctx_, crc):
            o = orig(ctx_, crc)
            o.load_method = method
            return o
        ck._options = opts
    try:
        with ck._Reader(path) as r:
            infos = r.infos()
            reqs = (ck._lib.LoadRequest * len(infos))()
            for i, info in enumerate(infos):
                b = bufs[i]
                reqs[i] = ck._lib.LoadRequest(i, b.ctypes.data, info.nbytes, ck._lib.DEVICE_HOST)
            r.check(r.lib.ckptio_reader_load_many(r.handle, reqs, len(infos)), "load")
            st = Stats()
            st.size = ctypes.sizeof(st)
            r.lib.ckptio_reader_stats(r.handle, ctypes.byref(st))
            return st
    finally:
        ck._options = orig


def view_and_verify(ck, path, do_verify):
    """Zero-copy: the library's read-only views into its file mapping,
    touched (one byte a page), with or without the CRC pass first."""
    with ck._Reader(path) as r:
        if do_verify:
            n = ctypes.c_size_t()
            r.check(r.lib.ckptio_reader_verify(r.handle, ctypes.byref(n)), "verify")
        total = 0
        for i, info in enumerate(r.infos()):
            p, nb = ctypes.c_void_p(), ctypes.c_uint64()
            r.check(r.lib.ckptio_reader_view(r.handle, i, ctypes.byref(p), ctypes.byref(nb)), "view")
            a = np.ctypeslib.as_array((ctypes.c_ubyte * nb.value).from_address(p.value))
            total += int(a[::peers.PAGE].sum(dtype=np.uint64)) + int(a[-1])
        return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="linear", choices=("llm", "linear"))
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default=".")
    ap.add_argument("--command", default=None)
    a = ap.parse_args()
    peers.TOUCH["mode"] = "page"  # the phases below time one byte a page
    c = peers.Contenders()
    ck, torch = c.ckptio, c.torch
    lib_extras(ck._lib.lib())
    ck._ctx()
    peers.warm_up(c, a.dir)
    target = peers.parse_size(a.size)
    specs, desc = peers.model_specs(a.model, target)
    sd = peers.build_state_dict(torch, specs)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    raw_n = peers._round_up(nbytes, peers.PAGE)
    raw = peers.Raw()
    base = os.path.join(a.dir, f".peers-profile-{os.getpid()}")
    st_path, pt_path, torch_path = base + ".safetensors", base + ".pt", base + ".torch.pt"
    raw_path = base + ".raw"
    print(f"command: {a.command or ' '.join(sys.argv)}")
    print(f"model: {a.model} {a.size}: {len(sd)} tensors, {nbytes / 1e9:.3f} GB ({desc})")
    print("load avg: %.2f %.2f %.2f" % os.getloadavg())
    print("first touch of 1 GiB of fresh memory (numpy.ones), by seconds since the last "
          "free: " + ", ".join(f"{p} s: {g:.2f} GB/s" for p, g in fresh_memory_probe()))
    ctx32 = make_ctx(ck, 32)
    log = {}
    lstats = {}
    try:
        views = peers.ckptio_views(torch, ck, sd)
        aligned = sum(1 for t in sd.values() if t.data_ptr() % 4096 == 0)
        print(f"torch tensors starting on a 4 KiB page: {aligned} of {len(sd)} "
              f"(offsets mod 4096: {sorted({t.data_ptr() % 4096 for t in sd.values()})})")
        for run in range(a.runs):
            # ---------------- save
            peers.settle()
            phase(log, "raw O_DIRECT write (limit)", nbytes, lambda: raw.write(raw_path, raw_n))
            peers.rm(raw_path)
            for fmt, path in (("safetensors", st_path), ("pt", pt_path)):
                peers.rm(path)
                peers.settle()
                st = phase(log, f"ckptio save {fmt}: total", nbytes,
                           lambda: ckptio_save_stats(ck, views, path, fmt))
                for k in ("seconds", "snapshot_seconds", "copy_seconds", "write_seconds",
                          "commit_seconds"):
                    lstats.setdefault(f"ckptio save {fmt}: stats.{k}", []).append(getattr(st, k))
            peers.rm(st_path)
            peers.settle()
            with ctx_swap(ck, ctx32):
                st = phase(log, "ckptio save safetensors, 32-thread context: total", nbytes,
                           lambda: ckptio_save_stats(ck, views, st_path, "safetensors"))
            peers.rm(torch_path)
            peers.settle()
            f = open(torch_path, "wb")
            phase(log, "torch.save: serialize into the page cache", nbytes,
                  lambda: (torch.save(sd, f), f.flush()))
            phase(log, "torch.save: fsync", nbytes, lambda: os.fsync(f.fileno()))
            f.close()
            # ---------------- loads, warm
            arrays = []
            for path in (st_path,):
                peers.settle()
                peers.warm_cache(path)
                out = phase(log, "warm ckptio.load_file(mmap=False) (safetensors) + touch", nbytes,
                            lambda: peers._load_touch(lambda cc, p: ck.load_file(p, mmap=False), c, path))
                del out
                gc.collect()
                out = phase(log, "warm ckptio.load_file(mmap=False) again at once (memory just freed)", nbytes,
                            lambda: peers._load_touch(lambda cc, p: ck.load_file(p, mmap=False), c, path))
                del out
                gc.collect()
                time.sleep(10)
                out = phase(log, "warm ckptio.load_file(mmap=False) again after a 10 s pause", nbytes,
                            lambda: peers._load_touch(lambda cc, p: ck.load_file(p, mmap=False), c, path))
                del out
                peers.settle()
                with ck._Reader(path) as r:
                    infos = r.infos()
                bufs = phase(log, "warm: np.empty of every tensor + first touch (the faults "
                             "load_file pays)", nbytes,
                             lambda: [_touched(np.empty(i.nbytes, np.uint8)) for i in infos])
                peers.warm_cache(path)
                st = phase(log, "warm: load_many into pre-touched buffers", nbytes,
                           lambda: load_into(ck, path, bufs))
                lstats.setdefault("warm load_many: stats.copy_seconds (summed over workers)",
                                  []).append(st.copy_seconds)
                peers.warm_cache(path)
                phase(log, "warm: ckptio_reader_view (zero-copy) + touch, no CRC", nbytes,
                      lambda: view_and_verify(ck, path, False))
                phase(log, "warm: ckptio_reader_verify (CRC pass) + view + touch", nbytes,
                      lambda: view_and_verify(ck, path, True))
                peers.warm_cache(path)
                out = phase(log, "warm: ckptio.torch.load_file zero-copy (private map, CRC "
                            "pass over it) + touch", nbytes,
                            lambda: peers._load_touch(lambda cc, p: c.ck_torch.load_file(p), c,
                                                      path))
                del out
                peers.settle()
                peers.drop_cache(path)
                phase(log, "cold: load_many (PREAD) into pre-touched buffers", nbytes,
                      lambda: load_into(ck, path, bufs))
                peers.settle()
                peers.drop_cache(path)
                phase(log, "cold: load_many (DIRECT) into pre-touched buffers", nbytes,
                      lambda: load_into(ck, path, bufs, method=3))
                peers.settle()
                peers.drop_cache(path)
                with ctx_swap(ck, ctx32):
                    phase(log, "cold: load_many (DIRECT), 32-thread context, pre-touched", nbytes,
                          lambda: load_into(ck, path, bufs, method=3))
                peers.settle()
                peers.drop_cache(path)
                with ctx_swap(ck, ctx32):
                    phase(log, "cold: load_many (PREAD), 32-thread context, pre-touched", nbytes,
                          lambda: load_into(ck, path, bufs))
                peers.settle()
                peers.drop_cache(path)
                out = phase(log, "cold ckptio.load_file(mmap=False) (safetensors) + touch", nbytes,
                            lambda: peers._load_touch(lambda cc, p: ck.load_file(p, mmap=False), c, path))
                del out, bufs
            peers.settle()
            phase(log, "memcpy (limit)", nbytes, lambda: raw.memcpy(nbytes))
            for cold in (False, True):
                tag = "cold" if cold else "warm"
                peers.settle()
                if cold:
                    peers.drop_cache(torch_path)
                else:
                    peers.warm_cache(torch_path)
                res = phase(log, f"{tag} torch.load(mmap=True): the call", nbytes,
                            lambda: torch.load(torch_path, mmap=True, weights_only=True))
                phase(log, f"{tag} torch.load(mmap=True): touch pass", nbytes,
                      lambda: peers.touch(res))
                del res
                peers.settle()
                if cold:
                    peers.drop_cache(torch_path)
                else:
                    peers.warm_cache(torch_path)
                res = phase(log, f"{tag} torch.load: the call", nbytes,
                            lambda: torch.load(torch_path))
                phase(log, f"{tag} torch.load: touch pass", nbytes, lambda: peers.touch(res))
                del res
            peers.settle()
            peers.drop_cache(raw_path) if os.path.exists(raw_path) else None
            raw.write(raw_path, raw_n)
            phase(log, "raw O_DIRECT read (limit)", nbytes, lambda: raw.read(raw_path, raw_n))
            peers.rm(raw_path)
    finally:
        for p in (st_path, pt_path, torch_path, raw_path):
            peers.rm(p)
        ck._lib.lib().ckptio_ctx_free(ctx32)
    print(f"\n{'phase':78s} {'median s':>9s} {'GB/s':>7s} {'min-max s':>15s} {'faults/4KiB':>11s}")
    for name, v in log.items():
        ts = [x[0] for x in v]
        fs = [x[1] for x in v]
        m = statistics.median(ts)
        print(f"{name:78s} {m:9.3f} {nbytes / m / 1e9:7.2f} {min(ts):7.3f}-{max(ts):7.3f} "
              f"{statistics.median(fs) / (nbytes / 4096):11.2f}")
    print()
    for name, v in lstats.items():
        print(f"{name:78s} {statistics.median(v):9.3f}")


def _touched(a):
    a[::peers.PAGE] = 0
    a[-1:] = 0
    return a


if __name__ == "__main__":
    main()
