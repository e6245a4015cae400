#!/usr/bin/env bash
# The ABI of libckptio.so against the baseline of the last release
# (tests/abi/libckptio.abi, written by scripts/abi-baseline.sh): abidiff
# (libabigail) compares every exported function's signature and the layout
# of every type the public header reaches. A removed or changed function, a
# struct whose fields moved or changed type, an enum value renumbered: the
# test fails and prints abidiff's report. Added functions are compatible and
# pass; a release that changes the ABI on purpose (a versioned struct that
# grows) regenerates the baseline (README, "The ABI").
# Usage: check_abi.sh LIBCKPTIO_SO SOURCE_DIR. Exit 77 (skip) without abidiff.
set -uo pipefail
LIB=$1 SRC=$2
if ! command -v abidiff > /dev/null; then
  echo "SKIP abi_baseline: abidiff not found (Debian: abigail-tools; scripts/setup.sh installs it)"
  exit 77
fi
report=$(abidiff --headers-dir2 "$SRC/include" --drop-private-types --no-added-syms \
                 "$SRC/tests/abi/libckptio.abi" "$LIB" 2>&1)
rc=$?
if ((rc != 0)); then
  echo "$report"
  echo "FAIL abi_baseline: abidiff exited $rc (4: the ABI changed, 8: incompatibly) against tests/abi/libckptio.abi"
  exit 1
fi
echo "ok abi_baseline: the ABI of $(basename "$LIB") is the baseline's (added functions aside)"
