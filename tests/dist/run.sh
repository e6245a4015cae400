#!/usr/bin/env bash
# Multi-rank checkpoints over real MPI processes: one scenario per call.
#   run.sh DRIVER SCENARIO WORKDIR
# Scenarios:
#   save-2        2 ranks save and load back
#   reshard       4 ranks save (a 2-D mesh among the splits); 1, 2 and 3 ranks load it
#   fail-rank     4 ranks save; then rank 1's disk fills mid-save: every rank
#                 fails naming rank 1, the first checkpoint stays whole
#   kill-rank     4 ranks save; then rank 2 is SIGKILLed mid-save: mpirun ends
#                 the job, the first checkpoint stays whole, and a next save
#                 (2 ranks) succeeds and removes the killed save's temp files
# Exits 77 (skip) when mpirun is missing.
set -euo pipefail
DRIVER="$1" SCENARIO="$2" WORK="$3"
command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (scripts/setup.sh installs openmpi-bin)"; exit 77; }
# Root in a container: OpenMPI refuses to run as root without both settings.
# 2 cores: oversubscribe, no binding; shared memory between the ranks.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mpi() { local n="$1"; shift; timeout 120 mpirun -np "$n" --oversubscribe --bind-to none "$DRIVER" "$@"; }
rm -rf "$WORK"
mkdir -p "$WORK"
case "$SCENARIO" in
  save-2)
    mpi 2 save "$WORK" 1 ;;
  reshard)
    mpi 4 save "$WORK" 1
    for n in 1 2 3; do mpi "$n" load "$WORK" 1; done ;;
  fail-rank)
    mpi 4 save "$WORK" 1
    mpi 4 fail-rank 1 "$WORK" 2 ;;
  kill-rank)
    mpi 4 save "$WORK" 1
    if mpi 4 kill-rank 2 "$WORK" 2 >"$WORK.kill.log" 2>&1; then
      cat "$WORK.kill.log"; echo "FAIL: the job with a killed rank exited 0"; exit 1
    fi
    echo "the killed job ended as expected: $(grep -m1 -i 'signal\|killed\|exited' "$WORK.kill.log" || true)"
    mpi 1 load "$WORK" 1
    left=$(ls -A "$WORK" | grep -c 'ckptio-tmp' || true)
    echo "temp files left by the killed save: $left"
    mpi 2 save "$WORK" 3  # also checks that no temp file remains
    ;;
  *) echo "unknown scenario $SCENARIO"; exit 2 ;;
esac
echo "PASS: $SCENARIO"
