// Multi-rank checkpoints in one process: N threads play N ranks over an
// in-process communicator (a barrier and a shared buffer), each with its own
// context, as N processes would. They save row, column, 3-D and 2-D mesh
// splits, replicas and single-owner tensors as one checkpoint; any box of it
// loads equal to the global tensor; disagreeing ranks, overlaps, holes and a
// failing rank fail every rank and leave the previous checkpoint whole.
// (tests/dist runs the same API over real MPI processes.)
#include <pthread.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "ckpt_fixture.h"
#include "thread_comm.h"
extern "C" {
#include "core/box.h"
#include "io/fault.h"
}

using namespace ckptio_test;

namespace {

// ------------------------------------------------------------ tensors and boxes

// What one rank adds: a tensor whole, or a box of it.
struct Part {
  const Tensor *t;
  std::vector<int64_t> off, size;  // empty: whole (ckptio_writer_add)
};

struct RankResult {
  int rc = 0;
  std::string err;
  size_t files = 0;
};

// Every rank (a thread) saves its parts into dir with prefix "model".
std::vector<RankResult> save_ranks(const std::string &dir, int n,
                                   const std::function<std::vector<Part>(int rank)> &parts_of, int abort_rank = -1) {
  Group g(n);
  std::vector<RankResult> out((size_t)n);
  std::vector<std::thread> th;
  for (int r = 0; r < n; r++)
    th.emplace_back([&, r] {
      Member m{&g, r};
      ckptio_comm comm = {sizeof(ckptio_comm), r, n, &m, group_allgather, group_broadcast, group_alltoallv};
      ckptio_options o = small_options();
      ckptio_ctx *ctx = nullptr;
      RankResult &res = out[(size_t)r];
      // Contexts are made before the collectives so no rank waits on a failure here.
      res.rc = ckptio_ctx_create(&o, &ctx);
      ckptio_writer *w = nullptr;
      if (res.rc == 0) res.rc = ckptio_writer_open_ranks(ctx, &comm, dir.c_str(), "model", nullptr, &w);
      std::vector<std::vector<uint8_t>> boxes;
      std::vector<std::pair<int, void *>> on_device;
      auto parts = parts_of(r);
      boxes.reserve(parts.size());
      for (auto &p : parts) {
        if (res.rc < 0) break;
        boxes.push_back(p.off.empty() ? p.t->bytes : extract(*p.t, p.off, p.size));
        ckptio_tensor d = host_desc(*p.t);
        d.data = boxes.back().data();
        if (!p.off.empty())
          for (size_t k = 0; k < p.size.size(); k++) d.shape[k] = p.size[k];
        if (on_gpu() && !boxes.back().empty()) {
          void *dp = nullptr;
          d.device = CKPTIO_DEVICE_CUDA(r % gpu_count());
          if ((res.rc = ckptio_device_alloc(ctx, d.device, boxes.back().size(), &dp)) < 0) break;
          on_device.push_back({d.device, dp});
          to_gpu(dp, boxes.back().data(), boxes.back().size());
          d.data = dp;
        }
        res.rc = p.off.empty() ? ckptio_writer_add(w, &d)
                               : ckptio_writer_add_part(w, &d, p.t->shape.data(), p.off.data());
      }
      if (res.rc == 0 && r == abort_rank) res.rc = ckptio_writer_abort(w, -EIO, "its tensors could not be prepared");
      if (res.rc == 0) res.rc = ckptio_writer_commit_async(w);
      if (res.rc == 0) res.rc = ckptio_writer_wait_snapshot(w) < 0 ? ckptio_writer_wait_durable(w) : 0;
      if (res.rc == 0) res.rc = ckptio_writer_wait_durable(w);
      if (w) {
        res.err = ckptio_writer_last_error(w);
        res.files = ckptio_writer_shard_count(w);
        if (res.rc == 0) {
          EXPECT_EQ(ckptio_writer_poll_durable(w), 1);
        }
      }
      int rc2 = ckptio_writer_close(w);
      if (res.rc == 0) res.rc = rc2;
      for (auto &dp : on_device) ckptio_device_free(ctx, dp.first, dp.second);
      ckptio_ctx_free(ctx);
    });
  for (auto &t : th) t.join();
  return out;
}

int64_t split_start(int64_t size, int r, int n) {
  int64_t a, b;
  ckptio_split_rank(size, r, n, &a, &b);
  return a;
}
int64_t split_len(int64_t size, int r, int n) {
  int64_t a, b;
  ckptio_split_rank(size, r, n, &a, &b);
  return b - a;
}

// The model: every kind of split, replicas and a single owner.
struct Model {
  Tensor row = make_tensor("w_row", CKPTIO_F32, {10, 6}, 1);      // dim 0, uneven (3, 3, 3, 1)
  Tensor col = make_tensor("w_col", CKPTIO_BF16, {8, 12}, 2);     // dim 1
  Tensor cube = make_tensor("w3", CKPTIO_F32, {2, 3, 8}, 3);      // dim 2 of 3
  Tensor mesh = make_tensor("mesh", CKPTIO_F32, {8, 6}, 4);       // 2 x 2 when 4 ranks
  Tensor rep = make_tensor("rep", CKPTIO_F32, {16}, 5);           // every rank, whole
  Tensor only0 = make_tensor("only0", CKPTIO_I64, {5}, 6);        // rank 0 alone
  std::vector<const Tensor *> all() const { return {&row, &col, &cube, &mesh, &rep, &only0}; }

  std::vector<Part> parts(int r, int n) const {
    std::vector<Part> p;
    p.push_back({&row, {split_start(10, r, n), 0}, {split_len(10, r, n), 6}});
    p.push_back({&col, {0, split_start(12, r, n)}, {8, split_len(12, r, n)}});
    p.push_back({&cube, {0, 0, split_start(8, r, n)}, {2, 3, split_len(8, r, n)}});
    if (n == 4)
      p.push_back({&mesh, {(r / 2) * 4, (r % 2) * 3}, {4, 3}});
    else
      p.push_back({&mesh, {split_start(8, r, n), 0}, {split_len(8, r, n), 6}});
    p.push_back({&rep, {}, {}});
    if (r == 0) p.push_back({&only0, {}, {}});
    // A rank with an empty share of a split adds nothing for it.
    p.erase(std::remove_if(p.begin(), p.end(),
                           [](const Part &x) {
                             for (auto s : x.size)
                               if (s == 0) return true;
                             return false;
                           }),
            p.end());
    return p;
  }
};

ckptio_ctx *make_ctx() {
  ckptio_options o = small_options();
  ckptio_ctx *ctx = nullptr;
  EXPECT_EQ(ckptio_ctx_create(&o, &ctx), 0);
  return ctx;
}

// Loads box [lo, hi) of every tensor through load_boxes and compares.
void expect_box(ckptio_ctx *ctx, ckptio_reader *r, const Tensor &t, const std::vector<int64_t> &lo, const std::vector<int64_t> &hi,
                int device = CKPTIO_DEVICE_HOST) {
  int64_t index = ckptio_reader_find(r, t.name.c_str());
  ASSERT_GE(index, 0) << t.name;
  std::vector<int64_t> size(lo.size());
  for (size_t d = 0; d < lo.size(); d++) size[d] = hi[d] - lo[d];
  std::vector<uint8_t> want = extract(t, lo, size), got(want.size() + 1, 0xEE);
  ckptio_box_request q = {};
  q.index = (size_t)index;
  for (size_t d = 0; d < lo.size(); d++) q.start[d] = lo[d], q.stop[d] = hi[d];
  ASSERT_EQ(ckptio_reader_box_nbytes(r, q.index, q.start, q.stop), (int64_t)want.size());
  void *dev = nullptr;
  q.dst = got.data();
  q.dst_bytes = want.size();
  q.device = device;
  if (device != CKPTIO_DEVICE_HOST && !want.empty()) {
    ASSERT_EQ(ckptio_device_alloc(ctx, device, want.size(), &dev), 0);
    q.dst = dev;
  }
  ASSERT_EQ(ckptio_reader_load_boxes(r, &q, 1), 0) << ckptio_reader_last_error(r);
  if (dev) {
    from_gpu(got.data(), dev, want.size());
    ckptio_device_free(ctx, device, dev);
  }
  EXPECT_EQ(got[want.size()], 0xEE) << t.name << ": wrote past the box";
  got.resize(want.size());
  EXPECT_EQ(got, want) << t.name;
}

std::string index_text(const TempDir &dir) {
  auto b = read_file(dir.file("model.safetensors.index.json"));
  return std::string(b.begin(), b.end());
}

void expect_no_temp(const TempDir &dir) {
  for (auto &n : dir.list()) EXPECT_EQ(n.find("ckptio-tmp"), std::string::npos) << n;
}

// ------------------------------------------------------------ tests

class Ranks : public ::testing::TestWithParam<int> {};

TEST_P(Ranks, EverySplitSavesAsOneCheckpointAndLoadsWhole) {
  int n = GetParam();
  TempDir dir;
  Model m;
  auto res = save_ranks(dir.path(), n, [&](int r) { return m.parts(r, n); });
  for (int r = 0; r < n; r++) ASSERT_EQ(res[(size_t)r].rc, 0) << "rank " << r << ": " << res[(size_t)r].err;
  // Every rank holds a part of the splits, so every rank writes a file.
  EXPECT_EQ(res[0].files, (size_t)n);
  expect_no_temp(dir);
  // One rank stores every tensor whole: a plain Hugging Face index.
  EXPECT_EQ(index_text(dir).find("\"ckptio\"") != std::string::npos, n > 1);

  ckptio_ctx *ctx = make_ctx();
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(ctx, dir.path().c_str(), nullptr, &r), 0) << ckptio_last_open_error();
  EXPECT_EQ(ckptio_reader_count(r), 6u);
  for (const Tensor *t : m.all()) {
    int64_t i = ckptio_reader_find(r, t->name.c_str());
    ASSERT_GE(i, 0) << t->name;
    ckptio_tensor_info info;
    ASSERT_EQ(ckptio_reader_info(r, (size_t)i, &info), 0);
    EXPECT_EQ(info.nbytes, t->bytes.size());
    EXPECT_EQ(info.dtype, t->dtype);
    size_t parts = ckptio_reader_part_count(r, (size_t)i);
    EXPECT_EQ(parts, t == &m.rep || t == &m.only0 ? 1u : (size_t)n) << t->name;
    std::vector<uint8_t> got(t->bytes.size());
    ASSERT_EQ(ckptio_reader_load(r, (size_t)i, got.data(), got.size()), 0) << ckptio_reader_last_error(r);
    EXPECT_EQ(got, t->bytes) << t->name;
  }
  size_t unchecked = 99;
  EXPECT_EQ(ckptio_reader_verify(r, &unchecked), 0) << ckptio_reader_last_error(r);
  EXPECT_EQ(unchecked, 0u);
  // A split tensor has no single place to view.
  const void *p;
  uint64_t nb;
  if (n > 1) {
    EXPECT_EQ(ckptio_reader_view(r, (size_t)ckptio_reader_find(r, "w_col"), &p, &nb), CKPTIO_E_FORMAT);
  }
  ckptio_reader_close(r);
  ckptio_ctx_free(ctx);
}

TEST_P(Ranks, AnyBoxLoadsReadingOnlyItsBytes) {
  int n = GetParam();
  TempDir dir;
  Model m;
  auto res = save_ranks(dir.path(), n, [&](int r) { return m.parts(r, n); });
  for (int r = 0; r < n; r++) ASSERT_EQ(res[(size_t)r].rc, 0) << res[(size_t)r].err;
  ckptio_ctx *ctx = make_ctx();
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  o.load_method = CKPTIO_LOAD_PREAD;
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(ctx, dir.path().c_str(), &o, &r), 0);
  std::mt19937 rng(7 + (unsigned)n);
  for (const Tensor *t : m.all())
    for (int k = 0; k < 40; k++) {
      std::vector<int64_t> lo(t->shape.size()), hi(t->shape.size());
      for (size_t d = 0; d < lo.size(); d++) {
        int64_t a = (int64_t)(rng() % (uint64_t)(t->shape[d] + 1)), b = (int64_t)(rng() % (uint64_t)(t->shape[d] + 1));
        lo[d] = std::min(a, b), hi[d] = std::max(a, b);
      }
      expect_box(ctx, r, *t, lo, hi);
      if (on_gpu() && k % 10 == 0) expect_box(ctx, r, *t, lo, hi, CKPTIO_DEVICE_CUDA(0)); // each GPU box is slow on the fake
    }
  // Resharding: the row-split tensor loaded by columns reads exactly the
  // column's bytes of each part (PREAD).
  ckptio_box_request q = {};
  q.index = (size_t)ckptio_reader_find(r, "w_row");
  q.start[0] = 0, q.stop[0] = 10, q.start[1] = 2, q.stop[1] = 4;
  std::vector<uint8_t> got(10 * 2 * 4);
  q.dst = got.data(), q.dst_bytes = got.size();
  ASSERT_EQ(ckptio_reader_load_boxes(r, &q, 1), 0) << ckptio_reader_last_error(r);
  EXPECT_EQ(q.bytes_read, got.size());
  EXPECT_EQ(q.verified, 0);
  EXPECT_EQ(got, extract(m.row, {0, 2}, {10, 2}));
  // The whole tensor as a box: every part read whole, every CRC checked.
  q.start[1] = 0, q.stop[1] = 6;
  got.assign(m.row.bytes.size(), 0);
  q.dst = got.data(), q.dst_bytes = got.size();
  ASSERT_EQ(ckptio_reader_load_boxes(r, &q, 1), 0);
  EXPECT_EQ(q.verified, 1);
  EXPECT_EQ(got, m.row.bytes);
  // A slice of a split tensor is a box.
  std::vector<uint8_t> sl(8 * 5 * 2);
  int verified = -1;
  ASSERT_EQ(ckptio_reader_load_slice(r, (size_t)ckptio_reader_find(r, "w_col"), 1, 3, 8, sl.data(), sl.size(), &verified), 0)
      << ckptio_reader_last_error(r);
  EXPECT_EQ(sl, extract(m.col, {0, 3}, {8, 5}));
  ckptio_reader_close(r);
  ckptio_ctx_free(ctx);
}

INSTANTIATE_TEST_SUITE_P(N, Ranks, ::testing::Values(1, 2, 3, 4));

TEST(RanksWhole, ReplicasAreWrittenOnceAndBalancedAsAHuggingFaceSet) {
  TempDir dir;
  std::vector<Tensor> ts;
  for (int i = 0; i < 8; i++) ts.push_back(make_tensor("layer." + std::to_string(i), CKPTIO_F32, {64, 16}, 10 + i));
  auto res = save_ranks(dir.path(), 4, [&](int) {
    std::vector<Part> p;
    for (auto &t : ts) p.push_back({&t, {}, {}});
    return p;
  });
  for (auto &x : res) ASSERT_EQ(x.rc, 0) << x.err;
  // Eight equal replicas over four ranks: two per rank, four files.
  EXPECT_EQ(res[0].files, 4u);
  for (int k = 1; k <= 4; k++) {
    char name[64];
    snprintf(name, sizeof(name), "model-%05d-of-00004.safetensors", k);
    ckptio_ctx *ctx = make_ctx();
    ckptio_reader *r = nullptr;
    ASSERT_EQ(ckptio_reader_open(ctx, dir.file(name).c_str(), nullptr, &r), 0) << name;
    EXPECT_EQ(ckptio_reader_count(r), 2u) << name;
    ckptio_reader_close(r);
    ckptio_ctx_free(ctx);
  }
  // No split: exactly a Hugging Face index, no ckptio section.
  EXPECT_EQ(index_text(dir).find("\"ckptio\""), std::string::npos);
  ckptio_ctx *ctx = make_ctx();
  std::vector<Tensor> sorted = ts;
  expect_loads(ctx, dir.path(), sorted);
  ckptio_ctx_free(ctx);
}

TEST(RanksWhole, TheSingleCommunicatorSavesAlone) {
  TempDir dir;
  Tensor a = make_tensor("a", CKPTIO_F32, {7, 3}, 1);
  ckptio_comm c;
  ckptio_comm_single(&c);
  EXPECT_EQ(c.rank, 0);
  EXPECT_EQ(c.nranks, 1);
  ckptio_ctx *ctx = make_ctx();
  ckptio_writer *w = nullptr;
  ASSERT_EQ(ckptio_writer_open_ranks(ctx, &c, dir.path().c_str(), "model", nullptr, &w), 0);
  ckptio_tensor d = host_desc(a);
  // One rank may not hold half a tensor: the other half would be a hole.
  int64_t off[2] = {0, 0};
  d.shape[0] = 3;
  ASSERT_EQ(ckptio_writer_add_part(w, &d, a.shape.data(), off), 0);
  EXPECT_EQ(ckptio_writer_commit(w), CKPTIO_E_RANK);
  EXPECT_NE(std::string(ckptio_writer_last_error(w)).find("hole"), std::string::npos) << ckptio_writer_last_error(w);
  ckptio_writer_close(w);
  EXPECT_TRUE(dir.list().empty());
  ASSERT_EQ(ckptio_writer_open_ranks(ctx, &c, dir.path().c_str(), "model", nullptr, &w), 0);
  d = host_desc(a);
  ASSERT_EQ(ckptio_writer_add_part(w, &d, a.shape.data(), off), 0);
  ASSERT_EQ(ckptio_writer_commit(w), 0) << ckptio_writer_last_error(w);
  ckptio_writer_close(w);
  expect_loads(ctx, dir.path(), {a});
  ckptio_ctx_free(ctx);
}

// Issue 28: after ckptio_writer_abort a writer may only be closed. On a
// multi-rank writer commit already failed (its message said "commit called
// twice"); now every verb says the save was aborted, and nothing is written.
TEST(RanksWhole, AnAbortedWriterCommitsNothing) {
  TempDir dir;
  Tensor a = make_tensor("a", CKPTIO_F32, {7, 3}, 1);
  ckptio_comm c;
  ckptio_comm_single(&c);
  ckptio_ctx *ctx = make_ctx();
  ckptio_writer *w = nullptr;
  ASSERT_EQ(ckptio_writer_open_ranks(ctx, &c, dir.path().c_str(), "model", nullptr, &w), 0);
  ckptio_tensor d = host_desc(a);
  ASSERT_EQ(ckptio_writer_add(w, &d), 0);
  EXPECT_EQ(ckptio_writer_abort(w, -EIO, "the caller gave up"), -EIO);
  EXPECT_EQ(ckptio_writer_commit(w), CKPTIO_E_STATE);
  EXPECT_NE(std::string(ckptio_writer_last_error(w)).find("aborted"), std::string::npos) << ckptio_writer_last_error(w);
  EXPECT_EQ(ckptio_writer_commit_async(w), CKPTIO_E_STATE);
  EXPECT_EQ(ckptio_writer_add(w, &d), CKPTIO_E_STATE);
  EXPECT_EQ(ckptio_writer_abort(w, -EIO, "again"), CKPTIO_E_STATE);
  ckptio_writer_close(w);
  EXPECT_TRUE(dir.list().empty());
  ckptio_ctx_free(ctx);
}

TEST(RanksWhole, PlainWritersTakeOnlyWholeBoxes) {
  TempDir dir;
  Tensor a = make_tensor("a", CKPTIO_F32, {4, 4}, 1);
  ckptio_ctx *ctx = make_ctx();
  ckptio_writer *w = nullptr;
  ASSERT_EQ(ckptio_writer_open(ctx, dir.file("x.safetensors").c_str(), CKPTIO_FORMAT_SAFETENSORS, nullptr, &w), 0);
  ckptio_tensor d = host_desc(a);
  int64_t off[2] = {2, 0}, zero[2] = {0, 0};
  d.shape[0] = 2;
  EXPECT_EQ(ckptio_writer_add_part(w, &d, a.shape.data(), off), CKPTIO_E_INVALID_ARG);
  EXPECT_NE(std::string(ckptio_writer_last_error(w)).find("multi-rank"), std::string::npos);
  d = host_desc(a);
  EXPECT_EQ(ckptio_writer_add_part(w, &d, a.shape.data(), zero), 0);
  ASSERT_EQ(ckptio_writer_commit(w), 0);
  ckptio_writer_close(w);
  // Any checkpoint takes boxes: a plain file's tensor is one part.
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(ctx, dir.file("x.safetensors").c_str(), nullptr, &r), 0);
  EXPECT_EQ(ckptio_reader_part_count(r, 0), 1u);
  expect_box(ctx, r, a, {1, 1}, {3, 4});
  expect_box(ctx, r, a, {0, 0}, {4, 4});
  expect_box(ctx, r, a, {2, 0}, {2, 4});
  ckptio_reader_close(r);
  ckptio_ctx_free(ctx);
}

// ------------------------------------------------------------ failures

// A good first save of the model at 2 ranks, to be kept by failed saves.
void first_save(const TempDir &dir, const Model &m) {
  auto res = save_ranks(dir.path(), 2, [&](int r) { return m.parts(r, 2); });
  for (auto &x : res) ASSERT_EQ(x.rc, 0) << x.err;
}

void expect_first_save(const TempDir &dir, const Model &m) {
  ckptio_ctx *ctx = make_ctx();
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(ctx, dir.path().c_str(), nullptr, &r), 0) << ckptio_last_open_error();
  EXPECT_EQ(ckptio_reader_verify(r, nullptr), 0) << ckptio_reader_last_error(r);
  for (const Tensor *t : m.all()) {
    std::vector<uint8_t> got(t->bytes.size());
    ASSERT_EQ(ckptio_reader_load(r, (size_t)ckptio_reader_find(r, t->name.c_str()), got.data(), got.size()), 0);
    EXPECT_EQ(got, t->bytes) << t->name;
  }
  ckptio_reader_close(r);
  ckptio_ctx_free(ctx);
}

TEST(RanksFail, DisagreeingShapesOverlapsAndHolesFailEveryRank) {
  Model m;
  Tensor other = make_tensor("w_row", CKPTIO_F32, {11, 6}, 1);
  struct Case {
    const char *what;
    std::function<std::vector<Part>(int)> parts;
  } cases[] = {
      {"as F32 [10, 6], rank 1 as F32 [11, 6]",
       [&](int r) { return std::vector<Part>{{r ? &other : &m.row, {r * 5, 0}, {5, 6}}}; }},
      {"overlaps", [&](int r) { return std::vector<Part>{{&m.row, {r * 4, 0}, {6, 6}}}; }},
      {"hole", [&](int r) { return std::vector<Part>{{&m.row, {r * 6, 0}, {4, 6}}}; }},
  };
  for (auto &c : cases) {
    TempDir dir;
    first_save(dir, m);
    auto before = dir.list();
    auto res = save_ranks(dir.path(), 2, c.parts);
    for (auto &x : res) {
      EXPECT_EQ(x.rc, CKPTIO_E_RANK) << c.what;
      EXPECT_NE(x.err.find("w_row"), std::string::npos) << x.err;
      EXPECT_NE(x.err.find(c.what), std::string::npos) << x.err;
    }
    EXPECT_EQ(dir.list(), before);
    expect_first_save(dir, m);
  }
}

TEST(RanksFail, AFailingRankFailsEveryRankAndKeepsThePreviousCheckpoint) {
  Model m2;
  for (auto *t : {&m2.row, &m2.col, &m2.cube, &m2.mesh, &m2.rep, &m2.only0})
    for (auto &b : t->bytes) b ^= 0x5a;  // the second save's values differ
  for (ckptio_fault_op op : {CKPTIO_FAULT_PWRITE, CKPTIO_FAULT_FSYNC, CKPTIO_FAULT_RENAME})
    for (long nth = 1; nth <= 4; nth++) {
      TempDir dir;
      Model m;
      first_save(dir, m);
      auto before = dir.list();
      ckptio_fault_arm(op, nth, ENOSPC);
      auto res = save_ranks(dir.path(), 2, [&](int r) { return m2.parts(r, 2); });
      ckptio_fault_clear();
      int failed = 0, told = 0;
      for (auto &x : res) {
        if (x.rc == -ENOSPC) failed++;
        if (x.rc == CKPTIO_E_RANK) {
          told++;
          EXPECT_NE(x.err.find("rank"), std::string::npos) << x.err;
          EXPECT_NE(x.err.find("failed"), std::string::npos) << x.err;
        }
      }
      if (failed == 0) {  // the fault came after the last call of its kind: a good save
        for (auto &x : res) EXPECT_EQ(x.rc, 0) << x.err;
        continue;
      }
      EXPECT_EQ(failed + told, 2) << "op " << op << " nth " << nth;
      EXPECT_EQ(dir.list(), before) << "op " << op << " nth " << nth;
      expect_first_save(dir, m);
    }
}

TEST(RanksFail, ARankThatCannotTakePartAbortsAndEveryRankFails) {
  TempDir dir;
  Model m;
  first_save(dir, m);
  auto before = dir.list();
  auto res = save_ranks(dir.path(), 3, [&](int r) { return m.parts(r, 3); }, 1);
  EXPECT_EQ(res[1].rc, -EIO);
  EXPECT_NE(res[1].err.find("rank 1"), std::string::npos) << res[1].err;
  for (int r : {0, 2}) {
    EXPECT_EQ(res[(size_t)r].rc, CKPTIO_E_RANK);
    EXPECT_NE(res[(size_t)r].err.find("rank 1 failed before the save began: its tensors could not be prepared"),
              std::string::npos)
        << res[(size_t)r].err;
  }
  EXPECT_EQ(dir.list(), before);
  expect_first_save(dir, m);
}

TEST(RanksFail, AKilledSavesTempFilesAreRemovedByTheNext) {
  TempDir dir;
  Model m;
  first_save(dir, m);
  // What a save killed before its commit leaves: hidden temp files.
  write_file(dir.file(".model-00001-of-00002.safetensors.ckptio-tmp-1-2-3"), "x");
  write_file(dir.file(".model.safetensors.index.json.ckptio-tmp-1-2-3"), "x");
  write_file(dir.file(".other.ckptio-tmp-1-2-3"), "kept: not this checkpoint's");
  first_save(dir, m);
  auto names = dir.list();
  EXPECT_EQ(std::count_if(names.begin(), names.end(), [](const std::string &n) { return n.find("ckptio-tmp") != std::string::npos; }), 1);
  expect_first_save(dir, m);
}

// ------------------------------------------------------------ the index as untrusted input

// A checkpoint saved by 2 ranks, its index then replaced: every lie is
// refused at open with CKPTIO_E_SHARD naming what is wrong.
class RanksIndex : public ::testing::Test {
 protected:
  void SetUp() override {
    auto res = save_ranks(dir.path(), 2, [&](int r) { return m.parts(r, 2); });
    for (auto &x : res) ASSERT_EQ(x.rc, 0) << x.err;
    good = index_text(dir);
  }
  // Opens with the index text replaced (first occurrence of from -> to).
  std::string open_with(const std::string &from, const std::string &to, int *rc) {
    std::string text = good;
    size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) text.replace(at, from.size(), to);
    write_file(dir.file("model.safetensors.index.json"), text);
    ckptio_ctx *ctx = make_ctx();
    ckptio_reader *r = nullptr;
    *rc = ckptio_reader_open(ctx, dir.path().c_str(), nullptr, &r);
    std::string msg = *rc < 0 ? ckptio_last_open_error() : "";
    ckptio_reader_close(r);
    ckptio_ctx_free(ctx);
    return msg;
  }
  TempDir dir;
  Model m;
  std::string good;
};

TEST_F(RanksIndex, TheSavedIndexLooksAsDocumented) {
  // docs/FORMATS.md: the Hugging Face keys, then the section, parts sorted.
  EXPECT_LT(good.find("\"metadata\""), good.find("\"weight_map\""));
  EXPECT_LT(good.find("\"weight_map\""), good.find("\"ckptio\""));
  EXPECT_NE(good.find("\"version\": 1"), std::string::npos);
  EXPECT_NE(good.find("{\"file\": \"model-00001-of-00002.safetensors\", \"offsets\": [0, 0], \"shape\": [5, 6]}"),
            std::string::npos)
      << good;
  EXPECT_NE(good.find("\"rep\": \"model-0000"), std::string::npos);  // whole: in weight_map
  EXPECT_EQ(good.back(), '\n');
}

TEST_F(RanksIndex, LiesAreRefusedNamingTheRule) {
  struct Case {
    std::string from, to, says;
  } cases[] = {
      {"\"offsets\": [5, 0]", "\"offsets\": [4, 0]", "overlaps"},
      {"\"offsets\": [5, 0], \"shape\": [5, 6]", "\"offsets\": [6, 0], \"shape\": [4, 6]", "hole"},
      {"\"offsets\": [5, 0], \"shape\": [5, 6]", "\"offsets\": [5, 0], \"shape\": [6, 6]", "outside"},
      {"\"dtype\": \"F32\"", "\"dtype\": \"F99\"", "unknown dtype"},
      {"\"dtype\": \"F32\"", "\"dtype\": \"F16\"", "is F32"},                 // the file says otherwise
      {"\"offsets\": [0, 0], \"shape\": [5, 6]", "\"offsets\": [0, 0], \"shape\": [5, 6, 1]", "sizes for a tensor"},
      {"\"file\": \"model-00001-of-00002.safetensors\"", "\"file\": \"../model-00001-of-00002.safetensors\"", "contains"},
      {"\"file\": \"model-00001-of-00002.safetensors\"", "\"file\": \"missing.safetensors\"", "missing.safetensors"},
      {"\"version\": 1", "\"version\": 2", "version 2"},
      {"\"version\": 1", "\"version\": 1, \"extra\": 0", "unknown or repeated key 'extra'"},
      {"\"shape\": [10, 6]", "\"shape\": [10, 6, 1, 1, 1, 1, 1, 1, 1]", "more than 8 dims"},
      {"\"shape\": [10, 6]", "\"shape\": [-10, 6]", "not an integer"},
      {"\"shape\": [10, 6]", "\"shape\": [9223372036854775807, 6]", "overflow"},
      {"\"weight_map\": {", "\"weight_map\": {\n    \"w_row\": \"model-00001-of-00002.safetensors\",", "both in weight_map"},
      {"\"tensors\": {", "\"tensors\": {\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"parts\": []},", "no parts"},
  };
  for (auto &c : cases) {
    int rc = 0;
    std::string msg = open_with(c.from, c.to, &rc);
    // A missing file is the filesystem's answer, as for any set.
    EXPECT_EQ(rc, c.says == "missing.safetensors" ? -ENOENT : CKPTIO_E_SHARD) << c.from << " -> " << c.to << ": " << msg;
    EXPECT_NE(msg.find(c.says), std::string::npos) << c.to << ": " << msg;
  }
}

TEST_F(RanksIndex, AFileOfAnotherSaveIsRefusedByTheSaveId) {
  // Rank 1's file from a later save of other values, put in place without
  // the index (a crash between the swaps).
  TempDir other;
  Model m2;
  for (auto &b : m2.rep.bytes) b ^= 1;
  auto res = save_ranks(other.path(), 2, [&](int r) { return m2.parts(r, 2); });
  for (auto &x : res) ASSERT_EQ(x.rc, 0);
  write_file(dir.file("model-00002-of-00002.safetensors"), read_file(other.file("model-00002-of-00002.safetensors")));
  ckptio_ctx *ctx = make_ctx();
  ckptio_reader *r = nullptr;
  EXPECT_EQ(ckptio_reader_open(ctx, dir.path().c_str(), nullptr, &r), CKPTIO_E_SHARD);
  EXPECT_NE(std::string(ckptio_last_open_error()).find("model-00002-of-00002.safetensors"), std::string::npos);
  EXPECT_NE(std::string(ckptio_last_open_error()).find("another save"), std::string::npos);
  ckptio_ctx_free(ctx);
}

TEST_F(RanksIndex, AKillBetweenTheSwapsStillReadsTheOldCheckpoint) {
  // What a save killed after swapping rank 1's file in, before the index,
  // leaves: the new file under the name, the old one in the hidden temp
  // file it was exchanged into. The reader finds the old one by its save id.
  TempDir other;
  Model m2;
  for (auto &b : m2.row.bytes) b ^= 1;
  auto res = save_ranks(other.path(), 2, [&](int r) { return m2.parts(r, 2); });
  for (auto &x : res) ASSERT_EQ(x.rc, 0);
  const std::string name = "model-00002-of-00002.safetensors";
  ASSERT_EQ(rename(dir.file(name).c_str(), dir.file("." + name + ".ckptio-tmp-9-9-9").c_str()), 0);
  write_file(dir.file(name), read_file(other.file(name)));
  expect_first_save(dir, m);
  // And a temp file of another save (or damaged) stands in for nothing.
  write_file(dir.file("." + name + ".ckptio-tmp-9-9-9"), read_file(other.file(name)));
  ckptio_ctx *ctx = make_ctx();
  ckptio_reader *r = nullptr;
  EXPECT_EQ(ckptio_reader_open(ctx, dir.path().c_str(), nullptr, &r), CKPTIO_E_SHARD);
  EXPECT_NE(std::string(ckptio_last_open_error()).find("another save"), std::string::npos);
  ckptio_ctx_free(ctx);
}

TEST_F(RanksIndex, ThousandsOfMutationsNeverCrash) {
  // Random byte edits of the section: each open fails cleanly or opens a
  // checkpoint that loads (the parser's bounds under ASan).
  size_t sec = good.find("\"ckptio\"");
  ASSERT_NE(sec, std::string::npos);
  std::mt19937 rng(11);
  const char alphabet[] = "0123456789[]{},:\" -abcfhilnoprstuvxFS";
  int opened = 0;
  ckptio_ctx *ctx = make_ctx();  // one for every open: a context per open cost 10 ms of thread starts
  for (int k = 0; k < 1500; k++) {
    std::string text = good;
    int edits = 1 + (int)(rng() % 3);
    for (int e = 0; e < edits; e++) {
      size_t at = sec + rng() % (text.size() - sec);
      text[at] = alphabet[rng() % (sizeof(alphabet) - 1)];
    }
    write_file(dir.file("model.safetensors.index.json"), text);
    ckptio_reader *r = nullptr;
    int rc = ckptio_reader_open(ctx, dir.path().c_str(), nullptr, &r);
    if (rc == 0) {
      opened++;
      for (size_t i = 0; i < ckptio_reader_count(r); i++) {
        ckptio_tensor_info info;
        ASSERT_EQ(ckptio_reader_info(r, i, &info), 0);
        std::vector<uint8_t> buf(info.nbytes);
        ckptio_reader_load(r, i, buf.data(), buf.size());
      }
      ckptio_reader_close(r);
    } else {
      EXPECT_TRUE(rc == CKPTIO_E_SHARD || rc == -ENOENT || rc == -ENOTDIR || rc == CKPTIO_E_HEADER_JSON) << rc;
    }
  }
  ckptio_ctx_free(ctx);
  EXPECT_GT(opened, 0);  // some edits (whitespace, equal digits) keep it valid
}

// ------------------------------------------------------------ exact cover, the arithmetic

ckptio_box_result cover(std::vector<int64_t> shape, std::vector<std::vector<int64_t>> offs,
                        std::vector<std::vector<int64_t>> sizes, size_t *a = nullptr, size_t *b = nullptr) {
  std::vector<std::array<int64_t, CKPTIO_MAX_DIMS>> o(offs.size()), s(offs.size());
  for (size_t i = 0; i < offs.size(); i++)
    for (size_t d = 0; d < shape.size(); d++) o[i][d] = offs[i][d], s[i][d] = sizes[i][d];
  return ckptio_box_cover_check((int)shape.size(), shape.data(), (const int64_t(*)[CKPTIO_MAX_DIMS])o.data(),
                                (const int64_t(*)[CKPTIO_MAX_DIMS])s.data(), offs.size(), a, b);
}

TEST(RanksBoxes, CoverIsExactInsideAndWithoutOverlap) {
  EXPECT_EQ(cover({4, 4}, {{0, 0}, {2, 0}}, {{2, 4}, {2, 4}}), CKPTIO_BOX_OK);
  EXPECT_EQ(cover({4, 4}, {{0, 0}, {0, 2}, {2, 0}, {2, 2}}, {{2, 2}, {2, 2}, {2, 2}, {2, 2}}), CKPTIO_BOX_OK);
  EXPECT_EQ(cover({4, 4}, {{0, 0}, {2, 0}}, {{2, 4}, {1, 4}}), CKPTIO_BOX_HOLE);
  size_t a = 9, b = 9;
  EXPECT_EQ(cover({4, 4}, {{0, 0}, {1, 0}}, {{2, 4}, {3, 4}}, &a, &b), CKPTIO_BOX_OVERLAP);
  EXPECT_EQ(a, 0u);
  EXPECT_EQ(b, 1u);
  EXPECT_EQ(cover({4, 4}, {{0, 0}, {0, 0}}, {{4, 4}, {4, 4}}), CKPTIO_BOX_OVERLAP);  // identical
  EXPECT_EQ(cover({4, 4}, {{0, 0}, {3, 0}}, {{3, 4}, {2, 4}}, &a), CKPTIO_BOX_OUTSIDE);
  EXPECT_EQ(a, 1u);
  EXPECT_EQ(cover({4}, {{INT64_MAX - 1}}, {{4}}), CKPTIO_BOX_OUTSIDE);  // no overflow
  EXPECT_EQ(cover({4}, {{-1}}, {{5}}), CKPTIO_BOX_OUTSIDE);
  EXPECT_EQ(cover({0, 4}, {{0, 0}}, {{0, 4}}), CKPTIO_BOX_OK);        // nothing to cover
  EXPECT_EQ(cover({}, {{}}, {{}}), CKPTIO_BOX_OK);                    // a scalar, once
  EXPECT_EQ(cover({}, {{}, {}}, {{}, {}}), CKPTIO_BOX_OVERLAP);
  // 3-D, and boxes that are not a grid (an L of three bricks).
  EXPECT_EQ(cover({2, 2, 4}, {{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {1, 1, 0}}, {{1, 1, 4}, {1, 1, 4}, {1, 1, 4}, {1, 1, 4}}),
            CKPTIO_BOX_OK);
  EXPECT_EQ(cover({4, 4}, {{0, 0}, {0, 3}, {3, 0}}, {{3, 3}, {4, 1}, {1, 3}}), CKPTIO_BOX_OK);
}

TEST(RanksBoxes, ManyPartsOffTheGridStayBounded) {
  // 3000 diagonal-staggered column strips: the grid would have millions of
  // cells, so the pairwise path decides (and finds the hole) within budget.
  std::vector<std::vector<int64_t>> offs, sizes;
  for (int64_t i = 0; i < 3000; i++) offs.push_back({i, i}), sizes.push_back({1, 3000 - i});
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(cover({3000, 3000}, offs, sizes), CKPTIO_BOX_HOLE);
  double pairwise = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // 65536 rows of one element each: a grid, linear.
  offs.clear(), sizes.clear();
  for (int64_t i = 0; i < 65536; i++) offs.push_back({i, 0}), sizes.push_back({1, 7});
  t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(cover({65536, 7}, offs, sizes), CKPTIO_BOX_OK);
  double grid = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // A budget measured in the same run, not in seconds: the pairwise
  // decision over 3000 parts (1 ms here) within twice the linear grid's
  // over 65536 (90 ms here).
  EXPECT_LT(pairwise, 2 * grid) << "pairwise " << pairwise << " s, grid " << grid << " s";
}

}  // namespace
