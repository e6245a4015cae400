// Tiered checkpoints in one process: 4 threads play 4 ranks as 2 machines
// of 2 (thread_comm.h), each machine's memory tier its own directory, so the
// sanitizer builds see the save (synchronous and on the handle's thread),
// the exchange of copies and the restore. Every restored part is checked
// byte for byte. (tests/dist/tiers.sh runs the same over MPI processes,
// with kills; tests/interop/test_tiers.py over gloo.)
#include <filesystem>
#include <functional>
#include <thread>

#define CKPTIO_EXPERIMENTAL
#include "ckpt_fixture.h"
#include "thread_comm.h"

using namespace ckptio_test;

namespace {

constexpr int kRanks = 4, kPerNode = 2;

// Rank r's tensors at `step`.
std::vector<Tensor> part(int r, uint64_t step) {
  return {make_tensor("w", CKPTIO_F32, {100 + 10 * r, 64}, (uint64_t)r * 1000 + step),
          make_tensor("b", CKPTIO_I64, {3 + r}, (uint64_t)r * 1000 + step + 500)};
}

struct Job {
  std::string root;
  int background = 0, fatal = 0;
  std::string durable;  // "" : root/durable
  std::string storage;  // "": no storage tier; else its prefix, every 2nd step, and no durable tier
  bool memory = true;

  ckptio_tiers_options options(int r, int nranks, std::string *mem, std::string *dur) const {
    *mem = root + "/node" + std::to_string(r / kPerNode) + "/shm";
    *dur = durable.empty() ? root + "/durable" : durable;
    ckptio_tiers_options o = CKPTIO_TIERS_OPTIONS_INIT;
    o.memory_dir = mem->c_str();
    o.peers = nranks / kPerNode > 1;  // a restart on one node keeps no copies
    o.ranks_per_node = kPerNode;
    o.durable_dir = dur->c_str();
    o.durable_every = 2;
    o.background = background;
    o.fatal = fatal;
    if (!storage.empty()) {
      o.durable_dir = nullptr;
      o.storage_dir = storage.c_str();
      o.storage_every = 2;
    }
    if (!memory) o.memory_dir = nullptr, o.peers = 0;
    return o;
  }
};

// Runs body(rank, handle) on nranks threads, each with its own context and
// handle over one in-process communicator.
void on_ranks(const Job &s, const std::function<void(int, ckptio_tiers *)> &body, int nranks = kRanks) {
  Group g(nranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; r++)
    threads.emplace_back([&, r] {
      Member m{&g, r};
      ckptio_comm comm = group_comm(&m);
      TestContext tc;
      std::string mem, dur;
      ckptio_tiers_options o = s.options(r, nranks, &mem, &dur);
      ckptio_tiers *t = nullptr;
      ASSERT_EQ(ckptio_tiers_open(tc.ctx, &comm, &o, &t), 0) << ckptio_last_open_error();
      body(r, t);
      ckptio_tiers_close(t);
    });
  for (auto &t : threads) t.join();
}

void save_steps(const Job &s, uint64_t first, uint64_t last) {
  on_ranks(s, [&](int r, ckptio_tiers *t) {
    for (uint64_t step = first; step <= last; step++) {
      std::vector<Tensor> ts = part(r, step);
      std::vector<ckptio_tensor> d = {host_desc(ts[0]), host_desc(ts[1])};
      EXPECT_EQ(ckptio_tiers_save(t, step, d.data(), d.size()), 0) << ckptio_tiers_last_error(t);
      // The save took its copy: changing the tensors now must not change it.
      for (auto &x : ts) std::fill(x.bytes.begin(), x.bytes.end(), 0xEE);
    }
    EXPECT_EQ(ckptio_tiers_wait(t), 0) << ckptio_tiers_last_error(t);
  });
}

// Each rank restores: the step, and from which tier, per rank.
struct Restored {
  uint64_t step[kRanks] = {};
  int tier[kRanks] = {};
  uint64_t skipped[kRanks] = {};
};

Restored restore(const Job &s) {
  Restored out;
  on_ranks(s, [&](int r, ckptio_tiers *t) {
    char path[4096];
    uint64_t step = 0;
    ASSERT_EQ(ckptio_tiers_restore(t, &step, path, sizeof(path)), 0) << ckptio_tiers_last_error(t);
    ckptio_tiers_stats st = CKPTIO_TIERS_STATS_INIT;
    ASSERT_EQ(ckptio_tiers_stats_get(t, &st), 0);
    out.step[r] = step;
    out.tier[r] = -1;
    for (int k = 0; k < CKPTIO_TIERS; k++)
      if (st.restored_bytes[k]) out.tier[r] = out.tier[r] < 0 ? k : 9;  // 9: more than one tier
    out.skipped[r] = st.skipped_copies;
    TestContext tc;
    expect_loads(tc.ctx, path, part(r, step));
  });
  return out;
}

void flip_byte(const std::string &path) {
  std::vector<uint8_t> b = read_file(path);
  b[b.size() - 100] ^= 0xFF;
  write_file(path, b);
}

class Tiers : public ::testing::TestWithParam<int> {};

TEST_P(Tiers, RestoresFromMemoryPeersAndDiskNeverABadCopy) {
  TempDir dir;
  Job s{dir.path(), GetParam(), 0, "", "", true};
  save_steps(s, 1, 3);
  Restored a = restore(s);
  for (int r = 0; r < kRanks; r++) {
    EXPECT_EQ(a.step[r], 3u) << r;
    EXPECT_EQ(a.tier[r], CKPTIO_TIER_MEMORY) << r;
  }
  // Rank 0's own part damaged: its copy (held by rank 2, on the other node) serves.
  flip_byte(dir.path() + "/node0/shm/step-00000003/rank-00000.safetensors");
  Restored b = restore(s);
  EXPECT_EQ(b.step[0], 3u);
  EXPECT_EQ(b.tier[0], CKPTIO_TIER_PEER);
  EXPECT_EQ(b.skipped[0], 1u);
  // Node 1 lost: its ranks from the copies on node 0.
  std::filesystem::remove_all(dir.path() + "/node1");
  Restored c = restore(s);
  for (int r = 0; r < kRanks; r++) {
    EXPECT_EQ(c.step[r], 3u) << r;
    EXPECT_EQ(c.tier[r], r < kPerNode ? CKPTIO_TIER_MEMORY : CKPTIO_TIER_PEER) << r;
  }
  // Both nodes lost: the newest durable step (every 2nd).
  std::filesystem::remove_all(dir.path() + "/node0");
  std::filesystem::remove_all(dir.path() + "/node1");
  Restored d = restore(s);
  for (int r = 0; r < kRanks; r++) {
    EXPECT_EQ(d.step[r], 2u) << r;
    EXPECT_EQ(d.tier[r], CKPTIO_TIER_DURABLE) << r;
  }
  // Nothing anywhere: -ENOENT on every rank.
  std::filesystem::remove_all(dir.path() + "/durable");
  on_ranks(s, [&](int, ckptio_tiers *t) {
    char path[4096];
    uint64_t step = 0;
    EXPECT_EQ(ckptio_tiers_restore(t, &step, path, sizeof(path)), -ENOENT);
    EXPECT_NE(std::string(ckptio_tiers_last_error(t)).find("no step is whole"), std::string::npos);
  });
}

// A one-pass restore into zeroed tensors shaped as rank r's part: they
// must then hold exactly step want_step's bytes.
void expect_restore_load(int r, ckptio_tiers *t, uint64_t want_step) {
  std::vector<Tensor> want = part(r, want_step);
  std::vector<std::vector<uint8_t>> got(2);
  std::vector<ckptio_tiers_dest> d;
  for (size_t i = 0; i < 2; i++) {
    got[i].assign(want[i].bytes.size(), 0);
    d.push_back({want[i].name.c_str(), got[i].data(), got[i].size(), CKPTIO_DEVICE_HOST});
  }
  uint64_t step = 0;
  ASSERT_EQ(ckptio_tiers_restore_load(t, &step, d.data(), d.size()), 0) << ckptio_tiers_last_error(t);
  EXPECT_EQ(step, want_step) << r;
  for (size_t i = 0; i < 2; i++) EXPECT_EQ(got[i], want[i].bytes) << r << " " << want[i].name;
}

// One pass: each rank's part loaded straight into its tensors, each CRC32
// checked as it lands; a damaged part is skipped as by ckptio_tiers_restore.
// (Rank 0's copy comes from its peer in 64-byte chunks: its header arrives
// in several, and most of the others land in w in place.)
TEST_P(Tiers, RestoreLoadFillsTheDestinationsFromTheFastestGoodHolder) {
  ScopedEnv chunk("CKPTIO_FAULT_TIERS_CHUNK", "64");
  TempDir dir;
  Job s{dir.path(), GetParam(), 0, "", "", true};
  save_steps(s, 1, 3);
  flip_byte(dir.path() + "/node0/shm/step-00000003/rank-00000.safetensors");
  on_ranks(s, [&](int r, ckptio_tiers *t) {
    expect_restore_load(r, t, 3);
    ckptio_tiers_stats st = CKPTIO_TIERS_STATS_INIT;
    ckptio_tiers_stats_get(t, &st);
    EXPECT_GT(st.restored_bytes[r == 0 ? CKPTIO_TIER_PEER : CKPTIO_TIER_MEMORY], 0u) << r;
    EXPECT_EQ(st.skipped_copies, r == 0 ? 1u : 0u) << r;
    // A tensor no part holds: every holder of every step fails, so nothing is whole.
    std::vector<uint8_t> buf(64);
    uint64_t step = 0;
    ckptio_tiers_dest none = {"no.such.tensor", buf.data(), buf.size(), CKPTIO_DEVICE_HOST};
    EXPECT_EQ(ckptio_tiers_restore_load(t, &step, &none, 1), -ENOENT);
  });
}

// A peer's copy lands in the tensors straight from the exchange: a damaged
// or torn copy must fail its check there and leave the step to an older
// one, whose bytes then overwrite the destinations. In 4 KiB chunks, most
// of which fall inside w and are received into it in place.
TEST_P(Tiers, RestoreLoadNeverKeepsABadPeerCopy) {
  ScopedEnv chunk("CKPTIO_FAULT_TIERS_CHUNK", "4096");
  TempDir dir;
  Job s{dir.path(), GetParam(), 0, "", "", true};
  save_steps(s, 1, 3);
  auto at = [&](int node, const char *file) {
    return dir.path() + "/node" + std::to_string(node) + "/shm/step-00000003/" + file;
  };
  // Ranks 0 and 1 lose their own parts; rank 0's copy (on rank 2) is torn,
  // rank 1's (on rank 3) has a flipped byte.
  flip_byte(at(0, "rank-00000.safetensors"));
  flip_byte(at(0, "rank-00001.safetensors"));
  std::filesystem::resize_file(at(1, "copy-00000.safetensors"),
                               std::filesystem::file_size(at(1, "copy-00000.safetensors")) / 2);
  flip_byte(at(1, "copy-00001.safetensors"));
  on_ranks(s, [&](int r, ckptio_tiers *t) {
    expect_restore_load(r, t, 2);
    ckptio_tiers_stats st = CKPTIO_TIERS_STATS_INIT;
    ckptio_tiers_stats_get(t, &st);
    EXPECT_EQ(st.skipped_copies, r < 2 ? 2u : 0u) << r;
    if (r == 1) {  // its last warning: the copy's, checked as it landed
      EXPECT_NE(std::string(ckptio_tiers_last_error(t)).find("held by rank 3): skipped: tensor 'w': checksum mismatch"),
                std::string::npos)
          << ckptio_tiers_last_error(t);
    }
  });
}

// The storage tier on the S3 server of CKPTIO_S3_BUCKET (ctest runs this
// under tests/s3/weed_server.py: unit_tiers_storage); skipped without one.
TEST_P(Tiers, StorageServesWhenEveryMachineIsLost) {
  const char *bucket = getenv("CKPTIO_S3_BUCKET");
  if (!bucket) GTEST_SKIP() << "no S3 server (ctest's unit_tiers_storage runs this under weed_server.py)";
  TempDir dir;
  std::string prefix = std::string("s3://") + bucket + "/unit-" + std::to_string(GetParam()) + "-" +
                       std::to_string(getpid());
  Job s{dir.path(), GetParam(), 0, "", prefix, true};
  save_steps(s, 1, 3);
  std::filesystem::remove_all(dir.path() + "/node0");
  std::filesystem::remove_all(dir.path() + "/node1");
  Restored a = restore(s);  // every part downloaded into its memory directory
  for (int r = 0; r < kRanks; r++) {
    EXPECT_EQ(a.step[r], 2u) << r;
    EXPECT_EQ(a.tier[r], CKPTIO_TIER_STORAGE) << r;
  }
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/node1/shm/step-00000002/rank-00003.safetensors"));
  Job alone = s;  // the storage alone: the restore hands out the objects
  alone.memory = false;
  alone.storage = prefix + "-alone";
  save_steps(alone, 1, 4);
  Restored b = restore(alone);
  for (int r = 0; r < kRanks; r++) {
    EXPECT_EQ(b.step[r], 4u) << r;
    EXPECT_EQ(b.tier[r], CKPTIO_TIER_STORAGE) << r;
  }
  // Loaded in one pass straight from the objects (nothing downloaded first).
  on_ranks(s, [&](int r, ckptio_tiers *t) {
    std::vector<Tensor> want = part(r, 2);
    std::vector<uint8_t> w(want[0].bytes.size()), bias(want[1].bytes.size());
    ckptio_tiers_dest d[2] = {{"w", w.data(), w.size(), CKPTIO_DEVICE_HOST}, {"b", bias.data(), bias.size(), CKPTIO_DEVICE_HOST}};
    uint64_t step = 0;
    ASSERT_EQ(ckptio_tiers_restore_load(t, &step, d, 2), 0) << ckptio_tiers_last_error(t);
    EXPECT_EQ(step, 2u);
    EXPECT_EQ(w, want[0].bytes);
    EXPECT_EQ(bias, want[1].bytes);
  });
}

INSTANTIATE_TEST_SUITE_P(SyncAndBackground, Tiers, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int> &i) { return i.param ? "background" : "sync"; });

// Saved with places (rank r's w: rows after ranks 0..r-1's of one global
// w; its b: values after theirs of one global b), restored at 2 ranks from
// the multi-rank checkpoint of `tier` (durable, or the storage of s): each
// rank's half of w's rows.
void placed_round_trip(const Job &s, int tier) {
  int64_t rows = 0, vals = 0, at_rows[kRanks], at_vals[kRanks];
  std::vector<uint8_t> w_all, b_all;  // the global tensors' bytes at step 2
  for (int r = 0; r < kRanks; r++) {
    std::vector<Tensor> ts = part(r, 2);
    at_rows[r] = rows, at_vals[r] = vals;
    rows += ts[0].shape[0], vals += ts[1].shape[0];
    w_all.insert(w_all.end(), ts[0].bytes.begin(), ts[0].bytes.end());
    b_all.insert(b_all.end(), ts[1].bytes.begin(), ts[1].bytes.end());
  }
  on_ranks(s, [&](int r, ckptio_tiers *t) {
    for (uint64_t step = 1; step <= 2; step++) {
      std::vector<Tensor> ts = part(r, step);
      std::vector<ckptio_tensor> d = {host_desc(ts[0]), host_desc(ts[1])};
      ckptio_tiers_place p[2] = {{{rows, 64}, {at_rows[r], 0}}, {{vals}, {at_vals[r]}}};
      EXPECT_EQ(ckptio_tiers_save_placed(t, step, d.data(), p, d.size()), 0) << ckptio_tiers_last_error(t);
    }
  });
  on_ranks(s, [&](int r, ckptio_tiers *t) {
    char path[4096];
    uint64_t step = 0;
    ASSERT_EQ(ckptio_tiers_restore_global(t, &step, path, sizeof(path)), 0) << ckptio_tiers_last_error(t);
    EXPECT_EQ(step, 2u);
    TestContext tc;
    ckptio_reader *rd = nullptr;
    ASSERT_EQ(ckptio_reader_open(tc.ctx, path, nullptr, &rd), 0) << ckptio_last_open_error();
    int64_t first = rows * r / 2, last = rows * (r + 1) / 2, row_bytes = 64 * 4;
    std::vector<uint8_t> got((size_t)((last - first) * row_bytes)), b(b_all.size());
    ckptio_box_request q[2] = {};
    q[0].index = (size_t)ckptio_reader_find(rd, "w"), q[0].start[0] = first, q[0].stop[0] = last, q[0].stop[1] = 64;
    q[0].dst = got.data(), q[0].dst_bytes = got.size();
    q[1].index = (size_t)ckptio_reader_find(rd, "b"), q[1].stop[0] = vals, q[1].dst = b.data(), q[1].dst_bytes = b.size();
    ASSERT_EQ(ckptio_reader_load_boxes(rd, q, 2), 0) << ckptio_reader_last_error(rd);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), w_all.begin() + first * row_bytes)) << "rows of w, rank " << r;
    EXPECT_EQ(b, b_all);
    ckptio_reader_close(rd);
  }, 2);
  // At the same world size, a rank's part is its file of the checkpoint.
  std::filesystem::remove_all(s.root + "/node0");
  std::filesystem::remove_all(s.root + "/node1");
  Restored a = restore(s);
  for (int r = 0; r < kRanks; r++) EXPECT_EQ(a.tier[r], tier) << r;
}

TEST(TiersPlaced, RestoresAtAnotherWorldSizeFromTheDurableTier) {
  TempDir dir;
  placed_round_trip(Job{dir.path(), 0, 0, "", "", true}, CKPTIO_TIER_DURABLE);
}

// The same from the storage (ctest's tiers_storage runs it under a server).
TEST(TiersPlaced, RestoresAtAnotherWorldSizeFromTheStorage) {
  const char *bucket = getenv("CKPTIO_S3_BUCKET");
  if (!bucket) GTEST_SKIP() << "no S3 server (ctest's tiers_storage runs this under weed_server.py)";
  TempDir dir;
  std::string prefix = std::string("s3://") + bucket + "/placed-" + std::to_string(getpid());
  placed_round_trip(Job{dir.path(), 0, 0, "", prefix, true}, CKPTIO_TIER_STORAGE);
}

TEST(TiersSave, AFailingTierWarnsAndTheSaveGoesOnUnlessFatal) {
  TempDir dir;
  write_file(dir.file("blocked"), std::string("a file where the durable directory would go"));
  for (int fatal = 0; fatal <= 1; fatal++) {
    Job s{dir.path() + "/f" + std::to_string(fatal), 0, fatal, dir.file("blocked") + "/durable", "", true};
    on_ranks(s, [&](int r, ckptio_tiers *t) {
      std::vector<Tensor> ts = part(r, 2);
      std::vector<ckptio_tensor> d = {host_desc(ts[0]), host_desc(ts[1])};
      int rc = ckptio_tiers_save(t, 2, d.data(), d.size());  // durable due at step 2
      std::string err = ckptio_tiers_last_error(t);
      EXPECT_NE(err.find("not saved to the durable tier"), std::string::npos) << err;
      if (fatal)
        EXPECT_LT(rc, 0);
      else
        EXPECT_EQ(rc, 0) << err;
      ckptio_tiers_stats st = CKPTIO_TIERS_STATS_INIT;
      ckptio_tiers_stats_get(t, &st);
      EXPECT_EQ(st.failed_tier_saves, 1u);
      EXPECT_GT(st.saved_bytes[CKPTIO_TIER_MEMORY], 0u);  // memory still published
    });
  }
}

TEST(TiersOpen, RefusesWhatCannotWork) {
  TestContext tc;
  ckptio_comm one;
  ckptio_comm_single(&one);
  ckptio_tiers *t = nullptr;
  ckptio_tiers_options none = CKPTIO_TIERS_OPTIONS_INIT;
  EXPECT_EQ(ckptio_tiers_open(tc.ctx, &one, &none, &t), CKPTIO_E_INVALID_ARG);
  EXPECT_NE(std::string(ckptio_last_open_error()).find("no tier"), std::string::npos);
  ckptio_tiers_options peers = CKPTIO_TIERS_OPTIONS_INIT;
  peers.memory_dir = "/tmp/unused";
  peers.peers = 1;  // one node: a copy would stay on its own machine
  EXPECT_EQ(ckptio_tiers_open(tc.ctx, &one, &peers, &t), CKPTIO_E_INVALID_ARG);
  EXPECT_NE(std::string(ckptio_last_open_error()).find("more nodes than copies"), std::string::npos);
  Group g(4);
  Member m{&g, 0};
  ckptio_comm four = group_comm(&m);
  ckptio_tiers_options uneven = CKPTIO_TIERS_OPTIONS_INIT;
  uneven.memory_dir = "/tmp/unused";
  uneven.ranks_per_node = 3;
  EXPECT_EQ(ckptio_tiers_open(tc.ctx, &four, &uneven, &t), CKPTIO_E_INVALID_ARG);
  EXPECT_NE(std::string(ckptio_last_open_error()).find("does not divide"), std::string::npos);
  ckptio_tiers_options local = CKPTIO_TIERS_OPTIONS_INIT;
  local.storage_dir = "/tmp/not-a-storage";
  EXPECT_EQ(ckptio_tiers_open(tc.ctx, &one, &local, &t), CKPTIO_E_INVALID_ARG);
  EXPECT_NE(std::string(ckptio_last_open_error()).find("is a local path"), std::string::npos);
  EXPECT_EQ(t, nullptr);
}

TEST(TiersSave, StepsMustGrow) {
  TempDir dir;
  TestContext tc;
  ckptio_comm one;
  ckptio_comm_single(&one);
  std::string mem = dir.file("shm");
  ckptio_tiers_options o = CKPTIO_TIERS_OPTIONS_INIT;
  o.memory_dir = mem.c_str();
  ckptio_tiers *t = nullptr;
  ASSERT_EQ(ckptio_tiers_open(tc.ctx, &one, &o, &t), 0) << ckptio_last_open_error();
  std::vector<Tensor> ts = part(0, 5);
  ckptio_tensor d = host_desc(ts[0]);
  EXPECT_EQ(ckptio_tiers_save(t, 5, &d, 1), 0) << ckptio_tiers_last_error(t);
  EXPECT_EQ(ckptio_tiers_save(t, 5, &d, 1), CKPTIO_E_INVALID_ARG);
  EXPECT_NE(std::string(ckptio_tiers_last_error(t)).find("steps must grow"), std::string::npos);
  ckptio_tiers_close(t);
}

}  // namespace
