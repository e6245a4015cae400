#!/usr/bin/env python3
"""A power cut at any point of any save loses nothing (issue 28).

Each save kind saves in a loop onto plfs, a FUSE filesystem that keeps only
what was made durable (fsync of a file for its data, fsync of a directory
for its entries). The power is cut at a chosen point: either at the N-th
durability call since the mount (N cycles over every call of two saves:
deterministic), or after a random delay. From that instant nothing more
becomes durable: the durability call in flight blocks, the saver is killed
(SIGKILL), the filesystem replaces its backing directory by the durable
state (optionally with unsynced files torn at page boundaries), and is
mounted again. Then:
  - the checkpoint opens and verifies (every CRC) and holds exactly the last
    save that reported durable, or the one in flight (a set or multi-rank
    checkpoint: one whole generation, never a mix);
  - the manager's latest names a complete step, never older than the last
    step whose save_end returned before the cut;
  - the next save on the surviving state succeeds and leaves no temp file.

usage: powerloss_test.py --plfs PLFS --kill-driver D --crash-driver D --ckptio CLI WORKDIR
                         [--kinds K,K] [--cuts N] [--max-seconds S] [--seed N]
                         [--points-only] [--reorder]
                         [--preload-skip-dirsync SO --expect-loss]

--preload-skip-dirsync runs the savers with a library that turns every
directory fsync into a no-op (a deliberately broken save); with
--expect-loss the run passes only if the harness catches a lost save.
Exits 77 (skip) when FUSE cannot be mounted here.
"""

import argparse
import collections
import os
import random
import shutil
import signal
import subprocess
import sys
import time

KINDS = ["single", "pt", "zstd", "sharded", "resharded", "ranks3", "manager", "manager_sharded", "convert"]
FILES = {"single": "model.safetensors", "pt": "model.pt", "zstd": "model.safetensors.zst", "convert": "model.pt"}


class Lost(Exception):
    """The run could not go on (a saver that died, a cut point never reached)."""


class DataLost(Lost):
    """The durable state after a cut is not what a crash-safe save leaves:
    the one failure --expect-loss accepts."""


class Mount:
    """One plfs mount of backing at mnt; start() mounts, stop() unmounts."""

    def __init__(self, plfs, workdir):
        self.plfs = plfs
        self.backing = os.path.join(workdir, "backing")
        self.shadow = os.path.join(workdir, "shadow")
        self.mnt = os.path.join(workdir, "mnt")
        self.proc = None
        for d in (self.backing, self.mnt):
            os.makedirs(d, exist_ok=True)

    def start(self):
        shutil.rmtree(self.shadow, ignore_errors=True)
        os.makedirs(self.shadow)
        self.proc = subprocess.Popen([self.plfs, self.backing, self.shadow, self.mnt],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 10
        while not os.path.ismount(self.mnt):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                err = self.proc.stderr.read() if self.proc.poll() is not None else "timeout"
                self.stop()
                raise OSError(f"plfs did not mount: {err}")
            time.sleep(0.01)

    def control(self, command=None):
        path = os.path.join(self.mnt, ".plfs")
        if command:
            with open(path, "w") as f:
                f.write(command)
            return None
        with open(path) as f:
            return dict(kv.split("=") for kv in f.read().split())

    def stop(self):
        if self.proc is None:
            return
        # Even a mount whose plfs died (ENOTCONN: not ismount) is taken away.
        r = subprocess.run(["fusermount3", "-u", self.mnt], capture_output=True)
        if r.returncode != 0:
            subprocess.run(["fusermount3", "-u", "-z", self.mnt], capture_output=True)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stderr.close()
        self.proc = None


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=120, **kw)


class Kind:
    """One save kind: how its loop starts, what it reported, what a check finds."""

    def __init__(self, a, name, mount, env):
        self.a, self.name, self.mount, self.env = a, name, mount, env
        self.rel = name if name not in FILES else os.path.join(name, FILES[name])
        self.durable = 0   # the last save that reported durable before a cut
        self.next = 1      # the sequence number (or step) the next save gets
        os.makedirs(os.path.join(mount.backing, name), exist_ok=True)
        self.src = os.path.join(a.workdir, "convert-src.safetensors")
        # The manager's save-loop options: retention, and 1 MiB shards.
        self.manager = None
        if name.startswith("manager"):
            self.manager = ["--keep", "2", "--every", "25"] + (["--sharded"] if name == "manager_sharded" else [])

    def path(self):
        return os.path.join(self.mount.mnt, self.rel)

    def loop_command(self):
        if self.manager:
            return [self.a.crash_driver, "save", self.path(), *self.manager]
        if self.name == "convert":
            # One convert after another of a fresh source each time; the
            # sources are written off the mount, so only the conversions'
            # writes meet the cut.
            script = ('seq=$1; while :; do "$2" save single "$3" 1 $seq >/dev/null || exit 2; echo begin $seq; '
                      '"$4" convert "$3" "$5" >/dev/null || exit 3; echo durable $seq; seq=$((seq+1)); done')
            return ["bash", "-c", script, "convert", str(self.next), self.a.kill_driver, self.src, self.a.ckptio,
                    self.path()]
        return [self.a.kill_driver, "save", self.name, self.path(), str(1 << 40), str(self.next)]

    def check(self):
        """What survived: (sequence or step, strays)."""
        if self.manager:
            r = run([self.a.crash_driver, "check", self.path()], env=self.env)
            fields = dict(kv.split("=") for kv in r.stdout.split() if "=" in kv)
            if r.returncode != 0 or "latest" not in fields:
                raise DataLost(f"manager check: {r.stdout}{r.stderr}")
            return int(fields["latest"]), int(fields["strays"])
        kind = "pt" if self.name == "convert" else self.name
        r = run([self.a.kill_driver, "check", kind, self.path()], env=self.env)
        if r.returncode != 0 or not r.stdout.startswith("seq="):
            raise DataLost(f"{self.name} check: {r.stdout}{r.stderr}")
        seq, strays = (int(kv.split("=")[1]) for kv in r.stdout.split())
        return seq, strays

    def save_once(self):
        """One whole save on the surviving state (no cut): it must succeed."""
        if self.manager:
            r = run([self.a.crash_driver, "save", self.path(), *self.manager, "--steps", "1"], env=self.env)
        elif self.name == "convert":
            r = run([self.a.kill_driver, "save", "single", self.src, "1", str(self.next)], env=self.env)
            if r.returncode == 0:
                r = run([self.a.ckptio, "convert", self.src, self.path()], env=self.env)
        else:
            r = run([self.a.kill_driver, "save", self.name, self.path(), "1", str(self.next)], env=self.env)
        if r.returncode != 0:
            raise Lost(f"{self.name}: the save after the cut failed: {r.stdout}{r.stderr}")


def events_of(out):
    words = out.split()
    return [(e, int(n)) for e, n in zip(words[0::2], words[1::2]) if e in ("begin", "snapshot", "durable")]


def one_cut(a, kind, mount, rng, cut_no, points, counts):
    """Mount, save until the cut, kill, cut, remount; check what survived.
    Even cuts come at durability call points[cut_no // 2] (points: every
    call of two saves, in a random rotation), odd ones after a random delay
    (with --points-only every cut comes at points[cut_no])."""
    mount.start()
    how, p = "", None
    try:
        if a.points_only or cut_no % 2 == 0:
            n = points[(cut_no if a.points_only else cut_no // 2) % len(points)]
            mount.control(f"freeze-at {n}")
            how = f"at durability call {n}"
        # Its own process group: convert's loop is a shell with children.
        p = subprocess.Popen(kind.loop_command(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=kind.env, start_new_session=True)
        if how:
            deadline = time.monotonic() + 30
            while int(mount.control()["blocked"]) == 0:
                if p.poll() is not None:
                    raise Lost(f"{kind.name}: the save loop ended by itself: {p.stderr.read()}")
                if time.monotonic() > deadline:
                    raise Lost(f"{kind.name}: durability call {n} never came")
                time.sleep(0.005)
        else:
            delay = rng.uniform(0.0, a.max_delay)
            time.sleep(delay)
            if p.poll() is not None:
                raise Lost(f"{kind.name}: the save loop ended by itself: {p.stderr.read()}")
            mount.control("freeze")
            how = f"after {delay * 1000:.0f} ms"
        os.killpg(p.pid, signal.SIGKILL)
        torn, reorder = rng.random() < 0.5, a.reorder or rng.random() < 0.5
        mount.control(f"cut{' torn' if torn else ''}{' reorder' if reorder else ''} {rng.randrange(1, 1 << 30)}")
        out, err = p.communicate(timeout=30)
    finally:
        try:
            if p and p.poll() is None:  # a failure above: end the saver (a cut frees its blocked calls)
                os.killpg(p.pid, signal.SIGKILL)
                try:
                    mount.control("cut")
                except OSError:
                    pass
                p.wait(timeout=30)
        finally:
            mount.stop()
    events = events_of(out)
    reported = [n for e, n in events if e == "durable"]
    began = [n for e, n in events if e == "begin"]
    floor = reported[-1] if reported else kind.durable
    in_flight = began[-1] if began and began[-1] > floor else None
    counts["torn"] += torn
    counts["reordered"] += reorder

    mount.start()
    try:
        where = f"cut {cut_no} ({how}{', torn' if torn else ''}{', reordered' if reorder else ''})"
        try:
            got, strays = kind.check()
        except DataLost as e:
            raise DataLost(f"{where}: {e}") from None
        if kind.manager:
            # latest may be ahead of the last reported step (published, not yet
            # reported), never behind it.
            if got < floor:
                raise DataLost(f"manager, {where}: latest went back to {got}, step {floor} was durable")
            counts["new" if got > floor else "old"] += 1
        elif got == floor:  # floor >= 1: calibrate() left one durable save
            counts["old"] += 1
        elif in_flight is not None and got == in_flight:
            counts["new"] += 1
        else:
            raise DataLost(f"{kind.name}, {where}: holds save {got}; save {floor} was durable"
                       f"{f', {in_flight} in flight' if in_flight else ''}")
        kind.durable = got
        # The manager resumes after its latest step; the other loops take a
        # number no save has used, so nothing left of a lost save passes for
        # the next one.
        kind.next = got + 1 if kind.manager else max(kind.next, got, floor, in_flight or 0) + 1
        counts["strays after cut"] += strays > 0
        kind.save_once()
        got2, strays2 = kind.check()
        if got2 != kind.next or strays2:
            raise DataLost(f"{kind.name}, {where}: after the next save: holds {got2} (expected {kind.next}), "
                       f"{strays2} temp files left")
        kind.durable = got2
        kind.next += 1
    finally:
        mount.stop()


def calibrate(kind, mount):
    """Durability calls of one whole save of this kind (the deterministic points)."""
    mount.start()
    try:
        before = int(mount.control()["syncs"])
        kind.save_once()
        syncs = int(mount.control()["syncs"]) - before
        got, _ = kind.check()
    finally:
        mount.stop()
    kind.durable, kind.next = got, got + 1
    return syncs


def fuse_usable(plfs, workdir):
    if not os.path.exists("/dev/fuse") or not shutil.which("fusermount3"):
        return "no /dev/fuse or fusermount3 (Debian: fuse3)"
    m = Mount(plfs, os.path.join(workdir, "probe"))
    try:
        m.start()
    except OSError as e:
        return str(e)
    finally:
        m.stop()
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workdir")
    ap.add_argument("--plfs", required=True)
    ap.add_argument("--kill-driver", required=True)
    ap.add_argument("--crash-driver", required=True)
    ap.add_argument("--ckptio", required=True)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--cuts", type=int, default=4)
    ap.add_argument("--max-seconds", type=float, default=600)
    ap.add_argument("--max-delay", type=float, default=0.3)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--points-only", action="store_true", help="every cut at a durability call")
    ap.add_argument("--reorder", action="store_true", help="every cut applies some unsynced entry changes")
    ap.add_argument("--preload-skip-dirsync")
    ap.add_argument("--expect-loss", action="store_true")
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"powerloss: seed {seed} (rerun with --seed {seed})", flush=True)
    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir)
    why = fuse_usable(a.plfs, a.workdir)
    if why:
        print(f"powerloss: SKIP: cannot mount a FUSE filesystem here: {why}")
        return 77
    env = dict(os.environ)
    if a.preload_skip_dirsync:
        env["LD_PRELOAD"] = os.path.abspath(a.preload_skip_dirsync)
        env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0"
    deadline = time.monotonic() + a.max_seconds
    total = 0
    for name in a.kinds.split(","):
        mount = Mount(a.plfs, os.path.join(a.workdir, name))
        kind = Kind(a, name, mount, env)
        counts = collections.Counter()
        start = time.monotonic()
        try:
            syncs = calibrate(kind, mount)
            first = rng.randrange(2 * syncs)
            points = [1 + (first + i) % (2 * syncs) for i in range(2 * syncs)]
            cut = 0
            while cut < a.cuts and time.monotonic() < deadline:
                one_cut(a, kind, mount, rng, cut, points, counts)
                cut += 1
        except DataLost as e:
            if a.expect_loss:
                print(f"powerloss: the broken save was caught, as it must be: {e}")
                return 0
            print(f"powerloss: FAIL {e}")
            return 1
        except Lost as e:
            print(f"powerloss: FAIL {e}")
            return 1
        total += cut
        print(f"powerloss: {name}: {cut} cuts in {time.monotonic() - start:.1f} s, {syncs} durability calls "
              f"per save; kept the old save {counts['old']}, the new one {counts['new']}; "
              f"{counts['torn']} torn, {counts['reordered']} reordered; temp files left by the cut {counts['strays after cut']} "
              f"(removed by the next save)", flush=True)
        if cut < a.cuts:
            print(f"powerloss: FAIL only {cut} of {a.cuts} cuts of {name} within {a.max_seconds} s")
            return 1
    if a.expect_loss:
        print(f"powerloss: FAIL the broken save was not caught in {total} cuts")
        return 1
    print(f"powerloss: {total} cuts, nothing lost: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
