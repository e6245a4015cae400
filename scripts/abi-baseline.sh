#!/usr/bin/env bash
# Writes tests/abi/libckptio.abi, the ABI baseline the abi_baseline test
# compares the library with, from a release build of libckptio.so (debug
# info needed: scripts/build.sh builds RelWithDebInfo). Run at a release,
# after checking that every difference abidiff reports is meant.
# Usage: scripts/abi-baseline.sh [BUILD_DIR (default build)]
set -euo pipefail
cd "$(dirname "$0")/.."
lib=${1:-build}/libckptio.so
abidw --headers-dir include --drop-private-types --no-corpus-path --out-file tests/abi/libckptio.abi "$lib"
echo "wrote tests/abi/libckptio.abi from $lib"
