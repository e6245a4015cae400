#!/usr/bin/env bash
# Tiered checkpoints timed (bench/tiers_bench.c), 2 MPI ranks as 2 machines
# with 1 peer copy each: the save's stall to memory + peers against a
# durable save and against a plain copy of the part, then restores from
# each tier (memory; a machine's memory wiped: peers; both wiped and the
# durable parts out of the page cache: durable), every part loaded after
# (a restore then a load, and the one-pass ckptio_tiers_restore_load: the
# "-load" rows); as the reference, each part saved to and loaded from S3
# (SeaweedFS); and a restore from the storage tier on the same server.
#   bench/tiers.sh [WORK (/work/exp/tiers)] [MIB per rank (1024)] [ROUNDS (5)]
set -euo pipefail
WORK="${1:-/work/exp/tiers}" MIB="${2:-1024}" ROUNDS="${3:-5}"
export TIERS_SHM="${TIERS_SHM:-/dev/shm/ckptio-tiers-bench}"  # the machines' memory tiers
BENCH="$(dirname "$0")/../build/bench/tiers_bench"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mpi() { mpirun -x TIERS_SHM -np 2 --oversubscribe --bind-to none "$BENCH" "$WORK" "$MIB" "$@"; }
rm -rf "$WORK" "$TIERS_SHM"
mkdir -p "$WORK" "$TIERS_SHM"
mpi save "$ROUNDS" | grep RESULT
for i in 1 2 3; do
  mpi restore "$ROUNDS" memory | grep RESULT
  mpi restore "$ROUNDS" memory-load | grep RESULT
done
for kind in peers peers-load peers peers-load; do
  rm -rf "$TIERS_SHM/node1"
  mpi restore "$ROUNDS" $kind | grep RESULT
done
rm -rf "$TIERS_SHM/node0" "$TIERS_SHM/node1"
mpi restore "$ROUNDS" durable-cold | grep RESULT
rm -rf "$TIERS_SHM/node0" "$TIERS_SHM/node1"
mpi restore "$ROUNDS" durable-cold | grep RESULT
# The same parts from S3 (SeaweedFS on 127.0.0.1, started and stopped here).
for i in 1 2 3; do
  "$(dirname "$0")/../.venv/bin/python" "$(dirname "$0")/../tests/s3/weed_server.py" -- \
    bash -c 'for mode in s3 storage; do
               mpirun -x AWS_ENDPOINT_URL -x AWS_ACCESS_KEY_ID -x AWS_SECRET_ACCESS_KEY -x AWS_REGION -x TIERS_SHM \
                 -np 2 --oversubscribe --bind-to none "$0" "$1" "$2" $mode "$CKPTIO_S3_BUCKET"
             done' "$BENCH" "$WORK" "$MIB" | grep RESULT
done
rm -rf "$WORK" "$TIERS_SHM"
