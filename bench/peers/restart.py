"""The restart sequence (issue 45): what a user sees when fresh processes
load one checkpoint one after another (a notebook, a test loop, an inference
server restarting). Per round and contender: the file's pages dropped from
the page cache once, then three loads in three fresh processes, each
touching every byte of what it loaded (summed as 8-byte words). The order
of the contenders rotates every round; the machine is settled (peers.py's
memory primer) just before each child's clock.

Contenders, by format:
  safetensors file (written by ckptio):
    ckptio         ckptio.torch.load_file (backend "auto", the default)
    ckptio_direct  backend="direct": O_DIRECT, nothing left cached
                   (what "auto" did for a cold file before this issue)
    ckptio_c       the C reader with CKPTIO_LOAD_AUTO (restart_load.c)
    ckptio_c_direct  the same with CKPTIO_LOAD_DIRECT (what AUTO did with
                   a cold file before this issue)
    ckptio_c_map   the C reader's zero-copy load: ckptio_reader_map_private
                   (a copy-on-write mapping of the file, every CRC checked)
    safetensors    safetensors.torch.load_file
  sharded set (written by ckptio, 256 MB shards):
    ckptio_set     ckptio.torch.load_file of the directory
    safetensors_set  safetensors.torch.load_file of each shard, as
                   transformers loads a set
  .pt (written by torch.save):
    ckptio_pt      ckptio.torch.load_file
    torch_pt       torch.load(weights_only=True, mmap=True)
and "pressure": ckptio's load run in a memory cgroup whose limit leaves
less than twice the file (CKPTIO_LOAD_AUTO then reads by O_DIRECT), next to
fio's O_DIRECT read of the same file (32 x 8 MiB in flight) in the same
round; skipped where no cgroup can be made.

usage: python restart.py --dir DIR [--sizes 1GiB,4GiB] [--rounds 5]
                         [--contenders a,b,...] [--out FILE.md]
(run.sh-style: PYTHONPATH=python CKPTIO_LIB=build/libckptio.so)
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import peers  # noqa: E402  settle, await_go, run_settled, touch, drop_cache

FILES = {"ckptio": "single", "ckptio_direct": "single", "ckptio_c": "single", "ckptio_c_direct": "single",
         "ckptio_c_map": "single",
         "safetensors": "single",
         "ckptio_set": "set", "safetensors_set": "set", "ckptio_pt": "pt", "torch_pt": "pt"}
PEER = {"ckptio": "safetensors", "ckptio_c": "safetensors", "ckptio_direct": "safetensors",
        "ckptio_c_direct": "safetensors", "ckptio_c_map": "safetensors",
        "ckptio_set": "safetensors_set", "ckptio_pt": "torch_pt"}
# What the same load did with a cold file before issue 45 (O_DIRECT, nothing
# left cached): its first load is the one not to fall behind.
BEFORE = {"ckptio": "ckptio_direct", "ckptio_c": "ckptio_c_direct"}


def parse_size(s):
    units = {"GiB": 1 << 30, "MiB": 1 << 20}
    for u, m in units.items():
        if s.endswith(u):
            return int(float(s[:-len(u)]) * m)
    return int(s)


# ------------------------------------------------------------ the children

def child(name, path):
    """One timed load in this fresh process: prints seconds, bytes, and the
    load's methods where ckptio says them."""
    import torch
    if name.startswith("ckptio"):
        import ckptio.torch as ct
    if name == "safetensors_set" or name == "safetensors":
        import safetensors.torch as st
    peers.await_go()
    t0 = time.perf_counter()
    if name in ("ckptio", "ckptio_set", "ckptio_pt"):
        out = ct.load_file(path)
    elif name == "ckptio_direct":
        out = ct.load_file(path, backend="direct")
    elif name == "safetensors":
        out = st.load_file(path)
    elif name == "safetensors_set":
        with open(os.path.join(path, "model.safetensors.index.json")) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        out = {}
        for s in shards:
            out.update(st.load_file(os.path.join(path, s)))
    elif name == "torch_pt":
        out = torch.load(path, weights_only=True, mmap=True)
    else:
        raise SystemExit(f"unknown contender {name}")
    n = sum(v.numel() * v.element_size() for v in out.values())
    peers.touch(out)
    print(f"{time.perf_counter() - t0:.6f} {n}", flush=True)


# ------------------------------------------------------------ the parent

def make_files(d, nbytes):
    """The state (bf16, Llama-like sizes scaled to nbytes) in the three
    formats; returns {kind: path}."""
    import torch
    import ckptio.torch as ct
    n = max(8, nbytes // (32 << 20))
    per = nbytes // n // 2
    g = torch.Generator().manual_seed(45)
    state = {f"layers.{i}.weight": torch.randn(per, generator=g).to(torch.bfloat16) for i in range(n)}
    paths = {"single": os.path.join(d, "model.safetensors"), "set": os.path.join(d, "set"),
             "pt": os.path.join(d, "model.pt")}
    ct.save_file(state, paths["single"])
    shutil.rmtree(paths["set"], ignore_errors=True)
    os.makedirs(paths["set"])
    ct.save_torch_state_dict(state, paths["set"], max_shard_size="256MB")
    torch.save(state, paths["pt"])
    os.sync()
    return paths


def drop(path):
    files = [os.path.join(path, f) for f in os.listdir(path)] if os.path.isdir(path) else [path]
    for f in files:
        peers.drop_cache(f)


def run_child(name, path, env, c_loader):
    if name.startswith("ckptio_c"):
        peers.settle()
        mode = {"ckptio_c_direct": ["direct"], "ckptio_c_map": ["private"]}.get(name, [])
        r = subprocess.run([c_loader, path] + mode, env=env,
                           capture_output=True, text=True, timeout=900)
        if r.returncode:
            raise SystemExit(f"{name}: {r.stderr}")
        secs, n, methods = r.stdout.split()
        return float(secs), int(n), methods
    r = peers.run_settled([sys.executable, os.path.abspath(__file__), "--child", name, path], env)
    if r.returncode:
        raise SystemExit(f"{name}: exit {r.returncode}: {r.stderr[-2000:]}")
    secs, n = r.stdout.split()[-2:]
    return float(secs), int(n), ""


def cgroup_dir():
    """A new memory cgroup to run a child in, and the name of its limit
    file, or (None, None)."""
    with open("/proc/self/cgroup") as f:
        lines = f.read().splitlines()
    for line in lines:
        if ":memory:" in line:
            base, limit = "/sys/fs/cgroup/memory" + line.split(":memory:")[1], "memory.limit_in_bytes"
            break
    else:
        v2 = [ln for ln in lines if ln.startswith("0::")]
        if not v2:
            return None, None
        base, limit = "/sys/fs/cgroup" + v2[0][3:], "memory.max"
    d = os.path.join(base, f"ckptio-restart-{os.getpid()}")
    try:
        os.mkdir(d)
    except OSError:
        return None, None
    if not os.access(os.path.join(d, limit), os.W_OK):
        os.rmdir(d)
        return None, None
    return d, limit


def pressure(path, nbytes, env):
    """ckptio's load in a cgroup whose limit is the file plus 1 GiB (less
    than twice the file for 1 GiB and up), next to fio's O_DIRECT read of
    the same file; (ckptio s, fio s) or None where it cannot run."""
    d, limit = cgroup_dir()
    if not d or not shutil.which("fio"):
        return None
    try:
        with open(os.path.join(d, limit), "w") as f:
            f.write(str(nbytes + (1 << 30)))
        drop(path)
        peers.settle()
        code = (f"import os; open({os.path.join(d, 'cgroup.procs')!r}, 'w').write(str(os.getpid())); "
                f"import runpy, sys; sys.argv = [{os.path.abspath(__file__)!r}, '--child', 'ckptio', {path!r}]; "
                f"runpy.run_path(sys.argv[0], run_name='__main__')")
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
        if r.returncode:
            raise SystemExit(f"pressure: exit {r.returncode}: {r.stderr[-2000:]}")
        ck = float(r.stdout.split()[-2])
    finally:
        os.rmdir(d)
    drop(path)
    f = subprocess.run(["fio", "--name=r", f"--filename={path}", "--rw=read", "--bs=8M", "--direct=1",
                        "--ioengine=libaio", "--iodepth=32", "--output-format=json"],
                       capture_output=True, text=True, timeout=900, check=True)
    job = json.loads(f.stdout)["jobs"][0]["read"]
    return ck, job["io_bytes"] / (job["bw_bytes"] or 1)


def build_c_loader():
    out = os.path.join(ROOT, "build", "restart_load")
    src = os.path.join(HERE, "restart_load.c")
    subprocess.run(["cc", "-O2", "-I", os.path.join(ROOT, "include"), src, "-L", os.path.join(ROOT, "build"),
                    "-lckptio", f"-Wl,-rpath,{os.path.join(ROOT, 'build')}", "-o", out], check=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=2, metavar=("NAME", "PATH"))
    ap.add_argument("--dir")
    ap.add_argument("--sizes", default="1GiB")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--contenders", default=",".join(FILES) + ",pressure")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.child:
        return child(*a.child)
    env = dict(os.environ)
    c_loader = build_c_loader()
    names = a.contenders.split(",")
    report = [f"command: {' '.join(sys.argv)}", ""]
    for size in a.sizes.split(","):
        nbytes = parse_size(size)
        d = os.path.join(a.dir, size)
        os.makedirs(d, exist_ok=True)
        peers.PRIME["bytes"] = min(2 * nbytes + (256 << 20), peers.mem_available() // 2 - (1 << 30))
        paths = make_files(d, nbytes)
        rows = {n: [[], [], []] for n in names if n != "pressure"}
        press = []
        for rnd in range(a.rounds):
            order = names[rnd % len(names):] + names[:rnd % len(names)]
            for name in order:
                if name == "pressure":
                    p = pressure(paths["single"], nbytes, env)
                    if p:
                        press.append(p)
                        print(f"{size} round {rnd + 1} pressure: ckptio {nbytes / p[0] / 1e9:.2f} GB/s, "
                              f"fio {nbytes / p[1] / 1e9:.2f} GB/s, ratio {p[1] / p[0]:.2f}", flush=True)
                    continue
                path = paths[FILES[name]]
                drop(path)
                got = []
                for k in range(3):
                    secs, n, methods = run_child(name, path, env, c_loader)
                    rows[name][k].append(n / secs / 1e9)
                    got.append(f"{n / secs / 1e9:.2f}{methods and ' ' + methods}")
                print(f"{size} round {rnd + 1} {name}: " + ", ".join(got) + " GB/s", flush=True)
        report += [f"## {size}, {a.rounds} rounds (GB/s: first, second, third load; median [per round])", "",
                   "| contender | 1st | 2nd | 3rd | vs its peer, per round (1st / 2nd / 3rd) |", "|---|---|---|---|---|"]
        for name, loads in rows.items():
            med = [statistics.median(x) for x in loads]
            peer = PEER.get(name)
            ratio = ""
            if peer in rows:
                ratio = " / ".join(
                    f"{statistics.median(a_ / b_ for a_, b_ in zip(loads[k], rows[peer][k])):.2f} "
                    f"[{' '.join(f'{a_ / b_:.2f}' for a_, b_ in zip(loads[k], rows[peer][k]))}]" for k in range(3))
                ratio = f"{ratio} (x {peer})"
            if BEFORE.get(name) in rows:
                b = rows[BEFORE[name]][0]
                ratio += (f"; 1st x {BEFORE[name]} "
                          f"{statistics.median(x / y for x, y in zip(loads[0], b)):.2f} "
                          f"[{' '.join(f'{x / y:.2f}' for x, y in zip(loads[0], b))}]")
            report.append(f"| {name} | " + " | ".join(
                f"{m:.2f} [{' '.join(f'{v:.2f}' for v in loads[k])}]" for k, m in enumerate(med)) + f" | {ratio} |")
        if press:
            r = [f / c for c, f in press]
            report += ["", f"pressure (cgroup limit = file + 1 GiB): ckptio / fio O_DIRECT read, per round "
                       f"{' '.join(f'{x:.2f}' for x in r)}, median {statistics.median(r):.2f}"]
        report.append("")
    text = "\n".join(report)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
