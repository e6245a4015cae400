# What tests/dist/tiers.sh and tiers_storage.sh share (sourced, with DRIVER
# set): the skip without MPI, the driver run on N ranks, and the restore of
# a checkpoint saved with places at other world sizes.
command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (scripts/setup.sh installs openmpi-bin)"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
fail() { echo "FAIL: $*"; exit 1; }
# tiers_run N DIR ARGS...: the driver on N ranks over DIR, each of the
# driver's TIERS_* variables that is set passed on to every rank.
tiers_run() {
  local n=$1 dir=$2 x=() v
  shift 2
  for v in TIERS_STORAGE TIERS_NO_MEMORY TIERS_BACKGROUND; do [ -n "${!v:-}" ] && x+=(-x "$v"); done
  timeout 120 mpirun "${x[@]}" -np "$n" --oversubscribe --bind-to none "$DRIVER" "$dir" "$@"
}
# restores_at_sizes DIR STEP N...: ckptio_tiers_restore_global of STEP at
# each world size N, every one of the N ranks saying it restored STEP (logs
# in $WORK/global-N.log).
restores_at_sizes() {
  local dir=$1 step=$2 n
  shift 2
  for n in "$@"; do
    tiers_run "$n" "$dir" restore-global "$step" | tee "$WORK/global-$n.log"
    [ "$(grep -c "of $n restored step $step " "$WORK/global-$n.log")" = "$n" ] ||
      fail "not every one of $n ranks restored step $step"
  done
}
