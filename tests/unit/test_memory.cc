// Memory bounds of a load: into host buffers the peak RSS grows by at most
// 64 MiB beyond the destination (no hidden copy of the file, no mapped
// pages kept, no per-element expansion of a .pt's pickle): with the
// destination S, the peak is at most S + 64 MiB; onto a GPU the host side stays within the
// staging ring plus 64 MiB whatever the checkpoint's size. Peak RSS is
// VmHWM, reset before each phase through /proc/self/clear_refs.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "ckpt_fixture.h"

using namespace ckptio_test;

namespace {

uint64_t status_kib(const char *field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(field, 0) == 0) return std::strtoull(line.c_str() + strlen(field), nullptr, 10);
  return 0;
}

bool reset_peak() {
  int fd = open("/proc/self/clear_refs", O_WRONLY);
  bool ok = fd >= 0 && write(fd, "5", 1) == 1;
  if (fd >= 0) close(fd);
  return ok;
}

const uint64_t kSize = 512ull << 20;
const uint64_t kSlack = 64ull << 20;

// Writes a 512 MiB checkpoint (eight 64 MiB tensors) from untouched calloc
// memory: zero pages, which cost the writer no RSS.
void write_big(ckptio_ctx *ctx, const std::string &path, ckptio_format format) {
  void *zeros = calloc(1, kSize);
  ASSERT_NE(zeros, nullptr);
  ckptio_writer *w;
  ASSERT_EQ(ckptio_writer_open(ctx, path.c_str(), format, nullptr, &w), 0);
  std::vector<std::string> names;
  for (int i = 0; i < 8; i++) names.push_back("layer." + std::to_string(i));
  for (int i = 0; i < 8; i++) {
    ckptio_tensor t{names[i].c_str(), CKPTIO_BF16, 2, {4096, 8192}, (char *)zeros + i * (kSize / 8),
                    CKPTIO_DEVICE_HOST};
    ASSERT_EQ(ckptio_writer_add(w, &t), 0);
  }
  ASSERT_EQ(ckptio_writer_commit(w), 0) << ckptio_writer_last_error(w);
  ckptio_writer_close(w);
  free(zeros);
}

}  // namespace

class Memory : public ::testing::TestWithParam<ckptio_format> {};

TEST_P(Memory, HostLoadAddsAtMost64MiBToTheDestination) {
  if (on_gpu()) GTEST_SKIP() << "host variant only";
  TempDir dir;
  ckptio_ctx *ctx;
  ASSERT_EQ(ckptio_ctx_create(nullptr, &ctx), 0);
  std::string path = dir.file(GetParam() == CKPTIO_FORMAT_PYTORCH ? "m.pt" : "m.safetensors");
  write_big(ctx, path, GetParam());
  char *dst = (char *)malloc(kSize);
  memset(dst, 1, kSize);  // touched once, as a caller's reused buffers are (not 0:
                          // malloc + memset(0) may become an untouched calloc)
  // Every method: pread into the destination, the map (whose pages must be
  // dropped as they are copied: mapped file pages count in RSS), O_DIRECT.
  for (auto m : {CKPTIO_LOAD_PREAD, CKPTIO_LOAD_MMAP, CKPTIO_LOAD_DIRECT}) {
    SCOPED_TRACE("method " + std::to_string(m));
    if (!reset_peak()) GTEST_SKIP() << "cannot reset the peak RSS (/proc/self/clear_refs)";
    uint64_t base = status_kib("VmRSS:") << 10;
    ckptio_options o = CKPTIO_OPTIONS_INIT;
    o.load_method = m;
    ckptio_reader *r;
    ASSERT_EQ(ckptio_reader_open(ctx, path.c_str(), &o, &r), 0) << ckptio_last_open_error();
    std::vector<ckptio_load_request> reqs;
    for (size_t i = 0; i < ckptio_reader_count(r); i++) {
      ckptio_tensor_info info;
      ckptio_reader_info(r, i, &info);
      reqs.push_back({i, dst + i * (kSize / 8), info.nbytes, CKPTIO_DEVICE_HOST});
    }
    ASSERT_EQ(ckptio_reader_load_many(r, reqs.data(), reqs.size()), 0) << ckptio_reader_last_error(r);
    uint64_t peak = status_kib("VmHWM:") << 10;
    // The destination is already resident: all a load may add is slack.
    EXPECT_LE(peak - base, kSlack) << "peak grew by " << ((peak - base) >> 20) << " MiB";
    ckptio_reader_close(r);
  }
  free(dst);
  ckptio_ctx_free(ctx);
}

TEST_P(Memory, GpuLoadHostSideStaysWithinStaging) {
  if (!on_gpu()) GTEST_SKIP() << "needs a CUDA runtime: runs in the cuda-fake and gpu variants";
  TempDir dir;
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  o.staging_bytes = 32u << 20;
  o.chunk_bytes = 4u << 20;
  ckptio_ctx *ctx;
  ASSERT_EQ(ckptio_ctx_create(&o, &ctx), 0);
  std::string path = dir.file(GetParam() == CKPTIO_FORMAT_PYTORCH ? "m.pt" : "m.safetensors");
  write_big(ctx, path, GetParam());
  void *dev = nullptr;
  ASSERT_EQ(ckptio_device_alloc(ctx, CKPTIO_DEVICE_CUDA(0), kSize, &dev), 0);
  if (!reset_peak()) GTEST_SKIP() << "cannot reset the peak RSS (/proc/self/clear_refs)";
  uint64_t base = status_kib("VmRSS:") << 10;
  ckptio_reader *r;
  ASSERT_EQ(ckptio_reader_open(ctx, path.c_str(), nullptr, &r), 0);
  std::vector<ckptio_load_request> reqs;
  for (size_t i = 0; i < ckptio_reader_count(r); i++) {
    ckptio_tensor_info info;
    ckptio_reader_info(r, i, &info);
    reqs.push_back({i, (char *)dev + i * (kSize / 8), info.nbytes, CKPTIO_DEVICE_CUDA(0)});
  }
  ASSERT_EQ(ckptio_reader_load_many(r, reqs.data(), reqs.size()), 0) << ckptio_reader_last_error(r);
  uint64_t peak = status_kib("VmHWM:") << 10;
  // The fake keeps "device memory" in a shared mapping of this process, so
  // its 512 MiB show in RSS too; what is left is the host side. A real
  // GPU's memory is not in RSS.
  uint64_t grew = peak > base ? peak - base : 0;
  uint64_t host = !fake_gpu() ? grew : grew > kSize ? grew - kSize : 0;
  EXPECT_LE(host, o.staging_bytes + kSlack) << "host side grew by " << (host >> 20) << " MiB";
  ckptio_reader_close(r);
  ckptio_device_free(ctx, CKPTIO_DEVICE_CUDA(0), dev);
  ckptio_ctx_free(ctx);
}

INSTANTIATE_TEST_SUITE_P(Formats, Memory, ::testing::Values(CKPTIO_FORMAT_SAFETENSORS, CKPTIO_FORMAT_PYTORCH));

// Saves host tensors (also through a CUDA context: the ring is pinned at
// its first GPU copy, so host saves pin and touch no more of it).
static int save_host(ckptio_ctx *ctx, const std::string &path, const Tensor &t) {
  ckptio_writer *w = nullptr;
  int rc = ckptio_writer_open(ctx, path.c_str(), CKPTIO_FORMAT_SAFETENSORS, nullptr, &w);
  if (rc < 0) return rc;
  ckptio_tensor d = host_desc(t);
  if ((rc = ckptio_writer_add(w, &d)) == 0) rc = ckptio_writer_commit(w);
  int rc2 = ckptio_writer_close(w);
  return rc < 0 ? rc : rc2;
}

// A context is cheap until used: creating one with a 256 MiB ring touches
// none of it (a CUDA context neither: its ring is pinned lazily, at the
// first GPU copy), a small save touches a slot, not the ring, and the slots
// a save touched stay touched, so the next save of the same size grows
// nothing. In the GPU variants the context has CUDA and the saves are of
// host tensors (a GPU's first use would add the runtime's own memory).
TEST(Staging, TouchedOnFirstUseAndKept) {
#ifdef __SANITIZE_ADDRESS__
  GTEST_SKIP() << "under ASan, RSS is its shadow and quarantine's, not the ring's";
#endif
  TempDir dir;
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  o.staging_bytes = 256u << 20;
  o.chunk_bytes = 8u << 20;
  o.cuda = on_gpu() ? 1 : 0;
  if (on_gpu()) gpu_count();  // the runtime loaded before the first measure
  uint64_t before = status_kib("VmRSS:") << 10;
  ckptio_ctx *ctx;
  ASSERT_EQ(ckptio_ctx_create(&o, &ctx), 0);
  uint64_t created = status_kib("VmRSS:") << 10;
  EXPECT_LT(created - before, 16u << 20) << "creating the context touched " << ((created - before) >> 20) << " MiB";
  Tensor small = make_tensor("x", CKPTIO_F32, {4}, 1);
  ASSERT_EQ(save_host(ctx, dir.file("small.safetensors"), small), 0);
  uint64_t after_small = status_kib("VmRSS:") << 10;
  EXPECT_LT(after_small - created, 2 * o.chunk_bytes + (8u << 20)) << "a 16-byte save touched too much";
  Tensor big = make_tensor("y", CKPTIO_F32, {16, 1 << 20}, 2);  // 64 MiB
  ASSERT_EQ(save_host(ctx, dir.file("big.safetensors"), big), 0);
  uint64_t after_big = status_kib("VmRSS:") << 10;
  ASSERT_EQ(save_host(ctx, dir.file("big2.safetensors"), big), 0);
  uint64_t after_again = status_kib("VmRSS:") << 10;
  EXPECT_LT(after_again > after_big ? after_again - after_big : 0, 8u << 20) << "the second save touched new slots";
  ckptio_ctx_free(ctx);
}

// The minor page faults of the calling thread alone (the context's own
// threads fault on their own counts).
static long thread_minflt() {
  struct rusage ru;
  return getrusage(RUSAGE_THREAD, &ru) == 0 ? ru.ru_minflt : -1;
}

// Snapshot memory is made ready behind the caller's back: creating a
// context with 256 MiB of it faults in none of it on the calling thread
// (the old context touched all of it there: at least one fault per 2 MiB
// huge page, 128 and more), the memory is resident soon after without any
// save, and a first save that fits finds it ready: it grows the process by
// far less than its size. In the GPU variants the memory is also pinned
// behind the caller, and the save goes through the same context.
TEST(Staging, SnapshotMemoryIsPreparedBehindContextCreation) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "under a sanitizer, RSS and faults are its shadow memory's, not the ring's";
#endif
  TempDir dir;
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  o.staging_bytes = 16u << 20;
  o.chunk_bytes = 8u << 20;
  o.snapshot_bytes = 256u << 20;
  o.cuda = on_gpu() ? 1 : 0;
  o.numa = 0;  // placement starts every worker, each a few faults on this thread
  if (on_gpu()) gpu_count();  // the runtime loaded before the first measure
  ckptio_ctx *ctx;
  {  // a context without snapshot memory first: the libraries it loads are not counted
    ckptio_options plain = o;
    plain.snapshot_bytes = 0;
    ASSERT_EQ(ckptio_ctx_create(&plain, &ctx), 0);
    ckptio_ctx_free(ctx);
  }
  uint64_t before = status_kib("VmRSS:") << 10;
  long faults = thread_minflt();
  ASSERT_EQ(ckptio_ctx_create(&o, &ctx), 0);
  faults = thread_minflt() - faults;
  EXPECT_LT(faults, (long)(o.snapshot_bytes / (2u << 20) / 2))
      << "creating the context faulted in its snapshot memory on the caller's thread";
  uint64_t rss = 0;
  for (int i = 0; i < 1000; i++) {  // 10 s at most; 0.1-0.3 s here
    rss = status_kib("VmRSS:") << 10;
    if (rss > before && rss - before >= o.snapshot_bytes - (8u << 20)) break;
    usleep(10 * 1000);
  }
  EXPECT_GE(rss - before, o.snapshot_bytes - (8u << 20)) << "the snapshot memory was never faulted in";
  Tensor big = make_tensor("y", CKPTIO_F32, {32, 1 << 20}, 2);  // 128 MiB, fits the snapshot memory
  uint64_t ready = status_kib("VmRSS:") << 10;
  ASSERT_EQ(save_host(ctx, dir.file("big.safetensors"), big), 0);
  uint64_t saved = status_kib("VmRSS:") << 10;
  EXPECT_LT(saved > ready ? saved - ready : 0, 32u << 20) << "the first save faulted in its own slots";
  ckptio_ctx_free(ctx);
}

// A context freed at once stops preparing: it does not fault in (nor wait
// for) memory nobody will use (2 GiB: 0.4-0.7 s of faults here).
TEST(Staging, AContextFreedAtOnceStopsPreparing) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "under a sanitizer, RSS and faults are its shadow memory's, not the ring's";
#endif
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  o.snapshot_bytes = 2ull << 30;
  o.cuda = 0;
  if (!reset_peak()) GTEST_SKIP() << "cannot reset the peak RSS (/proc/self/clear_refs)";
  uint64_t before = status_kib("VmRSS:") << 10;
  ckptio_ctx *ctx;
  ASSERT_EQ(ckptio_ctx_create(&o, &ctx), 0);
  ckptio_ctx_free(ctx);
  uint64_t peak = status_kib("VmHWM:") << 10;
  EXPECT_LT(peak > before ? peak - before : 0, 1ull << 30) << "freeing the context waited for its preparing";
}
