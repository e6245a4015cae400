#!/usr/bin/env bash
# Tiered checkpoints (ckptio_tiers_*) over real MPI processes: 4 ranks as 2
# machines of 2 (tests/dist/tiers_driver.c), each machine's memory tier its
# own directory WORK/node<n>/shm, the durable tier WORK/durable. Memory
# keeps 2 steps, 1 peer copy on the other machine, durable every 2nd step.
#   tiers.sh DRIVER WORKDIR MODE CLI    (MODE: sync or background; CLI: the ckptio command)
# In background mode every save returns at its snapshot point and the
# handle's thread fills the tiers (TIERS_BACKGROUND). Exits 77 (skip) when
# mpirun is missing.
set -euo pipefail
DRIVER="$1" WORK="$2" MODE="$3" CLI="$4"
[ "$MODE" = background ] && export TIERS_BACKGROUND=1
. "$(dirname "$0")/tiers_common.sh"
mpi() { tiers_run 4 "$WORK" "$@"; }
rm -rf "$WORK"
mkdir -p "$WORK"
steps() { ls "$1" 2>/dev/null | tr '\n' ' '; }

echo "== steps 1-3: memory keeps 2, durable every 2nd"
mpi save 1 3
[ "$(steps "$WORK/node0/shm")" = "step-00000002 step-00000003 " ] || fail "memory holds $(steps "$WORK/node0/shm")"
[ "$(steps "$WORK/durable")" = "step-00000002 " ] || fail "durable holds $(steps "$WORK/durable")"
ls "$WORK/node1/shm/step-00000003" | grep -q "copy-00000" || fail "node1 holds no copy of rank 0"
"$CLI" tiers --verify "$WORK/node1/shm" "$WORK/durable" | tee "$WORK/tiers.txt"
[ "$(grep -c ' verified ' "$WORK/tiers.txt")" = 12 ] || fail "ckptio tiers: not 2 x (2 parts + 2 copies) + 4 durable parts verified"
grep -q "^3  *copy  *0 .*verified .*node1/shm/step-00000003/copy-00000.safetensors" "$WORK/tiers.txt" || fail "ckptio tiers: no copy of rank 0 on node 1"

echo "== a rank SIGKILLed at each point of a save's publication in each tier: the restart restores a whole step"
# Step 4 is due in every tier (durable every 2nd). Killed once its parts are
# written, nothing of step 4 is agreed: step 3, from memory. Killed later,
# step 4 is whole where it was agreed (memory's publication comes first),
# so the restart takes step 4 or, where not every rank marked it, step 3.
points="written agreed-memory marked-memory"
[ "$MODE" = sync ] && points="$points agreed-peers marked-peers agreed-durable marked-durable"
for point in $points; do
  if CKPTIO_FAULT_TIERS_KILL=$point:1 mpi save 4 4 >"$WORK/kill-$point.log" 2>&1; then
    cat "$WORK/kill-$point.log"; fail "the job whose rank 1 was killed ($point) exited 0"
  fi
  if [ $point = written ]; then
    mpi restore 3 mmmm | tee "$WORK/restore-$point.log"
  else
    mpi restore 0 '????' | tee "$WORK/restore-$point.log"
  fi
  grep -q "restored step [34] " "$WORK/restore-$point.log" || fail "after the kill at $point: not step 3 or 4"
done
echo "== the job goes on: steps 4-7"
mpi save 4 7
[ "$(steps "$WORK/durable")" = "step-00000004 step-00000006 " ] || fail "durable holds $(steps "$WORK/durable")"

echo "== machine 1 lost (its memory wiped): its ranks restore from the copies on machine 0, 0 bytes from disk"
rm -rf "$WORK/node1"
mpi restore 7 mmpp

echo "== steps 8-9, then rank 0's part in memory damaged: the copy on machine 1 serves"
mpi save 8 9
f="$WORK/node0/shm/step-00000009/rank-00000.safetensors"
printf '\xff' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") - 100 )) conv=notrunc status=none
if "$CLI" tiers --verify "$WORK/node0/shm" >"$WORK/tiers-bad.txt"; then cat "$WORK/tiers-bad.txt"; fail "ckptio tiers --verify exited 0 with a damaged part"; fi
grep -q "^9  *part  *0 .*CORRUPT .*rank-00000.safetensors.*checksum" "$WORK/tiers-bad.txt" || { cat "$WORK/tiers-bad.txt"; fail "ckptio tiers does not name the damaged part"; }
mpi restore 9 pmmm 2>"$WORK/warn1.log"
grep -q "rank 0 warning: .*rank 0, step 9, memory: skipped" "$WORK/warn1.log" || { cat "$WORK/warn1.log"; fail "no warning naming rank 0, step 9, memory"; }

echo "== both copies of rank 0's step 9 bad (damaged, torn): step 8, never the bad bytes"
printf '\xff' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") - 100 )) conv=notrunc status=none
c="$WORK/node1/shm/step-00000009/copy-00000.safetensors"
truncate -s $(( $(stat -c %s "$c") / 2 )) "$c"
mpi restore 8 mmmm 2>"$WORK/warn2.log"
grep -q "rank 0, step 9, a peer's copy (held by rank 2): skipped" "$WORK/warn2.log" || { cat "$WORK/warn2.log"; fail "no warning naming the torn copy"; }

echo "== both machines' memory lost: the newest durable step, nothing newer claimed"
rm -rf "$WORK/node0" "$WORK/node1"
mpi restore 8 dddd

echo "== the durable step damaged for rank 3: the older durable step"
f="$WORK/durable/step-00000008/rank-00003.safetensors"
printf '\xff' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") - 100 )) conv=notrunc status=none
rm -rf "$WORK/node0" "$WORK/node1"
mpi restore 6 dddd 2>"$WORK/warn3.log"
grep -q "rank 3, step 8, the durable tier: skipped" "$WORK/warn3.log" || { cat "$WORK/warn3.log"; fail "no warning naming rank 3's durable part"; }

echo "== everything lost: restore says so on every rank"
rm -rf "$WORK/node0" "$WORK/node1" "$WORK/durable"
mpi none
echo "== saved with places (rows of global tensors): restored at 4 ranks as parts, at 2, 3 and 1 from the durable tier"
P="$WORK/placed"
mpin() { local n=$1; shift; tiers_run "$n" "$P" "$@"; }
mpin 4 save-placed 1 4
[ -f "$P/durable/step-00000004/model.safetensors.index.json" ] || fail "no multi-rank checkpoint at durable step 4: $(ls "$P/durable/step-00000004")"
rm -rf "$P/node0" "$P/node1"
mpin 4 restore 4 dddd
restores_at_sizes "$P" 4 2 3 1
f="$P/durable/step-00000004/model-00002-of-00004.safetensors"
printf '\xff' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") - 100 )) conv=notrunc status=none
"$CLI" tiers --verify "$P/durable" >"$WORK/tiers-placed.txt" && fail "ckptio tiers --verify exited 0 with a damaged file"
grep -q "^4  *part  *1 .*CORRUPT .*model-00002-of-00004.safetensors" "$WORK/tiers-placed.txt" || { cat "$WORK/tiers-placed.txt"; fail "ckptio tiers does not name the damaged file"; }
mpin 3 restore-global 2 2>"$WORK/warn-global.log"
grep -q "rank 1 warning: .*rank 1, step 4, the durable tier: skipped: .*model-00002-of-00004" "$WORK/warn-global.log" ||
  { cat "$WORK/warn-global.log"; fail "no warning naming the damaged file of step 4"; }
echo "PASS: tiers $MODE"
