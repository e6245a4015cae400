// ckptio_reader_map_private: the caller's copy-on-write mapping of the
// reader's file, CRC-checked over its own pages; writes stay private, it
// outlives the reader, a file renamed over the path does not change it, and
// a flipped byte returns CKPTIO_E_CHECKSUM with no mapping.

// Uses ckptio_reader_map_private, ckptio_map_free and ckptio_reader_resident,
// of ckptio.h's experimental section.
#define CKPTIO_EXPERIMENTAL

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "ckpt_fixture.h"

using namespace ckptio_test;

namespace {

std::vector<Tensor> model(uint64_t seed) {
  return {make_tensor("a", CKPTIO_F32, {3, 65537}, seed),  // several pieces of 64 KiB
          make_tensor("b", CKPTIO_BF16, {7}, seed + 1), make_tensor("c", CKPTIO_U8, {0}, seed + 2)};
}

// Every tensor's bytes at base + offset.
void expect_tensors(ckptio_reader *r, const unsigned char *base, const std::vector<Tensor> &ts) {
  ASSERT_EQ(ckptio_reader_count(r), ts.size());
  for (const Tensor &t : ts) {
    int64_t i = ckptio_reader_find(r, t.name.c_str());
    ASSERT_GE(i, 0) << t.name;
    ckptio_tensor_info info;
    ASSERT_EQ(ckptio_reader_info(r, (size_t)i, &info), 0);
    ASSERT_EQ(info.nbytes, t.bytes.size()) << t.name;
    if (!t.bytes.empty()) {  // (an empty vector's data() may be NULL)
      EXPECT_EQ(0, memcmp(base + info.offset, t.bytes.data(), t.bytes.size())) << t.name;
    }
  }
}

size_t pages(uint64_t size) { return (size_t)((size + 4095) / 4096); }

// Pages of [base, base + size) in memory (0 if mincore fails).
size_t resident_pages(const void *base, uint64_t size) {
  std::vector<unsigned char> vec(pages(size));
  size_t n = 0;
  if (mincore(const_cast<void *>(base), (size_t)size, vec.data()) == 0)
    for (unsigned char v : vec) n += v & 1;
  return n;
}

// Pages of path in the page cache (mapped, not touched), of *total.
size_t resident_file_pages(const std::string &path, size_t *total) {
  int fd = open(path.c_str(), O_RDONLY);
  off_t size = lseek(fd, 0, SEEK_END);
  *total = pages((uint64_t)size);
  void *m = mmap(nullptr, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
  size_t n = m != MAP_FAILED ? resident_pages(m, (uint64_t)size) : 0;
  if (m != MAP_FAILED) munmap(m, (size_t)size);
  close(fd);
  return n;
}

// Drops path from the page cache; false where the filesystem keeps it
// cached anyway (tmpfs), which a cold-file test must skip.
bool dropped_from_cache(const std::string &path) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return false;
  fdatasync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
  size_t total = 0;
  return resident_file_pages(path, &total) <= total / 20;
}

// save() of the fixture writes safetensors; this writes either format.
void save_as(ckptio_ctx *ctx, const std::string &path, ckptio_format f, const std::vector<Tensor> &ts) {
  ckptio_writer *w = nullptr;
  ASSERT_EQ(ckptio_writer_open(ctx, path.c_str(), f, nullptr, &w), 0);
  for (const Tensor &t : ts) {
    ckptio_tensor d{};
    d.name = t.name.c_str();
    d.dtype = t.dtype;
    d.ndim = (int)t.shape.size();
    for (size_t k = 0; k < t.shape.size(); k++) d.shape[k] = t.shape[k];
    d.data = t.bytes.data();
    d.device = CKPTIO_DEVICE_HOST;
    ASSERT_EQ(ckptio_writer_add(w, &d), 0);
  }
  ASSERT_EQ(ckptio_writer_commit(w), 0) << ckptio_writer_last_error(w);
  ckptio_writer_close(w);
}

}  // namespace

TEST(ReaderMap, EqualWritablePrivateAndOutlivesTheReader) {
  TempDir dir;
  TestContext c;
  std::string path = dir.file("m.safetensors");
  auto ts = model(1);
  ASSERT_EQ(save(c.ctx, path, ts), 0);
  std::vector<uint8_t> file = read_file(path);
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(c.ctx, path.c_str(), nullptr, &r), 0);
  void *base = nullptr;
  uint64_t size = 0;
  ASSERT_EQ(ckptio_reader_map_private(r, &base, &size), 0) << ckptio_reader_last_error(r);
  ASSERT_NE(base, nullptr);
  ASSERT_EQ(size, file.size());
  EXPECT_EQ(0, memcmp(base, file.data(), file.size()));
  expect_tensors(r, (const unsigned char *)base, ts);
  // The CRC pass mapped the pages in: all resident before any touch here.
  EXPECT_EQ(resident_pages(base, size), pages(size));
  ckptio_tensor_info a;
  ASSERT_EQ(ckptio_reader_info(r, (size_t)ckptio_reader_find(r, "a"), &a), 0);
  ckptio_reader_close(r);
  // Writes after the reader is gone: private to this mapping.
  memset((unsigned char *)base + a.offset, 0xAB, (size_t)a.nbytes);
  EXPECT_EQ(read_file(path), file);
  ASSERT_EQ(ckptio_reader_open(c.ctx, path.c_str(), nullptr, &r), 0);
  size_t unchecked = 99;
  EXPECT_EQ(ckptio_reader_verify(r, &unchecked), 0);
  EXPECT_EQ(unchecked, 0u);
  ckptio_reader_close(r);
  EXPECT_EQ(ckptio_map_free(base, size), 0);
  EXPECT_EQ(ckptio_map_free(nullptr, 0), 0);
}

TEST(ReaderMap, AFileSavedOverThePathDoesNotChangeIt) {
  TempDir dir;
  TestContext c;
  std::string path = dir.file("m.pt");
  auto old_ts = model(1), new_ts = model(50);
  save_as(c.ctx, path, CKPTIO_FORMAT_PYTORCH, old_ts);
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(c.ctx, path.c_str(), nullptr, &r), 0);
  void *base = nullptr;
  uint64_t size = 0;
  ASSERT_EQ(ckptio_reader_map_private(r, &base, &size), 0) << ckptio_reader_last_error(r);
  save_as(c.ctx, path, CKPTIO_FORMAT_PYTORCH, new_ts);  // temp file + rename: a new inode
  ASSERT_EQ(unlink(path.c_str()), 0);
  expect_tensors(r, (const unsigned char *)base, old_ts);
  ckptio_reader_close(r);
  EXPECT_EQ(ckptio_map_free(base, size), 0);
}

TEST(ReaderMap, AFlippedByteIsRefusedWithNoMapping) {
  TempDir dir;
  TestContext c;
  for (ckptio_format f : {CKPTIO_FORMAT_SAFETENSORS, CKPTIO_FORMAT_PYTORCH}) {
    std::string path = dir.file(f == CKPTIO_FORMAT_PYTORCH ? "bad.pt" : "bad.safetensors");
    save_as(c.ctx, path, f, model(3));
    ckptio_reader *r = nullptr;
    ASSERT_EQ(ckptio_reader_open(c.ctx, path.c_str(), nullptr, &r), 0);
    ckptio_tensor_info info;
    ASSERT_EQ(ckptio_reader_info(r, (size_t)ckptio_reader_find(r, "a"), &info), 0);
    ckptio_reader_close(r);
    std::vector<uint8_t> bytes = read_file(path);
    bytes[info.offset + 200000] ^= 0x10;  // in the second half of 'a'
    write_file(path, bytes);
    ASSERT_EQ(ckptio_reader_open(c.ctx, path.c_str(), nullptr, &r), 0);
    void *base = (void *)1;
    uint64_t size = 7;
    EXPECT_EQ(ckptio_reader_map_private(r, &base, &size), CKPTIO_E_CHECKSUM);
    EXPECT_EQ(base, nullptr);
    EXPECT_EQ(size, 0u);
    EXPECT_NE(strstr(ckptio_reader_last_error(r), "tensor 'a': checksum mismatch"), nullptr)
        << ckptio_reader_last_error(r);
    ckptio_reader_close(r);
    // crc off: the bytes as they are, flipped one included.
    ckptio_options off = small_options();
    off.crc = 0;
    ASSERT_EQ(ckptio_reader_open(c.ctx, path.c_str(), &off, &r), 0);
    ASSERT_EQ(ckptio_reader_map_private(r, &base, &size), 0);
    EXPECT_EQ(0, memcmp(base, bytes.data(), bytes.size()));
    ckptio_reader_close(r);
    EXPECT_EQ(ckptio_map_free(base, size), 0);
  }
}

TEST(ReaderMap, BadArguments) {
  void *base = nullptr;
  uint64_t size = 0;
  EXPECT_EQ(ckptio_reader_map_private(nullptr, &base, &size), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(ckptio_reader_map_private(nullptr, nullptr, &size), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(ckptio_reader_map_private(nullptr, &base, nullptr), CKPTIO_E_INVALID_ARG);
}

// A .pt has a zip local header before every tensor, which opening it checks.
// Read through the file's mapping with the kernel's read-around, each of
// those reads a window of the disk's read-ahead size (8 MiB on the virtual
// disks here, 128 KiB by default) around it: most of a cold file, one window
// at a time, before the load itself reads it again.
TEST(ReaderMap, OpeningAColdPtReadsItsHeadersNotItsTensors) {
  TempDir dir;
  TestContext c;
  std::string path = dir.file("m.pt");
  std::vector<Tensor> ts;
  for (int k = 0; k < 64; k++) ts.push_back(make_tensor("t" + std::to_string(k), CKPTIO_F32, {65536}, k));
  save_as(c.ctx, path, CKPTIO_FORMAT_PYTORCH, ts);
  if (!dropped_from_cache(path))
    GTEST_SKIP() << "this filesystem keeps the file cached after POSIX_FADV_DONTNEED (tmpfs?)";
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(c.ctx, path.c_str(), nullptr, &r), 0);
  EXPECT_EQ(ckptio_reader_count(r), ts.size());
  size_t total = 0, read = resident_file_pages(path, &total);
  EXPECT_LT(read, total / 10) << "opening read " << read << " of " << total << " pages";
  std::vector<uint8_t> got(ts[5].bytes.size());
  ASSERT_EQ(ckptio_reader_load(r, (size_t)ckptio_reader_find(r, "t5"), got.data(), got.size()), 0);
  EXPECT_EQ(got, ts[5].bytes) << "a load after the open";
  ckptio_reader_close(r);
}

// ckptio_reader_resident samples what the page cache holds, CKPTIO_LOAD_AUTO
// decides by it (pread warm; cold, through the page cache when the load
// fits in memory, as here, filled ahead and mapped, and the file is then
// resident: test_cache_policy has the rest), and
// ckptio_stats.load_methods shows the choice, as the zero-copy map's MMAP.
TEST(ReaderMap, ResidentShareDecidesAutoAndStatsShowIt) {
  TempDir dir;
  TestContext c;
  std::string path = dir.file("resident.safetensors");
  std::vector<Tensor> ts;
  for (int k = 0; k < 16; k++) ts.push_back(make_tensor("t" + std::to_string(k), CKPTIO_F32, {1 << 18}, k));
  save_as(c.ctx, path, CKPTIO_FORMAT_SAFETENSORS, ts);
  if (!dropped_from_cache(path))
    GTEST_SKIP() << "this filesystem keeps the file cached after POSIX_FADV_DONTNEED (tmpfs?)";
  int dfd = open(path.c_str(), O_RDONLY | O_DIRECT);
  if (dfd < 0) GTEST_SKIP() << "this filesystem refuses O_DIRECT: AUTO reads it by pread";
  close(dfd);

  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(c.ctx, path.c_str(), nullptr, &r), 0);
  double share = -1;
  ASSERT_EQ(ckptio_reader_resident(r, &share), 0);
  EXPECT_LT(share, 0.2) << "a dropped file";
  std::vector<std::vector<uint8_t>> got(ts.size());
  std::vector<ckptio_load_request> reqs;
  for (size_t k = 0; k < ts.size(); k++) {
    got[k].resize(ts[k].bytes.size());
    reqs.push_back({(size_t)ckptio_reader_find(r, ts[k].name.c_str()), got[k].data(), got[k].size(),
                    CKPTIO_DEVICE_HOST});
  }
  ckptio_stats st = CKPTIO_STATS_INIT;
  ASSERT_EQ(ckptio_reader_load_many(r, reqs.data(), reqs.size()), 0) << ckptio_reader_last_error(r);
  ASSERT_EQ(ckptio_reader_stats(r, &st), 0);
  EXPECT_EQ(st.load_methods, 1u << CKPTIO_LOAD_MMAP) << "a cold file that fits in memory, AUTO: filled ahead";
  ASSERT_EQ(ckptio_reader_resident(r, &share), 0);
  EXPECT_GT(share, 0.9) << "the cold AUTO load left the file in the page cache";
  for (size_t k = 0; k < ts.size(); k++) EXPECT_EQ(got[k], ts[k].bytes) << ts[k].name;

  // Read through the page cache: now resident, and AUTO reads by pread.
  std::vector<uint8_t> all(4 << 20);
  int fd = open(path.c_str(), O_RDONLY);
  while (read(fd, all.data(), all.size()) > 0) {
  }
  close(fd);
  ASSERT_EQ(ckptio_reader_resident(r, &share), 0);
  EXPECT_GT(share, 0.9) << "a file just read";
  ASSERT_EQ(ckptio_reader_load_many(r, reqs.data(), reqs.size()), 0) << ckptio_reader_last_error(r);
  ASSERT_EQ(ckptio_reader_stats(r, &st), 0);
  EXPECT_EQ(st.load_methods, 1u << CKPTIO_LOAD_PREAD) << "a warm file, AUTO";

  void *base = nullptr;
  uint64_t size = 0;
  ASSERT_EQ(ckptio_reader_map_private(r, &base, &size), 0);
  ASSERT_EQ(ckptio_reader_stats(r, &st), 0);
  EXPECT_EQ(st.load_methods, 1u << CKPTIO_LOAD_MMAP) << "the zero-copy map";
  ckptio_map_free(base, size);
  EXPECT_EQ(ckptio_reader_resident(nullptr, &share), CKPTIO_E_INVALID_ARG);
  ckptio_reader_close(r);
}
