#!/usr/bin/env bash
# The suite's behaviour on a machine with a GPU, shown on this one: with a
# stand-in driver (libcuda.so.1 seeing one GPU) and the fake runtime as
# libcudart.so.13 on LD_LIBRARY_PATH, test_device's NoGpu tests skip with
# the reason, gpu_run runs a test on "the real runtime" (found by name, as
# on a GPU machine), and without the driver gpu_run skips (77) saying so.
# Usage: sim_test.sh <gpu_run> <test_device> <test_cuda> <dir of libcuda.so.1> <dir of libcudart.so.13>
set -uo pipefail
GPU_RUN=$1 TEST_DEVICE=$2 TEST_CUDA=$3 DRIVER_DIR=$4 RUNTIME_DIR=$5
fail() { echo "FAIL: $*"; exit 1; }
unset CKPTIO_CUDART
export FAKE_CUDART_DEVICES=1 FAKE_CUDART_REPORT_LEAKS=1

out=$(LD_LIBRARY_PATH="$DRIVER_DIR:$RUNTIME_DIR" "$TEST_DEVICE" --gtest_filter='NoGpu.*' 2>&1) ||
  fail "test_device with a GPU present: $out"
echo "$out" | grep -q '\[  SKIPPED \] NoGpu.AutoContextWorksAndSaysWhy' || fail "NoGpu did not skip: $out"
echo "$out" | grep -q 'a real NVIDIA driver sees 1 GPU(s)' || fail "the skip does not say why: $out"
echo "ok: NoGpu skips where a driver sees a GPU"

out=$(LD_LIBRARY_PATH="$DRIVER_DIR:$RUNTIME_DIR" CKPTIO_TEST_DEVICE=cuda-real "$GPU_RUN" "$TEST_CUDA" \
        --gtest_filter='Cuda.SnapshotHoldsWorkQueuedBeforeCommitAndNothingAfter:Cuda.PointerMixUpsAreRefusedNotCrashed:Cuda.InjectedFailuresFailTheSaveCleanly' 2>&1)
rc=$?
((rc == 0)) || fail "gpu_run test_cuda exited $rc: $out"
echo "$out" | grep -q 'gpu_run: the driver sees 1 GPU(s)' || fail "gpu_run did not run the test: $out"
echo "$out" | grep -q '\[  PASSED  \] 2 tests' || fail "the two device tests did not pass: $out"
echo "$out" | grep -q 'needs injected failures of the fake CUDA runtime' || fail "the fake-only test did not skip: $out"
echo "ok: gpu_run runs the device tests on the runtime found by name, fake-only tests skip"

if /sbin/ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
  echo "ok: (the no-driver case is not shown: this machine has a real libcuda.so.1)"
  exit 0
fi
out=$(LD_LIBRARY_PATH="$RUNTIME_DIR" "$GPU_RUN" "$TEST_CUDA" 2>&1)
rc=$?
((rc == 77)) || fail "gpu_run without a driver exited $rc, not 77: $out"
echo "$out" | tail -1 | grep -q '^SKIP test_cuda on the real CUDA runtime: no NVIDIA driver' ||
  fail "the skip's last line does not say why: $out"
echo "ok: without a driver gpu_run skips (77) and says why"
