#!/usr/bin/env bash
# A real full disk (issue 15 item 3): a tmpfs of 8 MiB holds one 4.6 MiB
# checkpoint but not a second beside it, so the second save of each kind
# (single, pt, sharded, zstd, ranks) runs out of space for its temp file
# while the first is still in place. It must fail with ENOSPC naming the
# file, leave the first checkpoint whole (every CRC checked, every byte the
# first save's), leave no temp file, and the checkpoint must still load.
# Mounting needs root or a user namespace (unshare -rm); otherwise the test
# skips (77) and says why. EIO: this machine has no device-mapper (no
# /dev/mapper/control), so failing reads and writes stay the injected ones
# of tests/unit/test_faults.cc.
#   enospc.sh KILL_DRIVER WORKDIR
set -euo pipefail
DRIVER="$1" WORK="$2"
MNT="$WORK/mnt"
if [[ "${ENOSPC_INNER:-}" != 1 ]]; then
  rm -rf "$WORK"
  mkdir -p "$MNT"
  if mount -t tmpfs -o size=8m ckptio-enospc "$MNT" 2>/dev/null; then
    trap 'umount "$MNT" 2>/dev/null || true' EXIT
    ENOSPC_INNER=1 MOUNTED=1 "$0" "$@"
    exit $?
  fi
  if command -v unshare >/dev/null && unshare -rm true 2>/dev/null; then
    exec unshare -rm env ENOSPC_INNER=1 "$0" "$@"
  fi
  echo "SKIP: cannot mount a tmpfs here (not root, and no user namespaces: unshare -rm failed)"
  exit 77
fi
[[ "${MOUNTED:-}" == 1 ]] || mount -t tmpfs -o size=8m ckptio-enospc "$MNT"
fail() { echo "FAIL: $*"; exit 1; }
for kind in single pt sharded zstd ranks; do
  case $kind in
    single) path="$MNT/$kind/model.safetensors" ;;
    pt) path="$MNT/$kind/model.pt" ;;
    zstd) path="$MNT/$kind/model.safetensors.zst" ;;
    *) path="$MNT/$kind" ;;
  esac
  rm -rf "${MNT:?}"/*
  mkdir -p "$MNT/$kind"
  if "$DRIVER" save "$kind" "$path" 2 >"$WORK/out.txt" 2>"$WORK/err.txt"; then
    fail "$kind: a second save fitted in 8 MiB ($(df -k "$MNT" | tail -1))"
  fi
  grep -q "durable 1" "$WORK/out.txt" || fail "$kind: the first save did not complete: $(cat "$WORK/err.txt")"
  grep -qi "no space left" "$WORK/err.txt" || fail "$kind: not ENOSPC: $(cat "$WORK/err.txt")"
  grep -q "$MNT/$kind" "$WORK/err.txt" || fail "$kind: the error does not name the file: $(cat "$WORK/err.txt")"
  "$DRIVER" check "$kind" "$path" >"$WORK/check.txt" || fail "$kind: $(cat "$WORK/check.txt")"
  grep -q "seq=1 strays=0" "$WORK/check.txt" || fail "$kind: after ENOSPC: $(cat "$WORK/check.txt")"
  echo "$kind: ENOSPC on the second save: $(head -c 200 "$WORK/err.txt" | tr '\n' ' ')"
  echo "$kind: the first checkpoint verifies and loads, no temp file left"
done
echo "PASS"
