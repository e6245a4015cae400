#!/usr/bin/env bash
# Phase timings behind bench/peers/run.sh's figures (see profile.py):
#   bench/peers/profile.sh [--model llm|linear] [--size 1GiB] [--runs 3] [--dir DIR]
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BUILD="${BUILD:-$ROOT/build-peers}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
if [[ ! -f "$BUILD/build.ninja" ]]; then cmake -S "$ROOT" -B "$BUILD" -G Ninja >/dev/null; fi
ninja -C "$BUILD" libckptio.so >/dev/null
cmd="bench/peers/profile.sh"
for a in "$@"; do cmd+=" $(printf '%q' "$a")"; done
export CKPTIO_LIB="$BUILD/libckptio.so"
export PYTHONDONTWRITEBYTECODE=1  # keep bench/peers/ free of __pycache__
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" "$HERE/profile.py" --command "$cmd" "$@"
