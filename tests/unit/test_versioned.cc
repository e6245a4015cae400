// The one rule for the versioned structs (include/ckptio.h, "Versioned
// structs"; src/core/sized.c), struct by struct: an older, shorter struct is
// accepted and the fields past its size take their defaults (in) or are not
// written (out), whatever the caller's memory holds there; a larger one is
// accepted when the bytes past this library's struct are zero and refused
// with CKPTIO_E_INVALID_ARG and a message naming the struct when not; a
// size that cannot be any version's is refused without reading past it.
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "ckpt_fixture.h"

using namespace ckptio_test;

namespace {

// A caller's struct with room past it: what a program built against a
// newer ckptio.h passes (size covers `extra`), or an older one's struct
// followed by other memory.
template <typename T>
struct Larger {
  T s;
  unsigned char extra[24];
};

template <typename T>
Larger<T> larger(const T &init) {
  Larger<T> l;
  memset(&l, 0, sizeof(l));
  l.s = init;
  l.s.size = sizeof(l);
  return l;
}

std::string open_error() { return ckptio_last_open_error(); }

bool contains(const std::string &s, const std::string &part) { return s.find(part) != std::string::npos; }

// The size of ckptio_options and ckptio_stats as released in 0.1.0: the
// fields added since (snapshot_bytes, direct_bytes) are past it.
constexpr size_t kOptionsV01 = offsetof(ckptio_options, snapshot_bytes);
constexpr size_t kStatsV01 = offsetof(ckptio_stats, direct_bytes);

class Versioned : public ::testing::Test {
 protected:
  void SetUp() override {
    ckptio_options o = small_options();
    ASSERT_EQ(ckptio_ctx_create(&o, &ctx_), 0) << open_error();
    ts_ = {make_tensor("a", CKPTIO_F32, {1000}, 1), make_tensor("b", CKPTIO_U8, {77}, 2)};
  }
  void TearDown() override { ckptio_ctx_free(ctx_); }

  // A manager's step saved from ts_.
  int save_step(ckptio_manager *m, uint64_t step) {
    ckptio_writer *w = nullptr;
    int rc = ckptio_manager_save_begin(m, step, &w);
    if (rc < 0) return rc;
    for (auto &t : ts_) {
      ckptio_tensor d = host_desc(t);
      EXPECT_EQ(ckptio_writer_add(w, &d), 0);
    }
    EXPECT_EQ(ckptio_writer_commit_async(w), 0);
    return ckptio_manager_save_end(m, w);
  }

  TempDir dir_;
  ckptio_ctx *ctx_ = nullptr;
  std::vector<Tensor> ts_;
};

}  // namespace

// ---------------------------------------------------------------- ckptio_options

TEST_F(Versioned, OptionsOfOlderSizeGetTheDefaultsPastIt) {
  // The 0.1.0 struct, with memory past it that is not the caller's field.
  ckptio_options o = small_options(64 << 10, 256 << 10, 3);
  o.size = kOptionsV01;
  o.snapshot_bytes = 64u << 20;
  ckptio_ctx *ctx = nullptr;
  ASSERT_EQ(ckptio_ctx_create(&o, &ctx), 0) << open_error();
  ckptio_options got = CKPTIO_OPTIONS_INIT;
  ASSERT_EQ(ckptio_ctx_options(ctx, &got), 0);
  EXPECT_EQ(got.size, sizeof(ckptio_options));
  EXPECT_EQ(got.threads, 3) << "a field within its size is the caller's";
  EXPECT_EQ(got.chunk_bytes, 64u << 10);
  EXPECT_EQ(got.snapshot_bytes, 0u) << "a field past its size takes CKPTIO_OPTIONS_INIT's value";
  ckptio_ctx_free(ctx);

  // Per call: a struct that ends before compress_level saves a plain file,
  // whatever lies past it.
  ckptio_options call = CKPTIO_OPTIONS_INIT;
  call.size = offsetof(ckptio_options, compress_level);
  call.compress_level = 3;
  ASSERT_EQ(save(ctx_, dir_.file("m.safetensors"), ts_, &call), 0);
  auto bytes = read_file(dir_.file("m.safetensors"));
  ASSERT_GE(bytes.size(), 4u);
  const unsigned char zstd_magic[4] = {0x28, 0xB5, 0x2F, 0xFD};
  EXPECT_NE(memcmp(bytes.data(), zstd_magic, 4), 0) << "compress_level past the size was read";
  expect_loads(ctx_, dir_.file("m.safetensors"), ts_);

  // The manager took only sizeof(ckptio_options) before; now the same rule.
  ckptio_manager *m = nullptr;
  ASSERT_EQ(ckptio_manager_open(ctx_, dir_.file("ckpts").c_str(), nullptr, &call, &m), 0) << open_error();
  ASSERT_EQ(save_step(m, 1), 0) << ckptio_manager_last_error(m);
  ckptio_manager_close(m);
}

TEST_F(Versioned, OptionsOfLargerSizeAreTakenWhenTheUnknownTailIsZero) {
  Larger<ckptio_options> l = larger<ckptio_options>(small_options());
  ckptio_ctx *ctx = nullptr;
  ASSERT_EQ(ckptio_ctx_create(&l.s, &ctx), 0) << open_error();
  ckptio_ctx_free(ctx);
  ASSERT_EQ(save(ctx_, dir_.file("m.safetensors"), ts_, &l.s), 0);
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(ctx_, dir_.file("m.safetensors").c_str(), &l.s, &r), 0) << open_error();
  ckptio_reader_close(r);
  ckptio_manager *m = nullptr;
  ASSERT_EQ(ckptio_manager_open(ctx_, dir_.file("ckpts").c_str(), nullptr, &l.s, &m), 0) << open_error();
  ckptio_manager_close(m);

  // A field this library does not know, set: refused by every call.
  l.extra[5] = 1;
  EXPECT_EQ(ckptio_ctx_create(&l.s, &ctx), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(ctx, nullptr);
  EXPECT_TRUE(contains(open_error(), "ckptio_options")) << open_error();
  EXPECT_TRUE(contains(open_error(), "newer ckptio.h")) << open_error();
  ckptio_writer *w = nullptr;
  EXPECT_EQ(ckptio_writer_open(ctx_, dir_.file("n.safetensors").c_str(), CKPTIO_FORMAT_SAFETENSORS, &l.s, &w),
            CKPTIO_E_INVALID_ARG);
  EXPECT_TRUE(contains(open_error(), "ckptio_options")) << open_error();
  EXPECT_EQ(ckptio_writer_open_sharded(ctx_, dir_.path().c_str(), "s", CKPTIO_FORMAT_SAFETENSORS, 1 << 20,
                                       CKPTIO_SHARD_ORDER_ADDED, &l.s, &w),
            CKPTIO_E_INVALID_ARG);
  EXPECT_TRUE(contains(open_error(), "ckptio_options")) << open_error();
  EXPECT_EQ(ckptio_reader_open(ctx_, dir_.file("m.safetensors").c_str(), &l.s, &r), CKPTIO_E_INVALID_ARG);
  EXPECT_TRUE(contains(open_error(), "ckptio_options")) << open_error();
  EXPECT_EQ(ckptio_manager_open(ctx_, dir_.file("ckpts").c_str(), nullptr, &l.s, &m), CKPTIO_E_INVALID_ARG);
  EXPECT_TRUE(contains(open_error(), "ckptio_options")) << open_error();
  EXPECT_EQ(w, nullptr);
  EXPECT_EQ(dir_.list(), (std::vector<std::string>{"ckpts", "m.safetensors"})) << "a refused open wrote";
}

TEST_F(Versioned, SizesNoVersionHasAreRefusedWithoutReadingPastThem) {
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  ckptio_ctx *ctx = nullptr;
  for (size_t size : {size_t(0), sizeof(size_t) - 1, sizeof(ckptio_options) + 4096, size_t(-1)}) {
    SCOPED_TRACE(size);
    o.size = size;  // only `o` is there: ASan would see a read past it
    EXPECT_EQ(ckptio_ctx_create(&o, &ctx), CKPTIO_E_INVALID_ARG);
    EXPECT_TRUE(contains(open_error(), "ckptio_options: size")) << open_error();
  }
  // The size field alone: every field takes its default.
  o.size = sizeof(size_t);
  o.threads = 1000000;
  ASSERT_EQ(ckptio_ctx_create(&o, &ctx), 0) << open_error();
  ckptio_ctx_free(ctx);
}

// The manager checks the options' ranges at open, as a context does (it
// took them unchecked, to fail at its first save).
TEST_F(Versioned, TheManagerChecksTheOptionsAtOpen) {
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  o.cuda = 7;
  ckptio_manager *m = nullptr;
  EXPECT_EQ(ckptio_manager_open(ctx_, dir_.file("ckpts").c_str(), nullptr, &o, &m), CKPTIO_E_INVALID_ARG);
  EXPECT_TRUE(contains(open_error(), "cuda is 7")) << open_error();
  ckptio_ctx *ctx = nullptr;
  EXPECT_EQ(ckptio_ctx_create(&o, &ctx), CKPTIO_E_INVALID_ARG);
  EXPECT_TRUE(contains(open_error(), "cuda is 7")) << open_error();
}

TEST_F(Versioned, ContextOptionsFillOnlyWhatTheCallersStructHolds) {
  ckptio_options got = CKPTIO_OPTIONS_INIT;
  got.size = kOptionsV01;
  got.snapshot_bytes = 12345;  // the caller's memory, not its field
  ASSERT_EQ(ckptio_ctx_options(ctx_, &got), 0);
  EXPECT_EQ(got.chunk_bytes, 64u << 10);
  EXPECT_EQ(got.size, kOptionsV01) << "the caller's size is left as it is";
  EXPECT_EQ(got.snapshot_bytes, 12345u);
  Larger<ckptio_options> l = larger<ckptio_options>(CKPTIO_OPTIONS_INIT);
  ASSERT_EQ(ckptio_ctx_options(ctx_, &l.s), 0);
  EXPECT_EQ(l.s.chunk_bytes, 64u << 10);
  EXPECT_EQ(l.s.size, sizeof(l));
  l.extra[0] = 9;
  l.s.chunk_bytes = 1;
  EXPECT_EQ(ckptio_ctx_options(ctx_, &l.s), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(l.s.chunk_bytes, 1u) << "a refused struct is not written";
  EXPECT_EQ(ckptio_ctx_options(ctx_, nullptr), CKPTIO_E_INVALID_ARG);
}

// ---------------------------------------------------------------- ckptio_stats

TEST_F(Versioned, StatsOfOlderSizeGetOnlyTheirFields) {
  ASSERT_EQ(save(ctx_, dir_.file("m.safetensors"), ts_), 0);
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(ctx_, dir_.file("m.safetensors").c_str(), nullptr, &r), 0);
  std::vector<uint8_t> dst(ts_[0].bytes.size());
  ASSERT_EQ(ckptio_reader_load(r, 0, dst.data(), dst.size()), 0);
  ckptio_stats st = CKPTIO_STATS_INIT;
  st.size = kStatsV01;
  st.direct_bytes = 0xABCDEF;  // past the 0.1.0 struct: not the caller's field
  ASSERT_EQ(ckptio_reader_stats(r, &st), 0);
  EXPECT_EQ(st.bytes, ts_[0].bytes.size());
  EXPECT_GT(st.threads, 0);
  EXPECT_EQ(st.direct_bytes, 0xABCDEFu);
  EXPECT_EQ(st.size, kStatsV01);
  ckptio_reader_close(r);
  // A set's writer keeps sums of its own (save/set.c): the same rule.
  ckptio_writer *w = nullptr;
  ASSERT_EQ(ckptio_writer_open_sharded(ctx_, dir_.path().c_str(), "model", CKPTIO_FORMAT_SAFETENSORS, 1024,
                                       CKPTIO_SHARD_ORDER_ADDED, nullptr, &w),
            0)
      << open_error();
  for (auto &t : ts_) {
    ckptio_tensor d = host_desc(t);
    ASSERT_EQ(ckptio_writer_add(w, &d), 0);
  }
  ASSERT_EQ(ckptio_writer_commit(w), 0) << ckptio_writer_last_error(w);
  st = CKPTIO_STATS_INIT;
  st.size = kStatsV01;
  st.direct_bytes = 0xABCDEF;
  ASSERT_EQ(ckptio_writer_stats(w, &st), 0);
  EXPECT_EQ(st.bytes, ts_[0].bytes.size() + ts_[1].bytes.size());
  EXPECT_EQ(st.direct_bytes, 0xABCDEFu);
  ASSERT_EQ(ckptio_writer_close(w), 0);
}

TEST_F(Versioned, StatsOfLargerSizeAreFilledWhenTheUnknownTailIsZero) {
  ckptio_writer *w = nullptr;
  ASSERT_EQ(ckptio_writer_open(ctx_, dir_.file("m.safetensors").c_str(), CKPTIO_FORMAT_SAFETENSORS, nullptr, &w), 0);
  for (auto &t : ts_) {
    ckptio_tensor d = host_desc(t);
    ASSERT_EQ(ckptio_writer_add(w, &d), 0);
  }
  ASSERT_EQ(ckptio_writer_commit(w), 0) << ckptio_writer_last_error(w);
  Larger<ckptio_stats> l = larger<ckptio_stats>(CKPTIO_STATS_INIT);
  ASSERT_EQ(ckptio_writer_stats(w, &l.s), 0);
  EXPECT_EQ(l.s.bytes, ts_[0].bytes.size() + ts_[1].bytes.size());
  EXPECT_EQ(l.s.size, sizeof(l)) << "the caller's size is left as it is";
  for (unsigned char c : l.extra) EXPECT_EQ(c, 0) << "wrote past the struct it knows";
  l.extra[sizeof(l.extra) - 1] = 1;
  l.s.bytes = 7;
  EXPECT_EQ(ckptio_writer_stats(w, &l.s), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(l.s.bytes, 7u) << "a refused struct is not written";
  ckptio_stats zero = CKPTIO_STATS_INIT;
  zero.size = 0;
  EXPECT_EQ(ckptio_writer_stats(w, &zero), CKPTIO_E_INVALID_ARG);
  ckptio_writer_close(w);
}

// ---------------------------------------------------------------- ckptio_comm

TEST_F(Versioned, CommOfOlderSizeLacksTheCollectivesPastIt) {
  ckptio_comm full;
  ckptio_comm_single(&full);
  // Ends before broadcast: the valid function pointer lying past its size
  // is not the caller's field; the default is none, refused as a NULL one.
  ckptio_comm c = full;
  c.size = offsetof(ckptio_comm, broadcast);
  ckptio_writer *w = nullptr;
  EXPECT_EQ(ckptio_writer_open_ranks(ctx_, &c, dir_.path().c_str(), "model", nullptr, &w), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(w, nullptr);
  EXPECT_TRUE(contains(open_error(), "allgather and broadcast")) << open_error();
  EXPECT_TRUE(contains(open_error(), "its size " + std::to_string(c.size))) << open_error();
  // The whole struct works.
  ASSERT_EQ(ckptio_writer_open_ranks(ctx_, &full, dir_.path().c_str(), "model", nullptr, &w), 0) << open_error();
  ckptio_writer_close(w);
}

TEST_F(Versioned, CommOfLargerSizeIsTakenWhenTheUnknownTailIsZero) {
  ckptio_comm single;
  ckptio_comm_single(&single);
  Larger<ckptio_comm> l = larger<ckptio_comm>(single);
  ckptio_writer *w = nullptr;
  ASSERT_EQ(ckptio_writer_open_ranks(ctx_, &l.s, dir_.path().c_str(), "model", nullptr, &w), 0) << open_error();
  ckptio_tensor d = host_desc(ts_[0]);
  ASSERT_EQ(ckptio_writer_add(w, &d), 0) << ckptio_writer_last_error(w);
  ASSERT_EQ(ckptio_writer_commit(w), 0) << ckptio_writer_last_error(w);
  ASSERT_EQ(ckptio_writer_close(w), 0);
  expect_loads(ctx_, dir_.path(), {ts_[0]});
  l.extra[2] = 0xFF;
  EXPECT_EQ(ckptio_writer_open_ranks(ctx_, &l.s, dir_.path().c_str(), "model", nullptr, &w), CKPTIO_E_INVALID_ARG);
  EXPECT_TRUE(contains(open_error(), "ckptio_comm")) << open_error();
}

// ---------------------------------------------------------------- ckptio_manager_options

TEST_F(Versioned, ManagerOptionsOfOlderSizeGetTheDefaultsPastIt) {
  // A first save, then its tensor bytes flipped: only a verifying latest
  // passes it over.
  ckptio_manager *m = nullptr;
  ASSERT_EQ(ckptio_manager_open(ctx_, dir_.file("ckpts").c_str(), nullptr, nullptr, &m), 0) << open_error();
  ASSERT_EQ(save_step(m, 1), 0) << ckptio_manager_last_error(m);
  char path[4096];
  uint64_t step = 0;
  ASSERT_EQ(ckptio_manager_latest(m, &step, path, sizeof(path)), 1);
  ckptio_manager_close(m);
  auto bytes = read_file(path);
  bytes[bytes.size() - 1] ^= 0xFF;
  write_file(path, bytes);

  ckptio_manager_options mo = CKPTIO_MANAGER_OPTIONS_INIT;
  mo.verify = 1;
  ASSERT_EQ(ckptio_manager_open(ctx_, dir_.file("ckpts").c_str(), &mo, nullptr, &m), 0) << open_error();
  EXPECT_EQ(ckptio_manager_latest(m, &step, path, sizeof(path)), 0) << "the whole struct: verify is on";
  ckptio_manager_close(m);
  // Ends before verify: the 1 past its size is not the caller's; verify
  // takes CKPTIO_MANAGER_OPTIONS_INIT's 0, and keep_last (within) is kept.
  mo.size = offsetof(ckptio_manager_options, verify);
  mo.keep_last = 1;
  ASSERT_EQ(ckptio_manager_open(ctx_, dir_.file("ckpts").c_str(), &mo, nullptr, &m), 0) << open_error();
  EXPECT_EQ(ckptio_manager_latest(m, &step, path, sizeof(path)), 1) << "verify past the size was read";
  ASSERT_EQ(save_step(m, 2), 0) << ckptio_manager_last_error(m);
  ASSERT_EQ(save_step(m, 3), 0) << ckptio_manager_last_error(m);
  EXPECT_EQ(ckptio_manager_list(m, 0), 1) << "keep_last 1, within the size, is the caller's";
  ckptio_manager_close(m);
}

TEST_F(Versioned, ManagerOptionsOfLargerSizeAreTakenWhenTheUnknownTailIsZero) {
  ckptio_manager_options init = CKPTIO_MANAGER_OPTIONS_INIT;
  init.keep_last = 1;
  Larger<ckptio_manager_options> l = larger<ckptio_manager_options>(init);
  ckptio_manager *m = nullptr;
  ASSERT_EQ(ckptio_manager_open(ctx_, dir_.file("ckpts").c_str(), &l.s, nullptr, &m), 0) << open_error();
  ASSERT_EQ(save_step(m, 1), 0);
  ASSERT_EQ(save_step(m, 2), 0);
  EXPECT_EQ(ckptio_manager_list(m, 0), 1);
  ckptio_manager_close(m);
  l.extra[7] = 1;
  EXPECT_EQ(ckptio_manager_open(ctx_, dir_.file("ckpts").c_str(), &l.s, nullptr, &m), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(m, nullptr);
  EXPECT_TRUE(contains(open_error(), "ckptio_manager_options")) << open_error();
}

// ---------------------------------------------------------------- ckptio_checkpoint_info

TEST_F(Versioned, CheckpointInfoOfOlderSizeGetsOnlyItsFields) {
  ckptio_manager *m = nullptr;
  ASSERT_EQ(ckptio_manager_open(ctx_, dir_.file("ckpts").c_str(), nullptr, nullptr, &m), 0) << open_error();
  ASSERT_EQ(save_step(m, 4), 0);
  ASSERT_EQ(ckptio_manager_list(m, 0), 1);
  const char *mine = "the caller's memory";
  ckptio_checkpoint_info c = CKPTIO_CHECKPOINT_INFO_INIT;
  c.size = offsetof(ckptio_checkpoint_info, detail);
  c.detail = mine;
  ASSERT_EQ(ckptio_manager_checkpoint(m, 0, &c), 0) << "refused a struct shorter than the library's";
  EXPECT_EQ(c.step, 4u);
  EXPECT_EQ(c.complete, 1);
  EXPECT_NE(c.path, nullptr);
  EXPECT_EQ(c.detail, mine) << "wrote past the caller's size";
  EXPECT_EQ(c.size, offsetof(ckptio_checkpoint_info, detail));
  ckptio_manager_close(m);
}

TEST_F(Versioned, CheckpointInfoOfLargerSizeIsFilledWhenTheUnknownTailIsZero) {
  ckptio_manager *m = nullptr;
  ASSERT_EQ(ckptio_manager_open(ctx_, dir_.file("ckpts").c_str(), nullptr, nullptr, &m), 0) << open_error();
  ASSERT_EQ(save_step(m, 4), 0);
  ASSERT_EQ(ckptio_manager_list(m, 0), 1);
  Larger<ckptio_checkpoint_info> l = larger<ckptio_checkpoint_info>(CKPTIO_CHECKPOINT_INFO_INIT);
  ASSERT_EQ(ckptio_manager_checkpoint(m, 0, &l.s), 0) << "refused a struct larger than the library's";
  EXPECT_EQ(l.s.step, 4u);
  EXPECT_STREQ(l.s.detail, "");
  for (unsigned char c : l.extra) EXPECT_EQ(c, 0) << "wrote past the struct it knows";
  l.extra[0] = 1;
  l.s.step = 0;
  EXPECT_EQ(ckptio_manager_checkpoint(m, 0, &l.s), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(l.s.step, 0u) << "a refused struct is not written";
  ckptio_manager_close(m);
}
