#!/usr/bin/env bash
# Sharded checkpoints through the `ckptio` command: convert a file into a
# Hugging Face set and back (same tensors, same CRCs), inspect and verify the
# set by its index and by its directory, and refuse a corrupt shard, a
# hostile index and an ambiguous directory with exit 1 and the reason.
# Usage: test_cli_shard.sh PATH/TO/ckptio
set -u
CKPTIO=${1:?usage: test_cli_shard.sh PATH/TO/ckptio}
T=$(mktemp -d "${PWD}/cli-shard-test.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
. "$(dirname "${BASH_SOURCE[0]}")/checks.sh"
# name:crc pairs of every tensor, sorted, from inspect --json
tensor_crcs() {
  "$CKPTIO" inspect --json "$1" | python3 -c 'import json,sys
d = json.load(sys.stdin)
for t in sorted(d["tensors"], key=lambda t: t["name"]): print(t["name"], t["crc32"])'
}

F=$T/model.safetensors
expect 0 "bench --keep (the input)" "$CKPTIO" bench --size 16MiB --runs 1 --keep "$F"
expect 0 "convert --max-shard-size 4MiB" "$CKPTIO" convert "$F" "$T/set" --max-shard-size 4MiB
mentions "convert --max-shard-size" "5 shards"
n=$(ls "$T/set" | wc -l)
[ "$n" -eq 6 ] && pass "5 shards and an index, no temp file" || { fail "$n files in the set"; ls -la "$T/set"; }
[ -f "$T/set/model-00001-of-00005.safetensors" ] && [ -f "$T/set/model.safetensors.index.json" ] &&
  pass "Hugging Face file names" || fail "unexpected names: $(ls "$T/set")"

expect 0 "inspect DIR" "$CKPTIO" inspect "$T/set"
mentions "inspect DIR" "safetensors-sharded"
mentions "inspect DIR" "model-00003-of-00005.safetensors"
mentions "inspect DIR" "shards       5"
expect 0 "inspect --json INDEX" "$CKPTIO" inspect --json "$T/set/model.safetensors.index.json"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert len(d["shards"]) == 5 and all(t["shard"] >= 1 for t in d["tensors"])' \
  "$T/out" && pass "inspect --json lists shards" || fail "inspect --json has no shards"
expect 0 "verify INDEX" "$CKPTIO" verify "$T/set/model.safetensors.index.json"
mentions "verify INDEX" "^OK"
mentions "verify INDEX" "shard 5/5"
expect 0 "verify DIR" "$CKPTIO" verify "$T/set"

expect 0 "convert the set back to one file" "$CKPTIO" convert "$T/set" "$T/back.safetensors"
if command -v python3 >/dev/null; then
  if [ "$(tensor_crcs "$F")" = "$(tensor_crcs "$T/back.safetensors")" ]; then pass "round trip keeps every tensor's CRC"
  else fail "round trip changed the tensors"; fi
fi
expect 0 "convert the set to .pt" "$CKPTIO" convert "$T/set" "$T/back.pt"

# Corrupt one data byte at the end of shard 3: verify names the shard.
S3=$T/set/model-00003-of-00005.safetensors
size=$(stat -c %s "$S3")
printf '\xff' | dd of="$S3" bs=1 seek=$((size - 10)) conv=notrunc status=none
expect 1 "verify (corrupt shard 3)" "$CKPTIO" verify "$T/set"
mentions "verify (corrupt shard 3)" "model-00003-of-00005.safetensors"
mentions "verify (corrupt shard 3)" "checksum"

mkdir "$T/bad"
cp "$T/set/model-00001-of-00005.safetensors" "$T/bad/"
printf '{"weight_map": {"x": "../model.safetensors"}}' >"$T/bad/model.safetensors.index.json"
expect 1 "inspect (index escaping its directory)" "$CKPTIO" inspect "$T/bad"
mentions "inspect (index escaping its directory)" "contains '/'"
printf '{"weight_map": {"x": "model-00001-of-00005.safetensors"}}' >"$T/bad/model.safetensors.index.json"
expect 1 "verify (tensor missing from its shard)" "$CKPTIO" verify "$T/bad/model.safetensors.index.json"
mentions "verify (tensor missing from its shard)" "which does not hold it"
cp "$T/bad/model.safetensors.index.json" "$T/bad/other.safetensors.index.json"
expect 1 "inspect (two indexes in a directory)" "$CKPTIO" inspect "$T/bad"
mentions "inspect (two indexes in a directory)" "other.safetensors.index.json"
expect 0 "bench --max-shard-size" "$CKPTIO" bench --size 16MiB --runs 1 --max-shard-size 4MiB --json --dir "$T"
python3 -c 'import json,sys; d=json.loads(open(sys.argv[1]).readline()); assert d["shards"] >= 4 and d["sharded_save_gbps"]["median"] > 0' \
  "$T/out" && pass "bench reports the sharded save" || fail "bench --json has no sharded save"
leftover=$(find "$T" -maxdepth 1 -name '.ckptio-bench-*' | wc -l)
[ "$leftover" -eq 0 ] && pass "bench left no scratch files" || fail "$leftover scratch files left in $T"
expect 2 "convert --max-shard-size 0" "$CKPTIO" convert "$F" "$T/x" --max-shard-size 0

finish_checks
