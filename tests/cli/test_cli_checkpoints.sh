#!/usr/bin/env bash
# `ckptio checkpoints DIR` over a checkpoint manager's directory (made by the
# manager's crash driver): the table, --verify, --json, a corrupt and an
# incomplete checkpoint reported with exit 1, a missing DIR refused and not
# created.
# Usage: test_cli_checkpoints.sh PATH/TO/ckptio PATH/TO/crash_driver
set -u
CKPTIO=${1:?usage: test_cli_checkpoints.sh PATH/TO/ckptio PATH/TO/crash_driver}
DRIVER=${2:?usage: test_cli_checkpoints.sh PATH/TO/ckptio PATH/TO/crash_driver}
T=$(mktemp -d "${PWD}/cli-checkpoints-test.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
. "$(dirname "${BASH_SOURCE[0]}")/checks.sh"
mentions() {
  if grep -qE -- "$2" "$T/out"; then pass "$1 mentions '$2'"; else
    fail "$1 does not mention '$2'"; sed 's/^/     | /' "$T/out"; fi
}

D=$T/ckpts
expect 0 "three saves, keep 2" "$DRIVER" save "$D" --keep 2 --steps 3
expect 0 "checkpoints" "$CKPTIO" checkpoints "$D"
mentions "checkpoints" "^2 .* complete .*step-00000002/model.safetensors"
mentions "checkpoints" "^3 .* complete"
mentions "checkpoints" "resume: step 3 "
n=$(grep -c "^[0-9]" "$T/out")
[ "$n" -eq 2 ] && pass "two checkpoints listed" || fail "$n checkpoints listed"
expect 0 "checkpoints --verify" "$CKPTIO" checkpoints "$D" --verify
mentions "checkpoints --verify" "^3 .* verified"
expect 0 "checkpoints --json" "$CKPTIO" checkpoints --json "$D"
if python3 -c 'import json,sys
d = json.load(open(sys.argv[1]))
assert [c["step"] for c in d["checkpoints"]] == [2, 3], d
assert d["resume"]["step"] == 3 and all(c["complete"] for c in d["checkpoints"]), d' "$T/out"; then
  pass "--json parses, steps 2 and 3, resume 3"; else fail "--json"; cat "$T/out"; fi

# A flipped data byte: complete (the header is fine) but CORRUPT on --verify,
# and the resume falls back to step 2.
f=$D/step-00000003/model.safetensors
size=$(stat -c %s "$f")
printf '\xff' | dd of="$f" bs=1 seek=$((size - 5)) conv=notrunc status=none
expect 0 "checkpoints (corrupt data, no --verify)" "$CKPTIO" checkpoints "$D"
expect 1 "checkpoints --verify (corrupt data)" "$CKPTIO" checkpoints "$D" --verify
mentions "checkpoints --verify" "^3 .* CORRUPT .*t[0-9]"
mentions "checkpoints --verify" "resume: step 2 "
# An empty step directory: incomplete.
mkdir "$D/step-00000009"
expect 1 "checkpoints (incomplete)" "$CKPTIO" checkpoints "$D"
mentions "checkpoints (incomplete)" "^9 .* INCOMPLETE"
mentions "checkpoints (incomplete)" "resume: step 3 "
# Missing directory: refused, not created.
expect 2 "checkpoints of a missing dir" "$CKPTIO" checkpoints "$T/nothing"
[ ! -e "$T/nothing" ] && pass "missing dir not created" || fail "missing dir was created"
expect 2 "checkpoints --bogus" "$CKPTIO" checkpoints --bogus "$D"
expect 0 "help checkpoints" "$CKPTIO" help checkpoints

finish_checks
