// The checkpoint manager on a storage: DIR is a prefix ("s3://bucket/ckpts",
// "mem://ckpts") instead of a local directory. Each test runs on two
// storages: "mem", an in-memory storage registered by the test (every verb,
// so it needs no server), and "s3", the built-in S3 storage against a real
// server (SeaweedFS, run around the test by tests/s3/weed_server.py; the
// instance skips without it). The same guarantees as on a disk: a step
// exists once its checkpoint is published, `latest` is written after it,
// retention removes old steps only after the new one is in place, what a
// killed save left (uploads never completed, a set's shards without an
// index) is swept by the next save, and resume finds the newest complete
// step whatever `latest` says.
#define CKPTIO_EXPERIMENTAL  // ckptio_ctx_storage, ckptio_storage_ops, ckptio_path_scheme
#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "ckpt_fixture.h"
#include "manage_util.h"
extern "C" {
#include "s3/s3.h"
}

using namespace ckptio_test;

namespace {

// ------------------------------------------------------------ the memory storage

// Objects in this process's memory, every verb of ckptio_storage_ops:
// published objects replaced whole at publish, uploads invisible until
// then, sweep marking the open ones under a prefix abandoned (their
// writer's publish then fails, as an aborted S3 upload's does).
struct MemStore {
  using Bytes = std::shared_ptr<const std::vector<uint8_t>>;
  struct ReadObj {
    std::string path;
    Bytes bytes;
  };
  struct Upload {
    std::string path;
    std::vector<uint8_t> bytes;
    bool swept = false;
  };
  std::mutex mu;
  std::map<std::string, Bytes> objects;
  std::set<Upload *> open;
  std::string drop_reads_under;  // reads of objects under it fail as a dropped connection would

  size_t open_under(const std::string &prefix) {
    std::lock_guard<std::mutex> g(mu);
    size_t n = 0;
    for (Upload *u : open) n += u->path.compare(0, prefix.size(), prefix) == 0;
    return n;
  }

  static MemStore *of(void *self) { return static_cast<MemStore *>(self); }
  static int open_read(void *self, const char *path, void **obj, uint64_t *size, char *err, size_t errlen) {
    MemStore *s = of(self);
    std::lock_guard<std::mutex> g(s->mu);
    auto it = s->objects.find(path);
    if (it == s->objects.end()) {
      snprintf(err, errlen, "%s: no such object in the memory store", path);
      return -ENOENT;
    }
    *obj = new ReadObj{path, it->second};  // a reader keeps the version it opened
    *size = it->second->size();
    return 0;
  }
  static int read(void *self, void *obj, void *buf, size_t len, uint64_t offset, char *err, size_t errlen) {
    MemStore *s = of(self);
    {
      std::lock_guard<std::mutex> g(s->mu);
      if (!s->drop_reads_under.empty() && static_cast<ReadObj *>(obj)->path.rfind(s->drop_reads_under, 0) == 0) {
        snprintf(err, errlen, "%s: the connection dropped (injected)", static_cast<ReadObj *>(obj)->path.c_str());
        return CKPTIO_E_SHORT_IO;
      }
    }
    memcpy(buf, static_cast<ReadObj *>(obj)->bytes->data() + offset, len);
    return 0;
  }
  static void close_read(void *, void *obj) { delete static_cast<ReadObj *>(obj); }
  static int create(void *self, const char *path, uint64_t size, uint64_t, void **obj, char *, size_t) {
    MemStore *s = of(self);
    Upload *u = new Upload{path, std::vector<uint8_t>(size), false};
    std::lock_guard<std::mutex> g(s->mu);
    s->open.insert(u);
    *obj = u;
    return 0;
  }
  static int write(void *, void *obj, const void *buf, size_t len, uint64_t offset, char *, size_t) {
    memcpy(static_cast<Upload *>(obj)->bytes.data() + offset, buf, len);  // disjoint chunks
    return 0;
  }
  static int publish(void *self, void *obj, char *err, size_t errlen) {
    MemStore *s = of(self);
    Upload *u = static_cast<Upload *>(obj);
    int rc = 0;
    {
      std::lock_guard<std::mutex> g(s->mu);
      s->open.erase(u);
      if (u->swept)
        rc = -ECANCELED, snprintf(err, errlen, "%s: the upload was swept before its publish", u->path.c_str());
      else
        s->objects[u->path] = std::make_shared<const std::vector<uint8_t>>(std::move(u->bytes));
    }
    delete u;
    return rc;
  }
  static void abandon(void *self, void *obj) {
    MemStore *s = of(self);
    Upload *u = static_cast<Upload *>(obj);
    {
      std::lock_guard<std::mutex> g(s->mu);
      s->open.erase(u);
    }
    delete u;
  }
  static int list(void *self, const char *prefix, int (*fn)(void *, const char *, uint64_t), void *arg, char *,
                  size_t) {
    MemStore *s = of(self);
    std::vector<std::pair<std::string, uint64_t>> found;
    {
      std::lock_guard<std::mutex> g(s->mu);
      for (auto &o : s->objects)
        if (o.first.compare(0, strlen(prefix), prefix) == 0) found.emplace_back(o.first, o.second->size());
    }
    for (auto &f : found)
      if (int rc = fn(arg, f.first.c_str(), f.second)) return rc;
    return 0;
  }
  static int remove(void *self, const char *path, char *, size_t) {
    MemStore *s = of(self);
    std::lock_guard<std::mutex> g(s->mu);
    s->objects.erase(path);
    return 0;
  }
  static int sweep(void *self, const char *prefix, char *, size_t) {
    MemStore *s = of(self);
    std::lock_guard<std::mutex> g(s->mu);
    for (auto it = s->open.begin(); it != s->open.end();) {
      if ((*it)->path.compare(0, strlen(prefix), prefix) == 0) {
        (*it)->swept = true;  // its writer still owns it: publish fails, abandon frees
        it = s->open.erase(it);
      } else {
        ++it;
      }
    }
    return 0;
  }
  static ckptio_storage_ops ops() {
    ckptio_storage_ops o;
    memset(&o, 0, sizeof(o));
    o.size = sizeof(o);
    o.open_read = open_read, o.read = read, o.close_read = close_read;
    o.create = create, o.write = write, o.publish = publish, o.abandon = abandon;
    o.list = list, o.remove = remove, o.sweep = sweep;
    return o;
  }
};

// ------------------------------------------------------------ the fixture

std::vector<Tensor> model_of(uint64_t step, int n = 3) {
  std::vector<Tensor> ts;
  for (int k = 0; k < n; k++)
    ts.push_back(make_tensor("layers." + std::to_string(k) + ".w", CKPTIO_F32, {64 + k, 1024}, step * 7 + k));
  ts.push_back(make_tensor("norm", CKPTIO_BF16, {300}, step * 7 + 100));
  return ts;
}

const char *bucket() {
  const char *b = getenv("CKPTIO_S3_BUCKET");
  return b && *b ? b : "ckptio-test";
}

class ManageStorage : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    s3_ = GetParam() == "s3";
    if (s3_) {
      if (!getenv("AWS_ENDPOINT_URL")) GTEST_SKIP() << "no S3 server (run under tests/s3/weed_server.py)";
      char err[512] = "";
      int rc = ckptio_s3_client_create(nullptr, &client_, err, sizeof(err));
      if (rc == CKPTIO_E_FORMAT) {  // a build without libcurl: the whole binary skips (ctest's 77)
        printf("SKIP: %s\n", err);
        fflush(stdout);
        _exit(77);
      }
      ASSERT_EQ(rc, 0) << err;
    }
    // Chunks of 64 KiB: a step's objects are uploaded in several parts.
    ckptio_options o = small_options(64 << 10, 512 << 10, 4);
    o.cuda = 0;
    ASSERT_EQ(ckptio_ctx_create(&o, &ctx_), 0) << ckptio_last_open_error();
    if (!s3_) {
      ckptio_storage_ops ops = MemStore::ops();
      ASSERT_EQ(ckptio_ctx_storage_register(ctx_, "mem", &ops, &mem_), 0) << ckptio_last_open_error();
    }
    const auto *info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = info->name();
    name = name.substr(0, name.find('/'));
    key_ = "mgr/" + name + "-" + std::to_string(getpid());
    root_ = s3_ ? std::string("s3://") + bucket() + "/" + key_ : "mem://" + key_;
    char err[512] = "";
    ASSERT_EQ(ckptio_ctx_storage(ctx_, root_.c_str(), &ops_, &self_, err, sizeof(err)), 1) << err;
  }
  void TearDown() override {
    ckptio_manager_close(m_);
    ckptio_ctx_free(ctx_);
    ckptio_s3_client_free(client_);
  }

  void open(ckptio_manager_options mo = CKPTIO_MANAGER_OPTIONS_INIT) {
    ckptio_manager_close(m_);
    m_ = nullptr;
    ASSERT_EQ(ckptio_manager_open(ctx_, root_.c_str(), &mo, nullptr, &m_), 0) << ckptio_last_open_error();
    ckptio_manager_set_warning(m_, Warnings::fn, &warn_);
  }
  int save_step(uint64_t step, int n = 3) {
    ckptio_writer *w = nullptr;
    int rc = ckptio_manager_save_begin(m_, step, &w);
    if (rc < 0) return rc;
    auto ts = model_of(step, n);
    for (auto &t : ts) {
      ckptio_tensor d = host_desc(t);
      EXPECT_EQ(ckptio_writer_add(w, &d), 0);
    }
    EXPECT_EQ(ckptio_writer_commit_async(w), 0);
    return ckptio_manager_save_end(m_, w);
  }
  std::vector<uint64_t> listed(std::vector<int> *complete = nullptr) { return listed_steps(m_, complete); }
  uint64_t latest(std::string *path = nullptr) { return latest_step(m_, path); }
  // Every object under the manager's prefix, by its name below it.
  std::vector<std::string> objects() {
    std::vector<std::string> out;
    struct Ctx {
      std::vector<std::string> *out;
      size_t skip;
    } c{&out, root_.size() + 1};
    char err[512] = "";
    EXPECT_EQ(ops_->list(
                  self_, (root_ + "/").c_str(),
                  [](void *arg, const char *path, uint64_t) {
                    Ctx *c = static_cast<Ctx *>(arg);
                    c->out->push_back(path + c->skip);
                    return 0;
                  },
                  &c, err, sizeof(err)),
              0)
        << err;
    std::sort(out.begin(), out.end());
    return out;
  }
  std::vector<std::string> objects_of(uint64_t step) {
    std::vector<std::string> out;
    for (auto &o : objects())
      if (o.rfind(step_name(step) + "/", 0) == 0) out.push_back(o.substr(step_name(step).size() + 1));
    return out;
  }
  // Uploads begun and never completed or abandoned under the prefix.
  size_t open_uploads() {
    if (!s3_) return mem_.open_under(root_ + "/");
    struct Count {
      std::string key;
      size_t n;
    } c{key_ + "/", 0};
    char err[512] = "";
    EXPECT_EQ(ckptio_s3_list_uploads(
                  client_, bucket(), c.key.c_str(),
                  [](void *arg, const char *k, const char *) {
                    Count *c = static_cast<Count *>(arg);
                    c->n += strncmp(k, c->key.c_str(), c->key.size()) == 0;
                    return 0;
                  },
                  &c, err, sizeof(err)),
              0)
        << err;
    return c.n;
  }
  // An object published whole under the prefix (`name` below it).
  void put(const std::string &name, const std::string &bytes) {
    void *obj = nullptr;
    char err[512] = "";
    std::string path = root_ + "/" + name;
    ASSERT_EQ(ops_->create(self_, path.c_str(), bytes.size(), bytes.size(), &obj, err, sizeof(err)), 0) << err;
    ASSERT_EQ(ops_->write(self_, obj, bytes.data(), bytes.size(), 0, err, sizeof(err)), 0) << err;
    ASSERT_EQ(ops_->publish(self_, obj, err, sizeof(err)), 0) << err;
  }
  std::string get(const std::string &name) {
    void *obj = nullptr;
    uint64_t size = 0;
    char err[512] = "";
    std::string path = root_ + "/" + name;
    if (ops_->open_read(self_, path.c_str(), &obj, &size, err, sizeof(err)) < 0) return "<" + std::string(err) + ">";
    std::string out(size, '\0');
    EXPECT_EQ(ops_->read(self_, obj, &out[0], size, 0, err, sizeof(err)), 0) << err;
    ops_->close_read(self_, obj);
    return out;
  }
  // What a save killed after its upload began leaves: the upload, open (an
  // object of three 8 MiB chunks: a multipart upload on S3). Returns it,
  // for abandon once the test is done with it (its memory is the test's).
  void *begin_upload(const std::string &name) {
    void *obj = nullptr;
    char err[512] = "";
    std::string path = root_ + "/" + name;
    EXPECT_EQ(ops_->create(self_, path.c_str(), 24 << 20, 8 << 20, &obj, err, sizeof(err)), 0) << err;
    return obj;
  }
  // Every tensor of the checkpoint at path, CRC-checked, equal to step's.
  void expect_step(const std::string &path, uint64_t step, int n = 3) {
    auto ts = model_of(step, n);
    ckptio_reader *r = nullptr;
    ASSERT_EQ(ckptio_reader_open(ctx_, path.c_str(), nullptr, &r), 0) << ckptio_last_open_error();
    ASSERT_EQ(ckptio_reader_count(r), ts.size()) << path;
    for (auto &t : ts) {
      int64_t i = ckptio_reader_find(r, t.name.c_str());
      ASSERT_GE(i, 0) << path << ": " << t.name;
      std::vector<uint8_t> got(t.bytes.size());
      ASSERT_EQ(ckptio_reader_load(r, (size_t)i, got.data(), got.size()), 0) << ckptio_reader_last_error(r);
      EXPECT_TRUE(got == t.bytes) << path << ": " << t.name << " is not step " << step << "'s";
    }
    size_t unchecked = 1;
    EXPECT_EQ(ckptio_reader_verify(r, &unchecked), 0) << ckptio_reader_last_error(r);
    EXPECT_EQ(unchecked, 0u);
    ckptio_reader_close(r);
  }

  bool s3_ = false;
  MemStore mem_;
  ckptio_s3_client *client_ = nullptr;
  ckptio_ctx *ctx_ = nullptr;
  ckptio_manager *m_ = nullptr;
  const ckptio_storage_ops *ops_ = nullptr;
  void *self_ = nullptr;
  std::string key_, root_;
  Warnings warn_;
};

// Several steps: each published whole, `latest` naming the newest, keep-last-2
// removing the older ones entirely (no object of theirs left), nothing open.
// The one rule that tells a storage's path from a local one (the library's
// routing, the manager, the command and Python all ask it): RFC 3986's
// scheme, then "://".
TEST(PathScheme, SchemesAreRfc3986FollowedBySlashes) {
  EXPECT_EQ(ckptio_path_scheme("s3://bucket/key"), 2u);
  EXPECT_EQ(ckptio_path_scheme("my+x.y-z://a/b"), 8u);
  EXPECT_EQ(ckptio_path_scheme("S3://bucket"), 2u);
  EXPECT_EQ(ckptio_path_scheme("s3://"), 2u);
  EXPECT_EQ(ckptio_path_scheme("/tmp/run://1/model.safetensors"), 0u);  // "://" inside a local path
  EXPECT_EQ(ckptio_path_scheme("ckpt/s3://x"), 0u);
  EXPECT_EQ(ckptio_path_scheme("1s://x"), 0u);  // a scheme starts with a letter
  EXPECT_EQ(ckptio_path_scheme("s_3://x"), 0u);
  EXPECT_EQ(ckptio_path_scheme("s3:/x"), 0u);
  EXPECT_EQ(ckptio_path_scheme("model.safetensors"), 0u);
  EXPECT_EQ(ckptio_path_scheme(""), 0u);
  EXPECT_EQ(ckptio_path_scheme(nullptr), 0u);
}

TEST_P(ManageStorage, SavesStepsKeepsTheLastTwoAndResumes) {
  ckptio_manager_options mo = CKPTIO_MANAGER_OPTIONS_INIT;
  mo.keep_last = 2;
  open(mo);
  EXPECT_EQ(latest(), ~0ull);  // an empty prefix: nothing to resume
  for (uint64_t s = 1; s <= 4; s++) ASSERT_EQ(save_step(s * 10), 0) << ckptio_manager_last_error(m_);
  EXPECT_EQ(listed(), (std::vector<uint64_t>{30, 40}));
  EXPECT_EQ(get("latest"), step_name(40) + "\n");
  EXPECT_EQ(objects(), (std::vector<std::string>{"latest", step_name(30) + "/model.safetensors",
                                                 step_name(40) + "/model.safetensors"}));
  std::string path;
  EXPECT_EQ(latest(&path), 40u);
  EXPECT_EQ(path, root_ + "/" + step_name(40) + "/model.safetensors");
  expect_step(path, 40);
  EXPECT_TRUE(warn_.messages.empty()) << warn_.messages[0];
  EXPECT_EQ(open_uploads(), 0u);

  ASSERT_EQ(ckptio_manager_list(m_, 1), 2);
  ckptio_checkpoint_info info = CKPTIO_CHECKPOINT_INFO_INIT;
  ASSERT_EQ(ckptio_manager_checkpoint(m_, 1, &info), 0);
  EXPECT_EQ(info.complete, 1);
  EXPECT_EQ(info.verified, 1);
  EXPECT_EQ(info.files, 1u);
  EXPECT_EQ(std::string(info.dir), root_ + "/" + step_name(40));
  EXPECT_GT(info.bytes, 3u * 64 * 1024 * 4);  // the three F32 tensors' bytes, and a header

  // A trailing '/' names the same prefix.
  ckptio_manager *again = nullptr;
  ASSERT_EQ(ckptio_manager_open(ctx_, (root_ + "/").c_str(), nullptr, nullptr, &again), 0) << ckptio_last_open_error();
  char buf[4096];
  uint64_t step = 0;
  EXPECT_EQ(ckptio_manager_latest(again, &step, buf, sizeof(buf)), 1);
  EXPECT_EQ(std::string(buf), path);
  ckptio_manager_close(again);
}

// Sharded sets: the index is the step's checkpoint; retention removes every
// shard of the steps it lets go.
TEST_P(ManageStorage, ShardedSetsAreRetainedWhole) {
  ckptio_manager_options mo = CKPTIO_MANAGER_OPTIONS_INIT;
  mo.keep_last = 1;
  mo.max_shard_bytes = 300 << 10;  // 3 tensors of ~260 KiB and a small one: 3 shards
  open(mo);
  for (uint64_t s = 1; s <= 3; s++) ASSERT_EQ(save_step(s), 0) << ckptio_manager_last_error(m_);
  EXPECT_EQ(listed(), (std::vector<uint64_t>{3}));
  auto objs = objects_of(3);
  EXPECT_EQ(objs.size(), 4u) << "an index and 3 shards";
  EXPECT_EQ(objects().size(), objs.size() + 1) << "only step 3's objects and latest";
  std::string path;
  EXPECT_EQ(latest(&path), 3u);
  EXPECT_EQ(path, root_ + "/" + step_name(3) + "/model.safetensors.index.json");
  expect_step(path, 3);
  EXPECT_EQ(open_uploads(), 0u);
}

// The directory is the truth: a `latest` naming a step that is not there,
// or none at all, is reported and resume scans.
TEST_P(ManageStorage, StaleOrMissingLatestFallsBackToTheScan) {
  open();
  ASSERT_EQ(save_step(1), 0) << ckptio_manager_last_error(m_);
  ASSERT_EQ(save_step(2), 0) << ckptio_manager_last_error(m_);
  put("latest", step_name(9) + "\n");
  EXPECT_EQ(latest(), 2u);
  EXPECT_TRUE(warn_.any_contains("names \"" + step_name(9) + "\"")) << (warn_.messages.empty() ? "" : warn_.messages[0]);
  warn_.messages.clear();
  char err[512] = "";
  ASSERT_EQ(ops_->remove(self_, (root_ + "/latest").c_str(), err, sizeof(err)), 0) << err;
  EXPECT_EQ(latest(), 2u);
  EXPECT_TRUE(warn_.any_contains("latest is missing"));
  ASSERT_EQ(save_step(3), 0) << ckptio_manager_last_error(m_);
  EXPECT_EQ(get("latest"), step_name(3) + "\n");
}

// What killed saves leave: an upload never completed (a single file), a
// set's shards without their index (killed before it), a shard of a second
// save of a published step. None of it is a step; the next save removes it
// all and leaves the published step as it was.
TEST_P(ManageStorage, LeftoversOfKilledSavesAreSweptByTheNextSave) {
  ckptio_manager_options mo = CKPTIO_MANAGER_OPTIONS_INIT;
  mo.max_shard_bytes = 300 << 10;
  open(mo);
  ASSERT_EQ(save_step(1), 0) << ckptio_manager_last_error(m_);
  auto published = objects_of(1);
  void *upload = begin_upload(step_name(2) + "/model.safetensors");
  put(step_name(3) + "/model-00001-of-00002-deadbeef.safetensors", std::string(1000, 'x'));
  put(step_name(1) + "/model-00001-of-00004-0badc0de.safetensors", std::string(1000, 'y'));
  // The caller's own objects beside a checkpoint are not the manager's.
  put(step_name(1) + "/trainer_state.json", "{}");
  put(step_name(3) + "/notes.txt", "mine");
  EXPECT_EQ(open_uploads(), 1u);
  EXPECT_EQ(listed(), (std::vector<uint64_t>{1})) << "leftovers are not steps";
  EXPECT_EQ(latest(), 1u);

  ASSERT_EQ(save_step(4), 0) << ckptio_manager_last_error(m_);
  EXPECT_EQ(open_uploads(), 0u) << "the killed save's upload is still open";
  EXPECT_TRUE(objects_of(2).empty());
  EXPECT_EQ(objects_of(3), (std::vector<std::string>{"notes.txt"}));
  published.push_back("trainer_state.json");
  std::sort(published.begin(), published.end());
  EXPECT_EQ(objects_of(1), published) << "a published step lost or kept objects";
  EXPECT_EQ(listed(), (std::vector<uint64_t>{1, 4}));
  expect_step(root_ + "/" + step_name(1) + "/model.safetensors.index.json", 1);
  ops_->abandon(self_, upload);  // frees the test's handle (on S3: already aborted)
}

// A step whose set lost a shard is incomplete: listed as such, skipped on
// resume with a warning naming it, and removed by retention.
TEST_P(ManageStorage, AnIncompleteSetIsSkippedAndRemovedByRetention) {
  ckptio_manager_options mo = CKPTIO_MANAGER_OPTIONS_INIT;
  mo.max_shard_bytes = 300 << 10;
  mo.keep_last = 1;
  open(mo);
  ASSERT_EQ(save_step(1), 0) << ckptio_manager_last_error(m_);
  mo.keep_last = 0;  // keep both
  open(mo);
  ASSERT_EQ(save_step(2), 0) << ckptio_manager_last_error(m_);
  auto objs = objects_of(2);
  ASSERT_GT(objs.size(), 2u);
  char err[512] = "";
  ASSERT_EQ(ops_->remove(self_, (root_ + "/" + step_name(2) + "/" + objs[0]).c_str(), err, sizeof(err)), 0) << err;
  std::vector<int> complete;
  EXPECT_EQ(listed(&complete), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(complete, (std::vector<int>{1, 0}));
  EXPECT_EQ(latest(), 1u);
  EXPECT_TRUE(warn_.any_contains(step_name(2))) << "the skipped step is named";
  mo.keep_last = 1;
  open(mo);
  ASSERT_EQ(save_step(3), 0) << ckptio_manager_last_error(m_);
  EXPECT_EQ(listed(), (std::vector<uint64_t>{3}));
  EXPECT_TRUE(objects_of(2).empty());
}

// A step saved again as another kind: the new checkpoint is what the step
// opens as, and nothing of the old one is left.
TEST_P(ManageStorage, AStepSavedAgainAsAnotherKindReplacesIt) {
  ckptio_manager_options sharded = CKPTIO_MANAGER_OPTIONS_INIT;
  sharded.max_shard_bytes = 300 << 10;
  open(sharded);
  ASSERT_EQ(save_step(5), 0) << ckptio_manager_last_error(m_);
  EXPECT_GT(objects_of(5).size(), 2u);
  open();  // single files
  ASSERT_EQ(save_step(5, 2), 0) << ckptio_manager_last_error(m_);
  EXPECT_EQ(objects_of(5), (std::vector<std::string>{"model.safetensors"}));
  std::string path;
  EXPECT_EQ(latest(&path), 5u);
  expect_step(path, 5, 2);
  open(sharded);
  ASSERT_EQ(save_step(5, 3), 0) << ckptio_manager_last_error(m_);
  auto objs = objects_of(5);
  EXPECT_EQ(std::count(objs.begin(), objs.end(), "model.safetensors"), 0) << "the single file is left";
  EXPECT_EQ(std::count(objs.begin(), objs.end(), "model.safetensors.index.json"), 1);
  EXPECT_EQ(latest(&path), 5u);
  expect_step(path, 5, 3);
}

// .pt and compressed steps on a storage: model.pt (its chunks holding the
// tensors' data descriptors sent as soon as the chunks before them are in)
// and model.safetensors.zst, published, found by `latest`, loaded whole and
// verified. A compressed step on the in-memory storage, whose create verb
// takes the size first, is refused naming the URL, the older step kept.
TEST_P(ManageStorage, PtAndCompressedSteps) {
  ckptio_manager_options pt = CKPTIO_MANAGER_OPTIONS_INIT;
  pt.format = CKPTIO_FORMAT_PYTORCH;
  open(pt);
  ASSERT_EQ(save_step(3, 12), 0) << ckptio_manager_last_error(m_);
  EXPECT_EQ(objects_of(3), (std::vector<std::string>{"model.pt"}));
  std::string path;
  EXPECT_EQ(latest(&path), 3u);
  expect_step(path, 3, 12);
  ckptio_options z = small_options(64 << 10, 512 << 10, 4);
  z.cuda = 0;
  z.compress_level = 3;
  ckptio_manager_close(m_);
  m_ = nullptr;
  ASSERT_EQ(ckptio_manager_open(ctx_, root_.c_str(), nullptr, &z, &m_), 0) << ckptio_last_open_error();
  ckptio_manager_set_warning(m_, Warnings::fn, &warn_);
  int rc = save_step(4, 12);
  if (!s3_) {
    EXPECT_EQ(rc, CKPTIO_E_FORMAT);
    EXPECT_NE(std::string(ckptio_manager_last_error(m_)).find(root_), std::string::npos)
        << ckptio_manager_last_error(m_);
    EXPECT_EQ(latest(&path), 3u);
    return;
  }
  ASSERT_EQ(rc, 0) << ckptio_manager_last_error(m_);
  EXPECT_EQ(objects_of(4), (std::vector<std::string>{"model.safetensors.zst"}));
  EXPECT_EQ(latest(&path), 4u);
  expect_step(path, 4, 12);
}

// On a storage a check that fails for the network's sake (a connection
// dropped past the retries: CKPTIO_E_SHORT_IO) says nothing about the
// checkpoint: retention keeps the step, as it keeps one it could not check
// for lack of memory. (The in-memory storage injects the failure.)
TEST_P(ManageStorage, RetentionKeepsAStepItCouldNotReadForTheNetworksSake) {
  if (s3_) GTEST_SKIP() << "the failure is injected by the in-memory storage";
  ckptio_manager_options mo = CKPTIO_MANAGER_OPTIONS_INIT;
  mo.keep_last = 2;
  open(mo);
  ASSERT_EQ(save_step(1), 0) << ckptio_manager_last_error(m_);
  ASSERT_EQ(save_step(2), 0) << ckptio_manager_last_error(m_);
  {
    std::lock_guard<std::mutex> g(mem_.mu);
    mem_.drop_reads_under = root_ + "/" + step_name(2) + "/";
  }
  ASSERT_EQ(save_step(3), 0) << ckptio_manager_last_error(m_);
  std::vector<int> complete;
  EXPECT_EQ(listed(&complete), (std::vector<uint64_t>{1, 2, 3})) << "a step unread for the network's sake went";
  EXPECT_EQ(complete, (std::vector<int>{1, 0, 1}));
  {
    std::lock_guard<std::mutex> g(mem_.mu);
    mem_.drop_reads_under.clear();
  }
  ASSERT_EQ(save_step(4), 0) << ckptio_manager_last_error(m_);
  EXPECT_EQ(listed(), (std::vector<uint64_t>{3, 4})) << "once readable, it is retained by the rules";
}

// Errors name the URL: a storage nobody registered, a storage that cannot
// list, (S3) a bucket that does not exist.
TEST_P(ManageStorage, ErrorsNameTheUrl) {
  ckptio_manager *m = nullptr;
  EXPECT_EQ(ckptio_manager_open(ctx_, "nostore://x/ckpts", nullptr, nullptr, &m), CKPTIO_E_INVALID_ARG);
  EXPECT_NE(std::string(ckptio_last_open_error()).find("nostore://x/ckpts"), std::string::npos)
      << ckptio_last_open_error();
  if (s3_) {
    std::string url = "s3://no-such-bucket-ckptio/ckpts";
    EXPECT_LT(ckptio_manager_open(ctx_, url.c_str(), nullptr, nullptr, &m), 0);
    std::string msg = ckptio_last_open_error();
    EXPECT_NE(msg.find("no-such-bucket-ckptio"), std::string::npos) << msg;
    EXPECT_NE(msg.find("NoSuchBucket"), std::string::npos) << msg;
  } else {
    ckptio_storage_ops ro = MemStore::ops();
    ro.list = nullptr;
    ASSERT_EQ(ckptio_ctx_storage_register(ctx_, "nolist", &ro, &mem_), 0);
    EXPECT_EQ(ckptio_manager_open(ctx_, "nolist://ckpts", nullptr, nullptr, &m), CKPTIO_E_INVALID_ARG);
    EXPECT_NE(std::string(ckptio_last_open_error()).find("no list verb"), std::string::npos)
        << ckptio_last_open_error();
  }
  EXPECT_EQ(m, nullptr);
}

INSTANTIATE_TEST_SUITE_P(Storages, ManageStorage, ::testing::Values("mem", "s3"),
                         [](const ::testing::TestParamInfo<std::string> &p) { return p.param; });

}  // namespace
