// A process that has used ckptio and then forks (DataLoader workers,
// multiprocessing, preforking servers): the child's copy of the parent's
// context has none of its worker threads, so every call that would use
// them fails at once with CKPTIO_E_STATE instead of waiting for ever, and
// a context the child creates works in full. Each child runs under an
// alarm: a hang fails the test instead of the suite's timeout.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "ckpt_fixture.h"

using namespace ckptio_test;

namespace {

// Runs body in a forked child (20 s alarm); its exit status: 0 when every
// check held, the number of the failed check, or 128 + a signal.
template <typename F>
int in_child(F body) {
  pid_t pid = fork();
  if (pid == 0) {
    alarm(20);
    _exit(body());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::vector<Tensor> model() {
  return {make_tensor("a", CKPTIO_F32, {1000, 33}, 1), make_tensor("b", CKPTIO_BF16, {77}, 2)};
}

}  // namespace

TEST(Fork, ParentsContextFailsAtOnceInTheChild) {
  TempDir dir;
  TestContext c(small_options());
  auto ts = model();
  std::string err;
  ASSERT_EQ(save(c.ctx, dir.file("m.safetensors"), ts, nullptr, &err), 0) << err;  // workers started
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(c.ctx, dir.file("m.safetensors").c_str(), nullptr, &r), 0);
  std::vector<uint8_t> got(ts[0].bytes.size());
  ASSERT_EQ(ckptio_reader_load(r, 0, got.data(), got.size()), 0);

  int status = in_child([&] {
    // A reader the parent opened: its load fails, saying what to do.
    if (ckptio_reader_load(r, 0, got.data(), got.size()) != CKPTIO_E_STATE) return 1;
    if (!strstr(ckptio_reader_last_error(r), "after fork")) return 2;
    // Opens on the parent's context fail the same way.
    ckptio_reader *r2 = nullptr;
    if (ckptio_reader_open(c.ctx, dir.file("m.safetensors").c_str(), nullptr, &r2) != CKPTIO_E_STATE) return 3;
    if (!strstr(ckptio_last_open_error(), "create a context in the child")) return 4;
    ckptio_writer *w = nullptr;
    if (ckptio_writer_open(c.ctx, dir.file("child.safetensors").c_str(), CKPTIO_FORMAT_SAFETENSORS, nullptr, &w) !=
        CKPTIO_E_STATE)
      return 5;
    // Freeing the parent's context and reader returns (it joins nothing).
    ckptio_reader_close(r);
    ckptio_ctx_free(c.ctx);
    return 0;
  });
  EXPECT_EQ(status, 0);
  // The parent's context still works.
  EXPECT_EQ(ckptio_reader_load(r, 0, got.data(), got.size()), 0);
  ckptio_reader_close(r);
}

TEST(Fork, ParentsWriterIsRefusedInTheChild) {
  TempDir dir;
  TestContext c(small_options());
  auto ts = model();
  ckptio_writer *w = nullptr;
  ASSERT_EQ(ckptio_writer_open(c.ctx, dir.file("m.safetensors").c_str(), CKPTIO_FORMAT_SAFETENSORS, nullptr, &w), 0);
  for (auto &t : ts) {
    ckptio_tensor d = host_desc(t);
    ASSERT_EQ(ckptio_writer_add(w, &d), 0);
  }
  int status = in_child([&] {
    if (ckptio_writer_commit(w) != CKPTIO_E_STATE) return 1;
    if (ckptio_writer_wait_durable(w) != CKPTIO_E_STATE) return 2;
    if (ckptio_writer_close(w) != CKPTIO_E_STATE) return 3;  // left to the parent
    return 0;
  });
  EXPECT_EQ(status, 0);
  EXPECT_EQ(ckptio_writer_commit(w), 0) << ckptio_writer_last_error(w);
  EXPECT_EQ(ckptio_writer_close(w), 0);
  expect_loads(c.ctx, dir.file("m.safetensors"), ts, CKPTIO_LOAD_AUTO);
}

TEST(Fork, ChildsOwnContextSavesAndLoads) {
  TempDir dir;
  TestContext c(small_options());
  auto ts = model();
  std::string err;
  ASSERT_EQ(save(c.ctx, dir.file("m.safetensors"), ts, nullptr, &err), 0) << err;
  expect_loads(c.ctx, dir.file("m.safetensors"), ts, CKPTIO_LOAD_DIRECT);  // parent's workers busy
  int status = in_child([&] {
    ckptio_options o = small_options();
    ckptio_ctx *mine = nullptr;
    if (ckptio_ctx_create(&o, &mine) != 0) return 1;
    std::string e;
    if (save(mine, dir.file("child.safetensors"), ts, nullptr, &e) != 0) return 2;
    for (auto m : {CKPTIO_LOAD_AUTO, CKPTIO_LOAD_DIRECT, CKPTIO_LOAD_PREAD}) {
      ckptio_options lo = small_options();
      lo.load_method = m;
      for (const char *f : {"m.safetensors", "child.safetensors"}) {
        ckptio_reader *r = nullptr;
        if (ckptio_reader_open(mine, dir.file(f).c_str(), &lo, &r) != 0) return 3;
        std::vector<uint8_t> got(ts[0].bytes.size());
        int rc = ckptio_reader_load(r, (size_t)ckptio_reader_find(r, "a"), got.data(), got.size());
        ckptio_reader_close(r);
        if (rc != 0 || got != ts[0].bytes) return 4;
      }
    }
    ckptio_ctx_free(mine);
    return 0;
  });
  EXPECT_EQ(status, 0);
  expect_loads(c.ctx, dir.file("child.safetensors"), ts, CKPTIO_LOAD_AUTO);
}
