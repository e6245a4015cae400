// The CUDA path over the fake runtime (label cuda-fake): the hot path makes
// no pageable copies, the snapshot includes work still queued on the
// caller's stream at the commit and nothing queued after the snapshot, host/device pointer
// mix-ups are refused, every injected CUDA failure fails the save or load
// cleanly with the CUDA error's name, and nothing pinned or created leaks.
// On the real runtime (label gpu) the same tests run except those that need
// the fake's controls (injected failures, its statistics); the stream
// ordering ones use the last GPU, which is GPU 1 of the fake's two.

// Uses the device calls (ckptio_device_copy, ...), of ckptio.h's experimental
// section.
#define CKPTIO_EXPERIMENTAL

#include <cstring>

#include "ckpt_fixture.h"
#include "fake_cudart.h"

using namespace ckptio_test;

namespace {

struct fake_cudart_stats stats() {
  struct fake_cudart_stats s = FAKE_CUDART_STATS_INIT;
  sym<int (*)(struct fake_cudart_stats *)>("fake_cudart_stats")(&s);
  return s;
}

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!on_gpu()) GTEST_SKIP() << "needs a CUDA runtime: runs in the cuda-fake and gpu ctest variants";
    ckptio_options o = small_options(64 << 10, 512 << 10, 4);
    o.cuda = 1;
    ASSERT_EQ(ckptio_ctx_create(&o, &ctx_), 0) << ckptio_last_open_error();
    if (fake_gpu()) sym<void (*)()>("fake_cudart_reset_stats")();
  }
  void TearDown() override {
    if (!on_gpu()) return;
    if (fake_gpu()) sym<int (*)(const char *, long, int)>("fake_cudart_set_fail")(nullptr, 0, 0);
    ckptio_ctx_free(ctx_);
    if (!fake_gpu()) return;
    struct fake_cudart_stats s = stats();
    EXPECT_EQ(s.registered_ranges, 0u) << "pinned staging leaked";
    EXPECT_EQ(s.pinned_allocs, 0u);
    EXPECT_EQ(s.streams, 0u);
    EXPECT_EQ(s.events, 0u);
    EXPECT_EQ(s.device_allocs, 0u);
  }
  void fail_nth(const char *func, long nth, int err) {
    sym<int (*)(const char *, long, int)>("fake_cudart_set_fail")(func, nth, err);
  }
  std::vector<Tensor> model() {
    return {make_tensor("a", CKPTIO_BF16, {300000}, 1), make_tensor("b", CKPTIO_F32, {7}, 2),
            make_tensor("c", CKPTIO_F32, {100000}, 3)};
  }
  TempDir dir_;
  ckptio_ctx *ctx_ = nullptr;
};

// The GPU the stream-ordering tests use: GPU 1 of the fake's two, the only
// one on a one-GPU machine.
int last_gpu() { return gpu_count() - 1; }

}  // namespace

TEST_F(Cuda, HotPathMakesNoPageableCopies) {
  auto ts = model();
  ASSERT_EQ(save(ctx_, dir_.file("m.safetensors"), ts), 0);
  for (auto m : {CKPTIO_LOAD_PREAD, CKPTIO_LOAD_DIRECT, CKPTIO_LOAD_MMAP})
    expect_loads(ctx_, dir_.file("m.safetensors"), ts, m);
  if (real_gpu()) return;  // the copy counts below are the fake's
  struct fake_cudart_stats s = stats();
  // The fixture's own uploads / downloads use cudaMemcpy on pageable vectors;
  // ckptio's copies are all cudaMemcpyAsync from pinned staging.
  EXPECT_GT(s.async_copies, 0u);
  EXPECT_EQ(s.pageable_copies, s.sync_copies) << "ckptio made a pageable async copy";
}

TEST_F(Cuda, SnapshotHoldsWorkQueuedBeforeCommitAndNothingAfter) {
  const size_t n = 1 << 20;
  void *buf = nullptr;
  ASSERT_EQ(ckptio_device_alloc(ctx_, CKPTIO_DEVICE_CUDA(last_gpu()), n, &buf), 0);
  std::vector<uint8_t> ones(n, 0x11);
  to_gpu(buf, ones.data(), n);
  sym<int (*)(int)>("cudaSetDevice")(last_gpu());
  void *stream = nullptr;
  ASSERT_EQ(sym<int (*)(void **, unsigned)>("cudaStreamCreateWithFlags")(&stream, 1), 0);
  auto memset_async = sym<int (*)(void *, int, size_t, void *)>("cudaMemsetAsync");
  // The training step's last kernel, still queued (the fake delays it).
  ASSERT_EQ(memset_async(buf, 0x22, n, stream), 0);
  ckptio_writer *w;
  ASSERT_EQ(ckptio_writer_open(ctx_, dir_.file("s.safetensors").c_str(), CKPTIO_FORMAT_SAFETENSORS, nullptr, &w), 0);
  ckptio_tensor t{"w", CKPTIO_U8, 1, {(int64_t)n}, buf, CKPTIO_DEVICE_CUDA(last_gpu())};
  ASSERT_EQ(ckptio_writer_add(w, &t), 0);
  ASSERT_EQ(ckptio_writer_set_stream(w, CKPTIO_DEVICE_CUDA(last_gpu()), stream), 0);
  ASSERT_EQ(ckptio_writer_commit_async(w), 0);
  // The next step's kernel may be queued once the snapshot is taken (the
  // tensors are borrowed until then).
  ASSERT_EQ(ckptio_writer_wait_snapshot(w), 0) << ckptio_writer_last_error(w);
  ASSERT_EQ(memset_async(buf, 0x33, n, stream), 0);
  ASSERT_EQ(ckptio_writer_wait_durable(w), 0) << ckptio_writer_last_error(w);
  ckptio_writer_close(w);
  sym<int (*)(void *)>("cudaStreamSynchronize")(stream);
  sym<int (*)(void *)>("cudaStreamDestroy")(stream);
  ckptio_device_free(ctx_, CKPTIO_DEVICE_CUDA(last_gpu()), buf);
  auto bytes = read_file(dir_.file("s.safetensors"));
  ASSERT_GE(bytes.size(), n);
  for (size_t i = bytes.size() - n; i < bytes.size(); i += 4093) ASSERT_EQ(bytes[i], 0x22) << "at " << i;
}

// The same ordering for a sharded save: the stream reaches every shard's
// writer, so each shard holds the values queued before the commit.
TEST_F(Cuda, ShardedSnapshotWaitsForTheCallersStream) {
  const size_t n = 1 << 20;
  void *buf[2] = {nullptr, nullptr};
  std::vector<uint8_t> ones(n, 0x11);
  for (auto &b : buf) {
    ASSERT_EQ(ckptio_device_alloc(ctx_, CKPTIO_DEVICE_CUDA(last_gpu()), n, &b), 0);
    to_gpu(b, ones.data(), n);
  }
  sym<int (*)(int)>("cudaSetDevice")(last_gpu());
  void *stream = nullptr;
  ASSERT_EQ(sym<int (*)(void **, unsigned)>("cudaStreamCreateWithFlags")(&stream, 1), 0);
  auto memset_async = sym<int (*)(void *, int, size_t, void *)>("cudaMemsetAsync");
  for (auto &b : buf) ASSERT_EQ(memset_async(b, 0x22, n, stream), 0);
  ckptio_writer *w = nullptr;
  ASSERT_EQ(ckptio_writer_open_sharded(ctx_, dir_.path().c_str(), "model", CKPTIO_FORMAT_SAFETENSORS, n, CKPTIO_SHARD_ORDER_ADDED,
                                       nullptr, &w),
            0);
  ckptio_tensor t0{"w0", CKPTIO_U8, 1, {(int64_t)n}, buf[0], CKPTIO_DEVICE_CUDA(last_gpu())};
  ckptio_tensor t1{"w1", CKPTIO_U8, 1, {(int64_t)n}, buf[1], CKPTIO_DEVICE_CUDA(last_gpu())};
  ASSERT_EQ(ckptio_writer_add(w, &t0), 0);
  ASSERT_EQ(ckptio_writer_add(w, &t1), 0);
  EXPECT_EQ(ckptio_writer_set_stream(w, CKPTIO_DEVICE_CUDA(gpu_count()), stream), CKPTIO_E_DEVICE);
  ASSERT_EQ(ckptio_writer_set_stream(w, CKPTIO_DEVICE_CUDA(last_gpu()), stream), 0);
  ASSERT_EQ(ckptio_writer_commit(w), 0) << ckptio_writer_last_error(w);
  ASSERT_EQ(ckptio_writer_shard_count(w), 2u);
  ckptio_writer_close(w);
  sym<int (*)(void *)>("cudaStreamSynchronize")(stream);
  sym<int (*)(void *)>("cudaStreamDestroy")(stream);
  for (auto &b : buf) ckptio_device_free(ctx_, CKPTIO_DEVICE_CUDA(last_gpu()), b);
  for (const char *f : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
    auto bytes = read_file(dir_.file(f));
    ASSERT_GE(bytes.size(), n) << f;
    for (size_t i = bytes.size() - n; i < bytes.size(); i += 4093) ASSERT_EQ(bytes[i], 0x22) << f << " at " << i;
  }
}

TEST_F(Cuda, PointerMixUpsAreRefusedNotCrashed) {
  void *dev = nullptr;
  ASSERT_EQ(ckptio_device_alloc(ctx_, CKPTIO_DEVICE_CUDA(0), 4096, &dev), 0);
  std::vector<uint8_t> host(4096);
  ckptio_writer *w;
  ASSERT_EQ(ckptio_writer_open(ctx_, dir_.file("x.safetensors").c_str(), CKPTIO_FORMAT_SAFETENSORS, nullptr, &w), 0);
  ckptio_tensor as_host{"h", CKPTIO_U8, 1, {4096}, dev, CKPTIO_DEVICE_HOST};
  EXPECT_EQ(ckptio_writer_add(w, &as_host), CKPTIO_E_DEVICE);
  EXPECT_NE(std::string(ckptio_writer_last_error(w)).find("GPU memory but the descriptor says host"), std::string::npos)
      << ckptio_writer_last_error(w);
  ckptio_tensor as_dev{"d", CKPTIO_U8, 1, {4096}, host.data(), CKPTIO_DEVICE_CUDA(0)};
  EXPECT_EQ(ckptio_writer_add(w, &as_dev), CKPTIO_E_DEVICE);
  if (gpu_count() >= 2) {
    ckptio_tensor wrong_gpu{"g", CKPTIO_U8, 1, {4096}, dev, CKPTIO_DEVICE_CUDA(1)};
    EXPECT_EQ(ckptio_writer_add(w, &wrong_gpu), CKPTIO_E_DEVICE);
    EXPECT_NE(std::string(ckptio_writer_last_error(w)).find("on GPU 0"), std::string::npos);
  }
  ckptio_tensor no_gpu{"n", CKPTIO_U8, 1, {4096}, dev, CKPTIO_DEVICE_CUDA(gpu_count())};
  EXPECT_EQ(ckptio_writer_add(w, &no_gpu), CKPTIO_E_DEVICE);
  ckptio_tensor ok{"ok", CKPTIO_U8, 1, {4096}, host.data(), CKPTIO_DEVICE_HOST};
  ASSERT_EQ(ckptio_writer_add(w, &ok), 0);
  ASSERT_EQ(ckptio_writer_commit(w), 0);
  ckptio_writer_close(w);
  ckptio_reader *r;
  ASSERT_EQ(ckptio_reader_open(ctx_, dir_.file("x.safetensors").c_str(), nullptr, &r), 0);
  ckptio_load_request into_host_as_dev{0, host.data(), 4096, CKPTIO_DEVICE_CUDA(0)};
  EXPECT_EQ(ckptio_reader_load_many(r, &into_host_as_dev, 1), CKPTIO_E_DEVICE);
  ckptio_load_request into_dev_as_host{0, dev, 4096, CKPTIO_DEVICE_HOST};
  EXPECT_EQ(ckptio_reader_load_many(r, &into_dev_as_host, 1), CKPTIO_E_DEVICE);
  ckptio_reader_close(r);
  ckptio_device_free(ctx_, CKPTIO_DEVICE_CUDA(0), dev);
}

// Each CUDA call of the save path, failed in turn: the save fails with the
// CUDA error's name, the previous checkpoint is untouched, no temp file is
// left, and the context still saves afterwards.
TEST_F(Cuda, InjectedFailuresFailTheSaveCleanly) {
  CKPTIO_SKIP_ON_REAL_GPU("injected failures");
  auto old = model();
  ASSERT_EQ(save(ctx_, dir_.file("m.safetensors"), old), 0);
  auto old_bytes = read_file(dir_.file("m.safetensors"));
  auto next = old;
  for (auto &t : next) t.bytes = pattern(t.bytes.size(), 99);
  struct Case { const char *func; long nth; int err; const char *name; };
  for (Case c : {Case{"cudaMemcpyAsync", 1, 719, "cudaErrorLaunchFailure"},
                 Case{"cudaMemcpyAsync", 4, 700, "cudaErrorIllegalAddress"},
                 Case{"cudaEventRecord", 3, 999, "cudaErrorUnknown"},
                 Case{"cudaEventSynchronize", 2, 719, "cudaErrorLaunchFailure"},
                 Case{"cudaStreamWaitEvent", 1, 400, "cudaErrorInvalidResourceHandle"},
                 Case{"cudaPointerGetAttributes", 2, 1, "cudaErrorInvalidValue"}}) {
    SCOPED_TRACE(std::string(c.func) + " #" + std::to_string(c.nth));
    // Uploads in the fixture use cudaMemcpy (not Async): counts stay ours.
    fail_nth(c.func, c.nth, c.err);
    std::string msg;
    EXPECT_EQ(save(ctx_, dir_.file("m.safetensors"), next, nullptr, &msg), CKPTIO_E_DEVICE) << msg;
    fail_nth(nullptr, 0, 0);
    EXPECT_NE(msg.find(c.name), std::string::npos) << msg;
    EXPECT_EQ(read_file(dir_.file("m.safetensors")), old_bytes);
    EXPECT_EQ(dir_.list(), std::vector<std::string>{"m.safetensors"});
  }
  expect_loads(ctx_, dir_.file("m.safetensors"), old);
  ASSERT_EQ(save(ctx_, dir_.file("m.safetensors"), next), 0);
  expect_loads(ctx_, dir_.file("m.safetensors"), next);
}

// A GPU's copy streams and slot events are created, and the ring pinned, on
// first use: a failure there names the call that failed, and the next save
// retries.
TEST_F(Cuda, FirstUseFailuresNameTheCall) {
  CKPTIO_SKIP_ON_REAL_GPU("injected failures");
  auto ts = model();
  struct Case { const char *func, *named; };
  for (Case c : {Case{"cudaStreamCreateWithFlags", "cudaStreamCreateWithFlags"},
                 Case{"cudaEventCreateWithFlags", "cudaEventCreateWithFlags"}, Case{"cudaGetDevice", "cudaGetDevice"},
                 Case{"cudaHostRegister", "cudaHostRegister (the staging ring)"}}) {
    SCOPED_TRACE(c.func);
    ckptio_ctx *fresh = nullptr;
    ckptio_options o = small_options(64 << 10, 512 << 10, 4);
    o.cuda = 1;
    ASSERT_EQ(ckptio_ctx_create(&o, &fresh), 0) << ckptio_last_open_error();
    fail_nth(c.func, 1, 2);
    std::string msg;
    EXPECT_EQ(save(fresh, dir_.file("m.safetensors"), ts, nullptr, &msg), CKPTIO_E_DEVICE) << msg;
    fail_nth(nullptr, 0, 0);
    EXPECT_NE(msg.find(std::string(c.named) + ": cudaErrorMemoryAllocation"), std::string::npos) << msg;
    EXPECT_EQ(save(fresh, dir_.file("m.safetensors"), ts), 0);
    ckptio_ctx_free(fresh);
  }
  expect_loads(ctx_, dir_.file("m.safetensors"), ts);
}

TEST_F(Cuda, InjectedFailuresFailTheLoadWithTheTensorName) {
  CKPTIO_SKIP_ON_REAL_GPU("injected failures");
  auto ts = model();
  ASSERT_EQ(save(ctx_, dir_.file("m.safetensors"), ts), 0);
  ckptio_reader *r;
  ASSERT_EQ(ckptio_reader_open(ctx_, dir_.file("m.safetensors").c_str(), nullptr, &r), 0);
  void *dev = nullptr;
  ASSERT_EQ(ckptio_device_alloc(ctx_, CKPTIO_DEVICE_CUDA(0), 1 << 20, &dev), 0);
  int64_t i = ckptio_reader_find(r, "a");
  for (const char *func : {"cudaMemcpyAsync", "cudaEventSynchronize"}) {
    fail_nth(func, 2, 719);
    ckptio_load_request q{(size_t)i, dev, 1 << 20, CKPTIO_DEVICE_CUDA(0)};
    EXPECT_EQ(ckptio_reader_load_many(r, &q, 1), CKPTIO_E_DEVICE);
    fail_nth(nullptr, 0, 0);
    std::string msg = ckptio_reader_last_error(r);
    EXPECT_NE(msg.find("'a'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cudaErrorLaunchFailure"), std::string::npos) << msg;
  }
  ckptio_device_free(ctx_, CKPTIO_DEVICE_CUDA(0), dev);
  ckptio_reader_close(r);
}

// The calls that create a GPU's streams and events (lazily, on a context's
// first save or load there; events also per operation) and the query of the
// caller's current GPU, failed in turn: the message names the call, not
// only the error, and the context works once the fault is gone.
TEST_F(Cuda, FailedStreamEventAndDeviceCallsAreNamed) {
  CKPTIO_SKIP_ON_REAL_GPU("injected failures");
  auto ts = model();
  ASSERT_EQ(save(ctx_, dir_.file("m.safetensors"), ts), 0);
  struct Case { const char *func, *named; bool warm; };
  for (Case c : {Case{"cudaEventCreateWithFlags", "cudaEventCreate", false},
                 Case{"cudaEventCreateWithFlags", "cudaEventCreate", true},
                 Case{"cudaStreamCreateWithFlags", "cudaStreamCreate", false},
                 Case{"cudaGetDevice", "cudaGetDevice", false},
                 Case{"cudaGetDevice", "cudaGetDevice", true}}) {
    for (bool loading : {false, true}) {
      SCOPED_TRACE(std::string(c.func) + (c.warm ? " (streams made)" : " (first use)") +
                   (loading ? " in a load" : " in a save"));
      ckptio_options o = small_options(64 << 10, 512 << 10, 4);
      o.cuda = 1;
      ckptio_ctx *ctx = nullptr;
      ASSERT_EQ(ckptio_ctx_create(&o, &ctx), 0) << ckptio_last_open_error();
      // Warm: the streams and slot events exist, so what fails is the
      // per-operation event or query.
      if (c.warm) {
        ASSERT_EQ(save(ctx, dir_.file("w.safetensors"), ts), 0);
        expect_loads(ctx, dir_.file("m.safetensors"), ts);
      }
      void *dev = nullptr;
      ckptio_reader *r = nullptr;
      if (loading) {
        ASSERT_EQ(ckptio_device_alloc(ctx, CKPTIO_DEVICE_CUDA(0), 1 << 20, &dev), 0);
        ASSERT_EQ(ckptio_reader_open(ctx, dir_.file("m.safetensors").c_str(), nullptr, &r), 0);
      }
      fail_nth(c.func, 1, 2);  // cudaErrorMemoryAllocation
      std::string msg;
      int rc;
      if (loading) {
        ckptio_load_request q{(size_t)ckptio_reader_find(r, "a"), dev, 1 << 20, CKPTIO_DEVICE_CUDA(0)};
        rc = ckptio_reader_load_many(r, &q, 1);
        msg = ckptio_reader_last_error(r);
      } else {
        rc = save(ctx, dir_.file("n.safetensors"), ts, nullptr, &msg);
      }
      long calls = sym<long (*)(const char *)>("fake_cudart_calls")(c.func);
      fail_nth(nullptr, 0, 0);
      ASSERT_GE(calls, 1) << "the fault was never reached: this case tests nothing";
      EXPECT_EQ(rc, CKPTIO_E_DEVICE) << msg;
      EXPECT_NE(msg.find(c.named), std::string::npos) << msg;
      EXPECT_NE(msg.find("cudaErrorMemoryAllocation"), std::string::npos) << msg;
      if (loading) {
        expect_loads(ctx, dir_.file("m.safetensors"), ts);
        ckptio_reader_close(r);
        ckptio_device_free(ctx, CKPTIO_DEVICE_CUDA(0), dev);
      } else {
        EXPECT_EQ(save(ctx, dir_.file("n.safetensors"), ts), 0);
      }
      ckptio_ctx_free(ctx);
    }
  }
}

TEST_F(Cuda, StagingIsPinnedOnceAndBoundedDuringSaves) {
  CKPTIO_SKIP_ON_REAL_GPU("the statistics");
  EXPECT_EQ(stats().registered_ranges, 0u) << "the ring is pinned at its first GPU copy, not at creation";
  auto ts = model();
  ASSERT_EQ(save(ctx_, dir_.file("m.safetensors"), ts), 0);
  struct fake_cudart_stats first = stats();
  EXPECT_EQ(first.registered_ranges, 1u) << "the context pins its ring once";
  EXPECT_EQ(first.registered_bytes, 512u << 10);
  for (int k = 0; k < 3; k++) ASSERT_EQ(save(ctx_, dir_.file("m.safetensors"), ts), 0);
  struct fake_cudart_stats after = stats();
  EXPECT_EQ(after.registered_ranges, 1u);
  EXPECT_EQ(after.peak_locked_bytes, 512u << 10) << "saves must not pin more than the ring";
}

// A CUDA context that only ever moves host memory (a tokenizer's tensors, a
// CPU-side optimizer state) pins and touches none of the ring.
TEST_F(Cuda, HostOnlySavesAndLoadsPinNothing) {
  CKPTIO_SKIP_ON_REAL_GPU("the statistics");
  std::vector<Tensor> ts = {make_tensor("h", CKPTIO_F32, {200000}, 4)};
  ckptio_writer *w;
  ASSERT_EQ(ckptio_writer_open(ctx_, dir_.file("h.safetensors").c_str(), CKPTIO_FORMAT_SAFETENSORS, nullptr, &w), 0);
  ckptio_tensor d = host_desc(ts[0]);
  ASSERT_EQ(ckptio_writer_add(w, &d), 0) << ckptio_writer_last_error(w);
  ASSERT_EQ(ckptio_writer_commit(w), 0) << ckptio_writer_last_error(w);
  EXPECT_EQ(ckptio_writer_close(w), 0);
  ckptio_reader *r;
  ASSERT_EQ(ckptio_reader_open(ctx_, dir_.file("h.safetensors").c_str(), nullptr, &r), 0);
  std::vector<uint8_t> got(ts[0].bytes.size());
  ASSERT_EQ(ckptio_reader_load(r, 0, got.data(), got.size()), 0) << ckptio_reader_last_error(r);
  ckptio_reader_close(r);
  EXPECT_EQ(got, ts[0].bytes);
  struct fake_cudart_stats s = stats();
  EXPECT_EQ(s.registered_ranges, 0u);
  EXPECT_EQ(s.peak_locked_bytes, 0u);
}

// A load onto buffers the caller's queued work still writes: with the
// caller's stream named, ckptio's copies land after that work; the fake's
// delayed memset would otherwise overwrite the loaded bytes.
TEST_F(Cuda, LoadWaitsForWorkQueuedOnTheCallersStream) {
  const size_t n = 1 << 20;
  std::vector<Tensor> ts = {make_tensor("w", CKPTIO_U8, {(int64_t)n}, 5)};
  ASSERT_EQ(save(ctx_, dir_.file("m.safetensors"), ts), 0);
  void *dst = nullptr;
  ASSERT_EQ(ckptio_device_alloc(ctx_, CKPTIO_DEVICE_CUDA(last_gpu()), n, &dst), 0);
  sym<int (*)(int)>("cudaSetDevice")(last_gpu());
  void *stream = nullptr;
  ASSERT_EQ(sym<int (*)(void **, unsigned)>("cudaStreamCreateWithFlags")(&stream, 1), 0);
  auto memset_async = sym<int (*)(void *, int, size_t, void *)>("cudaMemsetAsync");
  ckptio_reader *r;
  ASSERT_EQ(ckptio_reader_open(ctx_, dir_.file("m.safetensors").c_str(), nullptr, &r), 0);
  ASSERT_EQ(ckptio_reader_set_stream(r, CKPTIO_DEVICE_CUDA(last_gpu()), stream), 0);
  ASSERT_EQ(memset_async(dst, 0x5A, n, stream), 0);  // the last step still clearing the buffer
  ckptio_load_request q{0, dst, n, CKPTIO_DEVICE_CUDA(last_gpu())};
  ASSERT_EQ(ckptio_reader_load_many(r, &q, 1), 0) << ckptio_reader_last_error(r);
  std::vector<uint8_t> got(n);
  from_gpu(got.data(), dst, n);
  EXPECT_EQ(got, ts[0].bytes);
  EXPECT_EQ(ckptio_reader_set_stream(r, CKPTIO_DEVICE_CUDA(gpu_count()), stream), CKPTIO_E_DEVICE);
  ckptio_reader_close(r);
  sym<int (*)(void *)>("cudaStreamSynchronize")(stream);
  sym<int (*)(void *)>("cudaStreamDestroy")(stream);
  ckptio_device_free(ctx_, CKPTIO_DEVICE_CUDA(last_gpu()), dst);
}

// The experimental device calls (what `ckptio bench` uses instead of a CUDA
// runtime of its own): a GPU described, a pinned host buffer copied to a
// GPU and back through the context's runtime, every refusal said.
TEST_F(Cuda, DeviceCallsDescribeCopyAndPin) {
  const int gpu = CKPTIO_DEVICE_CUDA(last_gpu());
  ckptio_device_info info = CKPTIO_DEVICE_INFO_INIT;
  ASSERT_EQ(ckptio_device_describe(ctx_, gpu, &info), 0) << ckptio_last_open_error();
  EXPECT_NE(info.pci_bus_id[0], '\0');
  EXPECT_NE(std::string(info.runtime).find("libcudart"), std::string::npos) << info.runtime;
  if (fake_gpu()) {
    EXPECT_NE(std::string(info.name).find("not a GPU"), std::string::npos) << info.name;
  }
  if (fake_gpu() && gpu_count() > 1) {  // the fake numbers its GPUs up the PCI bus
    ckptio_device_info first = CKPTIO_DEVICE_INFO_INIT;
    ASSERT_EQ(ckptio_device_describe(ctx_, CKPTIO_DEVICE_CUDA(0), &first), 0) << ckptio_last_open_error();
    EXPECT_STRNE(first.pci_bus_id, info.pci_bus_id);
  }

  const size_t n = 3 << 20;  // more than one staging chunk of the fixture's ring
  std::vector<uint8_t> want(n);
  for (size_t i = 0; i < n; i++) want[i] = (uint8_t)(i * 7 + 3);
  // Page-aligned, as a program's staging would be; pinned through the context.
  uint8_t *host = static_cast<uint8_t *>(aligned_alloc(4096, n));
  ASSERT_NE(host, nullptr);
  void *dev = nullptr;
  ASSERT_EQ(ckptio_device_alloc(ctx_, gpu, n, &dev), 0);
  ASSERT_EQ(ckptio_host_pin(ctx_, host, n), 0) << ckptio_last_open_error();
  struct fake_cudart_stats before = FAKE_CUDART_STATS_INIT;
  if (fake_gpu()) before = stats();
  memcpy(host, want.data(), n);
  ASSERT_EQ(ckptio_device_copy(ctx_, dev, gpu, host, CKPTIO_DEVICE_HOST, n), 0) << ckptio_last_open_error();
  memset(host, 0, n);
  ASSERT_EQ(ckptio_device_copy(ctx_, host, CKPTIO_DEVICE_HOST, dev, gpu, n), 0) << ckptio_last_open_error();
  EXPECT_EQ(memcmp(host, want.data(), n), 0) << "the bytes did not come back from the GPU";
  if (fake_gpu()) {
    struct fake_cudart_stats after = stats();
    EXPECT_EQ(after.pageable_copies, before.pageable_copies) << "a copy from pinned memory ran as a pageable one";
    EXPECT_GE(after.async_copies, before.async_copies + 2);
  }
  std::vector<uint8_t> direct(n);  // through the runtime's own cudaMemcpy (pageable: after the counts)
  from_gpu(direct.data(), dev, n);
  EXPECT_EQ(direct, want) << "the upload did not land in the GPU's memory";
  EXPECT_EQ(ckptio_device_copy(ctx_, dev, gpu, host, CKPTIO_DEVICE_HOST, 0), 0) << "0 bytes is a copy of nothing";

  // Refusals, each with a sentence naming the call.
  auto said = [](const char *what) { return std::string(ckptio_last_open_error()).find(what) != std::string::npos; };
  EXPECT_EQ(ckptio_device_copy(ctx_, host, CKPTIO_DEVICE_HOST, want.data(), CKPTIO_DEVICE_HOST, n),
            CKPTIO_E_INVALID_ARG);
  EXPECT_TRUE(said("ckptio_device_copy: one side must be the host")) << ckptio_last_open_error();
  EXPECT_EQ(ckptio_device_copy(ctx_, dev, CKPTIO_DEVICE_CUDA(gpu_count()), host, CKPTIO_DEVICE_HOST, n),
            CKPTIO_E_DEVICE);
  EXPECT_TRUE(said("no GPU")) << ckptio_last_open_error();
  EXPECT_EQ(ckptio_device_describe(ctx_, CKPTIO_DEVICE_CUDA(gpu_count()), &info), CKPTIO_E_DEVICE);
  EXPECT_TRUE(said("ckptio_device_describe: no GPU")) << ckptio_last_open_error();
  EXPECT_EQ(ckptio_host_pin(ctx_, host, n), CKPTIO_E_DEVICE) << "pinned twice";
  EXPECT_TRUE(said("ckptio_host_pin: cudaHostRegister")) << ckptio_last_open_error();
  EXPECT_EQ(ckptio_host_unpin(ctx_, want.data()), CKPTIO_E_DEVICE) << "never pinned";
  EXPECT_TRUE(said("cudaHostUnregister")) << ckptio_last_open_error();
  EXPECT_EQ(ckptio_device_copy(nullptr, dev, gpu, host, CKPTIO_DEVICE_HOST, n), CKPTIO_E_INVALID_ARG);
  EXPECT_TRUE(said("ctx is NULL")) << ckptio_last_open_error();

  ASSERT_EQ(ckptio_host_unpin(ctx_, host), 0) << ckptio_last_open_error();
  EXPECT_STREQ(ckptio_last_open_error(), "") << "a call that succeeds leaves no detail";
  ckptio_device_free(ctx_, gpu, dev);
  free(host);
}

// A runtime failure of the copy is CKPTIO_E_DEVICE naming the GPU, the
// runtime's call and its error; the caller's current GPU is kept.
TEST_F(Cuda, DeviceCopyFailureIsNamedAndKeepsTheCurrentGpu) {
  CKPTIO_SKIP_ON_REAL_GPU("injected failures");
  const size_t n = 1 << 16;
  std::vector<uint8_t> host(n, 0x3C);
  void *dev = nullptr;
  ASSERT_EQ(ckptio_device_alloc(ctx_, CKPTIO_DEVICE_CUDA(last_gpu()), n, &dev), 0);
  auto set_device = sym<int (*)(int)>("cudaSetDevice");
  auto get_device = sym<int (*)(int *)>("cudaGetDevice");
  ASSERT_EQ(set_device(0), 0);
  // Pageable memory is allowed (the copy is slower, not wrong).
  ASSERT_EQ(ckptio_device_copy(ctx_, dev, CKPTIO_DEVICE_CUDA(last_gpu()), host.data(), CKPTIO_DEVICE_HOST, n), 0)
      << ckptio_last_open_error();
  int current = -1;
  ASSERT_EQ(get_device(&current), 0);
  EXPECT_EQ(current, 0) << "the copy left another GPU current in the caller's thread";
  fail_nth("cudaMemcpyAsync", 1, 2);  // cudaErrorMemoryAllocation
  int rc = ckptio_device_copy(ctx_, host.data(), CKPTIO_DEVICE_HOST, dev, CKPTIO_DEVICE_CUDA(last_gpu()), n);
  long calls = sym<long (*)(const char *)>("fake_cudart_calls")("cudaMemcpyAsync");
  fail_nth(nullptr, 0, 0);
  ASSERT_GE(calls, 1) << "the fault was never reached: this case tests nothing";
  EXPECT_EQ(rc, CKPTIO_E_DEVICE);
  std::string msg = ckptio_last_open_error();
  EXPECT_NE(msg.find("ckptio_device_copy: GPU " + std::to_string(last_gpu())), std::string::npos) << msg;
  EXPECT_NE(msg.find("cudaMemcpyAsync (device to host)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cudaErrorMemoryAllocation"), std::string::npos) << msg;
  ASSERT_EQ(get_device(&current), 0);
  EXPECT_EQ(current, 0);
  ckptio_device_free(ctx_, CKPTIO_DEVICE_CUDA(last_gpu()), dev);
}

// ckptio_device_info follows the rule of versioned structs: an older,
// shorter struct gets only its fields, a larger one with a zero tail is
// filled, and a size never set is refused naming the struct, untouched.
TEST_F(Cuda, DeviceInfoFollowsTheVersionedStructRule) {
  const int gpu = CKPTIO_DEVICE_CUDA(0);
  ckptio_device_info older = CKPTIO_DEVICE_INFO_INIT;
  older.size = offsetof(ckptio_device_info, runtime);
  strcpy(older.runtime, "the caller's memory");
  ASSERT_EQ(ckptio_device_describe(ctx_, gpu, &older), 0) << ckptio_last_open_error();
  EXPECT_NE(older.pci_bus_id[0], '\0');
  EXPECT_STREQ(older.runtime, "the caller's memory") << "wrote past the caller's size";
  EXPECT_EQ(older.size, offsetof(ckptio_device_info, runtime));

  struct {
    ckptio_device_info s;
    unsigned char extra[64];
  } larger;
  memset(&larger, 0, sizeof(larger));
  larger.s.size = sizeof(larger);
  ASSERT_EQ(ckptio_device_describe(ctx_, gpu, &larger.s), 0) << ckptio_last_open_error();
  EXPECT_NE(larger.s.runtime[0], '\0');
  for (unsigned char c : larger.extra) EXPECT_EQ(c, 0) << "wrote past the struct it knows";
  larger.extra[0] = 1;
  larger.s.pci_bus_id[0] = '\0';
  EXPECT_EQ(ckptio_device_describe(ctx_, gpu, &larger.s), CKPTIO_E_INVALID_ARG);
  EXPECT_NE(std::string(ckptio_last_open_error()).find("ckptio_device_info"), std::string::npos)
      << ckptio_last_open_error();
  EXPECT_EQ(larger.s.pci_bus_id[0], '\0') << "a refused struct is not written";
  ckptio_device_info unset = CKPTIO_DEVICE_INFO_INIT;
  unset.size = 0;
  EXPECT_EQ(ckptio_device_describe(ctx_, CKPTIO_DEVICE_CUDA(gpu_count()), &unset), CKPTIO_E_INVALID_ARG)
      << "the size is checked before the GPU";
}
