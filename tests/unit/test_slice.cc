// Partial loads and tensor-parallel plans: every dim of 1-D to 4-D tensors
// of 1-, 2-, 4- and 8-byte and sub-byte dtypes through every load method
// equals slicing the saved bytes; bad slices are refused with their rule;
// whole slices are CRC-verified and partial ones say they are not; only the
// slice's bytes are read (the reader's count and the kernel's, rchar); the
// plan's ranges for all ranks tile the tensor and hold each rank's slice;
// PyTorch views and big-endian files; and, in the cuda-fake variant, slices
// loaded straight onto fake GPUs.

// Uses ckptio_reader_slice_ranges and ckptio_reader_plan_rank, of ckptio.h's
// experimental section.
#define CKPTIO_EXPERIMENTAL

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>

#include "ckpt_fixture.h"
#include "fake_cudart.h"
#include "pt_bytes.h"
extern "C" {
#include "io/fault.h"
}

using namespace ckptio_test;

namespace {

const ckptio_load_method kMethods[] = {CKPTIO_LOAD_PREAD, CKPTIO_LOAD_MMAP, CKPTIO_LOAD_DIRECT, CKPTIO_LOAD_AUTO};

// The slice a:b of `dim` of a row-major tensor, cut from its bytes bit by bit.
std::vector<uint8_t> ref_slice(const std::vector<uint8_t> &bytes, int bits, const std::vector<int64_t> &shape,
                               int dim, int64_t a, int64_t b) {
  uint64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; d++) outer *= (uint64_t)shape[d];
  for (size_t d = (size_t)dim + 1; d < shape.size(); d++) inner *= (uint64_t)shape[d];
  std::vector<uint8_t> out;
  for (uint64_t o = 0; o < outer; o++) {
    uint64_t bit0 = (o * (uint64_t)shape[dim] + (uint64_t)a) * inner * (uint64_t)bits;
    uint64_t nbits = (uint64_t)(b - a) * inner * (uint64_t)bits;
    EXPECT_EQ(bit0 % 8, 0u);
    EXPECT_EQ(nbits % 8, 0u);
    out.insert(out.end(), bytes.begin() + (long)(bit0 / 8), bytes.begin() + (long)((bit0 + nbits) / 8));
  }
  return out;
}

struct Ctx {
  explicit Ctx(ckptio_options o = small_options()) {
    if (on_gpu()) o.cuda = 1;
    EXPECT_EQ(ckptio_ctx_create(&o, &ctx), 0) << ckptio_last_open_error();
  }
  ~Ctx() { ckptio_ctx_free(ctx); }
  ckptio_ctx *ctx = nullptr;
};

struct Reader {
  Reader(ckptio_ctx *ctx, const std::string &path, ckptio_load_method m = CKPTIO_LOAD_AUTO, int crc = 1) {
    ckptio_options o = CKPTIO_OPTIONS_INIT;
    o.load_method = m;
    o.crc = crc;
    EXPECT_EQ(ckptio_reader_open(ctx, path.c_str(), &o, &r), 0) << ckptio_last_open_error();
  }
  ~Reader() { ckptio_reader_close(r); }
  size_t find(const std::string &name) {
    int64_t i = ckptio_reader_find(r, name.c_str());
    EXPECT_GE(i, 0) << name;
    return (size_t)i;
  }
  std::string err() const { return ckptio_reader_last_error(r); }
  ckptio_reader *r = nullptr;
};

// Loads one slice into a fresh host buffer (with a guard byte that must
// stay), checking bytes_read against what the method may read.
std::vector<uint8_t> load(Reader &rd, size_t index, int dim, int64_t a, int64_t b, ckptio_load_method m,
                          int *verified = nullptr) {
  int64_t n = ckptio_reader_slice_nbytes(rd.r, index, dim, a, b);
  EXPECT_GE(n, 0) << rd.err();
  if (n < 0) return {};
  std::vector<uint8_t> out((size_t)n + 1, 0xEE);
  ckptio_slice_request q = {index, dim, a, b, out.data(), (uint64_t)n, CKPTIO_DEVICE_HOST, -1, 0};
  EXPECT_EQ(ckptio_reader_load_slices(rd.r, &q, 1), 0) << rd.err();
  EXPECT_EQ(out.back(), 0xEE) << "wrote past the slice";
  out.pop_back();
  if (verified) *verified = q.verified;
  int64_t runs = ckptio_reader_slice_ranges(rd.r, index, dim, a, b, nullptr, 0);
  EXPECT_GE(runs, 0);
  if (!q.verified && (m == CKPTIO_LOAD_PREAD || m == CKPTIO_LOAD_MMAP)) {
    EXPECT_EQ(q.bytes_read, (uint64_t)n) << "read more than the slice";
  } else if (!q.verified) {
    // O_DIRECT rounds to pages each run, and each slot's share of a long one.
    uint64_t pieces = (uint64_t)runs + (uint64_t)n / ((64 << 10) - 8192) + 1;
    EXPECT_LE(q.bytes_read, (uint64_t)n + 2 * 4096 * pieces) << "read more than the slice's pages";
  }
  return out;
}

std::vector<Tensor> model() {
  return {make_tensor("u8.1d", CKPTIO_U8, {37}, 1),         make_tensor("f16.2d", CKPTIO_F16, {6, 10}, 2),
          make_tensor("f32.3d", CKPTIO_F32, {3, 5, 7}, 3),    make_tensor("f64.4d", CKPTIO_F64, {2, 3, 4, 5}, 4),
          make_tensor("i8.4d", CKPTIO_I8, {3, 1, 4, 2}, 5),   make_tensor("bf16.rows", CKPTIO_BF16, {1000, 33}, 6),
          make_tensor("f32.big", CKPTIO_F32, {300, 257}, 7),  make_tensor("c64.2d", CKPTIO_C64, {4, 6}, 8),
          make_tensor("f32.empty", CKPTIO_F32, {4, 0, 3}, 9), make_tensor("i64.2d", CKPTIO_I64, {5, 3}, 10)};
}

// start:stop pairs worth trying on a dim of `size`.
std::vector<std::pair<int64_t, int64_t>> cuts(int64_t size) {
  std::vector<std::pair<int64_t, int64_t>> v = {{0, size}, {0, 0}, {size, size}};
  if (size >= 1) v.push_back({0, 1}), v.push_back({size - 1, size});
  if (size >= 3) v.push_back({1, size - 1}), v.push_back({size / 3, 2 * size / 3 + 1});
  return v;
}

int64_t rchar() {  // bytes this process has read through read/pread (the kernel's count)
  std::ifstream f("/proc/self/io");
  std::string key;
  int64_t v;
  while (f >> key >> v)
    if (key == "rchar:") return v;
  return -1;
}

}  // namespace

TEST(Slice, EveryDimOfEveryTensorByEveryMethod) {
  if (on_gpu()) GTEST_SKIP() << "host destinations: run by the unit variant";
  TempDir dir;
  Ctx c;
  auto ts = model();
  ASSERT_EQ(save(c.ctx, dir.file("m.safetensors"), ts), 0);
  for (auto m : kMethods) {
    Reader rd(c.ctx, dir.file("m.safetensors"), m);
    for (const Tensor &t : ts) {
      size_t i = rd.find(t.name);
      for (int d = 0; d < (int)t.shape.size(); d++)
        for (auto [a, b] : cuts(t.shape[d])) {
          SCOPED_TRACE(t.name + " dim " + std::to_string(d) + " " + std::to_string(a) + ":" + std::to_string(b) +
                       " method " + std::to_string(m));
          int verified = -1;
          auto got = load(rd, i, d, a, b, m, &verified);
          EXPECT_EQ(got, ref_slice(t.bytes, ckptio_dtype_bits(t.dtype), t.shape, d, a, b));
          EXPECT_EQ(verified, a == 0 && b == t.shape[d] ? 1 : 0) << "only a whole slice can be verified";
        }
    }
  }
}

TEST(Slice, ManySlicesInOneCallAndStats) {
  if (on_gpu()) GTEST_SKIP() << "host destinations: run by the unit variant";
  TempDir dir;
  Ctx c;
  auto ts = model();
  ASSERT_EQ(save(c.ctx, dir.file("m.safetensors"), ts), 0);
  Reader rd(c.ctx, dir.file("m.safetensors"), CKPTIO_LOAD_PREAD);
  std::vector<ckptio_slice_request> qs;
  std::vector<std::vector<uint8_t>> outs, want;
  uint64_t total = 0;
  for (const Tensor &t : ts) {
    if (t.shape.size() < 2) continue;
    for (int whole = 0; whole < 2; whole++) {
      int64_t a = whole ? 0 : 1, b = t.shape[1];
      if (a > b) continue;
      int64_t n = ckptio_reader_slice_nbytes(rd.r, rd.find(t.name), 1, a, b);
      ASSERT_GE(n, 0);
      outs.emplace_back((size_t)n);
      want.push_back(ref_slice(t.bytes, ckptio_dtype_bits(t.dtype), t.shape, 1, a, b));
      qs.push_back({rd.find(t.name), 1, a, b, nullptr, (uint64_t)n, CKPTIO_DEVICE_HOST, -1, 0});
      total += (uint64_t)n;
    }
  }
  for (size_t k = 0; k < qs.size(); k++) qs[k].dst = outs[k].data();
  ASSERT_EQ(ckptio_reader_load_slices(rd.r, qs.data(), qs.size()), 0) << rd.err();
  for (size_t k = 0; k < qs.size(); k++) {
    EXPECT_EQ(outs[k], want[k]) << k;
    EXPECT_EQ(qs[k].verified, qs[k].start == 0 ? 1 : 0) << k;
  }
  ckptio_stats s = CKPTIO_STATS_INIT;
  ASSERT_EQ(ckptio_reader_stats(rd.r, &s), 0);
  EXPECT_EQ(s.bytes, total) << "stats count the partial and the whole slices";
  uint64_t done, all;
  ckptio_reader_progress(rd.r, &done, &all);
  EXPECT_EQ(done, total);
  EXPECT_EQ(all, total);
}

TEST(Slice, BadSlicesAreRefusedWithTheRule) {
  TempDir dir;
  Ctx c;
  ASSERT_EQ(save(c.ctx, dir.file("m.safetensors"),
                 {make_tensor("w", CKPTIO_F32, {4, 6}, 1), make_tensor("s", CKPTIO_F32, {}, 2)}),
            0);
  Reader rd(c.ctx, dir.file("m.safetensors"));
  size_t w = rd.find("w"), s = rd.find("s");
  std::vector<uint8_t> buf(1024);
  struct Bad {
    size_t index;
    int dim;
    int64_t a, b;
    int code;
    const char *needle;
  };
  for (Bad bad : {Bad{w, 0, 3, 2, CKPTIO_E_INVALID_ARG, "slice 3:2 of dim 0 is outside"},
                  Bad{w, 1, 0, 7, CKPTIO_E_INVALID_ARG, "0 <= start <= stop <= 6"},
                  Bad{w, 0, -1, 2, CKPTIO_E_INVALID_ARG, "slice -1:2"},
                  Bad{w, 0, INT64_MIN, INT64_MAX, CKPTIO_E_INVALID_ARG, "outside the tensor"},
                  Bad{w, 1, INT64_MAX, INT64_MAX, CKPTIO_E_INVALID_ARG, "outside the tensor"},
                  Bad{w, 2, 0, 1, CKPTIO_E_INVALID_ARG, "has 2 dims: there is no dim 2"},
                  Bad{w, -1, 0, 1, CKPTIO_E_INVALID_ARG, "no dim -1"},
                  Bad{s, 0, 0, 0, CKPTIO_E_INVALID_ARG, "'s' has 0 dims"},
                  Bad{99, 0, 0, 1, CKPTIO_E_INVALID_ARG, "no tensor at index 99"}}) {
    SCOPED_TRACE(bad.needle);
    EXPECT_EQ(ckptio_reader_slice_nbytes(rd.r, bad.index, bad.dim, bad.a, bad.b), bad.code);
    EXPECT_NE(rd.err().find(bad.needle), std::string::npos) << rd.err();
    ckptio_slice_request q = {bad.index, bad.dim, bad.a, bad.b, buf.data(), buf.size(), CKPTIO_DEVICE_HOST, 7, 7};
    EXPECT_EQ(ckptio_reader_load_slices(rd.r, &q, 1), bad.code);
    EXPECT_EQ(ckptio_reader_slice_ranges(rd.r, bad.index, bad.dim, bad.a, bad.b, nullptr, 0), bad.code);
    EXPECT_EQ(q.verified, 0);
  }
  // Destination: too small by one byte, NULL, NULL for an empty slice (fine).
  EXPECT_EQ(ckptio_reader_load_slice(rd.r, w, 1, 1, 3, buf.data(), 4 * 2 * 4 - 1, nullptr), CKPTIO_E_BUFFER_TOO_SMALL);
  EXPECT_NE(rd.err().find("slice 1:3 of dim 1 needs 32 bytes, destination has 31"), std::string::npos) << rd.err();
  EXPECT_EQ(ckptio_reader_load_slice(rd.r, w, 1, 1, 3, nullptr, 1 << 20, nullptr), CKPTIO_E_BUFFER_TOO_SMALL);
  int verified = -1;
  EXPECT_EQ(ckptio_reader_load_slice(rd.r, w, 1, 2, 2, nullptr, 0, &verified), 0) << rd.err();
  EXPECT_EQ(verified, 0);
  // A bad request anywhere in a batch fails the batch before anything is read.
  ckptio_slice_request qs[2] = {{w, 0, 0, 1, buf.data(), buf.size(), CKPTIO_DEVICE_HOST, 0, 0},
                                {w, 0, 0, 5, buf.data(), buf.size(), CKPTIO_DEVICE_HOST, 0, 0}};
  EXPECT_EQ(ckptio_reader_load_slices(rd.r, qs, 2), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(qs[0].bytes_read, 0u);
  EXPECT_EQ(ckptio_reader_load_slices(nullptr, qs, 1), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(ckptio_reader_load_slices(rd.r, nullptr, 1), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(ckptio_reader_load_slices(rd.r, nullptr, 0), 0);
  EXPECT_EQ(ckptio_reader_slice_ranges(rd.r, w, 0, 0, 1, nullptr, 3), CKPTIO_E_INVALID_ARG) << "cap without an array";
  if (!on_gpu()) {  // a device destination needs CUDA
    ckptio_slice_request g = {w, 0, 0, 1, buf.data(), buf.size(), CKPTIO_DEVICE_CUDA(0), 0, 0};
    EXPECT_EQ(ckptio_reader_load_slices(rd.r, &g, 1), CKPTIO_E_DEVICE);
  }
}

TEST(Slice, EmptyTensorsWithHugeDimsReadNothing) {
  // [0, 2^40, 2^40] is a valid empty tensor, but the other dims' products
  // overflow 64 bits: slices of it are empty, not an overflow.
  TempDir dir;
  Ctx c;
  std::string json =
      "{\"w\":{\"dtype\":\"F32\",\"shape\":[0,1099511627776,1099511627776],\"data_offsets\":[0,0]}}";
  while (json.size() % 8) json += ' ';
  std::string file(8, '\0');
  for (int k = 0; k < 8; k++) file[(size_t)k] = (char)(json.size() >> (8 * k));
  write_file(dir.file("e.safetensors"), file + json);
  Reader rd(c.ctx, dir.file("e.safetensors"));
  for (int d = 0; d < 3; d++) {
    int64_t size = d ? INT64_C(1) << 40 : 0;
    EXPECT_EQ(ckptio_reader_slice_nbytes(rd.r, 0, d, 0, size), 0) << rd.err();
    EXPECT_EQ(ckptio_reader_slice_nbytes(rd.r, 0, d, size / 2, size), 0) << rd.err();
    EXPECT_EQ(ckptio_reader_slice_ranges(rd.r, 0, d, 0, size, nullptr, 0), 0);
    int verified = -1;
    EXPECT_EQ(ckptio_reader_load_slice(rd.r, 0, d, 0, size, nullptr, 0, &verified), 0) << rd.err();
    EXPECT_EQ(ckptio_reader_plan_rank(rd.r, 0, d, 1, 2, nullptr, nullptr, nullptr, 0), 0);
  }
  EXPECT_EQ(ckptio_reader_slice_nbytes(rd.r, 0, 1, 0, (INT64_C(1) << 40) + 1), CKPTIO_E_INVALID_ARG);
}

TEST(Slice, SubByteDtypesCutOnlyOnByteBoundaries) {
  TempDir dir;
  Ctx c;
  auto ts = std::vector<Tensor>{make_tensor("f4", CKPTIO_F4, {4, 6}, 1), make_tensor("f6", CKPTIO_F6_E2M3, {8}, 2),
                                make_tensor("f4.odd", CKPTIO_F4, {5, 2}, 3)};
  ASSERT_EQ(save(c.ctx, dir.file("m.safetensors"), ts), 0);
  for (auto m : kMethods) {
    Reader rd(c.ctx, dir.file("m.safetensors"), m);
    size_t f4 = rd.find("f4"), f6 = rd.find("f6"), odd = rd.find("f4.odd");
    EXPECT_EQ(load(rd, f4, 0, 1, 3, m), ref_slice(ts[0].bytes, 4, ts[0].shape, 0, 1, 3));
    EXPECT_EQ(load(rd, f4, 1, 0, 2, m), ref_slice(ts[0].bytes, 4, ts[0].shape, 1, 0, 2));
    EXPECT_EQ(load(rd, f4, 1, 2, 6, m), ref_slice(ts[0].bytes, 4, ts[0].shape, 1, 2, 6));
    EXPECT_EQ(load(rd, f6, 0, 4, 8, m), ref_slice(ts[1].bytes, 6, ts[1].shape, 0, 4, 8));
    EXPECT_EQ(load(rd, odd, 0, 1, 4, m), ref_slice(ts[2].bytes, 4, ts[2].shape, 0, 1, 4));
    EXPECT_EQ(ckptio_reader_slice_nbytes(rd.r, f4, 1, 1, 3), CKPTIO_E_MISALIGNED);
    EXPECT_NE(rd.err().find("does not start and end on byte boundaries (F4 has 4 bits per element)"),
              std::string::npos)
        << rd.err();
    EXPECT_EQ(ckptio_reader_slice_nbytes(rd.r, f4, 1, 0, 1), CKPTIO_E_MISALIGNED) << "half a byte per row";
    EXPECT_EQ(ckptio_reader_slice_nbytes(rd.r, f6, 0, 0, 3), CKPTIO_E_MISALIGNED);
    EXPECT_EQ(ckptio_reader_slice_nbytes(rd.r, f6, 0, 1, 5), CKPTIO_E_MISALIGNED);
    EXPECT_EQ(ckptio_reader_slice_nbytes(rd.r, odd, 1, 0, 1), CKPTIO_E_MISALIGNED) << "rows of 8 bits, pitch 4";
    std::vector<uint8_t> buf(64);
    EXPECT_EQ(ckptio_reader_load_slice(rd.r, f4, 1, 1, 3, buf.data(), buf.size(), nullptr), CKPTIO_E_MISALIGNED);
  }
}

TEST(Slice, WholeSlicesAreVerifiedPartialOnesAreNot) {
  if (on_gpu()) GTEST_SKIP() << "host destinations: run by the unit variant";
  TempDir dir;
  Ctx c;
  auto ts = std::vector<Tensor>{make_tensor("w", CKPTIO_F32, {64, 64}, 1)};
  ASSERT_EQ(save(c.ctx, dir.file("m.safetensors"), ts), 0);
  std::vector<uint8_t> buf(64 * 64 * 4);
  int verified = -1;
  {
    Reader off(c.ctx, dir.file("m.safetensors"), CKPTIO_LOAD_PREAD, 0);
    ASSERT_EQ(ckptio_reader_load_slice(off.r, 0, 0, 0, 64, buf.data(), buf.size(), &verified), 0);
    EXPECT_EQ(verified, 0) << "crc off: nothing was checked";
  }
  // Flip a byte in row 40: whole slices see it, slices that skip it load.
  std::string path = dir.file("m.safetensors");
  ckptio_tensor_info info;
  {
    Reader rd(c.ctx, path);
    ASSERT_EQ(ckptio_reader_info(rd.r, 0, &info), 0);
  }
  auto bytes = read_file(path);
  bytes[info.offset + 40 * 64 * 4 + 8] ^= 0x5a;
  write_file(path, bytes);
  for (auto m : kMethods) {
    Reader rd(c.ctx, path, m);
    EXPECT_EQ(ckptio_reader_load_slice(rd.r, 0, 0, 0, 64, buf.data(), buf.size(), &verified), CKPTIO_E_CHECKSUM);
    EXPECT_NE(rd.err().find("tensor 'w': checksum mismatch"), std::string::npos) << rd.err();
    EXPECT_EQ(verified, 0);
    EXPECT_EQ(ckptio_reader_load_slice(rd.r, 0, 1, 0, 64, buf.data(), buf.size(), nullptr), CKPTIO_E_CHECKSUM)
        << "the whole tensor through any dim";
    EXPECT_EQ(ckptio_reader_load_slice(rd.r, 0, 0, 0, 40, buf.data(), buf.size(), &verified), 0) << rd.err();
    EXPECT_EQ(verified, 0);
    std::vector<uint8_t> want = ref_slice(ts[0].bytes, 32, ts[0].shape, 0, 0, 40);
    EXPECT_EQ(memcmp(buf.data(), want.data(), want.size()), 0);
    // The partial slice holding the flipped byte loads unverified: the API says so.
    EXPECT_EQ(ckptio_reader_load_slice(rd.r, 0, 0, 40, 41, buf.data(), buf.size(), &verified), 0);
    EXPECT_EQ(verified, 0);
    EXPECT_NE(memcmp(buf.data(), ts[0].bytes.data() + 40 * 64 * 4, 256), 0);
  }
}

TEST(Slice, ReadsOnlyTheSlicesBytes) {
  if (on_gpu()) GTEST_SKIP() << "host destinations: run by the unit variant";
  TempDir dir;
  Ctx c(small_options(1 << 20, 4 << 20, 2));
  auto ts = std::vector<Tensor>{make_tensor("w", CKPTIO_F32, {512, 1024}, 1)};  // 2 MiB
  ASSERT_EQ(save(c.ctx, dir.file("m.safetensors"), ts), 0);
  if (rchar() < 0) GTEST_SKIP() << "no /proc/self/io here to count the kernel's reads";
  struct Case {
    int dim;
    int64_t a, b;
  };
  for (auto m : {CKPTIO_LOAD_PREAD, CKPTIO_LOAD_DIRECT})
    for (Case k : {Case{0, 100, 164}, Case{1, 0, 128}, Case{1, 1000, 1024}, Case{1, 3, 4}}) {
      SCOPED_TRACE("dim " + std::to_string(k.dim) + " method " + std::to_string(m));
      Reader rd(c.ctx, dir.file("m.safetensors"), m);
      int64_t n = ckptio_reader_slice_nbytes(rd.r, 0, k.dim, k.a, k.b);
      int64_t runs = ckptio_reader_slice_ranges(rd.r, 0, k.dim, k.a, k.b, nullptr, 0);
      EXPECT_EQ(runs, k.dim == 0 ? 1 : 512);
      std::vector<uint8_t> out((size_t)n);
      ckptio_slice_request q = {0, k.dim, k.a, k.b, out.data(), (uint64_t)n, CKPTIO_DEVICE_HOST, 0, 0};
      int64_t before = rchar();
      ASSERT_EQ(ckptio_reader_load_slices(rd.r, &q, 1), 0) << rd.err();
      int64_t kernel = rchar() - before;
      EXPECT_EQ(out, ref_slice(ts[0].bytes, 32, ts[0].shape, k.dim, k.a, k.b));
      uint64_t slack = m == CKPTIO_LOAD_DIRECT ? 2 * 4096 * (uint64_t)runs : 0;
      EXPECT_GE(q.bytes_read, (uint64_t)n);
      EXPECT_LE(q.bytes_read, (uint64_t)n + slack);
      EXPECT_GE(kernel, n) << "the kernel saw fewer bytes read than the slice holds?";
      EXPECT_LE(kernel, n + (int64_t)slack + 4096) << "read more than the slice (whole tensor: 2 MiB)";
      if (m == CKPTIO_LOAD_DIRECT && k.dim == 1 && k.b - k.a == 1) {
        EXPECT_EQ(q.bytes_read, 512u * 4096) << "one page per row: rows 4 KiB apart never share one";
      }
    }
}

TEST(Slice, ReadFailuresNameTheTensor) {
  if (on_gpu()) GTEST_SKIP() << "host destinations: run by the unit variant";
  TempDir dir;
  Ctx c;
  ASSERT_EQ(save(c.ctx, dir.file("m.safetensors"), {make_tensor("w", CKPTIO_F32, {256, 256}, 1)}), 0);
  Reader rd(c.ctx, dir.file("m.safetensors"), CKPTIO_LOAD_PREAD);
  std::vector<uint8_t> buf(256 * 256 * 4);
  ckptio_fault_arm(CKPTIO_FAULT_PREAD, 5, EIO);
  EXPECT_EQ(ckptio_reader_load_slice(rd.r, 0, 1, 10, 20, buf.data(), buf.size(), nullptr), -EIO);
  ckptio_fault_clear();
  EXPECT_NE(rd.err().find("tensor 'w': reading bytes"), std::string::npos) << rd.err();
  EXPECT_EQ(ckptio_reader_load_slice(rd.r, 0, 1, 10, 20, buf.data(), buf.size(), nullptr), 0) << "and recovers";
}

TEST(Plan, SplitRankFollowsTorchChunk) {
  int64_t a, b;
  struct Case {
    int64_t size;
    int n;
    std::vector<std::pair<int64_t, int64_t>> want;
  };
  for (const Case &k : {Case{12, 4, {{0, 3}, {3, 6}, {6, 9}, {9, 12}}}, Case{10, 4, {{0, 3}, {3, 6}, {6, 9}, {9, 10}}},
                        Case{6, 4, {{0, 2}, {2, 4}, {4, 6}, {6, 6}}}, Case{0, 3, {{0, 0}, {0, 0}, {0, 0}}},
                        Case{5, 1, {{0, 5}}}, Case{2, 5, {{0, 1}, {1, 2}, {2, 2}, {2, 2}, {2, 2}}}}) {
    for (int r = 0; r < k.n; r++) {
      ASSERT_EQ(ckptio_split_rank(k.size, r, k.n, &a, &b), 0);
      EXPECT_EQ(std::make_pair(a, b), k.want[(size_t)r]) << k.size << " / " << k.n << " rank " << r;
    }
  }
  // No overflow at the edges of int64.
  ASSERT_EQ(ckptio_split_rank(INT64_MAX, 2, 3, &a, &b), 0);
  EXPECT_EQ(b, INT64_MAX);
  EXPECT_LT(a, b);
  ASSERT_EQ(ckptio_split_rank(INT64_MAX, INT32_MAX - 1, INT32_MAX, &a, &b), 0);
  EXPECT_LE(a, b);
  EXPECT_EQ(b, INT64_MAX);
  for (auto bad : {std::make_tuple(INT64_C(-1), 0, 1), std::make_tuple(INT64_C(4), 0, 0),
                   std::make_tuple(INT64_C(4), -1, 2), std::make_tuple(INT64_C(4), 2, 2)})
    EXPECT_EQ(ckptio_split_rank(std::get<0>(bad), std::get<1>(bad), std::get<2>(bad), &a, &b), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(ckptio_split_rank(4, 0, 1, nullptr, &b), CKPTIO_E_INVALID_ARG);
}

TEST(Plan, RanksTileTheTensorAndHoldTheirSlices) {
  if (on_gpu()) GTEST_SKIP() << "host destinations: run by the unit variant";
  TempDir dir;
  Ctx c;
  auto ts = model();
  ASSERT_EQ(save(c.ctx, dir.file("m.safetensors"), ts), 0);
  auto file = read_file(dir.file("m.safetensors"));
  Reader rd(c.ctx, dir.file("m.safetensors"), CKPTIO_LOAD_PREAD);
  for (const Tensor &t : ts) {
    size_t i = rd.find(t.name);
    ckptio_tensor_info info;
    ASSERT_EQ(ckptio_reader_info(rd.r, i, &info), 0);
    for (int d = 0; d < (int)t.shape.size(); d++)
      for (int n : {1, 2, 3, 4, 7}) {
        SCOPED_TRACE(t.name + " dim " + std::to_string(d) + " ranks " + std::to_string(n));
        std::vector<ckptio_byte_range> all;
        int64_t expect_start = 0;
        for (int rank = 0; rank < n; rank++) {
          int64_t a = -1, b = -1;
          int64_t count = ckptio_reader_plan_rank(rd.r, i, d, rank, n, &a, &b, nullptr, 0);
          ASSERT_GE(count, 0) << rd.err();
          EXPECT_EQ(a, std::min(expect_start, t.shape[d]));
          expect_start = b;
          std::vector<ckptio_byte_range> rs((size_t)count + 1, ckptio_byte_range{77, 77, 77});
          ASSERT_EQ(ckptio_reader_plan_rank(rd.r, i, d, rank, n, nullptr, nullptr, rs.data(), (size_t)count), count);
          EXPECT_EQ(rs.back().file, 77u) << "wrote past cap";
          rs.pop_back();
          // The ranges' bytes, in order, are the rank's slice, and loading it gives the same.
          std::vector<uint8_t> from_ranges;
          for (auto &x : rs) {
            EXPECT_EQ(x.file, 0u);
            EXPECT_GT(x.length, 0u);
            from_ranges.insert(from_ranges.end(), file.begin() + (long)x.offset, file.begin() + (long)(x.offset + x.length));
          }
          auto want = ref_slice(t.bytes, ckptio_dtype_bits(t.dtype), t.shape, d, a, b);
          EXPECT_EQ(from_ranges, want);
          EXPECT_EQ(load(rd, i, d, a, b, CKPTIO_LOAD_PREAD), want);
          for (size_t k = 1; k < rs.size(); k++)
            EXPECT_LT(rs[k - 1].offset + rs[k - 1].length, rs[k].offset) << "adjacent ranges are merged";
          all.insert(all.end(), rs.begin(), rs.end());
        }
        EXPECT_EQ(expect_start, t.shape[d]) << "the ranks cover the dim";
        // All ranks together: disjoint, and exactly the tensor's bytes.
        std::sort(all.begin(), all.end(), [](auto &x, auto &y) { return x.offset < y.offset; });
        uint64_t at = info.offset;
        for (auto &x : all) {
          EXPECT_EQ(x.offset, at) << "a hole or an overlap";
          at = x.offset + x.length;
        }
        EXPECT_EQ(at, info.offset + info.nbytes);
      }
  }
  // A cap below the count writes only cap ranges and still counts them all.
  size_t rows = rd.find("bf16.rows");
  ckptio_byte_range two[3] = {{9, 9, 9}, {9, 9, 9}, {9, 9, 9}};
  EXPECT_EQ(ckptio_reader_slice_ranges(rd.r, rows, 1, 1, 2, two, 2), 1000);
  EXPECT_EQ(two[1].offset, two[0].offset + 66);
  EXPECT_EQ(two[2].offset, 9u);
  EXPECT_EQ(ckptio_reader_plan_rank(rd.r, rows, 0, 3, 3, nullptr, nullptr, nullptr, 0), CKPTIO_E_INVALID_ARG);
  EXPECT_NE(rd.err().find("no rank 3 of 3"), std::string::npos) << rd.err();
  EXPECT_EQ(ckptio_reader_plan_rank(rd.r, rows, 2, 0, 3, nullptr, nullptr, nullptr, 0), CKPTIO_E_INVALID_ARG);
}

// ------------------------------------------------------------ PyTorch files

namespace {

std::string bytes_str(const std::vector<uint8_t> &v) { return std::string(v.begin(), v.end()); }

// Element i of a view, from its storage (element size es).
std::vector<uint8_t> materialise(const std::vector<uint8_t> &storage, size_t es, const PtTensor &t) {
  std::vector<uint8_t> out;
  size_t nd = t.size.size();
  int64_t numel = 1;
  for (int64_t s : t.size) numel *= s;
  std::vector<int64_t> idx(nd, 0);
  for (int64_t k = 0; k < numel; k++) {
    int64_t pos = t.offset;
    for (size_t d = 0; d < nd; d++) pos += idx[d] * t.stride[d];
    out.insert(out.end(), storage.begin() + pos * (long)es, storage.begin() + (pos + 1) * (long)es);
    for (size_t d = nd; d-- > 0;) {
      if (++idx[d] < t.size[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

std::vector<uint8_t> swapped(std::vector<uint8_t> v, size_t es) {
  for (size_t i = 0; i + es <= v.size(); i += es) std::reverse(v.begin() + (long)i, v.begin() + (long)(i + es));
  return v;
}

}  // namespace

TEST(Slice, PyTorchViewsAndBigEndianFiles) {
  TempDir dir;
  Ctx c;
  // One float storage of 6 x 8 (rows of 8): the base, its transpose, a
  // column block with an offset, a broadcast (stride 0) and a step-2 view;
  // plus a plain int16 tensor, written little- and big-endian.
  std::vector<uint8_t> st = pattern(48 * 4, 1), st16 = pattern(5 * 6 * 2, 2);
  std::vector<PtTensor> views = {
      {"base", "FloatStorage", "0", 48, 0, {6, 8}, {8, 1}},   {"t", "FloatStorage", "0", 48, 0, {8, 6}, {1, 8}},
      {"block", "FloatStorage", "0", 48, 10, {4, 3}, {8, 1}}, {"bcast", "FloatStorage", "0", 48, 3, {5, 4}, {0, 1}},
      {"step", "FloatStorage", "0", 48, 1, {3, 2, 4}, {16, 8, 2}}, {"i16", "ShortStorage", "1", 30, 0, {5, 6}, {6, 1}}};
  for (std::string order : {"little", "big"}) {
    SCOPED_TRACE(order);
    bool big = order == "big";
    std::vector<uint8_t> f32 = big ? swapped(st, 4) : st, i16 = big ? swapped(st16, 2) : st16;
    std::string path = dir.file(order + ".pt");
    write_file(path, pt_archive(views, {{"0", bytes_str(f32)}, {"1", bytes_str(i16)}}, order));
    for (auto m : kMethods) {
      Reader rd(c.ctx, path, m);
      size_t unchecked = 9;
      EXPECT_EQ(ckptio_reader_verify(rd.r, &unchecked), 0) << rd.err();  // (crashed with MMAP on big-endian files)
      EXPECT_EQ(unchecked, 0u);
      for (const PtTensor &v : views) {
        size_t es = v.storage_class == "FloatStorage" ? 4 : 2;
        auto logical = materialise(es == 4 ? st : st16, es, v);  // little-endian values
        size_t i = rd.find(v.name);
        for (int d = 0; d < (int)v.size.size(); d++)
          for (auto [a, b] : cuts(v.size[(size_t)d])) {
            SCOPED_TRACE(v.name + " dim " + std::to_string(d) + " " + std::to_string(a) + ":" + std::to_string(b));
            int verified = -1;
            auto got = load(rd, i, d, a, b, m, &verified);
            EXPECT_EQ(got, ref_slice(logical, (int)es * 8, v.size, d, a, b));
            EXPECT_EQ(verified, a == 0 && b == v.size[(size_t)d] ? 1 : 0);
          }
      }
      // The plan of a view names storage bytes: every byte of the slice
      // comes from a range, in order.
      size_t t = rd.find("t");
      ckptio_byte_range rs[64];
      int64_t nr = ckptio_reader_slice_ranges(rd.r, t, 0, 2, 5, rs, 64);
      ASSERT_EQ(nr, 18) << "a column of the storage: one element per range";
      std::vector<uint8_t> file = read_file(path), cat;
      for (int64_t k = 0; k < nr; k++) cat.insert(cat.end(), file.begin() + (long)rs[k].offset, file.begin() + (long)(rs[k].offset + rs[k].length));
      auto want = ref_slice(materialise(st, 4, views[1]), 32, {8, 6}, 0, 2, 5);
      EXPECT_EQ(big ? swapped(cat, 4) : cat, want);
    }
  }
}

// ------------------------------------------------------------ fake GPUs

TEST(SliceGpu, SlicesLandOnTheGpuByEveryMethod) {
  if (!on_gpu()) GTEST_SKIP() << "needs a CUDA runtime: runs in the cuda-fake and gpu ctest variants";
  TempDir dir;
  Ctx c(small_options(64 << 10, 512 << 10, 4));
  auto ts = model();
  ASSERT_EQ(save(c.ctx, dir.file("m.safetensors"), ts), 0);
  std::vector<uint8_t> st = pattern(48 * 4, 1);
  std::vector<PtTensor> views = {{"t", "FloatStorage", "0", 48, 0, {8, 6}, {1, 8}}};
  write_file(dir.file("big.pt"), pt_archive(views, {{"0", bytes_str(swapped(st, 4))}}, "big"));
  if (fake_gpu()) sym<void (*)()>("fake_cudart_reset_stats")();
  for (auto m : kMethods) {
    Reader rd(c.ctx, dir.file("m.safetensors"), m);
    Reader pt(c.ctx, dir.file("big.pt"), m);
    struct Want {
      Reader *rd;
      size_t index;
      int dim;
      int64_t a, b;
      std::vector<uint8_t> bytes;
      bool full;
    };
    std::vector<Want> wants;
    for (const Tensor &t : ts)
      for (int d = 0; d < (int)t.shape.size(); d++) {
        int64_t a = t.shape[d] / 3, b = t.shape[d] - t.shape[d] / 4;
        wants.push_back({&rd, rd.find(t.name), d, a, b, ref_slice(t.bytes, ckptio_dtype_bits(t.dtype), t.shape, d, a, b),
                         a == 0 && b == t.shape[d]});
      }
    wants.push_back({&pt, 0, 1, 1, 4, ref_slice(materialise(st, 4, views[0]), 32, {8, 6}, 1, 1, 4), false});
    wants.push_back({&pt, 0, 0, 0, 8, materialise(st, 4, views[0]), true});  // whole: verified
    for (size_t k = 0; k < wants.size(); k++) {
      Want &w = wants[k];
      SCOPED_TRACE("slice " + std::to_string(k) + " method " + std::to_string(m));
      int dev = CKPTIO_DEVICE_CUDA((int)(k % (size_t)gpu_count()));
      void *p = nullptr;
      size_t n = w.bytes.size();
      ASSERT_EQ(ckptio_device_alloc(c.ctx, dev, n + 1, &p), 0);
      ckptio_slice_request q = {w.index, w.dim, w.a, w.b, p, n, dev, -1, 0};
      EXPECT_EQ(ckptio_reader_load_slices(w.rd->r, &q, 1), 0) << w.rd->err();
      std::vector<uint8_t> got(n);
      from_gpu(got.data(), p, n);
      EXPECT_EQ(got, w.bytes);
      EXPECT_EQ(q.verified, w.full ? 1 : 0);
      // A host pointer named as the GPU's, and the GPU's named as host.
      std::vector<uint8_t> host(n + 1);
      ckptio_slice_request lie = {w.index, w.dim, w.a, w.b, host.data(), n, dev, 0, 0};
      if (n) {
        EXPECT_EQ(ckptio_reader_load_slices(w.rd->r, &lie, 1), CKPTIO_E_DEVICE);
        lie = {w.index, w.dim, w.a, w.b, p, n, CKPTIO_DEVICE_HOST, 0, 0};
        EXPECT_EQ(ckptio_reader_load_slices(w.rd->r, &lie, 1), CKPTIO_E_DEVICE);
      }
      ckptio_device_free(c.ctx, dev, p);
    }
  }
  if (real_gpu()) return;  // the copy counts below are the fake's
  struct fake_cudart_stats fs = FAKE_CUDART_STATS_INIT;
  sym<int (*)(struct fake_cudart_stats *)>("fake_cudart_stats")(&fs);
  EXPECT_GT(fs.async_copies, 0u);
  // The test's own downloads are cudaMemcpy from pageable vectors; every copy
  // ckptio makes is cudaMemcpyAsync from pinned staging.
  EXPECT_EQ(fs.pageable_copies, fs.sync_copies) << "ckptio made a pageable async copy";
}
