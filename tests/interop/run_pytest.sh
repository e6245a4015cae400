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

# The modules are checked in the interpreter that then runs pytest: a
# separate interpreter per module imported each twice, and torch's import
# takes seconds. CKPTIO_PYTEST_NEEDS adds modules a test needs beyond these
# (e.g. torch). The skip is told apart from a pytest exit of 77 by the
# file the check writes before it exits.
skipped="$(mktemp)" || exit 1
trap 'rm -f "$skipped"' EXIT
"$PY" -c '
import importlib, os, sys, traceback
for mod in ["numpy", "safetensors", "pytest"] + os.environ.get("CKPTIO_PYTEST_NEEDS", "").split():
    try:
        importlib.import_module(mod)
    except BaseException:
        print(f"SKIP interop: the venv at {sys.executable} cannot import {mod}; run scripts/setup.sh")
        print("\n".join(traceback.format_exc().rstrip().splitlines()[-3:]))
        sys.stdout.flush()
        with open(sys.argv[1], "w") as f:
            f.write(mod)
        os._exit(77)
import pytest
sys.exit(int(pytest.main(["-rs"] + sys.argv[2:])))  # -rs: every skip says why
' "$skipped" "$@"
rc=$?
if [[ $rc == 77 && -s "$skipped" ]]; then
  exit 77
fi
case $rc in
  0) ;;
  5) echo "FAIL interop: pytest collected no tests"; exit 1 ;;
  77) echo "FAIL interop: pytest exited 77, which is not a skip here"; exit 1 ;;
  *) echo "FAIL interop: pytest exited $rc" ;;
esac
exit $rc
