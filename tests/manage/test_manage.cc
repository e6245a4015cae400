// The checkpoint manager: step directories published only when durable, the
// `latest` record, keep-last-K and keep-every-N, resume from the newest
// complete checkpoint past corrupt, incomplete and stale ones (each named
// in a warning), stray temporaries of a killed save, sharded checkpoints.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "ckpt_fixture.h"
#include "manage_util.h"
extern "C" {
#include "core/hold.h"
}

using namespace ckptio_test;

namespace {

std::vector<Tensor> model_of(uint64_t step) {
  return {make_tensor("a", CKPTIO_F32, {64, 33}, step * 3 + 1), make_tensor("b", CKPTIO_BF16, {300}, step * 3 + 2),
          make_tensor("c", CKPTIO_I64, {17, 5}, step * 3 + 3)};
}

class Manage : public ::testing::Test {
 protected:
  void SetUp() override {
    ckptio_options o = small_options();
    o.cuda = 0;
    ASSERT_EQ(ckptio_ctx_create(&o, &ctx_), 0);
  }
  void TearDown() override {
    ckptio_manager_close(m_);
    ckptio_ctx_free(ctx_);
    ckptio_held_slow_closes(0);
  }
  std::string root() const { return tmp_.file("ckpts"); }
  void open(ckptio_manager_options mo = CKPTIO_MANAGER_OPTIONS_INIT) {
    ckptio_manager_close(m_);
    m_ = nullptr;
    ASSERT_EQ(ckptio_manager_open(ctx_, root().c_str(), &mo, nullptr, &m_), 0) << ckptio_last_open_error();
    ckptio_manager_set_warning(m_, Warnings::fn, &warn_);
  }
  // One checkpoint through the manager: begin, add, commit_async, end.
  int save_step(uint64_t step) {
    ckptio_writer *w = nullptr;
    int rc = ckptio_manager_save_begin(m_, step, &w);
    if (rc < 0) return rc;
    auto ts = model_of(step);
    for (auto &t : ts) {
      ckptio_tensor d = host_desc(t);
      EXPECT_EQ(ckptio_writer_add(w, &d), 0);
    }
    EXPECT_EQ(ckptio_writer_commit_async(w), 0);
    EXPECT_EQ(ckptio_writer_wait_snapshot(w), 0);
    return ckptio_manager_save_end(m_, w);
  }
  std::vector<uint64_t> steps_on_disk() { return listed_steps(m_); }
  uint64_t latest(std::string *path = nullptr) { return latest_step(m_, path); }
  std::vector<std::string> hidden() {
    std::vector<std::string> out;
    for (auto &n : list_dir(root()))
      if (n.rfind(".ckptio-mgr-", 0) == 0) out.push_back(n);
    return out;
  }
  static std::vector<std::string> list_dir(const std::string &d) {
    std::vector<std::string> out;
    DIR *dir = opendir(d.c_str());
    if (!dir) return out;
    while (struct dirent *e = readdir(dir))
      if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) out.push_back(e->d_name);
    closedir(dir);
    return out;
  }
  std::string read_latest() {
    auto b = read_file(root() + "/latest");
    return std::string(b.begin(), b.end());
  }

  TempDir tmp_;
  ckptio_ctx *ctx_ = nullptr;
  ckptio_manager *m_ = nullptr;
  Warnings warn_;
};

TEST_F(Manage, PublishesAndResumesFromLatest) {
  open();
  EXPECT_EQ(latest(), ~0ull);  // empty directory: nothing to resume
  EXPECT_TRUE(warn_.messages.empty());
  ASSERT_EQ(save_step(100), 0) << ckptio_manager_last_error(m_);
  ASSERT_EQ(save_step(200), 0) << ckptio_manager_last_error(m_);
  EXPECT_EQ(read_latest(), step_name(200) + "\n");
  std::string path;
  EXPECT_EQ(latest(&path), 200u);
  EXPECT_EQ(path, root() + "/" + step_name(200) + "/model.safetensors");
  expect_loads(ctx_, path, model_of(200));
  EXPECT_TRUE(warn_.messages.empty()) << warn_.messages[0];
  EXPECT_TRUE(hidden().empty());

  ASSERT_EQ(ckptio_manager_list(m_, 1), 2);
  ckptio_checkpoint_info info = CKPTIO_CHECKPOINT_INFO_INIT;
  ASSERT_EQ(ckptio_manager_checkpoint(m_, 0, &info), 0);
  EXPECT_EQ(info.step, 100u);
  EXPECT_EQ(info.complete, 1);
  EXPECT_EQ(info.verified, 1);
  EXPECT_EQ(info.files, 1u);
  struct stat st;
  ASSERT_EQ(stat(info.path, &st), 0);
  EXPECT_EQ(info.bytes, (uint64_t)st.st_size);
  EXPECT_EQ(ckptio_manager_checkpoint(m_, 2, &info), CKPTIO_E_INVALID_ARG);

  // Buffer too small for the path.
  char small[8];
  EXPECT_EQ(ckptio_manager_latest(m_, nullptr, small, sizeof(small)), CKPTIO_E_BUFFER_TOO_SMALL);
}

TEST_F(Manage, KeepLastK) {
  ckptio_manager_options mo = CKPTIO_MANAGER_OPTIONS_INIT;
  mo.keep_last = 2;
  open(mo);
  for (uint64_t s = 1; s <= 5; s++) ASSERT_EQ(save_step(s * 10), 0) << ckptio_manager_last_error(m_);
  EXPECT_EQ(steps_on_disk(), (std::vector<uint64_t>{40, 50}));
  EXPECT_TRUE(hidden().empty());
}

// Retention unlinks the steps it lets go before save_end returns, and
// holds their files open so that a thread frees their blocks after it
// (0.1-0.2 s per GiB here); closing the manager closes every one.
TEST_F(Manage, RetentionFreesTheRemovedFilesBlocksOffTheSaveAndClosesThemAll) {
  ckptio_manager_options mo = CKPTIO_MANAGER_OPTIONS_INIT;
  mo.keep_last = 1;
  open(mo);
  ckptio_held_slow_closes(300 * 1000 * 1000);  // each close frees its blocks in 0.3 s
  for (uint64_t s = 1; s <= 4; s++) {
    ASSERT_EQ(save_step(s), 0) << ckptio_manager_last_error(m_);
    // The step just removed is still held (its close is under way), no
    // earlier one: the next retention waited for the closes before it.
    EXPECT_EQ(open_removed_files("/.ckptio-mgr-del-step-"), s > 1 ? 1 : 0);
    EXPECT_EQ(steps_on_disk(), (std::vector<uint64_t>{s}));
    EXPECT_TRUE(hidden().empty());
  }
  ckptio_manager_close(m_);
  m_ = nullptr;
  EXPECT_EQ(open_removed_files("/.ckptio-mgr-del-step-"), 0);
}

TEST_F(Manage, KeepEveryN) {
  ckptio_manager_options mo = CKPTIO_MANAGER_OPTIONS_INIT;
  mo.keep_last = 1;
  mo.keep_every = 30;
  open(mo);
  for (uint64_t s = 1; s <= 7; s++) ASSERT_EQ(save_step(s * 10), 0) << ckptio_manager_last_error(m_);
  EXPECT_EQ(steps_on_disk(), (std::vector<uint64_t>{30, 60, 70}));
}

TEST_F(Manage, KeepAllWhenKeepLastIsZero) {
  ckptio_manager_options mo = CKPTIO_MANAGER_OPTIONS_INIT;
  mo.keep_last = 0;
  open(mo);
  for (uint64_t s = 1; s <= 4; s++) ASSERT_EQ(save_step(s), 0);
  EXPECT_EQ(steps_on_disk(), (std::vector<uint64_t>{1, 2, 3, 4}));
}

TEST_F(Manage, SkipsCorruptCheckpointWithWarning) {
  ckptio_manager_options mo = CKPTIO_MANAGER_OPTIONS_INIT;
  mo.verify = 1;
  open(mo);
  ASSERT_EQ(save_step(1), 0);
  ASSERT_EQ(save_step(2), 0);
  // Flip a byte in the data of step 2: the header still parses (structural
  // check passes), the CRC does not.
  std::string f = root() + "/" + step_name(2) + "/model.safetensors";
  auto b = read_file(f);
  b[b.size() - 10] ^= 0x40;
  write_file(f, b);
  EXPECT_EQ(latest(), 1u);
  ASSERT_FALSE(warn_.messages.empty());
  EXPECT_TRUE(warn_.any_contains(step_name(2))) << warn_.messages[0];
  EXPECT_TRUE(warn_.any_contains("verification failed"));

  // Without verify the structural check accepts it.
  mo.verify = 0;
  open(mo);
  EXPECT_EQ(latest(), 2u);
  // list --verify reports it complete but not verified, with the error.
  ASSERT_EQ(ckptio_manager_list(m_, 1), 2);
  ckptio_checkpoint_info info = CKPTIO_CHECKPOINT_INFO_INIT;
  ASSERT_EQ(ckptio_manager_checkpoint(m_, 1, &info), 0);
  EXPECT_EQ(info.complete, 1);
  EXPECT_EQ(info.verified, 0);
  EXPECT_EQ(info.error, CKPTIO_E_CHECKSUM);
}

TEST_F(Manage, SkipsIncompleteCheckpoint) {
  open();
  ASSERT_EQ(save_step(1), 0);
  ASSERT_EQ(save_step(2), 0);
  // A truncated file and an empty step directory, both newer.
  std::string f = root() + "/" + step_name(2) + "/model.safetensors";
  ASSERT_EQ(truncate(f.c_str(), 100), 0);
  ASSERT_EQ(mkdir((root() + "/" + step_name(3)).c_str(), 0777), 0);
  warn_.messages.clear();
  EXPECT_EQ(latest(), 1u);
  EXPECT_TRUE(warn_.any_contains(step_name(2)));
  EXPECT_TRUE(warn_.any_contains(step_name(3)));
  EXPECT_TRUE(warn_.any_contains("incomplete"));
  ASSERT_EQ(ckptio_manager_list(m_, 0), 3);
  ckptio_checkpoint_info info = CKPTIO_CHECKPOINT_INFO_INIT;
  ASSERT_EQ(ckptio_manager_checkpoint(m_, 2, &info), 0);
  EXPECT_EQ(info.complete, 0);
  EXPECT_EQ(info.error, -ENOENT);
  // Names that are not canonical step directories are not checkpoints.
  ASSERT_EQ(mkdir((root() + "/step-5").c_str(), 0777), 0);
  ASSERT_EQ(mkdir((root() + "/step-0000000x").c_str(), 0777), 0);
  EXPECT_EQ(ckptio_manager_list(m_, 0), 3);
}

TEST_F(Manage, AllIncompleteMeansNone) {
  open();
  ASSERT_EQ(mkdir((root() + "/" + step_name(7)).c_str(), 0777), 0);
  EXPECT_EQ(latest(), ~0ull);
  EXPECT_TRUE(warn_.any_contains(step_name(7)));
}

TEST_F(Manage, StaleOrMissingLatestRecordFallsBackToScan) {
  open();
  ASSERT_EQ(save_step(1), 0);
  ASSERT_EQ(save_step(2), 0);
  // A record naming an older step (a save killed between publication and
  // the record), then a missing one, then one naming nothing that exists.
  write_file(root() + "/latest", step_name(1) + "\n");
  warn_.messages.clear();
  EXPECT_EQ(latest(), 2u);
  EXPECT_TRUE(warn_.any_contains("names \"" + step_name(1) + "\""));
  ASSERT_EQ(unlink((root() + "/latest").c_str()), 0);
  warn_.messages.clear();
  EXPECT_EQ(latest(), 2u);
  EXPECT_TRUE(warn_.any_contains("missing"));
  write_file(root() + "/latest", std::string("step-99999999\n"));
  EXPECT_EQ(latest(), 2u);
  // The next save writes a correct record again.
  ASSERT_EQ(save_step(3), 0);
  EXPECT_EQ(read_latest(), step_name(3) + "\n");
}

TEST_F(Manage, StrayTemporariesRemovedByNextSave) {
  open();
  ASSERT_EQ(save_step(1), 0);
  // What a killed save leaves: a temp step dir with the writer's temp file,
  // a half-removed old checkpoint, a latest temp. And a file not ours.
  std::string t1 = root() + "/.ckptio-mgr-tmp-step-00000002-999-0";
  ASSERT_EQ(mkdir(t1.c_str(), 0777), 0);
  write_file(t1 + "/.model.safetensors.ckptio-tmp-999-1-2", std::string(1000, 'x'));
  std::string t2 = root() + "/.ckptio-mgr-del-step-00000000-999-1";
  ASSERT_EQ(mkdir(t2.c_str(), 0777), 0);
  write_file(t2 + "/model.safetensors", std::string(10, 'y'));
  write_file(root() + "/.ckptio-mgr-latest-999-2", std::string("step-"));
  write_file(root() + "/.not-ours", std::string("keep"));
  ASSERT_EQ(mkdir((root() + "/.ckptio-tmp-other").c_str(), 0777), 0);
  EXPECT_EQ(hidden().size(), 3u);
  // Reading never removes anything.
  EXPECT_EQ(latest(), 1u);
  EXPECT_EQ(hidden().size(), 3u);
  ASSERT_EQ(save_step(2), 0);
  EXPECT_TRUE(hidden().empty());
  EXPECT_EQ(read_file(root() + "/.not-ours").size(), 4u);
  struct stat st;
  EXPECT_EQ(stat((root() + "/.ckptio-tmp-other").c_str(), &st), 0);
}

TEST_F(Manage, FailedOrAbandonedSavePublishesNothing) {
  open();
  ASSERT_EQ(save_step(1), 0);
  // Begun, never committed: save_end closes it and removes its temp dir.
  ckptio_writer *w = nullptr;
  ASSERT_EQ(ckptio_manager_save_begin(m_, 2, &w), 0);
  ckptio_writer *w2 = nullptr;
  EXPECT_EQ(ckptio_manager_save_begin(m_, 3, &w2), CKPTIO_E_STATE);  // one save at a time
  EXPECT_EQ(w2, nullptr);
  EXPECT_EQ(ckptio_manager_save_end(m_, nullptr), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(ckptio_manager_save_end(m_, w), CKPTIO_E_STATE);
  EXPECT_NE(std::string(ckptio_manager_last_error(m_)).find("never committed"), std::string::npos);
  EXPECT_EQ(steps_on_disk(), (std::vector<uint64_t>{1}));
  EXPECT_TRUE(hidden().empty());
  // Begun and abandoned by close.
  ASSERT_EQ(ckptio_manager_save_begin(m_, 4, &w), 0);
  auto ts = model_of(4);
  ckptio_tensor d = host_desc(ts[0]);
  ASSERT_EQ(ckptio_writer_add(w, &d), 0);
  ASSERT_EQ(ckptio_writer_commit_async(w), 0);
  ckptio_manager_close(m_);
  m_ = nullptr;
  open();
  EXPECT_EQ(steps_on_disk(), (std::vector<uint64_t>{1}));
  EXPECT_TRUE(hidden().empty());
  EXPECT_EQ(read_latest(), step_name(1) + "\n");
}

TEST_F(Manage, SameStepIsReplaced) {
  open();
  ASSERT_EQ(save_step(5), 0);
  // Save step 5 again with other contents: the new one replaces it.
  ckptio_writer *w = nullptr;
  ASSERT_EQ(ckptio_manager_save_begin(m_, 5, &w), 0);
  auto ts = model_of(6);
  for (auto &t : ts) {
    ckptio_tensor d = host_desc(t);
    ASSERT_EQ(ckptio_writer_add(w, &d), 0);
  }
  ASSERT_EQ(ckptio_writer_commit(w), 0);
  ASSERT_EQ(ckptio_manager_save_end(m_, w), 0) << ckptio_manager_last_error(m_);
  std::string path;
  EXPECT_EQ(latest(&path), 5u);
  expect_loads(ctx_, path, ts);
  EXPECT_TRUE(hidden().empty());
}

// Saving a step again (a final save at the step of the last periodic one)
// replaces the older copy; its blocks are freed after save_end, not in it.
// The save is held against the same save with no old copy, timed just
// before on this machine as it is now, plus half the slow close.
TEST_F(Manage, AStepSavedAgainFreesTheOldCopyAfterTheSaveNotInIt) {
  const double close_s = 0.8;
  auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  open();
  auto tb = std::chrono::steady_clock::now();
  ASSERT_EQ(save_step(5), 0);
  double base = since(tb);  // the same save with no old copy to close
  ckptio_held_slow_closes((uint64_t)(close_s * 1e9));
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(save_step(5), 0) << ckptio_manager_last_error(m_);
  double took = since(t0);
  EXPECT_EQ(open_removed_files("/.ckptio-mgr-"), 1) << "the old copy's file is not held";
  EXPECT_LT(took, base + close_s / 2) << "the save waited for the old copy's close (with fast closes it took " << base
                                      << " s)";
  EXPECT_TRUE(hidden().empty());
  std::string path;
  EXPECT_EQ(latest(&path), 5u);
  ckptio_manager_close(m_);
  m_ = nullptr;
  // The close began after t0 and takes close_s: a floor, whatever the load.
  EXPECT_GE(since(t0), close_s) << "close did not wait for the pending close";
  EXPECT_EQ(open_removed_files("/.ckptio-mgr-"), 0);
}

TEST_F(Manage, OneSaverPerDirectory) {
  open();
  ckptio_manager *other = nullptr;
  ASSERT_EQ(ckptio_manager_open(ctx_, root().c_str(), nullptr, nullptr, &other), 0);
  ckptio_writer *w = nullptr, *w2 = nullptr;
  ASSERT_EQ(ckptio_manager_save_begin(m_, 1, &w), 0);
  EXPECT_EQ(ckptio_manager_save_begin(other, 2, &w2), -EBUSY);
  // The busy one left the running save's temporary alone.
  EXPECT_EQ(hidden().size(), 1u);
  EXPECT_EQ(ckptio_manager_save_end(m_, w), CKPTIO_E_STATE);
  ASSERT_EQ(ckptio_manager_save_begin(other, 2, &w2), 0);
  ckptio_manager_close(other);
}

TEST_F(Manage, Sharded) {
  ckptio_manager_options mo = CKPTIO_MANAGER_OPTIONS_INIT;
  mo.max_shard_bytes = 4096;
  mo.keep_last = 1;
  mo.verify = 1;
  open(mo);
  ASSERT_EQ(save_step(1), 0) << ckptio_manager_last_error(m_);
  ASSERT_EQ(save_step(2), 0) << ckptio_manager_last_error(m_);
  std::string path;
  EXPECT_EQ(latest(&path), 2u);
  EXPECT_EQ(path, root() + "/" + step_name(2) + "/model.safetensors.index.json");
  expect_loads(ctx_, path, model_of(2));
  EXPECT_EQ(steps_on_disk(), (std::vector<uint64_t>{2}));
  ASSERT_EQ(ckptio_manager_list(m_, 1), 1);
  ckptio_checkpoint_info info = CKPTIO_CHECKPOINT_INFO_INIT;
  ASSERT_EQ(ckptio_manager_checkpoint(m_, 0, &info), 0);
  EXPECT_GT(info.files, 2u);
  EXPECT_EQ(info.verified, 1);

  // A missing shard makes the set incomplete; a single-file checkpoint of an
  // earlier configuration is still found.
  mo.max_shard_bytes = 0;
  mo.keep_last = 0;
  open(mo);
  ASSERT_EQ(save_step(1), 0);
  std::string shard;
  for (auto &n : list_dir(root() + "/" + step_name(2)))
    if (n.rfind("model-00001-of-", 0) == 0) shard = n;
  ASSERT_FALSE(shard.empty());
  ASSERT_EQ(unlink((root() + "/" + step_name(2) + "/" + shard).c_str()), 0);
  warn_.messages.clear();
  EXPECT_EQ(latest(), 1u);
  EXPECT_TRUE(warn_.any_contains(step_name(2)));
}

TEST_F(Manage, RetentionNeverRemovesTheOnlyCompleteCheckpoint) {
  ckptio_manager_options mo = CKPTIO_MANAGER_OPTIONS_INIT;
  mo.keep_last = 1;
  open(mo);
  ASSERT_EQ(save_step(10), 0);
  // Newer incomplete directories do not count towards keep_last, and are
  // not removed by an older save; the older complete one goes only once
  // the new one is published.
  ASSERT_EQ(mkdir((root() + "/" + step_name(30)).c_str(), 0777), 0);
  ASSERT_EQ(save_step(20), 0);
  EXPECT_EQ(steps_on_disk(), (std::vector<uint64_t>{20, 30}));
  EXPECT_EQ(latest(), 20u);
}

TEST_F(Manage, PyTorchFormatAndBadOptions) {
  ckptio_manager_options mo = CKPTIO_MANAGER_OPTIONS_INIT;
  mo.format = CKPTIO_FORMAT_PYTORCH;
  open(mo);
  ASSERT_EQ(save_step(1), 0) << ckptio_manager_last_error(m_);
  std::string path;
  EXPECT_EQ(latest(&path), 1u);
  EXPECT_EQ(path.substr(path.size() - 9), "/model.pt");
  mo.max_shard_bytes = 100;
  ckptio_manager *bad = nullptr;
  EXPECT_EQ(ckptio_manager_open(ctx_, root().c_str(), &mo, nullptr, &bad), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(bad, nullptr);
  mo = CKPTIO_MANAGER_OPTIONS_INIT;
  mo.keep_last = -1;
  EXPECT_EQ(ckptio_manager_open(ctx_, root().c_str(), &mo, nullptr, &bad), CKPTIO_E_INVALID_ARG);
  EXPECT_NE(std::string(ckptio_last_open_error()).find("keep_last"), std::string::npos);
  EXPECT_EQ(ckptio_manager_open(ctx_, "/nonexistent/a/b", nullptr, nullptr, &bad), -ENOENT);
  ckptio_manager_close(nullptr);
}

}  // namespace
