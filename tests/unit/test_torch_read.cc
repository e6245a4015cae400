// The PyTorch reader (zip_read, pickle_read, torch_read) on archives built
// byte by byte here the way torch.save lays them out: what it indexes, every
// refusal with its code and a message naming what was found, bombs and
// overflows, and truncation / byte-flip sweeps that must fail cleanly and
// never crash (run them under ASan too: build with -DCKPTIO_SANITIZE=ON).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"
extern "C" {
#include "core/crc32.h"
#include "core/error.h"
#include "formats/index.h"
#include "formats/pickle_read.h"
#include "formats/torch_read.h"
#include "formats/torch_write.h"
#include "formats/zip_read.h"
}

namespace {

void put_le(std::string &b, uint64_t v, int n) {
  for (int k = 0; k < n; k++) b += (char)(uint8_t)(v >> (8 * k));
}

// ------------------------------------------------------------ pickles

struct Pk {
  std::string b;
  Pk &op(uint8_t c) { return b += (char)c, *this; }
  Pk &proto() { return op(0x80).op(2); }
  Pk &global(const std::string &m, const std::string &n) { return op('c'), b += m + "\n" + n + "\n", *this; }
  Pk &str(const std::string &s) { return op('X'), put_le(b, s.size(), 4), b += s, *this; }
  Pk &i(int64_t v) {
    if (v >= 0 && v < 256) return op('K').op((uint8_t)v);
    if (v >= INT32_MIN && v <= INT32_MAX) return op('J'), put_le(b, (uint64_t)v, 4), *this;
    return op(0x8a).op(8), put_le(b, (uint64_t)v, 8), *this;
  }
  Pk &f(double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    op('G');
    for (int k = 7; k >= 0; k--) b += (char)(uint8_t)(u >> (8 * k));
    return *this;
  }
  Pk &put(uint32_t k) { return op('r'), put_le(b, k, 4), *this; }
  Pk &get(uint32_t k) { return op('j'), put_le(b, k, 4), *this; }
  Pk &mark() { return op('('); }
  Pk &tuple() { return op('t'); }
  Pk &ints(const std::vector<int64_t> &v) {
    mark();
    for (int64_t x : v) i(x);
    return tuple();
  }
  Pk &odict() { return global("collections", "OrderedDict").op(')').op('R'); }
  Pk &stop() { return op('.'); }
};

struct T {  // one tensor of a state dict
  std::string name, cls, key;
  int64_t numel, offset;
  std::vector<int64_t> size, stride;
  std::string v3;  // a dtype name: _rebuild_tensor_v3 over an UntypedStorage
  T(std::string n = "", std::string c = "FloatStorage", std::string k = "0", int64_t ne = 6, int64_t off = 0,
    std::vector<int64_t> sz = {2, 3}, std::vector<int64_t> st = {3, 1}, std::string v = "")
      : name(n), cls(c), key(k), numel(ne), offset(off), size(sz), stride(st), v3(v) {}
};

Pk &tensor(Pk &p, const T &t) {
  p.global("torch._utils", t.v3.empty() ? "_rebuild_tensor_v2" : "_rebuild_tensor_v3").mark();
  p.mark().str("storage");
  if (t.v3.empty()) p.global("torch", t.cls);
  else p.global("torch.storage", "UntypedStorage");
  p.str(t.key).str("cpu").i(t.numel).tuple().op('Q');
  p.i(t.offset).ints(t.size).ints(t.stride).op(0x89).odict();
  if (!t.v3.empty()) p.global("torch", t.v3);
  return p.tuple().op('R');
}

std::string state_dict(const std::vector<T> &ts) {
  Pk p;
  p.proto().odict().mark();
  for (const T &t : ts) tensor(p.str(t.name), t);
  return p.op('u').stop().b;
}

// ------------------------------------------------------------ zips

struct ZEntry {
  std::string name, data;
  uint16_t method = 0;
  bool crc = true;
};

struct Zip {
  std::string bytes;
  uint64_t cd_offset = 0, cd_size = 0;
  std::vector<uint64_t> header, data;
};

// torch.save's layout: local header with an 'FB' extra aligning data to 64,
// data descriptor, central directory, zip64 end record + locator, EOCD.
Zip make_zip(const std::vector<ZEntry> &es, bool zip64 = true) {
  Zip z;
  std::string &b = z.bytes;
  std::vector<uint32_t> crcs;
  for (const ZEntry &e : es) {
    uint32_t crc = e.crc ? ckptio_crc32(0, e.data.data(), e.data.size()) : 0;
    crcs.push_back(crc);
    z.header.push_back(b.size());
    size_t start = b.size() + 30 + e.name.size() + 4, pad = (64 - start % 64) % 64;
    put_le(b, 0x04034b50, 4), put_le(b, 0, 2), put_le(b, e.data.empty() ? 0x0800 : 0x0808, 2);
    put_le(b, e.method, 2), put_le(b, 0, 4), put_le(b, 0, 4), put_le(b, 0, 8);
    put_le(b, e.name.size(), 2), put_le(b, 4 + pad, 2);
    b += e.name + "FB";
    put_le(b, pad, 2);
    b += std::string(pad, 'Z');
    z.data.push_back(b.size());
    b += e.data;
    if (!e.data.empty()) put_le(b, 0x08074b50, 4), put_le(b, crc, 4), put_le(b, e.data.size(), 4), put_le(b, e.data.size(), 4);
  }
  z.cd_offset = b.size();
  for (size_t i = 0; i < es.size(); i++) {
    const ZEntry &e = es[i];
    put_le(b, 0x02014b50, 4), put_le(b, 0, 4), put_le(b, e.data.empty() ? 0x0800 : 0x0808, 2);
    put_le(b, e.method, 2), put_le(b, 0, 4), put_le(b, crcs[i], 4);
    put_le(b, e.data.size(), 4), put_le(b, e.data.size(), 4), put_le(b, e.name.size(), 2);
    put_le(b, 0, 2), put_le(b, 0, 2), put_le(b, 0, 2), put_le(b, 0, 2), put_le(b, 0, 4);
    put_le(b, z.header[i], 4);
    b += e.name;
  }
  z.cd_size = b.size() - z.cd_offset;
  if (zip64) {
    uint64_t at = b.size();
    put_le(b, 0x06064b50, 4), put_le(b, 44, 8), put_le(b, 0x2d1e, 4), put_le(b, 0, 8);
    put_le(b, es.size(), 8), put_le(b, es.size(), 8), put_le(b, z.cd_size, 8), put_le(b, z.cd_offset, 8);
    put_le(b, 0x07064b50, 4), put_le(b, 0, 4), put_le(b, at, 8), put_le(b, 1, 4);
  }
  put_le(b, 0x06054b50, 4), put_le(b, 0, 4), put_le(b, es.size(), 2), put_le(b, es.size(), 2);
  put_le(b, z.cd_size, 4), put_le(b, z.cd_offset, 4), put_le(b, 0, 2);
  return z;
}

std::string bytes_of(size_t n, uint64_t seed) {
  auto v = ckptio_test::pattern(n, seed);
  return std::string(v.begin(), v.end());
}

// A torch.save archive: data.pkl, the small records, data/<key> for each
// record given (in map order), version, serialization id.
Zip archive(const std::string &pkl, const std::map<std::string, std::string> &records,
            const std::string &prefix = "archive", const std::string &byteorder = "little",
            std::vector<ZEntry> extra = {}) {
  std::vector<ZEntry> es = {{prefix + "/data.pkl", pkl}, {prefix + "/.format_version", "1"},
                            {prefix + "/.storage_alignment", "64"}};
  if (!byteorder.empty()) es.push_back({prefix + "/byteorder", byteorder});
  for (auto &r : records) es.push_back({prefix + "/data/" + r.first, r.second});
  es.push_back({prefix + "/version", "3\n"});
  es.push_back({prefix + "/.data/serialization_id", std::string(40, '1')});
  for (auto &e : extra) es.push_back(e);
  return make_zip(es);
}

struct Idx {
  ckptio_index v;
  Idx() { memset(&v, 0, sizeof(v)); }
  ~Idx() { ckptio_index_free(&v); }
  const ckptio_entry *find(const std::string &name) const {
    for (size_t i = 0; i < v.count; i++)
      if (name == v.entries[i].name) return &v.entries[i];
    return nullptr;
  }
  std::string meta(const std::string &key) const {
    for (size_t i = 0; i < v.meta_count; i++)
      if (key == v.meta[i].key) return v.meta[i].value;
    return "<absent>";
  }
};

int parse(const std::string &f, Idx *ix, std::string *msg = nullptr) {
  char err[CKPTIO_ERRLEN] = "";
  int rc = ckptio_torch_parse((const uint8_t *)f.data(), f.size(), &ix->v, err, sizeof(err));
  if (msg) *msg = err;
  if (rc < 0) {
    EXPECT_TRUE(!ix->v.count && !ix->v.entries && !ix->v.meta) << "a failed parse must leave the index empty";
    EXPECT_NE(err[0], '\0') << "a failure must say why";
  } else {
    for (size_t i = 0; i < ix->v.count; i++)
      EXPECT_LE(ix->v.entries[i].offset + ix->v.entries[i].nbytes, f.size()) << ix->v.entries[i].name;
  }
  return rc;
}

#define EXPECT_REFUSED(file, code, needle)                                   \
  do {                                                                       \
    Idx ix_;                                                                 \
    std::string m_;                                                          \
    EXPECT_EQ(parse((file), &ix_, &m_), (int)(code)) << m_;                  \
    EXPECT_NE(m_.find(needle), std::string::npos) << "message: " << m_;      \
  } while (0)

std::string one_tensor_file(const T &t, size_t record_bytes, const std::string &byteorder = "little") {
  return archive(state_dict({t}), {{t.key, bytes_of(record_bytes, 1)}}, "archive", byteorder).bytes;
}

}  // namespace

// ------------------------------------------------------------ what is read

TEST(TorchRead, FlatStateDict) {
  T w{"w"}, b{"b", "LongStorage", "1", 3, 0, {3}, {1}};
  std::string d0 = bytes_of(24, 1), d1 = bytes_of(24, 2);
  Zip z = archive(state_dict({w, b}), {{"0", d0}, {"1", d1}}, "weights");
  Idx ix;
  ASSERT_EQ(parse(z.bytes, &ix), 0);
  EXPECT_STREQ(ckptio_index_format_name(ix.v.format), "pytorch");
  ASSERT_EQ(ix.v.count, 2u);
  const ckptio_entry *e = &ix.v.entries[0];  // sorted by offset: data/0 first
  EXPECT_STREQ(e->name, "w");
  EXPECT_EQ(e->dtype, CKPTIO_F32);
  EXPECT_EQ(e->ndim, 2);
  EXPECT_EQ(e->shape[0], 2);
  EXPECT_EQ(e->shape[1], 3);
  EXPECT_EQ(e->offset, z.data[4]);
  EXPECT_EQ(e->offset % 64, 0u);
  EXPECT_EQ(e->nbytes, 24u);
  EXPECT_EQ(e->strided, 0);
  EXPECT_EQ(e->has_crc, 1);
  EXPECT_EQ(e->crc, ckptio_crc32(0, d0.data(), 24));
  EXPECT_EQ(e->byteswap, 0);
  EXPECT_EQ(ix.v.header_bytes, e->offset);
  e = &ix.v.entries[1];
  EXPECT_STREQ(e->name, "b");
  EXPECT_EQ(e->dtype, CKPTIO_I64);
  EXPECT_EQ(e->crc, ckptio_crc32(0, d1.data(), 24));
}

TEST(TorchRead, ViewsScalarsAndEmpty) {
  // One 12-float storage: a contiguous row at an offset, its transpose, a
  // 0-d element; plus an empty tensor over an empty record.
  T row{"row", "FloatStorage", "0", 12, 4, {4}, {1}};
  T tr{"t", "FloatStorage", "0", 12, 0, {4, 3}, {1, 4}};
  T sc{"s", "FloatStorage", "0", 12, 11, {}, {}};
  T em{"e", "HalfStorage", "1", 0, 0, {0, 5}, {5, 1}};
  Zip z = archive(state_dict({row, tr, sc, em}), {{"0", bytes_of(48, 3)}, {"1", ""}});
  Idx ix;
  ASSERT_EQ(parse(z.bytes, &ix), 0);
  ASSERT_EQ(ix.v.count, 4u);
  const ckptio_entry *e = ix.find("row");
  EXPECT_EQ(e->strided, 0);
  EXPECT_EQ(e->offset, z.data[4] + 16);
  EXPECT_EQ(e->nbytes, 16u);
  EXPECT_EQ(e->has_crc, 0) << "a part of a record has no CRC of its own";
  e = ix.find("t");
  EXPECT_EQ(e->strided, 1);
  EXPECT_EQ(e->offset, z.data[4]);
  EXPECT_EQ(e->nbytes, 48u);
  EXPECT_EQ(e->stride[0], 1);
  EXPECT_EQ(e->stride[1], 4);
  EXPECT_EQ(e->has_crc, 1);
  e = ix.find("s");
  EXPECT_EQ(e->ndim, 0);
  EXPECT_EQ(e->offset, z.data[4] + 44);
  EXPECT_EQ(e->nbytes, 4u);
  e = ix.find("e");
  EXPECT_EQ(e->dtype, CKPTIO_F16);
  EXPECT_EQ(e->nbytes, 0u);
  EXPECT_EQ(e->has_crc, 1) << "the CRC of nothing is 0, and recorded";
  // Sorted by offset, then name: e (data/1 is later) last.
  EXPECT_STREQ(ix.v.entries[0].name, "t");
  EXPECT_STREQ(ix.v.entries[3].name, "e");
}

TEST(TorchRead, NestedCheckpoint) {
  Pk p;
  p.proto().op('}').mark();
  p.str("model").op('}').mark().str("w");
  tensor(p, T{"w"}).op('u');
  p.str("optimizer").op('}').mark();
  p.str("state").op('}').i(0).op('}').str("exp_avg");
  tensor(p, T{"", "FloatStorage", "1"}).op('s').op('s');
  p.str("param_groups").op(']').op('}').mark().str("lr").f(0.1).str("params").op(']').mark().i(0).i(1);
  p.op('e').str("betas").f(0.9).f(0.999).op(0x86).str("nesterov").op(0x89).str("foreach").op('N');
  p.op('u').op('a').op('u');
  p.str("step").i(10).str("lr").f(1e-05).str("name").str("run-7").str("seed").op(0x8a).op(9);
  put_le(p.b, 0xfffffffffffffffbull, 8);
  p.b += '\0';
  p.str("big").f(1e16).str("neg").f(-0.0);
  p.str("tags").global("__builtin__", "set").op(']').mark().i(1).i(2).op('e').op(0x85).op('R');
  p.str("empty_set").op(0x8f).str("blob").global("_codecs", "encode").str("ab").str("latin1").op(0x86).op('R');
  p.str("dev").global("torch", "device").str("cuda").i(0).op(0x86).op('R').op('u').stop();
  Zip z = archive(p.b, {{"0", bytes_of(24, 4)}, {"1", bytes_of(24, 5)}});
  Idx ix;
  std::string msg;
  ASSERT_EQ(parse(z.bytes, &ix, &msg), 0) << msg;
  ASSERT_EQ(ix.v.count, 2u);
  EXPECT_NE(ix.find("model.w"), nullptr);
  EXPECT_NE(ix.find("optimizer.state.0.exp_avg"), nullptr);
  EXPECT_EQ(ix.meta("optimizer.param_groups.0.lr"), "0.1");
  EXPECT_EQ(ix.meta("optimizer.param_groups.0.params.1"), "1");
  EXPECT_EQ(ix.meta("optimizer.param_groups.0.betas.1"), "0.999");
  EXPECT_EQ(ix.meta("optimizer.param_groups.0.nesterov"), "False");
  EXPECT_EQ(ix.meta("optimizer.param_groups.0.foreach"), "None");
  EXPECT_EQ(ix.meta("step"), "10");
  EXPECT_EQ(ix.meta("lr"), "1e-05");
  EXPECT_EQ(ix.meta("name"), "run-7");
  EXPECT_EQ(ix.meta("seed"), "18446744073709551611");
  EXPECT_EQ(ix.meta("big"), "1e+16");
  EXPECT_EQ(ix.meta("neg"), "-0.0");
  EXPECT_EQ(ix.v.meta_count, 13u) << "sets, bytes and devices name nothing";
}

TEST(TorchRead, ParameterBuildMetadataAndMemo) {
  // state_dict(): an OrderedDict whose _metadata attribute arrives by BUILD;
  // a Parameter; a tied weight (the same tensor twice through the memo).
  Pk p;
  p.proto().odict().mark().str("p").global("torch._utils", "_rebuild_parameter").mark();
  tensor(p, T{}).put(7).op(0x88).odict().tuple().op('R');
  p.str("tied").get(7).op('u').op('}').str("_metadata").odict().op('s').op('b').stop();
  Idx ix;
  ASSERT_EQ(parse(archive(p.b, {{"0", bytes_of(24, 6)}}).bytes, &ix), 0);
  ASSERT_EQ(ix.v.count, 2u);
  EXPECT_EQ(ix.find("p")->offset, ix.find("tied")->offset);
  EXPECT_EQ(ix.v.meta_count, 0u) << "BUILD state is attributes, not items";
}

TEST(TorchRead, NewDtypesAndByteorder) {
  T f8{"f8", "", "0", 6, 0, {6}, {1}, "float8_e4m3fn"};
  T u16{"u16", "", "1", 8, 1, {3}, {1}, "uint16"};  // storage numel counts bytes
  Zip z = archive(state_dict({f8, u16}), {{"0", bytes_of(6, 7)}, {"1", bytes_of(8, 8)}}, "archive", "big");
  Idx ix;
  ASSERT_EQ(parse(z.bytes, &ix), 0);
  EXPECT_EQ(ix.find("f8")->dtype, CKPTIO_F8_E4M3);
  EXPECT_EQ(ix.find("f8")->byteswap, 0) << "one-byte elements never swap";
  EXPECT_EQ(ix.find("u16")->dtype, CKPTIO_U16);
  EXPECT_EQ(ix.find("u16")->offset, z.data[5] + 2) << "v3 offsets count elements of the dtype";
  EXPECT_EQ(ix.find("u16")->byteswap, 1);
  // A view past an untyped storage's last whole element.
  T over{"o", "", "0", 7, 2, {2}, {1}, "uint16"};
  EXPECT_REFUSED(one_tensor_file(over, 7), CKPTIO_E_TENSOR_INFO, "reaches element 3");
  EXPECT_REFUSED(one_tensor_file(T{"w"}, 24, "middle"), CKPTIO_E_FORMAT, "neither 'little' nor 'big'");
  EXPECT_REFUSED(one_tensor_file(T{"c", "ComplexDoubleStorage", "0", 6}, 96), CKPTIO_E_DTYPE,
                 "dtype torch.complex128 has no ckptio equivalent");
  EXPECT_REFUSED(one_tensor_file(T{"q", "", "0", 6, 0, {6}, {1}, "float4_e2m1fn_x2"}, 6), CKPTIO_E_DTYPE,
                 "torch.float4_e2m1fn_x2");
}

TEST(TorchRead, OlderAndRarerForms) {
  // _rebuild_tensor (4 args) over a CUDA storage class; _v2 over an
  // UntypedStorage is bytes; metadata bits that are all false; Counter;
  // NEWOBJ of an OrderedDict; SHORT_BINSTRING keys; the other int opcodes.
  Pk p;
  p.proto().op('}').mark();
  p.op('U').op(2).b += "v1";
  p.global("torch._utils", "_rebuild_tensor").mark().mark().str("storage").global("torch.cuda", "IntStorage");
  p.str("0").str("cuda:0").i(6).tuple().op('Q').i(0).ints({6}).ints({1}).tuple().op('R');
  p.str("u8").global("torch._utils", "_rebuild_tensor_v2").mark().mark().str("storage");
  p.global("torch.storage", "UntypedStorage").str("1").str("cpu").i(5).tuple().op('Q');
  p.i(1).ints({4}).ints({1}).op(0x88).odict().op('}').str("conj").op(0x89).op('s').tuple().op('R');
  p.str("c").global("collections", "Counter").op('}').str("x").i(3).op('s').op(0x85).op('R');
  p.str("n").global("collections", "OrderedDict").op(')').op(0x81).str("y").op('M').op(0x34).op(0x12).op('s');
  p.str("j").i(-5).str("l").op(0x8a).op(2).op(0xff).op(0x7f).str("z").op(0x8a).op(0).op('u').stop();
  Idx ix;
  std::string msg;
  ASSERT_EQ(parse(archive(p.b, {{"0", bytes_of(24, 1)}, {"1", bytes_of(5, 2)}}).bytes, &ix, &msg), 0) << msg;
  EXPECT_EQ(ix.find("v1")->dtype, CKPTIO_I32);
  EXPECT_EQ(ix.find("u8")->dtype, CKPTIO_U8);
  EXPECT_EQ(ix.find("u8")->nbytes, 4u);
  EXPECT_EQ(ix.meta("c.x"), "3");
  EXPECT_EQ(ix.meta("n.y"), "4660");
  EXPECT_EQ(ix.meta("j"), "-5");
  EXPECT_EQ(ix.meta("l"), "32767");
  EXPECT_EQ(ix.meta("z"), "0");
  // A conj view saved as such: its bytes are not its values.
  Pk c;
  c.proto().global("torch._utils", "_rebuild_tensor_v2").mark().mark().str("storage").global("torch", "FloatStorage");
  c.str("0").str("cpu").i(6).tuple().op('Q').i(0).ints({6}).ints({1}).op(0x89).odict();
  c.op('}').str("conj").op(0x88).op('s').tuple().op('R').stop();
  EXPECT_REFUSED(archive(c.b, {{"0", bytes_of(24, 1)}}).bytes, CKPTIO_E_FORMAT, "conj or neg bit");
}

TEST(TorchRead, PlainZipEndAndCrcZero) {
  std::string pkl = state_dict({T{"w"}});
  Zip z = make_zip({{"x/data.pkl", pkl}, {"x/data/0", bytes_of(24, 9), 0, false}}, false);
  Idx ix;
  ASSERT_EQ(parse(z.bytes, &ix), 0);
  EXPECT_EQ(ix.find("w")->has_crc, 0) << "crc 0 with data means not recorded";
}

// ------------------------------------------------------------ other files

TEST(TorchRead, RefusesOtherKindsOfFile) {
  EXPECT_REFUSED(std::string("\x7f" "ELF\x02\x01\x01", 7), CKPTIO_E_FORMAT, "starts with 7f 45 4c 46");
  EXPECT_REFUSED(std::string("PK"), CKPTIO_E_FORMAT, "only 2 bytes");
  EXPECT_REFUSED(std::string(), CKPTIO_E_FORMAT, "only 0 bytes");
  EXPECT_REFUSED(std::string("PYTORCH1") + std::string(100, '\0'), CKPTIO_E_FORMAT, "preview release");
  std::string legacy("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19\x2e\x80\x02M\xe9\x03.", 21);
  EXPECT_REFUSED(legacy, CKPTIO_E_FORMAT, "legacy (pre-1.6) torch.save format is not supported");
  std::string tar(1024, '\0');
  memcpy(&tar[257], "ustar", 5);
  EXPECT_REFUSED(tar, CKPTIO_E_FORMAT, "tar archive");
  EXPECT_REFUSED(Pk().proto().op('N').stop().b, CKPTIO_E_FORMAT, "a pickle stream");
  std::string pkl = state_dict({T{"w"}});
  Zip ts = archive(pkl, {{"0", bytes_of(24, 1)}}, "archive", "little",
                   {{"archive/constants.pkl", Pk().proto().op(')').stop().b}, {"archive/code/m.py", "x", 8}});
  EXPECT_REFUSED(ts.bytes, CKPTIO_E_FORMAT, "TorchScript archive");  // before its compressed code
  EXPECT_REFUSED(make_zip({{"data.pkl", pkl}}).bytes, CKPTIO_E_FORMAT, "is not in a folder");
  EXPECT_REFUSED(make_zip({{"a/other", pkl}}).bytes, CKPTIO_E_FORMAT, "no record 'a/data.pkl'");
  Zip comp = make_zip({{"a/data.pkl", pkl}, {"a/data/0", bytes_of(24, 1), 8}});
  EXPECT_REFUSED(comp.bytes, CKPTIO_E_FORMAT, "compressed entry 'a/data/0' (method 8) is not supported");
  std::string enc = make_zip({{"a/data.pkl", pkl}}).bytes;
  enc[make_zip({{"a/data.pkl", pkl}}).cd_offset + 8] |= 1;
  EXPECT_REFUSED(enc, CKPTIO_E_FORMAT, "encrypted entry 'a/data.pkl'");
  EXPECT_REFUSED(std::string("PK\x05\x06", 4) + std::string(18, '\0'), CKPTIO_E_ZIP, "does not contain any files");
}

// ------------------------------------------------------------ corrupt zips

TEST(TorchRead, ZipOpenOnItsOwn) {
  Zip z = make_zip({{"a/x", "hello"}, {"a/y", bytes_of(100, 3), 8}});
  ckptio_zip zip;
  char err[CKPTIO_ERRLEN];
  const uint8_t *m = (const uint8_t *)z.bytes.data();
  EXPECT_EQ(ckptio_zip_open(m, z.bytes.size(), 0, &zip, err, sizeof(err)), CKPTIO_E_FORMAT);
  EXPECT_STREQ(err, "compressed entry 'a/y' (method 8) is not supported: ckptio reads only stored "
                    "entries, as torch.save writes them");
  EXPECT_EQ(zip.count, 0u);
  ASSERT_EQ(ckptio_zip_open(m, z.bytes.size(), CKPTIO_ZIP_ALLOW_COMPRESSED, &zip, err, sizeof(err)), 0) << err;
  EXPECT_EQ(ckptio_zip_require_stored(&zip, err, sizeof(err)), CKPTIO_E_FORMAT);
  EXPECT_NE(strstr(err, "'a/y' (method 8)"), nullptr);
  ASSERT_EQ(zip.count, 2u);
  EXPECT_EQ(zip.zip64, 1);
  const ckptio_zip_entry *e = ckptio_zip_find(&zip, "a/x");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->data_offset, z.data[0]);
  EXPECT_EQ(e->size, 5u);
  EXPECT_EQ(e->crc, ckptio_crc32(0, "hello", 5));
  EXPECT_EQ(ckptio_zip_find(&zip, "a/z"), nullptr);
  EXPECT_EQ(ckptio_zip_find(&zip, "a/"), nullptr);
  ckptio_zip_free(&zip);
  ckptio_zip_free(&zip);  // twice, and NULL, are fine
  ckptio_zip_free(nullptr);
  ckptio_index empty;
  memset(&empty, 0, sizeof(empty));
  ckptio_index_free(&empty);
  ckptio_index_free(nullptr);
}

TEST(TorchRead, CorruptZip) {
  std::string pkl = state_dict({T{"w"}});
  Zip z = archive(pkl, {{"0", bytes_of(24, 1)}});
  auto with = [&](uint64_t at, uint64_t v, int n) {
    std::string f = z.bytes;
    for (int k = 0; k < n; k++) f[at + k] = (char)(uint8_t)(v >> (8 * k));
    return f;
  };
  size_t cd4 = z.cd_offset;  // central entry of data.pkl
  EXPECT_REFUSED(with(cd4 + 20, 100000, 4), CKPTIO_E_ZIP, "compressed size 100000 but size");
  EXPECT_REFUSED(with(cd4 + 20, 100000, 4).replace(cd4 + 24, 4, std::string("\xa0\x86\x01\x00", 4)),
                 CKPTIO_E_ZIP, "run past the start of the central directory");
  EXPECT_REFUSED(with(cd4 + 42, z.header[1], 4), CKPTIO_E_ZIP, "names a different file");
  EXPECT_REFUSED(with(z.header[1], 0, 4), CKPTIO_E_ZIP, "no local header signature");
  EXPECT_REFUSED(with(z.header[1] + 8, 8, 2), CKPTIO_E_ZIP, "local header says method 8");
  EXPECT_REFUSED(with(cd4, 0, 4), CKPTIO_E_ZIP, "missing its signature");
  // Two names that point at one local header: the same bytes twice.
  std::string a = bytes_of(24, 1);
  Zip dup = make_zip({{"a/data.pkl", pkl}, {"a/data/0", a}, {"a/data/1", a}});
  std::string f = dup.bytes;
  uint64_t e2 = dup.cd_offset + (46 + 10) + (46 + 8);  // third central entry
  for (int k = 0; k < 4; k++) f[e2 + 42 + k] = (char)(uint8_t)(dup.header[1] >> (8 * k));
  EXPECT_REFUSED(f, CKPTIO_E_ZIP, "names a different file");
  f[e2 + 46 + 7] = '0';  // rename a/data/1 to a/data/0: now it matches
  EXPECT_REFUSED(f, CKPTIO_E_ZIP, "overlap");
  Zip twice = make_zip({{"a/data.pkl", pkl}, {"a/data/0", a}, {"a/data/0", a}});
  EXPECT_REFUSED(twice.bytes, CKPTIO_E_ZIP, "entry 'a/data/0' appears twice");
  // Central directory sizes and counts that disagree with the end records.
  uint64_t eocd = z.bytes.size() - 22, z64 = eocd - 20 - 56;
  EXPECT_REFUSED(with(z64 + 40, z.cd_size - 1, 8), CKPTIO_E_ZIP, "disagree");
  EXPECT_REFUSED(with(z64 + 40, z.cd_size - 1, 8).replace(eocd + 12, 4, std::string(4, '\xff')), CKPTIO_E_ZIP,
                 "run");
  EXPECT_REFUSED(with(eocd + 20, 5, 2), CKPTIO_E_ZIP, "no end of central directory");
  EXPECT_REFUSED(with(eocd - 20 + 8, 12345678, 8), CKPTIO_E_ZIP, "zip64 locator points at byte 12345678");
  EXPECT_REFUSED(with(eocd - 20 + 16, 2, 4), CKPTIO_E_FORMAT, "multi-disk");
}

TEST(TorchRead, TruncatedAnywhere) {
  Zip z = archive(state_dict({T{"w"}, T{"v", "FloatStorage", "1"}}), {{"0", bytes_of(24, 1)}, {"1", bytes_of(24, 2)}});
  for (size_t cut = 0; cut < z.bytes.size(); cut++) {
    Idx ix;
    EXPECT_LT(parse(z.bytes.substr(0, cut), &ix), 0) << "cut at " << cut;
  }
  // The directory's size field, every smaller value, in both end records.
  for (uint64_t s = 0; s < z.cd_size; s++) {
    std::string f = z.bytes;
    uint64_t eocd = f.size() - 22, z64 = eocd - 76;
    for (int k = 0; k < 8; k++) f[z64 + 40 + k] = (char)(uint8_t)(s >> (8 * k));
    for (int k = 0; k < 4; k++) f[eocd + 12 + k] = (char)(uint8_t)(s >> (8 * k));
    Idx ix;
    EXPECT_LT(parse(f, &ix), 0) << "cd size " << s;
  }
}

// ------------------------------------------------------------ the pickle

TEST(TorchRead, ForbiddenOpcodes) {
  const struct { uint8_t op; const char *name; } ops[] = {
      {0x93, "STACK_GLOBAL"}, {0x8c, "SHORT_BINUNICODE"}, {0x8d, "BINUNICODE8"}, {0x94, "MEMOIZE"},
      {0x95, "FRAME"},        {0x90, "ADDITEMS"},         {'i', "INST"},          {'o', "OBJ"},
      {'B', "BINBYTES"},      {0x82, "EXT1"},             {'P', "PERSID"},        {'S', "STRING"},
      {0x92, "NEWOBJ_EX"},    {'2', "DUP"},               {'0', "POP"},           {0xff, "unknown"}};
  for (auto &o : ops) {
    char want[96];
    snprintf(want, sizeof(want), "pickle opcode 0x%02x (%s) at byte 2 is not allowed", o.op, o.name);
    std::string pkl = Pk().proto().op(o.op).b + std::string(16, 'N') + ".";
    EXPECT_REFUSED(archive(pkl, {}).bytes, CKPTIO_E_PICKLE, want);
  }
}

TEST(TorchRead, ForbiddenGlobals) {
  const char *bad[][2] = {{"os", "system"},       {"posix", "system"},    {"nt", "system"},
                          {"sys", "exit"},        {"builtins", "eval"},   {"__builtin__", "eval"},
                          {"subprocess", "Popen"}, {"builtins", "getattr"}, {"torch", "load"},
                          {"torch._utils", "_rebuild_tensor_v9"}, {"collections", "defaultdict"},
                          {"builtins", "frozenset"}};
  for (auto &g : bad) {
    // What `class X: __reduce__ = lambda s: (os.system, ("echo pwned",))` pickles to.
    std::string pkl = Pk().proto().global(g[0], g[1]).str("echo pwned").op(0x85).op('R').stop().b;
    std::string mod = strcmp(g[0], "__builtin__") ? g[0] : "builtins";  // as torch maps it
    std::string want = "pickle global '" + mod + "." + g[1] + "' is not allowed";
    EXPECT_REFUSED(archive(pkl, {}).bytes, CKPTIO_E_PICKLE, want);
  }
  // Allowed by torch, not representable here: refused as unsupported.
  std::string q = Pk().proto().global("torch._utils", "_rebuild_qtensor").op(')').op('R').stop().b;
  EXPECT_REFUSED(archive(q, {}).bytes, CKPTIO_E_FORMAT, "'torch._utils._rebuild_qtensor' is allowed by torch but not supported");
  // Only rebuild functions are callable, and BUILD only on an OrderedDict.
  EXPECT_REFUSED(archive(Pk().proto().i(1).op(')').op('R').stop().b, {}).bytes, CKPTIO_E_PICKLE, "REDUCE calls a int");
  EXPECT_REFUSED(archive(Pk().proto().op('}').op('}').op('b').stop().b, {}).bytes, CKPTIO_E_PICKLE,
                 "BUILD on a dict is not allowed");
  EXPECT_REFUSED(archive(Pk().proto().op(')').i(1).op('a').stop().b, {}).bytes, CKPTIO_E_PICKLE,
                 "APPEND on a tuple is not allowed");
  std::string pid = Pk().proto().mark().str("module").str("x").tuple().op('Q').stop().b;
  EXPECT_REFUSED(archive(pid, {}).bytes, CKPTIO_E_PICKLE, "only storages are allowed");
}

TEST(TorchRead, Bombs) {
  auto refused = [](const std::string &pkl, int code, const char *needle) {
    EXPECT_REFUSED(archive(pkl, {}).bytes, code, needle);
  };
  refused(Pk().proto().op('N').put(0xfffffff0u).stop().b, CKPTIO_E_PICKLE, "memo index 4294967280");
  refused(Pk().proto().get(3).stop().b, CKPTIO_E_PICKLE, "memo 3 is unset");
  refused(Pk().proto().b + std::string(1000, '(') + "N.", CKPTIO_E_PICKLE, "MARKs nested deeper than 128");
  refused(Pk().proto().b + std::string(CKPTIO_PICKLE_MAX_STACK + 1, 'N') + ".", CKPTIO_E_PICKLE,
          "stack deeper than");
  // Lists nested 1000 deep without a MARK: caught on the walk.
  Pk deep;
  deep.proto();
  for (int k = 0; k < 1000; k++) deep.op(']');
  for (int k = 0; k < 999; k++) deep.op('a');
  refused(deep.stop().b, CKPTIO_E_PICKLE, "containers nested too deep");
  // A list inside itself.
  refused(Pk().proto().op(']').put(0).get(0).op('a').stop().b, CKPTIO_E_PICKLE, "a container contains itself");
  // Billion laughs: each level holds the one below twice.
  Pk laughs;
  laughs.proto().op(']').i(1).op('a').put(0);
  for (uint32_t k = 1; k < 60; k++) laughs.op(']').mark().get(k - 1).get(k - 1).op('e').put(k);
  refused(laughs.stop().b, CKPTIO_E_PICKLE, "shared containers expand");
  // Strings and truncation.
  std::string huge = Pk().proto().op('X').b;
  put_le(huge, 0xffffffffu, 4);
  refused(huge, CKPTIO_E_PICKLE, "over the limit");
  refused(Pk().proto().str("abc").b.substr(0, 8), CKPTIO_E_PICKLE, "runs past the end");
  refused(Pk().proto().op('N').b, CKPTIO_E_PICKLE, "without STOP");
  refused(Pk().proto().stop().b, CKPTIO_E_PICKLE, "STOP finds the stack empty");
  refused(Pk().proto().op('t').stop().b, CKPTIO_E_PICKLE, "no MARK");
  refused(Pk().proto().op('}').mark().i(1).op('u').stop().b, CKPTIO_E_PICKLE, "odd number");
  refused(Pk().proto().mark().op('R').stop().b, CKPTIO_E_PICKLE, "stack empty");
}

// ------------------------------------------------------------ tensor checks

TEST(TorchRead, StoragesAndViews) {
  EXPECT_REFUSED(one_tensor_file(T{"w", "FloatStorage", "0", 6, 1}, 24), CKPTIO_E_TENSOR_INFO,
                 "tensor 'w' reaches element 6 of record 'archive/data/0', which holds 6");
  EXPECT_REFUSED(one_tensor_file(T{"w", "FloatStorage", "0", 6, 0, {3, 3}, {3, 1}}, 24), CKPTIO_E_TENSOR_INFO,
                 "reaches element 8");
  EXPECT_REFUSED(one_tensor_file(T{"w"}, 20), CKPTIO_E_TENSOR_INFO,
                 "record 'archive/data/0' holds 20 bytes but storage '0' of 6 x float32 needs 24");
  EXPECT_REFUSED(archive(state_dict({T{"w"}}), {{"7", bytes_of(24, 1)}}).bytes, CKPTIO_E_NOT_FOUND,
                 "storage '0' has no record 'archive/data/0'");
  EXPECT_REFUSED(archive(state_dict({T{"a"}, T{"b", "IntStorage"}}), {{"0", bytes_of(24, 1)}}).bytes,
                 CKPTIO_E_DTYPE, "storage '0' is used as float32 and as int32");
  EXPECT_REFUSED(archive(state_dict({T{"a"}, T{"b", "FloatStorage", "0", 5, 0, {5}, {1}}}), {{"0", bytes_of(24, 1)}}).bytes,
                 CKPTIO_E_TENSOR_INFO, "storage '0' is 24 bytes");
  const int64_t big = INT64_C(1) << 62;
  EXPECT_REFUSED(one_tensor_file(T{"w", "FloatStorage", "0", 6, 0, {big, big}, {1, 1}}, 24), CKPTIO_E_OVERFLOW,
                 "shape overflows");
  EXPECT_REFUSED(one_tensor_file(T{"w", "FloatStorage", "0", 6, 0, {5, 2}, {INT64_MAX, 1}}, 24), CKPTIO_E_OVERFLOW,
                 "overflows 64 bits");
  EXPECT_REFUSED(one_tensor_file(T{"w", "FloatStorage", "0", 6, INT64_MAX, {3}, {INT64_MAX}}, 24),
                 CKPTIO_E_OVERFLOW, "overflows 64 bits");
  EXPECT_REFUSED(one_tensor_file(T{"w", "FloatStorage", "0", 6, 0, {3, 2}, {big, big}}, 24), CKPTIO_E_TENSOR_INFO,
                 "reaches element");
  EXPECT_REFUSED(one_tensor_file(T{"w", "FloatStorage", "0", 6, 0, {-1}, {1}}, 24), CKPTIO_E_SHAPE, "negative");
  EXPECT_REFUSED(one_tensor_file(T{"w", "FloatStorage", "0", 6, 0, {1, 1, 1, 1, 1, 1, 1, 1, 6}, {6, 6, 6, 6, 6, 6, 6, 6, 1}}, 24),
                 CKPTIO_E_SHAPE, "9 dims");
  EXPECT_REFUSED(one_tensor_file(T{"w", "FloatStorage", "0", INT64_MAX}, 24), CKPTIO_E_OVERFLOW, "overflow 64 bits");
  // An empty view may point anywhere: it reads nothing.
  Idx ix;
  ASSERT_EQ(parse(one_tensor_file(T{"w", "FloatStorage", "0", 6, 1000, {0}, {1}}, 24), &ix), 0);
  EXPECT_EQ(ix.find("w")->nbytes, 0u);
  // Two tensors that end up with one name.
  Pk p;
  p.proto().op('}').mark().str("a.b");
  tensor(p, T{}).str("a").op('}').str("b");
  tensor(p, T{}).op('s').op('u').stop();
  EXPECT_REFUSED(archive(p.b, {{"0", bytes_of(24, 1)}}).bytes, CKPTIO_E_DUPLICATE, "two tensors named 'a.b'");
  Pk k;
  k.proto().op('}').op(')').i(1).op('s').stop();
  EXPECT_REFUSED(archive(k.b, {}).bytes, CKPTIO_E_FORMAT, "a dict key under '' is a tuple");
}

// ------------------------------------------------------------ records, numpy, given pickles

// A nested checkpoint as save_checkpoint pickles it: a tuple-keyed dict (no
// dotted name can hold it), a view and a whole tensor over storage 0,
// storage 1 of another dtype.
std::string nested_pickle() {
  Pk p;
  p.proto().op('}').mark();
  p.mark().i(1).i(2).tuple();
  tensor(p, T{"", "FloatStorage", "0", 6, 0, {2, 3}, {3, 1}});
  p.str("list").op(']').mark();
  tensor(p, T{"", "FloatStorage", "0", 6, 1, {2}, {3}});
  tensor(p, T{"", "LongStorage", "1", 2, 0, {2}, {1}});
  p.op('e');
  return p.op('u').stop().b;
}

int parse_records(const std::string &f, Idx *ix, std::string *msg) {
  char err[CKPTIO_ERRLEN] = "";
  int rc = ckptio_torch_parse_flags((const uint8_t *)f.data(), f.size(), CKPTIO_TORCH_RECORDS, &ix->v, err,
                                    sizeof(err));
  *msg = err;
  return rc;
}

TEST(TorchRead, RecordsOfANestedCheckpoint) {
  Zip z = archive(nested_pickle(), {{"0", bytes_of(24, 1)}, {"1", bytes_of(16, 2)}});
  Idx flat;
  std::string msg;
  EXPECT_EQ(parse(z.bytes, &flat, &msg), CKPTIO_E_FORMAT) << "a tuple key names no tensor";
  Idx ix;
  ASSERT_EQ(parse_records(z.bytes, &ix, &msg), 0) << msg;
  ASSERT_EQ(ix.v.count, 3u);  // data.pkl and each storage once, in file order
  const ckptio_entry *pkl = ix.find("data.pkl"), *s0 = ix.find("data/0"), *s1 = ix.find("data/1");
  ASSERT_TRUE(pkl && s0 && s1);
  EXPECT_EQ(pkl->offset, z.data[0]);
  EXPECT_EQ(s0->nbytes, 24u);
  EXPECT_EQ(s1->nbytes, 16u);
  EXPECT_EQ(s0->dtype, CKPTIO_U8);
  EXPECT_EQ(s0->shape[0], 24);
  EXPECT_TRUE(s0->has_crc);
  EXPECT_EQ(s0->crc, ckptio_crc32(0, z.bytes.data() + s0->offset, 24));
  EXPECT_EQ(std::string(z.bytes, s1->offset, 16), bytes_of(16, 2));
  // Every check of a plain open still holds: a view past its record, a
  // record missing, a big-endian archive.
  std::string over = nested_pickle();
  Zip short_rec = archive(over, {{"0", bytes_of(24, 1)}, {"1", bytes_of(8, 2)}});
  Idx a, b, c;
  EXPECT_EQ(parse_records(short_rec.bytes, &a, &msg), CKPTIO_E_TENSOR_INFO) << msg;
  EXPECT_EQ(parse_records(archive(over, {{"0", bytes_of(24, 1)}}).bytes, &b, &msg), CKPTIO_E_NOT_FOUND) << msg;
  Pk v;
  v.proto();
  tensor(v, T{"", "FloatStorage", "0", 6, 4, {2}, {3}}).stop();
  EXPECT_EQ(parse_records(archive(v.b, {{"0", bytes_of(24, 1)}}).bytes, &c, &msg), CKPTIO_E_TENSOR_INFO) << msg;
  EXPECT_NE(msg.find("the tensor at pickle byte"), std::string::npos) << msg;
  Idx d;
  EXPECT_EQ(parse_records(archive(state_dict({T{"w"}}), {{"0", bytes_of(24, 1)}}, "archive", "big").bytes, &d, &msg),
            CKPTIO_E_FORMAT);
  EXPECT_NE(msg.find("big-endian"), std::string::npos) << msg;
}

// numpy.random.get_state()'s array, as protocol 2 pickles it: reducers
// kept as opaque values, each state taken by one BUILD.
TEST(TorchRead, NumpyArraysAreOpaqueValues) {
  auto ndarray = [](Pk &p, int builds) {
    p.global("numpy._core.multiarray", "_reconstruct").global("numpy", "ndarray").i(0).op(0x85).str("b").op(0x87).op('R');
    p.mark().i(1).ints({3}).global("numpy", "dtype").str("u4").op(0x89).op(0x88).op(0x87).op('R');
    p.mark().i(3).str("<").op('N').op('N').op('N').i(-1).i(-1).i(0).tuple().op('b');
    p.op(0x89).str(std::string(12, 'x')).tuple();
    for (int k = 0; k < builds; k++) p.op('b');
    return std::ref(p);
  };
  Pk ok;
  ok.proto().op('}').str("rng");
  ndarray(ok, 1);
  ok.op('s').str("w");
  tensor(ok, T{}).op('s').stop();
  Idx ix;
  std::string msg;
  ASSERT_EQ(parse(archive(ok.b, {{"0", bytes_of(24, 1)}}).bytes, &ix, &msg), 0) << msg;
  EXPECT_EQ(ix.v.count, 1u);  // the tensor; the array names nothing
  Pk twice;
  twice.proto();
  ndarray(twice, 1).get().op(')').op('b').stop();  // a second state for the same array
  EXPECT_REFUSED(archive(twice.b, {}).bytes, CKPTIO_E_PICKLE, "BUILD on a object is not allowed");
  Pk newobj;
  newobj.proto().global("numpy", "ndarray").op(')').op(0x81).stop();
  EXPECT_REFUSED(archive(newobj.b, {}).bytes, CKPTIO_E_FORMAT, "numpy.ndarray");
}

// ckptio_torch_layout_pickle: the caller's data.pkl, checked before any
// byte is planned.
TEST(TorchRead, GivenPickleIsCheckedAgainstTheInputs) {
  int64_t six[] = {6}, two[] = {2};
  ckptio_layout_input in[] = {{"0", CKPTIO_U8, 1, six, 24}, {"1", CKPTIO_U8, 1, two, 16}};
  auto layout = [&](const std::string &pkl, std::string *msg) {
    ckptio_layout l;
    char err[CKPTIO_ERRLEN] = "";
    int rc = ckptio_torch_layout_pickle(in, 2, (const uint8_t *)pkl.data(), pkl.size(), nullptr, 0, 1, "a", &l,
                                        err, sizeof(err));
    *msg = err;
    if (rc == 0) ckptio_layout_free(&l);
    return rc;
  };
  std::string msg;
  EXPECT_EQ(layout(nested_pickle(), &msg), 0) << msg;
  Pk wrong_key;
  wrong_key.proto();
  tensor(wrong_key, T{"", "FloatStorage", "5"}).stop();
  EXPECT_EQ(layout(wrong_key.b, &msg), CKPTIO_E_INVALID_ARG);
  EXPECT_NE(msg.find("names storage '5'"), std::string::npos) << msg;
  Pk wrong_size;
  wrong_size.proto();
  tensor(wrong_size, T{"", "FloatStorage", "0", 5, 0, {5}, {1}}).stop();
  EXPECT_EQ(layout(wrong_size.b, &msg), CKPTIO_E_INVALID_ARG);
  EXPECT_NE(msg.find("input 0 ('0') holds 24 bytes"), std::string::npos) << msg;
  std::string evil = Pk().proto().global("os", "system").str("echo").op(0x85).op('R').stop().b;
  EXPECT_EQ(layout(evil, &msg), CKPTIO_E_PICKLE);
  EXPECT_NE(msg.find("os.system"), std::string::npos) << msg;
}

// ------------------------------------------------------------ fuzzing

TEST(TorchRead, RandomByteFlipsNeverCrash) {
  Pk p;
  p.proto().odict().mark();
  tensor(p.str("w"), T{"w"});
  tensor(p.str("t"), T{"t", "FloatStorage", "0", 6, 0, {3, 2}, {1, 3}});
  tensor(p.str("f8"), T{"f8", "", "1", 4, 0, {4}, {1}, "float8_e5m2"});
  p.str("lr").f(0.5).str("xs").op(']').mark().i(1).str("a").op('N').op('e').op('u').stop();
  Zip z = archive(p.b, {{"0", bytes_of(24, 1)}, {"1", bytes_of(4, 2)}});
  Idx ok;
  ASSERT_EQ(parse(z.bytes, &ok), 0);
  std::mt19937_64 rng(12345);
  size_t accepted = 0;
  for (int it = 0; it < 30000; it++) {
    std::string f = z.bytes;
    // Half the time aim at the pickle, half anywhere in the file.
    size_t lo = it % 2 ? z.data[0] : 0, hi = it % 2 ? z.data[0] + p.b.size() : f.size();
    int flips = 1 + (int)(rng() % 4);
    for (int k = 0; k < flips; k++) f[lo + rng() % (hi - lo)] ^= (char)(1 + rng() % 255);
    Idx ix;
    std::string msg;
    int rc = parse(f, &ix, &msg);
    if (rc == 0) accepted++;
    else EXPECT_GE(rc, (int)CKPTIO_E_ERROR_MIN) << msg;
  }
  EXPECT_GT(accepted, 0u) << "flips in padding and data must still parse";
}
