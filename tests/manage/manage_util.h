// What the manager's tests share: the warnings a manager reported, and the
// name of a step's directory.
#ifndef CKPTIO_TESTS_MANAGE_UTIL_H
#define CKPTIO_TESTS_MANAGE_UTIL_H

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

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

#endif
