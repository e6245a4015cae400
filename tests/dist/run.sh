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
#   cli           4 ranks save; `ckptio inspect` lists the parts, `verify`
#                 checks every part (and names a damaged one), `convert`
#                 consolidates into one file and into a set of whole tensors,
#                 which 1 and 2 ranks load (CLI = the ckptio command, 4th argument)
#   group         group loads (DRIVER: group_driver): 2 and 4 ranks load a
#                 48 MiB model whole, then as tensor-parallel shares, through
#                 their shared page cache, exchanged, and (each rank its own
#                 copy) through windows of shared memory; the group reads at
#                 most 1.02x the union of the boxes from storage
#   group-faults  a damaged byte, a missing tensor, another checkpoint on one
#                 rank: every rank fails naming it; a rank SIGKILLed mid-load:
#                 mpirun ends the job, no rank hangs
#   s3            the same checkpoints in S3 (run under tests/s3/weed_server.py,
#                 which sets AWS_* and CKPTIO_S3_BUCKET): 4 ranks save to a
#                 prefix, 1 and 3 load it; rank 2 is SIGKILLed mid-save: the
#                 old checkpoint stays whole, a next save (2 ranks) succeeds
#                 and no multipart upload stays open; `ckptio verify` and
#                 `convert` (to a local file, which 1 rank loads) read the prefix
# Exits 77 (skip) when mpirun is missing.
set -euo pipefail
DRIVER="$1" SCENARIO="$2" WORK="$3" CLI="${4:-}"
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
  cli)
    mkdir -p "$WORK/ckpt"
    mpi 4 save "$WORK/ckpt" 1
    "$CLI" inspect "$WORK/ckpt" >"$WORK/inspect.txt"
    grep -q "layers.0.mlp .*4 parts" "$WORK/inspect.txt" || { cat "$WORK/inspect.txt"; echo "FAIL: no parts in inspect"; exit 1; }
    grep -q "\[32+32, 24+24\]  model-00004-of-00004.safetensors" "$WORK/inspect.txt" || { echo "FAIL: mesh part"; exit 1; }
    "$CLI" inspect --json "$WORK/ckpt" | grep -q '"parts":\[{"file":' || { echo "FAIL: no parts in --json"; exit 1; }
    "$CLI" verify "$WORK/ckpt" | tee "$WORK/verify.txt"
    grep -q "7 tensors, 7 checked, 0 unchecked" "$WORK/verify.txt" || { echo "FAIL: verify count"; exit 1; }
    "$CLI" convert "$WORK/ckpt" "$WORK/one.safetensors"
    mpi 1 load "$WORK/one.safetensors" 1
    "$CLI" convert --max-shard-size 1MB "$WORK/ckpt" "$WORK/whole"
    mpi 2 load "$WORK/whole" 1
    grep -q '"ckptio"' "$WORK/whole/model.safetensors.index.json" && { echo "FAIL: a set of whole tensors has a ckptio section"; exit 1; }
    # A damaged byte in rank 3's part of the mesh: verify names that file.
    f="$WORK/ckpt/model-00003-of-00004.safetensors"
    printf '\xff' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") - 7 )) conv=notrunc status=none
    if "$CLI" verify "$WORK/ckpt" >"$WORK/bad.txt" 2>&1; then cat "$WORK/bad.txt"; echo "FAIL: damage not found"; exit 1; fi
    grep -q "model-00003-of-00004.safetensors.*checksum" "$WORK/bad.txt" || { cat "$WORK/bad.txt"; echo "FAIL: the damaged file is not named"; exit 1; }
    ;;
  group)
    f="$WORK/model.safetensors"
    mpi 1 prepare "$f"
    for r in 0 1 2 3; do cp "$f" "$f.copy$r"; done
    for n in 2 4; do
      mpi "$n" whole "$f"; mpi "$n" tp "$f"          # through the shared page cache
      mpi "$n" whole-x "$f"; mpi "$n" tp-x "$f"      # exchanged
      mpi "$n" whole-w "$f"; mpi "$n" tp-w "$f"      # each rank its own copy: windows of shared memory
    done ;;
  group-faults)
    f="$WORK/model.safetensors"
    mpi 1 prepare "$f"
    mpi 1 prepare-other "$f.other"
    mpi 3 missing-x "$f"
    mpi 3 different-x "$f"
    # A damaged byte in the middle of the largest tensor (the first rank's span).
    cp "$f" "$f.good"
    printf '\xff' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") / 4 )) conv=notrunc status=none
    mpi 3 fail-crc-x "$f"
    cp "$f.good" "$f"
    set +e
    mpi 3 kill-x "$f" >"$WORK/kill.log" 2>&1
    rc=$?
    set -e
    if ((rc == 0 || rc == 124)); then
      cat "$WORK/kill.log"; echo "FAIL: the job with a killed rank exited $rc (124: it hung)"; exit 1
    fi
    echo "the killed job ended as expected (exit $rc): $(grep -m1 -i 'signal\|killed\|exited' "$WORK/kill.log" || true)"
    mpi 3 whole-x "$f"  # the file is untouched: the next group load succeeds
    ;;
  s3)
    [[ -n "${CKPTIO_S3_BUCKET:-}" ]] || { echo "FAIL: the s3 scenario runs under tests/s3/weed_server.py"; exit 1; }
    url="s3://$CKPTIO_S3_BUCKET/dist/ckpt"
    mpi 4 save "$url" 1
    for n in 1 3; do mpi "$n" load "$url" 1; done
    if mpi 4 kill-rank 2 "$url" 2 >"$WORK/kill.log" 2>&1; then
      cat "$WORK/kill.log"; echo "FAIL: the job with a killed rank exited 0"; exit 1
    fi
    mpi 1 load "$url" 1  # the killed save published nothing
    mpi 2 save "$url" 3
    "$(dirname "$0")/../../.venv/bin/python" - <<'EOF'
import os, sys, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
open_ = s3.list_multipart_uploads(Bucket=os.environ["CKPTIO_S3_BUCKET"], Prefix="dist/").get("Uploads", [])
print(f"multipart uploads open under dist/: {len(open_)}")
sys.exit(1 if open_ else 0)
EOF
    "$CLI" verify "$url" | tee "$WORK/verify.txt"
    grep -q "7 tensors, 7 checked, 0 unchecked" "$WORK/verify.txt" || { echo "FAIL: verify count"; exit 1; }
    "$CLI" convert "$url" "$WORK/one.safetensors"
    mpi 1 load "$WORK/one.safetensors" 3
    ;;
  *) echo "unknown scenario $SCENARIO"; exit 2 ;;
esac
echo "PASS: $SCENARIO"
