// A cold load runs at the slower of its two stages, not at their sum: reads
// from a modeled disk (the fault layer's read-rate model) and, in the
// cuda-fake variant, host-to-device copies at a modeled bandwidth overlap,
// one slot reading while another is copied. On the host the second stage is
// copy + CRC, and the load must keep to the disk's time. With one I/O
// thread the overlap comes from the copy running on while the thread reads
// the next slot; with several, also from the threads themselves.
#include <gtest/gtest.h>

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

  ckptio_fault_slow_reads(static_cast<uint64_t>(kDiskBps));
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(ckptio_reader_load_many(r, reqs.data(), reqs.size()), 0) << ckptio_reader_last_error(r);
  double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ckptio_fault_slow_reads(0);

  double bytes = static_cast<double>(kTensors * kEach);
  double read_s = bytes / kDiskBps, copy_s = on_gpu() ? bytes / (kGpuMBps * 1e6) : 0;
  double slower = read_s > copy_s ? read_s : copy_s;
  printf("%d I/O threads: cold load of %.0f MiB: %.3f s; modeled read %.3f s, %s %.3f s; slower stage %.3f s, sum %.3f s\n",
         GetParam(), bytes / MiB, load_s, read_s, on_gpu() ? "host-to-device copy" : "no device copy", copy_s, slower,
         read_s + copy_s);
  // Serial stages would take the sum (on the GPU twice the slower one);
  // overlapped ones the slower stage plus one slot's fill and drain.
  EXPECT_LT(load_s, 1.5 * slower) << "the stages of the load do not overlap";
  EXPECT_GE(load_s, 0.95 * slower) << "faster than the modeled limits: the models are not in the path";

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

}  // namespace
