// Group loads in one process: N threads play N ranks over the in-process
// communicator, each with its own context and reader, as N processes would.
// Every rank gets exactly its boxes' bytes (whole tensors, row and column
// slices, replicas, any mix, on the host or a GPU), the group reads each
// needed stored byte once (the ranks' bytes_read sum to the union's parts),
// over every kind of source; and every failure (a bad box, a missing
// tensor, another checkpoint, a damaged byte, a 1.0 communicator) fails
// every rank with a message naming the rank and the cause.
// (tests/dist runs the same call over real MPI processes.)
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <functional>
#include <thread>

#include <sys/stat.h>

#include <filesystem>

#define CKPTIO_EXPERIMENTAL
#include "ckpt_fixture.h"
#include "thread_comm.h"
extern "C" {
#include "io/fault.h"
}

using namespace ckptio_test;

namespace {

size_t elem_size(ckptio_dtype dt) { return (size_t)ckptio_dtype_bits(dt) / 8; }

// A box one rank asks for: tensor `t` (by position in the model), [start, stop).
struct Want {
  size_t t;
  std::vector<int64_t> start, stop;
};

Want whole(const std::vector<Tensor> &m, size_t t) {
  return Want{t, std::vector<int64_t>(m[t].shape.size(), 0), m[t].shape};
}

// Rows or columns [k * n / parts, (k + 1) * n / parts) of a 2-D tensor.
Want split(const std::vector<Tensor> &m, size_t t, int dim, int k, int parts) {
  Want w = whole(m, t);
  int64_t n = m[t].shape[(size_t)dim];
  w.start[(size_t)dim] = k * n / parts;
  w.stop[(size_t)dim] = (k + 1) * n / parts;
  return w;
}

struct RankOut {
  int rc = 0;
  std::string err;
  std::vector<std::vector<uint8_t>> got;  // each box's bytes
  std::vector<int> verified;
  uint64_t read = 0;         // the boxes' bytes_read
  uint64_t stats_bytes = 0;  // ckptio_reader_stats: what landed in this rank's boxes
  uint32_t methods = 0;      // ckptio_reader_stats: how it was read
};

// Every rank opens `path` (rank r opens paths[r] when given) and loads its
// boxes as one group.
std::vector<RankOut> group_load(const std::string &path, int n, const std::vector<Tensor> &model,
                                const std::function<std::vector<Want>(int)> &wants_of, uint64_t staging = 1 << 20,
                                const std::vector<std::string> &paths = {}, size_t comm_size = sizeof(ckptio_comm),
                                unsigned flags = CKPTIO_GROUP_EXCHANGE) {
  Group g(n);
  std::vector<RankOut> out((size_t)n);
  std::vector<std::thread> th;
  for (int r = 0; r < n; r++)
    th.emplace_back([&, r] {
      Member m{&g, r};
      ckptio_comm comm = group_comm(&m);
      comm.size = comm_size;
      RankOut &res = out[(size_t)r];
      ckptio_options o = small_options();
      ckptio_ctx *ctx = nullptr;
      ckptio_reader *rd = nullptr;
      // Every rank reaches the collective: a rank whose open failed would
      // leave the others waiting, which is the caller's to avoid.
      EXPECT_EQ(ckptio_ctx_create(&o, &ctx), 0);
      const std::string &p = paths.empty() ? path : paths[(size_t)r];
      EXPECT_EQ(ckptio_reader_open(ctx, p.c_str(), nullptr, &rd), 0) << ckptio_last_open_error();
      std::vector<Want> wants = wants_of(r);
      std::vector<ckptio_box_request> q(wants.size());
      std::vector<void *> dev(wants.size(), nullptr);
      res.got.resize(wants.size());
      for (size_t i = 0; i < wants.size(); i++) {
        const Want &w = wants[i];
        int64_t index = ckptio_reader_find(rd, model[w.t].name.c_str());
        EXPECT_GE(index, 0) << model[w.t].name;
        q[i].index = (size_t)index;
        size_t bytes = elem_size(model[w.t].dtype);
        for (size_t d = 0; d < w.start.size(); d++) {
          q[i].start[d] = w.start[d], q[i].stop[d] = w.stop[d];
          bytes *= (size_t)(w.stop[d] - w.start[d]);
        }
        res.got[i].assign(bytes, 0xEE);
        q[i].dst = res.got[i].data();
        q[i].dst_bytes = bytes;
        q[i].device = CKPTIO_DEVICE_HOST;
        if (on_gpu() && bytes) {
          q[i].device = CKPTIO_DEVICE_CUDA(r % gpu_count());
          EXPECT_EQ(ckptio_device_alloc(ctx, q[i].device, bytes, &dev[i]), 0);
          q[i].dst = dev[i];
        }
      }
      res.rc = ckptio_reader_load_boxes_group(rd, &comm, q.data(), q.size(), staging, flags);
      res.err = ckptio_reader_last_error(rd);
      for (size_t i = 0; i < q.size(); i++) {
        if (dev[i]) {
          from_gpu(res.got[i].data(), dev[i], res.got[i].size());
          ckptio_device_free(ctx, q[i].device, dev[i]);
        }
        res.verified.push_back(q[i].verified);
        res.read += q[i].bytes_read;
      }
      ckptio_stats st = CKPTIO_STATS_INIT;
      EXPECT_EQ(ckptio_reader_stats(rd, &st), 0);
      res.stats_bytes = st.bytes;
      res.methods = st.load_methods;
      ckptio_reader_close(rd);
      ckptio_ctx_free(ctx);
    });
  for (auto &t : th) t.join();
  return out;
}

// Every rank's boxes hold the model's bytes.
void expect_boxes(const std::vector<RankOut> &out, const std::vector<Tensor> &model,
                  const std::function<std::vector<Want>(int)> &wants_of) {
  for (size_t r = 0; r < out.size(); r++) {
    ASSERT_EQ(out[r].rc, 0) << "rank " << r << ": " << out[r].err;
    std::vector<Want> wants = wants_of((int)r);
    for (size_t i = 0; i < wants.size(); i++) {
      const Want &w = wants[i];
      std::vector<int64_t> size(w.start.size());
      for (size_t d = 0; d < size.size(); d++) size[d] = w.stop[d] - w.start[d];
      EXPECT_TRUE(out[r].got[i] == extract(model[w.t], w.start, size))
          << "rank " << r << " box " << i << " of " << model[w.t].name;
    }
  }
}

uint64_t total_read(const std::vector<RankOut> &out) {
  uint64_t s = 0;
  for (auto &o : out) s += o.read;
  return s;
}

uint64_t model_bytes(const std::vector<Tensor> &m) {
  uint64_t s = 0;
  for (auto &t : m) s += t.bytes.size();
  return s;
}

// A model of embeddings, projections, norms and a scalar, some tensors
// larger than a round so they are read in several chunks.
std::vector<Tensor> model() {
  return {make_tensor("embed", CKPTIO_BF16, {1000, 96}, 1),
          make_tensor("layers.0.qkv", CKPTIO_F32, {96, 288}, 2),
          make_tensor("layers.0.out", CKPTIO_F32, {96, 96}, 3),
          make_tensor("layers.0.norm", CKPTIO_F32, {96}, 4),
          make_tensor("layers.1.mlp", CKPTIO_F16, {384, 96, 3}, 5),
          make_tensor("step", CKPTIO_I64, {}, 6),
          make_tensor("empty", CKPTIO_F32, {0, 4}, 7)};
}

std::vector<Want> everything(const std::vector<Tensor> &m) {
  std::vector<Want> w;
  for (size_t t = 0; t < m.size(); t++) w.push_back(whole(m, t));
  return w;
}

// Every test: a model saved by ckptio at `path`.
class GroupLoad : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(save(c.ctx, path, m), 0); }
  TempDir dir;
  TestContext c;
  std::vector<Tensor> m = model();
  std::string path = dir.file("m.safetensors");
};

// ------------------------------------------------------------ what lands

TEST_F(GroupLoad, EveryRankGetsTheWholeModelAndEachByteIsReadOnce) {
  for (int n = 1; n <= 4; n++) {
    auto wants = [&](int) { return everything(m); };
    auto out = group_load(path, n, m, wants);
    expect_boxes(out, m, wants);
    EXPECT_EQ(total_read(out), model_bytes(m)) << n << " ranks";
    for (auto &o : out)
      for (int v : o.verified) EXPECT_EQ(v, 1);
    if (n > 1) {
      int readers = 0;
      for (auto &o : out) readers += o.read > 0;
      EXPECT_EQ(readers, n) << "every rank reads a share";
    }
  }
}

TEST_F(GroupLoad, RanksSharingAPageCacheEachReadThroughIt) {
  // Threads of one process: one machine, one file. Without
  // CKPTIO_GROUP_EXCHANGE each rank loads its boxes through the page cache.
  auto wants = [&](int r) {
    std::vector<Want> w = everything(m);
    w.push_back(split(m, 1, 1, r, 3));
    return w;
  };
  auto out = group_load(path, 3, m, wants, 1 << 20, {}, sizeof(ckptio_comm), 0);
  expect_boxes(out, m, wants);
  for (auto &o : out) {
    EXPECT_EQ(o.methods, 1u << CKPTIO_LOAD_PREAD);
    // Each rank read its own boxes, and the whole of qkv to check the CRC
    // of the part its slice cuts.
    EXPECT_EQ(o.read, model_bytes(m) + o.got.back().size() + m[1].bytes.size());
    for (int v : o.verified) EXPECT_EQ(v, 1);
  }
  // A damaged byte: every rank reads it, every rank fails on its own.
  std::vector<uint8_t> bytes = read_file(path);
  bytes[bytes.size() - 100] ^= 1;
  write_file(path, bytes);
  out = group_load(path, 3, m, wants, 1 << 20, {}, sizeof(ckptio_comm), 0);
  for (auto &o : out) EXPECT_EQ(o.rc, CKPTIO_E_CHECKSUM) << o.err;
}

void expect_all_fail(const std::vector<RankOut> &out, int culprit, int code, const std::string &cause) {
  for (size_t r = 0; r < out.size(); r++) {
    if ((int)r == culprit) {
      EXPECT_EQ(out[r].rc, code) << out[r].err;
    } else {
      EXPECT_EQ(out[r].rc, CKPTIO_E_RANK) << "rank " << r << ": " << out[r].err;
      if (culprit >= 0) {
        EXPECT_NE(out[r].err.find("rank " + std::to_string(culprit)), std::string::npos) << out[r].err;
      }
    }
    EXPECT_NE(out[r].err.find(cause), std::string::npos) << "rank " << r << ": " << out[r].err;
    for (int v : out[r].verified) EXPECT_EQ(v, 0);
  }
}

// Each rank opens its own copy of the file: one machine, no shared page
// cache, so the ranks share windows of memory (no CKPTIO_GROUP_EXCHANGE).
std::vector<std::string> copies(const TempDir &dir, const std::string &path, int n) {
  std::vector<std::string> out;
  for (int r = 0; r < n; r++) {
    out.push_back(dir.file("copy" + std::to_string(r) + ".safetensors"));
    write_file(out.back(), read_file(path));
  }
  return out;
}

// /dev/shm entries of the library's windows.
int windows_left() {
  int n = 0;
  for (const auto &e : std::filesystem::directory_iterator("/dev/shm"))
    n += e.path().filename().string().rfind("ckptio-group-", 0) == 0;
  return n;
}

TEST_F(GroupLoad, RanksOfOneMachineShareWindowsOfMemory) {
  auto paths = copies(dir, path, 3);
  auto wants = [&](int r) {
    std::vector<Want> w = everything(m);
    w.push_back(split(m, 1, 1, r, 3));
    w.push_back(split(m, 4, 0, r, 3));
    return w;
  };
  auto out = group_load("", 3, m, wants, 256 << 10, paths, sizeof(ckptio_comm), 0);
  expect_boxes(out, m, wants);
  EXPECT_EQ(total_read(out), model_bytes(m)) << "each part read once, by one rank";
  for (auto &o : out)
    for (int v : o.verified) EXPECT_EQ(v, 1);
  EXPECT_EQ(windows_left(), 0) << "the shared memory object is unlinked";
}

TEST_F(GroupLoad, ADamagedByteInAWindowFailsEveryRankNamingTheReader) {
  auto paths = copies(dir, path, 3);
  for (auto &p : paths) {
    std::vector<uint8_t> bytes = read_file(p);
    bytes[bytes.size() - 1000] ^= 0x20;  // in the last tensor of the file: the last rank's span
    write_file(p, bytes);
  }
  auto out = group_load("", 3, m, [&](int) { return everything(m); }, 256 << 10, paths, sizeof(ckptio_comm), 0);
  expect_all_fail(out, 2, CKPTIO_E_CHECKSUM, "checksum mismatch");
  EXPECT_EQ(windows_left(), 0);
}

TEST_F(GroupLoad, WithoutSharedMemoryTheRanksExchangeInstead) {
  auto paths = copies(dir, path, 3);
  ckptio_fault_arm(CKPTIO_FAULT_FALLOCATE, 1, ENOSPC);  // rank 0's /dev/shm is full
  auto out = group_load("", 3, m, [&](int) { return everything(m); }, 256 << 10, paths, sizeof(ckptio_comm), 0);
  ckptio_fault_clear();
  expect_boxes(out, m, [&](int) { return everything(m); });
  EXPECT_EQ(total_read(out), model_bytes(m));
  EXPECT_EQ(windows_left(), 0);
}

TEST_F(GroupLoad, TensorParallelSlicesAndReplicasLandExactly) {
  const int n = 3;
  // Column-parallel qkv, row-parallel out and mlp, a vocabulary split of
  // the embedding, replicated norm and step, and on rank 1 a corner box.
  auto wants = [&](int r) {
    std::vector<Want> w = {split(m, 1, 1, r, n), split(m, 2, 0, r, n), split(m, 4, 0, r, n), split(m, 0, 0, r, n),
                           whole(m, 3), whole(m, 5)};
    if (r == 1) w.push_back(Want{4, {10, 20, 1}, {30, 50, 3}});
    return w;
  };
  auto out = group_load(path, n, m, wants, 256 << 10);
  expect_boxes(out, m, wants);
  // The union is every tensor but "empty": each stored part read once.
  EXPECT_EQ(total_read(out), model_bytes(m));
}

TEST_F(GroupLoad, RanksWithNothingToLoadStillServeTheirShare) {
  // Rank 2 asks for everything, rank 1 for nothing, ranks 0 and 3 for the
  // scalar (whose bytes_read then carries what they read for rank 2).
  auto wants = [&](int r) {
    if (r == 2) return everything(m);
    return r == 1 ? std::vector<Want>{} : std::vector<Want>{whole(m, 5)};
  };
  auto out = group_load(path, 4, m, wants);
  expect_boxes(out, m, wants);
  // (Rank 1 reads its share too, but has no box to report it in.)
  EXPECT_LT(total_read(out), model_bytes(m));
  EXPECT_GT(out[0].read, 0u) << "rank 0 wants 8 bytes but reads its share for rank 2";
  EXPECT_GT(out[3].read, 0u);
  // The reader's stats count what landed in each rank's boxes.
  EXPECT_EQ(out[2].stats_bytes, model_bytes(m));
  EXPECT_EQ(out[1].stats_bytes, 0u);
  EXPECT_EQ(out[0].stats_bytes, 8u);
}

TEST_F(GroupLoad, EverySourceKind) {
  m.pop_back();  // .pt and zstd take the same model without the empty tensor
  std::string err;
  std::string pt = dir.file("m.pt"), zst = dir.file("m.safetensors.zst"), set = dir.file("set");
  ASSERT_EQ(save_format(c.ctx, pt, m, CKPTIO_FORMAT_PYTORCH, nullptr, &err), 0) << err;
  ckptio_options z = small_options();
  z.compress_level = 3;
  ASSERT_EQ(save(c.ctx, zst, m, &z, &err), 0) << err;
  ASSERT_EQ(mkdir(set.c_str(), 0755), 0);
  ckptio_writer *w = nullptr;
  ASSERT_EQ(ckptio_writer_open_sharded(c.ctx, set.c_str(), "model", CKPTIO_FORMAT_SAFETENSORS, 100 << 10,
                                       CKPTIO_SHARD_ORDER_ADDED, nullptr, &w),
            0);
  std::vector<ckptio_tensor> d;
  for (auto &t : m) ASSERT_EQ(ckptio_writer_add(w, &(d.emplace_back(host_desc(t)))), 0);
  ASSERT_EQ(ckptio_writer_commit(w), 0) << ckptio_writer_last_error(w);
  ASSERT_EQ(ckptio_writer_close(w), 0);
  for (const std::string &path : {pt, zst, set}) {
    auto wants = [&](int r) {
      std::vector<Want> v = everything(m);
      v.push_back(split(m, 1, 1, r, 2));
      return v;
    };
    auto out = group_load(path, 2, m, wants);
    expect_boxes(out, m, wants);
    if (path != zst) {
      EXPECT_EQ(total_read(out), model_bytes(m)) << path;
    }
  }
}

// ------------------------------------------------------------ failures

TEST_F(GroupLoad, ABadBoxOnOneRankFailsEveryRankNamingIt) {
  auto out = group_load(path, 3, m, [&](int r) {
    std::vector<Want> w = everything(m);
    if (r == 2) w.push_back(Want{2, {0, 90}, {96, 97}});
    return w;
  });
  expect_all_fail(out, 2, CKPTIO_E_INVALID_ARG, "outside the tensor");
}

TEST_F(GroupLoad, RanksThatOpenedDifferentCheckpointsAllFail) {
  auto m2 = model();
  m2[1] = make_tensor("layers.0.qkv", CKPTIO_F32, {96, 289}, 2);
  ASSERT_EQ(save(c.ctx, dir.file("a.safetensors"), m), 0);
  ASSERT_EQ(save(c.ctx, dir.file("b.safetensors"), m2), 0);
  std::vector<std::string> paths = {dir.file("a.safetensors"), dir.file("a.safetensors"), dir.file("b.safetensors")};
  auto out = group_load("", 3, m, [&](int) { return std::vector<Want>{whole(m, 0)}; }, 1 << 20, paths);
  expect_all_fail(out, -1, CKPTIO_E_RANK, "rank 2 opened another checkpoint");
}

TEST_F(GroupLoad, ADamagedByteFailsEveryRankNamingTheReader) {
  // The last tensor's bytes end the file; the last rank reads them.
  std::vector<uint8_t> bytes = read_file(path);
  {
    ckptio_reader *rd = nullptr;
    ASSERT_EQ(ckptio_reader_open(c.ctx, path.c_str(), nullptr, &rd), 0);
    ckptio_tensor_info info;
    int64_t index = ckptio_reader_find(rd, "layers.1.mlp");
    ASSERT_GE(index, 0);
    ASSERT_EQ(ckptio_reader_info(rd, (size_t)index, &info), 0);
    bytes[info.offset + info.nbytes / 2] ^= 0x40;  // in a middle chunk: the CRC across chunks finds it
    ckptio_reader_close(rd);
  }
  write_file(path, bytes);
  for (uint64_t staging : {(uint64_t)1 << 20, (uint64_t)64 << 20}) {
    auto out = group_load(path, 3, m, [&](int) { return everything(m); }, staging);
    int culprit = -1;
    for (size_t r = 0; r < out.size(); r++)
      if (out[r].rc == CKPTIO_E_CHECKSUM) culprit = (int)r;
    ASSERT_GE(culprit, 0) << out[0].err;
    expect_all_fail(out, culprit, CKPTIO_E_CHECKSUM, "layers.1.mlp");
  }
}

TEST_F(GroupLoad, AOneZeroCommunicatorIsRefusedOnEveryRank) {
  auto out = group_load(path, 2, m, [&](int) { return everything(m); }, 0, {}, offsetof(ckptio_comm, alltoallv));
  for (auto &o : out) {
    EXPECT_EQ(o.rc, CKPTIO_E_INVALID_ARG);
    EXPECT_NE(o.err.find("alltoallv"), std::string::npos) << o.err;
  }
}

}  // namespace
