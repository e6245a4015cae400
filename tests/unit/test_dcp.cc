// A torch.distributed.checkpoint directory (tests/unit/data/dcp_2ranks,
// written by torch's dcp.save from 2 processes) through the reader: global
// tensors assembled from their chunks, boxes across chunk boundaries, parts,
// byte items, verify, and the files damaged (cut short, a flipped byte, one
// missing). The interop test (tests/interop/test_dcp_native.py) runs the
// real torch; this one runs the same source under the sanitizers.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ckpt_fixture.h"

extern "C" {
#include "core/error.h"
#include "formats/dcp_meta.h"
}

using namespace ckptio_test;

namespace {

const std::string kData = std::string(CKPTIO_SOURCE_DIR) + "/tests/unit/data/dcp_2ranks";


// The fixture copied into a fresh directory, for the tests that damage it.
std::string copy_of(const TempDir &d) {
  for (const char *f : {".metadata", "__0_0.distcp", "__1_0.distcp"}) write_file(d.file(f), read_file(kData + "/" + f));
  return d.path();
}

size_t index_of(ckptio_reader *r, const char *name) {
  int64_t i = ckptio_reader_find(r, name);
  EXPECT_GE(i, 0) << name;
  return i < 0 ? 0 : (size_t)i;
}

TEST(Dcp, GlobalTensorsAssembleFromTheirChunks) {
  TestContext c;
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(c.ctx, kData.c_str(), nullptr, &r), 0) << ckptio_last_open_error();
  EXPECT_STREQ(ckptio_reader_format(r), "dcp");
  EXPECT_EQ(ckptio_reader_count(r), 4u);
  EXPECT_EQ(ckptio_reader_shard_count(r), 0u);  // the files are no shards that open alone

  float row[24];
  int32_t col[18];
  uint16_t rep[5];
  ASSERT_EQ(ckptio_reader_load(r, index_of(r, "row"), row, sizeof(row)), 0) << ckptio_reader_last_error(r);
  ASSERT_EQ(ckptio_reader_load(r, index_of(r, "col"), col, sizeof(col)), 0) << ckptio_reader_last_error(r);
  ASSERT_EQ(ckptio_reader_load(r, index_of(r, "rep"), rep, sizeof(rep)), 0) << ckptio_reader_last_error(r);
  for (int i = 0; i < 24; i++) EXPECT_EQ(row[i], (float)i) << i;
  for (int i = 0; i < 18; i++) EXPECT_EQ(col[i], i) << i;
  const uint16_t halves[5] = {0x0000, 0x3c00, 0x4000, 0x4200, 0x4400};  // 0..4 in float16
  EXPECT_EQ(0, memcmp(rep, halves, sizeof(rep)));

  // row is split by rows over the two files, col by columns; rep is whole.
  EXPECT_EQ(ckptio_reader_part_count(r, index_of(r, "row")), 2u);
  EXPECT_EQ(ckptio_reader_part_count(r, index_of(r, "col")), 2u);
  EXPECT_EQ(ckptio_reader_part_count(r, index_of(r, "rep")), 1u);
  const char *path = nullptr;
  int64_t off[CKPTIO_MAX_DIMS], size[CKPTIO_MAX_DIMS];
  ASSERT_EQ(ckptio_reader_part(r, index_of(r, "col"), 1, &path, off, size), 0);
  EXPECT_EQ(std::string(path), kData + "/__1_0.distcp");
  EXPECT_EQ(off[0], 0);
  EXPECT_EQ(off[1], 3);
  EXPECT_EQ(size[0], 3);
  EXPECT_EQ(size[1], 3);
  ckptio_reader_close(r);
}

TEST(Dcp, BoxesAcrossChunkBoundaries) {
  TestContext c;
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(c.ctx, kData.c_str(), nullptr, &r), 0) << ckptio_last_open_error();
  float rows[4 * 2];  // row[1:5, 1:3]: two rows of each chunk
  int32_t cols[2 * 4];  // col[1:3, 1:5]: columns of both chunks
  ckptio_box_request q[2] = {};
  q[0].index = index_of(r, "row");
  q[0].start[0] = 1, q[0].stop[0] = 5, q[0].start[1] = 1, q[0].stop[1] = 3;
  q[0].dst = rows, q[0].dst_bytes = sizeof(rows);
  q[1].index = index_of(r, "col");
  q[1].start[0] = 1, q[1].stop[0] = 3, q[1].start[1] = 1, q[1].stop[1] = 5;
  q[1].dst = cols, q[1].dst_bytes = sizeof(cols);
  ASSERT_EQ(ckptio_reader_load_boxes(r, q, 2), 0) << ckptio_reader_last_error(r);
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 2; j++) EXPECT_EQ(rows[i * 2 + j], (float)((i + 1) * 4 + j + 1)) << i << "," << j;
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++) EXPECT_EQ(cols[i * 4 + j], (i + 1) * 6 + j + 1) << i << "," << j;
  ckptio_reader_close(r);
}

TEST(Dcp, ByteItemsAndVerify) {
  TestContext c;
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(c.ctx, kData.c_str(), nullptr, &r), 0) << ckptio_last_open_error();
  ckptio_tensor_info info;
  ASSERT_EQ(ckptio_reader_info(r, index_of(r, "__dcp_bytes__.extra.step"), &info), 0);
  EXPECT_EQ(info.dtype, CKPTIO_U8);
  EXPECT_EQ(info.has_crc, 0);
  std::vector<unsigned char> b(info.nbytes);
  ASSERT_EQ(ckptio_reader_load(r, index_of(r, "__dcp_bytes__.extra.step"), b.data(), b.size()), 0);
  ASSERT_GE(b.size(), 4u);
  EXPECT_EQ(0, memcmp(b.data(), "PK\x03\x04", 4));  // the torch.save of the value {"step": 3}'s 3
  size_t unchecked = 99;
  EXPECT_EQ(ckptio_reader_verify(r, &unchecked), 0) << ckptio_reader_last_error(r);
  EXPECT_EQ(unchecked, 1u);  // the byte item: every tensor chunk has its zip CRC-32
  ckptio_reader_close(r);
}

// The same checkpoint through DCP's zstd stream extension: decompressed at
// open, then read like the plain one.
TEST(Dcp, ZstdStreamExtension) {
  TestContext c;
  ckptio_reader *r = nullptr;
  std::string dir = kData + "_zstd";
  ASSERT_EQ(ckptio_reader_open(c.ctx, dir.c_str(), nullptr, &r), 0) << ckptio_last_open_error();
  EXPECT_EQ(ckptio_reader_count(r), 4u);
  float row[24];
  int32_t cols[2 * 4];
  ASSERT_EQ(ckptio_reader_load(r, index_of(r, "row"), row, sizeof(row)), 0) << ckptio_reader_last_error(r);
  for (int i = 0; i < 24; i++) EXPECT_EQ(row[i], (float)i) << i;
  ckptio_box_request q = {};
  q.index = index_of(r, "col");
  q.start[0] = 1, q.stop[0] = 3, q.start[1] = 1, q.stop[1] = 5;
  q.dst = cols, q.dst_bytes = sizeof(cols);
  ASSERT_EQ(ckptio_reader_load_boxes(r, &q, 1), 0) << ckptio_reader_last_error(r);
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++) EXPECT_EQ(cols[i * 4 + j], (i + 1) * 6 + j + 1) << i << "," << j;
  size_t unchecked = 99;
  EXPECT_EQ(ckptio_reader_verify(r, &unchecked), 0) << ckptio_reader_last_error(r);
  EXPECT_EQ(unchecked, 1u);
  ckptio_reader_close(r);
  {  // every byte of a file garbled: its zstd streams are corrupt
    TempDir d;
    for (const char *f : {".metadata", "__0_0.distcp", "__1_0.distcp"})
      write_file(d.file(f), read_file(dir + "/" + f));
    std::vector<uint8_t> f = read_file(d.file("__0_0.distcp"));
    for (size_t i = 0; i < f.size(); i++) f[i] ^= (uint8_t)(i * 31 + 7);  // every stream garbled
    write_file(d.file("__0_0.distcp"), f);
    r = nullptr;
    int rc = ckptio_reader_open(c.ctx, d.path().c_str(), nullptr, &r);
    EXPECT_EQ(rc, CKPTIO_E_ZSTD) << ckptio_last_open_error();
    EXPECT_EQ(r, nullptr);
    ckptio_reader_close(r);
  }
}

TEST(Dcp, DamagedFilesAreRefused) {
  TestContext c;
  ckptio_reader *r = nullptr;
  {  // a file cut short: a chunk's range runs past its end
    TempDir d;
    std::string dir = copy_of(d);
    ASSERT_EQ(truncate(d.file("__1_0.distcp").c_str(), 3000), 0);
    EXPECT_EQ(ckptio_reader_open(c.ctx, dir.c_str(), nullptr, &r), CKPTIO_E_SHARD);
    EXPECT_NE(std::string(ckptio_last_open_error()).find("which has 3000"), std::string::npos)
        << ckptio_last_open_error();
  }
  {  // a flipped byte in row's first chunk: its zip CRC-32 catches it
    TempDir d;
    std::string dir = copy_of(d);
    std::vector<uint8_t> f = read_file(d.file("__0_0.distcp"));
    // row's first chunk is the file's first archive; its 48 data bytes are
    // the 3 x 4 floats 0..11: find 8.0f (0x41000000) and flip it.
    const uint8_t eight[4] = {0x00, 0x00, 0x00, 0x41};
    auto at = std::search(f.begin(), f.end(), eight, eight + 4);
    ASSERT_NE(at, f.end());
    *at ^= 1;
    write_file(d.file("__0_0.distcp"), f);
    ASSERT_EQ(ckptio_reader_open(c.ctx, dir.c_str(), nullptr, &r), 0);
    size_t unchecked;
    EXPECT_EQ(ckptio_reader_verify(r, &unchecked), CKPTIO_E_CHECKSUM) << ckptio_reader_last_error(r);
    float row[24];
    EXPECT_EQ(ckptio_reader_load(r, index_of(r, "row"), row, sizeof(row)), CKPTIO_E_CHECKSUM);
    ckptio_reader_close(r);
    r = nullptr;
  }
  {  // a file missing
    TempDir d;
    std::string dir = copy_of(d);
    ASSERT_EQ(unlink(d.file("__0_0.distcp").c_str()), 0);
    EXPECT_EQ(ckptio_reader_open(c.ctx, dir.c_str(), nullptr, &r), -ENOENT);
    EXPECT_NE(std::string(ckptio_last_open_error()).find("__0_0.distcp"), std::string::npos);
  }
  {  // a .metadata cut short
    TempDir d;
    std::string dir = copy_of(d);
    ASSERT_EQ(truncate(d.file(".metadata").c_str(), 700), 0);
    EXPECT_EQ(ckptio_reader_open(c.ctx, dir.c_str(), nullptr, &r), CKPTIO_E_PICKLE);
    EXPECT_NE(std::string(ckptio_last_open_error()).find(".metadata"), std::string::npos);
  }
  EXPECT_EQ(r, nullptr);
}

// The fixture's .metadata with bytes replaced (same length, so the pickle
// stays well formed), parsed alone.
std::string parse_error(const std::string &from, const std::string &to) {
  std::vector<uint8_t> m = read_file(kData + "/.metadata");
  std::string text(m.begin(), m.end());
  size_t n = 0;
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + 1), n++)
    text.replace(at, from.size(), to);
  EXPECT_GT(n, 0u) << from;
  ckptio_dcp_meta meta;
  char err[CKPTIO_ERRLEN] = "";
  int rc = ckptio_dcp_meta_parse((const uint8_t *)text.data(), text.size(), &meta, err, sizeof(err));
  ckptio_dcp_meta_free(&meta);
  return rc < 0 ? std::to_string(rc) + " " + err : "ok";
}

TEST(DcpMeta, HostileMetadataIsRefusedNamingTheRule) {
  EXPECT_EQ(parse_error("__1_0.distcp", "__1_0.distcp"), "ok");
  std::string e = parse_error("__1_0.distcp", "../__1_0.dis");
  EXPECT_NE(e.find("not a plain file name"), std::string::npos) << e;
  e = parse_error("TensorStorageMetadata", "TensorStorageMetadatX");
  EXPECT_NE(e.find("TensorStorageMetadatX' is not allowed"), std::string::npos) << e;
  e = parse_error("_StorageInfo", "_StorageIdea");
  EXPECT_NE(e.find("filesystem._StorageIdea' is not allowed"), std::string::npos) << e;
  e = parse_error("relative_path", "relative_pith");  // a field missing
  EXPECT_NE(e.find("relative_path is missing"), std::string::npos) << e;
  EXPECT_EQ(e.find(" .metadata: "), e.find(' ')) << e;  // the walk's failures name the file first

  // A REDUCE of os.system (protocol 2, and posix.system by STACK_GLOBAL).
  const std::string cmd = "touch /nonexistent/ckptio-ran";
  std::string p2 = std::string("\x80\x02" "cos\nsystem\nX") + std::string(1, (char)cmd.size()) + std::string(3, '\0') + cmd + "\x85R.";
  std::string p4 = std::string("\x80\x04\x8c\x05posix\x94\x8c\x06system\x94\x93\x94\x8c") +
                   std::string(1, (char)cmd.size()) + cmd + "\x85R.";
  for (const std::string &p : {p2, p4}) {
    ckptio_dcp_meta meta;
    char err[CKPTIO_ERRLEN] = "";
    EXPECT_EQ(ckptio_dcp_meta_parse((const uint8_t *)p.data(), p.size(), &meta, err, sizeof(err)), CKPTIO_E_PICKLE);
    EXPECT_NE(std::string(err).find("system' is not allowed"), std::string::npos) << err << " (" << p.size() << " bytes)";
    ckptio_dcp_meta_free(&meta);
  }
  // MARKs nested past the limit, and 100,000 nested lists (the walk never recurses).
  std::string marks = "\x80\x04" + std::string(100000, '(') + ".";
  std::string lists = "\x80\x04" + std::string(100000, ']') + std::string(99999, 'a') + ".";
  for (const std::string &p : {marks, lists}) {
    ckptio_dcp_meta meta;
    char err[CKPTIO_ERRLEN] = "";
    EXPECT_EQ(ckptio_dcp_meta_parse((const uint8_t *)p.data(), p.size(), &meta, err, sizeof(err)), CKPTIO_E_PICKLE);
    ckptio_dcp_meta_free(&meta);
  }
}

}  // namespace
