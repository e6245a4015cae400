// Shared helpers of the unit tests: a fresh directory per test, file
// helpers and deterministic data.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace ckptio_test {

// A new empty directory under $CKPTIO_TEST_TMPDIR (or /tmp), removed with
// everything in it when the object goes out of scope.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string &path() const { return path_; }
  std::string file(const std::string &name) const { return path_ + "/" + name; }
  std::vector<std::string> list() const;  // entry names, sorted

 private:
  std::string path_;
};

// An environment variable set for a scope (test builds read some of the
// library's at each use), unset after.
class ScopedEnv {
 public:
  ScopedEnv(const char *name, const char *value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv &) = delete;
  ScopedEnv &operator=(const ScopedEnv &) = delete;

 private:
  const char *name_;
};

std::vector<uint8_t> read_file(const std::string &path);
void write_file(const std::string &path, const std::vector<uint8_t> &bytes);
void write_file(const std::string &path, const std::string &bytes);
// Deterministic pseudo-random bytes.
std::vector<uint8_t> pattern(size_t n, uint64_t seed);

}  // namespace ckptio_test
