// A cold load runs at the slower of its two stages, not at their sum: reads
// from a modeled disk (the fault layer's read-rate model) and, in the
// cuda-fake variant, host-to-device copies at a modeled bandwidth (on the
// real runtime, the GPU's own) overlap,
// one slot reading while another is copied. On the host the second stage is
// copy + CRC, and the load must keep to the disk's time. With one I/O
// thread the overlap comes from the copy running on while the thread reads
// the next slot; with several, also from the threads themselves.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "ckpt_fixture.h"
#include "ckptio.h"
extern "C" {
#include "io/fault.h"
}
#include "test_util.h"

using namespace ckptio_test;

namespace {

constexpr size_t MiB = 1 << 20;
constexpr size_t kTensors = 8, kEach = 4 * MiB;
constexpr double kDiskBps = 100e6;  // the modeled disk: 100 MB/s
constexpr long kGpuMBps = 100;      // the modeled copy engine: as fast as the disk, the hardest case


class LoadOverlap : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { model_copies(kGpuMBps); }
  void TearDown() override {
    ckptio_fault_slow_reads(0);
    default_copies();
  }
};

TEST_P(LoadOverlap, AColdLoadTakesTheSlowerStageNotTheSum) {
  TempDir dir;
  std::vector<Tensor> ts;
  for (size_t i = 0; i < kTensors; i++)
    ts.push_back(make_tensor("layer." + std::to_string(i), CKPTIO_U8, {(int64_t)kEach}, 40 + i));
  ckptio_options o = small_options(1 * MiB, 8 * MiB, GetParam());
  ckptio_ctx *ctx = nullptr;
  ASSERT_EQ(ckptio_ctx_create(&o, &ctx), 0) << ckptio_last_open_error();
  std::string path = dir.file("m.safetensors");
  ASSERT_EQ(save(ctx, path, ts), 0);

  ckptio_options lo = CKPTIO_OPTIONS_INIT;
  lo.load_method = CKPTIO_LOAD_PREAD;  // every byte through the modeled disk
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(ctx, path.c_str(), &lo, &r), 0) << ckptio_last_open_error();
  std::vector<void *> dst(kTensors);
  std::vector<std::vector<uint8_t>> host(kTensors, std::vector<uint8_t>(kEach));
  std::vector<ckptio_load_request> reqs(kTensors);
  if (on_gpu()) {
    ASSERT_EQ(sym<int (*)(int)>("cudaSetDevice")(0), 0);  // save() left another GPU current
  }
  for (size_t i = 0; i < kTensors; i++) {
    if (on_gpu()) {
      ASSERT_EQ(sym<int (*)(void **, size_t)>("cudaMalloc")(&dst[i], kEach), 0);
    } else {
      dst[i] = host[i].data();
    }
    reqs[i] = {i, dst[i], kEach, on_gpu() ? CKPTIO_DEVICE_CUDA(0) : CKPTIO_DEVICE_HOST};
  }

  // Each stage alone, timed on this machine as it is now (a busy one
  // stretches both, the modeled disk's waits included), the larger of two
  // runs kept. The first: the same reads through the modeled disk into host
  // memory with no CRC and no device copy. The second: the device copy, or
  // on the host the CRC, with no disk model (the file is in the page cache).
  ckptio_options lo1 = lo;
  lo1.crc = 0;
  ckptio_reader *r1 = nullptr;
  ASSERT_EQ(ckptio_reader_open(ctx, path.c_str(), &lo1, &r1), 0) << ckptio_last_open_error();
  std::vector<ckptio_load_request> reqs1(kTensors);
  for (size_t i = 0; i < kTensors; i++) reqs1[i] = {i, host[i].data(), kEach, CKPTIO_DEVICE_HOST};
  auto timed = [](ckptio_reader *rd, std::vector<ckptio_load_request> &q) {
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(ckptio_reader_load_many(rd, q.data(), q.size()), 0) << ckptio_reader_last_error(rd);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double stage2_s = timed(r, reqs);
  ckptio_fault_slow_reads(static_cast<uint64_t>(kDiskBps));
  double stage1_s = timed(r1, reqs1);
  double load_s = timed(r, reqs);
  stage1_s = std::max(stage1_s, timed(r1, reqs1));
  ckptio_fault_slow_reads(0);
  stage2_s = std::max(stage2_s, timed(r, reqs));
  ckptio_reader_close(r1);

  double bytes = static_cast<double>(kTensors * kEach);
  double read_s = bytes / kDiskBps, model_copy_s = fake_gpu() ? bytes / (kGpuMBps * 1e6) : 0;
  double slower = std::max(stage1_s, stage2_s), faster = std::min(stage1_s, stage2_s);
  double limit = 1.5 * slower + 0.25 * faster;
  printf("%d I/O threads: cold load of %.0f MiB: %.3f s; reads alone %.3f s (modeled %.3f s), %s alone %.3f s; "
         "limit %.3f s, serial sum %.3f s\n",
         GetParam(), bytes / MiB, load_s, stage1_s, read_s, on_gpu() ? "host-to-device copy" : "CRC", stage2_s, limit,
         stage1_s + stage2_s);
  // Serial stages take the sum; overlapped ones the slower stage plus one
  // slot's fill and drain. The limit is below the sum when the stages are
  // equal (the cuda-fake case: the modeled copy engine runs at the disk's
  // rate) and leaves the slower stage half again for noise.
  EXPECT_LT(load_s, limit) << "the stages of the load do not overlap";
  // The models are floors: nothing beats them.
  EXPECT_GE(load_s, 0.95 * std::max(read_s, model_copy_s)) << "faster than the modeled limits: the models are not in the path";

  for (size_t i = 0; i < kTensors; i++) {
    if (on_gpu()) {
      from_gpu(host[i].data(), dst[i], kEach);
      sym<int (*)(void *)>("cudaFree")(dst[i]);
    }
    EXPECT_TRUE(host[i] == ts[i].bytes) << ts[i].name;
  }
  ckptio_reader_close(r);
  ckptio_ctx_free(ctx);
}

INSTANTIATE_TEST_SUITE_P(Threads, LoadOverlap, ::testing::Values(1, 4));

// The fill of the pipeline: a disk that serves every read in flight at once
// ends them together, so a GPU load that issued the ring's worth of reads
// at the start would copy nothing until all of them ended. Starting with a
// few reads in flight, the copies begin after a few slots' time and the
// load takes the copy time plus that. The copy engine is the slower stage
// here, so every moment it waits at the start is added to the load.
TEST(LoadFill, AGpuLoadStartsCopyingAfterAFewSlotsNotTheWholeRing) {
  if (!on_gpu()) GTEST_SKIP() << "GPU variant only: a host load has no stage after its reads";
  CKPTIO_SKIP_ON_REAL_GPU("a copy engine modeled slower than the disk");
  constexpr size_t kSlots = 32, kSlot = 1 * MiB, kCount = 12;
  constexpr double kShared = 50e6;  // the modeled disk, shared by the reads in flight
  constexpr long kCopyMBps = 25;    // the copy engine, half as fast
  model_copies(kCopyMBps);
  TempDir dir;
  std::vector<Tensor> ts;
  for (size_t i = 0; i < kCount; i++)
    ts.push_back(make_tensor("w." + std::to_string(i), CKPTIO_U8, {(int64_t)kEach}, 7 + i));
  ckptio_options o = small_options(kSlot, kSlots * kSlot, (int)kSlots);
  ckptio_ctx *ctx = nullptr;
  ASSERT_EQ(ckptio_ctx_create(&o, &ctx), 0) << ckptio_last_open_error();
  std::string path = dir.file("m.safetensors");
  ASSERT_EQ(save(ctx, path, ts), 0);
  ckptio_options lo = CKPTIO_OPTIONS_INIT;
  lo.load_method = CKPTIO_LOAD_PREAD;
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(ctx, path.c_str(), &lo, &r), 0) << ckptio_last_open_error();
  ASSERT_EQ(sym<int (*)(int)>("cudaSetDevice")(0), 0);
  std::vector<void *> dst(kCount);
  std::vector<ckptio_load_request> reqs(kCount);
  for (size_t i = 0; i < kCount; i++) {
    ASSERT_EQ(sym<int (*)(void **, size_t)>("cudaMalloc")(&dst[i], kEach), 0);
    int64_t idx = ckptio_reader_find(r, ts[i].name.c_str());
    ASSERT_GE(idx, 0) << ts[i].name;
    reqs[i] = {(size_t)idx, dst[i], kEach, CKPTIO_DEVICE_CUDA(0)};
  }

  auto timed_load = [&] {
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(ckptio_reader_load_many(r, reqs.data(), reqs.size()), 0) << ckptio_reader_last_error(r);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // The copy stage alone, timed on this machine as it is now (the larger of
  // a run before and one after): the same load with no disk model, the file
  // in the page cache.
  double copy_measured_s = timed_load();
  ckptio_fault_slow_reads_shared(static_cast<uint64_t>(kShared));
  double load_s = timed_load();
  ckptio_fault_slow_reads(0);
  copy_measured_s = std::max(copy_measured_s, timed_load());
  default_copies();

  double bytes = static_cast<double>(kCount * kEach);
  double copy_s = bytes / (kCopyMBps * 1e6), ring_fill_s = kSlots * kSlot / kShared;
  printf("GPU load of %.0f MiB: %.3f s; copy stage modeled %.3f s, measured alone %.3f s; the ring's reads "
         "together end after %.3f s\n",
         bytes / MiB, load_s, copy_s, copy_measured_s, ring_fill_s);
  // All 32 reads at once: the copy stage + the whole ring's fill (0.67 s
  // here); four first: + an eighth of it. Against the copy stage measured
  // in this run, not the model, so a busy machine moves the limit with it;
  // three quarters of the fill left for its noise.
  EXPECT_LT(load_s, std::max(copy_s, copy_measured_s) + 0.75 * ring_fill_s)
      << "the copies waited for the whole ring's reads";
  EXPECT_GE(load_s, 0.95 * copy_s) << "faster than the modeled copy: the model is not in the path";
  for (size_t i = 0; i < kCount; i++) {
    std::vector<uint8_t> back(kEach);
    from_gpu(back.data(), dst[i], kEach);
    sym<int (*)(void *)>("cudaFree")(dst[i]);
    EXPECT_TRUE(back == ts[i].bytes) << ts[i].name;
  }
  ckptio_reader_close(r);
  ckptio_ctx_free(ctx);
}

}  // namespace
