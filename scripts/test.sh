#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds build/ and runs every
# ctest there, then builds build-asan/ (AddressSanitizer + UBSan, -O0) and runs it
# again without the tests labelled slow, then the ThreadSanitizer pass of
# scripts/tsan.sh (build-tsan/, the concurrent tests). Extra arguments go to both ctest
# runs, e.g. scripts/test.sh -L unit (a -LE of yours replaces the passes'
# "-LE soak|long" and "-LE slow|soak|long"). Exits non-zero if any build or test fails; the last line is
# "test.sh: N passed, N failed, N skipped".
#
# The interop tests run under ASan too: tests/CMakeLists.txt preloads the ASan
# runtime into the (uninstrumented) python that loads the instrumented
# libckptio.so, with leak checks off for CPython's deliberate exit-time leaks.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
START=$SECONDS

say() { echo "test.sh: $*"; }

scripts/setup.sh || { say "ERROR: scripts/setup.sh failed"; exit 1; }

TOTAL_PASS=0 TOTAL_FAIL=0 TOTAL_SKIP=0
SUMMARY=()

# Counts one ctest run from its JUnit file; prints why each skipped test was
# skipped (ctest itself shows no output for skips).
count_junit() {  # name junit-file
  python3 - "$1" "$2" <<'EOF'
import sys
import xml.etree.ElementTree as ET
name, path = sys.argv[1], sys.argv[2]
suite = ET.parse(path).getroot()
tests = int(suite.get("tests", 0))
failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0) or 0)
skipped = int(suite.get("skipped", 0)) + int(suite.get("disabled", 0))
for case in suite.iter("testcase"):
    if case.get("status") == "notrun":
        out = (case.findtext("system-out") or "").strip().splitlines()
        reason = out[-1] if out else "no reason printed"
        print(f"test.sh: [{name}] skipped {case.get('name')}: {reason}", file=sys.stderr)
print(tests - failed - skipped, failed, skipped)
EOF
}

# Builds a directory and runs its ctest; adds to the totals.
run_pass() {  # name dir "cmake args" -- ctest args...
  local name=$1 dir=$2 cmake_args=$3
  shift 4
  local t0=$SECONDS
  say "=== [$name] building $dir"
  # shellcheck disable=SC2086  # cmake_args is a word list on purpose
  if ! scripts/build.sh "$dir" $cmake_args; then
    say "[$name] BUILD FAILED"
    TOTAL_FAIL=$((TOTAL_FAIL + 1))
    SUMMARY+=("$name: build failed")
    return
  fi
  local junit="$ROOT/$dir/ctest-junit.xml"
  rm -f "$junit"
  say "=== [$name] ctest $*"
  ctest --test-dir "$dir" --output-on-failure -j2 --no-tests=error \
        --output-junit "$junit" "$@"
  local rc=$?
  local counts pass=0 fail=0 skip=0
  if [[ -f "$junit" ]] && counts=$(count_junit "$name" "$junit"); then
    read -r pass fail skip <<<"$counts"
  fi
  # ctest failing without a failed test (no tests, a crash, a timeout in
  # setup) still fails the run.
  if ((rc != 0 && fail == 0)); then fail=1; fi
  TOTAL_PASS=$((TOTAL_PASS + pass))
  TOTAL_FAIL=$((TOTAL_FAIL + fail))
  TOTAL_SKIP=$((TOTAL_SKIP + skip))
  SUMMARY+=("$name: $pass passed, $fail failed, $skip skipped in $((SECONDS - t0)) s")
}

# The soak and long labels are left out (README, "Tests"): ctest -L soak, ctest -L long.
run_pass release build "" -- -LE '^(soak|long)$' "$@"
# Debug (-O0) for the sanitizer build: GCC compiles the GoogleTest files with
# ASan+UBSan 5-6x faster than at -O2, which keeps the suite well inside its
# time budget; the optimised build/ above keeps the -O2-only warnings.
run_pass asan build-asan "-DCKPTIO_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug" -- -LE '^(slow|soak|long)$' "$@"

# ThreadSanitizer over the concurrent tests (scripts/tsan.sh builds
# build-tsan/ and picks them); a reported race fails its test.
t0=$SECONDS
junit="$ROOT/build-tsan/ctest-junit.xml"
rm -f "$junit"
say "=== [tsan] scripts/tsan.sh"
scripts/tsan.sh --output-junit "$junit"
rc=$?
pass=0 fail=0 skip=0
if [[ -f "$junit" ]] && counts=$(count_junit tsan "$junit"); then read -r pass fail skip <<<"$counts"; fi
if ((rc != 0 && fail == 0)); then fail=1; fi
TOTAL_PASS=$((TOTAL_PASS + pass)) TOTAL_FAIL=$((TOTAL_FAIL + fail)) TOTAL_SKIP=$((TOTAL_SKIP + skip))
SUMMARY+=("tsan: $pass passed, $fail failed, $skip skipped in $((SECONDS - t0)) s")

for line in "${SUMMARY[@]}"; do say "$line"; done
say "total time $((SECONDS - START)) s"
say "$TOTAL_PASS passed, $TOTAL_FAIL failed, $TOTAL_SKIP skipped"
((TOTAL_FAIL == 0))
