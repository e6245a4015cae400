// Without a GPU: CUDA is reported unavailable with a reason, the host path
// keeps working, GPU tensors and destinations are refused with that reason,
// and NUMA placement is a harmless no-op that still runs. Where the real CUDA
// stack is present (a driver that sees a GPU, a runtime the library loads),
// the NoGpu tests skip and say so: the gpu ctest variants run there.
#include <gtest/gtest.h>

#include <pthread.h>

#include <string>

#include "ckpt_fixture.h"
extern "C" {
#include "device/numa.h"
}
#include "real_gpu.h"

using namespace ckptio_test;

// Skips the calling test when this machine has the real CUDA stack (asked
// apart from the library: see real_gpu.h), with what was found.
#define SKIP_WHERE_A_GPU_IS()                                                          \
  do {                                                                                 \
    char why_[512] = "";                                                               \
    if (int n_ = ckptio_test_real_gpus(why_, sizeof(why_)))                            \
      GTEST_SKIP() << "a real NVIDIA driver sees " << n_                               \
                   << " GPU(s) and a CUDA runtime loads: these tests are for machines " \
                      "without; the gpu ctest variants run here";                      \
  } while (0)

TEST(NoGpu, AutoContextWorksAndSaysWhy) {
  SKIP_WHERE_A_GPU_IS();
  ckptio_ctx *ctx;
  ASSERT_EQ(ckptio_ctx_create(nullptr, &ctx), 0);
  const char *why = nullptr;
  ASSERT_EQ(ckptio_ctx_cuda(ctx, &why), 0);
  EXPECT_EQ(std::string(why).rfind("CUDA unavailable: ", 0), 0u) << why;
  TempDir dir;
  std::vector<Tensor> ts = {make_tensor("w", CKPTIO_F32, {1000}, 1)};
  ASSERT_EQ(save(ctx, dir.file("m.safetensors"), ts), 0);
  expect_loads(ctx, dir.file("m.safetensors"), ts);
  // GPU tensors and destinations: refused, with the reason.
  ckptio_writer *w;
  ASSERT_EQ(ckptio_writer_open(ctx, dir.file("g.safetensors").c_str(), CKPTIO_FORMAT_SAFETENSORS, nullptr, &w), 0);
  float x = 1;
  ckptio_tensor t{"g", CKPTIO_F32, 0, {}, &x, CKPTIO_DEVICE_CUDA(0)};
  EXPECT_EQ(ckptio_writer_add(w, &t), CKPTIO_E_DEVICE);
  EXPECT_NE(std::string(ckptio_writer_last_error(w)).find("CUDA unavailable"), std::string::npos);
  EXPECT_EQ(ckptio_writer_set_stream(w, CKPTIO_DEVICE_CUDA(0), nullptr), CKPTIO_E_DEVICE);
  ckptio_writer_close(w);
  ckptio_reader *r;
  ASSERT_EQ(ckptio_reader_open(ctx, dir.file("m.safetensors").c_str(), nullptr, &r), 0);
  std::vector<float> dst(1000);
  ckptio_load_request q{0, dst.data(), 4000, CKPTIO_DEVICE_CUDA(0)};
  EXPECT_EQ(ckptio_reader_load_many(r, &q, 1), CKPTIO_E_DEVICE);
  EXPECT_NE(std::string(ckptio_reader_last_error(r)).find("CUDA unavailable"), std::string::npos);
  ckptio_reader_close(r);
  void *p = nullptr;
  EXPECT_EQ(ckptio_device_alloc(ctx, CKPTIO_DEVICE_CUDA(0), 16, &p), CKPTIO_E_DEVICE);
  ckptio_ctx_free(ctx);
}

TEST(NoGpu, RequiredCudaFailsWithReason) {
  SKIP_WHERE_A_GPU_IS();
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  o.cuda = 1;
  ckptio_ctx *ctx = nullptr;
  EXPECT_EQ(ckptio_ctx_create(&o, &ctx), CKPTIO_E_DEVICE);
  EXPECT_EQ(ctx, nullptr);
  EXPECT_EQ(std::string(ckptio_last_open_error()).rfind("CUDA unavailable: ", 0), 0u) << ckptio_last_open_error();
  o.cuda = 0;
  ASSERT_EQ(ckptio_ctx_create(&o, &ctx), 0);
  const char *why;
  EXPECT_EQ(ckptio_ctx_cuda(ctx, &why), 0);
  EXPECT_NE(std::string(why).find("turned off"), std::string::npos);
  ckptio_ctx_free(ctx);
}

TEST(Numa, PlacementIsANoOpThatStillRuns) {
  std::vector<char> mem(1 << 16);
  pthread_t self = pthread_self();
  char report[256] = "";
  int rc = ckptio_numa_place("0000:3b:00.0", mem.data(), mem.size(), &self, 1, report, sizeof(report));
  EXPECT_GE(rc, 0);
  EXPECT_EQ(std::string(report).rfind("NUMA: ", 0), 0u) << report;
  EXPECT_EQ(ckptio_numa_place(nullptr, mem.data(), mem.size(), &self, 1, report, sizeof(report)), -1);
}
