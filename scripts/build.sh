#!/usr/bin/env bash
# Configures (Ninja, RelWithDebInfo, warnings as errors) and builds ckptio:
# the development and test build, with fault injection from CKPTIO_FAULT*
# variables compiled in (-DCKPTIO_FAULT_INJECTION=ON: the tests rely on it;
# an extra -DCKPTIO_FAULT_INJECTION=OFF wins). Not for installing: build an
# install with plain cmake (README.md), which leaves it off.
# Usage: scripts/build.sh [dir] [extra cmake args...]
#   dir defaults to build/ in the repository; a relative dir is taken from the
#   current directory. Extra arguments go to the configure step, e.g.
#   scripts/build.sh build-asan -DCKPTIO_SANITIZE=ON
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
die() { echo "build.sh: ERROR: $*" >&2; exit 1; }

DIR="${1:-$ROOT/build}"
shift $(($# > 0 ? 1 : 0))
[[ "$DIR" == -* ]] && die "the first argument is the build directory, got '$DIR'"
[[ "$DIR" = /* ]] || DIR="$PWD/$DIR"

command -v cmake >/dev/null || die "cmake not found: run scripts/setup.sh"
command -v ninja >/dev/null || die "ninja not found: run scripts/setup.sh"

# A directory configured with another generator cannot be switched to Ninja.
if [[ -f "$DIR/CMakeCache.txt" ]] &&
   ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$DIR/CMakeCache.txt"; then
  die "$DIR was configured with another generator; remove it or pick another dir"
fi

echo "build.sh: configuring $DIR $*"
cmake -S "$ROOT" -B "$DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCKPTIO_WERROR=ON -DCKPTIO_FAULT_INJECTION=ON "$@" || die "cmake configure of $DIR failed"
echo "build.sh: building $DIR"
# CKPTIO_BUILD_TARGETS: only these targets (and what they need), for a pass
# that runs a few tests (scripts/tsan.sh).
# shellcheck disable=SC2086  # a word list on purpose
cmake --build "$DIR" -j "$(nproc)" ${CKPTIO_BUILD_TARGETS:+--target $CKPTIO_BUILD_TARGETS} ||
  die "build of $DIR failed"
echo "build.sh: built $DIR"
