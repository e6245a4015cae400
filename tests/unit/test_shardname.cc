// The one formatter and parser of a set's file names (core/shardname.h):
// Hugging Face's "<prefix>-00001-of-00004.safetensors", and a storage's
// "<prefix>-00001-of-00004-<8 of the save id>.safetensors". What the
// formatter writes the parser reads back; anything else is refused, since
// the sweeps that parse these names remove what they accept.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>

extern "C" {
#include "core/shardname.h"
}

namespace {

std::string fmt(const char *prefix, size_t k, size_t n, const char *id = nullptr) {
  char buf[256];
  int len = ckptio_shardname_format(buf, sizeof(buf), prefix, k, n, id);
  EXPECT_EQ(len, (int)strlen(buf));
  return buf;
}

// The parse of name for prefix: what follows ".safetensors", or "NULL".
std::string rest(const std::string &name, const char *prefix, ckptio_shardname *out = nullptr) {
  const char *r = ckptio_shardname_parse(name.c_str(), prefix, out);
  return r ? r : "NULL";
}

}  // namespace

TEST(ShardName, FormatsAsHuggingFace) {
  EXPECT_EQ(fmt("model", 0, 4), "model-00001-of-00004.safetensors");
  EXPECT_EQ(fmt("model", 3, 4), "model-00004-of-00004.safetensors");
  EXPECT_EQ(fmt("my-net.v2", 11, 12), "my-net.v2-00012-of-00012.safetensors");
  // A storage's: the first 8 characters of the save id.
  EXPECT_EQ(fmt("model", 0, 3, "0123456789abcdef0123456789abcdef"), "model-00001-of-00003-01234567.safetensors");
}

TEST(ShardName, RoundTrip) {
  const char *ids[] = {nullptr, "deadbeef0011223344556677889900aa"};
  for (const char *prefix : {"model", "m", "a-b-00001-of-00002", "x.safetensors"})
    for (const char *id : ids)
      for (size_t n : {1ul, 2ul, 4ul, 99ul, 12345ul, 99999ul})
        for (size_t k : {0ul, n / 2, n - 1}) {
          std::string name = fmt(prefix, k, n, id);
          ckptio_shardname s = {};
          ASSERT_EQ(rest(name, prefix, &s), "") << name;
          EXPECT_EQ(s.k, k) << name;
          EXPECT_EQ(s.n, n) << name;
          if (id) {
            ASSERT_NE(s.id, nullptr) << name;
            EXPECT_EQ(std::string(s.id, s.idlen), std::string(id, CKPTIO_SHARDNAME_ID_LEN)) << name;
          } else {
            EXPECT_EQ(s.id, nullptr) << name;
            EXPECT_EQ(s.idlen, 0u) << name;
          }
        }
}

TEST(ShardName, Bounds) {
  EXPECT_EQ(fmt("model", 99998, 99999), "model-99999-of-99999.safetensors");
  ckptio_shardname s = {};
  EXPECT_EQ(rest("model-99999-of-99999.safetensors", "model", &s), "");
  EXPECT_EQ(s.k, 99998u);
  EXPECT_EQ(s.n, 99999u);
  // Past 99999 the formatter writes the digits a count needs ("%05zu", as
  // the names on disk always were) and the parser refuses them, as every
  // parser of these names did: sweeps pass such files by.
  EXPECT_EQ(fmt("model", 0, 100000), "model-00001-of-100000.safetensors");
  EXPECT_EQ(fmt("model", 99999, 100000), "model-100000-of-100000.safetensors");
  EXPECT_EQ(rest("model-00001-of-100000.safetensors", "model"), "NULL");
  EXPECT_EQ(rest("model-100000-of-100000.safetensors", "model"), "NULL");
  // Any count fits in strlen(prefix) + CKPTIO_SHARDNAME_EXTRA bytes.
  int len = ckptio_shardname_format(nullptr, 0, "p", SIZE_MAX - 1, SIZE_MAX, "0123456789abcdef");
  EXPECT_LT((size_t)len, 1 + (size_t)CKPTIO_SHARDNAME_EXTRA);
  // Cut short as snprintf cuts, the length it needed returned.
  char small[8];
  EXPECT_EQ(ckptio_shardname_format(small, sizeof(small), "model", 0, 4, nullptr), 32);
  EXPECT_STREQ(small, "model-0");
}

TEST(ShardName, RestAfterTheName) {
  // What follows ".safetensors" is the caller's to judge: a temp file of
  // io/file.c is ".<name>.ckptio-tmp-*" (the caller strips the dot).
  EXPECT_EQ(rest("model-00001-of-00002.safetensors.ckptio-tmp-1-2-3", "model"), ".ckptio-tmp-1-2-3");
  EXPECT_EQ(rest("model-00001-of-00002-abcd1234.safetensors.bak", "model"), ".bak");
  ckptio_shardname s = {};
  const std::string name = "model-00002-of-00002-ab.safetensors";  // s.id points into it
  EXPECT_EQ(rest(name, "model", &s), "");  // a shorter id is still one
  EXPECT_EQ(std::string(s.id, s.idlen), "ab");
}

TEST(ShardName, GarbageRefused) {
  const char *bad[] = {
      "",
      "model",
      "model.safetensors",
      "model.safetensors.index.json",
      "model-00001-of-00002",                        // no extension
      "model-00001-of-00002.safetensor",             // a short one
      "model-00001-of-00002.json",                   //
      "other-00001-of-00002.safetensors",            // another prefix
      "modelx-00001-of-00002.safetensors",           // a longer prefix
      "mode-00001-of-00002.safetensors",             //
      "model00001-of-00002.safetensors",             // no dash after the prefix
      "model-1-of-2.safetensors",                    // not 5 digits
      "model-0001-of-00002.safetensors",             //
      "model-000001-of-00002.safetensors",           //
      "model-00001-of-0002.safetensors",             //
      "model- 0001-of-00002.safetensors",            // what sscanf would take
      "model-+0001-of-00002.safetensors",            //
      "model-0000a-of-00002.safetensors",            //
      "model-00001_of-00002.safetensors",            // not "-of-"
      "model-00001-0f-00002.safetensors",            //
      "model-00000-of-00002.safetensors",            // file 0
      "model-00003-of-00002.safetensors",            // past the count
      "model-00001-of-00000.safetensors",            // no files
      "model-00001-of-00002-.safetensors",           // an empty id
      "model-00001-of-00002-abcd12345.safetensors",  // an id of 9
      "model-00001-of-00002-ab_c.safetensors",       // not letters or digits
      "model-00001-of-00002-ab-cd.safetensors",      //
      "model-00001-of-00002-ab.cd.safetensors",      //
      "model-00001-of-00002.x.safetensors",          //
      ".model-00001-of-00002.safetensors",           // a temp's dot is the caller's
  };
  for (const char *name : bad) EXPECT_EQ(rest(name, "model"), "NULL") << "'" << name << "'";
}
