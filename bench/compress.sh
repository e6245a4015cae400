#!/usr/bin/env bash
# Reproduces the compression section of bench/RESULTS.md: ckptio's plain and
# zstd-compressed saves and loads of weight-like data, side by side.
# Usage: bench/compress.sh [--mib 256] [--runs 3] [--dir DIR]   (build first: scripts/build.sh)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$ROOT/.venv/bin/python"
[[ -x "$PY" ]] || { echo "compress.sh: no venv at $ROOT/.venv: run scripts/setup.sh" >&2; exit 2; }
export CKPTIO_LIB="${CKPTIO_LIB:-$ROOT/build/libckptio.so}"
[[ -f "$CKPTIO_LIB" ]] || { echo "compress.sh: $CKPTIO_LIB missing: run scripts/build.sh" >&2; exit 2; }
exec "$PY" "$ROOT/bench/compress.py" "$@"
