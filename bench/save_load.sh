#!/usr/bin/env bash
# ckptio save / load throughput next to fio's raw limits of the same disk.
# Each round runs, back to back on the same directory and byte count:
#   A  build/ckptio bench --size 2GiB --runs 5 --json --dir DIR
#      (which measures its own raw limits too, interleaved with its runs)
#   B  fio write, then fio read: libaio, iodepth 32, bs 8M, --direct=1
# fio is the independent second opinion of the raw limit; the table gives
# every ratio per round and the median over rounds.
#
# Usage: bench/save_load.sh [--rounds N] [--size SIZE] [--runs N] [--dir DIR]
#                           [--out DIR] [-- more ckptio bench options]
#   --rounds  A B rounds (default 3)      --size  model size (default 2GiB)
#   --runs    ckptio runs per round (5)   --dir   where the files go (default
#             $CKPTIO_BENCH_DIR or build/bench-tmp)
#   --out     where the JSON of every step and summary.txt go (default
#             build/bench-results/save_load-<time>)
# CKPTIO=path overrides build/ckptio. Needs fio and python3.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
die() { echo "save_load.sh: ERROR: $*" >&2; exit 1; }
say() { echo "save_load.sh: $*" >&2; }

ROUNDS=3 SIZE=2GiB RUNS=5
DIR="${CKPTIO_BENCH_DIR:-$ROOT/build/bench-tmp}"
OUT="$ROOT/build/bench-results/save_load-$(date +%Y%m%d-%H%M%S)"
EXTRA=()
while (($#)); do
  case "$1" in
    --rounds) ROUNDS=${2:?}; shift 2 ;;
    --size) SIZE=${2:?}; shift 2 ;;
    --runs) RUNS=${2:?}; shift 2 ;;
    --dir) DIR=${2:?}; shift 2 ;;
    --out) OUT=${2:?}; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (--help lists them)" ;;
  esac
done

CKPTIO="${CKPTIO:-$ROOT/build/ckptio}"
[[ -x "$CKPTIO" ]] || die "$CKPTIO not found: build first (scripts/build.sh)"
command -v fio >/dev/null || die "fio not found: apt-get install fio"
command -v python3 >/dev/null || die "python3 not found (it prints the table)"
mkdir -p "$DIR" "$OUT" || die "cannot create $DIR or $OUT"
DIR="$(cd "$DIR" && pwd)"
FIOFILE="$DIR/.save_load-fio-$$"
trap 'rm -f "$FIOFILE"' EXIT INT TERM

say "rounds $ROUNDS, ckptio --size $SIZE --runs $RUNS, dir $DIR ($(stat -f -c %T "$DIR")), results in $OUT"
for ((r = 1; r <= ROUNDS; r++)); do
  bench=("$CKPTIO" bench --size "$SIZE" --runs "$RUNS" --json --dir "$DIR" ${EXTRA[@]+"${EXTRA[@]}"})
  say "round $r/$ROUNDS A: ${bench[*]}"
  "${bench[@]}" >"$OUT/round$r.ckptio.json" || die "ckptio bench failed (round $r)"

  # The same byte count as ckptio's own raw limit, in whole 8 MiB blocks.
  bytes=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["raw"]["bytes"])' \
          "$OUT/round$r.ckptio.json")
  bytes=$((bytes / 8388608 * 8388608))
  for rw in write read; do
    fio=(fio --name=save_load --filename="$FIOFILE" --size="$bytes" --bs=8M --rw="$rw"
         --direct=1 --ioengine=libaio --iodepth=32 --output-format=json)
    [[ $rw == write ]] && fio+=(--end_fsync=1)
    say "round $r/$ROUNDS B: ${fio[*]}"
    "${fio[@]}" >"$OUT/round$r.fio-$rw.json" || die "fio $rw failed (round $r)"
  done
  rm -f "$FIOFILE"
done

python3 - "$OUT" "$ROUNDS" <<'EOF' | tee "$OUT/summary.txt"
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = []
def load(name):
    with open(f"{out}/{name}") as f:
        return json.load(f)
for r in range(1, rounds + 1):
    c = load(f"round{r}.ckptio.json")
    fw = load(f"round{r}.fio-write.json")["jobs"][0]["write"]["bw_bytes"] / 1e9
    fr = load(f"round{r}.fio-read.json")["jobs"][0]["read"]["bw_bytes"] / 1e9
    m = lambda k: c[k]["median"]
    rows.append({
        "save GB/s": m("save_gbps"),
        "ckptio raw write GB/s": m("raw_write_gbps"),
        "fio write GB/s": fw,
        "save / fio write": m("save_gbps") / fw,
        "save / ckptio raw write": m("save_vs_raw_write"),
        "ckptio raw / fio write": m("raw_write_gbps") / fw,
        "time to snapshot s": m("snapshot_s"),
        "cold load GB/s": m("cold_load_gbps"),
        "ckptio raw read GB/s": m("raw_read_gbps"),
        "fio read GB/s": fr,
        "cold load / fio read": m("cold_load_gbps") / fr,
        "cold load / ckptio raw read": m("cold_load_vs_raw_read"),
        "ckptio raw / fio read": m("raw_read_gbps") / fr,
        "warm load GB/s": m("warm_load_gbps"),
        "memcpy GB/s": m("memcpy_gbps"),
        "warm load / memcpy": m("warm_load_vs_memcpy"),
    })
c = load("round1.ckptio.json")
mc, o, md = c["machine"], c["options"], c["model"]
print(f"ckptio {c['version']} save/load vs fio: {rounds} round(s) of A (ckptio bench, "
      f"{o['runs']} run(s), its medians) and B (fio write, then read)")
print(f"command  {c['command']}")
print(f"machine  {mc['nproc']} cpus ({mc['cpu']}), {mc['mem_bytes'] / 2**30:.1f} GiB, "
      f"{mc['kernel']}; {mc['dir']} on {mc['fs_type']} ({mc['fs_device']})")
print(f"model    {o['shapes']}: {md['tensors']} tensors, {md['bytes']} bytes; "
      f"threads {o['threads']}, chunk {o['chunk_bytes']}, staging {o['staging_bytes']}, "
      f"crc {'on' if o['crc'] else 'off'}, fsync {'on' if o['fsync'] else 'off'}, "
      f"direct {o['direct']}, load {o['load']}")
print(f"fio      --bs=8M --iodepth=32 --ioengine=libaio --direct=1, same dir, "
      f"{md['bytes'] // 8388608 * 8388608} bytes")
print()
head = "".join(f"{'round ' + str(r + 1):>10}" for r in range(rounds))
print(f"{'':30}{head}{'median':>10}")
for key in rows[0]:
    vals = [row[key] for row in rows]
    unit = "x" if " / " in key else ""
    fmt = (lambda v: f"{v:9.3f}{unit or ' '}") if key.endswith(" s") else (lambda v: f"{v:9.2f}{unit or ' '}")
    print(f"{key:30}" + "".join(fmt(v) for v in vals) + fmt(statistics.median(vals)))
EOF
say "done: $OUT/summary.txt"
