#!/usr/bin/env bash
# ctest runs the interop tests through here so that a missing venv or package
# is a loud skip (exit 77, ctest's SKIP_RETURN_CODE), never a pass, and so
# that pytest's "no tests ran" (exit 5) is a failure.
# Usage: run_pytest.sh <python> [pytest args...]
set -u

PY="${1:?usage: run_pytest.sh <python> [pytest args...]}"
shift

if [[ ! -x "$PY" ]]; then
  echo "SKIP interop: no Python venv at $PY; run scripts/setup.sh to create it"
  exit 77
fi
# CKPTIO_PYTEST_NEEDS adds modules a test needs beyond these (e.g. torch).
for mod in numpy safetensors pytest ${CKPTIO_PYTEST_NEEDS:-}; do
  if ! out="$("$PY" -c "import $mod" 2>&1)"; then
    echo "SKIP interop: the venv at $PY cannot import $mod; run scripts/setup.sh"
    echo "$out" | tail -n 3
    exit 77
  fi
done

"$PY" -m pytest "$@"
rc=$?
case $rc in
  0) ;;
  5) echo "FAIL interop: pytest collected no tests"; exit 1 ;;
  77) echo "FAIL interop: pytest exited 77, which is not a skip here"; exit 1 ;;
  *) echo "FAIL interop: pytest exited $rc" ;;
esac
exit $rc
