#!/usr/bin/env bash
# ckptio next to torch.save / torch.load, safetensors and numpy on the same
# state dicts, beside the raw limits measured in the same run.
#
#   bench/peers/run.sh [--sizes 256MiB,1GiB] [--big] [--runs 3] [--dir DIR]
#                      [--models llm,linear] [--out DIR] [--no-rss]
#                      [--touch page|byte] [--no-prime] [--fresh]
#                      [--peers2] [--contenders a,b,...] [--steps save,load_cold,...]
#
# Builds libckptio into build-peers/ (the library the binding then loads),
# runs bench/peers/peers.py with the project venv, and leaves results.csv,
# results_runs.csv, results.json, results.md and results.png in bench/peers/
# (or --out). PYTHON=path picks another interpreter (it needs torch,
# safetensors and numpy; it installs matplotlib, and with --peers2
# runai-model-streamer, fastsafetensors and tensorizer, with pip if missing);
# BUILD=dir another build directory.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BUILD="${BUILD:-$ROOT/build-peers}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"

die() { echo "run.sh: $*" >&2; exit 2; }

for a in "$@"; do
  if [[ "$a" == -h || "$a" == --help ]]; then
    sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 0
  fi
done

[[ -x "$PYTHON" ]] || die "no interpreter at $PYTHON (run scripts/setup.sh, or set PYTHON)"
"$PYTHON" -c 'import torch, safetensors, numpy' 2>/dev/null \
  || die "$PYTHON lacks torch, safetensors or numpy (scripts/setup.sh installs them)"

# matplotlib (the PNG) and the second ring's packages (--peers2, or named in
# --contenders): installed into this interpreter's environment with pip when
# missing. The test suite never needs them.
wanted=()
want_ring2=0
for a in "$@"; do
  case "$a" in
    --peers2|*runai*|*fastsafetensors*|*tensorizer*) want_ring2=1 ;;
  esac
done
if ((want_ring2)); then
  wanted=(runai-model-streamer:runai_model_streamer fastsafetensors:fastsafetensors
          tensorizer:tensorizer)
fi
missing=()
for p in matplotlib:matplotlib "${wanted[@]}"; do
  "$PYTHON" -c "import ${p#*:}" 2>/dev/null || missing+=("${p%%:*}")
done
if ((${#missing[@]})); then
  echo "run.sh: pip installing ${missing[*]} into $("$PYTHON" -c 'import sys; print(sys.prefix)')" >&2
  "$PYTHON" -m pip install -q --disable-pip-version-check "${missing[@]}" \
    || die "pip install ${missing[*]} failed"
fi

# The shared library: `ninja ckptio` names the CLI binary (its output file is
# build-peers/ckptio), so ask for libckptio.so by its file name.
if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja >/dev/null || die "cmake failed"
fi
ninja -C "$BUILD" libckptio.so ckptio_cli >/dev/null || die "build failed (ninja -C $BUILD)"

cmd="bench/peers/run.sh"
for a in "$@"; do cmd+=" $(printf '%q' "$a")"; done

export CKPTIO_LIB="$BUILD/libckptio.so"
export PYTHONDONTWRITEBYTECODE=1  # keep bench/peers/ free of __pycache__
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" "$HERE/peers.py" --command "$cmd" "$@"
