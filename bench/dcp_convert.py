#!/usr/bin/env python3
"""Consolidating a torch.distributed.checkpoint checkpoint (DCP's own
format, written by --world gloo processes) into one file, by ckptio and by
torch, each contender a fresh process with the checkpoint cold, in rounds with the order rotated:

    bench/dcp_convert.py [--gib 2] [--world 2] [--rounds 3] [--dir DIR] [--cli build/ckptio]

  ckptio        `ckptio convert CKPT out.safetensors`: every chunk's CRC
                checked, then written, fsynced, renamed into place
  dcp_to_torch_save   torch.distributed.checkpoint.format_utils.dcp_to_torch_save
                (the whole state in memory, then torch.save), then fsync
  load+save_file      dcp.load (no_dist) into full tensors allocated from
                the metadata, then safetensors.torch.save_file, then fsync

Before each run the checkpoint's files are evicted from the page cache
(posix_fadvise DONTNEED), nothing else: torch's own files stay warm.

The checkpoint: 8 F32 tensors [rows, 4096] (rows set by --gib), half
DTensor Shard(0) and half Shard(1), so every tensor is split in --world
chunks. Reported per contender: the median wall time of the whole process
(the torch contenders' import of torch included, and their time after it
in parentheses), the spread, peak RSS (VmHWM, sampled every 10 ms: file
pages mapped count too) and peak anonymous memory (RssAnon sampled every 10 ms), both as a
fraction of the model's bytes; every output is checked to hold the model.
"""

import argparse
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLS = 4096


def evict(directory):
    """The checkpoint's pages out of the page cache (posix_fadvise
    DONTNEED after a sync), and nothing else: the interpreters' and
    libraries' files stay cached, as on a machine that runs jobs."""
    os.sync()
    for name in os.listdir(directory):
        fd = os.open(os.path.join(directory, name), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def writer(rank, world, port, path, rows):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    sd = {}
    for k in range(8):
        t = torch.empty(rows, COLS).uniform_(generator=torch.Generator().manual_seed(k))
        sd[f"layers.{k}.weight"] = distribute_tensor(t, mesh, [Shard(k % 2)])
    dcp.save(sd, checkpoint_id=path)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


TORCH_SAVE = """
import os, sys, time
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
t0 = time.monotonic()
dcp_to_torch_save(sys.argv[1], sys.argv[2])
fd = os.open(sys.argv[2], os.O_RDONLY); os.fsync(fd); os.close(fd)
print(time.monotonic() - t0)
"""

LOAD_SAVE_FILE = """
import os, sys, time
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from safetensors.torch import save_file
t0 = time.monotonic()
meta = dcp.FileSystemReader(sys.argv[1]).read_metadata()
sd = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.state_dict_metadata.items()
      if isinstance(m, TensorStorageMetadata)}
dcp.load(sd, checkpoint_id=sys.argv[1], no_dist=True)
save_file(sd, sys.argv[2])
fd = os.open(sys.argv[2], os.O_RDONLY); os.fsync(fd); os.close(fd)
print(time.monotonic() - t0)
"""


def run(cmd, ckpt):
    """Runs cmd with the checkpoint cold; returns (wall seconds, its own
    printed seconds or None, peak RSS bytes, peak RssAnon bytes). The peak
    RSS is the child's VmHWM, sampled: its ru_maxrss would count this
    process's RSS too (Linux keeps the larger of the pre-exec and the new
    image's high-water mark, and the pre-exec image is a copy of this one)."""
    evict(ckpt)
    peak_anon = [0]
    peak_rss = [0]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stop = threading.Event()

    def sample():
        path = f"/proc/{p.pid}/status"
        while not stop.is_set():
            try:
                with open(path) as f:
                    for line in f:
                        if line.startswith("RssAnon:"):
                            peak_anon[0] = max(peak_anon[0], int(line.split()[1]) * 1024)
                        elif line.startswith("VmHWM:"):
                            peak_rss[0] = max(peak_rss[0], int(line.split()[1]) * 1024)
            except OSError:
                pass
            stop.wait(0.01)

    th = threading.Thread(target=sample)
    th.start()
    _, status, _ = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    stop.set()
    th.join()
    out, err = p.stdout.read(), p.stderr.read()
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        sys.exit(f"{cmd[0]} failed ({p.returncode}):\n{out}\n{err}")
    own = None
    try:
        own = float(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        pass
    return wall, own, peak_rss[0], peak_anon[0]


def check_output(path, ckpt_tensors):
    """The output holds every tensor of the model, bit for bit (a sample of rows)."""
    import torch
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file
        got = load_file(path)
    else:
        got = torch.load(path, weights_only=True, mmap=True)
    for k in range(8):
        name = f"layers.{k}.weight"
        want = torch.empty(ckpt_tensors, COLS).uniform_(generator=torch.Generator().manual_seed(k))
        assert torch.equal(got[name], want), (path, name)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=os.path.join(ROOT, "build", "bench-dcp-convert"))
    ap.add_argument("--cli", default=os.path.join(ROOT, "build", "ckptio"))
    args = ap.parse_args()
    import torch.multiprocessing as mp

    rows = int(args.gib * (1 << 30) / 8 / COLS / 4)
    model = 8 * rows * COLS * 4
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    ckpt = os.path.join(args.dir, "ckpt")
    t0 = time.monotonic()
    mp.start_processes(writer, args=(args.world, free_port(), ckpt, rows), nprocs=args.world, join=True,
                       start_method="spawn")
    print(f"# DCP checkpoint: {model / 2**30:.2f} GiB, {args.world} ranks, written in "
          f"{time.monotonic() - t0:.1f} s ({ckpt})", flush=True)
    py = sys.executable
    contenders = {
        "ckptio convert": lambda out: [args.cli, "convert", ckpt, out + ".safetensors"],
        "dcp_to_torch_save": lambda out: [py, "-c", TORCH_SAVE, ckpt, out + ".pt"],
        "dcp.load + save_file": lambda out: [py, "-c", LOAD_SAVE_FILE, ckpt, out + ".safetensors"],
    }
    results = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            out = os.path.join(args.dir, "out-" + name.split()[0].replace(".", "_"))
            cmd = contenders[name](out)
            res = run(cmd, ckpt)
            results[name].append(res)
            print(f"round {r + 1}: {name}: {res[0]:.2f} s, peak RSS {res[2] / 2**20:.0f} MiB, "
                  f"peak anon {res[3] / 2**20:.0f} MiB", flush=True)
            if r == 0:
                check_output(cmd[-1], rows)
            os.unlink(cmd[-1])

    print()
    print(f"command: bench/dcp_convert.py --gib {args.gib:g} --world {args.world} --rounds {args.rounds}")
    print(f"machine: {platform.node()}, {os.cpu_count()} cores, "
          f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, {platform.platform()}")
    print(f"model: {model / 2**30:.2f} GiB in 8 F32 tensors, each split in {args.world} chunks; the checkpoint "
          "evicted from the page cache before each run")
    print()
    print("| contender | wall (median of %d) | spread | after imports | vs ckptio | peak RSS / model | "
          "peak anon / model |" % args.rounds)
    print("|---|---|---|---|---|---|---|")
    base = statistics.median(w for w, *_ in results["ckptio convert"])
    for name in names:
        ws = [w for w, *_ in results[name]]
        own = [o for _, o, *_ in results[name] if o is not None]
        med = statistics.median(ws)
        print(f"| {name} | {med:.2f} s | {min(ws):.2f}-{max(ws):.2f} s | "
              f"{statistics.median(own):.2f} s |" if own else f"| {name} | {med:.2f} s | {min(ws):.2f}-{max(ws):.2f} s | - |",
              end="")
        print(f" {med / base:.2f}x | {max(r[2] for r in results[name]) / model:.2f} | "
              f"{max(r[3] for r in results[name]) / model:.2f} |")
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
