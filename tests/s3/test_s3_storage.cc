// Saves and loads of s3://bucket/key through the storage interface, against
// a real S3 server (SeaweedFS, run around this test by tests/s3/weed_server.py,
// which sets AWS_ENDPOINT_URL, the credentials and CKPTIO_S3_BUCKET). In the
// cuda-fake variant the tensors are saved from and loaded onto fake GPUs.
// Every save is read back byte for byte with its CRCs checked, and after
// every save, failed or not, no multipart upload of its key is left open.
#define CKPTIO_EXPERIMENTAL  // the storage interface: ckptio_ctx_storage, registration
#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>

#include "ckpt_fixture.h"
#include "thread_comm.h"
extern "C" {
#include "s3/s3.h"
}

using namespace ckptio_test;

namespace {

const char *bucket() {
  const char *b = getenv("CKPTIO_S3_BUCKET");
  return b && *b ? b : "ckptio-test";
}

std::string url(const std::string &key) { return std::string("s3://") + bucket() + "/" + key; }

// Every tensor of the object, CRC-checked, onto the host or (cuda-fake) the
// fake GPUs, compared byte for byte; and rows 10-20 of the first as a slice.
// (The fixture's expect_loads also views the bytes in place, which an
// object refuses: it has no mapping.)
void expect_object_loads(ckptio_ctx *ctx, const std::string &path, const std::vector<Tensor> &ts) {
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(ctx, path.c_str(), nullptr, &r), 0) << ckptio_last_open_error();
  ASSERT_EQ(ckptio_reader_count(r), ts.size());
  std::vector<ckptio_load_request> reqs;
  std::vector<std::vector<uint8_t>> out(ts.size());
  std::vector<void *> dev(ts.size(), nullptr);
  for (size_t i = 0; i < ts.size(); i++) {
    int64_t idx = ckptio_reader_find(r, ts[i].name.c_str());
    ASSERT_GE(idx, 0) << ts[i].name;
    out[i].assign(ts[i].bytes.size(), 0xEE);
    reqs.push_back({(size_t)idx, out[i].data(), out[i].size(), CKPTIO_DEVICE_HOST});
    if (on_gpu()) {
      reqs[i].device = CKPTIO_DEVICE_CUDA((int)(i % (size_t)gpu_count()));
      ASSERT_EQ(ckptio_device_alloc(ctx, reqs[i].device, out[i].size(), &dev[i]), 0);
      reqs[i].dst = dev[i];
    }
  }
  const void *view = nullptr;
  EXPECT_EQ(ckptio_reader_view(r, 0, &view, nullptr), CKPTIO_E_FORMAT) << "an object has no view";
  int rc = ckptio_reader_load_many(r, reqs.data(), reqs.size());
  for (size_t i = 0; i < ts.size() && on_gpu(); i++) {
    if (rc == 0) from_gpu(out[i].data(), dev[i], out[i].size());
    ckptio_device_free(ctx, reqs[i].device, dev[i]);
  }
  ASSERT_EQ(rc, 0) << ckptio_reader_last_error(r);
  for (size_t i = 0; i < ts.size(); i++) EXPECT_TRUE(out[i] == ts[i].bytes) << path << ": " << ts[i].name;
  if (!ts.empty() && ts[0].shape.size() == 2 && ts[0].shape[0] >= 20) {
    size_t row = ts[0].bytes.size() / (size_t)ts[0].shape[0];
    std::vector<uint8_t> rows(10 * row);
    ASSERT_EQ(ckptio_reader_load_slice(r, (size_t)ckptio_reader_find(r, ts[0].name.c_str()), 0, 10, 20, rows.data(),
                                       rows.size(), nullptr),
              0)
        << ckptio_reader_last_error(r);
    EXPECT_EQ(0, memcmp(rows.data(), ts[0].bytes.data() + 10 * row, rows.size())) << "rows 10-20 of " << ts[0].name;
  }
  ckptio_reader_close(r);
}

// Requests the context's S3 client has sent so far.
uint64_t requests(ckptio_ctx *ctx, const std::string &path) {
  const ckptio_storage_ops *ops = nullptr;
  void *self = nullptr;
  char err[512] = "";
  EXPECT_EQ(ckptio_ctx_storage(ctx, path.c_str(), &ops, &self, err, sizeof(err)), 1) << err;  // 1: a storage serves it
  ckptio_s3_stats st{};
  ckptio_s3_client_stats(static_cast<ckptio_s3_client *>(self), &st);
  return st.requests;
}

class S3Storage : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!getenv("AWS_ENDPOINT_URL")) GTEST_SKIP() << "no S3 server (run under tests/s3/weed_server.py)";
    char err[512] = "";
    int rc = ckptio_s3_client_create(nullptr, &client, err, sizeof(err));
    if (rc == CKPTIO_E_FORMAT) {  // a build without libcurl: the whole binary skips (ctest's 77)
      printf("SKIP: %s\n", err);
      fflush(stdout);
      _exit(77);
    }
    ASSERT_EQ(rc, 0) << err;
  }
  void TearDown() override { ckptio_s3_client_free(client); }

  // Uploads open under key (exactly that key; or, under, every key under it).
  int open_uploads(const std::string &key, bool under = false) {
    struct Count {
      std::string key;
      bool under;
      int n;
    } c{key, under, 0};
    char err[512] = "";
    int rc = ckptio_s3_list_uploads(
        client, bucket(), key.c_str(),
        [](void *arg, const char *k, const char *) {
          Count *c = static_cast<Count *>(arg);
          c->n += c->key == k || (c->under && !strncmp(k, c->key.c_str(), c->key.size()));
          return 0;
        },
        &c, err, sizeof(err));
    EXPECT_EQ(rc, 0) << err;
    return c.n;
  }

  std::vector<Tensor> model(uint64_t seed, int n = 6) {
    std::vector<Tensor> ts;
    for (int k = 0; k < n; k++)
      ts.push_back(make_tensor("layers." + std::to_string(k) + ".w", CKPTIO_BF16, {300 + k, 1024}, seed + k));
    ts.push_back(make_tensor("norm", CKPTIO_F32, {17}, seed + 100));
    return ts;
  }

  ckptio_s3_client *client = nullptr;
};

// 8 MiB chunks: one part per chunk, uploaded from the ring's slots; 64 KiB
// chunks: under S3's 5 MiB part minimum, so 80 chunks are put together per
// part. Either way the object is what was saved, and an overwrite replaces it.
TEST_F(S3Storage, SavesReadBackByteForByteAtEitherChunkSize) {
  for (size_t chunk : {size_t(8) << 20, size_t(64) << 10}) {
    ckptio_options o = small_options(chunk, 4 * chunk, 4);
    TestContext c(o);
    std::string key = "saves/chunk" + std::to_string(chunk) + ".safetensors";
    std::vector<Tensor> a = model(1, 24);  // 14.6 MiB: several parts
    std::string err;
    ASSERT_EQ(save(c.ctx, url(key), a, nullptr, &err), 0) << err;
    expect_object_loads(c.ctx, url(key), a);
    std::vector<Tensor> b = model(2, 3);
    ASSERT_EQ(save(c.ctx, url(key), b, nullptr, &err), 0) << err;
    expect_object_loads(c.ctx, url(key), b);
    EXPECT_EQ(open_uploads(key), 0);
  }
}

// One chunk or less: a single PUT at publish; an empty checkpoint too.
TEST_F(S3Storage, SmallAndEmptyObjects) {
  TestContext c;
  std::string err;
  std::vector<Tensor> one = {make_tensor("x", CKPTIO_F32, {5}, 3)};
  ASSERT_EQ(save(c.ctx, url("small.safetensors"), one, nullptr, &err), 0) << err;
  expect_object_loads(c.ctx, url("small.safetensors"), one);
  ASSERT_EQ(save(c.ctx, url("empty.safetensors"), {}, nullptr, &err), 0) << err;
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(c.ctx, url("empty.safetensors").c_str(), nullptr, &r), 0) << ckptio_last_open_error();
  EXPECT_EQ(ckptio_reader_count(r), 0u);
  ckptio_reader_close(r);
}

// A save that dies before its publish (the process killed: it could not
// abort) leaves an upload open; the next save of the key aborts it, as the
// next local save removes a killed save's temp file.
TEST_F(S3Storage, NextSaveAbortsAnUploadACrashedSaveLeftOpen) {
  std::string key = "saves/crashed.safetensors";
  char id[CKPTIO_S3_UPLOAD_ID_MAX], err[512] = "";
  ASSERT_EQ(ckptio_s3_multipart_create(client, bucket(), key.c_str(), id, err, sizeof(err)), 0) << err;
  ASSERT_EQ(open_uploads(key), 1);
  TestContext c;
  std::string why;
  std::vector<Tensor> ts = model(5);
  ASSERT_EQ(save(c.ctx, url(key), ts, nullptr, &why), 0) << why;
  EXPECT_EQ(open_uploads(key), 0) << "the crashed save's upload is still open";
  expect_object_loads(c.ctx, url(key), ts);
}

// A save that fails half way (a GPU copy fails after parts went up): an
// error naming the cause, the old object untouched, no upload left open.
TEST_F(S3Storage, AFailedSaveKeepsTheOldObjectAndLeavesNoUpload) {
  if (!fake_gpu()) GTEST_SKIP() << "needs the fake CUDA runtime's injected failures (the cuda-fake variant)";
  ckptio_options o = small_options(8 << 20, 32 << 20, 4);
  TestContext c(o);
  std::string key = "saves/failing.safetensors", err;
  std::vector<Tensor> old = model(7, 3);
  ASSERT_EQ(save(c.ctx, url(key), old, nullptr, &err), 0) << err;
  sym<int (*)(const char *, long, int)>("fake_cudart_set_fail")("cudaMemcpyAsync", 4, 700);
  int rc = save(c.ctx, url(key), model(8, 24), nullptr, &err);
  sym<int (*)(const char *, long, int)>("fake_cudart_set_fail")(nullptr, 0, 0);
  EXPECT_EQ(rc, CKPTIO_E_DEVICE) << err;
  EXPECT_NE(err.find("cudaErrorIllegalAddress"), std::string::npos) << err;
  expect_object_loads(c.ctx, url(key), old);
  EXPECT_EQ(open_uploads(key), 0);
}

// A sharded set saved to a storage prefix; in the cuda-fake variant a second
// save fails half way (an injected GPU copy failure after shards went up):
// the old set still loads whole, and no new shard and no upload is left.
TEST_F(S3Storage, ASetSaveIsWholeOrNotAtAll) {
  ckptio_options o = small_options(8 << 20, 32 << 20, 4);
  TestContext c(o);
  std::string dir = url("sets/c"), index = dir + "/model.safetensors.index.json";
  auto save_set = [&](const std::vector<Tensor> &ts, std::string *why) {
    ckptio_writer *w = nullptr;
    int rc = ckptio_writer_open_sharded(c.ctx, dir.c_str(), "model", CKPTIO_FORMAT_SAFETENSORS, 4 << 20,
                                        CKPTIO_SHARD_ORDER_ADDED, nullptr, &w);
    if (rc < 0) {
      *why = ckptio_last_open_error();
      return rc;
    }
    std::vector<void *> dev;
    for (size_t i = 0; i < ts.size() && rc == 0; i++) {
      ckptio_tensor d = host_desc(ts[i]);
      if (on_gpu()) {
        void *p = nullptr;
        EXPECT_EQ(ckptio_device_alloc(c.ctx, CKPTIO_DEVICE_CUDA(0), ts[i].bytes.size(), &p), 0);
        to_gpu(p, ts[i].bytes.data(), ts[i].bytes.size());
        d.data = p, d.device = CKPTIO_DEVICE_CUDA(0);
        dev.push_back(p);
      }
      rc = ckptio_writer_add(w, &d);
    }
    if (rc == 0) rc = ckptio_writer_commit(w);
    *why = ckptio_writer_last_error(w);
    ckptio_writer_close(w);
    for (void *p : dev) ckptio_device_free(c.ctx, CKPTIO_DEVICE_CUDA(0), p);
    return rc;
  };
  std::vector<Tensor> old = model(11, 30);
  std::string why;
  ASSERT_EQ(save_set(old, &why), 0) << why;
  expect_object_loads(c.ctx, index, old);
  int before = 0;
  struct Count {
    int n;
  } objects{0};
  auto count = [&]() {
    objects.n = 0;
    char err[512] = "";
    EXPECT_EQ(ckptio_s3_list_objects(
                  client, bucket(), "sets/c/",
                  [](void *arg, const char *, uint64_t, const char *) {
                    static_cast<Count *>(arg)->n++;
                    return 0;
                  },
                  &objects, err, sizeof(err)),
              0)
        << err;
    return objects.n;
  };
  before = count();
  EXPECT_GT(before, 3);
  if (fake_gpu()) {
    sym<int (*)(const char *, long, int)>("fake_cudart_set_fail")("cudaMemcpyAsync", 6, 700);
    int rc = save_set(model(12, 30), &why);
    sym<int (*)(const char *, long, int)>("fake_cudart_set_fail")(nullptr, 0, 0);
    EXPECT_EQ(rc, CKPTIO_E_DEVICE) << why;
    expect_object_loads(c.ctx, index, old);
    EXPECT_EQ(count(), before) << "a failed set save left objects behind";
    EXPECT_EQ(open_uploads("sets/c/", true), 0);
  }
  std::vector<Tensor> next = model(13, 5);
  ASSERT_EQ(save_set(next, &why), 0) << why;
  expect_object_loads(c.ctx, index, next);
  EXPECT_LT(count(), before) << "the older save's shards are removed";
}

// A multi-rank checkpoint in a storage (three ranks, threads here): each
// rank uploads its own object, named for the save, and rank 0 writes the
// index last; the checkpoint loads whole and by boxes. A save a rank aborts
// fails on every rank and leaves the previous checkpoint, no object and no
// upload behind; the next save removes the older save's objects.
TEST_F(S3Storage, AMultiRankCheckpointIsWholeOrNotAtAll) {
  const int n = 3;
  std::string dir = url("ranks/a"), index = dir + "/model.safetensors.index.json";
  auto save_ranks = [&](const std::vector<Tensor> &ts, int abort_rank, std::string *why) {
    Group g(n);
    std::vector<int> rcs(n, 0);
    std::vector<std::string> errs(n);
    std::vector<std::thread> th;
    for (int r = 0; r < n; r++)
      th.emplace_back([&, r] {
        Member m{&g, r};
        ckptio_comm comm = group_comm(&m);
        TestContext c(small_options(8 << 20, 32 << 20, 2));
        ckptio_writer *w = nullptr;
        int rc = ckptio_writer_open_ranks(c.ctx, &comm, dir.c_str(), "model", nullptr, &w);
        // ts[0] split by rows across the ranks, the rest whole on every rank (replicas).
        int64_t rows = ts[0].shape[0], lo = rows * r / n, hi = rows * (r + 1) / n;
        size_t row = ts[0].bytes.size() / (size_t)rows;
        ckptio_tensor part = host_desc(ts[0]);
        part.shape[0] = hi - lo;
        part.data = ts[0].bytes.data() + (size_t)lo * row;
        int64_t off[CKPTIO_MAX_DIMS] = {lo};
        if (rc == 0) rc = ckptio_writer_add_part(w, &part, ts[0].shape.data(), off);
        for (size_t i = 1; i < ts.size() && rc == 0; i++) {
          ckptio_tensor d = host_desc(ts[i]);
          rc = ckptio_writer_add(w, &d);
        }
        if (r == abort_rank) rc = ckptio_writer_abort(w, CKPTIO_E_RANK, "rank 1 gave up");
        else if (rc == 0) rc = ckptio_writer_commit(w);
        rcs[(size_t)r] = rc;
        errs[(size_t)r] = w ? ckptio_writer_last_error(w) : ckptio_last_open_error();
        ckptio_writer_close(w);
      });
    for (auto &t : th) t.join();
    for (int r = 0; r < n; r++)
      if (rcs[(size_t)r] < 0) {
        *why = errs[(size_t)r];
        return rcs[(size_t)r];
      }
    return 0;
  };
  auto objects = [&]() {
    int count = 0;
    char err[512] = "";
    EXPECT_EQ(ckptio_s3_list_objects(
                  client, bucket(), "ranks/a/",
                  [](void *arg, const char *, uint64_t, const char *) {
                    ++*static_cast<int *>(arg);
                    return 0;
                  },
                  &count, err, sizeof(err)),
              0)
        << err;
    return count;
  };
  std::vector<Tensor> old = {make_tensor("rows", CKPTIO_BF16, {900, 4096}, 21),  // 7 MiB: 2.4 MiB a rank
                             make_tensor("rep", CKPTIO_F32, {100, 256}, 22)};
  std::string why;
  ASSERT_EQ(save_ranks(old, -1, &why), 0) << why;
  TestContext c;
  expect_object_loads(c.ctx, index, old);
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(c.ctx, index.c_str(), nullptr, &r), 0) << ckptio_last_open_error();
  EXPECT_EQ(ckptio_reader_part_count(r, (size_t)ckptio_reader_find(r, "rows")), (size_t)n);
  ckptio_reader_close(r);
  int before = objects();
  EXPECT_EQ(before, n + 1) << "one object a rank, and the index";

  EXPECT_EQ(save_ranks({make_tensor("rows", CKPTIO_BF16, {900, 4096}, 23), old[1]}, 1, &why), CKPTIO_E_RANK);
  EXPECT_NE(why.find("rank 1 gave up"), std::string::npos) << why;
  expect_object_loads(c.ctx, index, old);
  EXPECT_EQ(objects(), before) << "a failed save left objects behind";
  EXPECT_EQ(open_uploads("ranks/a/", true), 0);

  std::vector<Tensor> next = {make_tensor("rows", CKPTIO_BF16, {600, 4096}, 24), make_tensor("more", CKPTIO_I8, {77}, 25)};
  ASSERT_EQ(save_ranks(next, -1, &why), 0) << why;
  expect_object_loads(c.ctx, index, next);
  EXPECT_EQ(objects(), n + 1) << "the older save's objects are removed";
  EXPECT_EQ(open_uploads("ranks/a/", true), 0);
}

// What cannot be saved says so at open, before anything is sent: a scheme
// nobody serves; a compressed file to a storage whose create verb needs the
// size first (any but the built-in S3 one: a registered one here).
TEST_F(S3Storage, UnsupportedSavesAreRefusedAtOpen) {
  TestContext c;
  ckptio_writer *w = nullptr;
  EXPECT_EQ(ckptio_writer_open(c.ctx, "nostore://x", CKPTIO_FORMAT_SAFETENSORS, nullptr, &w), CKPTIO_E_INVALID_ARG);
  ckptio_storage_ops ro{};  // every verb fails: only the open's refusal is looked at
  ro.size = sizeof(ro);
  ro.open_read = [](void *, const char *, void **, uint64_t *, char *, size_t) { return -ENOENT; };
  ro.read = [](void *, void *, void *, size_t, uint64_t, char *, size_t) { return -EIO; };
  ro.close_read = [](void *, void *) {};
  ro.create = [](void *, const char *, uint64_t, uint64_t, void **, char *, size_t) { return -EIO; };
  ro.write = [](void *, void *, const void *, size_t, uint64_t, char *, size_t) { return -EIO; };
  ro.publish = [](void *, void *, char *, size_t) { return -EIO; };
  ro.abandon = [](void *, void *) {};
  ASSERT_EQ(ckptio_ctx_storage_register(c.ctx, "sized", &ro, nullptr), 0) << ckptio_last_open_error();
  ckptio_options z = CKPTIO_OPTIONS_INIT;
  z.compress_level = 3;
  EXPECT_EQ(ckptio_writer_open(c.ctx, "sized://m.safetensors", CKPTIO_FORMAT_SAFETENSORS, &z, &w), CKPTIO_E_FORMAT);
  EXPECT_NE(std::string(ckptio_last_open_error()).find("size"), std::string::npos) << ckptio_last_open_error();
  EXPECT_EQ(w, nullptr);
}

// .pt archives and compressed files (with and without the shuffle filter)
// saved to and loaded from objects, at 8 MiB chunks (a part each) and 64
// KiB chunks (80 a part, with a ring of 4 slots: a .pt's chunks nearly all
// hold a tensor's CRC in its data descriptor, so they must go as soon as
// the chunks before them are in, not at the end, or the ring runs dry).
// Loads read the index in a few requests, whatever the tensor count.
TEST_F(S3Storage, PtAndCompressedFilesRoundTripAtEitherChunkSize) {
  for (size_t chunk : {size_t(8) << 20, size_t(64) << 10}) {
    ckptio_options o = small_options(chunk, 4 * chunk, 4);
    TestContext c(o);
    std::vector<Tensor> a = model(31, 24);  // 14.6 MiB: several parts
    std::string tag = std::to_string(chunk), err;
    std::string pt = "fmt/m" + tag + ".pt";
    ASSERT_EQ(save_format(c.ctx, url(pt), a, CKPTIO_FORMAT_PYTORCH, nullptr, &err), 0) << err;
    EXPECT_EQ(open_uploads(pt), 0);
    uint64_t before = requests(c.ctx, url(pt));
    ckptio_reader *r = nullptr;
    ASSERT_EQ(ckptio_reader_open(c.ctx, url(pt).c_str(), nullptr, &r), 0) << ckptio_last_open_error();
    EXPECT_EQ(ckptio_reader_count(r), a.size());
    ckptio_reader_close(r);
    // HEAD, the first 256 KiB (which hold the archive's head: no request
    // again), the tail (directory and small records), then one read per
    // local header not within 64 KiB of another (24 tensor records 600 KiB
    // apart), in parallel: 27.
    EXPECT_LE(requests(c.ctx, url(pt)) - before, 3u + 24u) << "requests to open the archive";
    expect_object_loads(c.ctx, url(pt), a);
    for (int shuffle : {0, 1}) {
      ckptio_options z = o;
      z.compress_level = 3;
      z.shuffle = shuffle;
      std::string zk = "fmt/m" + tag + "-" + std::to_string(shuffle) + ".safetensors";
      ASSERT_EQ(save_format(c.ctx, url(zk), a, CKPTIO_FORMAT_SAFETENSORS, &z, &err), 0) << err;
      EXPECT_EQ(open_uploads(zk), 0);
      before = requests(c.ctx, url(zk));
      ASSERT_EQ(ckptio_reader_open(c.ctx, url(zk).c_str(), nullptr, &r), 0) << ckptio_last_open_error();
      EXPECT_EQ(ckptio_reader_count(r), a.size());
      ckptio_reader_close(r);
      // HEAD, the first 256 KiB (with the header frame: no request again)
      // and the tail (with the seek table): 3.
      EXPECT_LE(requests(c.ctx, url(zk)) - before, 3u) << "requests to open the compressed file";
      expect_object_loads(c.ctx, url(zk), a);
    }
  }
}

// A fill that fails once parts are up: the save fails naming the cause,
// its upload is aborted (none left open), the old object still loads.
int failing_fill(void *arg, uint64_t off, void *dst, uint64_t n, char *why, size_t why_len) {
  memset(dst, 7, n);
  if (off + n > *static_cast<uint64_t *>(arg)) {
    snprintf(why, why_len, "the source went away");
    return -EIO;
  }
  return 0;
}

TEST_F(S3Storage, FailedPtAndCompressedSavesLeaveNoUploadAndKeepTheOldObject) {
  ckptio_options o = small_options(64 << 10, 256 << 10, 4);
  TestContext c(o);
  for (int compress : {0, 1}) {
    std::string key = compress ? "fail/m.safetensors" : "fail/m.pt", err;
    ckptio_format f = compress ? CKPTIO_FORMAT_SAFETENSORS : CKPTIO_FORMAT_PYTORCH;
    ckptio_options z = o;
    z.compress_level = compress ? 1 : 0;
    std::vector<Tensor> old = model(51, 3);
    ASSERT_EQ(save_format(c.ctx, url(key), old, f, &z, &err), 0) << err;
    ckptio_writer *w = nullptr;
    ASSERT_EQ(ckptio_writer_open(c.ctx, url(key).c_str(), f, &z, &w), 0) << ckptio_last_open_error();
    std::vector<Tensor> next = model(52, 12);  // 7.3 MiB before the fill: parts go up first
    for (const Tensor &t : next) {
      ckptio_tensor d = host_desc(t);
      ASSERT_EQ(ckptio_writer_add(w, &d), 0);
    }
    uint64_t fail_at = 3 << 20;
    ckptio_tensor d{};
    d.name = "filled";
    d.dtype = CKPTIO_U8;
    d.ndim = 1;
    d.shape[0] = 8 << 20;
    d.device = CKPTIO_DEVICE_HOST;
    ASSERT_EQ(ckptio_writer_add_fill(w, &d, failing_fill, &fail_at), 0) << ckptio_writer_last_error(w);
    int rc = ckptio_writer_commit(w);
    std::string msg = ckptio_writer_last_error(w);
    ckptio_writer_close(w);
    EXPECT_LT(rc, 0);
    EXPECT_NE(msg.find("the source went away"), std::string::npos) << msg;
    EXPECT_EQ(open_uploads(key), 0) << key;
    expect_object_loads(c.ctx, url(key), old);
  }
}

// Objects cut short or with a byte changed: the open or the load fails with
// the URL in the message, never a crash or wrong bytes.
TEST_F(S3Storage, DamagedPtAndCompressedObjectsFailNamingTheUrl) {
  TestContext c;
  std::vector<Tensor> a = model(61, 4);
  std::string err;
  for (int compress : {0, 1}) {
    std::string key = compress ? "damaged/src.safetensors" : "damaged/src.pt";
    ckptio_options z = small_options();
    z.compress_level = compress ? 3 : 0;
    ASSERT_EQ(save_format(c.ctx, url(key), a, compress ? CKPTIO_FORMAT_SAFETENSORS : CKPTIO_FORMAT_PYTORCH, &z, &err), 0)
        << err;
    ckptio_s3_object head{};
    char why[512] = "";
    ASSERT_EQ(ckptio_s3_head(client, bucket(), key.c_str(), &head, why, sizeof(why)), 0) << why;
    std::vector<uint8_t> bytes(head.size);
    ASSERT_EQ(ckptio_s3_get_range(client, bucket(), key.c_str(), 0, bytes.size(), bytes.data(), why, sizeof(why)), 0)
        << why;
    struct Damage {
      const char *name;
      size_t keep;
      size_t flip;  // a byte changed, or SIZE_MAX
    };
    std::vector<Damage> cases = {{"cut-end", bytes.size() - 7, SIZE_MAX},
                                 {"cut-half", bytes.size() / 2, SIZE_MAX},
                                 {"flipped", bytes.size(), bytes.size() / 2}};
    for (const Damage &d : cases) {
      std::string bad = std::string("damaged/") + d.name + (compress ? ".safetensors" : ".pt");
      std::vector<uint8_t> b(bytes.begin(), bytes.begin() + (long)d.keep);
      if (d.flip != SIZE_MAX) b[d.flip] ^= 0x5a;
      ASSERT_EQ(ckptio_s3_put_object(client, bucket(), bad.c_str(), b.data(), b.size(), nullptr, why, sizeof(why)), 0)
          << why;
      ckptio_reader *r = nullptr;
      int rc = ckptio_reader_open(c.ctx, url(bad).c_str(), nullptr, &r);
      std::string msg = rc < 0 ? ckptio_last_open_error() : "";
      if (rc == 0) {
        std::vector<std::vector<uint8_t>> out(ckptio_reader_count(r));
        std::vector<ckptio_load_request> reqs;
        for (size_t i = 0; i < out.size(); i++) {
          ckptio_tensor_info info{};
          ASSERT_EQ(ckptio_reader_info(r, i, &info), 0);
          out[i].resize(info.nbytes);
          reqs.push_back({i, out[i].data(), out[i].size(), CKPTIO_DEVICE_HOST});
        }
        rc = ckptio_reader_load_many(r, reqs.data(), reqs.size());
        msg = ckptio_reader_last_error(r);
        ckptio_reader_close(r);
      }
      EXPECT_LT(rc, 0) << bad << " loaded";
      EXPECT_NE(msg.find(url(bad)), std::string::npos) << bad << ": " << msg;
    }
  }
}

// Every read of an object is an HTTP request, so neighbouring small tensors
// are read together, up to a staging chunk a GET (300 norms of 6 KiB: one
// GET, not 300), each still CRC-checked on its own: a byte changed inside
// the run fails the load with that tensor's name.
TEST_F(S3Storage, NeighbouringTensorsAreReadByOneRequest) {
  ckptio_options o = small_options(8 << 20, 32 << 20, 4);
  TestContext c(o);
  std::vector<Tensor> ts;
  for (int k = 0; k < 300; k++) ts.push_back(make_tensor("norms." + std::to_string(k), CKPTIO_F32, {1536}, 40 + k));
  std::string key = "loads/norms.safetensors", err;
  ASSERT_EQ(save(c.ctx, url(key), ts, nullptr, &err), 0) << err;
  uint64_t before = requests(c.ctx, url(key));
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(c.ctx, url(key).c_str(), nullptr, &r), 0) << ckptio_last_open_error();
  uint64_t opened = requests(c.ctx, url(key));
  // The header (300 entries, ~30 KiB) is inside the first bytes the open reads.
  EXPECT_EQ(opened - before, 2u) << "a HEAD and one read of the first bytes, the header with them";
  std::vector<std::vector<uint8_t>> out(ts.size());
  std::vector<ckptio_load_request> reqs;
  for (size_t i = 0; i < ts.size(); i++) {
    out[i].assign(ts[i].bytes.size(), 0xEE);
    reqs.push_back({(size_t)ckptio_reader_find(r, ts[i].name.c_str()), out[i].data(), out[i].size(),
                    CKPTIO_DEVICE_HOST});
  }
  ASSERT_EQ(ckptio_reader_load_many(r, reqs.data(), reqs.size()), 0) << ckptio_reader_last_error(r);
  EXPECT_EQ(requests(c.ctx, url(key)) - opened, 1u) << "300 tensors of 6 KiB in one GET";
  for (size_t i = 0; i < ts.size(); i++) ASSERT_TRUE(out[i] == ts[i].bytes) << ts[i].name;
  ckptio_tensor_info info;
  ASSERT_EQ(ckptio_reader_info(r, (size_t)ckptio_reader_find(r, "norms.150"), &info), 0);
  ckptio_reader_close(r);

  // The same object with one byte of norms.150 changed, uploaded as it is.
  ckptio_s3_object head;
  char e[512] = "";
  ASSERT_EQ(ckptio_s3_head(client, bucket(), key.c_str(), &head, e, sizeof(e)), 0) << e;
  std::vector<uint8_t> bytes(head.size);
  ASSERT_EQ(ckptio_s3_get_range(client, bucket(), key.c_str(), 0, bytes.size(), bytes.data(), e, sizeof(e)), 0) << e;
  bytes[info.offset + 100] ^= 0x01;
  std::string bad = "loads/norms-flipped.safetensors";
  ASSERT_EQ(ckptio_s3_put_object(client, bucket(), bad.c_str(), bytes.data(), bytes.size(), nullptr, e, sizeof(e)), 0)
      << e;
  ASSERT_EQ(ckptio_reader_open(c.ctx, url(bad).c_str(), nullptr, &r), 0) << ckptio_last_open_error();
  uint64_t start = requests(c.ctx, url(bad));
  EXPECT_EQ(ckptio_reader_load_many(r, reqs.data(), reqs.size()), CKPTIO_E_CHECKSUM);
  EXPECT_EQ(requests(c.ctx, url(bad)) - start, 1u);
  std::string msg = ckptio_reader_last_error(r);
  EXPECT_NE(msg.find("tensor 'norms.150': checksum mismatch"), std::string::npos) << msg;
  EXPECT_NE(msg.find(url(bad)), std::string::npos) << msg;
  ckptio_reader_close(r);
}

// The stretches of `grid` bytes of an object that the bytes of each tensor
// of `want` fall in.
std::set<uint64_t> stretches(ckptio_reader *r, const std::vector<Tensor> &ts, const std::vector<size_t> &want,
                             uint64_t grid) {
  std::set<uint64_t> out;
  for (size_t i : want) {
    ckptio_tensor_info info;
    EXPECT_EQ(ckptio_reader_info(r, (size_t)ckptio_reader_find(r, ts[i].name.c_str()), &info), 0);
    for (uint64_t at = info.offset; at < info.offset + info.nbytes; at = (at / grid + 1) * grid)
      out.insert(at / grid);
  }
  return out;
}

// A server reads a multipart object a part at a time (8 MiB parts here,
// ckptio's chunk), and a GET across a part boundary reads two. So a load's
// GETs follow the object's grid of parts, not its tensors: one GET for each
// aligned pair of parts (16 MiB) that holds wanted bytes when all of them go
// to host memory, its body going straight to the tensors in it, whatever
// their sizes (a tensor across a line is read by the GETs of both sides);
// every byte in place. All 7 tensors here (26 MiB, four parts) are 2 GETs;
// read tensor by tensor (up to 8 MiB a GET from each one's start, the small
// ones with their neighbours) they were 7, and by single parts 4.
TEST_F(S3Storage, LoadsReadTheObjectByPairsOfParts) {
  ckptio_options o = small_options(8 << 20, 32 << 20, 4);
  TestContext c(o);
  std::vector<Tensor> ts;
  const int64_t kib[] = {3 << 10, 6, 5 << 10, 11 << 10, 100, 7 << 10, 6};
  for (size_t k = 0; k < sizeof(kib) / sizeof(kib[0]); k++)
    ts.push_back(make_tensor("t" + std::to_string(k), CKPTIO_F32, {kib[k] * 256}, 70 + k));
  std::string key = "loads/stretches.safetensors", err;
  ASSERT_EQ(save(c.ctx, url(key), ts, nullptr, &err), 0) << err;
  // Loads the tensors of `want` (tensor `gpu` onto a GPU, -1: none) and
  // checks every byte; returns the GETs it sent, and in *grids the
  // tensors' 8 MiB and 16 MiB stretches.
  auto load = [&](const std::vector<size_t> &want, long gpu, size_t grids[2]) -> uint64_t {
    ckptio_reader *r = nullptr;
    EXPECT_EQ(ckptio_reader_open(c.ctx, url(key).c_str(), nullptr, &r), 0) << ckptio_last_open_error();
    if (!r) return 0;
    std::vector<std::vector<uint8_t>> out(ts.size());
    std::vector<ckptio_load_request> reqs;
    void *dev = nullptr;
    for (size_t i : want) {
      out[i].assign(ts[i].bytes.size(), 0xEE);
      reqs.push_back({(size_t)ckptio_reader_find(r, ts[i].name.c_str()), out[i].data(), out[i].size(),
                      CKPTIO_DEVICE_HOST});
      if ((long)i == gpu) {
        EXPECT_EQ(ckptio_device_alloc(c.ctx, CKPTIO_DEVICE_CUDA(0), out[i].size(), &dev), 0);
        reqs.back().dst = dev, reqs.back().device = CKPTIO_DEVICE_CUDA(0);
      }
    }
    grids[0] = stretches(r, ts, want, 8 << 20).size();
    grids[1] = stretches(r, ts, want, 16 << 20).size();
    uint64_t before = requests(c.ctx, url(key));
    int rc = ckptio_reader_load_many(r, reqs.data(), reqs.size());
    uint64_t gets = requests(c.ctx, url(key)) - before;
    if (dev) {
      if (rc == 0) from_gpu(out[(size_t)gpu].data(), dev, out[(size_t)gpu].size());
      ckptio_device_free(c.ctx, CKPTIO_DEVICE_CUDA(0), dev);
    }
    EXPECT_EQ(rc, 0) << ckptio_reader_last_error(r);
    for (size_t i : want) EXPECT_TRUE(rc != 0 || out[i] == ts[i].bytes) << ts[i].name;
    ckptio_reader_close(r);
    return gets;
  };
  const std::vector<size_t> all = {0, 1, 2, 3, 4, 5, 6};
  for (const auto &want : std::vector<std::vector<size_t>>{all, {3}, {0, 6}}) {
    size_t grids[2];
    uint64_t gets = load(want, -1, grids);
    if (want.size() == ts.size()) {
      EXPECT_EQ(grids[0], 4u) << "the layout the comment describes";
      EXPECT_EQ(grids[1], 2u) << "the layout the comment describes";
    }
    EXPECT_EQ(gets, grids[1]) << want.size() << " tensors";
  }
  if (!on_gpu()) return;
  // A part for a GPU goes through a slot, which holds one 8 MiB cell: with
  // t3 (across parts 1 and 2) on a GPU, no pair is host-only, and the four
  // parts are four GETs, every byte in place.
  size_t grids[2];
  EXPECT_EQ(load(all, 3, grids), 4u) << "t3 on a GPU";
}

// A column slice is a run per row. From an object, runs under 64 KiB apart
// share a GET (the bytes between dropped, and counted in bytes_read): the
// 256 rows of a column slice of a 1 MiB tensor are one GET, not 256; rows
// 256 KiB apart are still read run by run, never the megabytes between.
TEST_F(S3Storage, AColumnSliceIsReadByFewGets) {
  ckptio_options o = small_options(8 << 20, 32 << 20, 4);
  TestContext c(o);
  std::vector<Tensor> ts = {make_tensor("a.near", CKPTIO_F32, {256, 1024}, 91),
                            make_tensor("b.far", CKPTIO_F32, {16, 65536}, 92)};
  std::string key = "loads/columns.safetensors", err;
  ASSERT_EQ(save(c.ctx, url(key), ts, nullptr, &err), 0) << err;
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(c.ctx, url(key).c_str(), nullptr, &r), 0) << ckptio_last_open_error();
  struct Case {
    size_t t;
    int64_t cols, start, stop;
    uint64_t gets, max_read;
  } cases[] = {{0, 1024, 100, 200, 1, 1 << 20}, {1, 65536, 10, 20, 16, 16 * 40}};
  for (const Case &k : cases) {
    std::vector<uint8_t> out((size_t)(ts[k.t].shape[0] * (k.stop - k.start) * 4), 0xEE);
    ckptio_slice_request q{};
    q.index = (size_t)ckptio_reader_find(r, ts[k.t].name.c_str());
    q.dim = 1, q.start = k.start, q.stop = k.stop, q.dst = out.data(), q.dst_bytes = out.size();
    q.device = CKPTIO_DEVICE_HOST;
    uint64_t before = requests(c.ctx, url(key));
    ASSERT_EQ(ckptio_reader_load_slices(r, &q, 1), 0) << ckptio_reader_last_error(r);
    EXPECT_EQ(requests(c.ctx, url(key)) - before, k.gets) << ts[k.t].name;
    EXPECT_GE(q.bytes_read, out.size()) << ts[k.t].name;
    EXPECT_LE(q.bytes_read, k.max_read) << ts[k.t].name;
    size_t row = (size_t)(k.stop - k.start) * 4;
    for (int64_t i = 0; i < ts[k.t].shape[0]; i++)
      ASSERT_EQ(0, memcmp(out.data() + i * row, ts[k.t].bytes.data() + (i * k.cols + k.start) * 4, row))
          << ts[k.t].name << " row " << i;
  }
  ckptio_reader_close(r);
}

// The server gone in the middle of a save: an error naming the object, in
// bounded time, and no crash (run alone, last: it kills the server).
TEST_F(S3Storage, ServerKilledMidSave) {
  const char *pid = getenv("CKPTIO_WEED_PID");
  if (!pid || !getenv("CKPTIO_S3_KILL")) GTEST_SKIP() << "run alone by the s3_storage_kill test";
  ckptio_options o = small_options(8 << 20, 32 << 20, 4);
  TestContext c(o);
  std::vector<Tensor> big = model(9, 200);  // 120 MiB
  ckptio_writer *w = nullptr;
  ASSERT_EQ(ckptio_writer_open(c.ctx, url("saves/killed.safetensors").c_str(), CKPTIO_FORMAT_SAFETENSORS, nullptr, &w),
            0);
  for (const Tensor &t : big) {
    ckptio_tensor d = host_desc(t);
    ASSERT_EQ(ckptio_writer_add(w, &d), 0);
  }
  ASSERT_EQ(ckptio_writer_commit_async(w), 0);
  usleep(200 * 1000);
  kill(-atoi(pid), SIGKILL);
  kill(atoi(pid), SIGKILL);
  int rc = ckptio_writer_wait_durable(w);
  std::string msg = ckptio_writer_last_error(w);
  ckptio_writer_close(w);
  EXPECT_LT(rc, 0);
  EXPECT_NE(msg.find("saves/killed.safetensors"), std::string::npos) << msg;
}

}  // namespace
