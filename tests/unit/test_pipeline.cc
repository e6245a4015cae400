// Save and load round trips through the whole pipeline: every dtype, 0-d,
// empty and odd-sized tensors, chunk / thread / staging variations, all load
// methods, the two completion points, and the file's layout.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "ckpt_fixture.h"

using namespace ckptio_test;

namespace {

std::vector<Tensor> every_dtype_model() {
  std::vector<Tensor> ts;
  for (int d = 0; d < CKPTIO_DTYPE_COUNT; d++) {
    std::string name = std::string("t.") + ckptio_dtype_name((ckptio_dtype)d);
    ts.push_back(make_tensor(name, (ckptio_dtype)d, {4, 8}, d + 1));
  }
  ts.push_back(make_tensor("scalar", CKPTIO_F32, {}, 100));
  ts.push_back(make_tensor("empty", CKPTIO_BF16, {0, 4096}, 101));
  ts.push_back(make_tensor("odd", CKPTIO_U8, {3, 5, 7}, 102));
  ts.push_back(make_tensor("spans.chunks", CKPTIO_F32, {3, 65537}, 103));  // > 3 chunks of 64 KiB
  ts.push_back(make_tensor("weird \"name\"\\ é\n", CKPTIO_I8, {5}, 104));
  return ts;
}

}  // namespace

TEST(Pipeline, EveryDtypeRoundTrip) {
  TempDir dir;
  TestContext c(small_options());
  auto ts = every_dtype_model();
  std::string err;
  ASSERT_EQ(save(c.ctx, dir.file("m.safetensors"), ts, nullptr, &err), 0) << err;
  for (auto m : {CKPTIO_LOAD_PREAD, CKPTIO_LOAD_MMAP, CKPTIO_LOAD_DIRECT})
    expect_loads(c.ctx, dir.file("m.safetensors"), ts, m);
  EXPECT_EQ(dir.list(), std::vector<std::string>{"m.safetensors"});  // no temp file left
}

TEST(Pipeline, ChunkThreadAndStagingVariations) {
  std::vector<Tensor> ts;
  for (int i = 0; i < 40; i++) ts.push_back(make_tensor("w" + std::to_string(i), CKPTIO_BF16, {i * 97 + 1, 33}, i));
  ts.push_back(make_tensor("big", CKPTIO_F32, {300001}, 7));
  struct V { size_t chunk, staging; int threads; int direct; };
  for (V v : {V{64 << 10, 128 << 10, 1, CKPTIO_AUTO}, V{64 << 10, 1 << 20, 8, 0}, V{128 << 10, 512 << 10, 3, 1},
              V{1 << 20, 2 << 20, 2, CKPTIO_AUTO}}) {
    SCOPED_TRACE("chunk " + std::to_string(v.chunk) + " threads " + std::to_string(v.threads));
    TempDir dir;
    TestContext c(small_options(v.chunk, v.staging, v.threads));
    ckptio_options o = small_options(v.chunk, v.staging, v.threads);
    o.direct_io = v.direct;
    std::string err;
    ASSERT_EQ(save(c.ctx, dir.file("m.safetensors"), ts, &o, &err), 0) << err;
    expect_loads(c.ctx, dir.file("m.safetensors"), ts);
  }
}

TEST(Pipeline, LayoutDataStartsPageAlignedAndFileIsExact) {
  TempDir dir;
  TestContext c(small_options());
  auto ts = every_dtype_model();
  ASSERT_EQ(save(c.ctx, dir.file("m.safetensors"), ts), 0);
  auto bytes = read_file(dir.file("m.safetensors"));
  uint64_t n = 0;
  memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 4096, 0u);
  EXPECT_EQ(bytes[8], '{');
  size_t data = 0;
  for (auto &t : ts) data += t.bytes.size();
  EXPECT_EQ(bytes.size(), 8 + n + data);
  std::string hdr(bytes.begin() + 8, bytes.begin() + 8 + n);
  EXPECT_EQ(hdr.find("{\"__metadata__\":{"), 0u);
  EXPECT_NE(hdr.find("\"ckptio.crc32.scalar\":\""), std::string::npos);
  struct stat st;
  ASSERT_EQ(stat(dir.file("m.safetensors").c_str(), &st), 0);
  mode_t um = umask(0);
  umask(um);
  EXPECT_EQ(st.st_mode & 0777, 0666 & ~um) << "a checkpoint gets the permissions of a normal file";
}

TEST(Pipeline, NoCrcOptionWritesNoChecksums) {
  TempDir dir;
  TestContext c(small_options());
  ckptio_options o = small_options();
  o.crc = 0;
  auto ts = every_dtype_model();
  ASSERT_EQ(save(c.ctx, dir.file("m.safetensors"), ts, &o), 0);
  ckptio_reader *r;
  ASSERT_EQ(ckptio_reader_open(c.ctx, dir.file("m.safetensors").c_str(), nullptr, &r), 0);
  size_t unchecked = 0;
  EXPECT_EQ(ckptio_reader_verify(r, &unchecked), 0);
  EXPECT_EQ(unchecked, ts.size());
  ckptio_reader_close(r);
  expect_loads(c.ctx, dir.file("m.safetensors"), ts);
}

TEST(Pipeline, MetadataRoundTripAndReservedKeys) {
  TempDir dir;
  TestContext c(small_options());
  ckptio_writer *w;
  ASSERT_EQ(ckptio_writer_open(c.ctx, dir.file("m.safetensors").c_str(), CKPTIO_FORMAT_SAFETENSORS, nullptr, &w), 0);
  EXPECT_EQ(ckptio_writer_set_metadata(w, "step", "1200"), 0);
  EXPECT_EQ(ckptio_writer_set_metadata(w, "note", "quote \" and \\ and \xc3\xa9"), 0);
  EXPECT_EQ(ckptio_writer_set_metadata(w, "step", "1"), CKPTIO_E_DUPLICATE);
  EXPECT_EQ(ckptio_writer_set_metadata(w, "ckptio.crc32.x", "0"), CKPTIO_E_INVALID_ARG);
  EXPECT_NE(std::string(ckptio_writer_last_error(w)).find("reserved"), std::string::npos);
  ASSERT_EQ(ckptio_writer_commit(w), 0);
  EXPECT_EQ(ckptio_writer_close(w), 0);
  ckptio_reader *r;
  ASSERT_EQ(ckptio_reader_open(c.ctx, dir.file("m.safetensors").c_str(), nullptr, &r), 0);
  EXPECT_EQ(ckptio_reader_count(r), 0u);
  EXPECT_STREQ(ckptio_reader_metadata_get(r, "step"), "1200");
  EXPECT_STREQ(ckptio_reader_metadata_get(r, "note"), "quote \" and \\ and \xc3\xa9");
  EXPECT_STREQ(ckptio_reader_metadata_get(r, "ckptio.version"), ckptio_version_string());
  EXPECT_EQ(ckptio_reader_metadata_get(r, "missing"), nullptr);
  EXPECT_EQ(ckptio_reader_find(r, "nothing"), CKPTIO_E_NOT_FOUND);
  ckptio_reader_close(r);
}

TEST(Pipeline, AddRejectsBadTensors) {
  TempDir dir;
  TestContext c(small_options());
  ckptio_writer *w;
  ASSERT_EQ(ckptio_writer_open(c.ctx, dir.file("m.safetensors").c_str(), CKPTIO_FORMAT_SAFETENSORS, nullptr, &w), 0);
  uint8_t buf[16] = {};
  ckptio_tensor t{"a", CKPTIO_U8, 1, {16}, buf, CKPTIO_DEVICE_HOST};
  EXPECT_EQ(ckptio_writer_add(w, &t), 0);
  EXPECT_EQ(ckptio_writer_add(w, &t), CKPTIO_E_DUPLICATE);
  EXPECT_NE(std::string(ckptio_writer_last_error(w)).find("'a'"), std::string::npos);
  ckptio_tensor neg{"n", CKPTIO_U8, 1, {-1}, buf, CKPTIO_DEVICE_HOST};
  EXPECT_EQ(ckptio_writer_add(w, &neg), CKPTIO_E_SHAPE);
  ckptio_tensor big{"b", CKPTIO_F64, 3, {1ll << 40, 1ll << 20, 1ll << 10}, buf, CKPTIO_DEVICE_HOST};
  EXPECT_EQ(ckptio_writer_add(w, &big), CKPTIO_E_OVERFLOW);
  ckptio_tensor f4{"f4", CKPTIO_F4, 1, {3}, buf, CKPTIO_DEVICE_HOST};
  EXPECT_EQ(ckptio_writer_add(w, &f4), CKPTIO_E_MISALIGNED);
  ckptio_tensor meta{"__metadata__", CKPTIO_U8, 1, {1}, buf, CKPTIO_DEVICE_HOST};
  EXPECT_EQ(ckptio_writer_add(w, &meta), CKPTIO_E_INVALID_ARG);
  ckptio_tensor dev{"d", CKPTIO_U8, 1, {1}, buf, CKPTIO_DEVICE_CUDA(0)};
  EXPECT_EQ(ckptio_writer_add(w, &dev), CKPTIO_E_DEVICE);
  ckptio_tensor nul{"z", CKPTIO_U8, 1, {4}, nullptr, CKPTIO_DEVICE_HOST};
  EXPECT_EQ(ckptio_writer_add(w, &nul), CKPTIO_E_INVALID_ARG);
  // Closing without commit writes nothing.
  EXPECT_EQ(ckptio_writer_close(w), 0);
  EXPECT_TRUE(dir.list().empty());
}

TEST(Pipeline, ManyTensorsWithDuplicateFarApart) {
  TempDir dir;
  TestContext c(small_options());
  ckptio_writer *w;
  ASSERT_EQ(ckptio_writer_open(c.ctx, dir.file("m.safetensors").c_str(), CKPTIO_FORMAT_SAFETENSORS, nullptr, &w), 0);
  uint8_t b = 1;
  std::vector<std::string> names;
  for (int i = 0; i < 5000; i++) names.push_back("layer." + std::to_string(i));
  for (auto &n : names) {
    ckptio_tensor t{n.c_str(), CKPTIO_U8, 1, {1}, &b, CKPTIO_DEVICE_HOST};
    ASSERT_EQ(ckptio_writer_add(w, &t), 0);
  }
  ckptio_tensor t{"layer.3", CKPTIO_U8, 1, {1}, &b, CKPTIO_DEVICE_HOST};
  EXPECT_EQ(ckptio_writer_add(w, &t), CKPTIO_E_DUPLICATE);
  ASSERT_EQ(ckptio_writer_commit(w), 0) << ckptio_writer_last_error(w);
  ckptio_writer_close(w);
  ckptio_reader *r;
  ASSERT_EQ(ckptio_reader_open(c.ctx, dir.file("m.safetensors").c_str(), nullptr, &r), 0);
  EXPECT_EQ(ckptio_reader_count(r), 5000u);
  EXPECT_GE(ckptio_reader_find(r, "layer.4999"), 0);
  ckptio_reader_close(r);
}

// The snapshot point: once wait_snapshot returns, the caller's memory may
// change and the file must still hold the values at the time of the save.
TEST(Pipeline, SnapshotThenModifyKeepsSavedValues) {
  TempDir dir;
  TestContext c(small_options(64 << 10, 128 << 10, 2));  // 2 slots: the save runs long after add
  std::vector<Tensor> ts = {make_tensor("a", CKPTIO_F32, {1 << 20}, 1), make_tensor("b", CKPTIO_BF16, {777}, 2)};
  auto original = ts;
  ckptio_writer *w;
  ASSERT_EQ(ckptio_writer_open(c.ctx, dir.file("m.safetensors").c_str(), CKPTIO_FORMAT_SAFETENSORS, nullptr, &w), 0);
  for (auto &t : ts) {
    ckptio_tensor d{t.name.c_str(), t.dtype, 1, {t.shape[0]}, t.bytes.data(), CKPTIO_DEVICE_HOST};
    ASSERT_EQ(ckptio_writer_add(w, &d), 0);
  }
  EXPECT_EQ(ckptio_writer_poll_snapshot(w), CKPTIO_E_STATE);
  ASSERT_EQ(ckptio_writer_commit_async(w), 0);
  EXPECT_EQ(ckptio_writer_commit_async(w), CKPTIO_E_STATE);
  ASSERT_EQ(ckptio_writer_wait_snapshot(w), 0);
  EXPECT_EQ(ckptio_writer_poll_snapshot(w), 1);
  for (auto &t : ts) std::fill(t.bytes.begin(), t.bytes.end(), 0xFF);
  ASSERT_EQ(ckptio_writer_wait_durable(w), 0) << ckptio_writer_last_error(w);
  EXPECT_EQ(ckptio_writer_poll_durable(w), 1);
  uint64_t done, total;
  ckptio_writer_progress(w, &done, &total);
  EXPECT_EQ(done, total);
  EXPECT_EQ(total, (4u << 20) + 777 * 2);
  EXPECT_EQ(ckptio_writer_close(w), 0);
  expect_loads(c.ctx, dir.file("m.safetensors"), original);
}

TEST(Pipeline, ContextReusedAcrossSavesAndConcurrentWriters) {
  TempDir dir;
  TestContext c(small_options(64 << 10, 256 << 10, 4));
  std::vector<std::thread> th;
  for (int k = 0; k < 4; k++) {
    th.emplace_back([&, k] {
      for (int step = 0; step < 3; step++) {
        std::vector<Tensor> ts = {make_tensor("w", CKPTIO_F32, {100000 + k}, k * 10 + step)};
        std::string p = dir.file("m" + std::to_string(k) + ".safetensors");
        std::string err;
        ASSERT_EQ(save(c.ctx, p, ts, nullptr, &err), 0) << err;
        expect_loads(c.ctx, p, ts);  // overwrites the previous step atomically
      }
    });
  }
  for (auto &t : th) t.join();
  EXPECT_EQ(dir.list().size(), 4u);
}

// Snapshot memory is faulted in by a thread of the context while saves
// already use it (ctx.c): that thread never writes a byte, so saves started
// at once, from two threads, round-trip exactly; and the context is freed
// while it may still be preparing (TSan runs this test).
TEST(Pipeline, SavesWhileSnapshotMemoryIsPrepared) {
  TempDir dir;
  ckptio_options o = small_options(64 << 10, 256 << 10, 4);
  o.snapshot_bytes = 64u << 20;  // 1024 slots, prepared one by one
  TestContext c(o);
  std::vector<std::thread> th;
  for (int k = 0; k < 2; k++) {
    th.emplace_back([&, k] {
      std::vector<Tensor> ts = {make_tensor("w", CKPTIO_F32, {(1 << 20) + k}, k + 1),
                                make_tensor("b", CKPTIO_BF16, {4097}, k + 5)};
      std::string p = dir.file("m" + std::to_string(k) + ".safetensors");
      std::string err;
      ASSERT_EQ(save(c.ctx, p, ts, nullptr, &err), 0) << err;
      expect_loads(c.ctx, p, ts);
    });
  }
  for (auto &t : th) t.join();
}

// A tensor beyond 4 GiB in a sparse file: offsets and sizes stay 64-bit.
TEST(Pipeline, ReadsTensorPastFourGiBInSparseFile) {
  TempDir dir;
  TestContext c(small_options());
  const uint64_t hole = (4ull << 30) + 4096;
  std::string json = "{\"hole\":{\"dtype\":\"U8\",\"shape\":[" + std::to_string(hole) +
                     "],\"data_offsets\":[0," + std::to_string(hole) + "]},\"tail\":{\"dtype\":\"F32\",\"shape\":[3]," +
                     "\"data_offsets\":[" + std::to_string(hole) + "," + std::to_string(hole + 12) + "]}}";
  while ((8 + json.size()) % 8) json += ' ';
  std::string path = dir.file("sparse.safetensors");
  int fd = open(path.c_str(), O_CREAT | O_WRONLY, 0644);
  ASSERT_GE(fd, 0);
  uint64_t n = json.size();
  ASSERT_EQ(pwrite(fd, &n, 8, 0), 8);
  ASSERT_EQ(pwrite(fd, json.data(), n, 8), (ssize_t)n);
  float tail[3] = {1.5f, -2.0f, 3.25f};
  ASSERT_EQ(pwrite(fd, tail, 12, 8 + n + hole), 12);
  close(fd);
  ckptio_reader *r;
  ASSERT_EQ(ckptio_reader_open(c.ctx, path.c_str(), nullptr, &r), 0) << ckptio_last_open_error();
  int64_t i = ckptio_reader_find(r, "tail");
  ASSERT_GE(i, 0);
  ckptio_tensor_info info;
  ASSERT_EQ(ckptio_reader_info(r, (size_t)i, &info), 0);
  EXPECT_GT(info.offset, 4ull << 30);
  for (auto m : {CKPTIO_LOAD_PREAD, CKPTIO_LOAD_MMAP, CKPTIO_LOAD_DIRECT}) {
    ckptio_reader *rm;
    ckptio_options o = CKPTIO_OPTIONS_INIT;
    o.load_method = m;
    ASSERT_EQ(ckptio_reader_open(c.ctx, path.c_str(), &o, &rm), 0);
    float got[3] = {};
    ASSERT_EQ(ckptio_reader_load(rm, (size_t)i, got, sizeof(got)), 0) << ckptio_reader_last_error(rm);
    EXPECT_EQ(memcmp(got, tail, 12), 0) << "method " << m;
    ckptio_reader_close(rm);
  }
  ckptio_reader_close(r);
}

TEST(Pipeline, LoadRejectsSmallDestination) {
  TempDir dir;
  TestContext c(small_options());
  std::vector<Tensor> ts = {make_tensor("w", CKPTIO_F32, {10}, 1)};
  ASSERT_EQ(save(c.ctx, dir.file("m.safetensors"), ts), 0);
  ckptio_reader *r;
  ASSERT_EQ(ckptio_reader_open(c.ctx, dir.file("m.safetensors").c_str(), nullptr, &r), 0);
  float buf[10];
  EXPECT_EQ(ckptio_reader_load(r, 0, buf, 39), CKPTIO_E_BUFFER_TOO_SMALL);
  EXPECT_NE(std::string(ckptio_reader_last_error(r)).find("'w'"), std::string::npos);
  EXPECT_EQ(ckptio_reader_load(r, 5, buf, 40), CKPTIO_E_INVALID_ARG);
  ckptio_reader_close(r);
}

// A file cut short after it was opened: the mapped load is a clean error
// (MADV_POPULATE_READ reports the missing pages), never SIGBUS; pread and
// O_DIRECT see a short read.
TEST(Pipeline, FileShortenedAfterOpenIsAnError) {
  if (on_gpu()) GTEST_SKIP() << "host loads";
  TempDir dir;
  TestContext c(small_options());
  std::vector<Tensor> ts = {make_tensor("w", CKPTIO_F32, {64, 1024}, 3)};
  std::string path = dir.file("m.safetensors");
  for (auto m : {CKPTIO_LOAD_MMAP, CKPTIO_LOAD_PREAD, CKPTIO_LOAD_DIRECT}) {
    SCOPED_TRACE(m);
    ASSERT_EQ(save(c.ctx, path, ts), 0);
    ckptio_options o = small_options();
    o.load_method = m;
    ckptio_reader *r = nullptr;
    ASSERT_EQ(ckptio_reader_open(c.ctx, path.c_str(), &o, &r), 0);
    ASSERT_EQ(truncate(path.c_str(), 3 * 4096), 0);
    std::vector<uint8_t> buf(ts[0].bytes.size());
    EXPECT_EQ(ckptio_reader_load(r, 0, buf.data(), buf.size()), CKPTIO_E_SHORT_IO) << ckptio_reader_last_error(r);
    EXPECT_NE(std::string(ckptio_reader_last_error(r)).find("'w'"), std::string::npos);
    ckptio_reader_close(r);
  }
}

TEST(Pipeline, OptionsAreValidated) {
  ckptio_ctx *ctx = nullptr;
  ckptio_options o = small_options(1000, 1 << 20, 2);  // chunk not a page multiple
  EXPECT_EQ(ckptio_ctx_create(&o, &ctx), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(ctx, nullptr);
  o = small_options(1 << 20, 1 << 20, 2);  // one slot: no overlap possible
  EXPECT_EQ(ckptio_ctx_create(&o, &ctx), CKPTIO_E_INVALID_ARG);
  ASSERT_EQ(ckptio_ctx_create(nullptr, &ctx), 0);
  ckptio_options got = CKPTIO_OPTIONS_INIT;
  ASSERT_EQ(ckptio_ctx_options(ctx, &got), 0);
  EXPECT_EQ(got.chunk_bytes, 8u << 20);
  EXPECT_EQ(got.staging_bytes, 256u << 20);
  EXPECT_EQ(got.crc, 1);
  ckptio_ctx_free(ctx);
  ckptio_ctx_free(nullptr);
  ckptio_writer_close(nullptr);
  ckptio_reader_close(nullptr);
}

// Issue 28: ckptio_last_open_error kept an older failure's text after a
// later open succeeded, or failed early on a NULL argument without a word.
// Every open-type call clears it on entry and, when it fails, leaves its own
// detail there.
TEST(Pipeline, LastOpenErrorBelongsToTheLastOpen) {
  TempDir dir;
  ckptio_ctx *ctx = nullptr;
  ASSERT_EQ(ckptio_ctx_create(nullptr, &ctx), 0);
  auto last = [] { return std::string(ckptio_last_open_error()); };
  // A failure whose text names "stale-file", for the next call to replace.
  auto stale = [&] {
    ckptio_reader *r = nullptr;
    ASSERT_LT(ckptio_reader_open(ctx, dir.file("stale-file").c_str(), nullptr, &r), 0);
    ASSERT_NE(last().find("stale-file"), std::string::npos) << last();
  };
  // A failed call leaves a message of its own (naming the call or the path).
  auto fails = [&](int rc, const char *what) {
    EXPECT_LT(rc, 0) << what;
    EXPECT_EQ(last().find("stale-file"), std::string::npos) << what << ": " << last();
    EXPECT_NE(last(), "") << what;
  };
  auto clean = [&](int rc, const char *what) {
    EXPECT_EQ(rc, 0) << what << ": " << last();
    EXPECT_EQ(last(), "") << what;
  };
  Tensor a = make_tensor("a", CKPTIO_F32, {4}, 1);
  ASSERT_EQ(save(ctx, dir.file("a.safetensors"), {a}), 0);
  ckptio_options bad = small_options(1000, 1 << 20, 2);  // chunk not a page multiple
  ckptio_comm comm;
  ckptio_comm_single(&comm);
  ckptio_writer *w = nullptr;
  ckptio_reader *r = nullptr;
  ckptio_manager *m = nullptr;
  ckptio_ctx *c2 = nullptr;

  stale();
  fails(ckptio_ctx_create(&bad, &c2), "ckptio_ctx_create, bad options");
  stale();
  fails(ckptio_ctx_create(nullptr, nullptr), "ckptio_ctx_create, NULL out");
  stale();
  clean(ckptio_ctx_create(nullptr, &c2), "ckptio_ctx_create");
  ckptio_ctx_free(c2);

  stale();
  fails(ckptio_reader_open(ctx, nullptr, nullptr, &r), "ckptio_reader_open, NULL path");
  stale();
  clean(ckptio_reader_open(ctx, dir.file("a.safetensors").c_str(), nullptr, &r), "ckptio_reader_open");
  ckptio_reader_close(r);

  stale();
  fails(ckptio_writer_open(ctx, nullptr, CKPTIO_FORMAT_SAFETENSORS, nullptr, &w), "ckptio_writer_open, NULL path");
  stale();
  fails(ckptio_writer_open(ctx, dir.file("b").c_str(), (ckptio_format)99, nullptr, &w), "ckptio_writer_open, format");
  stale();
  clean(ckptio_writer_open(ctx, dir.file("b").c_str(), CKPTIO_FORMAT_SAFETENSORS, nullptr, &w), "ckptio_writer_open");
  ckptio_writer_close(w);

  stale();
  fails(ckptio_writer_open_sharded(ctx, nullptr, "model", CKPTIO_FORMAT_SAFETENSORS, 1000, CKPTIO_SHARD_ORDER_ADDED,
                                   nullptr, &w),
        "ckptio_writer_open_sharded, NULL dir");
  stale();
  clean(ckptio_writer_open_sharded(ctx, dir.path().c_str(), "model", CKPTIO_FORMAT_SAFETENSORS, 1000,
                                   CKPTIO_SHARD_ORDER_ADDED, nullptr, &w),
        "ckptio_writer_open_sharded");
  ckptio_writer_close(w);

  stale();
  fails(ckptio_writer_open_ranks(ctx, nullptr, dir.path().c_str(), "model", nullptr, &w),
        "ckptio_writer_open_ranks, NULL comm");
  stale();
  clean(ckptio_writer_open_ranks(ctx, &comm, dir.path().c_str(), "model", nullptr, &w), "ckptio_writer_open_ranks");
  ckptio_writer_close(w);

  stale();
  fails(ckptio_manager_open(ctx, nullptr, nullptr, nullptr, &m), "ckptio_manager_open, NULL dir");
  stale();
  clean(ckptio_manager_open(ctx, dir.file("steps").c_str(), nullptr, nullptr, &m), "ckptio_manager_open");
  ckptio_manager_close(m);

  // Other calls leave it alone: it stays the last open's.
  ASSERT_EQ(ckptio_writer_open(ctx, dir.file("c.safetensors").c_str(), CKPTIO_FORMAT_SAFETENSORS, nullptr, &w), 0);
  stale();
  ckptio_tensor d = host_desc(a);
  EXPECT_EQ(ckptio_writer_add(w, &d), 0);
  EXPECT_EQ(ckptio_writer_commit(w), 0) << ckptio_writer_last_error(w);
  EXPECT_EQ(ckptio_writer_close(w), 0);
  EXPECT_NE(last().find("stale-file"), std::string::npos) << last();
  // The manager's save and latest open files inside, and put it back.
  ASSERT_EQ(ckptio_manager_open(ctx, dir.file("steps").c_str(), nullptr, nullptr, &m), 0);
  stale();
  ASSERT_EQ(ckptio_manager_save_begin(m, 7, &w), 0) << ckptio_manager_last_error(m);
  EXPECT_EQ(ckptio_writer_add(w, &d), 0);
  EXPECT_EQ(ckptio_writer_commit_async(w), 0) << ckptio_writer_last_error(w);
  ASSERT_EQ(ckptio_manager_save_end(m, w), 0) << ckptio_manager_last_error(m);
  uint64_t step = 0;
  char path[4096];
  EXPECT_EQ(ckptio_manager_latest(m, &step, path, sizeof(path)), 1) << ckptio_manager_last_error(m);
  EXPECT_EQ(step, 7u);
  EXPECT_NE(last().find("stale-file"), std::string::npos) << last();
  ckptio_manager_close(m);
  ckptio_ctx_free(ctx);
}

// Issue 28: ckptio_ctx_options(NULL, ...) dereferenced NULL (the test
// crashed); with no context it gives CKPTIO_OPTIONS_INIT, and a NULL out is
// a no-op.
TEST(Pipeline, OptionsOfNoContextAreTheInitValues) {
  const ckptio_options init = CKPTIO_OPTIONS_INIT;
  ckptio_options got = small_options();
  got.crc = 0;
  ckptio_ctx_options(nullptr, &got);
  EXPECT_EQ(got.size, init.size);
  EXPECT_EQ(got.threads, init.threads);
  EXPECT_EQ(got.chunk_bytes, init.chunk_bytes);
  EXPECT_EQ(got.staging_bytes, init.staging_bytes);
  EXPECT_EQ(got.crc, init.crc);
  EXPECT_EQ(got.direct_io, init.direct_io);
  EXPECT_EQ(got.fsync, init.fsync);
  EXPECT_EQ(got.load_method, init.load_method);
  EXPECT_EQ(got.cuda, init.cuda);
  EXPECT_EQ(got.snapshot_bytes, init.snapshot_bytes);
  ckptio_ctx_options(nullptr, nullptr);
  ckptio_ctx *ctx = nullptr;
  ASSERT_EQ(ckptio_ctx_create(nullptr, &ctx), 0);
  ckptio_ctx_options(ctx, nullptr);
  ckptio_ctx_free(ctx);
}

namespace {

// A fill serving a Tensor's bytes, counting how often each byte was asked
// for; fails with -EIO at byte `fail_at` of the tensor when set.
struct Filled {
  const Tensor *t;
  std::mutex mu;
  std::vector<int> asked;
  int64_t fail_at = -1;
};

int fill_from(void *arg, uint64_t offset, void *dst, uint64_t nbytes, char *why, size_t why_len) {
  auto *f = static_cast<Filled *>(arg);
  std::lock_guard<std::mutex> lock(f->mu);
  if (f->fail_at >= 0 && (uint64_t)f->fail_at >= offset && (uint64_t)f->fail_at < offset + nbytes) {
    snprintf(why, why_len, "the source went away");
    return -EIO;
  }
  for (uint64_t i = offset; i < offset + nbytes; i++) f->asked.at(i)++;
  memcpy(dst, f->t->bytes.data() + offset, nbytes);
  return 0;
}

// Every other tensor of ts added with a fill; *fills keeps their state.
void add_half_filled(ckptio_writer *w, const std::vector<Tensor> &ts, std::vector<std::unique_ptr<Filled>> *fills) {
  for (size_t i = 0; i < ts.size(); i++) {
    ckptio_tensor d = host_desc(ts[i]);
    if (i % 2 == 0) {
      ASSERT_EQ(ckptio_writer_add(w, &d), 0) << ckptio_writer_last_error(w);
      continue;
    }
    fills->push_back(std::make_unique<Filled>());
    Filled *f = fills->back().get();
    f->t = &ts[i];
    f->asked.assign(ts[i].bytes.size(), 0);
    d.data = nullptr;
    ASSERT_EQ(ckptio_writer_add_fill(w, &d, fill_from, f), 0) << ckptio_writer_last_error(w);
  }
}

}  // namespace

// ckptio_writer_add_fill: the bytes come from the callback, every byte asked
// for exactly once, through a single file, a compressed one (frames may cut
// elements) and a sharded set; a failing fill fails the save and publishes
// nothing; a filled tensor with a data pointer or on a GPU is refused.
TEST(Pipeline, FilledTensorsComeFromTheirFillOnce) {
  std::vector<Tensor> ts = every_dtype_model();
  ts.push_back(make_tensor("rows", CKPTIO_F32, {300, 129}, 7));  // ~151 KiB: many 64 KiB chunks
  ts.push_back(make_tensor("more.rows", CKPTIO_BF16, {77, 1001}, 8));
  struct Kind { const char *name; int level; uint64_t shard; };
  for (Kind k : {Kind{"file", 0, 0}, Kind{"zstd", 3, 0}, Kind{"set", 0, 100 << 10}}) {
    SCOPED_TRACE(k.name);
    TempDir dir;
    TestContext c(small_options());
    ckptio_options o = small_options();
    o.compress_level = k.level;
    std::string path = k.shard ? dir.path() : dir.file("m.safetensors");
    ckptio_writer *w;
    ASSERT_EQ(k.shard ? ckptio_writer_open_sharded(c.ctx, path.c_str(), "m", CKPTIO_FORMAT_SAFETENSORS, k.shard,
                                                   CKPTIO_SHARD_ORDER_ADDED, nullptr, &w)
                      : ckptio_writer_open(c.ctx, path.c_str(), CKPTIO_FORMAT_SAFETENSORS, &o, &w),
              0);
    std::vector<std::unique_ptr<Filled>> fills;
    add_half_filled(w, ts, &fills);
    ASSERT_EQ(ckptio_writer_commit(w), 0) << ckptio_writer_last_error(w);
    ckptio_writer_close(w);
    for (auto &f : fills)
      for (size_t i = 0; i < f->asked.size(); i++) ASSERT_EQ(f->asked[i], 1) << f->t->name << " byte " << i;
    if (k.level) {  // no views of a compressed file: loads only
      ckptio_reader *r;
      ASSERT_EQ(ckptio_reader_open(c.ctx, path.c_str(), nullptr, &r), 0);
      for (const Tensor &t : ts) {
        std::vector<uint8_t> got(t.bytes.size() + 1);
        EXPECT_EQ(ckptio_reader_load(r, (size_t)ckptio_reader_find(r, t.name.c_str()), got.data(), got.size()), 0);
        got.resize(t.bytes.size());
        EXPECT_TRUE(got == t.bytes) << t.name;
      }
      ckptio_reader_close(r);
    } else {
      expect_loads(c.ctx, path, ts);
    }
  }

  TempDir dir;
  TestContext c(small_options());
  ckptio_writer *w;
  ASSERT_EQ(ckptio_writer_open(c.ctx, dir.file("m.safetensors").c_str(), CKPTIO_FORMAT_SAFETENSORS, nullptr, &w), 0);
  std::vector<std::unique_ptr<Filled>> fills;
  add_half_filled(w, ts, &fills);
  fills.back()->fail_at = 30000;  // past the first 64 KiB chunk of the file
  EXPECT_EQ(ckptio_writer_commit(w), -EIO);
  std::string err = ckptio_writer_last_error(w);
  EXPECT_NE(err.find("'" + fills.back()->t->name + "'"), std::string::npos) << err;
  EXPECT_NE(err.find("the source went away"), std::string::npos) << err;
  ckptio_writer_close(w);
  EXPECT_TRUE(dir.list().empty());

  ASSERT_EQ(ckptio_writer_open(c.ctx, dir.file("n.safetensors").c_str(), CKPTIO_FORMAT_SAFETENSORS, nullptr, &w), 0);
  uint8_t buf[4] = {};
  ckptio_tensor with_data{"d", CKPTIO_U8, 1, {4}, buf, CKPTIO_DEVICE_HOST};
  EXPECT_EQ(ckptio_writer_add_fill(w, &with_data, fill_from, nullptr), CKPTIO_E_INVALID_ARG);
  ckptio_tensor on_gpu{"g", CKPTIO_U8, 1, {4}, nullptr, CKPTIO_DEVICE_CUDA(0)};
  EXPECT_EQ(ckptio_writer_add_fill(w, &on_gpu, fill_from, nullptr), CKPTIO_E_INVALID_ARG);
  EXPECT_NE(std::string(ckptio_writer_last_error(w)).find("'g'"), std::string::npos);
  ckptio_tensor no_fill{"n", CKPTIO_U8, 1, {4}, nullptr, CKPTIO_DEVICE_HOST};
  EXPECT_EQ(ckptio_writer_add_fill(w, &no_fill, nullptr, nullptr), CKPTIO_E_INVALID_ARG);
  ckptio_writer_close(w);
}
