#!/usr/bin/env bash
# torch.distributed.checkpoint directories through the `ckptio` command, on
# the checkpoints torch wrote for the unit tests (tests/unit/data/dcp_2ranks,
# and the same through DCP's zstd extension): inspect lists the tensors,
# their chunks and the files; verify checks each chunk's zip CRC-32 and says
# DCP records none of its own; convert consolidates into one safetensors or
# .pt file and into a Hugging Face set; a flipped byte and a hostile
# .metadata are refused with exit 1 and the reason. Runs in the sanitizer
# builds too (the interop test with the real torch does not).
# Usage: test_cli_dcp.sh PATH/TO/ckptio SOURCE_DIR
set -u
CKPTIO=${1:?usage: test_cli_dcp.sh PATH/TO/ckptio SOURCE_DIR}
SRC=${2:?usage: test_cli_dcp.sh PATH/TO/ckptio SOURCE_DIR}
T=$(mktemp -d "${PWD}/cli-dcp-test.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
. "$(dirname "${BASH_SOURCE[0]}")/checks.sh"

for kind in dcp_2ranks dcp_2ranks_zstd; do
  D=$SRC/tests/unit/data/$kind
  expect 0 "inspect $kind" "$CKPTIO" inspect "$D"
  mentions "inspect $kind" "format       dcp"
  mentions "inspect $kind" "files        2"
  mentions "inspect $kind" "__1_0.distcp"
  mentions "inspect $kind" "row .*2 parts"
  mentions "inspect $kind" "__dcp_bytes__.extra.step"
  expect 0 "verify $kind" "$CKPTIO" verify "$D"
  mentions "verify $kind" "^OK .*4 tensors, 3 checked, 1 unchecked"
  mentions "verify $kind" "records no checksums"
  expect 0 "convert $kind to safetensors" "$CKPTIO" convert "$D" "$T/$kind.safetensors"
  expect 0 "verify the converted $kind" "$CKPTIO" verify "$T/$kind.safetensors"
  mentions "verify the converted $kind" "^OK .*4 tensors, 4 checked"
  expect 0 "convert $kind to .pt" "$CKPTIO" convert "$D" "$T/$kind.pt"
  expect 0 "convert $kind to a set" "$CKPTIO" convert --max-shard-size 200 "$D" "$T/$kind-set"
  expect 0 "verify the $kind set" "$CKPTIO" verify "$T/$kind-set"
done
# The converted file holds row = arange(24) as float32 (bytes 0..11 of it: 0.0, 1.0, 2.0).
"$CKPTIO" inspect --json "$T/dcp_2ranks.safetensors" | python3 -c '
import json, sys
d = json.load(sys.stdin)
t = {x["name"]: x for x in d["tensors"]}
assert t["row"]["shape"] == [6, 4] and t["row"]["dtype"] == "F32", t["row"]
assert t["col"]["shape"] == [3, 6] and t["col"]["dtype"] == "I32", t["col"]
' && pass "converted shapes and dtypes" || fail "converted shapes and dtypes"
python3 - "$T/dcp_2ranks.safetensors" <<'PY' && pass "converted values" || fail "converted values"
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
def vals(name, fmt):
    s, e = h[name]["data_offsets"]
    return list(struct.unpack("<%d%s" % ((e - s) // 4, fmt), b[8 + n + s:8 + n + e]))
assert vals("row", "f") == [float(i) for i in range(24)]
assert vals("col", "i") == list(range(18))
PY

# A flipped byte in row's first chunk (its float 8.0 = 00 00 00 41).
mkdir "$T/bad" && cp "$SRC/tests/unit/data/dcp_2ranks/".metadata "$SRC/tests/unit/data/dcp_2ranks/"__* "$T/bad/"
python3 - "$T/bad/__0_0.distcp" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
at = b.find(bytes([0, 0, 0, 0x41]))
b[at] ^= 1
open(p, "wb").write(bytes(b))
PY
expect 1 "verify (flipped byte)" "$CKPTIO" verify "$T/bad"
mentions "verify (flipped byte)" "row@\[0, 0\].*checksum mismatch"
expect 1 "convert (flipped byte)" "$CKPTIO" convert "$T/bad" "$T/bad.safetensors"
[ ! -e "$T/bad.safetensors" ] && pass "nothing written from a corrupt input" || fail "bad.safetensors exists"

# A .metadata that would run os.system: refused, nothing run.
mkdir "$T/evil" && cp "$SRC/tests/unit/data/dcp_2ranks/"__* "$T/evil/"
python3 - "$T/evil/.metadata" "$T/ran" <<'PY'
import sys
cmd = ("touch " + sys.argv[2]).encode()
open(sys.argv[1], "wb").write(b"\x80\x02cos\nsystem\nX" + len(cmd).to_bytes(4, "little") + cmd + b"\x85R.")
PY
expect 1 "inspect (os.system in .metadata)" "$CKPTIO" inspect "$T/evil"
mentions "inspect (os.system in .metadata)" "os.system' is not allowed"
[ ! -e "$T/ran" ] && pass "the command did not run" || fail "the pickle ran its command"

finish_checks
