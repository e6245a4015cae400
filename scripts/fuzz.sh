#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (build-fuzz/, clang-14, ASan +
# UBSan, -DCKPTIO_FUZZ=ON) and runs each for a time or a count, seeded from
# tests/fuzz/corpus/<target>. New inputs go to build-fuzz/corpus/<target>,
# crashes to build-fuzz/crashes/<target>/; the committed corpus is only read.
# Usage: scripts/fuzz.sh [--seconds N | --runs N] [--smoke] [target...]
#   --seconds N   run each target N seconds (default 60)
#   --runs N      run each target N inputs instead
#   --smoke       exit 77 (skip) when clang-14 is missing, for the suite
#   target        a tests/fuzz/fuzz_<target>.c: safetensors torch zstd_table dcp_meta
#                 hf_index reader (default: all of them)
# Prints per target the executions reached, the coverage and any crash file;
# exits non-zero when a target crashed, leaked or ran out of memory
# (-rss_limit_mb=2048).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${CKPTIO_FUZZ_DIR:-$ROOT/build-fuzz}"
say() { echo "fuzz.sh: $*"; }
die() { echo "fuzz.sh: ERROR: $*" >&2; exit 1; }

SECONDS_EACH=60 RUNS="" SMOKE=0 TARGETS=()
while (($#)); do
  case "$1" in
    --seconds) SECONDS_EACH="${2:?--seconds needs a value}"; RUNS=""; shift 2 ;;
    --runs) RUNS="${2:?--runs needs a value}"; shift 2 ;;
    --smoke) SMOKE=1; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) TARGETS+=("$1"); shift ;;
  esac
done
if ((${#TARGETS[@]} == 0)); then
  for f in "$ROOT"/tests/fuzz/fuzz_*.c; do
    f=${f##*/fuzz_}
    TARGETS+=("${f%.c}")
  done
fi

CC_FUZZ="${CKPTIO_FUZZ_CC:-clang-14}"
if ! command -v "$CC_FUZZ" >/dev/null; then
  msg="$CC_FUZZ not found (apt-get install clang libclang-rt-14-dev, or run scripts/setup.sh)"
  if ((SMOKE)); then echo "SKIP fuzz smoke: $msg"; exit 77; fi
  die "$msg"
fi

mkdir -p "$DIR" || die "cannot create $DIR"
say "building $DIR with $CC_FUZZ"
CC="$CC_FUZZ" CXX="${CC_FUZZ/clang/clang++}" \
  cmake -S "$ROOT" -B "$DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCKPTIO_FUZZ=ON -DCKPTIO_BUILD_TESTS=OFF >"$DIR/configure.log" 2>&1 \
  || { cat "$DIR/configure.log"; die "configure of $DIR failed"; }
cmake --build "$DIR" --target fuzzers -j "$(nproc)" || die "build of the fuzzers failed"

# LeakSanitizer inside libFuzzer checks every input; UBSan stops at the first
# report so it becomes a crash file.
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"

status=0
declare -a REPORT
for t in "${TARGETS[@]}"; do
  bin="$DIR/tests/fuzz/fuzz_$t"
  [[ -x "$bin" ]] || die "no fuzz target $t ($bin)"
  seeds="$ROOT/tests/fuzz/corpus/$t"
  work="$DIR/corpus/$t" crashes="$DIR/crashes/$t"
  mkdir -p "$work" "$crashes"
  log="$DIR/fuzz_$t.log"
  if [[ -n "$RUNS" ]]; then limit=(-runs="$RUNS"); else limit=(-max_total_time="$SECONDS_EACH"); fi
  say "running $t (${limit[*]}), log $log"
  "$bin" "${limit[@]}" -rss_limit_mb=2048 -timeout=30 -print_final_stats=1 \
         -artifact_prefix="$crashes/" "$work" "$seeds" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1)
  crash=$(grep -o "Test unit written to .*" "$log" | sed 's/^Test unit written to //' | tail -1)
  line="$t: ${execs:-?} executions, ${cov:-cov: ?}, ${ft:-ft: ?}"
  if ((rc != 0)); then
    status=1
    line="$line, FAILED (exit $rc)${crash:+, crash input $crash}"
    grep -m1 -E 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:' "$log" | sed 's/^/    /'
  fi
  REPORT+=("$line")
done
for line in "${REPORT[@]}"; do say "$line"; done
exit $status
