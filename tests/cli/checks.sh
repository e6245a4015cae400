# The checks the `ckptio` command's test scripts share; sourced after $T
# (the script's scratch directory) is set. Each check prints "ok" or "FAIL"
# and the script ends with finish_checks.
fails=0

pass() { echo "ok   $1"; }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }
# expect CODE NAME COMMAND... -- runs the command, keeps stdout+stderr in $T/out
expect() {
  local want=$1 name=$2
  shift 2
  "$@" >"$T/out" 2>"$T/err"
  local got=$?
  cat "$T/err" >>"$T/out"
  if [ "$got" -eq "$want" ]; then pass "$name (exit $got)"; else
    fail "$name: exit $got, expected $want"; sed 's/^/     | /' "$T/out"; fi
}
# mentions NAME PATTERN -- $T/out matches PATTERN (grep, any case)
mentions() {
  if grep -qi -- "$2" "$T/out"; then pass "$1 mentions '$2'"; else
    fail "$1 does not mention '$2'"; sed 's/^/     | /' "$T/out"; fi
}
finish_checks() {
  if [ "$fails" -ne 0 ]; then echo "$fails checks failed"; exit 1; fi
  echo "all checks passed"
}
