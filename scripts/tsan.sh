#!/usr/bin/env bash
# ThreadSanitizer over the concurrent parts of the library: builds
# build-tsan/ (-DCKPTIO_TSAN=ON) and runs the pool, pipeline, snapshot, faults, shard,
# slice, multi-rank, zstd and manager tests (the manager closes removed
# files on a thread of its own) and the S3 client's (parts and ranged GETs
# from many threads on one client; skipped without weed), on the host
# device and over the fake CUDA runtime (whose copy thread and events race
# with the pipeline's workers if anything does). TSan stops a test at its
# first report (halt_on_error), so a race fails the run. Called by
# scripts/test.sh; extra arguments go to ctest.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
# Only the executables of the tests below: the rest of the tree (the command,
# fuzzers, examples, the libtorch adapter) would double this pass's build.
CKPTIO_BUILD_TARGETS="test_pool test_pipeline test_faults test_shard test_slice test_ranks test_zstd test_cuda
                      test_manage test_s3 test_tiers test_snapshot test_cache_policy" \
  scripts/build.sh build-tsan -DCKPTIO_TSAN=ON -DCMAKE_BUILD_TYPE=Debug || exit 1
# tests/tsan.supp: the dynamic loader's own TLS bookkeeping, nothing else.
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$ROOT/tests/tsan.supp ${TSAN_OPTIONS:-}"
ctest --test-dir build-tsan --output-on-failure -j2 --no-tests=error \
      -R '^(test_(pool|pipeline|faults|shard|slice|ranks|zstd|cuda|manage|tiers|snapshot|cache_policy)(_cuda_fake)?|s3_(retry|client|kill)|tiers_storage)$' "$@"
