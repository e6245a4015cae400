#!/usr/bin/env bash
# The storage tier of tiered checkpoints over real MPI processes and a real
# S3 server (run under tests/s3/weed_server.py, which starts SeaweedFS on
# 127.0.0.1): 4 ranks as 2 machines of 2 (tests/dist/tiers_driver.c), each
# machine's memory tier its own directory, 1 peer copy on the other
# machine, the storage tier s3://BUCKET/tiers every 2nd step keeping 2.
#   tiers_storage.sh DRIVER WORKDIR CLI    (CLI: the ckptio command)
# Exits 77 (skip) when mpirun is missing.
set -euo pipefail
DRIVER="$1" WORK="$2" CLI="$3"
HERE="$(cd "$(dirname "$0")" && pwd)"
PY="$HERE/../../.venv/bin/python"
. "$HERE/tiers_common.sh"
[[ -n "${CKPTIO_S3_BUCKET:-}" ]] || fail "run under tests/s3/weed_server.py"
export TIERS_STORAGE="s3://$CKPTIO_S3_BUCKET/tiers"
mpi() { tiers_run 4 "$WORK" "$@"; }
# s3 ls PREFIX | flip KEY | tear KEY | uploads PREFIX: the bucket as boto3 sees it.
s3() {
  "$PY" - "$@" <<'EOF'
import os, sys, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
bucket, (what, arg) = os.environ["CKPTIO_S3_BUCKET"], sys.argv[1:3]
if what == "ls":
    keys = sorted(o["Key"] for p in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=arg)
                  for o in p.get("Contents", []))
    print(" ".join(k[len(arg):] for k in keys))
elif what in ("flip", "tear"):
    body = bytearray(s3.get_object(Bucket=bucket, Key=arg)["Body"].read())
    if what == "flip":
        body[-100] ^= 0xFF
    else:
        del body[len(body) // 2:]
    s3.put_object(Bucket=bucket, Key=arg, Body=bytes(body))
elif what == "uploads":
    print(len(s3.list_multipart_uploads(Bucket=bucket, Prefix=arg).get("Uploads", [])))
EOF
}
parts() { echo "PUBLISHED rank-00000.safetensors rank-00001.safetensors rank-00002.safetensors rank-00003.safetensors"; }
rm -rf "$WORK"
mkdir -p "$WORK"

echo "== steps 1-5: the storage holds steps 2 and 4, every part and the mark"
mpi save 1 5
want="$(for s in 2 4; do for f in $(parts); do printf 'step-%08d/%s ' $s $f; done; done)"
[ "$(s3 ls tiers/) " = "$want" ] || fail "the storage holds: $(s3 ls tiers/)"

echo "== a rank SIGKILLed at each point of the storage's publication of step 6: a whole step restored"
# Killed once the parts are written (before any agreement), step 6 is not
# published in the storage; killed after the storage's agreement, rank 0
# may have marked it: every part is there then.
for point in written agreed-storage marked-storage; do
  if CKPTIO_FAULT_TIERS_KILL=$point:1 mpi save 6 6 >"$WORK/kill-$point.log" 2>&1; then
    cat "$WORK/kill-$point.log"; fail "the job whose rank 1 was killed ($point) exited 0"
  fi
  if [ $point = written ] && s3 ls tiers/step-00000006/ | grep -q PUBLISHED; then
    fail "step 6 published in the storage though a rank died before the mark"
  fi
  mpi restore 0 '????' | tee "$WORK/restore-$point.log"
  grep -q "restored step [56] " "$WORK/restore-$point.log" || fail "after the kill at $point: not step 5 or 6"
done

echo "== the job goes on: steps 6-7, the storage keeps 4 and 6"
mpi save 6 7
s3 ls tiers/ | grep -q "step-00000002" && fail "step 2 not retired: $(s3 ls tiers/)"
[ "$(s3 uploads tiers/)" = 0 ] || fail "multipart uploads left open under tiers/"
"$CLI" tiers --verify "$TIERS_STORAGE" | tee "$WORK/tiers.txt"
[ "$(grep -c ' verified ' "$WORK/tiers.txt")" = 8 ] || fail "ckptio tiers: not 2 steps x 4 parts verified"
grep -q "^6  *part  *3 .*verified .*$TIERS_STORAGE/step-00000006/rank-00003.safetensors" "$WORK/tiers.txt" ||
  fail "ckptio tiers: no rank 3 part of step 6 in the storage"

echo "== both machines lost (memory and copies wiped): every part from the storage, nothing newer claimed"
rm -rf "$WORK/node0" "$WORK/node1"
mpi restore 6 ssss | tee "$WORK/restore-s.log"
grep -q "storage 0 bytes" "$WORK/restore-s.log" && fail "a rank restored 0 bytes from the storage"
grep -q "from $WORK/node0/shm/step-00000006/rank-00000.safetensors" "$WORK/restore-s.log" ||
  fail "rank 0's part was not downloaded into its memory directory"

echo "== rank 3's object of step 6 damaged, rank 1's of step 4 torn: step 4 is bad too, so nothing"
rm -rf "$WORK/node0" "$WORK/node1"
s3 flip tiers/step-00000006/rank-00003.safetensors
mpi restore 4 ssss 2>"$WORK/warn-flip.log"
grep -q "rank 3, step 6, the storage: skipped" "$WORK/warn-flip.log" || { cat "$WORK/warn-flip.log"; fail "no warning naming rank 3's object"; }
rm -rf "$WORK/node0" "$WORK/node1"
s3 tear tiers/step-00000004/rank-00001.safetensors
mpi none 2>"$WORK/warn-tear.log"
grep -q "rank 1, step 4, the storage: skipped" "$WORK/warn-tear.log" || { cat "$WORK/warn-tear.log"; fail "no warning naming rank 1's torn object"; }

echo "== the storage alone (no memory tier), background saves: the restore hands out the object, verified"
TIERS_STORAGE="s3://$CKPTIO_S3_BUCKET/alone" TIERS_NO_MEMORY=1 TIERS_BACKGROUND=1 mpi save 1 4
TIERS_STORAGE="s3://$CKPTIO_S3_BUCKET/alone" TIERS_NO_MEMORY=1 mpi restore 4 ssss | tee "$WORK/restore-alone.log"
grep -q "from s3://$CKPTIO_S3_BUCKET/alone/step-00000004/rank-00002.safetensors" "$WORK/restore-alone.log" ||
  fail "rank 2 was not handed its object"
echo "== saved with places: the storage holds a multi-rank checkpoint, restored at 4 ranks as parts, at 2, 3 and 1"
P="$WORK/placed"
export TIERS_STORAGE="s3://$CKPTIO_S3_BUCKET/placed"
mpin() { local n=$1; shift; tiers_run "$n" "$P" "$@"; }
mpin 4 save-placed 1 4
# (a storage's file names carry the save's id: model-00001-of-00004-<id>.safetensors)
want="PUBLISHED $(for k in 1 2 3 4; do printf 'model-%05d-of-00004-ID.safetensors ' $k; done)model.safetensors.index.json"
[ "$(s3 ls placed/step-00000004/ | sed -E 's/-[0-9a-z]{8}\.safetensors/-ID.safetensors/g')" = "$want" ] ||
  fail "the storage's step 4 holds: $(s3 ls placed/step-00000004/)"
"$CLI" tiers --verify "$TIERS_STORAGE" | tee "$WORK/tiers-placed.txt"
[ "$(grep -c ' verified .*/model-0000[1-4]-of-00004-' "$WORK/tiers-placed.txt")" = 8 ] ||
  fail "ckptio tiers: not 2 steps x 4 files of the multi-rank checkpoints verified"
rm -rf "$P/node0" "$P/node1"
mpin 4 restore 4 ssss
restores_at_sizes "$P" 4 2 3 1
s3 flip "placed/step-00000004/$(s3 ls placed/step-00000004/ | tr ' ' '\n' | grep '^model-00002-of-00004')"
mpin 3 restore-global 2 2>"$WORK/warn-global.log"
grep -q "rank 1 warning: .*rank 1, step 4, the storage: skipped: .*model-00002-of-00004" "$WORK/warn-global.log" ||
  { cat "$WORK/warn-global.log"; fail "no warning naming the damaged object of step 4"; }
echo "PASS: tiers storage"
