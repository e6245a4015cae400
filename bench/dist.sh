#!/usr/bin/env bash
# Multi-rank save and load throughput next to fio with as many jobs as ranks,
# interleaved in every round on the same directory and byte count:
#   raw write: each of N ranks writes its share to its own file, O_DIRECT,
#              8 MiB blocks, 16 in flight, fdatasync (dist_bench raw-write)
#              then   N ranks save (bench/dist_bench.c, durable) twice in
#              the same processes, into fresh directories, 3 s apart (a
#              training step): the first save of each process and the warm
#              one (pool, ring and pages already in use), reported apart
#   raw read of those files (cache dropped)   then   N ranks load their rows
#              of every tensor, cold (page cache dropped)
#   N ranks load their columns (PREAD): bytes read / bytes needed
#   fio with numjobs=N, write then read (libaio, iodepth 8, bs 8M, direct),
#              as a second opinion of the limit (its bandwidth leaves out
#              the final fsync, so it reads higher than a durable write)
# Every dist_bench figure is barrier, work, barrier on the wall clock.
# Ratios are taken per round, then the median over rounds.
#
# Usage: bench/dist.sh [--ranks N] [--gib G] [--rounds R] [--dir DIR]
#   defaults: 2 ranks, 1 GiB in all, 3 rounds, build/bench-tmp/dist
# Needs mpirun, fio, python3, and build/bench/dist_bench (DIST_BENCH names
# another; scripts/build.sh builds it when CMake finds MPI).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RANKS=2 GIB=1 ROUNDS=3 DIR="$ROOT/build/bench-tmp/dist"
while (($#)); do
  case "$1" in
    --ranks) RANKS=${2:?}; shift 2 ;;
    --gib) GIB=${2:?}; shift 2 ;;
    --rounds) ROUNDS=${2:?}; shift 2 ;;
    --dir) DIR=${2:?}; shift 2 ;;
    -h | --help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "dist.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
BENCH="${DIST_BENCH:-$ROOT/build/bench/dist_bench}"
[[ -x "$BENCH" ]] || { echo "dist.sh: $BENCH missing: scripts/build.sh with MPI installed" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$DIR/ckpt" "$DIR/fio"
LOG="$DIR/log.txt"
: >"$LOG"
per_job_mib=$(python3 -c "print(int($GIB * 1024 / $RANKS))")
fio_run() { # rw
  fio --name=raw --directory="$DIR/fio" --rw="$1" --bs=8M --direct=1 --ioengine=libaio --iodepth=8 \
      --numjobs="$RANKS" --size="${per_job_mib}M" --end_fsync=1 --invalidate=1 --group_reporting \
      --output-format=json | python3 -c "
import json, sys
j = json.load(sys.stdin)['jobs'][0]
side = j['$1' if '$1' == 'read' else 'write']
# group_reporting: io_bytes and bw_bytes are the jobs' aggregate
print('fio-$1 bytes=%d seconds=%.4f' % (side['io_bytes'], side['io_bytes'] / side['bw_bytes']))"
}
for round in $(seq "$ROUNDS"); do
  echo "round $round" >>"$LOG"
  mpirun -np "$RANKS" --oversubscribe --bind-to none "$BENCH" raw-write "$DIR/fio" "$GIB" >>"$LOG"
  rm -rf "$DIR/ckpt" "$DIR/ckpt.warm" && mkdir -p "$DIR/ckpt"
  mpirun -np "$RANKS" --oversubscribe --bind-to none "$BENCH" save "$DIR/ckpt" "$GIB" 2 3 >>"$LOG"
  sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
  mpirun -np "$RANKS" --oversubscribe --bind-to none "$BENCH" raw-read "$DIR/fio" >>"$LOG"
  sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
  mpirun -np "$RANKS" --oversubscribe --bind-to none "$BENCH" load "$DIR/ckpt" >>"$LOG"
  mpirun -np "$RANKS" --oversubscribe --bind-to none "$BENCH" reshard "$DIR/ckpt" >>"$LOG"
  fio_run write >>"$LOG"
  fio_run read >>"$LOG"
done
python3 - "$LOG" "$RANKS" "$GIB" <<'PY'
import re, statistics, sys
log, ranks, gib = sys.argv[1], sys.argv[2], sys.argv[3]
rounds, cur = [], None
for line in open(log):
    if line.startswith('round'):
        cur = {}; rounds.append(cur); continue
    m = re.match(r'(\S+) .*bytes=(\d+) seconds=([\d.]+)(?: read=(\d+))?', line)
    if m: cur[m.group(1)] = (int(m.group(2)), float(m.group(3)), int(m.group(4) or 0))
gbs = lambda b, s: b / s / 1e9
rows = []
for r in rounds:
    w, s, rd, l, rs = r['raw-write'], r['save'], r['raw-read'], r['load'], r['reshard']
    rows.append((gbs(*w[:2]), gbs(*s[:2]), gbs(*rd[:2]), gbs(*l[:2]), rs[2] / rs[0],
                 gbs(*r['fio-write'][:2]), gbs(*r['fio-read'][:2]), gbs(*r['save-warm'][:2])))
med = lambda i: statistics.median(x[i] for x in rows)
ratio = lambda a, b: statistics.median(x[a] / x[b] for x in rows)
print(f"ranks {ranks}, {gib} GiB, {len(rows)} rounds (GB/s, median; ratio per round, then median)")
for i, r in enumerate(rows, 1):
    print(f"  round {i}: raw write {r[0]:.3f}  first save {r[1]:.3f} ({r[1]/r[0]:.2f}x)  "
          f"warm save {r[7]:.3f} ({r[7]/r[0]:.2f}x)  raw read {r[2]:.3f}  "
          f"load {r[3]:.3f} ({r[3]/r[2]:.2f}x)  reshard read/needed {r[4]:.4f}  "
          f"fio write {r[5]:.3f} read {r[6]:.3f}")
print(f"  median: first save {med(1):.3f} = {ratio(1,0):.2f}x raw write {med(0):.3f}; warm save {med(7):.3f} = "
      f"{ratio(7,0):.2f}x; load {med(3):.3f} = "
      f"{ratio(3,2):.2f}x raw read {med(2):.3f}; resharded loads read {med(4):.4f}x the bytes they need")
PY
