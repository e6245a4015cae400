// Compressed checkpoints (zstd seekable): round trips with and without the
// shuffle filter, the real `zstd -d` restoring the plain file byte for byte,
// refusals at open, every lie a seek table or frame can tell, a fuzz pass
// over mutated and truncated files, and a load onto a (fake) GPU.

// Uses ckptio_reader_map_private and ckptio_reader_plan_rank, of ckptio.h's
// experimental section.
#define CKPTIO_EXPERIMENTAL

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <unistd.h>
#include <zstd.h>
#include <vector>

#include "ckpt_fixture.h"
#include "ckptio.h"
extern "C" {
#include "formats/zstd_seekable.h"
#include "io/fault.h"
#include "save/zsave.h"
}
#include "test_util.h"

using namespace ckptio_test;

namespace {

uint16_t bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}

// Normally distributed values, like trained weights (not random bytes).
Tensor normal_tensor(const std::string &name, ckptio_dtype dtype, std::vector<int64_t> shape, uint64_t seed,
                     float sigma = 0.02f) {
  Tensor t{name, dtype, shape, {}};
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  t.bytes.resize((size_t)n * (size_t)ckptio_dtype_bits(dtype) / 8);
  for (int64_t i = 0; i < n; i++) {
    float v = dist(rng);
    if (dtype == CKPTIO_BF16) {
      uint16_t h = bf16(v);
      memcpy(&t.bytes[(size_t)i * 2], &h, 2);
    } else {
      memcpy(&t.bytes[(size_t)i * 4], &v, 4);
    }
  }
  return t;
}

std::vector<Tensor> model() {
  return {
      normal_tensor("layers.0.attn.weight", CKPTIO_BF16, {256, 384}, 1),     // several frames
      normal_tensor("layers.0.mlp.weight", CKPTIO_F32, {128, 300}, 2),
      normal_tensor("layers.0.norm.weight", CKPTIO_F32, {384}, 3, 1.0f),    // small: shares frames
      normal_tensor("layers.1.norm.weight", CKPTIO_BF16, {383}, 4, 1.0f),
      make_tensor("step", CKPTIO_I64, {}, 5),                                 // scalar
      make_tensor("mask", CKPTIO_U8, {1001}, 6),
      make_tensor("empty", CKPTIO_F16, {0, 7}, 7),
      make_tensor("half", CKPTIO_F16, {333}, 8),
      make_tensor("f64", CKPTIO_F64, {17, 3}, 9),
  };
}

ckptio_options zopts(int level, int shuffle) {
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  o.compress_level = level;
  o.shuffle = shuffle;
  return o;
}

struct Ctx {
  ckptio_ctx *ctx = nullptr;
  explicit Ctx(size_t chunk = 64 << 10, size_t staging = 512 << 10) {
    ckptio_options o = small_options(chunk, staging, 3);
    EXPECT_EQ(ckptio_ctx_create(&o, &ctx), 0) << ckptio_last_open_error();
  }
  ~Ctx() { ckptio_ctx_free(ctx); }
};

// Loads every tensor in one load_many (or only `only`) and compares.
void expect_all(ckptio_ctx *ctx, const std::string &path, const std::vector<Tensor> &ts, int only = -1) {
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(ctx, path.c_str(), nullptr, &r), 0) << ckptio_last_open_error();
  ASSERT_EQ(ckptio_reader_count(r), ts.size());
  std::vector<std::vector<uint8_t>> out(ts.size());
  std::vector<ckptio_load_request> reqs;
  for (size_t i = 0; i < ts.size(); i++) {
    if (only >= 0 && (size_t)only != i) continue;
    int64_t k = ckptio_reader_find(r, ts[i].name.c_str());
    ASSERT_GE(k, 0) << ts[i].name;
    out[i].assign(ts[i].bytes.size() + 1, 0xEE);
    reqs.push_back({(size_t)k, out[i].data(), ts[i].bytes.size(), CKPTIO_DEVICE_HOST});
  }
  ASSERT_EQ(ckptio_reader_load_many(r, reqs.data(), reqs.size()), 0) << ckptio_reader_last_error(r);
  for (size_t i = 0; i < ts.size(); i++) {
    if (only >= 0 && (size_t)only != i) continue;
    EXPECT_TRUE(std::equal(ts[i].bytes.begin(), ts[i].bytes.end(), out[i].begin())) << ts[i].name;
    EXPECT_EQ(out[i].back(), 0xEE) << ts[i].name << ": wrote past the tensor";
  }
  size_t unchecked = 99;
  EXPECT_EQ(ckptio_reader_verify(r, &unchecked), 0) << ckptio_reader_last_error(r);
  EXPECT_EQ(unchecked, 0u);
  ckptio_reader_close(r);
}

std::string run(const std::string &cmd) {
  std::string out;
  FILE *p = popen(cmd.c_str(), "r");
  if (!p) return "";
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

uint32_t rd32(const std::vector<uint8_t> &b, size_t at) {
  return (uint32_t)b[at] | (uint32_t)b[at + 1] << 8 | (uint32_t)b[at + 2] << 16 | (uint32_t)b[at + 3] << 24;
}
void wr32(std::vector<uint8_t> &b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; i++) b[at + i] = (uint8_t)(v >> (8 * i));
}

// The seek table of a file we wrote (8-byte entries).
struct Table {
  uint32_t n;
  size_t entries;  // offset of entry 0
};
Table table_of(const std::vector<uint8_t> &f) {
  uint32_t n = rd32(f, f.size() - 9);
  return {n, f.size() - 9 - (size_t)n * 8};
}

// Opens and, if that works, loads everything: the first failure's code.
int open_and_load(ckptio_ctx *ctx, const std::string &path, std::string *msg = nullptr) {
  ckptio_reader *r = nullptr;
  int rc = ckptio_reader_open(ctx, path.c_str(), nullptr, &r);
  if (rc < 0) {
    if (msg) *msg = ckptio_last_open_error();
    return rc;
  }
  size_t n = ckptio_reader_count(r);
  std::vector<std::vector<uint8_t>> bufs(n);
  std::vector<ckptio_load_request> reqs;
  for (size_t i = 0; i < n; i++) {
    ckptio_tensor_info info;
    ckptio_reader_info(r, i, &info);
    if (info.nbytes > (64u << 20)) continue; /* the fuzz never makes real tensors this big */
    bufs[i].resize(info.nbytes + 1);
    reqs.push_back({i, bufs[i].data(), info.nbytes, CKPTIO_DEVICE_HOST});
  }
  rc = ckptio_reader_load_many(r, reqs.data(), reqs.size());
  if (rc == 0) rc = ckptio_reader_verify(r, nullptr);
  if (msg) *msg = rc < 0 ? ckptio_reader_last_error(r) : "";
  ckptio_reader_close(r);
  return rc;
}

}  // namespace

TEST(Zstd, RoundTripEveryLevelAndFilter) {
  TempDir dir;
  Ctx c;
  auto ts = model();
  for (int level : {1, 3, -5}) {
    for (int shuffle : {0, 1}) {
      SCOPED_TRACE("level " + std::to_string(level) + " shuffle " + std::to_string(shuffle));
      std::string path = dir.file("m" + std::to_string(level) + "_" + std::to_string(shuffle) + ".zst");
      ckptio_options o = zopts(level, shuffle);
      std::string err;
      ASSERT_EQ(save(c.ctx, path, ts, &o, &err), 0) << err;
      expect_all(c.ctx, path, ts);
      expect_all(c.ctx, path, ts, 3);  // one tensor: only its frames
      ckptio_reader *r = nullptr;
      ASSERT_EQ(ckptio_reader_open(c.ctx, path.c_str(), nullptr, &r), 0);
      uint64_t frames = 0, csize = 0, plain = 0;
      EXPECT_EQ(ckptio_reader_compression(r, &frames, &csize, &plain), 1);
      EXPECT_GT(frames, 4u);  // header frame + data frames of at most 64 KiB
      EXPECT_EQ(csize, read_file(path).size());
      const char *f = ckptio_reader_metadata_get(r, "ckptio.filter");
      if (shuffle) EXPECT_STREQ(f, "shuffle");
      else EXPECT_EQ(f, nullptr);
      const void *v = nullptr;
      EXPECT_EQ(ckptio_reader_view(r, 0, &v, nullptr), CKPTIO_E_FORMAT);
      EXPECT_NE(std::string(ckptio_reader_last_error(r)).find("compressed"), std::string::npos);
      ckptio_reader_close(r);
    }
  }
}

// The bytes of slice start:stop of dim d of t, row-major (the reference).
std::vector<uint8_t> ref_slice(const Tensor &t, int d, int64_t a, int64_t b) {
  size_t es = (size_t)ckptio_dtype_bits(t.dtype) / 8, outer = 1, inner = es;
  for (int k = 0; k < d; k++) outer *= (size_t)t.shape[k];
  for (size_t k = (size_t)d + 1; k < t.shape.size(); k++) inner *= (size_t)t.shape[k];
  std::vector<uint8_t> out;
  for (size_t o = 0; o < outer; o++) {
    auto from = t.bytes.begin() + (ptrdiff_t)((o * (size_t)t.shape[d] + (size_t)a) * inner);
    out.insert(out.end(), from, from + (ptrdiff_t)((size_t)(b - a) * inner));
  }
  return out;
}

// Slices of a compressed file decompress only the frames holding their runs
// (each frame once), undo the shuffle element range by element range, and
// land where a plain file's slice would; onto a GPU too. Plans refuse (no
// plain byte ranges) and so does the zero-copy mapping.
TEST(Zstd, SlicesOfACompressedFile) {
  TempDir dir;
  Ctx c;  // 64 KiB chunks: the larger tensors span several frames
  auto ts = model();
  for (int shuffle : {0, 1}) {
    SCOPED_TRACE("shuffle " + std::to_string(shuffle));
    ckptio_options o = zopts(1, shuffle);
    std::string path = dir.file("s" + std::to_string(shuffle) + ".zst"), err;
    ASSERT_EQ(save(c.ctx, path, ts, &o, &err), 0) << err;
    ckptio_reader *r = nullptr;
    ASSERT_EQ(ckptio_reader_open(c.ctx, path.c_str(), nullptr, &r), 0);
    for (const Tensor &t : ts) {
      if (t.shape.empty() || t.bytes.empty()) continue;
      size_t ix = (size_t)ckptio_reader_find(r, t.name.c_str());
      for (int d = 0; d < (int)t.shape.size(); d++) {
        int64_t n = t.shape[(size_t)d];
        for (auto ab : std::vector<std::pair<int64_t, int64_t>>{{0, n / 2}, {n / 3, n}, {1, n - 1}, {0, n}}) {
          if (ab.first > ab.second || ab.second > n) continue;
          SCOPED_TRACE(t.name + " dim " + std::to_string(d) + " " + std::to_string(ab.first) + ":" +
                       std::to_string(ab.second));
          auto want = ref_slice(t, d, ab.first, ab.second);
          std::vector<uint8_t> got(want.size() + 1, 0xEE);
          ckptio_slice_request q = {ix, d, ab.first, ab.second, got.data(), got.size(), CKPTIO_DEVICE_HOST, -1, 0};
          ASSERT_EQ(ckptio_reader_load_slices(r, &q, 1), 0) << ckptio_reader_last_error(r);
          EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin()));
          EXPECT_EQ(got.back(), 0xEE) << "wrote past the slice";
          EXPECT_EQ(q.verified, ab.first == 0 && ab.second == n ? 1 : 0);
        }
      }
    }
    // A quarter of the rows of the largest tensor: only its frames.
    const Tensor &w = ts[0];
    size_t ix = (size_t)ckptio_reader_find(r, w.name.c_str());
    std::vector<uint8_t> got(w.bytes.size() / 4);
    ckptio_slice_request q = {ix, 0, 0, w.shape[0] / 4, got.data(), got.size(), CKPTIO_DEVICE_HOST, -1, 0};
    ASSERT_EQ(ckptio_reader_load_slices(r, &q, 1), 0) << ckptio_reader_last_error(r);
    EXPECT_GT(q.bytes_read, 0u);
    EXPECT_LE(q.bytes_read, got.size() + 2 * (64u << 10)) << "decompressed frames the slice does not need";
    if (on_gpu()) {  // the same slice on dim 1 onto the last GPU (shuffled frames unshuffled in the slot)
      const int gpu = CKPTIO_DEVICE_CUDA(gpu_count() - 1);
      auto want = ref_slice(w, 1, 5, 205);
      void *dev = nullptr;
      ASSERT_EQ(ckptio_device_alloc(c.ctx, gpu, want.size(), &dev), 0);
      ckptio_slice_request g = {ix, 1, 5, 205, dev, want.size(), gpu, -1, 0};
      ASSERT_EQ(ckptio_reader_load_slices(r, &g, 1), 0) << ckptio_reader_last_error(r);
      std::vector<uint8_t> back(want.size());
      from_gpu(back.data(), dev, back.size());
      EXPECT_TRUE(back == want);
      ckptio_device_free(c.ctx, gpu, dev);
    }
    // Plans name the frames holding a rank's rows: decompressed, they
    // contain the rank's slice; rank 0 of 4 needs fewer than all frames.
    auto file = read_file(path);
    for (int rank = 0; rank < 4; rank++) {
      int64_t a = 0, b = 0, n = ckptio_reader_plan_rank(r, ix, 0, rank, 4, &a, &b, nullptr, 0);
      ASSERT_GT(n, 0) << ckptio_reader_last_error(r);
      std::vector<ckptio_byte_range> rr((size_t)n);
      ASSERT_EQ(ckptio_reader_plan_rank(r, ix, 0, rank, 4, nullptr, nullptr, rr.data(), rr.size()), n);
      std::vector<uint8_t> frames;
      for (auto &x : rr) {
        ASSERT_LE(x.offset + x.length, file.size());
        frames.insert(frames.end(), file.begin() + (ptrdiff_t)x.offset,
                      file.begin() + (ptrdiff_t)(x.offset + x.length));
      }
      std::vector<uint8_t> plain(frames.size() * 64 + (1 << 20));
      size_t got = ZSTD_decompress(plain.data(), plain.size(), frames.data(), frames.size());
      ASSERT_FALSE(ZSTD_isError(got)) << "ranges are whole frames";
      plain.resize(got);
      auto want = ref_slice(w, 0, a, b);
      if (!shuffle) {
        EXPECT_NE(std::search(plain.begin(), plain.end(), want.begin(), want.end()), plain.end());
      }
      if (rank == 0) {
        EXPECT_LT(frames.size(), file.size() / 2) << "rank 0 needs only some frames";
      }
    }
    void *base = nullptr;
    uint64_t size = 0;
    EXPECT_EQ(ckptio_reader_map_private(r, &base, &size), CKPTIO_E_FORMAT);
    EXPECT_EQ(base, nullptr);
    ckptio_reader_close(r);
  }
}

TEST(Zstd, ShuffleCompressesFloatsBetter) {
  TempDir dir;
  Ctx c(1 << 20, 4 << 20);
  std::vector<Tensor> ts = {normal_tensor("w", CKPTIO_BF16, {1024, 512}, 11)};
  ckptio_options a = zopts(1, 0), b = zopts(1, 1);
  ASSERT_EQ(save(c.ctx, dir.file("a"), ts, &a), 0);
  ASSERT_EQ(save(c.ctx, dir.file("b"), ts, &b), 0);
  size_t plain = ts[0].bytes.size(), sa = read_file(dir.file("a")).size(), sb = read_file(dir.file("b")).size();
  EXPECT_LT(sa, plain);
  EXPECT_LT(sb * 105 / 100, sa) << "shuffle should gain >5% on bf16 N(0, 0.02): " << sa << " vs " << sb;
}

TEST(Zstd, ZstdCliRestoresThePlainFile) {
  if (system("zstd --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "the zstd command is not installed";
  TempDir dir;
  Ctx c;
  auto ts = model();
  ckptio_options plain = CKPTIO_OPTIONS_INIT, z = zopts(3, 0);
  ASSERT_EQ(save(c.ctx, dir.file("plain.safetensors"), ts, &plain), 0);
  ASSERT_EQ(save(c.ctx, dir.file("c.zst"), ts, &z), 0);
  std::string cmd = "zstd -q -d -f '" + dir.file("c.zst") + "' -o '" + dir.file("dec.safetensors") + "' 2>&1";
  EXPECT_EQ(run(cmd), "");
  auto want = read_file(dir.file("plain.safetensors")), got = read_file(dir.file("dec.safetensors"));
  ASSERT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want) << "zstd -d must give back ckptio's plain save byte for byte";
  // And the official safetensors package reads it, when the venv has it.
  std::string venv = std::string(CKPTIO_SOURCE_DIR) + "/.venv/bin/python";
  if (access(venv.c_str(), X_OK) == 0) {
    std::string out = run("'" + venv + "' -c \"from safetensors.torch import load_file; d = load_file('" +
                          dir.file("dec.safetensors") + "'); w = d['layers.0.attn.weight']; "
                          "print(len(d), tuple(d['mask'].shape), w.dtype, tuple(w.shape))\" 2>&1");
    EXPECT_EQ(out, "9 (1001,) torch.bfloat16 (256, 384)\n");
  }
}

// The frame plan: the header alone in frame 0; data frames of at most
// max_frame bytes that end at the last tensor end they contain, so a large
// tensor is cut into full frames of its own and small neighbours share one.
TEST(Zstd, FramesFollowTensors) {
  const uint64_t F = 1 << 20, H = 4096;
  std::vector<uint64_t> sizes = {5 * F + 12, 100, 2000, F / 8, 3 * F, 64, 64, F / 2 + 8};
  std::vector<ckptio_zsave_tensor> ts;
  uint64_t off = H;
  for (uint64_t n : sizes) ts.push_back({off, n, 4}), off += n;
  ckptio_zsave_params p = {1, 0, 2, NULL, H, off, F, 2, ts.data(), ts.size()};
  ckptio_zsave *z = nullptr;
  char err[256] = "";
  ASSERT_EQ(ckptio_zsave_open(&p, &z, err, sizeof(err)), 0) << err;
  uint64_t n = ckptio_zsave_frames(z);
  EXPECT_EQ(ckptio_zsave_start(z, 0), 0u);
  EXPECT_EQ(ckptio_zsave_start(z, 1), H);
  EXPECT_EQ(ckptio_zsave_start(z, n), off);
  size_t inside = 0;
  for (uint64_t c = 1; c < n; c++) {
    uint64_t a = ckptio_zsave_start(z, c), b = ckptio_zsave_start(z, c + 1);
    ASSERT_LT(a, b);
    EXPECT_LE(b - a, F);
    EXPECT_EQ(ckptio_zsave_frame_of(z, a), c);
    EXPECT_EQ(ckptio_zsave_frame_of(z, b - 1), c);
    bool ends_at_tensor = false, in_one = false;
    for (auto &t : ts) {
      ends_at_tensor |= t.offset + t.nbytes == b;
      in_one |= a >= t.offset && b <= t.offset + t.nbytes;
    }
    EXPECT_TRUE(ends_at_tensor || b - a == F) << "frame " << c << " cut mid-tensor below the full size";
    if (!ends_at_tensor) {
      EXPECT_TRUE(in_one) << "frame " << c << " holds a tensor end but was not cut there";
    }
    inside += in_one;
  }
  // 5 MiB + 12: five full frames inside it, then its 12-byte tail with the
  // small tensors up to the 1/8 MiB one; the 3 MiB one: three frames of its
  // own; then the last three tensors in one frame.
  EXPECT_EQ(inside, 8u);
  EXPECT_EQ(n, 1u + 5 + 1 + 3 + 1);
  ckptio_zsave_free(z);
}

TEST(Zstd, RefusedAtOpen) {
  TempDir dir;
  Ctx c;
  ckptio_writer *w = nullptr;
  ckptio_options o = zopts(3, 0);
  EXPECT_EQ(ckptio_writer_open(c.ctx, dir.file("x.pt").c_str(), CKPTIO_FORMAT_PYTORCH, &o, &w), CKPTIO_E_FORMAT);
  EXPECT_NE(std::string(ckptio_last_open_error()).find("only safetensors"), std::string::npos);
  EXPECT_EQ(w, nullptr);
  o = zopts(23, 0);
  EXPECT_EQ(ckptio_writer_open(c.ctx, dir.file("x").c_str(), CKPTIO_FORMAT_SAFETENSORS, &o, &w), CKPTIO_E_INVALID_ARG);
  o = zopts(0, 1);
  EXPECT_EQ(ckptio_writer_open(c.ctx, dir.file("x").c_str(), CKPTIO_FORMAT_SAFETENSORS, &o, &w), CKPTIO_E_INVALID_ARG);
  o = zopts(1, 2);
  EXPECT_EQ(ckptio_writer_open(c.ctx, dir.file("x").c_str(), CKPTIO_FORMAT_SAFETENSORS, &o, &w), CKPTIO_E_INVALID_ARG);
  EXPECT_STREQ(ckptio_strerror(CKPTIO_E_ZSTD), "corrupt zstd frame or seek table");
}

TEST(Zstd, EmptyCheckpoint) {
  TempDir dir;
  Ctx c;
  ckptio_options o = zopts(1, 1);
  ASSERT_EQ(save(c.ctx, dir.file("e.zst"), {}, &o), 0);
  expect_all(c.ctx, dir.file("e.zst"), {});
}

TEST(Zstd, FailedSaveLeavesTheOldFile) {
  TempDir dir;
  Ctx c;
  auto ts = model();
  std::string path = dir.file("keep.zst");
  write_file(path, std::string("old contents"));
  for (long nth : {1L, 3L}) {
    ckptio_fault_arm(CKPTIO_FAULT_PWRITE, nth, ENOSPC);
    ckptio_options o = zopts(1, 0);
    std::string err;
    EXPECT_EQ(save(c.ctx, path, ts, &o, &err), -ENOSPC) << err;
    ckptio_fault_clear();
    auto bytes = read_file(path);
    EXPECT_EQ(std::string(bytes.begin(), bytes.end()), "old contents");
    EXPECT_EQ(dir.list(), std::vector<std::string>{"keep.zst"}) << "no temp file left behind";
  }
}

// Each lie of a seek table, and each corruption, gets a clear error.
class ZstdBad : public ::testing::Test {
 protected:
  void SetUp() override {
    ckptio_options o = zopts(3, 0);
    ts_ = model();
    ASSERT_EQ(save(c_.ctx, dir_.file("good.zst"), ts_, &o), 0);
    good_ = read_file(dir_.file("good.zst"));
    t_ = table_of(good_);
    ASSERT_GT(t_.n, 3u);
  }
  // Writes bytes, returns open-and-load's code and message.
  int try_bytes(const std::vector<uint8_t> &b, std::string *msg) {
    write_file(dir_.file("bad.zst"), b);
    return open_and_load(c_.ctx, dir_.file("bad.zst"), msg);
  }
  TempDir dir_;
  Ctx c_;
  std::vector<Tensor> ts_;
  std::vector<uint8_t> good_;
  Table t_;
};

TEST_F(ZstdBad, GoodFileLoads) {
  std::string msg;
  EXPECT_EQ(try_bytes(good_, &msg), 0) << msg;
}

TEST_F(ZstdBad, CorruptFrame) {
  auto b = good_;
  size_t f1 = rd32(good_, t_.entries);  // frame 1 starts after the header frame
  for (size_t i = 0; i < 64; i++) b[f1 + 40 + i] ^= 0x5a;
  std::string msg;
  int rc = try_bytes(b, &msg);
  EXPECT_TRUE(rc == CKPTIO_E_ZSTD || rc == CKPTIO_E_CHECKSUM) << rc << " " << msg;
  EXPECT_NE(msg.find("bad.zst"), std::string::npos) << msg;
}

// A load decompresses only the frames of the tensors it asks for: with the
// first data frame corrupt, the tensors elsewhere still load, its own do not.
TEST_F(ZstdBad, LoadsTouchOnlyTheirFrames) {
  auto b = good_;
  size_t f1 = rd32(good_, t_.entries);
  ASSERT_GT(rd32(good_, t_.entries + 8), 80u);
  b[f1] ^= 0xff;  // frame 1's magic: decoding it is an error, whoever asks
  write_file(dir_.file("sel.zst"), b);
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(c_.ctx, dir_.file("sel.zst").c_str(), nullptr, &r), 0);
  // Frame 1 holds plain-file bytes [d0, d0 + d1) (the seek table's
  // decompressed sizes); the tensors touching them are its.
  uint64_t d0 = rd32(good_, t_.entries + 4), d1 = rd32(good_, t_.entries + 12);
  size_t theirs = 0;
  for (size_t i = 0; i < ts_.size(); i++) {
    int64_t k = ckptio_reader_find(r, ts_[i].name.c_str());
    ckptio_tensor_info info;
    ckptio_reader_info(r, (size_t)k, &info);
    std::vector<uint8_t> buf(info.nbytes + 1);
    int rc = ckptio_reader_load(r, (size_t)k, buf.data(), info.nbytes);
    if (info.nbytes && info.offset < d0 + d1 && info.offset + info.nbytes > d0) {
      theirs++;
      EXPECT_EQ(rc, CKPTIO_E_ZSTD) << ts_[i].name;
      EXPECT_NE(std::string(ckptio_reader_last_error(r)).find("frame 1 "), std::string::npos)
          << ckptio_reader_last_error(r);
    } else {
      EXPECT_EQ(rc, 0) << ts_[i].name << ": " << ckptio_reader_last_error(r);
      EXPECT_TRUE(std::equal(ts_[i].bytes.begin(), ts_[i].bytes.end(), buf.begin())) << ts_[i].name;
    }
  }
  EXPECT_GT(theirs, 0u);
  EXPECT_LT(theirs, ts_.size());
  ckptio_reader_close(r);
}

TEST_F(ZstdBad, SizesThatDoNotAddUp) {
  auto b = good_;
  wr32(b, t_.entries + 8, rd32(b, t_.entries + 8) - 1);
  std::string msg;
  EXPECT_EQ(try_bytes(b, &msg), CKPTIO_E_ZSTD);
  EXPECT_NE(msg.find("add up"), std::string::npos) << msg;
  b = good_;
  wr32(b, t_.entries + 8, 0);
  EXPECT_EQ(try_bytes(b, &msg), CKPTIO_E_ZSTD);
}

TEST_F(ZstdBad, FrameCountPastTheLimit) {
  auto b = good_;
  wr32(b, b.size() - 9, 0x8000001);
  std::string msg;
  EXPECT_EQ(try_bytes(b, &msg), CKPTIO_E_ZSTD);
  EXPECT_NE(msg.find("limit"), std::string::npos) << msg;
  wr32(b, b.size() - 9, 0xFFFFFFFF);
  EXPECT_EQ(try_bytes(b, &msg), CKPTIO_E_ZSTD);
  wr32(b, b.size() - 9, t_.n + 1);  // within the limit, larger than the table
  EXPECT_EQ(try_bytes(b, &msg), CKPTIO_E_ZSTD);
}

TEST_F(ZstdBad, DecompressedSizeOverOneGiB) {
  auto b = good_;
  wr32(b, t_.entries + 8 + 4, (1u << 30) + 1);
  std::string msg;
  EXPECT_EQ(try_bytes(b, &msg), CKPTIO_E_ZSTD);
  EXPECT_NE(msg.find("1 GiB"), std::string::npos) << msg;
}

TEST_F(ZstdBad, ReservedDescriptorBits) {
  for (int bit = 2; bit <= 6; bit++) {
    auto b = good_;
    b[b.size() - 5] |= (uint8_t)(1u << bit);
    std::string msg;
    EXPECT_EQ(try_bytes(b, &msg), CKPTIO_E_ZSTD) << bit;
    EXPECT_NE(msg.find("reserved"), std::string::npos) << msg;
  }
}

TEST_F(ZstdBad, Truncated) {
  for (size_t cut : {good_.size() - 1, good_.size() - 9, good_.size() / 2, (size_t)100, (size_t)5, (size_t)4}) {
    std::vector<uint8_t> b(good_.begin(), good_.begin() + (long)cut);
    std::string msg;
    EXPECT_EQ(try_bytes(b, &msg), CKPTIO_E_ZSTD) << cut << " " << msg;
  }
}

TEST_F(ZstdBad, HeaderFrameThatLies) {
  // The header frame's entry says less than the frame holds (the next
  // frame's entry takes the difference, so the totals still agree).
  auto b = good_;
  wr32(b, t_.entries + 4, rd32(b, t_.entries + 4) - 8);
  wr32(b, t_.entries + 8 + 4, rd32(b, t_.entries + 8 + 4) + 8);
  std::string msg;
  EXPECT_EQ(try_bytes(b, &msg), CKPTIO_E_ZSTD);
  EXPECT_NE(msg.find("frame 0"), std::string::npos) << msg;
  // A header length prefix pointing past the decompressed stream.
  b = good_;
  size_t data = 13 + 3;  // raw frame header + first block header
  wr32(b, data, 90000000);  // under the 100 MB limit, past the stream
  EXPECT_EQ(try_bytes(b, &msg), CKPTIO_E_HEADER_LENGTH) << msg;
  // The header's JSON altered inside the raw frame.
  b = good_;
  b[data + 8] = '[';
  EXPECT_EQ(try_bytes(b, &msg), CKPTIO_E_HEADER_JSON) << msg;
}

TEST_F(ZstdBad, DataFrameThatLiesAboutItsSize) {
  auto b = good_;
  wr32(b, t_.entries + 8 + 4, rd32(b, t_.entries + 8 + 4) - 16);
  wr32(b, t_.entries + 16 + 4, rd32(b, t_.entries + 16 + 4) + 16);
  std::string msg;
  EXPECT_EQ(try_bytes(b, &msg), CKPTIO_E_ZSTD);
  EXPECT_NE(msg.find("seek table entry"), std::string::npos) << msg;
}

// A file cut short after open: the frames are read through the mapping,
// and a missing page is a clean error, not a SIGBUS.
TEST_F(ZstdBad, ShrinksAfterOpen) {
  std::string path = dir_.file("shrink.zst");
  write_file(path, good_);
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(c_.ctx, path.c_str(), nullptr, &r), 0);
  ASSERT_EQ(truncate(path.c_str(), 4096 * 2), 0);
  int64_t k = ckptio_reader_find(r, "layers.0.mlp.weight");
  ASSERT_GE(k, 0);
  std::vector<uint8_t> buf(ts_[1].bytes.size());
  EXPECT_EQ(ckptio_reader_load(r, (size_t)k, buf.data(), buf.size()), CKPTIO_E_SHORT_IO);
  EXPECT_NE(std::string(ckptio_reader_last_error(r)).find("shorter"), std::string::npos);
  ckptio_reader_close(r);
}

TEST_F(ZstdBad, Fuzz) {
  std::mt19937_64 rng(20261122);
  size_t tail = (size_t)t_.n * 8 + 9 + 8;
  int ok = 0, refused = 0;
  for (int iter = 0; iter < 3000; iter++) {
    auto b = good_;
    int kind = (int)(rng() % 4);
    if (kind == 0) {  // bytes of the seek table
      for (int k = 0, m = 1 + (int)(rng() % 4); k < m; k++) b[b.size() - 1 - rng() % tail] = (uint8_t)rng();
    } else if (kind == 1) {  // a table entry set to a boundary value
      static const uint32_t vals[] = {0, 1, 0x7fffffff, 0x80000000, 0xffffffff, 1u << 30, (1u << 30) + 1};
      wr32(b, t_.entries + 4 * (rng() % (2 * t_.n)), vals[rng() % 7]);
    } else if (kind == 2) {  // bytes anywhere
      for (int k = 0, m = 1 + (int)(rng() % 8); k < m; k++) b[rng() % b.size()] = (uint8_t)rng();
    } else {  // truncation, maybe with a valid-looking footer pasted back
      b.resize(rng() % b.size());
      if (b.size() > 9 && rng() % 2) std::copy(good_.end() - 9, good_.end(), b.end() - 9);
    }
    std::string msg;
    int rc = try_bytes(b, &msg);
    if (rc == 0) ok++;
    else {
      refused++;
      ASSERT_LT(rc, 0);
      ASSERT_FALSE(msg.empty()) << "iteration " << iter << ": error " << rc << " without a message";
    }
  }
  EXPECT_GT(refused, 2000);
  RecordProperty("accepted", ok);
}

// The table parser alone, on 200,000 small buffers with plausible footers
// (run under ASan, a read outside the buffer fails the test): every result
// is either a table whose frames exactly tile the bytes before it, or an
// error with a message.
TEST(ZstdTable, FuzzParser) {
  std::mt19937_64 rng(7);
  int accepted = 0;
  for (int iter = 0; iter < 200000; iter++) {
    size_t len = rng() % 160;
    std::vector<uint8_t> b(len);
    for (auto &x : b) x = (uint8_t)(rng() % 4 == 0 ? rng() : rng() % 3);
    if (len >= 17 && rng() % 4) {
      uint32_t n = (uint32_t)(rng() % 8), esize = rng() % 2 ? 12 : 8;
      wr32(b, len - 4, 0x8F92EAB1u);
      wr32(b, len - 9, n);
      b[len - 5] = esize == 12 ? 0x80 : 0;
      size_t table = n * esize + 9 + 8;
      if (table <= len && rng() % 8) {
        wr32(b, len - table, 0x184D2A5Eu);
        wr32(b, len - table + 4, (uint32_t)(table - 8));
        uint64_t left = len - table;
        for (uint32_t i = 0; i < n; i++) {  // sizes that often add up
          uint32_t c = (uint32_t)(i + 1 == n ? left : rng() % (left + 1));
          if (rng() % 10 == 0) c = (uint32_t)rng();
          left -= c <= left ? c : left;
          wr32(b, len - table + 8 + i * esize, c);
          wr32(b, len - table + 12 + i * esize, (uint32_t)(rng() % 5 ? rng() % 100 : rng()));
        }
      }
    }
    ckptio_zs_table t;
    char err[256] = "";
    int rc = ckptio_zs_table_parse(b.data(), b.size(), &t, err, sizeof(err));
    if (rc == 0) {
      accepted++;
      uint64_t off = 0;
      for (size_t i = 0; i < t.count; i++) {
        ASSERT_EQ(t.frames[i].coff, off);
        ASSERT_GT(t.frames[i].csize, 0u);
        ASSERT_LE(t.frames[i].dsize, 1u << 30);
        off += t.frames[i].csize;
      }
      ASSERT_EQ(off + t.table_bytes, b.size());
      ckptio_zs_table_free(&t);
    } else {
      ASSERT_EQ(rc, CKPTIO_E_ZSTD);
      ASSERT_NE(err[0], 0);
    }
  }
  EXPECT_GT(accepted, 1000);
}

TEST(ZstdGpu, LoadOntoAGpu) {
  if (!on_gpu()) GTEST_SKIP() << "runs in the cuda-fake and gpu variants (CKPTIO_TEST_DEVICE=cuda, cuda-real)";
  TempDir dir;
  Ctx c;
  auto ts = model();
  for (int shuffle : {0, 1}) {
    std::string path = dir.file("g" + std::to_string(shuffle) + ".zst");
    ckptio_options o = zopts(1, shuffle);
    ASSERT_EQ(save(c.ctx, path, ts, &o), 0);  // from device memory, in this variant
    ckptio_reader *r = nullptr;
    ASSERT_EQ(ckptio_reader_open(c.ctx, path.c_str(), nullptr, &r), 0);
    std::vector<void *> dev(ts.size());
    std::vector<ckptio_load_request> reqs;
    for (size_t i = 0; i < ts.size(); i++) {
      int device = CKPTIO_DEVICE_CUDA((int)(i % (size_t)gpu_count()));
      ASSERT_EQ(ckptio_device_alloc(c.ctx, device, ts[i].bytes.size() + 1, &dev[i]), 0);
      reqs.push_back({(size_t)ckptio_reader_find(r, ts[i].name.c_str()), dev[i], ts[i].bytes.size(), device});
    }
    ASSERT_EQ(ckptio_reader_load_many(r, reqs.data(), reqs.size()), 0) << ckptio_reader_last_error(r);
    for (size_t i = 0; i < ts.size(); i++) {
      std::vector<uint8_t> back(ts[i].bytes.size());
      if (!back.empty()) from_gpu(back.data(), dev[i], back.size());
      EXPECT_TRUE(back == ts[i].bytes) << ts[i].name << " shuffle " << shuffle;
      ckptio_device_free(c.ctx, reqs[i].device, dev[i]);
    }
    ckptio_reader_close(r);
  }
}
