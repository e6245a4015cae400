#!/usr/bin/env python3
"""Crash safety of the checkpoint manager (issue 13 item 6).

Runs crash_driver's save loop, kills it with SIGKILL after a random delay
(a random point of a save: writing, syncing, publishing, the latest record,
retention), then checks the directory with crash_driver check: every
published checkpoint is complete, CRC-verified and holds exactly its step's
bytes, ckptio_manager_latest returns the newest of them, and once a complete
checkpoint existed there is always at least one. Repeats --kills times
(bounded by --max-seconds), alternating single-file and sharded saves in the
same directory, then saves once without a kill and checks that no stray
temporary is left.

usage: manager_kill_test.py DRIVER WORKDIR [--kills N] [--max-seconds S] [--seed N]
"""

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time


def check(driver, d):
    r = subprocess.run([driver, "check", d], capture_output=True, text=True, timeout=60)
    m = re.search(r"complete=(\d+) latest=(-?\d+) strays=(\d+)", r.stdout)
    if r.returncode != 0 or not m:
        sys.exit(f"FAIL check of {d}:\n{r.stdout}{r.stderr}")
    return int(m[1]), int(m[2]), int(m[3])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("driver")
    ap.add_argument("workdir")
    ap.add_argument("--kills", type=int, default=40)
    ap.add_argument("--max-seconds", type=float, default=25.0)
    ap.add_argument("--max-delay", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    d = os.path.join(a.workdir, "ckpts")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(a.workdir, exist_ok=True)
    print(f"crash_test: seed {seed} (rerun: {' '.join(sys.argv)} --seed {seed})", flush=True)

    start = time.monotonic()
    kills = 0
    ever = False
    prev_latest = -1
    saves_seen = set()
    while kills < a.kills and time.monotonic() - start < a.max_seconds:
        args = [a.driver, "save", d, "--keep", "2", "--every", "25"]
        if rng.random() < 0.5:
            args.append("--sharded")
        p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(rng.uniform(0, a.max_delay))
        if p.poll() is not None:
            sys.exit(f"FAIL the save loop ended by itself (rc {p.returncode}):\n{p.stderr.read()}")
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        p.stderr.close()
        kills += 1
        complete, latest, strays = check(a.driver, d)
        if ever and complete == 0:
            sys.exit(f"FAIL after kill {kills}: no complete checkpoint left, but one existed")
        if latest < prev_latest:
            sys.exit(f"FAIL after kill {kills}: latest went back from {prev_latest} to {latest}")
        ever = ever or complete > 0
        prev_latest = max(prev_latest, latest)
        saves_seen.add(latest)

    # A clean save removes whatever the kills left behind.
    r = subprocess.run([a.driver, "save", d, "--keep", "2", "--every", "25", "--steps", "1"],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        sys.exit(f"FAIL final save: {r.stderr}")
    complete, latest, strays = check(a.driver, d)
    if strays or latest != prev_latest + 1 and prev_latest >= 0 or complete == 0:
        sys.exit(f"FAIL after the final save: complete={complete} latest={latest} "
                 f"(expected {prev_latest + 1}) strays={strays}")
    secs = time.monotonic() - start
    print(f"crash_test: {kills} kills in {secs:.1f} s, newest checkpoint step {latest}, "
          f"{len(saves_seen)} distinct latest steps seen, {complete} complete at the end: PASS")
    if kills < a.kills:
        sys.exit(f"FAIL only {kills} of {a.kills} kills within {a.max_seconds} s")


if __name__ == "__main__":
    main()
