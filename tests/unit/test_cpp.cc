// The C++ layer (include/ckptio.hpp): the handles own and free their C
// handles, failures throw ckptio::error with the code and the detail, and a
// save and a load round-trip through it, single file and sharded set.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "ckptio.hpp"
#include "test_util.h"

namespace {

using ckptio_test::TempDir;

TEST(Cpp, SaveLoadRoundTrip) {
  TempDir dir;
  ckptio::context ctx;
  std::vector<float> w(1000);
  std::iota(w.begin(), w.end(), 0.5f);
  std::vector<int64_t> step{7};
  {
    auto wr = ckptio::writer::open(ctx, dir.file("m.safetensors"));
    wr.add(ckptio::tensor_of("w", CKPTIO_F32, {10, 100}, w.data()))
        .add(ckptio::tensor_of("step", CKPTIO_I64, {}, step.data()))
        .set_metadata("epoch", "3");
    EXPECT_EQ(wr.shard_count(), 1u);
    wr.commit_async();
    wr.wait_snapshot();
    wr.wait_durable();
    EXPECT_TRUE(wr.durable_done());
    EXPECT_EQ(wr.progress().first, wr.progress().second);
    EXPECT_EQ(wr.stats().bytes, 4008u);
  }
  auto r = ckptio::reader::open(ctx, dir.file("m.safetensors"));
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r.format(), "safetensors");
  EXPECT_EQ(r.metadata("epoch").value_or(""), "3");
  EXPECT_FALSE(r.metadata("nope"));
  EXPECT_FALSE(r.find("nope"));
  size_t i = r.index("w");
  EXPECT_EQ(r.info(i).shape[1], 100);
  std::vector<float> back(1000);
  r.load(i, back.data(), back.size() * sizeof(float));
  EXPECT_EQ(back, w);
  std::vector<float> rows(200);
  EXPECT_FALSE(r.load_slice(i, 0, 2, 4, rows.data(), rows.size() * sizeof(float)));  // partial: no CRC
  EXPECT_EQ(rows[0], w[200]);
  EXPECT_EQ(r.verify(), 0u);
}

TEST(Cpp, FailuresThrowTheCodeAndTheDetail) {
  TempDir dir;
  ckptio::context ctx;
  try {
    ckptio::reader::open(ctx, dir.file("missing.safetensors"));
    FAIL() << "opened a missing file";
  } catch (const ckptio::error &e) {
    EXPECT_EQ(e.code(), -ENOENT);
    EXPECT_NE(e.detail().find("missing.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ckptio_reader_open"), std::string::npos) << e.what();
  }
  float x = 1;
  auto wr = ckptio::writer::open(ctx, dir.file("d.safetensors"));
  wr.add(ckptio::tensor_of("x", CKPTIO_F32, {1}, &x));
  try {
    wr.add(ckptio::tensor_of("x", CKPTIO_F32, {1}, &x));
    FAIL() << "added a name twice";
  } catch (const ckptio::error &e) {
    EXPECT_EQ(e.code(), CKPTIO_E_DUPLICATE);
    EXPECT_NE(e.detail().find("'x'"), std::string::npos) << e.what();
  }
  wr.commit();
  auto r = ckptio::reader::open(ctx, dir.file("d.safetensors"));
  float small = 0;
  EXPECT_THROW(r.load(r.index("x"), &small, 2), ckptio::error);
  EXPECT_THROW(r.index("y"), ckptio::error);
}

TEST(Cpp, ShardedSetAndMoves) {
  TempDir dir;
  ckptio::context ctx;
  std::vector<uint8_t> a(3000, 1), b(3000, 2), c(3000, 3);
  auto wr = ckptio::writer::open_sharded(ctx, dir.path(), "model", 4096);
  wr.add(ckptio::tensor_of("a", CKPTIO_U8, {3000}, a.data()))
      .add(ckptio::tensor_of("b", CKPTIO_U8, {3000}, b.data()))
      .add(ckptio::tensor_of("c", CKPTIO_U8, {3000}, c.data()));
  ckptio::writer moved = std::move(wr);  // the handle moves; the moved-from one frees nothing
  moved.commit();
  EXPECT_EQ(moved.shard_count(), 3u);
  moved.close();
  ckptio::reader r = ckptio::reader::open(ctx, dir.path());
  EXPECT_EQ(r.size(), 3u);
  std::vector<ckptio_load_request> reqs;
  std::vector<std::vector<uint8_t>> out(3, std::vector<uint8_t>(3000));
  for (size_t k = 0; k < 3; k++) reqs.push_back({r.index(std::string(1, char('a' + k))), out[k].data(), 3000, 0});
  r.load_many(reqs);
  EXPECT_EQ(out[0], a);
  EXPECT_EQ(out[2], c);
  ckptio::reader r2 = std::move(r);
  EXPECT_EQ(r2.names().size(), 3u);
}

}  // namespace
