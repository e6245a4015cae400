#!/usr/bin/env bash
# The `ckptio` command end to end: a checkpoint made by `bench --keep` must
# inspect and verify clean, a flipped data byte and a truncation must fail
# verify with exit 1 and say why, and bench must run in its main variants.
# Usage: test_cli.sh PATH/TO/ckptio
set -u
CKPTIO=${1:?usage: test_cli.sh PATH/TO/ckptio}
T=$(mktemp -d "${PWD}/cli-test.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
fails=0

pass() { echo "ok   $1"; }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }
# expect CODE NAME -- runs the rest, keeps stdout+stderr in $T/out
expect() {
  local want=$1 name=$2
  shift 2
  "$@" >"$T/out" 2>"$T/err"
  local got=$?
  cat "$T/err" >>"$T/out"
  if [ "$got" -eq "$want" ]; then pass "$name (exit $got)"; else
    fail "$name: exit $got, expected $want"; sed 's/^/     | /' "$T/out"; fi
}
mentions() {
  if grep -qi -- "$2" "$T/out"; then pass "$1 mentions '$2'"; else
    fail "$1 does not mention '$2'"; sed 's/^/     | /' "$T/out"; fi
}
# flip_byte FILE OFFSET: inverts one byte in place
flip_byte() {
  local v
  v=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
  printf "\\$(printf %03o $((v ^ 255)))" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}

F=$T/model.safetensors
expect 0 "bench --size 64MiB --runs 1 --keep" "$CKPTIO" bench --size 64MiB --runs 1 --keep "$F"
mentions "bench table" "save / raw write"
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

expect 0 "verify (intact)" "$CKPTIO" verify "$F"
mentions "verify (intact)" "^OK"
if [ -s "$T/err" ]; then fail "verify wrote to stderr though it is not a terminal"; else
  pass "nothing on stderr when it is not a terminal"; fi

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
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["save_vs_raw_write"]["median"]>0' \
    "$T/out" 2>/dev/null && pass "bench --json parses" || fail "bench --json is not the expected JSON"
fi
leftover=$(find "$T" -name '.ckptio-bench-*' | wc -l)
[ "$leftover" -eq 0 ] && pass "no scratch files left" || fail "$leftover scratch files left in $T"

if [ "$fails" -ne 0 ]; then echo "$fails checks failed"; exit 1; fi
echo "all checks passed"
