// What the manager's tests share: the warnings a manager reported, and the
// name of a step's directory.
#ifndef CKPTIO_TESTS_MANAGE_UTIL_H
#define CKPTIO_TESTS_MANAGE_UTIL_H

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "ckptio.h"

// A ckptio_manager_warn_fn's target: every message and its step, in order.
struct Warnings {
  std::vector<std::string> messages;
  std::vector<uint64_t> steps;
  static void fn(void *arg, uint64_t step, int, const char *msg) {
    auto *w = static_cast<Warnings *>(arg);
    w->messages.push_back(msg);
    w->steps.push_back(step);
  }
  bool any_contains(const std::string &s) const {
    for (auto &m : messages)
      if (m.find(s) != std::string::npos) return true;
    return false;
  }
};

// "step-00000042": the directory (or a storage's prefix) of a step.
inline std::string step_name(uint64_t step) {
  char b[32];
  snprintf(b, sizeof(b), "step-%08llu", (unsigned long long)step);
  return b;
}

// The steps of a fresh list of m (without verification), oldest first,
// and with `complete` whether each is complete.
inline std::vector<uint64_t> listed_steps(ckptio_manager *m, std::vector<int> *complete = nullptr) {
  std::vector<uint64_t> out;
  int64_t n = ckptio_manager_list(m, 0);
  EXPECT_GE(n, 0) << ckptio_manager_last_error(m);
  for (int64_t i = 0; i < n; i++) {
    ckptio_checkpoint_info info = CKPTIO_CHECKPOINT_INFO_INIT;
    EXPECT_EQ(ckptio_manager_checkpoint(m, (size_t)i, &info), 0);
    out.push_back(info.step);
    if (complete) complete->push_back(info.complete);
  }
  return out;
}

// The step ckptio_manager_latest resumes from (its path into *path), or
// ~0 when there is none.
inline uint64_t latest_step(ckptio_manager *m, std::string *path = nullptr) {
  uint64_t step = ~0ull;
  char buf[4096];
  int rc = ckptio_manager_latest(m, &step, buf, sizeof(buf));
  EXPECT_GE(rc, 0) << ckptio_manager_last_error(m);
  if (rc != 1) return ~0ull;
  if (path) *path = buf;
  return step;
}

#endif
