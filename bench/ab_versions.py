#!/usr/bin/env python3
"""Two builds of the `ckptio` command, A and B (e.g. the last release and
this tree), in alternating rounds of `ckptio bench --json`, each run saving
and loading the same synthetic model next to its own raw limits measured in
that run. Prints, per round, B's ratio to A of each figure the bench
normalises by its limit (so the disk's drift between rounds cancels), and
the medians. What bench/RESULTS.md's "against the last release" rows come
from.

usage: ab_versions.py A_CLI B_CLI --dir DIR [--size 1GiB] [--runs 2] [--rounds 4] [--out FILE.json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

# Higher is better for each (time to the snapshot point is inverted).
FIGURES = [("save_vs_raw_write", "save / raw O_DIRECT write"),
           ("cold_load_vs_raw_read", "cold load / raw O_DIRECT read"),
           ("warm_load_vs_memcpy", "warm load / memcpy"),
           ("snapshot_s", "time to the snapshot point (A/B)")]


def bench(cli, args):
    cmd = [cli, "bench", "--size", args.size, "--runs", str(args.runs), "--json", "--dir", args.dir]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    rounds = []
    for r in range(args.rounds):
        # Order rotated: a round's first run meets the disk as the last left it.
        order = ("a", "b") if r % 2 == 0 else ("b", "a")
        got = {k: bench(getattr(args, k), args) for k in order}
        ratios = {}
        for key, _ in FIGURES:
            a, b = got["a"][key]["median"], got["b"][key]["median"]
            ratios[key] = (a / b if key == "snapshot_s" else b / a) if a and b else None
        rounds.append({"order": order, "a": {k: got["a"][k]["median"] for k, _ in FIGURES},
                       "b": {k: got["b"][k]["median"] for k, _ in FIGURES}, "b_over_a": ratios,
                       "versions": [got["a"]["version"], got["b"]["version"]]})
        print(f"round {r + 1} ({order[0]} first): " +
              ", ".join(f"{key} {ratios[key]:.2f}" for key, _ in FIGURES if ratios[key] is not None), flush=True)
    print(f"\n{rounds[0]['versions'][1]} against {rounds[0]['versions'][0]}, B/A per round (higher: B better), median:")
    for key, title in FIGURES:
        v = [x["b_over_a"][key] for x in rounds if x["b_over_a"][key] is not None]
        print(f"  {title:36s} {' '.join(f'{x:.2f}' for x in v)}  median {statistics.median(v):.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rounds, f, indent=1)


if __name__ == "__main__":
    main()
