// The torch.save writer layout (src/formats/torch_write.c) and its pickle
// emitter, read back by a zip reader written here from the zip spec: record
// order, 64-byte alignment, CRCs in descriptors and the central directory,
// zip64 fields for a 5 GiB tensor (numbers only), data/ contiguity, and
// bytes compared with torch.save's own output (goldens from torch 2.15).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "test_util.h"
extern "C" {
#include "core/crc32.h"
#include "core/error.h"
#include "formats/layout.h"
#include "formats/pickle_write.h"
#include "formats/torch_write.h"
}

namespace {

struct Layout {
  ckptio_layout v;
  Layout() { memset(&v, 0, sizeof(v)); }
  ~Layout() { ckptio_layout_free(&v); }
};

struct Tensor {
  std::string name;
  ckptio_dtype dtype;
  std::vector<int64_t> shape;
};

std::vector<ckptio_layout_input> inputs(const std::vector<Tensor> &ts) {
  std::vector<ckptio_layout_input> in;
  for (const Tensor &t : ts) {
    int64_t nb = ckptio_tensor_nbytes(t.dtype, (int)t.shape.size(), t.shape.data());
    EXPECT_GE(nb, 0) << t.name;
    in.push_back({t.name.c_str(), t.dtype, (int)t.shape.size(), t.shape.data(), (uint64_t)nb});
  }
  return in;
}
// The inputs borrow the names and shapes: a temporary would leave them dangling.
std::vector<ckptio_layout_input> inputs(std::vector<Tensor> &&) = delete;

int plan(const std::vector<ckptio_layout_input> &in, Layout *l, int with_crc = 1,
         const std::vector<ckptio_kv> &meta = {}, const char *archive = "archive",
         std::string *msg = nullptr) {
  char err[CKPTIO_ERRLEN] = "";
  int rc = ckptio_torch_layout(in.data(), in.size(), meta.data(), meta.size(), with_crc, archive,
                               &l->v, err, sizeof(err));
  if (msg) *msg = err;
  return rc;
}

uint64_t rd(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int k = n - 1; k >= 0; k--) v = v << 8 | p[k];
  return v;
}

// Reads file bytes from the layout's extents alone (never tensor data), so a
// 5 GiB file can be checked without materialising it.
std::vector<uint8_t> extent_bytes(const ckptio_layout &l, uint64_t off, uint64_t len) {
  for (size_t e = 0; e < l.nextents; e++) {
    const ckptio_extent &x = l.extents[e];
    if (off >= x.offset && off + len <= x.offset + x.len)
      return std::vector<uint8_t>(x.bytes + (off - x.offset), x.bytes + (off - x.offset) + len);
  }
  ADD_FAILURE() << "bytes [" << off << ", +" << len << ") are not inside one extent";
  return std::vector<uint8_t>(len, 0);
}

// The whole file, the way the writer makes it: extents, tensor bytes, CRCs
// patched through set_crc, then the holds_crc extents written again.
std::vector<uint8_t> assemble(ckptio_layout &l, const std::vector<ckptio_layout_input> &in,
                              std::vector<std::vector<uint8_t>> *data = nullptr) {
  std::vector<uint8_t> f(l.file_size, 0xEE);  // holes would show as 0xEE
  for (size_t e = 0; e < l.nextents; e++)
    memcpy(&f[l.extents[e].offset], l.extents[e].bytes, l.extents[e].len);
  std::vector<std::vector<uint8_t>> local;
  if (!data) data = &local;
  for (size_t i = 0; i < in.size(); i++) {
    data->push_back(ckptio_test::pattern(in[i].nbytes, 100 + i));
    if (in[i].nbytes) memcpy(&f[l.offset[i]], data->back().data(), in[i].nbytes);
    if (l.set_crc) l.set_crc(&l, i, ckptio_crc32(0, data->back().data(), in[i].nbytes));
  }
  for (size_t e = 0; e < l.nextents; e++)
    if (l.extents[e].holds_crc) memcpy(&f[l.extents[e].offset], l.extents[e].bytes, l.extents[e].len);
  return f;
}

// ------------------------------------------------------------ zip reader

struct Entry {
  std::string name;
  uint16_t flags;
  uint32_t crc;
  uint64_t size, hdr, data;  // from the central directory + local header
  bool has_dd;
  uint32_t dd_crc;
  uint64_t dd_size, dd_len;
};

// Parses end records, central directory (zip64 extras) and local headers
// through `read`, checking every fixed field PyTorch's writer sets.
std::vector<Entry> read_zip(uint64_t file_size,
                            const std::function<std::vector<uint8_t>(uint64_t, uint64_t)> &read) {
  std::vector<Entry> out;
  auto eocd = read(file_size - 22, 22);
  EXPECT_EQ(rd(&eocd[0], 4), 0x06054b50u);
  auto loc = read(file_size - 42, 20);
  EXPECT_EQ(rd(&loc[0], 4), 0x07064b50u);
  EXPECT_EQ(rd(&loc[16], 4), 1u);
  uint64_t z64off = rd(&loc[8], 8);
  EXPECT_EQ(z64off, file_size - 98);
  auto z = read(z64off, 56);
  EXPECT_EQ(rd(&z[0], 4), 0x06064b50u);
  EXPECT_EQ(rd(&z[4], 8), 44u);
  EXPECT_EQ(rd(&z[12], 2), 0x031eu);
  EXPECT_EQ(rd(&z[14], 2), 0x002du);
  uint64_t count = rd(&z[32], 8), cd_len = rd(&z[40], 8), cd_off = rd(&z[48], 8);
  EXPECT_EQ(rd(&z[24], 8), count);
  EXPECT_EQ(cd_off + cd_len, z64off);
  EXPECT_EQ(rd(&eocd[10], 2), count < 0xFFFF ? count : 0xFFFF);
  EXPECT_EQ(rd(&eocd[12], 4), cd_len < 0xFFFFFFFF ? cd_len : 0xFFFFFFFF);
  EXPECT_EQ(rd(&eocd[16], 4), cd_off < 0xFFFFFFFF ? cd_off : 0xFFFFFFFF);
  auto cd = read(cd_off, cd_len);
  size_t p = 0;
  for (uint64_t k = 0; k < count && p + 46 <= cd.size(); k++) {
    const uint8_t *c = &cd[p];
    Entry e{};
    EXPECT_EQ(rd(c, 4), 0x02014b50u);
    EXPECT_EQ(rd(c + 4, 4), 0u) << "versions";
    e.flags = (uint16_t)rd(c + 8, 2);
    EXPECT_EQ(rd(c + 10, 2), 0u) << "stored";
    e.crc = (uint32_t)rd(c + 16, 4);
    uint64_t comp = rd(c + 20, 4), size = rd(c + 24, 4), hdr = rd(c + 42, 4);
    size_t nl = rd(c + 28, 2), el = rd(c + 30, 2);
    e.name.assign((const char *)c + 46, nl);
    const uint8_t *x = c + 46 + nl;
    if (el) {
      EXPECT_EQ(rd(x, 2), 1u) << e.name;
      EXPECT_EQ(rd(x + 2, 2) + 4, el) << e.name;
      x += 4;
      if (size == 0xFFFFFFFF) {
        EXPECT_EQ(comp, 0xFFFFFFFFu);
        size = rd(x, 8), comp = rd(x + 8, 8), x += 16;
      }
      if (hdr == 0xFFFFFFFF) hdr = rd(x, 8);
    }
    EXPECT_EQ(comp, size) << e.name;
    e.size = size, e.hdr = hdr;
    auto lh = read(hdr, 30);
    EXPECT_EQ(rd(&lh[0], 4), 0x04034b50u);
    EXPECT_EQ(rd(&lh[6], 2), e.flags) << e.name;
    for (int b = 8; b < 26; b++) EXPECT_EQ(lh[b], 0) << e.name << " local header byte " << b;
    size_t lnl = rd(&lh[26], 2), lel = rd(&lh[28], 2);
    EXPECT_EQ(lnl, nl);
    auto lx = read(hdr + 30, lnl + lel);
    EXPECT_EQ(std::string(lx.begin(), lx.begin() + lnl), e.name);
    size_t q = lnl;
    bool z64 = e.size >= 0xFFFFFFFF || hdr >= 0xFFFFFFFF;
    if (z64) {  // zip64 extra first: sizes (uncompressed, then 0) and/or offset
      EXPECT_EQ(rd(&lx[q], 2), 1u);
      size_t len = rd(&lx[q + 2], 2);
      EXPECT_EQ(len, (e.size >= 0xFFFFFFFF ? 16u : 0u) + (hdr >= 0xFFFFFFFF ? 8u : 0u));
      if (e.size >= 0xFFFFFFFF) {
        EXPECT_EQ(rd(&lx[q + 4], 8), e.size);
        EXPECT_EQ(rd(&lx[q + 12], 8), 0u);
      }
      if (hdr >= 0xFFFFFFFF) {
        EXPECT_EQ(rd(&lx[q + len - 4], 8), hdr);
      }
      q += 4 + len;
    }
    EXPECT_EQ(lx[q], 'F');
    EXPECT_EQ(lx[q + 1], 'B');
    size_t pad = rd(&lx[q + 2], 2);
    EXPECT_EQ(q + 4 + pad, lnl + lel) << e.name;
    for (size_t b = 0; b < pad; b++) EXPECT_EQ(lx[q + 4 + b], 'Z');
    e.data = hdr + 30 + lnl + lel;
    e.has_dd = e.size > 0;
    EXPECT_EQ(e.flags, e.size ? 0x0808 : 0x0800) << e.name;
    if (e.has_dd) {
      e.dd_len = z64 ? 24 : 16;
      auto dd = read(e.data + e.size, e.dd_len);
      EXPECT_EQ(rd(&dd[0], 4), 0x08074b50u);
      e.dd_crc = (uint32_t)rd(&dd[4], 4);
      int w = z64 ? 8 : 4;
      e.dd_size = rd(&dd[8 + w], w);
      EXPECT_EQ(rd(&dd[8], w), e.dd_size);
    }
    out.push_back(e);
    p += 46 + nl + el;
  }
  EXPECT_EQ(p, cd.size());
  if (!out.empty()) {  // the central directory follows the last record
    const Entry &e = out.back();
    EXPECT_EQ(e.data + e.size + (e.has_dd ? e.dd_len : 0), cd_off);
  }
  return out;
}

std::vector<Entry> read_zip(const std::vector<uint8_t> &f) {
  return read_zip(f.size(), [&](uint64_t off, uint64_t len) {
    EXPECT_LE(off + len, f.size());
    return std::vector<uint8_t>(f.begin() + off, f.begin() + off + len);
  });
}

std::vector<std::string> expected_names(const std::string &a, size_t n, bool meta = false) {
  std::vector<std::string> v = {a + "/data.pkl", a + "/.format_version", a + "/.storage_alignment",
                                a + "/byteorder"};
  for (size_t k = 0; k < n; k++) v.push_back(a + "/data/" + std::to_string(k));
  v.push_back(a + "/version");
  v.push_back(a + "/.data/serialization_id");
  if (meta) v.push_back(a + "/" CKPTIO_TORCH_META_RECORD);
  return v;
}

// Extents sorted, disjoint, never touching tensor bytes, and together with
// the tensors covering the whole file.
void check_extents(const ckptio_layout &l, const std::vector<ckptio_layout_input> &in) {
  uint64_t covered = 0, end = 0;
  for (size_t e = 0; e < l.nextents; e++) {
    const ckptio_extent &x = l.extents[e];
    EXPECT_GT(x.len, 0u);
    EXPECT_GE(x.offset, end) << "extent " << e << " overlaps or is out of order";
    end = x.offset + x.len;
    covered += x.len;
    for (size_t i = 0; i < in.size(); i++)
      EXPECT_TRUE(!in[i].nbytes || x.offset + x.len <= l.offset[i] ||
                  x.offset >= l.offset[i] + in[i].nbytes)
          << "extent " << e << " overlaps tensor " << i;
  }
  for (const auto &t : in) covered += t.nbytes;
  EXPECT_EQ(end, l.file_size);
  EXPECT_EQ(covered, l.file_size);
}

const std::vector<Tensor> kMixed = {
    {"w", CKPTIO_F32, {2, 3}},           {"b16", CKPTIO_BF16, {4}},
    {"flag", CKPTIO_BOOL, {}},           {"empty", CKPTIO_I64, {0, 3}},
    {"f8", CKPTIO_F8_E4M3, {5}},         {"u16", CKPTIO_U16, {3}},
    {"c", CKPTIO_C64, {2, 1, 2}},        {"e8m0", CKPTIO_F8_E8M0, {7}},
};

// ------------------------------------------------------------ tests

TEST(TorchWrite, RecordsAlignmentCrcsAndContiguity) {
  auto in = inputs(kMixed);
  Layout l;
  ASSERT_EQ(plan(in, &l), 0);
  ASSERT_EQ(l.v.count, in.size());
  ASSERT_NE(l.v.set_crc, nullptr);
  for (size_t k = 0; k < in.size(); k++) EXPECT_EQ(l.v.order[k], k);
  check_extents(l.v, in);
  std::vector<std::vector<uint8_t>> data;
  auto f = assemble(l.v, in, &data);
  auto es = read_zip(f);
  ASSERT_EQ(es.size(), in.size() + 6);
  auto names = expected_names("archive", in.size());
  for (size_t k = 0; k < es.size(); k++) {
    const Entry &e = es[k];
    EXPECT_EQ(e.name, names[k]);
    EXPECT_EQ(e.data % 64, 0u) << e.name;
    uint32_t crc = ckptio_crc32(0, &f[e.data], e.size);
    EXPECT_EQ(e.crc, crc) << e.name;
    if (e.has_dd) {
      EXPECT_EQ(e.dd_crc, crc) << e.name;
      EXPECT_EQ(e.dd_size, e.size) << e.name;
    }
    if (k + 1 < es.size()) {  // records follow each other with nothing between
      EXPECT_EQ(es[k + 1].hdr, e.data + e.size + (e.has_dd ? e.dd_len : 0)) << e.name;
    }
  }
  for (size_t i = 0; i < in.size(); i++) {
    const Entry &e = es[4 + i];
    EXPECT_EQ(e.data, l.v.offset[i]);
    EXPECT_EQ(e.size, in[i].nbytes);
    EXPECT_EQ(std::vector<uint8_t>(f.begin() + e.data, f.begin() + e.data + e.size), data[i]);
  }
  auto content = [&](size_t k) { return std::string(f.begin() + es[k].data, f.begin() + es[k].data + es[k].size); };
  EXPECT_EQ(content(1), "1");
  EXPECT_EQ(content(2), "64");
  EXPECT_EQ(content(3), "little");
  EXPECT_EQ(content(in.size() + 4), "3\n");
  std::string sid = content(in.size() + 5);
  ASSERT_EQ(sid.size(), 40u);
  for (char c : sid) EXPECT_TRUE(c >= '0' && c <= '9') << sid;
}

TEST(TorchWrite, SetCrcChangesOnlyHoldsCrcExtents) {
  auto in = inputs(kMixed);
  Layout l;
  ASSERT_EQ(plan(in, &l), 0);
  std::vector<std::vector<uint8_t>> before;
  for (size_t e = 0; e < l.v.nextents; e++)
    before.emplace_back(l.v.extents[e].bytes, l.v.extents[e].bytes + l.v.extents[e].len);
  for (size_t i = 0; i < in.size(); i++) l.v.set_crc(&l.v, i, 0xA5A5A5A5u ^ (uint32_t)i);
  size_t crc_extents = 0;
  for (size_t e = 0; e < l.v.nextents; e++) {
    std::vector<uint8_t> now(l.v.extents[e].bytes, l.v.extents[e].bytes + l.v.extents[e].len);
    crc_extents += l.v.extents[e].holds_crc;
    if (!l.v.extents[e].holds_crc) {
      EXPECT_EQ(now, before[e]) << "extent " << e;
    } else {
      EXPECT_NE(now, before[e]) << "extent " << e;
    }
  }
  // One descriptor per non-empty tensor, plus the central directory.
  size_t nonempty = 0;
  for (const auto &t : in) nonempty += t.nbytes > 0;
  EXPECT_EQ(crc_extents, nonempty + 1);
}

TEST(TorchWrite, MatchesTorchSaveBytes) {
  // torch 2.15: torch.save(OrderedDict(w=arange(6.).reshape(2,3),
  // f8=zeros(4, float8_e4m3fn), s=tensor(True)), io.BytesIO()).
  static const char kPickle[] =
      "800263636f6c6c656374696f6e730a4f726465726564446963740a71002952710128580100000077710263"
      "746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76320a71032828580700000073746f"
      "72616765710463746f7263680a466c6f617453746f726167650a71055801000000307106580300000063707571"
      "074b06747108514b004b024b038671094b034b0186710a8968002952710b74710c52710d58020000006638710e"
      "63746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76330a710f2828680463746f726368"
      "2e73746f726167650a556e747970656453746f726167650a7110580100000031711168074b04747112514b004b"
      "048571134b018571148968002952711563746f7263680a666c6f6174385f65346d33666e0a7116747117527118"
      "580100000073711968032828680463746f7263680a426f6f6c53746f726167650a711a580100000032711b6807"
      "4b0174711c514b0029298968002952711d74711e52711f752e";
  static const uint64_t kHeaders[] = {0, 462, 593, 722, 854, 1000, 1108, 1233, 1362};
  std::vector<Tensor> ts = {{"w", CKPTIO_F32, {2, 3}}, {"f8", CKPTIO_F8_E4M3, {4}}, {"s", CKPTIO_BOOL, {}}};
  auto in = inputs(ts);
  Layout l;
  ASSERT_EQ(plan(in, &l, 1, {}, nullptr), 0);  // default archive name "archive"
  auto f = assemble(l.v, in);
  EXPECT_EQ(f.size(), 2209u);
  auto es = read_zip(f);
  ASSERT_EQ(es.size(), 9u);
  std::string hex;
  for (uint64_t k = 0; k < es[0].size; k++) {
    char b[3];
    snprintf(b, sizeof(b), "%02x", f[es[0].data + k]);
    hex += b;
  }
  EXPECT_EQ(hex, kPickle);
  for (size_t k = 0; k < 9; k++) EXPECT_EQ(es[k].hdr, kHeaders[k]) << es[k].name;
}

TEST(TorchWrite, Zip64ForA5GiBTensor) {
  // torch.save of {a: int32[5], big: uint8[N], c: float32[3], e: float32[0]}
  // into big.pt put the local headers at these offsets (torch 2.15, with
  // N = 2^32 + 100); N = 5 GiB + 100 pickles to as many bytes and moves
  // every later record by exactly 1 GiB, keeping the padding the same.
  const int64_t big = (5ll << 30) + 100;
  std::vector<Tensor> ts = {{"a", CKPTIO_I32, {5}}, {"big", CKPTIO_U8, {big}},
                            {"c", CKPTIO_F32, {3}}, {"e", CKPTIO_F32, {0}}};
  auto in = inputs(ts);
  Layout l;
  ASSERT_EQ(plan(in, &l, 1, {}, "big"), 0);
  check_extents(l.v, in);
  for (size_t i = 0; i < in.size(); i++) l.v.set_crc(&l.v, i, 0x11111111u * (uint32_t)(i + 1));
  auto es = read_zip(l.v.file_size, [&](uint64_t off, uint64_t len) { return extent_bytes(l.v, off, len); });
  ASSERT_EQ(es.size(), 10u);
  const uint64_t shift = (uint64_t)big - ((1ull << 32) + 100);
  const uint64_t want[] = {0, 466, 593, 722, 854, 996, 4294968508 + shift, 4294968612 + shift,
                           4294968704 + shift, 4294968794 + shift};
  for (size_t k = 0; k < 10; k++) {
    EXPECT_EQ(es[k].hdr, want[k]) << es[k].name;
    EXPECT_EQ(es[k].data % 64, 0u) << es[k].name;
  }
  EXPECT_EQ(es[5].size, (uint64_t)big);
  EXPECT_EQ(es[5].dd_len, 24u);  // size >= 4 GiB
  EXPECT_EQ(es[5].crc, 0x22222222u);
  EXPECT_EQ(es[5].dd_crc, 0x22222222u);
  EXPECT_EQ(es[4].dd_len, 16u);
  EXPECT_EQ(es[6].dd_len, 24u);  // small, but past 4 GiB
  EXPECT_FALSE(es[7].has_dd);    // empty: no descriptor
  EXPECT_EQ(es[7].flags, 0x0800);
  for (size_t i = 0; i < in.size(); i++) EXPECT_EQ(l.v.offset[i], es[4 + i].data);
}

TEST(TorchWrite, NoCrcModeLeavesTensorCrcsZero) {
  auto in = inputs(kMixed);
  Layout l;
  ASSERT_EQ(plan(in, &l, 0), 0);
  EXPECT_EQ(l.v.set_crc, nullptr);
  auto f = assemble(l.v, in);
  auto es = read_zip(f);
  for (const Entry &e : es) {
    bool tensor = e.name.find("/data/") != std::string::npos;
    uint32_t want = tensor ? 0 : ckptio_crc32(0, &f[e.data], e.size);
    EXPECT_EQ(e.crc, want) << e.name;
    if (e.has_dd) {
      EXPECT_EQ(e.dd_crc, want) << e.name;
    }
  }
}

TEST(TorchWrite, MetadataRecordAndDeterminism) {
  auto in = inputs(kMixed);
  std::vector<ckptio_kv> meta = {{"step", "12"}, {"note", "a \"q\"\n✓"}};
  Layout a, b, c;
  ASSERT_EQ(plan(in, &a, 1, meta), 0);
  ASSERT_EQ(plan(in, &b, 1, meta), 0);
  auto fa = assemble(a.v, in), fb = assemble(b.v, in);
  EXPECT_EQ(fa, fb) << "equal inputs must give equal files";
  auto es = read_zip(fa);
  auto names = expected_names("archive", in.size(), true);
  ASSERT_EQ(es.size(), names.size());
  for (size_t k = 0; k < es.size(); k++) EXPECT_EQ(es[k].name, names[k]);
  const Entry &m = es.back();
  EXPECT_EQ(std::string(fa.begin() + m.data, fa.begin() + m.data + m.size),
            "{\"step\":\"12\",\"note\":\"a \\\"q\\\"\\n✓\"}");
  meta[0].value = "13";
  ASSERT_EQ(plan(in, &c, 1, meta), 0);
  auto fc = assemble(c.v, in);
  auto sid = [](const std::vector<uint8_t> &f, const Entry &e) {
    return std::string(f.begin() + e.data, f.begin() + e.data + 40);
  };
  EXPECT_NE(sid(fa, es[in.size() + 5]), sid(fc, read_zip(fc)[in.size() + 5]));
}

TEST(TorchWrite, UnsupportedDtypesNameTheTensor) {
  for (ckptio_dtype dt : {CKPTIO_F4, CKPTIO_F6_E2M3, CKPTIO_F6_E3M2}) {
    std::vector<Tensor> ts = {{"ok", CKPTIO_F32, {2}}, {"layer.0.scale", dt, {8}}};
    auto in = inputs(ts);
    Layout l;
    std::string msg;
    EXPECT_EQ(plan(in, &l, 1, {}, "archive", &msg), CKPTIO_E_DTYPE);
    EXPECT_NE(msg.find("layer.0.scale"), std::string::npos) << msg;
    EXPECT_NE(msg.find(ckptio_dtype_name(dt)), std::string::npos) << msg;
    EXPECT_EQ(l.v.extents, nullptr);
    EXPECT_EQ(l.v.file_size, 0u);
  }
  for (int dt = 0; dt < CKPTIO_DTYPE_COUNT; dt++) {
    bool none = dt == CKPTIO_F4 || dt == CKPTIO_F6_E2M3 || dt == CKPTIO_F6_E3M2;
    EXPECT_EQ(ckptio_torch_dtype_name((ckptio_dtype)dt) == nullptr, none) << dt;
  }
}

TEST(TorchWrite, RejectsBadNamesAndArchives) {
  std::string bad = "w\xff";
  std::vector<Tensor> ts = {{bad, CKPTIO_F32, {1}}}, oks = {{"w", CKPTIO_F32, {1}}};
  auto in = inputs(ts);
  Layout l;
  EXPECT_EQ(plan(in, &l), CKPTIO_E_INVALID_ARG);
  auto ok = inputs(oks);
  EXPECT_EQ(plan(ok, &l, 1, {}, "a/b"), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(plan(ok, &l, 1, {}, "ok-name"), 0);
}

TEST(TorchWrite, ManyTensorsStayContiguous) {
  std::vector<Tensor> ts;
  for (int k = 0; k < 2001; k++) ts.push_back({"layer" + std::to_string(k), k % 2 ? CKPTIO_F8_E5M2 : CKPTIO_F16, {k % 5}});
  auto in = inputs(ts);
  Layout l;
  ASSERT_EQ(plan(in, &l), 0);
  check_extents(l.v, in);
  auto f = assemble(l.v, in);
  auto es = read_zip(f);
  ASSERT_EQ(es.size(), in.size() + 6);
  for (size_t i = 0; i < in.size(); i++) {
    EXPECT_EQ(es[4 + i].data, l.v.offset[i]);
    EXPECT_EQ(es[4 + i].crc, ckptio_crc32(0, &f[es[4 + i].data], es[4 + i].size));
  }
}

TEST(TorchWrite, FreeAcceptsZeroedAndFreedLayouts) {
  ckptio_layout l;
  memset(&l, 0, sizeof(l));
  ckptio_layout_free(&l);
  ckptio_layout_free(nullptr);
  std::vector<Tensor> ts = {{"w", CKPTIO_F32, {1}}};
  auto in = inputs(ts);
  char err[CKPTIO_ERRLEN];
  ASSERT_EQ(ckptio_torch_layout(in.data(), 1, nullptr, 0, 1, nullptr, &l, err, sizeof(err)), 0);
  ckptio_layout_free(&l);
  EXPECT_EQ(l.extents, nullptr);
  ckptio_layout_free(&l);  // twice is harmless
}

// ------------------------------------------------------------ pickle

std::string hexof(const ckptio_pickle_w &p) {
  std::string s;
  for (size_t k = 0; k < p.len; k++) {
    char b[3];
    snprintf(b, sizeof(b), "%02x", p.data[k]);
    s += b;
  }
  return s;
}

TEST(PickleWrite, IntsAsPython) {
  // pickle.dumps(v, protocol=2)[2:-1].hex() in CPython.
  const struct { int64_t v; const char *hex; } cases[] = {
      {0, "4b00"}, {255, "4bff"}, {256, "4d0001"}, {65535, "4dffff"}, {65536, "4a00000100"},
      {-1, "4affffffff"}, {-256, "4a00ffffff"}, {2147483647, "4affffff7f"},
      {2147483648, "8a050000008000"}, {-2147483648ll, "4a00000080"},
      {-2147483649ll, "8a05ffffff7fff"}, {INT64_MAX, "8a08ffffffffffffff7f"},
      {INT64_MIN, "8a080000000000000080"}, {1099511627776ll, "8a06000000000001"}};
  for (const auto &c : cases) {
    ckptio_pickle_w p;
    ckptio_pickle_w_init(&p);
    EXPECT_EQ(ckptio_pickle_w_int(&p, c.v), 0);
    EXPECT_EQ(hexof(p), c.hex) << c.v;
    ckptio_pickle_w_free(&p);
  }
}

TEST(PickleWrite, TuplesAndMemo) {
  ckptio_pickle_w p;
  ckptio_pickle_w_init(&p);
  // pickle.dumps((1, 2, 3, 4), 2) and pickle.dumps(('a',), 2)
  ckptio_pickle_w_proto(&p);
  ckptio_pickle_w_tuple_begin(&p, 4);
  for (int k = 1; k <= 4; k++) ckptio_pickle_w_int(&p, k);
  ckptio_pickle_w_tuple_end(&p, 4);
  ckptio_pickle_w_op(&p, CKPTIO_PICKLE_STOP);
  EXPECT_EQ(hexof(p), "8002284b014b024b034b047471002e");
  ckptio_pickle_w_free(&p);
  ckptio_pickle_w_init(&p);
  ckptio_pickle_w_proto(&p);
  ckptio_pickle_w_tuple_begin(&p, 1);
  ckptio_pickle_w_unicode(&p, "a", 1, nullptr);
  ckptio_pickle_w_tuple_end(&p, 1);
  ckptio_pickle_w_op(&p, CKPTIO_PICKLE_STOP);
  EXPECT_EQ(hexof(p), "800258010000006171008571012e");
  ckptio_pickle_w_free(&p);
  // Memo index 256 and up: LONG_BINPUT / LONG_BINGET.
  ckptio_pickle_w_init(&p);
  uint32_t idx = 0;
  for (int k = 0; k < 257; k++) ckptio_pickle_w_put(&p, &idx);
  EXPECT_EQ(idx, 256u);
  EXPECT_EQ(hexof(p).substr(hexof(p).size() - 10), "7200010000");
  ckptio_pickle_w_get(&p, 300);
  EXPECT_EQ(hexof(p).substr(hexof(p).size() - 10), "6a2c010000");
  ckptio_pickle_w_get(&p, 7);
  EXPECT_EQ(hexof(p).substr(hexof(p).size() - 4), "6807");
  EXPECT_EQ(p.err, 0);
  ckptio_pickle_w_free(&p);
}

TEST(PickleWrite, ItemBatches) {
  // Python: MARK ... SETITEMS per batch of 1000, SETITEM for a batch of one.
  for (size_t n : {0u, 1u, 2u, 1000u, 1001u, 2500u}) {
    ckptio_pickle_w p;
    ckptio_pickle_w_init(&p);
    size_t marks = 0, setitems = 0, setitem = 0;
    for (size_t i = 0; i < n;) {
      size_t before = p.len;
      size_t batch = ckptio_pickle_w_items_begin(&p, n - i);
      marks += p.len > before;
      i += batch;
      ckptio_pickle_w_items_end(&p, batch);
      (p.data[p.len - 1] == CKPTIO_PICKLE_SETITEMS ? setitems : setitem)++;
    }
    size_t full = n / 1000, rest = n % 1000;
    EXPECT_EQ(setitems, full + (rest > 1)) << n;
    EXPECT_EQ(setitem, (size_t)(rest == 1)) << n;
    EXPECT_EQ(marks, setitems) << n;
    ckptio_pickle_w_free(&p);
  }
}

}  // namespace
