#include "test_util.h"

#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <stdexcept>

namespace ckptio_test {

TempDir::TempDir() {
  const char *base = getenv("CKPTIO_TEST_TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/ckptio-test-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed: " + tmpl);
  path_ = buf.data();
}

TempDir::~TempDir() {
  for (const auto &name : list()) unlink(file(name).c_str());
  rmdir(path_.c_str());
}

std::vector<std::string> TempDir::list() const {
  std::vector<std::string> names;
  DIR *d = opendir(path_.c_str());
  if (!d) return names;
  while (struct dirent *e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<uint8_t> read_file(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void write_file(const std::string &path, const std::vector<uint8_t> &bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char *>(bytes.data()), (std::streamsize)bytes.size());
}

void write_file(const std::string &path, const std::string &bytes) {
  write_file(path, std::vector<uint8_t>(bytes.begin(), bytes.end()));
}

std::vector<uint8_t> pattern(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[i] = (uint8_t)x;
  }
  return v;
}

}  // namespace ckptio_test

// Sanitizer hooks (the names are the sanitizers', not ours). hwloc's
// topology plugins allocate on load and are unloaded before exit, so that
// leak is theirs; the slow unwinder is needed to see hwloc_topology_load in
// such a stack at all. Every other leak still fails the test.
extern "C" const char *__lsan_default_suppressions() { return "leak:hwloc_topology_load\n"; }
extern "C" const char *__asan_default_options() { return "fast_unwind_on_malloc=0"; }
