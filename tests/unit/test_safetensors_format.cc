// The safetensors header module: the reference reader's tests (safetensors
// src/tensor.rs) re-stated here, schema and JSON rejections one rule at a
// time, writer plans read back by the parser, and truncation / byte-flip
// sweeps that must fail cleanly and never crash (run them under ASan too).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdarg>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"
extern "C" {
#include "core/error.h"
#include "formats/json.h"
#include "formats/safetensors.h"
}

namespace {

// u64 N + json + data_len zero bytes; N is the json length unless given.
std::vector<uint8_t> st_file(const std::string &json, size_t data_len, uint64_t n = UINT64_MAX) {
  if (n == UINT64_MAX) n = json.size();
  std::vector<uint8_t> f(8);
  for (int b = 0; b < 8; b++) f[b] = (uint8_t)(n >> (8 * b));
  f.insert(f.end(), json.begin(), json.end());
  f.resize(f.size() + data_len, 0);
  return f;
}

std::vector<uint8_t> raw(const char *s, size_t n) { return std::vector<uint8_t>(s, s + n); }

struct Index {
  ckptio_st_index v;
  Index() { memset(&v, 0, sizeof(v)); }
  ~Index() { ckptio_st_index_free(&v); }
  const ckptio_st_entry *find(const std::string &name) const {
    for (size_t i = 0; i < v.count; i++)
      if (name == v.entries[i].name) return &v.entries[i];
    return nullptr;
  }
  bool empty() const { return !v.count && !v.entries && !v.meta && !v.meta_count; }
};

struct Plan {
  ckptio_st_plan v;
  Plan() { memset(&v, 0, sizeof(v)); }
  ~Plan() { ckptio_st_plan_free(&v); }
};

// Rules 1-7 on a whole file image, as a reader would run them.
int parse(const std::vector<uint8_t> &f, Index *idx, std::string *msg = nullptr) {
  char err[CKPTIO_ERRLEN] = "";
  uint64_t n = 0;
  int rc = ckptio_st_header_length(f.data(), f.size(), &n, err, sizeof(err));
  if (rc == 0) rc = ckptio_st_parse(f.data() + 8, n, f.size(), &idx->v, err, sizeof(err));
  if (msg) *msg = err;
  if (rc < 0) {
    EXPECT_TRUE(idx->empty()) << "a failed parse must leave the index empty";
    EXPECT_NE(err[0], '\0') << "a failure must say why";
  }
  return rc;
}

int parse_json(const std::string &json, size_t data_len, std::string *msg = nullptr) {
  Index idx;
  return parse(st_file(json, data_len), &idx, msg);
}

std::string tensor(const std::string &name, const char *dtype, const std::string &shape,
                   uint64_t b, uint64_t e) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":[" + shape +
         "],\"data_offsets\":[" + std::to_string(b) + "," + std::to_string(e) + "]}";
}

const char kI32[] = R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})";

}  // namespace

// ---------------------------------------------------------------- reference tests

TEST(StReference, Deserialization) {
  Index idx;
  ASSERT_EQ(parse(st_file(kI32, 16), &idx), 0);
  ASSERT_EQ(idx.v.count, 1u);
  EXPECT_STREQ(idx.v.entries[0].name, "test");
  EXPECT_EQ(idx.v.entries[0].dtype, CKPTIO_I32);
  EXPECT_EQ(idx.v.entries[0].ndim, 2);
  EXPECT_EQ(idx.v.entries[0].shape[1], 2);
  EXPECT_EQ(idx.v.entries[0].end, 16u);
  EXPECT_EQ(idx.v.data_start, 8u + strlen(kI32));
  EXPECT_EQ(idx.v.meta_count, 0u);
}

TEST(StReference, JsonAttack) {
  // Ten tensors all claiming bytes [0, 16): every one but the first overlaps.
  std::string j = "{";
  for (int i = 0; i < 10; i++) j += (i ? "," : "") + tensor("weight_" + std::to_string(i), "F32", "2,2", 0, 16);
  j += "}";
  std::string msg;
  EXPECT_EQ(parse_json(j, 16, &msg), CKPTIO_E_INVALID_OFFSET);
  EXPECT_NE(msg.find("'weight_"), std::string::npos) << msg;
}

TEST(StReference, JsonAttackManyTensors) {
  // attacks/safetensors_abuse_attempt_3 at full scale: 100k tensors, pretty JSON.
  std::string j = "{";
  for (int i = 0; i < 100000; i++)
    j += std::string(i ? ", " : "") + "\"weight_" + std::to_string(i) +
         "\": {\"dtype\": \"F32\", \"shape\": [200, 200], \"data_offsets\": [0, 160000]}";
  j += "}";
  EXPECT_EQ(parse_json(j, 160000), CKPTIO_E_INVALID_OFFSET);
}

TEST(StReference, MetadataIncompleteBuffer) {
  std::vector<uint8_t> f = st_file(kI32, 16);
  const char extra[] = "extra_bogus_data_for_polyglot_file";
  f.insert(f.end(), extra, extra + strlen(extra));
  Index a;
  std::string msg;
  EXPECT_EQ(parse(f, &a, &msg), CKPTIO_E_INCOMPLETE_BUFFER);
  EXPECT_NE(msg.find("trailing"), std::string::npos) << msg;
  Index b;
  EXPECT_EQ(parse(st_file(kI32, 14), &b), CKPTIO_E_INCOMPLETE_BUFFER);  // two bytes missing
}

TEST(StReference, HeaderTooLarge) {
  std::vector<uint8_t> f = st_file(kI32, 16);
  f[5] = f[6] = f[7] = 0xff;
  Index idx;
  EXPECT_EQ(parse(f, &idx), CKPTIO_E_HEADER_TOO_LARGE);
}

TEST(StReference, HeaderTooSmall) {
  Index a, b;
  EXPECT_EQ(parse({}, &a), CKPTIO_E_HEADER_TOO_SMALL);
  EXPECT_EQ(parse(raw("\x01\0\0\0\0\0\0", 7), &b), CKPTIO_E_HEADER_TOO_SMALL);
}

TEST(StReference, InvalidHeaderLength) {
  Index idx;
  EXPECT_EQ(parse(raw("<\0\0\0\0\0\0\0", 8), &idx), CKPTIO_E_HEADER_LENGTH);
}

TEST(StReference, InvalidHeaderNonUtf8) {
  Index idx;
  EXPECT_EQ(parse(raw("\x01\0\0\0\0\0\0\0\xff", 9), &idx), CKPTIO_E_HEADER_UTF8);
}

TEST(StReference, InvalidHeaderNotJson) {
  Index idx;
  EXPECT_EQ(parse(raw("\x01\0\0\0\0\0\0\0{", 9), &idx), CKPTIO_E_HEADER_JSON);
}

TEST(StReference, InvalidInfo) {
  std::string msg;
  EXPECT_EQ(parse_json(R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0, 4]}})", 0, &msg),
            CKPTIO_E_TENSOR_INFO);
  EXPECT_NE(msg.find("'test'"), std::string::npos) << msg;
}

TEST(StReference, ValidationOverflow) {
  EXPECT_EQ(parse_json(R"({"test":{"dtype":"I32","shape":[2,18446744073709551614],"data_offsets":[0,16]}})", 16),
            CKPTIO_E_OVERFLOW);
  EXPECT_EQ(parse_json(R"({"test":{"dtype":"I32","shape":[2,9223372036854775807],"data_offsets":[0,16]}})", 16),
            CKPTIO_E_OVERFLOW);
}

TEST(StReference, ZeroSizedTensor) {
  Index idx;
  ASSERT_EQ(parse(st_file(R"({"test":{"dtype":"I32","shape":[2,0],"data_offsets":[0, 0]}})", 0), &idx), 0);
  ASSERT_EQ(idx.v.count, 1u);
  EXPECT_EQ(idx.v.entries[0].ndim, 2);
  EXPECT_EQ(idx.v.entries[0].shape[1], 0);
  EXPECT_EQ(idx.v.entries[0].end, 0u);
}

TEST(StReference, EmptyShapesAllowed) {
  Index idx;
  ASSERT_EQ(parse(st_file(R"({"test":{"dtype":"I32","shape":[],"data_offsets":[0,4]}})", 4), &idx), 0);
  ASSERT_EQ(idx.v.count, 1u);
  EXPECT_EQ(idx.v.entries[0].ndim, 0);
  EXPECT_EQ(idx.v.entries[0].end, 4u);
}

TEST(StReference, WhitespacePaddedHeader) {
  Index idx;
  ASSERT_EQ(parse(st_file("{}\r \t\n", 0), &idx), 0);
  EXPECT_EQ(idx.v.count, 0u);
}

TEST(StReference, LeadingWhitespaceRefused) {
  // [ours] FORMATS.md: the header must begin with '{'. (safetensors >= 0.7
  // accepts leading whitespace; see kAllowLeadingWhitespace.)
  EXPECT_EQ(parse_json("\t\n{}\r ", 0), CKPTIO_E_HEADER_JSON);
  EXPECT_EQ(parse_json(" {}", 0), CKPTIO_E_HEADER_JSON);
}

// ---------------------------------------------------------------- rules 1-3

TEST(StHeaderLength, Bounds) {
  uint8_t p[8] = {0};
  uint64_t n = 99;
  EXPECT_EQ(ckptio_st_header_length(nullptr, 0, &n, nullptr, 0), CKPTIO_E_HEADER_TOO_SMALL);
  EXPECT_EQ(ckptio_st_header_length(nullptr, 8, &n, nullptr, 0), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(ckptio_st_header_length(p, 8, &n, nullptr, 0), 0);
  EXPECT_EQ(n, 0u);
  uint64_t max = CKPTIO_ST_MAX_HEADER;
  for (int b = 0; b < 8; b++) p[b] = (uint8_t)(max >> (8 * b));
  EXPECT_EQ(ckptio_st_header_length(p, 8 + max, &n, nullptr, 0), 0);
  EXPECT_EQ(n, max);
  EXPECT_EQ(ckptio_st_header_length(p, 7 + max, &n, nullptr, 0), CKPTIO_E_HEADER_LENGTH);
  p[0]++;
  EXPECT_EQ(ckptio_st_header_length(p, UINT64_MAX, &n, nullptr, 0), CKPTIO_E_HEADER_TOO_LARGE);
  memset(p, 0xff, 8);  // 8 + N would overflow: caught as too large first
  EXPECT_EQ(ckptio_st_header_length(p, UINT64_MAX, &n, nullptr, 0), CKPTIO_E_HEADER_TOO_LARGE);
  // parse re-checks the same rules on its own.
  ckptio_st_index idx;
  EXPECT_EQ(ckptio_st_parse((const uint8_t *)"{}", 2, 9, &idx, nullptr, 0), CKPTIO_E_HEADER_LENGTH);
  EXPECT_EQ(ckptio_st_parse((const uint8_t *)"{}", 2, 5, &idx, nullptr, 0), CKPTIO_E_HEADER_TOO_SMALL);
  EXPECT_EQ(ckptio_st_parse(nullptr, 0, 8, &idx, nullptr, 0), CKPTIO_E_HEADER_JSON);  // empty header
}

// ---------------------------------------------------------------- rule 4

TEST(StUtf8, RejectsEveryKindOfBadSequence) {
  const char *bad[] = {"\xc0\x80", "\xc1\xbf", "\xe0\x80\x80", "\xed\xa0\x80", "\xf0\x80\x80\x80",
                       "\xf4\x90\x80\x80", "\xf5\x80\x80\x80", "\x80", "\xe2\x82", "\xe2\x28\xa1"};
  for (const char *b : bad) {
    std::string j = std::string("{\"") + b + "\":" + "{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}";
    EXPECT_EQ(parse_json(j, 1), CKPTIO_E_HEADER_UTF8) << j;
  }
  size_t pos = 0;
  EXPECT_EQ(ckptio_utf8_check((const uint8_t *)"abcdefghij\xe2\x82", 12, &pos), -1);
  EXPECT_EQ(pos, 10u);
  const char good[] = "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf\xed\x9f\xbf";
  EXPECT_EQ(ckptio_utf8_check((const uint8_t *)good, strlen(good), nullptr), 0);
}

// ---------------------------------------------------------------- rule 5

struct Case {
  const char *why;
  std::string json;
  size_t data;
  int code;
};

TEST(StSchema, RejectsWithItsOwnCode) {
  const std::string t = R"("dtype":"U8","shape":[2],"data_offsets":[0,2])";
  const std::vector<Case> cases = {
      {"duplicate tensor", "{" + tensor("a", "U8", "2", 0, 2) + "," + tensor("a", "U8", "2", 2, 4) + "}", 4, CKPTIO_E_DUPLICATE},
      {"duplicate metadata key", R"({"__metadata__":{"k":"1","k":"2"}})", 0, CKPTIO_E_DUPLICATE},
      {"duplicate __metadata__", R"({"__metadata__":{},"__metadata__":{}})", 0, CKPTIO_E_DUPLICATE},
      {"duplicate field", R"({"a":{"dtype":"U8","dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2, CKPTIO_E_DUPLICATE},
      {"metadata value number", R"({"__metadata__":{"k":1}})", 0, CKPTIO_E_HEADER_JSON},
      {"metadata value null", R"({"__metadata__":{"k":null}})", 0, CKPTIO_E_HEADER_JSON},
      {"metadata value object", R"({"__metadata__":{"k":{}}})", 0, CKPTIO_E_HEADER_JSON},
      {"metadata is a string", R"({"__metadata__":"x"})", 0, CKPTIO_E_HEADER_JSON},
      {"metadata is an array", R"({"__metadata__":[]})", 0, CKPTIO_E_HEADER_JSON},
      {"tensor named __metadata__", R"({"__metadata__":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2, CKPTIO_E_HEADER_JSON},
      {"negative dim", R"({"a":{"dtype":"U8","shape":[-2],"data_offsets":[0,2]}})", 2, CKPTIO_E_HEADER_JSON},
      {"minus zero", R"({"a":{"dtype":"U8","shape":[-0],"data_offsets":[0,0]}})", 0, CKPTIO_E_HEADER_JSON},
      {"float dim", R"({"a":{"dtype":"U8","shape":[2.0],"data_offsets":[0,2]}})", 2, CKPTIO_E_HEADER_JSON},
      {"exponent dim", R"({"a":{"dtype":"U8","shape":[2e0],"data_offsets":[0,2]}})", 2, CKPTIO_E_HEADER_JSON},
      {"leading zero", R"({"a":{"dtype":"U8","shape":[02],"data_offsets":[0,2]}})", 2, CKPTIO_E_HEADER_JSON},
      {"dim above u64", R"({"a":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,2]}})", 2, CKPTIO_E_HEADER_JSON},
      {"dim as string", R"({"a":{"dtype":"U8","shape":["2"],"data_offsets":[0,2]}})", 2, CKPTIO_E_HEADER_JSON},
      {"negative offset", R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[-1,2]}})", 2, CKPTIO_E_HEADER_JSON},
      {"float offset", R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2.5]}})", 2, CKPTIO_E_HEADER_JSON},
      {"offset above u64", R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,99999999999999999999]}})", 2, CKPTIO_E_HEADER_JSON},
      {"one offset", R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0]}})", 2, CKPTIO_E_HEADER_JSON},
      {"three offsets", R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2,4]}})", 2, CKPTIO_E_HEADER_JSON},
      {"offsets object", R"({"a":{"dtype":"U8","shape":[2],"data_offsets":{}}})", 2, CKPTIO_E_HEADER_JSON},
      {"shape not array", R"({"a":{"dtype":"U8","shape":2,"data_offsets":[0,2]}})", 2, CKPTIO_E_HEADER_JSON},
      {"nine dims", R"({"a":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})", 1, CKPTIO_E_SHAPE},
      {"unknown dtype", R"({"a":{"dtype":"F128","shape":[2],"data_offsets":[0,2]}})", 2, CKPTIO_E_DTYPE},
      {"lowercase dtype", R"({"a":{"dtype":"u8","shape":[2],"data_offsets":[0,2]}})", 2, CKPTIO_E_DTYPE},
      {"dtype number", R"({"a":{"dtype":8,"shape":[2],"data_offsets":[0,2]}})", 2, CKPTIO_E_HEADER_JSON},
      {"no dtype", R"({"a":{"shape":[2],"data_offsets":[0,2]}})", 2, CKPTIO_E_HEADER_JSON},
      {"no shape", R"({"a":{"dtype":"U8","data_offsets":[0,2]}})", 2, CKPTIO_E_HEADER_JSON},
      {"no offsets", R"({"a":{"dtype":"U8","shape":[2]}})", 2, CKPTIO_E_HEADER_JSON},
      {"tensor is array", R"({"a":[1]})", 0, CKPTIO_E_HEADER_JSON},
      {"tensor is null", R"({"a":null})", 0, CKPTIO_E_HEADER_JSON},
      {"top level array", "[]", 0, CKPTIO_E_HEADER_JSON},
      {"top level string", "\"x\"", 0, CKPTIO_E_HEADER_JSON},
      {"empty header", "", 0, CKPTIO_E_HEADER_JSON},
      {"trailing garbage", "{}x", 0, CKPTIO_E_HEADER_JSON},
      {"second object", "{}{}", 0, CKPTIO_E_HEADER_JSON},
      {"trailing NUL", std::string("{} \0", 4), 0, CKPTIO_E_HEADER_JSON},
      {"trailing comma object", "{" + tensor("a", "U8", "2", 0, 2) + ",}", 2, CKPTIO_E_HEADER_JSON},
      {"trailing comma array", R"({"a":{"dtype":"U8","shape":[2,],"data_offsets":[0,2]}})", 2, CKPTIO_E_HEADER_JSON},
      {"missing colon", R"({"a" {}})", 0, CKPTIO_E_HEADER_JSON},
      {"unquoted key", R"({a:{}})", 0, CKPTIO_E_HEADER_JSON},
      {"single quotes", R"({'a':{}})", 0, CKPTIO_E_HEADER_JSON},
      {"invalid escape", R"({"a\x":{)" + t + "}}", 2, CKPTIO_E_HEADER_JSON},
      {"raw control char", "{\"a\x01\":{" + t + "}}", 2, CKPTIO_E_HEADER_JSON},
      {"raw newline", "{\"a\n\":{" + t + "}}", 2, CKPTIO_E_HEADER_JSON},
      {"lone high surrogate", R"({"\ud800":{)" + t + "}}", 2, CKPTIO_E_HEADER_JSON},
      {"high + non-low", R"({"\ud800\u0041":{)" + t + "}}", 2, CKPTIO_E_HEADER_JSON},
      {"lone low surrogate", R"({"\udc00":{)" + t + "}}", 2, CKPTIO_E_HEADER_JSON},
      {"escaped NUL", R"({"a\u0000":{)" + t + "}}", 2, CKPTIO_E_HEADER_JSON},
      {"bad hex", R"({"\u12g4":{)" + t + "}}", 2, CKPTIO_E_HEADER_JSON},
      {"short \\u", R"({"\u12"})", 0, CKPTIO_E_HEADER_JSON},
      {"unknown field bad literal", R"({"a":{"x":tru,)" + t + "}}", 2, CKPTIO_E_HEADER_JSON},
      {"unknown field bad number", R"({"a":{"x":1.,)" + t + "}}", 2, CKPTIO_E_HEADER_JSON},
      {"unknown field bad exponent", R"({"a":{"x":1e+,)" + t + "}}", 2, CKPTIO_E_HEADER_JSON},
      {"unknown field bare minus", R"({"a":{"x":-,)" + t + "}}", 2, CKPTIO_E_HEADER_JSON},
      {"good crc then bad crc", R"({"__metadata__":{"x":"1","ckptio.crc32.a":"00000000","y":"2","ckptio.crc32.b":"00000000"},)" + tensor("a", "U8", "2", 0, 2) + "}", 2, CKPTIO_E_HEADER_JSON},
      {"crc of no tensor", R"({"__metadata__":{"ckptio.crc32.b":"00000000"},)" + tensor("a", "U8", "2", 0, 2) + "}", 2, CKPTIO_E_HEADER_JSON},
      {"crc 7 digits", R"({"__metadata__":{"ckptio.crc32.a":"0000000"},)" + tensor("a", "U8", "2", 0, 2) + "}", 2, CKPTIO_E_HEADER_JSON},
      {"crc 9 digits", R"({"__metadata__":{"ckptio.crc32.a":"000000000"},)" + tensor("a", "U8", "2", 0, 2) + "}", 2, CKPTIO_E_HEADER_JSON},
      {"crc not hex", R"({"__metadata__":{"ckptio.crc32.a":"0000000g"},)" + tensor("a", "U8", "2", 0, 2) + "}", 2, CKPTIO_E_HEADER_JSON},
      {"crc with 0x", R"({"__metadata__":{"ckptio.crc32.a":"0x000000"},)" + tensor("a", "U8", "2", 0, 2) + "}", 2, CKPTIO_E_HEADER_JSON},
  };
  for (const Case &c : cases) {
    std::string msg;
    EXPECT_EQ(parse_json(c.json, c.data, &msg), c.code) << c.why << ": " << c.json << "\n  -> " << msg;
  }
}

TEST(StSchema, ErrorsSayWhereInTheHeader) {
  std::string msg;
  EXPECT_EQ(parse_json(R"({"a":{"dtype":"F128","shape":[2],"data_offsets":[0,2]}})", 2, &msg), CKPTIO_E_DTYPE);
  EXPECT_EQ(msg.rfind("unknown dtype: tensor 'a' has dtype 'F128' (header byte ", 0), 0u) << msg;
  EXPECT_EQ(msg.back(), ')') << msg;
}

namespace {
int context_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int context_err(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = ckptio_err_vfmt(err, errlen, CKPTIO_E_FORMAT, "<", ">", fmt, ap);
  va_end(ap);
  return rc;
}
}  // namespace

// The one formatter behind the parsers' wrappers: the text around the
// message, cut where the buffer ends (what does not fit is dropped).
TEST(StSchema, ErrorContextIsCutWithTheMessage) {
  char err[16];
  EXPECT_EQ(context_err(err, sizeof(err), "x %d", 12), CKPTIO_E_FORMAT);
  EXPECT_STREQ(err, "<x 12>");
  EXPECT_EQ(context_err(err, 5, "x %d", 12), CKPTIO_E_FORMAT);
  EXPECT_STREQ(err, "<x 1");
  EXPECT_EQ(context_err(err, 1, "x %d", 12), CKPTIO_E_FORMAT);
  EXPECT_STREQ(err, "");
  EXPECT_EQ(context_err(nullptr, 0, "x"), CKPTIO_E_FORMAT);
}

TEST(StSchema, Accepts) {
  const std::vector<Case> cases = {
      {"null metadata (serde Option)", R"({"__metadata__":null})", 0, 0},
      {"empty metadata", R"({"__metadata__":{}})", 0, 0},
      {"pretty JSON", "{ \"a\" : { \"dtype\" : \"U8\" , \"shape\" : [ 2 ] , \"data_offsets\" : [ 0 , 2 ] } }\n", 2, 0},
      {"unknown field, every kind of value",
       R"({"a":{"x":[true,false,null,-1.5e+3,0,0.25,1E-2,"s\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00",{"k":[]}],"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2, 0},
      {"fields in any order", R"({"a":{"data_offsets":[0,2],"shape":[2],"dtype":"U8"}})", 2, 0},
      {"tensors in any order", "{" + tensor("b", "U8", "2", 2, 4) + "," + tensor("a", "U8", "2", 0, 2) + "}", 4, 0},
      {"empty name", "{" + tensor("", "U8", "2", 0, 2) + "}", 2, 0},
      {"zero dim above int64 with another zero dim", "{" + tensor("a", "U8", "0,9223372036854775807", 0, 0) + "}", 0, 0},
      {"F4 whole bytes", "{" + tensor("a", "F4", "2,3", 0, 3) + "}", 3, 0},
      {"F6 whole bytes", "{" + tensor("a", "F6_E3M2", "4", 0, 3) + "}", 3, 0},
      {"crc uppercase", R"({"__metadata__":{"ckptio.crc32.a":"DEADBEEF"},)" + tensor("a", "U8", "2", 0, 2) + "}", 2, 0},
  };
  for (const Case &c : cases) {
    std::string msg;
    EXPECT_EQ(parse_json(c.json, c.data, &msg), 0) << c.why << ": " << c.json << "\n  -> " << msg;
  }
}

TEST(StSchema, GrammarErrorsNameTheTensor) {
  std::string msg;
  EXPECT_EQ(parse_json(R"({"ok":{"dtype":"U8","shape":[],"data_offsets":[0,1]},"neg":{"dtype":"U8","shape":[-2],"data_offsets":[1,3]}})", 3, &msg),
            CKPTIO_E_HEADER_JSON);
  EXPECT_NE(msg.find("in tensor 'neg': negative number"), std::string::npos) << msg;
  EXPECT_EQ(parse_json(R"({"__metadata__":{"k":"\q"}})", 0, &msg), CKPTIO_E_HEADER_JSON);
  EXPECT_NE(msg.find("in __metadata__: invalid escape"), std::string::npos) << msg;
  EXPECT_EQ(parse_json(R"({"__metadata__":{"k":2}})", 0, &msg), CKPTIO_E_HEADER_JSON);
  EXPECT_NE(msg.find("value of 'k' is not a string"), std::string::npos) << msg;
}

TEST(StSchema, DimAboveInt64IsOverflow) {
  // Even with a zero dim (the reference, on usize, would accept it), since
  // ckptio shapes are int64.
  EXPECT_EQ(parse_json("{" + tensor("a", "U8", "0,9223372036854775808", 0, 0) + "}", 0), CKPTIO_E_OVERFLOW);
}

TEST(StSchema, DeepNestingInAnUnknownField) {
  auto nested = [](size_t depth, bool objects) {
    std::string j = R"({"t":{"dtype":"U8","shape":[],"data_offsets":[0,1],"x":)";
    for (size_t i = 0; i < depth; i++) j += objects ? "{\"k\":" : "[";
    j += "1";
    for (size_t i = 0; i < depth; i++) j += objects ? "}" : "]";
    return j + "}}";
  };
  // The top object and the tensor take two of the 64 levels.
  EXPECT_EQ(parse_json(nested(CKPTIO_JSON_MAX_DEPTH - 2, false), 1), 0);
  EXPECT_EQ(parse_json(nested(CKPTIO_JSON_MAX_DEPTH - 2, true), 1), 0);
  std::string msg;
  EXPECT_EQ(parse_json(nested(CKPTIO_JSON_MAX_DEPTH - 1, false), 1, &msg), CKPTIO_E_HEADER_JSON);
  EXPECT_NE(msg.find("nesting"), std::string::npos) << msg;
  EXPECT_EQ(parse_json(nested(CKPTIO_JSON_MAX_DEPTH - 1, true), 1), CKPTIO_E_HEADER_JSON);
  EXPECT_EQ(parse_json(nested(200000, false), 1), CKPTIO_E_HEADER_JSON);  // no stack overflow
}

TEST(StSchema, EscapedNamesAreUnescaped) {
  Index idx;
  std::string j = "{" + tensor(R"(q\"b\\s\/\u00e9\ud83d\ude00\n)", "U8", "1", 0, 1) + "}";
  ASSERT_EQ(parse(st_file(j, 1), &idx), 0);
  EXPECT_STREQ(idx.v.entries[0].name, "q\"b\\s/\xc3\xa9\xf0\x9f\x98\x80\n");
}

TEST(StSchema, MetadataKeptInFileOrderWithoutCrcKeys) {
  Index idx;
  std::string j = R"({"__metadata__":{"z":"1","ckptio.crc32.a":"0000002a","a":"x\"y","ckptio.version":"0.1.0"},)" +
                  tensor("a", "U8", "2", 0, 2) + "}";
  ASSERT_EQ(parse(st_file(j, 2), &idx), 0);
  ASSERT_EQ(idx.v.meta_count, 3u);
  EXPECT_STREQ(idx.v.meta[0].key, "z");
  EXPECT_STREQ(idx.v.meta[1].key, "a");
  EXPECT_STREQ(idx.v.meta[1].value, "x\"y");
  EXPECT_STREQ(idx.v.meta[2].key, CKPTIO_ST_VERSION_KEY);
  EXPECT_EQ(idx.v.entries[0].has_crc, 1);
  EXPECT_EQ(idx.v.entries[0].crc, 42u);
}

// ---------------------------------------------------------------- rules 6-7

TEST(StLayout, OffsetRulesNameTheTensor) {
  std::string msg;
  EXPECT_EQ(parse_json("{" + tensor("v", "U8", "8", 0, 8) + "," + tensor("w", "U8", "4", 8, 4) + "}", 8, &msg),
            CKPTIO_E_INVALID_OFFSET);
  EXPECT_NE(msg.find("tensor 'w': data_offsets [8, 4) end before begin"), std::string::npos) << msg;
  EXPECT_EQ(parse_json("{" + tensor("a", "U8", "2", 0, 2) + "," + tensor("hole", "U8", "2", 3, 5) + "}", 5, &msg),
            CKPTIO_E_INVALID_OFFSET);
  EXPECT_NE(msg.find("'hole'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hole)"), std::string::npos) << msg;
  EXPECT_EQ(parse_json("{" + tensor("first", "U8", "2", 1, 3) + "}", 3, &msg), CKPTIO_E_INVALID_OFFSET);
  EXPECT_NE(msg.find("'first'"), std::string::npos) << msg;
  EXPECT_EQ(parse_json("{" + tensor("a", "U8", "4", 0, 4) + "," + tensor("b", "U8", "4", 2, 6) + "}", 6, &msg),
            CKPTIO_E_INVALID_OFFSET);
  EXPECT_NE(msg.find("overlap"), std::string::npos) << msg;
  EXPECT_EQ(parse_json("{" + tensor("m", "F4", "3", 0, 2) + "}", 2, &msg), CKPTIO_E_MISALIGNED);
  EXPECT_NE(msg.find("'m'"), std::string::npos) << msg;
  EXPECT_EQ(parse_json("{" + tensor("o", "U8", "4294967296,4294967296", 0, 0) + "}", 0, &msg), CKPTIO_E_OVERFLOW);
  EXPECT_NE(msg.find("'o'"), std::string::npos) << msg;
  EXPECT_EQ(parse_json("{" + tensor("i", "F32", "3", 0, 8) + "}", 8, &msg), CKPTIO_E_TENSOR_INFO);
  EXPECT_NE(msg.find("'i'"), std::string::npos) << msg;
  EXPECT_EQ(parse_json("{" + tensor("a", "U8", "2", 0, 2) + "}", 1, &msg), CKPTIO_E_INCOMPLETE_BUFFER);
  EXPECT_EQ(parse_json("{}", 1, &msg), CKPTIO_E_INCOMPLETE_BUFFER);
}

TEST(StLayout, EntriesSortedByOffset) {
  Index idx;
  std::string j = "{" + tensor("c", "U8", "2", 4, 6) + "," + tensor("z", "U8", "0", 4, 4) + "," +
                  tensor("a", "U8", "4", 0, 4) + "," + tensor("e", "U8", "0", 0, 0) + "}";
  ASSERT_EQ(parse(st_file(j, 6), &idx), 0);
  ASSERT_EQ(idx.v.count, 4u);
  const char *order[] = {"e", "a", "z", "c"};
  for (size_t i = 0; i < 4; i++) EXPECT_STREQ(idx.v.entries[i].name, order[i]);
}

TEST(StLayout, ManyTinyTensors) {
  // A valid header of 200k tensors: parse and sort stay fast (n log n).
  const int n = 200000;
  std::string j = "{";
  for (int i = 0; i < n; i++)
    j += (i ? "," : "") + tensor("t" + std::to_string(n - i), "U8", "", (uint64_t)i, (uint64_t)i + 1);
  j += "}";
  Index idx;
  ASSERT_EQ(parse(st_file(j, n), &idx), 0);
  ASSERT_EQ(idx.v.count, (size_t)n);
  EXPECT_STREQ(idx.v.entries[0].name, ("t" + std::to_string(n)).c_str());
  EXPECT_EQ(idx.v.entries[n - 1].begin, (uint64_t)n - 1);
}

// ---------------------------------------------------------------- writer

namespace {

struct Input {
  std::string name;
  ckptio_dtype dtype;
  std::vector<int64_t> shape;
};

int make_plan(const std::vector<Input> &in, const std::vector<std::pair<std::string, std::string>> &meta,
              int with_crc, uint64_t align, Plan *plan, std::string *msg = nullptr) {
  std::vector<ckptio_st_input> v;
  for (const Input &t : in) {
    int64_t nb = ckptio_tensor_nbytes(t.dtype, (int)t.shape.size(), t.shape.data());
    v.push_back({t.name.c_str(), t.dtype, (int)t.shape.size(), t.shape.data(), (uint64_t)nb});
  }
  std::vector<ckptio_st_kv> kv;
  for (const auto &m : meta) kv.push_back({(char *)m.first.c_str(), (char *)m.second.c_str()});
  char err[CKPTIO_ERRLEN] = "";
  int rc = ckptio_st_plan_make(v.data(), v.size(), kv.data(), kv.size(), with_crc, align, &plan->v, err,
                               sizeof(err));
  if (msg) *msg = err;
  return rc;
}

std::vector<uint8_t> image(const ckptio_st_plan &p) {
  std::vector<uint8_t> f(p.header, p.header + p.header_bytes);
  f.resize(p.file_size, 0);
  return f;
}

std::vector<Input> every_dtype() {
  std::vector<Input> in;
  for (int d = 0; d < CKPTIO_DTYPE_COUNT; d++) {
    bool sub = ckptio_dtype_bits((ckptio_dtype)d) < 8;
    in.push_back({std::string("t_") + ckptio_dtype_name((ckptio_dtype)d), (ckptio_dtype)d,
                  sub ? std::vector<int64_t>{2, 4} : std::vector<int64_t>{3, 5}});
  }
  in.push_back({"scalar", CKPTIO_F32, {}});
  in.push_back({"empty", CKPTIO_BF16, {0, 7}});
  in.push_back({"empty3", CKPTIO_I64, {5, 0, 3}});
  in.push_back({"q\"uote", CKPTIO_U8, {1}});
  in.push_back({"back\\slash", CKPTIO_U8, {2}});
  in.push_back({"uni\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", CKPTIO_F16, {3}});
  in.push_back({"ctl\x01\x1f\x7f\n\t\b\f\r/", CKPTIO_U8, {1}});
  in.push_back({"", CKPTIO_U8, {1}});
  in.push_back({"model.layers.0.self_attn.q_proj.weight", CKPTIO_BF16, {4, 4}});
  return in;
}

}  // namespace

TEST(StPlan, RoundTripEveryDtype) {
  std::vector<Input> in = every_dtype();
  for (int with_crc = 0; with_crc <= 1; with_crc++) {
    Plan plan;
    std::string msg;
    ASSERT_EQ(make_plan(in, {{"format", "pt"}, {"k\"ey\n", "v\\al\x01"}}, with_crc, 4096, &plan, &msg), 0) << msg;
    const ckptio_st_plan &p = plan.v;
    ASSERT_EQ(p.count, in.size());
    EXPECT_EQ(p.header_bytes % 4096, 0u);
    EXPECT_EQ(memcmp(p.header + 8, "{\"__metadata__\":{", 17), 0);
    EXPECT_EQ(p.header[p.header_bytes - 1], ' ');

    // File order: bits descending, then name; data contiguous from the header.
    uint64_t at = p.header_bytes;
    for (size_t k = 0; k < p.count; k++) {
      const Input &t = in[p.order[k]];
      if (k) {
        const Input &prev = in[p.order[k - 1]];
        int pb = ckptio_dtype_bits(prev.dtype), tb = ckptio_dtype_bits(t.dtype);
        EXPECT_TRUE(pb > tb || (pb == tb && prev.name < t.name)) << prev.name << " then " << t.name;
      }
      EXPECT_EQ(p.offset[p.order[k]], at);
      at += (uint64_t)ckptio_tensor_nbytes(t.dtype, (int)t.shape.size(), t.shape.data());
    }
    EXPECT_EQ(p.file_size, at);

    for (size_t i = 0; i < p.count; i++) {
      if (!with_crc) {
        EXPECT_EQ(p.crc_pos[i], 0u);
        continue;
      }
      ASSERT_GT(p.crc_pos[i], 8u);
      EXPECT_EQ(std::string((const char *)p.header + p.crc_pos[i], 8), "00000000");
      ckptio_st_plan_set_crc(&plan.v, i, 0x9E3779B9u * (uint32_t)(i + 1));
    }

    Index idx;
    ASSERT_EQ(parse(image(p), &idx, &msg), 0) << msg;
    EXPECT_EQ(idx.v.data_start, p.header_bytes);
    ASSERT_EQ(idx.v.count, in.size());
    for (size_t i = 0; i < in.size(); i++) {
      const ckptio_st_entry *e = idx.find(in[i].name);
      ASSERT_NE(e, nullptr) << in[i].name;
      EXPECT_EQ(e->dtype, in[i].dtype);
      ASSERT_EQ(e->ndim, (int)in[i].shape.size());
      for (int d = 0; d < e->ndim; d++) EXPECT_EQ(e->shape[d], in[i].shape[d]);
      EXPECT_EQ(idx.v.data_start + e->begin, p.offset[i]) << in[i].name;
      EXPECT_EQ(e->has_crc, with_crc);
      if (with_crc) {
        EXPECT_EQ(e->crc, 0x9E3779B9u * (uint32_t)(i + 1)) << in[i].name;
      }
    }
    ASSERT_EQ(idx.v.meta_count, 3u);  // the crc keys are not metadata
    EXPECT_STREQ(idx.v.meta[0].key, "format");
    EXPECT_STREQ(idx.v.meta[1].key, "k\"ey\n");
    EXPECT_STREQ(idx.v.meta[1].value, "v\\al\x01");
    EXPECT_STREQ(idx.v.meta[2].key, CKPTIO_ST_VERSION_KEY);
    EXPECT_STREQ(idx.v.meta[2].value, ckptio_version_string());
  }
}

TEST(StPlan, ExactHeaderText) {
  Plan plan;
  ASSERT_EQ(make_plan({{"b", CKPTIO_U8, {2}}, {"a", CKPTIO_BF16, {1, 2}}}, {}, 1, 8, &plan), 0);
  ckptio_st_plan_set_crc(&plan.v, 0, 0xCBF43926u);
  std::string h((const char *)plan.v.header + 8, plan.v.header_bytes - 8);
  const std::string want =
      R"({"__metadata__":{"ckptio.version":")" + std::string(ckptio_version_string()) +
      R"(","ckptio.crc32.a":"00000000","ckptio.crc32.b":"cbf43926"},)"
      R"("a":{"dtype":"BF16","shape":[1,2],"data_offsets":[0,4]},)"
      R"("b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})";
  EXPECT_EQ(h.substr(0, want.size()), want);
  EXPECT_EQ(h.find_first_not_of(' ', want.size()), std::string::npos);
  EXPECT_EQ(plan.v.header_bytes % 8, 0u);
  EXPECT_LT(plan.v.header_bytes - 8 - want.size(), 8u);  // minimal padding
  uint64_t n = 0;
  for (int b = 7; b >= 0; b--) n = n << 8 | plan.v.header[b];
  EXPECT_EQ(n, plan.v.header_bytes - 8);
  EXPECT_EQ(plan.v.order[0], 1u);
  EXPECT_EQ(plan.v.offset[1], plan.v.header_bytes);
  EXPECT_EQ(plan.v.offset[0], plan.v.header_bytes + 4);
}

TEST(StPlan, NoTensorsNoMetadataStillWritesVersion) {
  Plan plan;
  ASSERT_EQ(make_plan({}, {}, 0, 4096, &plan), 0);
  EXPECT_EQ(plan.v.header_bytes, 4096u);
  EXPECT_EQ(plan.v.file_size, 4096u);
  const std::string want = R"({"__metadata__":{"ckptio.version":")" + std::string(ckptio_version_string()) + R"("}})";
  EXPECT_EQ(std::string((const char *)plan.v.header + 8, want.size()), want);
  Index idx;
  ASSERT_EQ(parse(image(plan.v), &idx), 0);
  EXPECT_EQ(idx.v.count, 0u);
  ASSERT_EQ(idx.v.meta_count, 1u);
  EXPECT_STREQ(idx.v.meta[0].value, ckptio_version_string());
  ckptio_st_plan_set_crc(&plan.v, 0, 1);  // out of range: a no-op
}

TEST(StPlan, SetCrcWithoutCrcIsANoOp) {
  Plan plan;
  ASSERT_EQ(make_plan({{"a", CKPTIO_U8, {2}}}, {}, 0, 4096, &plan), 0);
  std::vector<uint8_t> before(plan.v.header, plan.v.header + plan.v.header_bytes);
  ckptio_st_plan_set_crc(&plan.v, 0, 0x12345678u);
  EXPECT_EQ(before, std::vector<uint8_t>(plan.v.header, plan.v.header + plan.v.header_bytes));
  ckptio_st_plan_set_crc(nullptr, 0, 0);
  ckptio_st_plan_free(nullptr);
  ckptio_st_index_free(nullptr);
}

TEST(StPlan, Rejections) {
  Plan p1, p2, p3, p4, p5, p6, p7, p8;
  std::string msg;
  EXPECT_EQ(make_plan({{"a", CKPTIO_U8, {2}}}, {}, 0, 0, &p1), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(make_plan({{"a", CKPTIO_U8, {2}}}, {}, 0, 4, &p1), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(make_plan({{"a", CKPTIO_U8, {2}}}, {}, 0, 4095, &p1), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(make_plan({{"__metadata__", CKPTIO_U8, {2}}}, {}, 0, 8, &p2), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(make_plan({{"bad\xff", CKPTIO_U8, {2}}}, {}, 0, 8, &p3), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(make_plan({}, {{CKPTIO_ST_VERSION_KEY, "9"}}, 0, 8, &p4, &msg), CKPTIO_E_INVALID_ARG);
  EXPECT_NE(msg.find("reserved"), std::string::npos) << msg;
  EXPECT_EQ(make_plan({}, {{"ckptio.crc32.a", "00000000"}}, 0, 8, &p5), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(make_plan({}, {{"k", "\xc0\x80"}}, 0, 8, &p6), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(make_plan({{"odd", CKPTIO_F4, {3}}}, {}, 0, 8, &p7), CKPTIO_E_MISALIGNED);
  EXPECT_EQ(p7.v.header, nullptr);
  EXPECT_EQ(p7.v.order, nullptr);

  // nbytes that disagrees with dtype x shape.
  int64_t shape[1] = {4};
  ckptio_st_input in = {"a", CKPTIO_F32, 1, shape, 15};
  EXPECT_EQ(ckptio_st_plan_make(&in, 1, nullptr, 0, 0, 8, &p8.v, nullptr, 0), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(ckptio_st_plan_make(nullptr, 1, nullptr, 0, 0, 8, &p8.v, nullptr, 0), CKPTIO_E_INVALID_ARG);
}

TEST(StPlan, HeaderTooLarge) {
  Plan plan;
  std::string big(CKPTIO_ST_MAX_HEADER, 'a');
  EXPECT_EQ(make_plan({}, {{"very_large_metadata", big}}, 0, 8, &plan), CKPTIO_E_HEADER_TOO_LARGE);
  EXPECT_EQ(plan.v.header, nullptr);
}

TEST(StPlan, AlignmentPaddingCanCrossTheLimit) {
  Plan plan;
  // JSON well under the limit, but padded to a 1 GiB boundary it is not.
  EXPECT_EQ(make_plan({{"a", CKPTIO_U8, {2}}}, {}, 0, 1ull << 30, &plan), CKPTIO_E_HEADER_TOO_LARGE);
  EXPECT_EQ(make_plan({{"a", CKPTIO_U8, {2}}}, {}, 0, 1ull << 63, &plan), CKPTIO_E_HEADER_TOO_LARGE);
}

// ---------------------------------------------------------------- JSON module

TEST(StJson, Escaper) {
  ckptio_json_out o = {};
  ASSERT_EQ(ckptio_json_out_string(&o, "a\"b\\c\n\x01\x1f\x7f/\xc3\xa9"), 0);
  EXPECT_EQ(std::string(o.data, o.len), "\"a\\\"b\\\\c\\n\\u0001\\u001f\x7f/\xc3\xa9\"");
  free(o.data);
}

TEST(StJson, U64Edges) {
  auto u64 = [](const char *s, uint64_t *v) {
    ckptio_json j;
    ckptio_json_init(&j, (const uint8_t *)s, strlen(s), nullptr, 0);
    int rc = ckptio_json_u64(&j, v);
    ckptio_json_free(&j);
    return rc;
  };
  uint64_t v = 0;
  EXPECT_EQ(u64("18446744073709551615", &v), 0);
  EXPECT_EQ(v, UINT64_MAX);
  EXPECT_EQ(u64("0", &v), 0);
  EXPECT_EQ(v, 0u);
  EXPECT_EQ(u64("  7 ", &v), 0);
  EXPECT_EQ(v, 7u);
  for (const char *bad : {"18446744073709551616", "99999999999999999999999", "-1", "1.0", "1e3", "00", "",
                          "x", "+1"})
    EXPECT_EQ(u64(bad, &v), CKPTIO_E_HEADER_JSON) << bad;
}

// ---------------------------------------------------------------- robustness

namespace {

// A planned file with a bit of everything in the header.
std::vector<uint8_t> sample_file(size_t *json_end) {
  Plan plan;
  std::vector<Input> in = {{"w\xc3\xa9ight", CKPTIO_F32, {2, 3}}, {"b\"ias", CKPTIO_BF16, {3}},
                           {"s", CKPTIO_I64, {}}, {"e", CKPTIO_U8, {0}}, {"f4", CKPTIO_F4, {2, 2}}};
  EXPECT_EQ(make_plan(in, {{"format", "pt"}, {"n\u00f6te", "a\\b"}}, 1, 8, &plan), 0);
  for (size_t i = 0; i < in.size(); i++) ckptio_st_plan_set_crc(&plan.v, i, (uint32_t)(i * 77777));
  std::vector<uint8_t> f = image(plan.v);
  size_t end = plan.v.header_bytes;
  while (end > 8 && f[end - 1] == ' ') end--;
  *json_end = end;
  return f;
}

}  // namespace

TEST(StRobust, TruncatedAtEveryByte) {
  size_t json_end;
  std::vector<uint8_t> f = sample_file(&json_end);
  uint64_t data_bytes = 0;
  {
    Index idx;
    ASSERT_EQ(parse(f, &idx), 0);
    data_bytes = f.size() - idx.v.data_start;
  }
  std::string json(f.begin() + 8, f.begin() + (long)json_end);
  for (size_t len = 0; len < json.size(); len++) {
    Index idx;
    int rc = parse(st_file(json.substr(0, len), data_bytes), &idx);
    EXPECT_TRUE(rc == CKPTIO_E_HEADER_JSON || rc == CKPTIO_E_HEADER_UTF8) << "cut at " << len << ": " << rc;
  }
  Index whole;
  EXPECT_EQ(parse(st_file(json, data_bytes), &whole), 0);
}

TEST(StRobust, RandomMutationsNeverCrash) {
  size_t json_end;
  const std::vector<uint8_t> base = sample_file(&json_end);
  static const char kAlphabet[] = "{}[]\",:0123456789e-.\\u \x80\xff";
  std::mt19937_64 rng(20240601);
  size_t ok = 0;
  for (int iter = 0; iter < 6000; iter++) {
    std::vector<uint8_t> f = base;
    int kind = iter % 3;
    if (kind == 0) {  // flip 1-4 bytes, mostly inside the JSON, sometimes anywhere
      int flips = 1 + (int)(rng() % 4);
      for (int k = 0; k < flips; k++) {
        size_t at = rng() % 8 ? 8 + rng() % (json_end - 8) : rng() % f.size();
        f[at] = rng() % 2 ? (uint8_t)rng() : (uint8_t)(f[at] ^ (1u << (rng() % 8)));
      }
    } else {  // insert or delete a byte in the JSON and keep N consistent
      size_t at = 8 + rng() % (json_end - 8);
      if (kind == 1) f.insert(f.begin() + (long)at, (uint8_t)kAlphabet[rng() % (sizeof(kAlphabet) - 1)]);
      else f.erase(f.begin() + (long)at);
      uint64_t n = 0;
      for (int b = 7; b >= 0; b--) n = n << 8 | f[b];
      n = kind == 1 ? n + 1 : n - 1;
      for (int b = 0; b < 8; b++) f[b] = (uint8_t)(n >> (8 * b));
    }
    Index idx;
    int rc = parse(f, &idx);
    ASSERT_LE(rc, 0);
    if (rc == 0) {  // whatever parsed must be a consistent index
      ok++;
      uint64_t at = 0;
      for (size_t i = 0; i < idx.v.count; i++) {
        EXPECT_EQ(idx.v.entries[i].begin, at);
        at = idx.v.entries[i].end;
      }
      EXPECT_EQ(idx.v.data_start + at, f.size());
    } else {
      EXPECT_GE(rc, (int)CKPTIO_E_ERROR_MIN);
    }
  }
  RecordProperty("parsed_ok", (int)ok);
}
