// Snapshot memory (ckptio_options.snapshot_bytes) against a slow disk (the
// fault layer's write-rate model): a state that fits is snapshotted in its
// copy time while the save takes many times longer; without it the old rule
// holds (the snapshot waits for the writes of all but the ring's worth); a
// state 4x the memory stalls by the documented rule; a tensor changed right
// after the snapshot point never reaches the file. In the cuda-fake variant
// the tensors live on fake GPUs whose copies run at a modeled bandwidth.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <unistd.h>
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
constexpr size_t kChunk = 1 * MiB, kStaging = 4 * MiB;
constexpr double kDiskBps = 40e6;   // the modeled disk: 40 MB/s
constexpr long kGpuMBps = 200;      // the modeled copy engine: 200 MB/s per direction


// A state of n tensors of `each` bytes, on the host or (cuda-fake) on GPU 0.
struct State {
  std::vector<std::vector<uint8_t>> host;
  std::vector<void *> dev;
  std::vector<std::string> names;

  State(size_t n, size_t each) {
    for (size_t i = 0; i < n; i++) {
      host.emplace_back(each);
      for (size_t b = 0; b < each; b++) host[i][b] = static_cast<uint8_t>(b * 31 + i * 7 + 1);
      names.push_back("layer." + std::to_string(i));
      if (on_gpu()) {
        void *p = nullptr;
        EXPECT_EQ(sym<int (*)(void **, size_t)>("cudaMalloc")(&p, each), 0);
        to_gpu(p, host[i].data(), each);
        dev.push_back(p);
      }
    }
  }
  ~State() {
    for (void *p : dev) sym<int (*)(void *)>("cudaFree")(p);
  }
  size_t bytes() const { return host.size() * host[0].size(); }
  ckptio_tensor desc(size_t i) const {
    ckptio_tensor t{};
    t.name = names[i].c_str();
    t.dtype = CKPTIO_U8;
    t.ndim = 1;
    t.shape[0] = static_cast<int64_t>(host[i].size());
    t.data = on_gpu() ? dev[i] : host[i].data();
    t.device = on_gpu() ? CKPTIO_DEVICE_CUDA(0) : CKPTIO_DEVICE_HOST;
    return t;
  }
  // Overwrites tensor i where it lives (the training step after the snapshot).
  void scribble(size_t i) {
    std::vector<uint8_t> junk(host[i].size(), 0xEE);
    if (on_gpu()) to_gpu(dev[i], junk.data(), junk.size());
    else memcpy(host[i].data(), junk.data(), junk.size());
  }
};

class Snapshot : public ::testing::Test {
 protected:
  void SetUp() override {
    model_copies(kGpuMBps);
    ckptio_fault_slow_writes(static_cast<uint64_t>(kDiskBps));
  }
  void TearDown() override {
    ckptio_fault_slow_writes(0);
    default_copies();
  }

  ckptio_ctx *make_ctx(size_t snapshot) {
    ckptio_options o = small_options(kChunk, kStaging, 4);
    o.snapshot_bytes = snapshot;
    ckptio_ctx *ctx = nullptr;
    EXPECT_EQ(ckptio_ctx_create(&o, &ctx), 0) << ckptio_last_open_error();
    return ctx;
  }

  // Saves the state; scribbles every tensor right after the snapshot point.
  ckptio_stats save(ckptio_ctx *ctx, const std::string &path, State &s, bool scribble = false, bool poll = true) {
    ckptio_writer *w = nullptr;
    EXPECT_EQ(ckptio_writer_open(ctx, path.c_str(), CKPTIO_FORMAT_SAFETENSORS, nullptr, &w), 0);
    for (size_t i = 0; i < s.host.size(); i++) {
      ckptio_tensor t = s.desc(i);
      EXPECT_EQ(ckptio_writer_add(w, &t), 0) << ckptio_writer_last_error(w);
    }
    EXPECT_EQ(ckptio_writer_commit_async(w), 0) << ckptio_writer_last_error(w);
    EXPECT_EQ(ckptio_writer_wait_snapshot(w), 0) << ckptio_writer_last_error(w);
    // Asked before the scribble, which on the fake GPU takes most of the
    // writes still to come (64 MiB at the modeled 200 MB/s against 16 MiB
    // at 40 MB/s) and once left the poll after the last write under load.
    if (poll) {
      EXPECT_EQ(ckptio_writer_poll_durable(w), 0) << "the slow disk should still be writing";
    }
    if (scribble)
      for (size_t i = 0; i < s.host.size(); i++) s.scribble(i);
    EXPECT_EQ(ckptio_writer_wait_durable(w), 0) << ckptio_writer_last_error(w);
    ckptio_stats st{};
    st.size = sizeof(st);
    EXPECT_EQ(ckptio_writer_stats(w, &st), 0);
    EXPECT_EQ(ckptio_writer_close(w), 0);
    return st;
  }

  // The file holds the state as it was before any scribble.
  void expect_file(ckptio_ctx *ctx, const std::string &path, const std::vector<std::vector<uint8_t>> &want) {
    ckptio_reader *r = nullptr;
    ASSERT_EQ(ckptio_reader_open(ctx, path.c_str(), nullptr, &r), 0) << ckptio_last_open_error();
    for (size_t i = 0; i < want.size(); i++) {
      std::vector<uint8_t> got(want[i].size());
      int64_t k = ckptio_reader_find(r, ("layer." + std::to_string(i)).c_str());
      ASSERT_GE(k, 0);
      ASSERT_EQ(ckptio_reader_load(r, static_cast<size_t>(k), got.data(), got.size()), 0) << ckptio_reader_last_error(r);
      EXPECT_TRUE(got == want[i]) << "tensor " << i << " is not what was there at the snapshot point";
    }
    ckptio_reader_close(r);
  }

  // The copy limit of the same run: pinned D2H at the modeled bandwidth
  // (cuda-fake), or the same bytes copied to host memory, timed: by
  // cudaMemcpy on a real GPU, by memcpy on the host.
  double copy_seconds(const State &s) {
    if (fake_gpu()) return static_cast<double>(s.bytes()) / (kGpuMBps * 1e6);
    std::vector<uint8_t> dst(s.bytes());
    memset(dst.data(), 0, dst.size());
    auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < s.host.size(); i++) {
      uint8_t *to = dst.data() + i * s.host[0].size();
      if (on_gpu()) from_gpu(to, s.dev[i], s.host[i].size());
      else memcpy(to, s.host[i].data(), s.host[i].size());
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // The snapshot time of the same save with no disk model, on this machine
  // as it is now: what the copies and the pipeline's own work take, which
  // the limits below are ratios of (the larger of two runs).
  double reference_snapshot(ckptio_ctx *ctx, const TempDir &dir, State &s) {
    ckptio_fault_slow_writes(0);
    double ref = 0;
    for (int k = 0; k < 2; k++) {
      ckptio_stats st = save(ctx, dir.file("ref.safetensors"), s, false, /*poll=*/false);
      ref = std::max(ref, st.snapshot_seconds);
    }
    ckptio_fault_slow_writes(static_cast<uint64_t>(kDiskBps));
    return ref;
  }
};

TEST_F(Snapshot, AStateThatFitsIsSnapshottedAtCopySpeed) {
  TempDir dir;
  State s(8, 4 * MiB);  // 32 MiB: 0.84 s on the modeled disk
  auto want = s.host;
  ckptio_ctx *ctx = make_ctx(s.bytes());
  double ref = reference_snapshot(ctx, dir, s);
  ckptio_stats st = save(ctx, dir.file("a.safetensors"), s, /*scribble=*/true);
  double copy = copy_seconds(s), disk = s.bytes() / kDiskBps;
  // The slow disk does not move the snapshot: it stays within the copies'
  // time and twice the same snapshot to a fast disk (host copies are
  // milliseconds, where a shared 2-core machine's noise is of their size).
  double limit = std::max(1.25 * copy, 2 * ref);
  EXPECT_LE(st.snapshot_seconds, limit) << "copy limit " << copy << " s, fast-disk snapshot " << ref << " s";
  EXPECT_GE(st.seconds, 0.9 * disk) << "the save writes behind, at the disk's rate";
  EXPECT_GE(st.seconds, 3 * st.snapshot_seconds) << "snapshot " << st.snapshot_seconds << " s";
  expect_file(ctx, dir.file("a.safetensors"), want);
  ckptio_ctx_free(ctx);
}

TEST_F(Snapshot, WithoutSnapshotMemoryTheOldRuleHolds) {
  TempDir dir;
  State s(8, 4 * MiB);
  ckptio_ctx *ctx = make_ctx(0);
  double ref = reference_snapshot(ctx, dir, s);
  ckptio_stats st = save(ctx, dir.file("b.safetensors"), s);
  // The snapshot waits for the writes of all but the ring's worth.
  double rule = (s.bytes() - kStaging) / kDiskBps;
  EXPECT_GE(st.snapshot_seconds, 0.85 * rule) << "rule " << rule << " s";
  EXPECT_LE(st.snapshot_seconds, 1.3 * rule + 2 * std::max(copy_seconds(s), ref))
      << "rule " << rule << " s, fast-disk snapshot " << ref << " s";
  ckptio_ctx_free(ctx);
}

TEST_F(Snapshot, AStateFourTimesTheMemoryStallsByTheRule) {
  TempDir dir;
  State s(16, 4 * MiB);  // 64 MiB against 4 MiB of ring + 12 MiB of snapshot memory
  auto want = s.host;
  size_t memory = kStaging + 12 * MiB;
  ckptio_ctx *ctx = make_ctx(12 * MiB);
  double ref = reference_snapshot(ctx, dir, s);
  ckptio_stats st = save(ctx, dir.file("c.safetensors"), s, /*scribble=*/true);
  double rule = (s.bytes() - memory) / kDiskBps;  // the bytes beyond the memory go through the disk first
  EXPECT_GE(st.snapshot_seconds, 0.85 * rule) << "rule " << rule << " s";
  EXPECT_LE(st.snapshot_seconds, 1.3 * rule + 2 * std::max(copy_seconds(s), ref))
      << "rule " << rule << " s, fast-disk snapshot " << ref << " s";
  EXPECT_GE(st.seconds - st.snapshot_seconds, 0.8 * memory / kDiskBps) << "the memory's worth is written after";
  expect_file(ctx, dir.file("c.safetensors"), want);
  ckptio_ctx_free(ctx);
}

// A second save started while the first is still writing takes the slots
// the first has released and waits for the rest: both files are exact, and
// the second's snapshot comes no earlier than the first's writes free the
// memory it needs.
TEST_F(Snapshot, ASecondSaveWaitsForFreeSnapshotMemory) {
  TempDir dir;
  State s(4, 4 * MiB);  // 16 MiB, the memory holds exactly one
  auto want = s.host;
  ckptio_ctx *ctx = make_ctx(s.bytes() - kStaging);
  ckptio_writer *w1 = nullptr;
  ASSERT_EQ(ckptio_writer_open(ctx, dir.file("1.safetensors").c_str(), CKPTIO_FORMAT_SAFETENSORS, nullptr, &w1), 0);
  for (size_t i = 0; i < 4; i++) {
    ckptio_tensor t = s.desc(i);
    ASSERT_EQ(ckptio_writer_add(w1, &t), 0);
  }
  ASSERT_EQ(ckptio_writer_commit_async(w1), 0);
  ASSERT_EQ(ckptio_writer_wait_snapshot(w1), 0);
  ckptio_stats st2 = save(ctx, dir.file("2.safetensors"), s);
  ASSERT_EQ(ckptio_writer_wait_durable(w1), 0);
  ckptio_writer_close(w1);
  EXPECT_GE(st2.snapshot_seconds, 0.5 * s.bytes() / kDiskBps) << "it waited for the first save's writes";
  expect_file(ctx, dir.file("1.safetensors"), want);
  expect_file(ctx, dir.file("2.safetensors"), want);
  ckptio_ctx_free(ctx);
}

// A host tensor filled by a callback that, at the last copy of a save,
// waits as long as four chunk writes take on the modeled disk and then
// asks how many bytes have been written.
struct WatchedFill {
  ckptio_writer *w = nullptr;
  std::vector<uint8_t> bytes;
  std::atomic<uint64_t> filled{0};
  std::atomic<int64_t> written_at_last{-1};
};

int fill_watching(void *arg, uint64_t offset, void *dst, uint64_t n, char *, size_t) {
  auto *f = static_cast<WatchedFill *>(arg);
  memcpy(dst, f->bytes.data() + offset, n);
  if (f->filled.fetch_add(n) + n == f->bytes.size()) {
    usleep(static_cast<useconds_t>(4 * kChunk / kDiskBps * 1e6));
    uint64_t done = 0, total = 0;
    ckptio_writer_progress(f->w, &done, &total);
    f->written_at_last = static_cast<int64_t>(done);
  }
  return 0;
}

// Copies come first at commit_async: with idle workers and a state the
// memory holds, no chunk is written before its last chunk is copied (the
// training step's copies have the CPUs and the memory to themselves), and
// the CRCs then taken from the snapshot memory before each write hold: the
// file loads with every CRC checked. (Before, an idle worker took a copied
// chunk's write while the last copies ran.) A state larger than the memory
// (the tests above) ends the deferral when its copies wait for slots.
TEST_F(Snapshot, NoChunkIsWrittenBeforeTheLastIsCopied) {
  TempDir dir;
  State s(2, 4 * MiB);
  WatchedFill f;
  f.bytes.resize(8 * MiB);
  for (size_t b = 0; b < f.bytes.size(); b++) f.bytes[b] = static_cast<uint8_t>(b * 13 + 5);
  ckptio_ctx *ctx = make_ctx(s.bytes() + f.bytes.size() + kChunk);
  std::string path = dir.file("f.safetensors");
  ASSERT_EQ(ckptio_writer_open(ctx, path.c_str(), CKPTIO_FORMAT_SAFETENSORS, nullptr, &f.w), 0);
  for (size_t i = 0; i < s.host.size(); i++) {
    ckptio_tensor t = s.desc(i);
    ASSERT_EQ(ckptio_writer_add(f.w, &t), 0) << ckptio_writer_last_error(f.w);
  }
  ckptio_tensor filled{};
  filled.name = "filled";
  filled.dtype = CKPTIO_U8;
  filled.ndim = 1;
  filled.shape[0] = static_cast<int64_t>(f.bytes.size());
  filled.device = CKPTIO_DEVICE_HOST;
  ASSERT_EQ(ckptio_writer_add_fill(f.w, &filled, fill_watching, &f), 0) << ckptio_writer_last_error(f.w);
  ASSERT_EQ(ckptio_writer_commit_async(f.w), 0) << ckptio_writer_last_error(f.w);
  ASSERT_EQ(ckptio_writer_wait_durable(f.w), 0) << ckptio_writer_last_error(f.w);
  ASSERT_EQ(ckptio_writer_close(f.w), 0);
  EXPECT_EQ(f.written_at_last.load(), 0) << "bytes written before the last chunk was copied";
  expect_file(ctx, path, s.host);
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(ctx, path.c_str(), nullptr, &r), 0) << ckptio_last_open_error();
  std::vector<uint8_t> got(f.bytes.size());
  ASSERT_EQ(ckptio_reader_load(r, static_cast<size_t>(ckptio_reader_find(r, "filled")), got.data(), got.size()), 0)
      << ckptio_reader_last_error(r);
  EXPECT_TRUE(got == f.bytes);
  ckptio_reader_close(r);
  ckptio_ctx_free(ctx);
}

TEST_F(Snapshot, SizesRoundDownToWholeChunks) {
  ckptio_options o = small_options(kChunk, kStaging, 2);
  o.snapshot_bytes = 8 * MiB + 5;
  ckptio_ctx *ctx = nullptr;
  ASSERT_EQ(ckptio_ctx_create(&o, &ctx), 0);
  ckptio_options got = o;
  ckptio_ctx_options(ctx, &got);
  EXPECT_EQ(got.snapshot_bytes, 8 * MiB);
  ckptio_ctx_free(ctx);
}

}  // namespace
