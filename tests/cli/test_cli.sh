#!/usr/bin/env bash
# The `ckptio` command end to end: a checkpoint made by `bench --keep` must
# inspect and verify clean, a flipped data byte and a truncation must fail
# verify with exit 1 and say why, and bench must run in its main variants:
# both formats, and --device cuda:0 over the fake CUDA runtime when its path
# is given (without it that part is skipped, loudly).
# Usage: test_cli.sh PATH/TO/ckptio [PATH/TO/fake/libcudart.so.13]
set -u
CKPTIO=${1:?usage: test_cli.sh PATH/TO/ckptio [PATH/TO/fake/libcudart.so.13]}
FAKE_CUDART=${2:-}
T=$(mktemp -d "${PWD}/cli-test.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
. "$(dirname "${BASH_SOURCE[0]}")/checks.sh"
# flip_byte FILE OFFSET: inverts one byte in place
flip_byte() {
  local v
  v=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
  printf "\\$(printf %03o $((v ^ 255)))" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}

F=$T/model.safetensors
expect 0 "bench --size 64MiB --runs 1 --keep" "$CKPTIO" bench --size 64MiB --runs 1 --keep "$F"
mentions "bench table" "save / raw write"
# The raw limits are the best of several ways, each reported (issue 26).
mentions "bench table" "raw read buffered 16x8M"
mentions "bench table" "raw read O_DIRECT 64x8M"
mentions "bench table" "raw read (best)"
mentions "bench table" "raw write buffered+sync"
if [ -s "$F" ]; then pass "--keep left the checkpoint"; else
  fail "--keep left no file at $F; the rest needs it"; exit 1; fi
leftover=$(find "$T" -name '.ckptio-bench-*' | wc -l)
[ "$leftover" -eq 0 ] && pass "no scratch files left" || fail "$leftover scratch files left in $T"

expect 0 "inspect" "$CKPTIO" inspect "$F"
mentions "inspect" "safetensors"
mentions "inspect" "model.embed_tokens.weight"
mentions "inspect" "data start"
expect 0 "inspect --json" "$CKPTIO" inspect --json "$F"
if command -v python3 >/dev/null; then
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["tensor_count"]==len(d["tensors"])>0' \
    "$T/out" && pass "inspect --json parses" || fail "inspect --json is not valid JSON"
fi

# --plan: 3 ranks of the embedding split on dim 1; their ranges tile it.
expect 0 "inspect --plan" "$CKPTIO" inspect "$F" --plan model.embed_tokens.weight:1:3
mentions "inspect --plan" "torch.chunk"
mentions "inspect --plan" "^2 "
expect 0 "inspect --plan --json" "$CKPTIO" inspect "$F" --plan model.embed_tokens.weight:1:3 --json
if command -v python3 >/dev/null; then
  cp "$T/out" "$T/plan.json"
  "$CKPTIO" inspect --json "$F" >"$T/inspect.json"
  python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))
t = [x for x in json.load(open(sys.argv[2]))["tensors"] if x["name"] == p["tensor"]][0]
rs = sorted((o, n) for r in p["ranks"] for _, o, n in r["ranges"])
assert [r["start"] for r in p["ranks"]][0] == 0 and p["ranks"][-1]["stop"] == t["shape"][1]
assert sum(r["nbytes"] for r in p["ranks"]) == t["nbytes"] == sum(n for _, n in rs)
assert rs[0][0] == t["offset"] and all(a + n == b for (a, n), (b, _) in zip(rs, rs[1:]))
' "$T/plan.json" "$T/inspect.json" && pass "inspect --plan ranges tile the tensor" ||
    fail "inspect --plan ranges do not tile the tensor"
fi
expect 2 "inspect --plan bad spec" "$CKPTIO" inspect "$F" --plan model.embed_tokens.weight:x:3
mentions "inspect --plan bad spec" "NAME:DIM:N"
expect 2 "inspect --plan one colon" "$CKPTIO" inspect "$F" --plan w:3
expect 2 "inspect --plan empty name" "$CKPTIO" inspect "$F" --plan :1:3
expect 2 "inspect --plan bad dim" "$CKPTIO" inspect "$F" --plan model.embed_tokens.weight:5:3
mentions "inspect --plan bad dim" "no dim 5"

expect 0 "verify (intact)" "$CKPTIO" verify "$F"
mentions "verify (intact)" "^OK"
if [ -s "$T/err" ]; then fail "verify wrote to stderr though it is not a terminal"; else
  pass "nothing on stderr when it is not a terminal"; fi

# Traces (issue 44): bench --trace and CKPTIO_TRACE each leave a complete
# Chrome trace-event file holding the stages that ran.
# has_stages NAME FILE STAGE...: FILE is a JSON array with those X events
has_stages() {
  local name=$1
  shift
  if python3 - "$@" <<'PY'
import json, sys
events = json.load(open(sys.argv[1]))
seen = {e["name"] for e in events if e["ph"] == "X"}
named = {e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
assert all(e["tid"] in named and e["dur"] >= 0 for e in events if e["ph"] == "X"), "a thread not named"
missing = [s for s in sys.argv[2:] if s not in seen]
assert not missing, "missing stages: %s (seen %s)" % (missing, sorted(seen))
PY
  then pass "$name: a valid trace with its stages"; else fail "$name: not a valid trace with its stages"; fi
}
if command -v python3 >/dev/null; then
  expect 0 "bench --trace" "$CKPTIO" bench --size 16MiB --runs 1 --dir "$T" --trace "$T/bench-trace.json"
  has_stages "bench --trace" "$T/bench-trace.json" save save.snapshot save.crc save.write save.header save.commit \
    load load.open load.read load.check
  expect 0 "verify with CKPTIO_TRACE" env CKPTIO_TRACE="$T/verify-trace.json" "$CKPTIO" verify "$F"
  has_stages "CKPTIO_TRACE" "$T/verify-trace.json" load.open load load.read
fi
expect 2 "bench --trace into a missing directory" "$CKPTIO" bench --size 8MiB --runs 1 --dir "$T" --trace "$T/no/trace.json"
mentions "bench --trace into a missing directory" "--trace $T/no/trace.json"

# One byte in the middle of the embedding, found from the inspect table.
off=$("$CKPTIO" inspect "$F" | awk '$1 == "model.embed_tokens.weight" { print $(NF - 2) }')
case "$off" in '' | *[!0-9]*) fail "no offset for model.embed_tokens.weight in inspect"; off=8 ;; esac
G=$T/flipped.safetensors
cp "$F" "$G"
flip_byte "$G" $((off + 12345))
expect 1 "verify (one byte flipped)" "$CKPTIO" verify "$G"
mentions "verify (one byte flipped)" "model.embed_tokens.weight"
mentions "verify (one byte flipped)" "checksum"

H=$T/truncated.safetensors
cp "$F" "$H"
truncate -s $(($(stat -c %s "$F") - 4096)) "$H"
expect 1 "verify (truncated)" "$CKPTIO" verify "$H"
mentions "verify (truncated)" "truncated"
expect 1 "inspect (truncated)" "$CKPTIO" inspect "$H"
head -c 5 "$F" >"$T/tiny"
expect 1 "verify (5-byte file)" "$CKPTIO" verify "$T/tiny"
mentions "verify (5-byte file)" "header too small"

expect 2 "verify (missing file)" "$CKPTIO" verify "$T/none"
expect 2 "verify (no argument)" "$CKPTIO" verify
expect 2 "bench --size bogus" "$CKPTIO" bench --size 12XB
expect 2 "bench --load bogus" "$CKPTIO" bench --load fast
expect 2 "unknown command" "$CKPTIO" frobnicate
expect 0 "bench --help" "$CKPTIO" bench --help
mentions "bench --help" "--keep"

N=$T/nocrc.safetensors
expect 0 "bench --no-crc" "$CKPTIO" bench --size 16MiB --runs 1 --no-crc --dir "$T" --keep "$N"
expect 0 "verify (no CRC recorded)" "$CKPTIO" verify "$N"
mentions "verify (no CRC recorded)" "0 checked"
expect 0 "bench --load mmap --verify" "$CKPTIO" bench --size 16MiB --runs 2 --load mmap --verify --dir "$T"
expect 0 "bench --load direct --verify" "$CKPTIO" bench --size 16MiB --runs 1 --load direct --verify --dir "$T"
expect 0 "bench --shapes linear --json" "$CKPTIO" bench --shapes linear --size 8MiB --runs 1 --no-fsync --json --dir "$T"
if command -v python3 >/dev/null; then
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["save_vs_raw_write"]["median"]>0 and d["raw_read_thp_gbps"]["median"]>0' \
    "$T/out" 2>/dev/null && pass "bench --json parses" || fail "bench --json is not the expected JSON"
  # Each run's raw limit is the fastest of its ways, every way measured.
  python3 -c 'import json,sys
d=json.load(open(sys.argv[1]))
assert len(d["raw"]["read_ways"])==4 and len(d["raw"]["write_ways"])==2
for x in d["runs"]:
    assert all(s>0 for s in x["raw_read_ways_s"]+x["raw_write_ways_s"])
    assert x["raw_read_s"]==min(x["raw_read_ways_s"]) and x["raw_write_s"]==min(x["raw_write_ways_s"])' \
    "$T/out" 2>/dev/null && pass "bench --json: raw limits are the best of their ways" \
    || fail "bench --json: raw_read_s / raw_write_s are not the best of raw_*_ways_s"
fi
expect 0 "bench --format pt" "$CKPTIO" bench --format pt --size 32MiB --runs 1 --dir "$T"
mentions "bench --format pt" "format    pt"
mentions "bench --format pt" "copy + CRC"
expect 2 "bench --format bogus" "$CKPTIO" bench --format npz

# No GPU: a runtime that cannot be loaded must give exit 2 and the reason.
expect 2 "bench --device cuda:0 (no CUDA runtime)" \
  env CKPTIO_CUDART=/nonexistent/libcudart.so.13 "$CKPTIO" bench --device cuda:0 --size 8MiB --runs 1 --dir "$T"
mentions "bench --device cuda:0 (no CUDA runtime)" "CUDA unavailable"
# Without the driver the runtime is not even loaded (a fresh process saves
# 0.2-0.5 ms where a toolkit sits on a machine without a GPU): the reason
# names the missing driver.
if command -v python3 >/dev/null && ! python3 -c 'import ctypes; ctypes.CDLL("libcuda.so.1")' 2>/dev/null; then
  expect 2 "bench --device cuda:0 (no NVIDIA driver)" \
    env -u CKPTIO_CUDART "$CKPTIO" bench --device cuda:0 --size 8MiB --runs 1 --dir "$T"
  mentions "bench --device cuda:0 (no NVIDIA driver)" "CUDA unavailable: no NVIDIA driver: libcuda.so.1"
else
  echo "skip bench --device cuda:0 (no NVIDIA driver): this machine has a driver, or no python3 to tell"
fi
expect 2 "bench --device bogus" "$CKPTIO" bench --device gpu0

if [ -z "$FAKE_CUDART" ]; then
  echo "skip bench --device cuda:0: no fake CUDA runtime path given (built only with the CUDA toolkit headers)"
elif [ ! -e "$FAKE_CUDART" ]; then
  fail "fake CUDA runtime $FAKE_CUDART does not exist"
else
  # Leak reporting on: the bench must free every device buffer, stream and
  # registration it made (the fake exits 3 otherwise). The fake writes its
  # counters at exit: every copy of the process, the bench's own uploads
  # included, must come from pinned memory, as a user's would.
  expect 0 "bench --device cuda:0 --verify (fake runtime)" \
    env CKPTIO_CUDART="$FAKE_CUDART" FAKE_CUDART_DEVICES=2 FAKE_CUDART_REPORT_LEAKS=1 \
    FAKE_CUDART_STATS_FILE="$T/fake-stats" \
    "$CKPTIO" bench --device cuda:0 --size 32MiB --runs 1 --verify --dir "$T"
  # The report names the GPU as the runtime does; the fake's name says it is not one.
  mentions "bench --device cuda:0" "on GPU    cuda:0: fake CUDA GPU (tests/fake_cudart), not a GPU"
  mentions "bench --device cuda:0" "pinned D2H"
  mentions "bench --device cuda:0" "host to device"
  stat_of() { awk -v k="$1" '$1 == k { print $2 }' "$T/fake-stats" 2>/dev/null; }
  pageable=$(stat_of pageable_copies) async=$(stat_of async_copies)
  if [ "$pageable" = 0 ] && [ "${async:-0}" -gt 0 ]; then
    pass "bench --device cuda:0: $async device copies, none from pageable memory"
  else
    fail "bench --device cuda:0: fake runtime counted pageable_copies '${pageable}', async_copies '${async}' (want 0 and > 0)"
  fi
  expect 0 "bench --device cuda:1 --format pt --json (fake runtime)" \
    env CKPTIO_CUDART="$FAKE_CUDART" FAKE_CUDART_DEVICES=2 FAKE_CUDART_REPORT_LEAKS=1 FAKE_CUDART_DELAY_US=50 \
    "$CKPTIO" bench --device cuda:1 --format pt --shapes linear --size 8MiB --runs 1 --verify --json --dir "$T"
  if command -v python3 >/dev/null; then
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert "not a GPU" in d["gpu_name"] and d["device"]=="cuda:1" and d["raw_h2d_gbps"]["median"]>0' \
      <(head -n 1 "$T/out") 2>/dev/null && pass "bench --device --json parses" || fail "bench --device --json is not the expected JSON"
  fi
  expect 2 "bench --device cuda:2 (two fake GPUs)" \
    env CKPTIO_CUDART="$FAKE_CUDART" FAKE_CUDART_DEVICES=2 "$CKPTIO" bench --device cuda:2 --size 8MiB --runs 1 --dir "$T"
  mentions "bench --device cuda:2 (two fake GPUs)" "no GPU 2"
fi
leftover=$(find "$T" -name '.ckptio-bench-*' | wc -l)
[ "$leftover" -eq 0 ] && pass "no scratch files left" || fail "$leftover scratch files left in $T"

finish_checks
