#!/usr/bin/env python3
"""SIGKILL anywhere during a save never loses a checkpoint (issue 15 item 2).

For each save kind, runs kill_driver's save loop (the same path saved over
and over, writes slowed by CKPTIO_FAULT_WRITE_MBPS so the kills spread over
every phase) and kills it with SIGKILL after a random delay, then checks
the path with kill_driver check: it must hold exactly the last save that
reported durable, or the one after it (killed after its rename, before it
could say so), every CRC verified and every byte that save's; never a mix,
never nothing once a save was durable. The phase of each kill is what the
driver last reported: "begin" (from the commit to the snapshot point:
copies, CRCs and, through the driver's 1 MiB ring, most writes),
"snapshot" (the last writes, fsync, renames, index), "durable" (between
saves). After the
kills, one save runs to the end and must leave no temp file behind.

usage: kill_test.py DRIVER WORKDIR [--kinds K,K] [--kills N] [--max-seconds S] [--seed N]
"""

import argparse
import collections
import os
import random
import re
import shutil
import subprocess
import sys
import time

KINDS = ["single", "pt", "sharded", "zstd", "ranks"]


def target(workdir, kind):
    base = os.path.join(workdir, kind)
    if kind in ("sharded", "ranks"):
        return base, base  # a directory holding the set
    return base, os.path.join(base, {"pt": "model.pt", "zstd": "model.safetensors.zst"}.get(kind, "model.safetensors"))


def check(driver, kind, path):
    r = subprocess.run([driver, "check", kind, path], capture_output=True, text=True, timeout=60)
    m = re.search(r"seq=(\d+) strays=(\d+)", r.stdout)
    if r.returncode != 0 or not m:
        sys.exit(f"FAIL {kind}: check of {path}:\n{r.stdout}{r.stderr}")
    return int(m[1]), int(m[2])


def run_kind(a, rng, kind, deadline):
    base, path = target(a.workdir, kind)
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    env = dict(os.environ, CKPTIO_FAULT_WRITE_MBPS=str(a.mbps))
    phases, outcomes = collections.Counter(), collections.Counter()
    durable = 0
    kills = 0
    while kills < a.kills and time.monotonic() < deadline:
        p = subprocess.Popen([a.driver, "save", kind, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
        time.sleep(rng.uniform(0.0, a.max_delay))
        p.kill()
        out, err = p.communicate()
        if p.returncode != -9:
            sys.exit(f"FAIL {kind}: the save loop ended by itself ({p.returncode}):\n{err}")
        lines = out.split()
        events = list(zip(lines[0::2], map(int, lines[1::2])))
        done = [s for e, s in events if e == "durable"]
        # The save loop restarts at 1 each run: a durable save replaces
        # the one before, so "old" is the last durable one of any run.
        if done:
            durable = done[-1]
        last = events[-1] if events else ("start", 0)
        phases[last[0]] += 1
        seq, strays = check(a.driver, kind, path)
        began = last[1] if last[0] in ("begin", "snapshot") else None
        if seq == durable and durable > 0:
            outcomes["old kept"] += 1
        elif began is not None and seq == began:
            outcomes["new, killed after publishing"] += 1
            durable = seq
        elif seq == 0 and durable == 0:
            outcomes["nothing yet"] += 1
        else:
            sys.exit(f"FAIL {kind}: kill {kills}: the path holds save {seq}; the last durable was {durable}, "
                     f"the last event {last}")
        outcomes["temp files left"] += strays > 0
        kills += 1
    # One more save to the end: it publishes and clears what the kills left.
    r = subprocess.run([a.driver, "save", kind, path, "1"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        sys.exit(f"FAIL {kind}: the save after the kills failed:\n{r.stderr}")
    seq, strays = check(a.driver, kind, path)
    if seq != 1 or strays:
        sys.exit(f"FAIL {kind}: after a clean save the path holds save {seq} with {strays} temp files")
    print(f"{kind:8s} {kills:4d} kills survived; last event before the kill: "
          + ", ".join(f"{k} {v}" for k, v in sorted(phases.items()))
          + "; outcome: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())), flush=True)
    return kills


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("driver")
    ap.add_argument("workdir")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--kills", type=int, default=15, help="per kind")
    ap.add_argument("--max-seconds", type=float, default=60.0, help="in all")
    ap.add_argument("--max-delay", type=float, default=0.25)
    ap.add_argument("--mbps", type=int, default=150, help="slowed writes (MB/s) to spread the kills")
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"kill_test: seed {seed} (rerun: {' '.join(sys.argv)} --seed {seed})", flush=True)
    kinds = a.kinds.split(",")
    start = time.monotonic()
    total = 0
    for i, kind in enumerate(kinds):
        share = (a.max_seconds - (time.monotonic() - start)) / (len(kinds) - i)
        total += run_kind(a, rng, kind, time.monotonic() + share)
    print(f"kill_test: {total} kills, every path whole after each")


if __name__ == "__main__":
    main()
