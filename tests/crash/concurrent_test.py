#!/usr/bin/env python3
"""Processes saving to one path at once all succeed (issue 45).

For each save kind, SAVERS kill_driver processes save COUNT times each to
the same path (every save's bytes its own: sequence numbers 1.., 1001..,
2001..), while a checker opens what is at the path over and over. Every
save must succeed (a save's sweep of the temps that killed saves left must
never remove a live save's temp), every look must find one whole save
(every CRC checked, every byte that save's), and at the end the path must
hold one of the last saves of some process, with no temp file left.

usage: concurrent_test.py DRIVER WORKDIR [--kinds K,K] [--savers N] [--count N]
"""

import argparse
import os
import shutil
import subprocess
import sys

from kill_test import check as look, target  # the path of a kind; the save a reader finds there

KINDS = ["single", "pt", "sharded", "zstd"]


def run_kind(a, kind):
    base, path = target(a.workdir, kind)
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    starts = [1 + 1000 * i for i in range(a.savers)]
    savers = [subprocess.Popen([a.driver, "save", kind, path, str(a.count), str(s)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for s in starts]
    seen = set()
    looks = 0
    while any(p.poll() is None for p in savers):
        seq, _ = look(a.driver, kind, path)
        seen.add(seq)
        looks += 1
    failed = []
    durable = 0
    for s, p in zip(starts, savers):
        out, err = p.communicate()
        durable += out.count("durable ")
        if p.returncode != 0:
            failed.append(f"the saver from {s}: exit {p.returncode}: {err.strip()}")
    if failed:
        sys.exit(f"FAIL {kind}: {len(failed)} of {a.savers} savers failed:\n" + "\n".join(failed))
    valid = {s + k for s in starts for k in range(a.count)}
    if not seen <= valid | {0}:
        sys.exit(f"FAIL {kind}: readers found saves nobody made: {sorted(seen - valid - {0})}")
    seq, strays = look(a.driver, kind, path)
    lasts = {s + a.count - 1 for s in starts}
    if seq not in valid or strays:
        sys.exit(f"FAIL {kind}: after the savers the path holds save {seq} with {strays} temp files left")
    print(f"{kind}: {durable} of {a.savers * a.count} saves durable, 0 failed; {looks} looks, each one whole save "
          f"({len(seen)} distinct); the path holds save {seq}{' (a last one)' if seq in lasts else ''}, 0 temps")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("driver")
    ap.add_argument("workdir")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--savers", type=int, default=3)
    ap.add_argument("--count", type=int, default=20)
    a = ap.parse_args()
    for kind in a.kinds.split(","):
        run_kind(a, kind)
    print("concurrent_test: all kinds passed")


if __name__ == "__main__":
    main()
