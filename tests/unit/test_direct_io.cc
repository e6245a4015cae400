// O_DIRECT straight into and out of the caller's memory. Reads: the ragged
// ends of every alignment, the bytes around the destination left alone, the
// loader choosing in place or a slot by the destination's alignment, the
// writer putting whole-page tensors on pages, a failing disk. Writes: chunks
// beyond the ring written from page-aligned tensors, the snapshot point
// after them, a failing disk.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>

#include "ckpt_fixture.h"
extern "C" {
#include "io/fault.h"
#include "io/rfile.h"
}

using namespace ckptio_test;

namespace {

constexpr size_t kPage = 4096;

// Page-aligned memory with guard bytes on both sides of [at, at + n).
struct Guarded {
  Guarded(size_t shift, size_t n) : len(n + 3 * kPage), shift(shift), n(n) {
    base = static_cast<uint8_t *>(mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    EXPECT_NE(base, MAP_FAILED);
    memset(base, 0xA5, len);
  }
  ~Guarded() { munmap(base, len); }
  uint8_t *at() const { return base + kPage + shift; }
  bool guards_intact() const {
    for (size_t i = 0; i < len; i++)
      if ((i < kPage + shift || i >= kPage + shift + n) && base[i] != 0xA5) return false;
    return true;
  }
  uint8_t *base;
  size_t len, shift, n;
};

struct RFile {
  explicit RFile(const std::string &path) {
    char err[256];
    EXPECT_EQ(ckptio_rfile_open(&f, path.c_str(), err, sizeof(err)), 0) << err;
    direct = ckptio_rfile_direct(&f) >= 0;
  }
  ~RFile() { ckptio_rfile_close(&f); }
  ckptio_rfile f;
  bool direct = false;
};

// Whether the filesystem of dir takes O_DIRECT (tmpfs does not): the tests
// of in-place I/O skip loudly where it cannot run.
bool direct_ok(const TempDir &dir) {
  write_file(dir.file("probe"), std::string(4096, 'x'));
  bool ok = RFile(dir.file("probe")).direct;
  unlink(dir.file("probe").c_str());
  return ok;
}

#define SKIP_WITHOUT_DIRECT(dir) \
  if (!direct_ok(dir)) GTEST_SKIP() << "O_DIRECT refused on " << (dir).path() << ": in-place I/O cannot run here"

}  // namespace

// Every start and length around the alignment, up to a file end that is not
// on a block: the bytes land where asked and nothing around them changes.
TEST(DirectIo, InPlaceEveryEdge) {
  TempDir dir;
  std::vector<uint8_t> bytes = pattern(9 * kPage + 1001, 7);
  write_file(dir.file("f"), bytes);
  SKIP_WITHOUT_DIRECT(dir);
  RFile r(dir.file("f"));
  uint64_t al = r.f.dio_align;
  ASSERT_GE(al, 512u);
  ASSERT_LE(al, CKPTIO_RFILE_EDGE);
  ASSERT_EQ(al & (al - 1), 0u);
  const uint64_t size = bytes.size();
  for (uint64_t abs : {uint64_t{0}, uint64_t{1}, al - 1, al, al + 7, 3 * al - 5, 4 * kPage + 100, size - 10}) {
    for (uint64_t len : {uint64_t{1}, al - 1, al, al + 1, 2 * al + 3, 5 * al, 3 * kPage + 17, size}) {
      if (abs + len > size) len = size - abs;
      SCOPED_TRACE("abs " + std::to_string(abs) + " len " + std::to_string(len));
      Guarded g(abs % al, len);
      ASSERT_TRUE(ckptio_rfile_in_place_ok(&r.f, g.at(), abs));
      ASSERT_EQ(ckptio_rfile_read_in_place(&r.f, g.at(), abs, len), 0);
      EXPECT_EQ(memcmp(g.at(), bytes.data() + abs, len), 0);
      EXPECT_TRUE(g.guards_intact());
    }
  }
  Guarded g(0, 100);
  EXPECT_FALSE(ckptio_rfile_in_place_ok(&r.f, g.at() + 1, 0));
  EXPECT_FALSE(ckptio_rfile_in_place_ok(&r.f, g.at(), al / 2));
  // Past the end of the file: a short read, not bytes of nothing.
  EXPECT_EQ(ckptio_rfile_read_in_place(&r.f, g.at(), size - 50, 100), CKPTIO_E_SHORT_IO);
}

// The writer puts tensors of whole pages first, so each starts on a page
// even where the reference order would put small ones before them.
TEST(DirectIo, WholePageTensorsStartOnPages) {
  TempDir dir;
  ckptio_ctx *ctx = nullptr;
  ckptio_options o = small_options();
  ASSERT_EQ(ckptio_ctx_create(&o, &ctx), 0);
  std::vector<Tensor> ts = {make_tensor("a.norm", CKPTIO_F32, {2752}, 1),  // 11008 bytes, first by name
                            make_tensor("b.weight", CKPTIO_BF16, {64, 1024}, 2),
                            make_tensor("c.bias", CKPTIO_F32, {3}, 3),
                            make_tensor("d.weight", CKPTIO_F32, {16, 1024}, 4)};
  ASSERT_EQ(save(ctx, dir.file("m.safetensors"), ts), 0);
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(ctx, dir.file("m.safetensors").c_str(), nullptr, &r), 0);
  for (const char *name : {"b.weight", "d.weight"}) {
    ckptio_tensor_info info;
    ASSERT_EQ(ckptio_reader_info(r, (size_t)ckptio_reader_find(r, name), &info), 0);
    EXPECT_EQ(info.offset % kPage, 0u) << name;
  }
  ckptio_reader_close(r);
  expect_loads(ctx, dir.file("m.safetensors"), ts);
  ckptio_ctx_free(ctx);
}

// A direct load into memory that agrees with the file's alignment reads in
// place, into memory that does not goes through a slot: the same bytes
// either way, the bytes around each destination untouched; a tensor off the
// page (after an odd-sized one) reads in place with ragged ends.
TEST(DirectIo, LoaderReadsInPlaceOrThroughSlot) {
  TempDir dir;
  SKIP_WITHOUT_DIRECT(dir);
  ckptio_ctx *ctx = nullptr;
  ckptio_options o = small_options(64 << 10, 256 << 10, 3);
  o.load_method = CKPTIO_LOAD_DIRECT;
  ASSERT_EQ(ckptio_ctx_create(&o, &ctx), 0);
  std::vector<Tensor> ts = {make_tensor("a", CKPTIO_F32, {1001}, 1), make_tensor("b", CKPTIO_F32, {300001}, 2),
                            make_tensor("c", CKPTIO_BF16, {512, 1024}, 3)};
  ASSERT_EQ(save(ctx, dir.file("m.safetensors"), ts), 0);
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(ctx, dir.file("m.safetensors").c_str(), &o, &r), 0);
  for (const Tensor &t : ts) {
    size_t i = (size_t)ckptio_reader_find(r, t.name.c_str());
    ckptio_tensor_info info;
    ASSERT_EQ(ckptio_reader_info(r, i, &info), 0);
    for (size_t shift : {size_t(info.offset % kPage), size_t(info.offset % kPage) + 1, size_t{0}}) {
      SCOPED_TRACE(t.name + " at page + " + std::to_string(shift) + ", file offset " + std::to_string(info.offset));
      Guarded g(shift, t.bytes.size());
      ASSERT_EQ(ckptio_reader_load(r, i, g.at(), t.bytes.size()), 0) << ckptio_reader_last_error(r);
      EXPECT_EQ(memcmp(g.at(), t.bytes.data(), t.bytes.size()), 0);
      EXPECT_TRUE(g.guards_intact());
      ckptio_stats st = CKPTIO_STATS_INIT;
      ASSERT_EQ(ckptio_reader_stats(r, &st), 0);
      // At the file offset's place in the page: in place whatever the disk's
      // alignment (512 or 4096); one byte off: never. Page-aligned memory for
      // a tensor off the page depends on the disk: not asserted.
      bool agrees = shift == info.offset % kPage && t.bytes.size() >= (64 << 10);
      if (shift != 0 || info.offset % kPage == 0) {
        EXPECT_EQ(st.direct_bytes, agrees ? t.bytes.size() : 0u);
      }
    }
  }
  ckptio_reader_close(r);
  ckptio_ctx_free(ctx);
}

// A disk failing under an in-place read: the load fails with its error and
// names the tensor.
TEST(DirectIo, FailingDiskUnderInPlaceReadNamesTheTensor) {
  TempDir dir;
  SKIP_WITHOUT_DIRECT(dir);
  ckptio_ctx *ctx = nullptr;
  ckptio_options o = small_options(64 << 10, 256 << 10, 2);
  o.load_method = CKPTIO_LOAD_DIRECT;
  ASSERT_EQ(ckptio_ctx_create(&o, &ctx), 0);
  std::vector<Tensor> ts = {make_tensor("w", CKPTIO_F32, {256, 1024}, 5)};
  ASSERT_EQ(save(ctx, dir.file("m.safetensors"), ts), 0);
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(ctx, dir.file("m.safetensors").c_str(), &o, &r), 0);
  Guarded g(0, ts[0].bytes.size());
  for (long nth : {1L, 3L}) {
    ckptio_fault_arm(CKPTIO_FAULT_PREAD, nth, EIO);
    EXPECT_EQ(ckptio_reader_load(r, 0, g.at(), ts[0].bytes.size()), -EIO);
    ckptio_fault_clear();
    EXPECT_NE(std::string(ckptio_reader_last_error(r)).find("'w'"), std::string::npos) << ckptio_reader_last_error(r);
    EXPECT_TRUE(g.guards_intact());
  }
  ASSERT_EQ(ckptio_reader_load(r, 0, g.at(), ts[0].bytes.size()), 0) << ckptio_reader_last_error(r);
  EXPECT_EQ(memcmp(g.at(), ts[0].bytes.data(), ts[0].bytes.size()), 0);
  ckptio_reader_close(r);
  ckptio_ctx_free(ctx);
}

namespace {

// A model in page-aligned memory (as a framework's allocator or pinned
// memory gives), larger than the test ring; with `small`, an odd-sized
// tensor between the whole-page ones in name order.
struct PagedModel {
  explicit PagedModel(bool small) {
    ts = {make_tensor("a.w", CKPTIO_F32, {96, 1024}, 1), make_tensor("c.w", CKPTIO_BF16, {256, 1024}, 3)};
    if (small) ts.push_back(make_tensor("b.norm", CKPTIO_F32, {1001}, 2));
    for (auto &t : ts) mem.emplace_back(new Guarded(0, t.bytes.size())), memcpy(mem.back()->at(), t.bytes.data(), t.bytes.size());
  }
  int add_all(ckptio_writer *w) {
    for (size_t i = 0; i < ts.size(); i++) {
      ckptio_tensor d{ts[i].name.c_str(), ts[i].dtype, (int)ts[i].shape.size(), {}, mem[i]->at(), CKPTIO_DEVICE_HOST};
      for (size_t k = 0; k < ts[i].shape.size(); k++) d.shape[k] = ts[i].shape[k];
      int rc = ckptio_writer_add(w, &d);
      if (rc < 0) return rc;
    }
    return 0;
  }
  std::vector<Tensor> ts;
  std::vector<std::unique_ptr<Guarded>> mem;
};

ckptio_options direct_options() {
  ckptio_options o = small_options(64 << 10, 256 << 10, 3);  // 4 slots of 64 KiB
  o.direct_io = 1;
  return o;
}

}  // namespace

// Chunks beyond the ring are written from the tensors themselves; the file
// holds the same bytes with every CRC right, and the snapshot point comes
// after those writes: memory changed right after it does not reach the file
// (writes slowed to 20 MB/s and the last chunks all in place, so an early
// snapshot would let it).
TEST(DirectIo, InPlaceWritesKeepSnapshotPromise) {
  TempDir dir;
  SKIP_WITHOUT_DIRECT(dir);
  ckptio_options o = direct_options();
  ckptio_ctx *ctx = nullptr;
  ASSERT_EQ(ckptio_ctx_create(&o, &ctx), 0);
  PagedModel m(false);
  ckptio_writer *w = nullptr;
  ASSERT_EQ(ckptio_writer_open(ctx, dir.file("m.safetensors").c_str(), CKPTIO_FORMAT_SAFETENSORS, &o, &w), 0);
  ASSERT_EQ(m.add_all(w), 0);
  ckptio_fault_slow_writes(20 * 1000 * 1000);
  ASSERT_EQ(ckptio_writer_commit_async(w), 0);
  ASSERT_EQ(ckptio_writer_wait_snapshot(w), 0) << ckptio_writer_last_error(w);
  for (auto &g : m.mem) memset(g->at(), 0xFF, g->n);
  ASSERT_EQ(ckptio_writer_wait_durable(w), 0) << ckptio_writer_last_error(w);
  ckptio_fault_slow_writes(0);
  ckptio_stats st = CKPTIO_STATS_INIT;
  ASSERT_EQ(ckptio_writer_stats(w, &st), 0);
  EXPECT_GT(st.direct_bytes, 512u << 10) << "chunks 4 and up of the two whole-page tensors";
  EXPECT_LT(st.direct_bytes, st.bytes) << "the ring's 4 chunks are copied";
  EXPECT_EQ(ckptio_writer_close(w), 0);
  expect_loads(ctx, dir.file("m.safetensors"), m.ts);
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(ctx, dir.file("m.safetensors").c_str(), nullptr, &r), 0);
  size_t unchecked = 99;
  EXPECT_EQ(ckptio_reader_verify(r, &unchecked), 0) << ckptio_reader_last_error(r);
  EXPECT_EQ(unchecked, 0u);
  ckptio_reader_close(r);
  ckptio_ctx_free(ctx);
}

// A save whose caller waits for the durable point (ckptio_writer_commit)
// gains nothing from copying into slots never touched: in a context's first
// save every chunk that can be is written in place, all but the one holding
// the header, so no staging memory is touched on its way; those slots are
// then faulted in behind it, and a later save copies the ring's share again
// (the disk takes it faster from the ring's huge pages).
TEST(DirectIo, AFirstCommitThatWaitsWritesInPlaceLaterOnesThroughTheRing) {
  TempDir dir;
  SKIP_WITHOUT_DIRECT(dir);
  ckptio_options o = direct_options();
  ckptio_ctx *ctx = nullptr;
  ASSERT_EQ(ckptio_ctx_create(&o, &ctx), 0);
  PagedModel m(false);
  ckptio_writer *w = nullptr;
  ASSERT_EQ(ckptio_writer_open(ctx, dir.file("m.safetensors").c_str(), CKPTIO_FORMAT_SAFETENSORS, &o, &w), 0);
  ASSERT_EQ(m.add_all(w), 0);
  ASSERT_EQ(ckptio_writer_commit(w), 0) << ckptio_writer_last_error(w);
  ckptio_stats st = CKPTIO_STATS_INIT;
  ASSERT_EQ(ckptio_writer_stats(w, &st), 0);
  EXPECT_GE(st.direct_bytes + o.chunk_bytes, st.bytes) << "only the header's chunk goes through staging";
  EXPECT_EQ(ckptio_writer_close(w), 0);
  expect_loads(ctx, dir.file("m.safetensors"), m.ts);
  uint64_t later = st.bytes;
  for (int i = 0; i < 100 && later + o.chunk_bytes >= st.bytes; i++) {  // the slots' preparing is a queued job
    ASSERT_EQ(ckptio_writer_open(ctx, dir.file("m.safetensors").c_str(), CKPTIO_FORMAT_SAFETENSORS, &o, &w), 0);
    ASSERT_EQ(m.add_all(w), 0);
    ASSERT_EQ(ckptio_writer_commit(w), 0) << ckptio_writer_last_error(w);
    ckptio_stats again = CKPTIO_STATS_INIT;
    ASSERT_EQ(ckptio_writer_stats(w, &again), 0);
    later = again.direct_bytes;
    EXPECT_EQ(ckptio_writer_close(w), 0);
    if (later + o.chunk_bytes >= st.bytes) usleep(10 * 1000);
  }
  EXPECT_LT(later + o.chunk_bytes, st.bytes) << "later saves never went through the ring again";
  expect_loads(ctx, dir.file("m.safetensors"), m.ts);
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(ctx, dir.file("m.safetensors").c_str(), nullptr, &r), 0);
  size_t unchecked = 99;
  EXPECT_EQ(ckptio_reader_verify(r, &unchecked), 0) << ckptio_reader_last_error(r);
  EXPECT_EQ(unchecked, 0u);
  ckptio_reader_close(r);
  ckptio_ctx_free(ctx);
}

// A disk failing under an in-place write (the 8th write is past the ring's
// 4 chunks): the save fails with the disk's error, the old file stays and
// no temp file is left.
TEST(DirectIo, FailingDiskUnderInPlaceWriteKeepsOldFile) {
  TempDir dir;
  SKIP_WITHOUT_DIRECT(dir);
  ckptio_options o = direct_options();
  ckptio_ctx *ctx = nullptr;
  ASSERT_EQ(ckptio_ctx_create(&o, &ctx), 0);
  std::vector<Tensor> old = {make_tensor("old", CKPTIO_U8, {100}, 9)};
  ASSERT_EQ(save(ctx, dir.file("m.safetensors"), old), 0);
  PagedModel m(true);
  ckptio_writer *w = nullptr;
  ASSERT_EQ(ckptio_writer_open(ctx, dir.file("m.safetensors").c_str(), CKPTIO_FORMAT_SAFETENSORS, &o, &w), 0);
  ASSERT_EQ(m.add_all(w), 0);
  ckptio_fault_arm(CKPTIO_FAULT_PWRITE, 8, EIO);
  EXPECT_EQ(ckptio_writer_commit(w), -EIO);
  ckptio_fault_clear();
  EXPECT_NE(std::string(ckptio_writer_last_error(w)).find("failed"), std::string::npos) << ckptio_writer_last_error(w);
  ckptio_writer_close(w);
  expect_loads(ctx, dir.file("m.safetensors"), old);
  EXPECT_EQ(dir.list(), std::vector<std::string>{"m.safetensors"});
  ckptio_ctx_free(ctx);
}
