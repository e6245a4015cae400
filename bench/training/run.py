"""A training loop's checkpoint, saved and loaded as users do it, against
torch.save / torch.load(weights_only=True), in fresh processes.

The state: {"model": state_dict of a ~1 GiB MLP (fp32), "optim": AdamW's
state_dict after one step (exp_avg, exp_avg_sq: ~2 GiB), "sched": a
LambdaLR's, "epoch": 3, "rng": torch's RNG state}. Each step runs in its own
interpreter that builds the state, then times only the step:

  save_torch     torch.save(state, f) then fsync(f)             (durable)
  save_ckptio    ckptio.torch.save_checkpoint(state, f)          (durable: fdatasync, atomic rename)
  stall_ckptio   save_checkpoint_async(...); wait_snapshot()     (when the loop may go on: its first save, with
                 snapshot memory configured and ckptio.prepare() called before the model was built)
  snapshot_copy  copy_ of every tensor into touched host buffers (the copy a snapshot cannot beat)
  load_torch     torch.load(f, weights_only=True), every byte summed
  load_ckptio    ckptio.torch.load_checkpoint(f), every byte summed
  read_raw       the ceiling: ckptio's file read by O_DIRECT, 8 MiB pieces, 8 threads (cold only)
  write_raw      the ceiling: as many bytes written by O_DIRECT from touched memory, 8 MiB pieces,
                 8 threads, then fdatasync
Loads run cold (the file's pages dropped first) and warm (the file read
once just before); each loader reads its own writer's file. The order of
the contenders alternates every round. Ratios are medians of per-round
ratios.

    PYTHONPATH=python CKPTIO_LIB=build/libckptio.so .venv/bin/python bench/training/run.py \\
        --dir /work/exp/training --rounds 5 --out bench/training/results.md
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(os.path.join(HERE, "..", "peers"))  # last: its profile.py must not hide the stdlib's
from peers import drop_cache, warm_cache  # noqa: E402  (the peers' page-cache helpers)


# ------------------------------------------------------------------ the child

def build_state(mib):
    import torch
    torch.manual_seed(0)
    width = 2048
    layers = max(1, (mib << 20) // (4 * width * width * 4))  # Linear(w, 4w) fp32
    model = torch.nn.Sequential(*[torch.nn.Linear(width, 4 * width) if i % 2 == 0
                                  else torch.nn.Linear(4 * width, width) for i in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = p.detach() * 0.01
    opt.step()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.99 ** s)
    return {"model": model.state_dict(), "optim": opt.state_dict(), "sched": sched.state_dict(),
            "epoch": 3, "rng": torch.get_rng_state()}


def tensors_of(obj):
    import torch
    stack = [obj]
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)


def touch(obj):
    """Every byte, summed as 8-byte words (4-byte tails as bytes)."""
    import numpy as np
    total, nbytes = 0, 0
    for t in tensors_of(obj):
        a = t.detach().cpu().contiguous().view(-1).numpy().view(np.uint8)
        n8 = a.size // 8 * 8
        total += int(a[:n8].view(np.uint64).sum(dtype=np.uint64)) + int(a[n8:].sum())
        nbytes += a.size
    return nbytes


def child(step, path, mib):
    import torch
    import ckptio
    import ckptio.torch as ct
    out = {}
    if step.startswith("save") or step in ("stall_ckptio", "snapshot_copy"):
        if step == "stall_ckptio":
            # As python/README advises a loop: snapshot memory sized and the
            # context made at startup, faulted in while the model is built.
            ckptio.configure(snapshot_bytes=(3 * mib << 20) + (512 << 20))
            ckptio.prepare()
        state = build_state(mib)
        nbytes = sum(t.nelement() * t.element_size() for t in tensors_of(state))
        out["bytes"] = nbytes
        if step == "snapshot_copy":
            dst = [torch.empty_like(t) for t in tensors_of(state)]
            for d in dst:
                d.fill_(1)
        t0 = time.perf_counter()
        if step == "save_torch":
            torch.save(state, path)
            with open(path, "rb+") as f:
                os.fsync(f.fileno())
        elif step == "save_ckptio":
            ct.save_checkpoint(state, path)
        elif step == "stall_ckptio":
            h = ct.save_checkpoint_async(state, path)
            h.wait_snapshot()
            out["stall"] = time.perf_counter() - t0
            h.wait_durable()
        elif step == "snapshot_copy":
            for d, t in zip(dst, tensors_of(state)):
                d.copy_(t)
        out["seconds"] = out.get("stall", time.perf_counter() - t0)
        out["durable"] = time.perf_counter() - t0
    elif step == "read_raw":
        out["bytes"], out["seconds"] = raw_io(path, os.path.getsize(path), write=False)
    elif step == "write_raw":
        out["bytes"], out["seconds"] = raw_io(path, os.path.getsize(path.replace("raw.bin", "ckptio.pt")),
                                              write=True)
    else:
        t0 = time.perf_counter()
        if step == "load_torch":
            obj = torch.load(path, weights_only=True)
        else:
            obj = ct.load_checkpoint(path)
        out["bytes"] = touch(obj)
        out["seconds"] = time.perf_counter() - t0
    print("RESULT " + json.dumps(out), flush=True)


def raw_io(path, size, write, piece=8 << 20, threads=8):
    """O_DIRECT reads of the file, or writes of `size` bytes to it (then
    fdatasync), in pieces spread over threads: the disk's rate as ckptio
    could use it, in the same run."""
    import mmap
    import threading
    flags = (os.O_WRONLY | os.O_CREAT | os.O_TRUNC) if write else os.O_RDONLY
    fd = os.open(path, flags | os.O_DIRECT, 0o644)
    offsets = list(range(0, size // piece * piece, piece))
    lock = threading.Lock()
    bufs = []
    for _ in range(threads):
        buf = mmap.mmap(-1, piece)  # page-aligned, as O_DIRECT needs
        buf.write(b"\x5a" * piece)  # touched
        bufs.append(buf)

    def worker(buf):
        io = os.pwritev if write else os.preadv
        while True:
            with lock:
                if not offsets:
                    return
                off = offsets.pop(0)
            io(fd, [buf], off)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker, args=(b,)) for b in bufs]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if write:
        os.fdatasync(fd)
    seconds = time.perf_counter() - t0
    os.close(fd)
    return size // piece * piece, seconds


# ------------------------------------------------------------------ the parent

def run(step, path, mib):
    os.sync()
    p = subprocess.run([sys.executable, __file__, "--child", step, "--path", path, "--mib", str(mib)],
                       capture_output=True, text=True, env=os.environ)
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode != 0 or not line:
        raise SystemExit(f"{step} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return json.loads(line[0][7:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--path")
    ap.add_argument("--dir", default="/work/exp/training")
    ap.add_argument("--mib", type=int, default=1024, help="the model's size; AdamW adds twice that")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.path, a.mib)
    os.makedirs(a.dir, exist_ok=True)
    f_torch, f_ck = os.path.join(a.dir, "torch.pt"), os.path.join(a.dir, "ckptio.pt")
    rows = []
    for r in range(a.rounds):
        row = {}
        saves = ["save_torch", "save_ckptio"] if r % 2 == 0 else ["save_ckptio", "save_torch"]
        for step in saves:
            row[step] = run(step, f_torch if step == "save_torch" else f_ck, a.mib)
        row["write_raw"] = run("write_raw", os.path.join(a.dir, "raw.bin"), a.mib)
        for step in (["stall_ckptio", "snapshot_copy"] if r % 2 == 0 else ["snapshot_copy", "stall_ckptio"]):
            row[step] = run(step, os.path.join(a.dir, "async.pt"), a.mib)
        for temp in ("cold", "warm"):
            loads = ["load_torch", "load_ckptio"] if r % 2 == 0 else ["load_ckptio", "load_torch"]
            loads += ["read_raw"] if temp == "cold" else []
            for step in loads:
                path = f_torch if step == "load_torch" else f_ck
                (drop_cache if temp == "cold" else warm_cache)(path)
                row[f"{step}_{temp}"] = run(step, path, a.mib)
        rows.append(row)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v['seconds']:.2f}s" for k, v in row.items()), flush=True)
    report(rows, a)


def report(rows, a):
    def gbs(row, k):
        return row[k]["bytes"] / row[k]["seconds"] / 1e9

    goals = [
        ("save: ckptio / torch.save (both durable)", lambda w: w["save_torch"]["seconds"] / w["save_ckptio"]["seconds"], ">= 3", 3.0, True),
        ("async stall / snapshot copy", lambda w: w["stall_ckptio"]["seconds"] / w["snapshot_copy"]["seconds"], "<= 1.2", 1.2, False),
        ("load cold: ckptio / torch.load(weights_only=True)", lambda w: w["load_torch_cold"]["seconds"] / w["load_ckptio_cold"]["seconds"], ">= 1.5", 1.5, True),
        ("load warm: ckptio / torch.load(weights_only=True)", lambda w: w["load_torch_warm"]["seconds"] / w["load_ckptio_warm"]["seconds"], ">= 1.5", 1.5, True),
        ("(info) save: ckptio / the raw O_DIRECT write", lambda w: w["write_raw"]["seconds"] / w["save_ckptio"]["seconds"], "", 0.0, True),
        ("(info) save: torch.save / the raw O_DIRECT write", lambda w: w["write_raw"]["seconds"] / w["save_torch"]["seconds"], "", 0.0, True),
        ("(info) load cold: ckptio / the raw O_DIRECT read", lambda w: w["read_raw_cold"]["seconds"] / w["load_ckptio_cold"]["seconds"], "", 0.0, True),
        ("(info) load cold: torch.load / the raw O_DIRECT read", lambda w: w["read_raw_cold"]["seconds"] / w["load_torch_cold"]["seconds"], "", 0.0, True),
    ]
    lines = [f"State: {rows[0]['save_ckptio']['bytes'] / 2**30:.2f} GiB of tensors (model {a.mib} MiB fp32 + AdamW), "
             f"{len(rows)} rounds, fresh processes.", "",
             "| goal | per round | median | met |", "|---|---|---|---|"]
    for name, f, want, limit, higher in goals:
        vals = [f(w) for w in rows]
        med = statistics.median(vals)
        met = med >= limit if higher else med <= limit
        lines.append(f"| {name} {want} | {' '.join(f'{v:.2f}' for v in vals)} | **{med:.2f}** | {'yes' if met else 'no'} |")
    lines += ["", "| step | GB/s (median) | seconds (median) |", "|---|---|---|"]
    for k in rows[0]:
        lines.append(f"| {k} | {statistics.median(gbs(w, k) for w in rows):.2f} | "
                     f"{statistics.median(w[k]['seconds'] for w in rows):.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        os.makedirs(os.path.dirname(a.out), exist_ok=True)
        with open(a.out, "w") as fh:
            fh.write(text)
        with open(a.out.replace(".md", ".json"), "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
