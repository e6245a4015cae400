// Sharded checkpoints: the Hugging Face layout written as an atomic set
// (faults anywhere leave the old set byte-identical and no temp file), read
// back as one checkpoint through the index or the directory, and hostile
// indexes (escaping names, missing files and tensors, wrong types, huge
// files, mixed saves, and thousands of mutations) refused with clear errors.

// Uses ckptio_reader_plan_rank, of ckptio.h's experimental section.
#define CKPTIO_EXPERIMENTAL

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <random>

#include "ckpt_fixture.h"
extern "C" {
#include "core/hold.h"
#include "formats/hf_index.h"
#include "ctx/ctx.h"
#include "io/fault.h"
}

using namespace ckptio_test;

namespace {

const char *kIndex = "model.safetensors.index.json";

std::string shard_name(int k, int n) {
  char b[64];
  snprintf(b, sizeof(b), "model-%05d-of-%05d.safetensors", k, n);
  return b;
}

int save_set(ckptio_ctx *ctx, const std::string &dir, const std::vector<Tensor> &ts, uint64_t max_bytes,
             std::string *err = nullptr, size_t *nshards = nullptr,
             ckptio_shard_order order = CKPTIO_SHARD_ORDER_ADDED) {
  ckptio_writer *w = nullptr;
  int rc = ckptio_writer_open_sharded(ctx, dir.c_str(), "model", CKPTIO_FORMAT_SAFETENSORS, max_bytes, order,
                                      nullptr, &w);
  if (rc < 0) {
    if (err) *err = ckptio_last_open_error();
    return rc;
  }
  rc = ckptio_writer_set_metadata(w, "format", "pt");
  std::vector<std::pair<int, void *>> on_device;
  for (size_t k = 0; k < ts.size() && rc == 0; k++) {
    ckptio_tensor d = host_desc(ts[k]);
    if (on_gpu()) {
      d.device = CKPTIO_DEVICE_CUDA((int)(k % (size_t)gpu_count()));
      void *p = nullptr;
      if ((rc = ckptio_device_alloc(ctx, d.device, ts[k].bytes.size(), &p)) < 0) break;
      on_device.push_back({d.device, p});
      to_gpu(p, ts[k].bytes.data(), ts[k].bytes.size());
      d.data = p;
    }
    rc = ckptio_writer_add(w, &d);
  }
  if (rc == 0) rc = ckptio_writer_commit_async(w);
  if (rc == 0) {
    int snap = ckptio_writer_wait_snapshot(w);
    rc = ckptio_writer_wait_durable(w);
    if (rc == 0) {
      EXPECT_EQ(snap, 0);
    }
    // Settled: both polls say so, with the set's error when it failed.
    EXPECT_EQ(ckptio_writer_poll_durable(w), rc == 0 ? 1 : rc);
    EXPECT_EQ(ckptio_writer_poll_snapshot(w), rc == 0 ? 1 : rc);
  }
  if (err) *err = ckptio_writer_last_error(w);
  if (nshards) *nshards = ckptio_writer_shard_count(w);
  int rc2 = ckptio_writer_close(w);
  for (auto &dp : on_device) ckptio_device_free(ctx, dp.first, dp.second);
  return rc < 0 ? rc : rc2;
}

// Tensor sizes 40000, 40000, 120000 (over the limit), 4000, 40000, 28: with
// a 100000-byte limit: {a, b}, {c}, {d, e, f}... see SplitsInOrderByTheFillRule.
std::vector<Tensor> model(uint64_t seed) {
  return {make_tensor("layers.0.w", CKPTIO_F32, {100, 100}, seed + 1),
          make_tensor("layers.0.b", CKPTIO_BF16, {20000}, seed + 2),
          make_tensor("embed", CKPTIO_F32, {300, 100}, seed + 3),
          make_tensor("layers.1.w", CKPTIO_F16, {2000}, seed + 4),
          make_tensor("layers.1.b", CKPTIO_F32, {10000}, seed + 5),
          make_tensor("scale", CKPTIO_F64, {}, seed + 6),
          make_tensor("head", CKPTIO_U8, {70000}, seed + 7)};
}

class Shard : public ::testing::Test {
 protected:
  void SetUp() override {
    ckptio_options o = small_options(64 << 10, 512 << 10, 4);
    ASSERT_EQ(ckptio_ctx_create(&o, &ctx_), 0);
  }
  void TearDown() override {
    ckptio_fault_clear();
    ckptio_ctx_free(ctx_);
  }
  std::map<std::string, std::vector<uint8_t>> snapshot() const {
    std::map<std::string, std::vector<uint8_t>> m;
    for (auto &n : dir_.list()) m[n] = read_file(dir_.file(n));
    return m;
  }
  int open(const std::string &path, ckptio_reader **r, std::string *err) {
    int rc = ckptio_reader_open(ctx_, path.c_str(), nullptr, r);
    *err = ckptio_last_open_error();
    return rc;
  }
  // Opens path, expecting failure with code and text in the message.
  void expect_open_error(const std::string &path, int code, const std::string &text) {
    ckptio_reader *r = nullptr;
    std::string err;
    int rc = open(path, &r, &err);
    EXPECT_EQ(rc, code) << err;
    EXPECT_EQ(r, nullptr);
    EXPECT_NE(err.find(text), std::string::npos) << "message: " << err;
    ckptio_reader_close(r);
  }

  TempDir dir_;
  ckptio_ctx *ctx_ = nullptr;
};

}  // namespace

// The index's bytes alone (formats/hf_index_write.c): transformers' layout,
// total_size sorted among the other metadata keys, inputs left in order.
TEST(HfIndexWrite, SortedTwoSpaceLayout) {
  ckptio_hf_weight map[] = {{"z", "m-00002-of-00002.safetensors"}, {"a\"b", "m-00001-of-00002.safetensors"}};
  ckptio_kv meta[] = {{"zeta", "1"}, {"alpha", "x"}};
  ckptio_json_out o = {};
  ASSERT_EQ(ckptio_hf_index_write(map, 2, nullptr, 0, meta, 2, 42, &o), 0);
  EXPECT_EQ(std::string(o.data, o.len),
            "{\n  \"metadata\": {\n    \"alpha\": \"x\",\n    \"total_size\": 42,\n    \"zeta\": \"1\"\n  },\n"
            "  \"weight_map\": {\n    \"a\\\"b\": \"m-00001-of-00002.safetensors\",\n"
            "    \"z\": \"m-00002-of-00002.safetensors\"\n  }\n}\n");
  EXPECT_STREQ(map[0].tensor, "z") << "the caller's array is not reordered";
  free(o.data);
  o = {};
  ASSERT_EQ(ckptio_hf_index_write(nullptr, 0, nullptr, 0, nullptr, 0, 0, &o), 0);
  EXPECT_EQ(std::string(o.data, o.len), "{\n  \"metadata\": {\n    \"total_size\": 0\n  },\n  \"weight_map\": {}\n}\n");
  free(o.data);
  o = {};
  ckptio_hf_weight dup[] = {{"a", "f"}, {"a", "g"}};
  EXPECT_EQ(ckptio_hf_index_write(dup, 2, nullptr, 0, nullptr, 0, 0, &o), CKPTIO_E_DUPLICATE);
  ckptio_kv total[] = {{"total_size", "1"}};
  EXPECT_EQ(ckptio_hf_index_write(map, 2, nullptr, 0, total, 1, 0, &o), CKPTIO_E_INVALID_ARG);
  free(o.data);
}

TEST_F(Shard, SplitsInOrderByTheFillRule) {
  auto ts = model(0);
  size_t n = 0;
  std::string err;
  ASSERT_EQ(save_set(ctx_, dir_.path(), ts, 100000, &err, &n), 0) << err;
  // {w 40000, b 40000}, {embed 120000: alone}, {l1.w 4000, l1.b 40000, scale 8}, {head 70000}
  ASSERT_EQ(n, 4u);
  std::vector<std::string> want = {kIndex};
  for (int k = 1; k <= 4; k++) want.push_back(shard_name(k, 4));
  std::sort(want.begin(), want.end());
  EXPECT_EQ(dir_.list(), want) << "exactly the shards and the index, no temp file";
  std::vector<std::vector<std::string>> expect = {
      {"layers.0.b", "layers.0.w"}, {"embed"}, {"layers.1.b", "layers.1.w", "scale"}, {"head"}};
  for (int k = 1; k <= 4; k++) {
    ckptio_reader *r = nullptr;
    ASSERT_EQ(ckptio_reader_open(ctx_, dir_.file(shard_name(k, 4)).c_str(), nullptr, &r), 0);
    std::vector<std::string> names;
    for (size_t i = 0; i < ckptio_reader_count(r); i++) {
      ckptio_tensor_info info;
      ckptio_reader_info(r, i, &info);
      names.push_back(info.name);
    }
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, expect[k - 1]) << "shard " << k;
    char tag[16];
    snprintf(tag, sizeof(tag), "%d/4", k);
    EXPECT_STREQ(ckptio_reader_metadata_get(r, "ckptio.shard"), tag);
    EXPECT_STREQ(ckptio_reader_metadata_get(r, "format"), "pt");
    ckptio_reader_close(r);
  }
  std::vector<uint8_t> idx = read_file(dir_.file(kIndex));
  std::string json(idx.begin(), idx.end());
  uint64_t total = 0;
  for (auto &t : ts) total += t.bytes.size();
  EXPECT_NE(json.find("\"total_size\": " + std::to_string(total)), std::string::npos) << json;
  EXPECT_NE(json.find("\"embed\": \"model-00002-of-00004.safetensors\""), std::string::npos) << json;
  EXPECT_LT(json.find("\"embed\""), json.find("\"head\"")) << "weight_map keys sorted";
  EXPECT_LT(json.find("\"head\""), json.find("\"layers.0.b\""));
}

// CKPTIO_SHARD_ORDER_HF: the tensor over the limit gets its shard at once,
// before the one still open, as huggingface_hub's
// split_torch_state_dict_into_shards places it (tests/interop compares with
// huggingface_hub itself).
TEST_F(Shard, HuggingFaceOrderPlacesTheOversizeShardFirst) {
  auto ts = model(0);
  size_t n = 0;
  std::string err;
  ASSERT_EQ(save_set(ctx_, dir_.path(), ts, 100000, &err, &n, CKPTIO_SHARD_ORDER_HF), 0) << err;
  ASSERT_EQ(n, 4u);
  std::vector<std::vector<std::string>> expect = {
      {"embed"}, {"layers.0.b", "layers.0.w", "layers.1.w"}, {"layers.1.b", "scale"}, {"head"}};
  for (int k = 1; k <= 4; k++) {
    ckptio_reader *r = nullptr;
    ASSERT_EQ(ckptio_reader_open(ctx_, dir_.file(shard_name(k, 4)).c_str(), nullptr, &r), 0);
    std::vector<std::string> names;
    for (size_t i = 0; i < ckptio_reader_count(r); i++) {
      ckptio_tensor_info info;
      ckptio_reader_info(r, i, &info);
      names.push_back(info.name);
    }
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, expect[k - 1]) << "shard " << k;
    ckptio_reader_close(r);
  }
  std::vector<uint8_t> idx = read_file(dir_.file(kIndex));
  std::string json(idx.begin(), idx.end());
  EXPECT_NE(json.find("\"embed\": \"model-00001-of-00004.safetensors\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"layers.1.w\": \"model-00002-of-00004.safetensors\""), std::string::npos) << json;
  expect_loads(ctx_, dir_.path(), ts);
}

// One handle for both kinds: a single file reports one shard, and NULL is
// refused by every call the same way.
TEST_F(Shard, OneWriterApiForFilesAndSets) {
  ckptio_writer *w = nullptr;
  ASSERT_EQ(ckptio_writer_open(ctx_, dir_.file("one.safetensors").c_str(), CKPTIO_FORMAT_SAFETENSORS, nullptr, &w), 0);
  EXPECT_EQ(ckptio_writer_shard_count(w), 1u);
  EXPECT_EQ(ckptio_writer_close(w), 0);
  EXPECT_EQ(ckptio_writer_open_sharded(ctx_, dir_.path().c_str(), "m", CKPTIO_FORMAT_SAFETENSORS, 10,
                                       (ckptio_shard_order)7, nullptr, &w),
            CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(w, nullptr);
  EXPECT_NE(std::string(ckptio_last_open_error()).find("shard order"), std::string::npos) << ckptio_last_open_error();
  ASSERT_EQ(ckptio_writer_open_sharded(ctx_, dir_.path().c_str(), "m", CKPTIO_FORMAT_SAFETENSORS, 10,
                                       CKPTIO_SHARD_ORDER_HF, nullptr, &w),
            0);
  EXPECT_EQ(ckptio_writer_shard_count(w), 0u) << "no shards before commit";
  EXPECT_EQ(ckptio_writer_close(w), 0);
  EXPECT_EQ(ckptio_writer_shard_count(nullptr), 0u);
  EXPECT_EQ(ckptio_writer_add(nullptr, nullptr), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(ckptio_writer_set_stream(nullptr, 0, nullptr), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(ckptio_writer_wait_snapshot(nullptr), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(ckptio_writer_commit(nullptr), CKPTIO_E_INVALID_ARG);
  uint64_t done = 1, total = 1;
  ckptio_writer_progress(nullptr, &done, &total);
  EXPECT_EQ(done + total, 0u);
  EXPECT_STREQ(ckptio_writer_last_error(nullptr), "");
}

// Issue 28: ckptio_writer_abort on a single-file or sharded writer only
// recorded a message, and a later commit still wrote and published the save
// and returned 0. After abort the writer may only be closed: every verb
// fails with CKPTIO_E_STATE and nothing reaches the directory (the older
// save there stays byte for byte, no temp file is left).
TEST_F(Shard, AnAbortedWriterCommitsNothing) {
  auto ts = model(10);
  std::string err;
  ASSERT_EQ(save(ctx_, dir_.file("one.safetensors"), ts, nullptr, &err), 0) << err;
  auto before = snapshot();
  for (int sharded = 0; sharded < 2; sharded++) {
    SCOPED_TRACE(sharded ? "sharded" : "one file");
    ckptio_writer *w = nullptr;
    if (sharded)
      ASSERT_EQ(ckptio_writer_open_sharded(ctx_, dir_.path().c_str(), "model", CKPTIO_FORMAT_SAFETENSORS, 100000,
                                           CKPTIO_SHARD_ORDER_ADDED, nullptr, &w), 0);
    else
      ASSERT_EQ(ckptio_writer_open(ctx_, dir_.file("one.safetensors").c_str(), CKPTIO_FORMAT_SAFETENSORS, nullptr, &w),
                0);
    std::vector<ckptio_tensor> d;
    for (auto &t : ts) d.push_back(host_desc(t));
    for (auto &x : d) ASSERT_EQ(ckptio_writer_add(w, &x), 0);
    EXPECT_EQ(ckptio_writer_abort(w, -EIO, "the caller gave up"), -EIO);
    EXPECT_NE(std::string(ckptio_writer_last_error(w)).find("the caller gave up"), std::string::npos)
        << ckptio_writer_last_error(w);
    EXPECT_EQ(ckptio_writer_commit(w), CKPTIO_E_STATE);
    EXPECT_NE(std::string(ckptio_writer_last_error(w)).find("aborted"), std::string::npos)
        << ckptio_writer_last_error(w);
    EXPECT_EQ(ckptio_writer_commit_async(w), CKPTIO_E_STATE);
    EXPECT_EQ(ckptio_writer_wait_durable(w), CKPTIO_E_STATE);
    EXPECT_EQ(ckptio_writer_add(w, &d[0]), CKPTIO_E_STATE);
    EXPECT_EQ(ckptio_writer_set_metadata(w, "k", "v"), CKPTIO_E_STATE);
    EXPECT_EQ(ckptio_writer_abort(w, -EIO, "again"), CKPTIO_E_STATE);
    EXPECT_EQ(ckptio_writer_close(w), 0);
    EXPECT_EQ(snapshot(), before) << "an aborted save wrote to the directory";
  }
  // Abort after a commit is refused and leaves the save alone.
  ckptio_writer *w = nullptr;
  ASSERT_EQ(ckptio_writer_open(ctx_, dir_.file("two.safetensors").c_str(), CKPTIO_FORMAT_SAFETENSORS, nullptr, &w), 0);
  ckptio_tensor d = host_desc(ts[0]);
  ASSERT_EQ(ckptio_writer_add(w, &d), 0);
  ASSERT_EQ(ckptio_writer_commit(w), 0) << ckptio_writer_last_error(w);
  EXPECT_EQ(ckptio_writer_abort(w, -EIO, "too late"), CKPTIO_E_STATE);
  EXPECT_EQ(ckptio_writer_close(w), 0);
  expect_loads(ctx_, dir_.file("two.safetensors"), {ts[0]});
}

TEST_F(Shard, OpensAsOneCheckpoint) {
  auto ts = model(10);
  std::string err;
  ASSERT_EQ(save_set(ctx_, dir_.path(), ts, 100000, &err), 0) << err;
  expect_loads(ctx_, dir_.file(kIndex), ts);
  expect_loads(ctx_, dir_.path(), ts, CKPTIO_LOAD_PREAD);
  expect_loads(ctx_, dir_.file(kIndex), ts, CKPTIO_LOAD_MMAP);
  expect_loads(ctx_, dir_.file(kIndex), ts, CKPTIO_LOAD_DIRECT);

  ckptio_reader *r = nullptr;
  ASSERT_EQ(open(dir_.path(), &r, &err), 0) << err;
  EXPECT_STREQ(ckptio_reader_format(r), "safetensors-sharded");
  EXPECT_EQ(ckptio_reader_count(r), ts.size());
  ASSERT_EQ(ckptio_reader_shard_count(r), 4u);
  size_t tensors = 0, all = 0;
  uint64_t bytes = 0, all_bytes = 0;
  const char *path = nullptr;
  for (size_t k = 0; k < 4; k++) {
    ASSERT_EQ(ckptio_reader_shard(r, k, &path, &tensors, &bytes), 0);
    EXPECT_EQ(std::string(path), dir_.file(shard_name((int)k + 1, 4)));
    all += tensors;
    all_bytes += bytes;
  }
  EXPECT_EQ(ckptio_reader_shard(r, 4, &path, &tensors, &bytes), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(all, ts.size());
  uint64_t total = 0;
  for (auto &t : ts) total += t.bytes.size();
  EXPECT_EQ(all_bytes, total);
  EXPECT_EQ(ckptio_reader_shard_of(r, (size_t)ckptio_reader_find(r, "embed")), 1);
  EXPECT_EQ(ckptio_reader_shard_of(r, (size_t)ckptio_reader_find(r, "head")), 3);
  EXPECT_STREQ(ckptio_reader_metadata_get(r, "total_size"), std::to_string(total).c_str());
  EXPECT_STREQ(ckptio_reader_metadata_get(r, "format"), "pt");
  EXPECT_NE(ckptio_reader_metadata_get(r, "ckptio.save_id"), nullptr);
  EXPECT_EQ(ckptio_reader_metadata_get(r, "ckptio.shard"), nullptr) << "differs per shard: not merged";
  // A corrupt byte in shard 3 is caught by verify and by a load, naming it.
  ckptio_reader_close(r);
  std::string s3 = dir_.file(shard_name(3, 4));
  auto bytes3 = read_file(s3);
  bytes3[bytes3.size() - 100] ^= 0x40;
  write_file(s3, bytes3);
  ASSERT_EQ(open(dir_.file(kIndex), &r, &err), 0) << err;
  EXPECT_EQ(ckptio_reader_verify(r, nullptr), CKPTIO_E_CHECKSUM);
  EXPECT_NE(std::string(ckptio_reader_last_error(r)).find(shard_name(3, 4)), std::string::npos)
      << ckptio_reader_last_error(r);
  ckptio_reader_close(r);
}

// Slices and tensor-parallel plans answer through the shard holding the
// tensor: the bytes come from that file and every range names its shard.
TEST_F(Shard, SlicesAndPlansReachTheirShard) {
  if (on_gpu()) GTEST_SKIP() << "host slices; device slices are test_slice's";
  auto ts = model(20);
  std::string err;
  ASSERT_EQ(save_set(ctx_, dir_.path(), ts, 100000, &err), 0) << err;
  ckptio_reader *r = nullptr;
  ASSERT_EQ(open(dir_.file(kIndex), &r, &err), 0) << err;
  const Tensor &embed = ts[2];  // [300, 100] f32, alone in shard 2 of 4
  size_t ix = (size_t)ckptio_reader_find(r, "embed");
  ASSERT_EQ(ckptio_reader_shard_of(r, ix), 1);
  std::vector<uint8_t> got(40 * 100 * 4);
  int verified = -1;
  ASSERT_EQ(ckptio_reader_load_slice(r, ix, 0, 10, 50, got.data(), got.size(), &verified), 0)
      << ckptio_reader_last_error(r);
  EXPECT_EQ(verified, 0);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), embed.bytes.begin() + 10 * 100 * 4));
  // Rank 1 of 2 on dim 1: 300 runs of 50 floats, each in shard 2's file.
  int64_t a = 0, b = 0;
  int64_t n = ckptio_reader_plan_rank(r, ix, 1, 1, 2, &a, &b, nullptr, 0);
  ASSERT_EQ(n, 300) << ckptio_reader_last_error(r);
  EXPECT_EQ(a, 50);
  EXPECT_EQ(b, 100);
  std::vector<ckptio_byte_range> ranges((size_t)n);
  ASSERT_EQ(ckptio_reader_plan_rank(r, ix, 1, 1, 2, nullptr, nullptr, ranges.data(), ranges.size()), n);
  const char *path = nullptr;
  ASSERT_EQ(ckptio_reader_shard(r, 1, &path, nullptr, nullptr), 0);
  auto file = read_file(path);
  for (size_t k = 0; k < ranges.size(); k++) {
    EXPECT_EQ(ranges[k].file, 1u);
    ASSERT_EQ(ranges[k].length, 200u);
    ASSERT_LE(ranges[k].offset + 200, file.size());
    EXPECT_EQ(0, memcmp(file.data() + ranges[k].offset, embed.bytes.data() + (k * 100 + 50) * 4, 200)) << k;
  }
  // A bad index is refused by the set with its message.
  EXPECT_EQ(ckptio_reader_load_slice(r, 99, 0, 0, 1, got.data(), got.size(), nullptr), CKPTIO_E_INVALID_ARG);
  EXPECT_NE(std::string(ckptio_reader_last_error(r)).find("no tensor at index 99 (the sharded set has"),
            std::string::npos);
  ckptio_reader_close(r);
}

TEST_F(Shard, OneShardAndSingleFileDirectories) {
  auto ts = model(20);
  std::string err;
  size_t n = 0;
  ASSERT_EQ(save_set(ctx_, dir_.path(), ts, 1ull << 40, &err, &n), 0) << err;
  EXPECT_EQ(n, 1u);
  expect_loads(ctx_, dir_.path(), ts);
  // A directory with one plain safetensors file and no index.
  TempDir single;
  ASSERT_EQ(save(ctx_, single.file("model.safetensors"), ts), 0);
  expect_loads(ctx_, single.path(), ts);
  ckptio_reader *r = nullptr;
  ASSERT_EQ(open(single.path(), &r, &err), 0) << err;
  EXPECT_STREQ(ckptio_reader_format(r), "safetensors");
  EXPECT_EQ(ckptio_reader_shard_count(r), 0u);
  ckptio_reader_close(r);
  // Two candidates and none: errors that list what was found.
  ASSERT_EQ(save(ctx_, single.file("other.safetensors"), ts), 0);
  expect_open_error(single.path(), CKPTIO_E_SHARD, "'other.safetensors'");
  TempDir empty;
  expect_open_error(empty.path(), CKPTIO_E_SHARD, "found neither");
  write_file(dir_.file("b.safetensors.index.json"), std::string("{}"));
  expect_open_error(dir_.path(), CKPTIO_E_SHARD, "b.safetensors.index.json");
}

TEST_F(Shard, StaleShardsOfAnotherCountAreRemoved) {
  std::string err;
  ASSERT_EQ(save_set(ctx_, dir_.path(), model(30), 100000, &err), 0) << err;
  write_file(dir_.file("notes.txt"), std::string("keep me"));
  write_file(dir_.file("model-00001-of-00004.safetensors.bak"), std::string("keep me"));
  write_file(dir_.file("other-00001-of-00002.safetensors"), std::string("keep me"));
  size_t n = 0;
  ASSERT_EQ(save_set(ctx_, dir_.path(), model(31), 1ull << 30, &err, &n), 0) << err;
  ASSERT_EQ(n, 1u);
  std::vector<std::string> want = {kIndex, shard_name(1, 1), "model-00001-of-00004.safetensors.bak", "notes.txt",
                                   "other-00001-of-00002.safetensors"};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(dir_.list(), want);
  expect_loads(ctx_, dir_.path(), model(31));
}

TEST_F(Shard, BadWriterArguments) {
  ckptio_writer *w = nullptr;
  EXPECT_EQ(ckptio_writer_open_sharded(ctx_, dir_.path().c_str(), "a/b", CKPTIO_FORMAT_SAFETENSORS, 10, CKPTIO_SHARD_ORDER_ADDED,
                                       nullptr, &w),
            CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(ckptio_writer_open_sharded(ctx_, dir_.path().c_str(), "m", CKPTIO_FORMAT_PYTORCH, 10, CKPTIO_SHARD_ORDER_ADDED,
                                       nullptr, &w),
            CKPTIO_E_FORMAT);
  EXPECT_EQ(ckptio_writer_open_sharded(ctx_, dir_.path().c_str(), "m", CKPTIO_FORMAT_SAFETENSORS, 0, CKPTIO_SHARD_ORDER_ADDED,
                                       nullptr, &w),
            CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(ckptio_writer_open_sharded(ctx_, dir_.file("nope").c_str(), "m", CKPTIO_FORMAT_SAFETENSORS, 10, CKPTIO_SHARD_ORDER_ADDED,
                                       nullptr, &w),
            -ENOENT);
  ckptio_options zo = CKPTIO_OPTIONS_INIT;
  zo.compress_level = 1;
  EXPECT_EQ(ckptio_writer_open_sharded(ctx_, dir_.path().c_str(), "m", CKPTIO_FORMAT_SAFETENSORS, 10, CKPTIO_SHARD_ORDER_ADDED,
                                       &zo, &w),
            CKPTIO_E_FORMAT);
  EXPECT_NE(std::string(ckptio_last_open_error()).find("plain safetensors"), std::string::npos);
  EXPECT_EQ(w, nullptr);
  ASSERT_EQ(ckptio_writer_open_sharded(ctx_, dir_.path().c_str(), "m", CKPTIO_FORMAT_SAFETENSORS, 10, CKPTIO_SHARD_ORDER_ADDED,
                                       nullptr, &w), 0);
  Tensor t = make_tensor("x", CKPTIO_F32, {4}, 1);
  ckptio_tensor d{"x", CKPTIO_F32, 1, {4}, t.bytes.data(), CKPTIO_DEVICE_HOST};
  EXPECT_EQ(ckptio_writer_set_metadata(w, "ckptio.save_id", "x"), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(ckptio_writer_commit(w), CKPTIO_E_INVALID_ARG) << "no tensors";
  EXPECT_EQ(ckptio_writer_add(w, &d), 0);
  EXPECT_EQ(ckptio_writer_add(w, &d), CKPTIO_E_DUPLICATE);
  d.dtype = (ckptio_dtype)99;
  EXPECT_EQ(ckptio_writer_add(w, &d), CKPTIO_E_DTYPE);
  EXPECT_EQ(ckptio_writer_close(w), 0);
  EXPECT_TRUE(dir_.list().empty()) << "a writer closed without commit writes nothing";
  EXPECT_EQ(ckptio_writer_close(nullptr), 0);
}

// ------------------------------------------------------------ atomic set

class ShardFaults : public Shard {
 protected:
  void SetUp() override {
    Shard::SetUp();
    std::string err;
    ASSERT_EQ(save_set(ctx_, dir_.path(), model(100), 100000, &err), 0) << err;
    old_ = snapshot();
    ASSERT_EQ(old_.size(), 5u);
  }
  void expect_failed_save(ckptio_fault_op op, long nth, int err_no, const std::string &want) {
    ckptio_fault_arm(op, nth, err_no);
    std::string err;
    int rc = save_set(ctx_, dir_.path(), model(200), 100000, &err);
    ckptio_fault_clear();
    EXPECT_LT(rc, 0);
    EXPECT_NE(err.find(want), std::string::npos) << err;
    auto now = snapshot();
    std::vector<std::string> names;
    for (auto &kv : now) names.push_back(kv.first);
    std::vector<std::string> old_names;
    for (auto &kv : old_) old_names.push_back(kv.first);
    EXPECT_EQ(names, old_names) << "a temp file was left or a file vanished";
    EXPECT_TRUE(now == old_) << "the old set changed";
    expect_loads(ctx_, dir_.path(), model(100));
    // And the next save goes through.
    ASSERT_EQ(save_set(ctx_, dir_.path(), model(300), 100000, &err), 0) << err;
    expect_loads(ctx_, dir_.path(), model(300));
  }
  std::map<std::string, std::vector<uint8_t>> old_;
};

TEST_F(ShardFaults, WriteFails) { expect_failed_save(CKPTIO_FAULT_PWRITE, 5, EIO, "Input/output error"); }
TEST_F(ShardFaults, ShortWrite) { expect_failed_save(CKPTIO_FAULT_PWRITE, 2, CKPTIO_FAULT_SHORT, "short"); }
TEST_F(ShardFaults, FsyncOfShard3Fails) { expect_failed_save(CKPTIO_FAULT_FSYNC, 3, EIO, "fdatasync"); }
TEST_F(ShardFaults, RenameOfShard3Fails) {
  expect_failed_save(CKPTIO_FAULT_RENAME, 3, EIO, shard_name(3, 4) + ": rename");
}
TEST_F(ShardFaults, RenameOfShard1Fails) { expect_failed_save(CKPTIO_FAULT_RENAME, 1, ENOSPC, "rename"); }
TEST_F(ShardFaults, RenameOfIndexFails) {
  // Every shard is in place when the index rename fails: all are put back.
  expect_failed_save(CKPTIO_FAULT_RENAME, 5, EROFS, std::string(kIndex) + ": rename");
}
TEST_F(ShardFaults, FsyncOfIndexFails) { expect_failed_save(CKPTIO_FAULT_FSYNC, 5, EIO, kIndex); }

TEST_F(Shard, PollsAndStatsFollowTheSet) {
  auto ts = model(7);
  ckptio_writer *w = nullptr;
  ASSERT_EQ(ckptio_writer_open_sharded(ctx_, dir_.path().c_str(), "model", CKPTIO_FORMAT_SAFETENSORS, 100000, CKPTIO_SHARD_ORDER_ADDED,
                                       
                                     nullptr, &w),
            0);
  uint64_t total = 0;
  for (auto &t : ts) {
    ckptio_tensor d = host_desc(t);
    ASSERT_EQ(ckptio_writer_add(w, &d), 0);
    total += t.bytes.size();
  }
  // Before commit: no save to poll, and empty stats.
  EXPECT_EQ(ckptio_writer_poll_snapshot(w), CKPTIO_E_STATE);
  EXPECT_EQ(ckptio_writer_poll_durable(w), CKPTIO_E_STATE);
  ckptio_stats st = CKPTIO_STATS_INIT;
  ASSERT_EQ(ckptio_writer_stats(w, &st), 0);
  EXPECT_EQ(st.bytes, 0u);
  EXPECT_EQ(st.seconds, 0.0);
  EXPECT_GT(st.threads, 0);
  ASSERT_EQ(ckptio_writer_commit_async(w), 0);
  int polls = 0, d;
  while ((d = ckptio_writer_poll_durable(w)) == 0) {
    int s = ckptio_writer_poll_snapshot(w);
    EXPECT_TRUE(s == 0 || s == 1) << s;
    polls++;
    usleep(200);
  }
  EXPECT_EQ(d, 1);
  EXPECT_EQ(ckptio_writer_poll_snapshot(w), 1);
  EXPECT_EQ(ckptio_writer_wait_durable(w), 0);
  ASSERT_EQ(ckptio_writer_stats(w, &st), 0);
  EXPECT_EQ(st.bytes, total);
  EXPECT_GT(st.seconds, 0.0);
  EXPECT_LE(st.snapshot_seconds, st.seconds);
  EXPECT_GT(st.write_seconds, 0.0);
  EXPECT_GT(st.commit_seconds, 0.0);  // the shards' syncs and the publication
  EXPECT_GT(st.staging_bytes, 0u);
  // Stable once durable: the wall time stops at the index's publication.
  ckptio_stats again = CKPTIO_STATS_INIT;
  usleep(20000);
  ASSERT_EQ(ckptio_writer_stats(w, &again), 0);
  EXPECT_EQ(again.seconds, st.seconds);
  // A caller with an older, shorter struct gets only its fields.
  ckptio_stats small = CKPTIO_STATS_INIT;
  small.size = offsetof(ckptio_stats, seconds);
  small.seconds = -1;
  ASSERT_EQ(ckptio_writer_stats(w, &small), 0);
  EXPECT_EQ(small.bytes, total);
  EXPECT_EQ(small.seconds, -1.0);
  EXPECT_EQ(ckptio_writer_close(w), 0);
  EXPECT_EQ(ckptio_writer_poll_durable(nullptr), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(ckptio_writer_poll_snapshot(nullptr), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(ckptio_writer_stats(nullptr, &st), CKPTIO_E_INVALID_ARG);
  (void)polls;
}

TEST_F(Shard, FailedFirstSaveLeavesAnEmptyDirectory) {
  // Nothing to exchange with: the shards renamed in before the failure are
  // removed again.
  for (long nth : {1L, 3L, 5L}) {
    ckptio_fault_arm(CKPTIO_FAULT_RENAME, nth, EIO);
    std::string err;
    EXPECT_EQ(save_set(ctx_, dir_.path(), model(50), 100000, &err), -EIO) << err;
    ckptio_fault_clear();
    EXPECT_TRUE(dir_.list().empty()) << "rename " << nth << " failed; left: " << dir_.list().size() << " files";
  }
}

TEST_F(ShardFaults, MixedSavesAreDetected) {
  // What a crash between two renames leaves: one shard of the old save
  // beside the new save's index and other shards.
  std::string s2 = dir_.file(shard_name(2, 4));
  auto old2 = read_file(s2);
  std::string err;
  ASSERT_EQ(save_set(ctx_, dir_.path(), model(400), 100000, &err), 0) << err;
  write_file(s2, old2);
  expect_open_error(dir_.path(), CKPTIO_E_SHARD, "shard '" + shard_name(2, 4) + "' belongs to another save");
  // A shard renamed to another position.
  ASSERT_EQ(save_set(ctx_, dir_.path(), model(400), 100000, &err), 0) << err;
  auto i = read_file(dir_.file(kIndex));
  std::string j(i.begin(), i.end());
  // The index of a set without ids (transformers' own) is not held to them.
  size_t a = j.find("\"ckptio.save_id\"");
  size_t b = j.find('\n', a);
  write_file(dir_.file(kIndex), j.substr(0, a) + j.substr(b + 5));
  ckptio_reader *r = nullptr;
  ASSERT_EQ(open(dir_.file(kIndex), &r, &err), 0) << err << "\n" << j.substr(0, a) + j.substr(b + 5);
  ckptio_reader_close(r);
}

// ------------------------------------------------------------ hostile indexes

class HostileIndex : public Shard {
 protected:
  void SetUp() override {
    Shard::SetUp();
    a_ = {make_tensor("a", CKPTIO_F32, {10}, 1), make_tensor("b", CKPTIO_I64, {3}, 2)};
    c_ = {make_tensor("c", CKPTIO_BF16, {7}, 3)};
    ASSERT_EQ(save(ctx_, dir_.file("s1.safetensors"), a_), 0);
    ASSERT_EQ(save(ctx_, dir_.file("s2.safetensors"), c_), 0);
  }
  std::string index_path() const { return dir_.file("m.safetensors.index.json"); }
  void expect(const std::string &json, int code, const std::string &text) {
    write_file(index_path(), json);
    expect_open_error(index_path(), code, text);
  }
  std::vector<Tensor> a_, c_;
};

TEST_F(HostileIndex, ValidOneOpens) {
  write_file(index_path(), std::string(R"({"metadata": {"total_size": 12345678901234, "note": "x", "nested": {"a": [1, 2.5]}},
    "weight_map": {"a": "s1.safetensors", "c": "s2.safetensors", "b": "s1.safetensors"}, "extra": [null]})"));
  std::vector<Tensor> all = a_;
  all.push_back(c_[0]);
  expect_loads(ctx_, index_path(), all);
  ckptio_reader *r = nullptr;
  std::string err;
  ASSERT_EQ(open(index_path(), &r, &err), 0) << err;
  EXPECT_STREQ(ckptio_reader_metadata_get(r, "total_size"), "12345678901234") << "kept, not trusted";
  EXPECT_EQ(ckptio_reader_metadata_get(r, "nested"), nullptr);
  ckptio_reader_close(r);
}

TEST_F(HostileIndex, NamesThatEscape) {
  expect(R"({"weight_map": {"a": "../s1.safetensors"}})", CKPTIO_E_SHARD, "contains '/'");
  expect(R"({"weight_map": {"a": "..s1.safetensors"}})", CKPTIO_E_SHARD, "contains '..'");
  expect(R"({"weight_map": {"a": ".."}})", CKPTIO_E_SHARD, "names a directory");
  expect(R"({"weight_map": {"a": "/etc/passwd"}})", CKPTIO_E_SHARD, "absolute path");
  expect(R"({"weight_map": {"a": "sub/s1.safetensors"}})", CKPTIO_E_SHARD, "contains '/'");
  expect(R"({"weight_map": {"a": "a\\s1.safetensors"}})", CKPTIO_E_SHARD, "contains '\\'");
  expect(R"({"weight_map": {"a": ""}})", CKPTIO_E_SHARD, "is empty");
  expect(R"({"weight_map": {"a": "s1\u0000x"}})", CKPTIO_E_SHARD, "\\u0000 in a string is not supported");
  expect(R"({"weight_map": {"a": "."}})", CKPTIO_E_SHARD, "names a directory");
}

TEST_F(HostileIndex, MissingAndMismatched) {
  expect(R"({"weight_map": {"a": "nope.safetensors"}})", -ENOENT, "shard 'nope.safetensors'");
  expect(R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors", "zz": "s1.safetensors", "c": "s2.safetensors"}})",
         CKPTIO_E_SHARD, "tensor 'zz' is mapped to shard 's1.safetensors', which does not hold it");
  expect(R"({"weight_map": {"a": "s1.safetensors", "c": "s2.safetensors"}})", CKPTIO_E_SHARD,
         "tensor 'b' of shard 's1.safetensors' is not in the index's weight_map");
  expect(R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors", "c": "s1.safetensors"}})", CKPTIO_E_SHARD,
         "mapped to shard 's1.safetensors', which does not hold it");
  // The same tensor in two shards.
  ASSERT_EQ(save(ctx_, dir_.file("s3.safetensors"), {a_[0], make_tensor("x", CKPTIO_U8, {3}, 9)}), 0);
  expect(R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors", "c": "s2.safetensors", "x": "s3.safetensors"}})",
         CKPTIO_E_SHARD, "tensor 'a' is in shard 's3.safetensors' but the index maps it to 's1.safetensors'");
  expect(R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors", "c": "s2.safetensors", "a": "s1.safetensors"}})",
         CKPTIO_E_SHARD, "tensor 'a' appears twice");
}

TEST_F(HostileIndex, WrongTypes) {
  expect(R"({"weight_map": ["a", "s1.safetensors"]})", CKPTIO_E_SHARD, "\"weight_map\" is not an object");
  expect(R"({"weight_map": "s1.safetensors"})", CKPTIO_E_SHARD, "\"weight_map\" is not an object");
  expect(R"({"weight_map": {"a": 1}})", CKPTIO_E_SHARD, "the file of tensor 'a' is not a string");
  expect(R"({"weight_map": {"a": null}})", CKPTIO_E_SHARD, "not a string");
  expect(R"({"weight_map": {"a": ["s1.safetensors"]}})", CKPTIO_E_SHARD, "not a string");
  expect(R"({"metadata": [], "weight_map": {"a": "s1.safetensors"}})", CKPTIO_E_SHARD, "\"metadata\" is not an object");
  expect(R"({"metadata": {}})", CKPTIO_E_SHARD, "no \"weight_map\"");
  expect(R"({"weight_map": {}})", CKPTIO_E_SHARD, "weight_map is empty");
  expect(R"([])", CKPTIO_E_SHARD, "expected an object");
  expect(R"({"weight_map": {"a": "s1.safetensors"}, "weight_map": {}})", CKPTIO_E_SHARD, "appears twice");
  expect(R"({"metadata": {"k": "1", "k": "2"}, "weight_map": {"a": "s1.safetensors"}})", CKPTIO_E_SHARD, "appears twice");
  expect(R"({"weight_map": {"a": "s1.safetensors"}} x)", CKPTIO_E_SHARD, "trailing bytes");
  expect(R"({"weight_map": {"a": "s1.safetensors")", CKPTIO_E_SHARD, "expected ',' or '}' after an object member");
  expect("", CKPTIO_E_SHARD, "at header byte 0: expected an object");
  expect(std::string("{\"weight_map\": {\"a\": \"s1\xff.safetensors\"}}"), CKPTIO_E_SHARD, "not UTF-8");
  expect(std::string(200, '[') + std::string(200, ']'), CKPTIO_E_SHARD, "expected an object");
  // Deep nesting where a value may go: refused at the parser's depth limit.
  expect("{\"metadata\": {\"a\": " + std::string(200, '[') + std::string(200, ']') +
             "}, \"weight_map\": {\"a\": \"s1.safetensors\"}}",
         CKPTIO_E_SHARD, "nesting deeper than 64 levels");
}

TEST_F(HostileIndex, HugeIndex) {
  // Sparse: a size over the limit costs no disk and must cost no memory.
  std::string p = index_path();
  write_file(p, std::string("{"));
  ASSERT_EQ(truncate(p.c_str(), 100000001), 0);
  expect_open_error(p, CKPTIO_E_SHARD, "larger than the 100000000-byte limit");
}

TEST_F(HostileIndex, BadShards) {
  // Not safetensors: a PyTorch zip and random bytes; a truncated shard; a
  // directory; the index itself as a shard.
  ckptio_writer *w = nullptr;
  ASSERT_EQ(ckptio_writer_open(ctx_, dir_.file("t.pt").c_str(), CKPTIO_FORMAT_PYTORCH, nullptr, &w), 0);
  ckptio_tensor d{"a", CKPTIO_F32, 1, {10}, a_[0].bytes.data(), CKPTIO_DEVICE_HOST};
  ASSERT_EQ(ckptio_writer_add(w, &d), 0);
  ASSERT_EQ(ckptio_writer_commit(w), 0);
  ckptio_writer_close(w);
  expect(R"({"weight_map": {"a": "t.pt"}})", CKPTIO_E_SHARD, "shard 't.pt' is a pytorch file, not safetensors");
  write_file(dir_.file("junk.safetensors"), pattern(1000, 5));
  expect(R"({"weight_map": {"a": "junk.safetensors"}})", CKPTIO_E_HEADER_TOO_LARGE, "shard 'junk.safetensors'");
  auto s1 = read_file(dir_.file("s1.safetensors"));
  s1.resize(s1.size() - 8);
  write_file(dir_.file("cut.safetensors"), s1);
  expect(R"({"weight_map": {"a": "cut.safetensors", "b": "cut.safetensors"}})", CKPTIO_E_INCOMPLETE_BUFFER,
         "shard 'cut.safetensors'");
  ASSERT_EQ(mkdir(dir_.file("d.safetensors").c_str(), 0755), 0);
  expect(R"({"weight_map": {"a": "d.safetensors"}})", CKPTIO_E_INVALID_ARG, "shard 'd.safetensors'");
  rmdir(dir_.file("d.safetensors").c_str());
  // Opened as a plain file (no recursion), which is not safetensors.
  expect(R"({"weight_map": {"a": "m.safetensors.index.json"}})", CKPTIO_E_HEADER_TOO_LARGE,
         "shard 'm.safetensors.index.json'");
}

TEST_F(HostileIndex, MutationsNeverCrash) {
  std::string good = R"({"metadata": {"total_size": 58}, "weight_map": {"a": "s1.safetensors", "b": "s1.safetensors", "c": "s2.safetensors"}})";
  write_file(index_path(), good);
  ckptio_reader *r = nullptr;
  std::string err;
  ASSERT_EQ(open(index_path(), &r, &err), 0) << err;
  ckptio_reader_close(r);
  std::mt19937_64 rng(42);
  const char alphabet[] = "{}[]\":,.\\/ 0123456789abcsu-eE\x00\xff\xc3";
  int opened = 0, refused = 0;
  for (int i = 0; i < 4000; i++) {
    std::string m = good;
    int edits = 1 + (int)(rng() % 4);
    for (int e = 0; e < edits && !m.empty(); e++) {
      size_t at = rng() % m.size();
      char c = alphabet[rng() % (sizeof(alphabet) - 1)];
      switch (rng() % 5) {
        case 0: m[at] = c; break;
        case 1: m.insert(m.begin() + (long)at, c); break;
        case 2: m.erase(at, 1 + rng() % 8); break;
        case 3: m.resize(at); break;
        default: m.insert(at, m.substr(rng() % m.size(), rng() % 16)); break;
      }
    }
    write_file(index_path(), m);
    int rc = ckptio_reader_open(ctx_, index_path().c_str(), nullptr, &r);
    if (rc == 0) {
      opened++;
      EXPECT_GE(ckptio_reader_count(r), 1u);
      EXPECT_EQ(ckptio_reader_verify(r, nullptr), 0) << m;
      ckptio_reader_close(r);
    } else {
      refused++;
      EXPECT_EQ(r, nullptr);
      EXPECT_NE(std::string(ckptio_last_open_error()), "") << m;
    }
  }
  EXPECT_GT(refused, 1000);
  EXPECT_GT(opened, 10) << "some mutations (whitespace, metadata) stay valid";
}

// A set saved over an old one keeps the old shards its exchange moved aside
// open and closes them after the durable point, one after the other on one
// worker: freeing their blocks is not part of the save, and the context's
// other workers stay free (here each close is made to take 0.5 s).
TEST_F(ShardFaults, TheOldShardsAreFreedAfterTheSaveNotInIt) {
  size_t shards = old_.size() - 1;  // and the index
  std::string err;
  // The same save and load where there is nothing to replace, timed on this
  // machine as it is now: the limits below are these plus half a close.
  double base_saved, base_loaded;
  {
    TempDir fresh;
    auto tb = std::chrono::steady_clock::now();
    auto since_b = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - tb).count(); };
    ASSERT_EQ(save_set(ctx_, fresh.path(), model(200), 100000, &err), 0) << err;
    base_saved = since_b();
    expect_loads(ctx_, fresh.path(), model(200));
    base_loaded = since_b();
  }
  ckptio_held_slow_closes(500 * 1000 * 1000);
  auto t0 = std::chrono::steady_clock::now();
  auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  ASSERT_EQ(save_set(ctx_, dir_.path(), model(200), 100000, &err), 0) << err;
  int held = open_removed_files(".safetensors.ckptio-tmp-");
  double saved = since();
  expect_loads(ctx_, dir_.path(), model(200));
  double loaded = since();
  // Neither waited for a close (0.5 s each).
  EXPECT_LT(saved, base_saved + 0.25) << "the save waited for the old shards' closes (" << base_saved
                                      << " s with nothing to close)";
  EXPECT_LT(loaded, base_loaded + 0.25) << "the load waited behind the closes (" << base_loaded
                                        << " s with nothing to close)";
  if (saved < 0.45) {
    EXPECT_EQ(held, (int)shards) << "the old shards are not held open";
  }
  EXPECT_EQ(ckptio_closer_wait(&ctx_->closer), 1);
  EXPECT_GT(since(), 0.5 * (double)shards - 0.1) << "the closes did not run one after the other";
  ckptio_held_slow_closes(0);
  EXPECT_EQ(open_removed_files(".safetensors.ckptio-tmp-"), 0);
}

// A set saved with another shard count leaves the old count's shards stale:
// they are removed when the new set is published, and freed after it.
TEST_F(ShardFaults, StaleShardsAreFreedAfterTheSaveNotInIt) {
  size_t stale = old_.size() - 1;
  std::string err;
  size_t n = 0;
  double base_saved;  // the same save where there is nothing to replace
  {
    TempDir fresh;
    auto tb = std::chrono::steady_clock::now();
    ASSERT_EQ(save_set(ctx_, fresh.path(), model(200), 1ull << 30, &err), 0) << err;
    base_saved = std::chrono::duration<double>(std::chrono::steady_clock::now() - tb).count();
  }
  ckptio_held_slow_closes(500 * 1000 * 1000);
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(save_set(ctx_, dir_.path(), model(200), 1ull << 30, &err, &n), 0) << err;
  double saved = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(n, 1u);
  char pattern[32];
  snprintf(pattern, sizeof(pattern), "-of-%05zu.safetensors (deleted)", stale);
  int held = open_removed_files(pattern);
  EXPECT_LT(saved, base_saved + 0.25) << "the save waited for the stale shards' closes (" << base_saved
                                      << " s with nothing to replace)";
  if (saved < 0.45) {
    EXPECT_EQ(held, (int)stale) << "the stale shards are not held open";
  }
  EXPECT_EQ(dir_.list(), (std::vector<std::string>{shard_name(1, 1), kIndex}));
  EXPECT_EQ(ckptio_closer_wait(&ctx_->closer), 1);
  ckptio_held_slow_closes(0);
  EXPECT_EQ(open_removed_files(pattern), 0);
  expect_loads(ctx_, dir_.path(), model(200));
}
