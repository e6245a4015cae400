// CKPTIO_LOAD_AUTO and the page cache (issue 45): a cold load that fits in
// memory reads through the cache and leaves the file there for the next
// load (a restarted process's included): filled ahead by the load's own
// threads and copied from the map (MMAP in the stats) where every request is
// a stretch of the file into host memory, else by pread; CKPTIO_LOAD_DIRECT,
// or a load that does not fit (a memory cgroup's limit), reads by O_DIRECT
// and leaves it cold. The stats say which.
#define CKPTIO_EXPERIMENTAL  // ckptio_reader_resident
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "ckpt_fixture.h"
extern "C" {
#include "io/cache.h"
}

using namespace ckptio_test;

namespace {

// Evicts path's pages (synced first: dirty pages stay); false where the
// filesystem keeps them (tmpfs) and the test cannot see a cold file.
bool drop_cache(const std::string &path) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return false;
  fsync(fd);
  bool ok = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
  close(fd);
  return ok;
}

double resident(ckptio_ctx *ctx, const std::string &path) {
  ckptio_reader *r = nullptr;
  double share = -1;
  if (ckptio_reader_open(ctx, path.c_str(), nullptr, &r) == 0) ckptio_reader_resident(r, &share);
  ckptio_reader_close(r);
  return share;
}

// Saves ts to path and evicts it from the page cache; false where the
// filesystem keeps it (tmpfs), so the test cannot see a cold file.
bool save_cold(ckptio_ctx *ctx, const std::string &path, const std::vector<Tensor> &ts) {
  EXPECT_EQ(save(ctx, path, ts), 0);
  return drop_cache(path) && resident(ctx, path) <= 0.1;
}
#define NO_COLD_FILE "the page cache keeps the file (tmpfs?): a cold file cannot be made here"

// Requests loading ts (by name) into out, sized here.
std::vector<ckptio_load_request> requests(ckptio_reader *r, const std::vector<Tensor> &ts,
                                          std::vector<std::vector<uint8_t>> &out) {
  std::vector<ckptio_load_request> reqs;
  out.resize(ts.size());
  for (size_t i = 0; i < ts.size(); i++) {
    out[i].resize(ts[i].bytes.size());
    reqs.push_back({(size_t)ckptio_reader_find(r, ts[i].name.c_str()), out[i].data(), out[i].size(),
                    CKPTIO_DEVICE_HOST});
  }
  return reqs;
}

// Loads every tensor of path with `method`; the stats' load_methods.
uint32_t load_all(ckptio_ctx *ctx, const std::string &path, ckptio_load_method method, const std::vector<Tensor> &ts) {
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  o.load_method = method;
  ckptio_reader *r = nullptr;
  EXPECT_EQ(ckptio_reader_open(ctx, path.c_str(), &o, &r), 0) << ckptio_last_open_error();
  if (!r) return 0;
  std::vector<std::vector<uint8_t>> out;
  std::vector<ckptio_load_request> reqs = requests(r, ts, out);
  EXPECT_EQ(ckptio_reader_load_many(r, reqs.data(), reqs.size()), 0) << ckptio_reader_last_error(r);
  for (size_t i = 0; i < ts.size(); i++) EXPECT_EQ(out[i], ts[i].bytes) << ts[i].name;
  ckptio_stats st = CKPTIO_STATS_INIT;
  EXPECT_EQ(ckptio_reader_stats(r, &st), 0);
  ckptio_reader_close(r);
  return st.load_methods;
}

std::vector<Tensor> model(int mib) {
  std::vector<Tensor> ts;
  for (int i = 0; i < mib / 4; i++) ts.push_back(make_tensor("w" + std::to_string(i), CKPTIO_F32, {1 << 20}, i));
  return ts;
}

}  // namespace

TEST(CachePolicy, AvailableMemoryIsReadAndBoundsTheCache) {
  uint64_t avail = ckptio_memory_available();
  ASSERT_NE(avail, UINT64_MAX) << "no /proc/meminfo";
  EXPECT_GT(avail, 0u);
  // Far from the half on either side: the tests running beside this one
  // move MemAvailable between the calls (the half itself is the cgroup
  // test's, below, where the limit is fixed).
  EXPECT_TRUE(ckptio_cache_fits(1 << 20));
  EXPECT_TRUE(ckptio_cache_fits(avail / 8));
  EXPECT_FALSE(ckptio_cache_fits(avail * 2));
}

TEST(CachePolicy, AutoLeavesAColdFileCachedAndDirectDoesNot) {
  TempDir dir;
  TestContext c(small_options(1 << 20, 8 << 20, 4));
  auto ts = model(16);
  const std::string path = dir.file("m.safetensors");
  if (!save_cold(c.ctx, path, ts)) GTEST_SKIP() << NO_COLD_FILE;
  // Cold: filled ahead through the map and copied behind the filler.
  EXPECT_EQ(load_all(c.ctx, path, CKPTIO_LOAD_AUTO, ts), 1u << CKPTIO_LOAD_MMAP);
  EXPECT_GT(resident(c.ctx, path), 0.9) << "the next load would read the disk again";
  EXPECT_EQ(load_all(c.ctx, path, CKPTIO_LOAD_AUTO, ts), 1u << CKPTIO_LOAD_PREAD);  // warm: from memory

  ASSERT_TRUE(drop_cache(path));
  uint32_t m = load_all(c.ctx, path, CKPTIO_LOAD_DIRECT, ts);
  if (m == 1u << CKPTIO_LOAD_PREAD) GTEST_SKIP() << "O_DIRECT refused on " << dir.path();
  EXPECT_EQ(m, 1u << CKPTIO_LOAD_DIRECT);
  EXPECT_LT(resident(c.ctx, path), 0.1) << "an O_DIRECT load filled the page cache";
}

// The filler reads in file order and the copies wait for it: requests in
// the reverse order of the file, a few tensors only, and one tensor twice,
// on more workers than the filler has threads, all land byte for byte.
TEST(CachePolicy, ColdAutoInAnyOrderLandsEveryByte) {
  TempDir dir;
  TestContext c(small_options(1 << 20, 8 << 20, 8));
  auto ts = model(32);
  const std::string path = dir.file("m.safetensors");
  if (!save_cold(c.ctx, path, ts)) GTEST_SKIP() << NO_COLD_FILE;
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(c.ctx, path.c_str(), nullptr, &r), 0) << ckptio_last_open_error();
  std::vector<Tensor> pick;
  for (size_t i = ts.size(); i-- > 0;)
    if (i % 3 != 1) pick.push_back(ts[i]);
  pick.push_back(pick.front());
  std::vector<std::vector<uint8_t>> out;
  std::vector<ckptio_load_request> reqs = requests(r, pick, out);
  ASSERT_EQ(ckptio_reader_load_many(r, reqs.data(), reqs.size()), 0) << ckptio_reader_last_error(r);
  ckptio_stats st = CKPTIO_STATS_INIT;
  ASSERT_EQ(ckptio_reader_stats(r, &st), 0);
  EXPECT_EQ(st.load_methods, 1u << CKPTIO_LOAD_MMAP);
  for (size_t k = 0; k < pick.size(); k++) EXPECT_EQ(out[k], pick[k].bytes) << pick[k].name;
  ckptio_reader_close(r);
}

// A cold load with a slice of many runs among its requests is no stretch
// into host memory for the filler: AUTO reads that load by pread, and it
// lands; a cold load of a whole tensor before it, on the same reader, is
// filled.
TEST(CachePolicy, ColdAutoWithAColumnSliceReadsByPread) {
  TempDir dir;
  TestContext c(small_options(1 << 20, 8 << 20, 4));
  std::vector<Tensor> ts;
  for (int i = 0; i < 4; i++) ts.push_back(make_tensor("w" + std::to_string(i), CKPTIO_F32, {8, 1 << 19}, i));
  const std::string path = dir.file("m.safetensors");
  if (!save_cold(c.ctx, path, ts)) GTEST_SKIP() << NO_COLD_FILE;
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(c.ctx, path.c_str(), nullptr, &r), 0) << ckptio_last_open_error();
  std::vector<uint8_t> whole(ts[0].bytes.size());
  ASSERT_EQ(ckptio_reader_load(r, (size_t)ckptio_reader_find(r, "w0"), whole.data(), whole.size()), 0)
      << ckptio_reader_last_error(r);
  ckptio_stats st = CKPTIO_STATS_INIT;
  ASSERT_EQ(ckptio_reader_stats(r, &st), 0);
  EXPECT_EQ(st.load_methods, 1u << CKPTIO_LOAD_MMAP) << "whole w0 from a cold file";
  EXPECT_EQ(whole, ts[0].bytes);

  const size_t row = 4u << 19;
  // w2's first half of every row (8 runs of 1 MiB), w3's rows 2..5 (one run).
  std::vector<uint8_t> cols(8 * row / 2), rows(4 * row);
  ckptio_slice_request sl[2] = {};
  sl[0].index = (size_t)ckptio_reader_find(r, "w2"), sl[0].dim = 1, sl[0].start = 0, sl[0].stop = 1 << 18;
  sl[0].dst = cols.data(), sl[0].dst_bytes = cols.size(), sl[0].device = CKPTIO_DEVICE_HOST;
  sl[1].index = (size_t)ckptio_reader_find(r, "w3"), sl[1].dim = 0, sl[1].start = 2, sl[1].stop = 6;
  sl[1].dst = rows.data(), sl[1].dst_bytes = rows.size(), sl[1].device = CKPTIO_DEVICE_HOST;
  ASSERT_EQ(ckptio_reader_load_slices(r, sl, 2), 0) << ckptio_reader_last_error(r);
  ASSERT_EQ(ckptio_reader_stats(r, &st), 0);
  EXPECT_EQ(st.load_methods, 1u << CKPTIO_LOAD_PREAD) << "a load with a slice of many runs";
  for (int i = 0; i < 8; i++)
    ASSERT_EQ(0, memcmp(cols.data() + i * row / 2, ts[2].bytes.data() + i * row, row / 2)) << "row " << i;
  EXPECT_EQ(0, memcmp(rows.data(), ts[3].bytes.data() + 2 * row, rows.size()));
  ckptio_reader_close(r);
}

// The private map of a cold file (what Python's default load hands out):
// filled ahead as a load is, every CRC checked behind the filler, and the
// file left cached.
TEST(CachePolicy, ColdPrivateMapIsFilledCheckedAndLeftCached) {
  TempDir dir;
  TestContext c(small_options(1 << 20, 8 << 20, 4));
  auto ts = model(24);
  const std::string path = dir.file("m.safetensors");
  if (!save_cold(c.ctx, path, ts)) GTEST_SKIP() << NO_COLD_FILE;
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(c.ctx, path.c_str(), nullptr, &r), 0) << ckptio_last_open_error();
  void *base = nullptr;
  uint64_t size = 0;
  ASSERT_EQ(ckptio_reader_map_private(r, &base, &size), 0) << ckptio_reader_last_error(r);
  for (const Tensor &t : ts) {
    ckptio_tensor_info in;
    ASSERT_EQ(ckptio_reader_info(r, (size_t)ckptio_reader_find(r, t.name.c_str()), &in), 0);
    ASSERT_EQ(0, memcmp((const uint8_t *)base + in.offset, t.bytes.data(), t.bytes.size())) << t.name;
  }
  EXPECT_GT(resident(c.ctx, path), 0.9) << "the next load would read the disk again";
  EXPECT_EQ(ckptio_map_free(base, size), 0);
  ckptio_reader_close(r);
}

// A cold set of more member files than the process runs fillers at once
// (4): the first members are filled, the rest read by pread as before,
// and every byte lands.
TEST(CachePolicy, ColdSetOfManyFilesFillsSomeAndPreadsTheRest) {
  TempDir dir;
  TestContext c(small_options(1 << 20, 8 << 20, 4));
  auto ts = model(24);  // six 4 MiB tensors: a shard each
  ckptio_writer *w = nullptr;
  ASSERT_EQ(ckptio_writer_open_sharded(c.ctx, dir.path().c_str(), "model", CKPTIO_FORMAT_SAFETENSORS, 4 << 20,
                                       CKPTIO_SHARD_ORDER_ADDED, nullptr, &w), 0) << ckptio_last_open_error();
  for (const Tensor &t : ts) {
    ckptio_tensor d = host_desc(t);
    ASSERT_EQ(ckptio_writer_add(w, &d), 0) << ckptio_writer_last_error(w);
  }
  ASSERT_EQ(ckptio_writer_commit(w), 0) << ckptio_writer_last_error(w);
  ASSERT_EQ(ckptio_writer_shard_count(w), 6u);
  ASSERT_EQ(ckptio_writer_close(w), 0);
  for (int k = 1; k <= 6; k++) {
    char name[64];
    snprintf(name, sizeof(name), "model-%05d-of-00006.safetensors", k);
    if (!drop_cache(dir.file(name)) || resident(c.ctx, dir.file(name)) > 0.1) GTEST_SKIP() << NO_COLD_FILE;
  }
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(c.ctx, dir.path().c_str(), nullptr, &r), 0) << ckptio_last_open_error();
  std::vector<std::vector<uint8_t>> out;
  std::vector<ckptio_load_request> reqs = requests(r, ts, out);
  ASSERT_EQ(ckptio_reader_load_many(r, reqs.data(), reqs.size()), 0) << ckptio_reader_last_error(r);
  ckptio_stats st = CKPTIO_STATS_INIT;
  ASSERT_EQ(ckptio_reader_stats(r, &st), 0);
  EXPECT_EQ(st.load_methods, (1u << CKPTIO_LOAD_MMAP) | (1u << CKPTIO_LOAD_PREAD));
  for (size_t i = 0; i < ts.size(); i++) EXPECT_EQ(out[i], ts[i].bytes) << ts[i].name;
  ckptio_reader_close(r);
}

// A cold file cut short after it was opened: the filler stops where the
// pages end and the copies behind it report the missing bytes, a clean
// error (never SIGBUS, never a wait on a filler that has stopped).
TEST(CachePolicy, ColdAutoOfAFileCutShortIsAnError) {
  TempDir dir;
  TestContext c(small_options(1 << 20, 8 << 20, 4));
  auto ts = model(16);
  const std::string path = dir.file("m.safetensors");
  if (!save_cold(c.ctx, path, ts)) GTEST_SKIP() << NO_COLD_FILE;
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(c.ctx, path.c_str(), nullptr, &r), 0) << ckptio_last_open_error();
  ASSERT_EQ(truncate(path.c_str(), 6 << 20), 0);  // w1 (at 4 MiB) partly, nothing after
  std::vector<std::vector<uint8_t>> out;
  std::vector<ckptio_load_request> reqs = requests(r, ts, out);
  EXPECT_EQ(ckptio_reader_load_many(r, reqs.data(), reqs.size()), CKPTIO_E_SHORT_IO) << ckptio_reader_last_error(r);
  ckptio_stats st = CKPTIO_STATS_INIT;
  ASSERT_EQ(ckptio_reader_stats(r, &st), 0);
  EXPECT_EQ(st.load_methods, 1u << CKPTIO_LOAD_MMAP) << "the filled way was the one tried";
  ckptio_reader_close(r);
}

// A child in a memory cgroup (v1 or v2) whose limit leaves less than twice
// the file: AUTO reads it by O_DIRECT, and the load completes inside the
// limit. Skipped where no cgroup can be made (not root, no controller).
TEST(CachePolicy, AMemoryLimitTurnsAutoToDirect) {
#ifdef __SANITIZE_THREAD__
  GTEST_SKIP() << "ThreadSanitizer's shadow memory does not fit the child's 80 MiB limit";
#endif
  TempDir dir;
  auto ts = model(48);
  const std::string path = dir.file("m.safetensors");
  {
    TestContext c(small_options(1 << 20, 8 << 20, 4));
    ASSERT_EQ(save(c.ctx, path, ts), 0);
  }
  // This process's memory cgroup directory and its files' names.
  std::ifstream cg("/proc/self/cgroup");
  std::string line, group, limit_file;
  while (std::getline(cg, line)) {
    size_t v1 = line.find(":memory:");
    if (v1 != std::string::npos) {
      group = "/sys/fs/cgroup/memory" + line.substr(v1 + 8), limit_file = "memory.limit_in_bytes";
      break;
    }
    if (line.rfind("0::", 0) == 0) group = "/sys/fs/cgroup" + line.substr(3), limit_file = "memory.max";
  }
  std::string child = group + "/ckptio-cache-test-" + std::to_string(getpid());
  if (group.empty() || mkdir(child.c_str(), 0755) != 0 || access((child + "/" + limit_file).c_str(), W_OK) != 0) {
    rmdir(child.c_str());
    GTEST_SKIP() << "cannot make a memory cgroup under '" << group << "' here";
  }
  pid_t pid = fork();
  if (pid == 0) {
    alarm(60);
    auto put = [&](const std::string &file, const std::string &v) {
      std::ofstream f(child + "/" + file);
      f << v;
      return (bool)f.flush();
    };
    // 80 MiB: the 48 MiB file does not fit twice; its 48 MiB of
    // destinations and a small context do.
    if (!put(limit_file, std::to_string(80 << 20)) || !put("cgroup.procs", std::to_string(getpid()))) _exit(10);
    if (ckptio_cache_fits(48 << 20)) _exit(11);
    if (!drop_cache(path)) _exit(12);
    ckptio_options o = small_options(1 << 20, 4 << 20, 4);
    ckptio_ctx *ctx = nullptr;
    if (ckptio_ctx_create(&o, &ctx) != 0) _exit(13);
    uint32_t m = load_all(ctx, path, CKPTIO_LOAD_AUTO, ts);
    _exit(::testing::Test::HasFailure() ? 14 : m == 1u << CKPTIO_LOAD_DIRECT ? 0 : 15);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  rmdir(child.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status) << " (over its limit?)";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10-13: setup, 14: a wrong byte, 15: not read by O_DIRECT";
}
