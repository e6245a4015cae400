#!/usr/bin/env bash
# The main job: installs what is missing, builds build/, then saves a
# synthetic ~1 GiB LLM-shaped checkpoint through the pipeline, loads it back,
# verifies every byte and CRC, and prints the throughput next to the raw disk
# bandwidth measured in the same run:
#   build/ckptio bench --size 1GiB --shapes llm --verify --dir DIR [your arguments...]
# DIR, where the checkpoint and the raw-bandwidth file go, is build/bench-tmp
# (on the /work filesystem) or $CKPTIO_BENCH_DIR when set; a --dir among your
# arguments wins. The bench removes its files when it ends.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
say() { echo "run.sh: $*"; }
die() { echo "run.sh: ERROR: $*" >&2; exit 1; }

scripts/setup.sh || die "scripts/setup.sh failed"
scripts/build.sh "$ROOT/build" || die "scripts/build.sh failed"
[[ -x build/ckptio ]] || die "build/ckptio was not built"

BENCH_DIR="${CKPTIO_BENCH_DIR:-$ROOT/build/bench-tmp}"
mkdir -p "$BENCH_DIR" || die "cannot create $BENCH_DIR"
BENCH_DIR="$(cd "$BENCH_DIR" && pwd)"

# The checkpoint and the raw-bandwidth file of the same size, plus headroom.
need_kib=$((3 * 1024 * 1024))
free_kib=$(df -Pk "$BENCH_DIR" | awk 'NR == 2 { print $4 }')
if [[ -n "$free_kib" ]] && ((free_kib < need_kib)); then
  die "$BENCH_DIR has $((free_kib / 1024)) MiB free; the bench needs about 3 GiB"
fi
fstype=$(stat -f -c %T "$BENCH_DIR" 2>/dev/null || echo unknown)
say "bench directory $BENCH_DIR ($fstype, $((free_kib / 1024 / 1024)) GiB free)"
if [[ "$fstype" == tmpfs || "$fstype" == ramfs ]]; then
  say "WARNING: $BENCH_DIR is in memory: the disk figures will not mean disk"
fi

cmd=("$ROOT/build/ckptio" bench --size 1GiB --shapes llm --verify --dir "$BENCH_DIR" "$@")
say "${cmd[*]}"
exec "${cmd[@]}"
