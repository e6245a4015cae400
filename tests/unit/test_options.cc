// Options per call (include/ckptio.h, ckptio_options): the context-only
// fields of a struct given to a writer, a reader or the manager are the
// context's, so any other value is refused naming the field and where to set
// it, never ignored; the struct the context was made from, the one
// ckptio_ctx_options gives and CKPTIO_OPTIONS_INIT are accepted; and each
// per-call field changes what that one save or load does, either way from
// the context's default.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ckpt_fixture.h"
extern "C" {
#include "io/fault.h"
}

using namespace ckptio_test;

namespace {

bool contains(const std::string &s, const std::string &part) { return s.find(part) != std::string::npos; }

// A context-only field set to a value the test context does not have.
struct Field {
  const char *name;
  std::function<void(ckptio_options &)> set;
};

const std::vector<Field> &context_fields() {
  static const std::vector<Field> fields = {
      {"threads", [](ckptio_options &o) { o.threads = 5; }},
      {"chunk_bytes", [](ckptio_options &o) { o.chunk_bytes = 128 << 10; }},
      {"staging_bytes", [](ckptio_options &o) { o.staging_bytes = 1 << 20; }},
      {"cuda", [](ckptio_options &o) { o.cuda = 0; }},
      {"numa", [](ckptio_options &o) { o.numa = 0; }},
      {"snapshot_bytes", [](ckptio_options &o) { o.snapshot_bytes = 1 << 20; }},
  };
  return fields;
}

class Options : public ::testing::Test {
 protected:
  void SetUp() override {
    // Not the defaults: 3 workers, 64 KiB chunks, a 256 KiB ring, snapshot
    // memory that is not whole chunks (the context rounds it down).
    made_ = small_options();
    made_.snapshot_bytes = 3 * made_.chunk_bytes + 100;
    ASSERT_EQ(ckptio_ctx_create(&made_, &ctx_), 0) << ckptio_last_open_error();
    ts_ = {make_tensor("a", CKPTIO_F32, {40000}, 1), make_tensor("b", CKPTIO_U8, {77}, 2)};
    ASSERT_EQ(save(ctx_, file(), ts_), 0);
  }
  void TearDown() override {
    ckptio_fault_clear();
    ckptio_ctx_free(ctx_);
  }
  std::string file() const { return dir_.file("m.safetensors"); }

  // Every open that takes per-call options, with `o`: each one's code and
  // ckptio_last_open_error, by the call's name. What an open writes is
  // closed (a writer without a commit writes nothing) or removed.
  struct Opened {
    std::string call;
    int rc;
    std::string why;
  };
  std::vector<Opened> open_each(const ckptio_options &o) {
    std::vector<Opened> out;
    auto note = [&](const char *call, int rc) { out.push_back({call, rc, ckptio_last_open_error()}); };
    ckptio_writer *w = nullptr;
    note("ckptio_writer_open",
         ckptio_writer_open(ctx_, dir_.file("w.safetensors").c_str(), CKPTIO_FORMAT_SAFETENSORS, &o, &w));
    ckptio_writer_close(w);
    note("ckptio_writer_open_sharded",
         ckptio_writer_open_sharded(ctx_, dir_.path().c_str(), "s", CKPTIO_FORMAT_SAFETENSORS, 1 << 20,
                                    CKPTIO_SHARD_ORDER_ADDED, &o, &w));
    ckptio_writer_close(w);
    ckptio_comm comm;
    ckptio_comm_single(&comm);
    note("ckptio_writer_open_ranks", ckptio_writer_open_ranks(ctx_, &comm, dir_.path().c_str(), "r", &o, &w));
    ckptio_writer_close(w);
    ckptio_reader *r = nullptr;
    note("ckptio_reader_open", ckptio_reader_open(ctx_, file().c_str(), &o, &r));
    ckptio_reader_close(r);
    ckptio_manager *m = nullptr;
    note("ckptio_manager_open", ckptio_manager_open(ctx_, dir_.file("ckpts").c_str(), nullptr, &o, &m));
    ckptio_manager_close(m);
    rmdir(dir_.file("ckpts").c_str());
    return out;
  }

  // Loads every tensor of path with `o`: 0, or the load's code.
  int load_all(const std::string &path, const ckptio_options *o, ckptio_stats *st = nullptr) {
    ckptio_reader *r = nullptr;
    int rc = ckptio_reader_open(ctx_, path.c_str(), o, &r);
    EXPECT_EQ(rc, 0) << ckptio_last_open_error();
    if (rc < 0) return rc;
    std::vector<std::vector<uint8_t>> out;
    std::vector<ckptio_load_request> reqs;
    for (size_t i = 0; i < ckptio_reader_count(r); i++) {
      ckptio_tensor_info info;
      EXPECT_EQ(ckptio_reader_info(r, i, &info), 0);
      out.emplace_back(info.nbytes);
      reqs.push_back({i, out.back().data(), info.nbytes, CKPTIO_DEVICE_HOST});
    }
    rc = ckptio_reader_load_many(r, reqs.data(), reqs.size());
    if (st) {
      EXPECT_EQ(ckptio_reader_stats(r, st), 0);
    }
    ckptio_reader_close(r);
    return rc;
  }

  TempDir dir_;
  ckptio_options made_;
  ckptio_ctx *ctx_ = nullptr;
  std::vector<Tensor> ts_;
};

}  // namespace

TEST_F(Options, ContextOnlyFieldsThatDifferAreRefusedPerCall) {
  const ckptio_options init = CKPTIO_OPTIONS_INIT;
  for (const Field &f : context_fields()) {
    // From CKPTIO_OPTIONS_INIT with the one field set, and from the
    // context's own struct with it changed.
    for (const ckptio_options *base : {&init, const_cast<const ckptio_options *>(&made_)}) {
      ckptio_options o = *base;
      f.set(o);
      for (const Opened &op : open_each(o)) {
        SCOPED_TRACE(std::string(f.name) + " to " + op.call + (base == &init ? " from INIT" : " from the context's"));
        EXPECT_EQ(op.rc, CKPTIO_E_INVALID_ARG) << "ignored, not refused";
        EXPECT_TRUE(contains(op.why, std::string(f.name) + " is ")) << op.why;
        EXPECT_TRUE(contains(op.why, "context option")) << op.why;
        EXPECT_TRUE(contains(op.why, "ckptio_ctx_create")) << "where to set it: " << op.why;
      }
    }
  }
  EXPECT_EQ(dir_.list(), std::vector<std::string>{"m.safetensors"}) << "a refused open wrote";
}

TEST_F(Options, ContextOnlyFieldsMayBeTheContextsOrLeftAtTheirDefaults) {
  ckptio_options init = CKPTIO_OPTIONS_INIT;
  ckptio_options in_force = CKPTIO_OPTIONS_INIT;
  ASSERT_EQ(ckptio_ctx_options(ctx_, &in_force), 0);
  EXPECT_EQ(in_force.snapshot_bytes, 3 * made_.chunk_bytes) << "rounded down to whole chunks";
  // CKPTIO_OPTIONS_INIT, the struct the context was made from (its
  // snapshot_bytes not rounded), and the options in force.
  for (const ckptio_options *o : {&init, &made_, &in_force}) {
    for (const Opened &op : open_each(*o)) {
      SCOPED_TRACE(op.call);
      EXPECT_EQ(op.rc, 0) << op.why;
    }
  }
  // A context made with the defaults resolves them (32 workers, 8 MiB
  // chunks): the same struct, or the resolved values, per call are its.
  ckptio_ctx *plain = nullptr;
  ASSERT_EQ(ckptio_ctx_create(&init, &plain), 0);
  ASSERT_EQ(ckptio_ctx_options(plain, &in_force), 0);
  EXPECT_GT(in_force.threads, 0);
  EXPECT_GT(in_force.chunk_bytes, 0u);
  ckptio_reader *r = nullptr;
  for (const ckptio_options *o : {&init, &in_force}) {
    EXPECT_EQ(ckptio_reader_open(plain, file().c_str(), o, &r), 0) << ckptio_last_open_error();
    ckptio_reader_close(r);
  }
  ckptio_ctx_free(plain);
}

TEST_F(Options, PerCallCrcIsHonouredBothWays) {
  // Saved without CRCs on a context whose default is on.
  ckptio_options off = CKPTIO_OPTIONS_INIT;
  off.crc = 0;
  ASSERT_EQ(save(ctx_, dir_.file("nocrc.safetensors"), ts_, &off), 0);
  for (auto [path, want] : {std::pair{dir_.file("nocrc.safetensors"), 0}, std::pair{file(), 1}}) {
    ckptio_reader *r = nullptr;
    ASSERT_EQ(ckptio_reader_open(ctx_, path.c_str(), nullptr, &r), 0);
    ckptio_tensor_info info;
    ASSERT_EQ(ckptio_reader_info(r, 0, &info), 0);
    EXPECT_EQ(info.has_crc, want) << path;
    ckptio_reader_close(r);
  }

  // A flipped byte of tensor data: caught by default, loaded with crc 0.
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(ctx_, file().c_str(), nullptr, &r), 0);
  ckptio_tensor_info info;
  ASSERT_EQ(ckptio_reader_info(r, 0, &info), 0);
  ckptio_reader_close(r);
  auto bytes = read_file(file());
  bytes[info.offset + 5] ^= 0x40;
  write_file(file(), bytes);
  EXPECT_EQ(load_all(file(), nullptr), CKPTIO_E_CHECKSUM);
  EXPECT_EQ(load_all(file(), &off), 0) << "crc 0 per call was not honoured";

  // And the other way: crc 1 per call on a context without CRCs.
  ckptio_options ctx_off = small_options();
  ctx_off.crc = 0;
  ckptio_ctx *saved = ctx_;
  ASSERT_EQ(ckptio_ctx_create(&ctx_off, &ctx_), 0);
  EXPECT_EQ(load_all(file(), nullptr), 0) << "the context's crc 0";
  ckptio_options on = CKPTIO_OPTIONS_INIT;
  EXPECT_EQ(load_all(file(), &on), CKPTIO_E_CHECKSUM) << "crc 1 per call was not honoured";
  ckptio_ctx_free(ctx_);
  ctx_ = saved;
}

TEST_F(Options, PerCallCompressionAndShuffleAreHonoured) {
  ckptio_options z = CKPTIO_OPTIONS_INIT;
  z.compress_level = 3;
  z.shuffle = 1;
  ASSERT_EQ(save(ctx_, dir_.file("z.safetensors.zst"), ts_, &z), 0);
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(ctx_, dir_.file("z.safetensors.zst").c_str(), nullptr, &r), 0);
  EXPECT_EQ(ckptio_reader_compression(r, nullptr, nullptr, nullptr), 1);
  EXPECT_NE(ckptio_reader_metadata_get(r, "ckptio.filter"), nullptr) << "shuffle 1 per call was not honoured";
  std::vector<uint8_t> a(ts_[0].bytes.size());
  ASSERT_EQ(ckptio_reader_load(r, (size_t)ckptio_reader_find(r, "a"), a.data(), a.size()), 0)
      << ckptio_reader_last_error(r);
  EXPECT_EQ(a, ts_[0].bytes);
  ckptio_reader_close(r);
  // The context's default stays a plain file.
  ASSERT_EQ(ckptio_reader_open(ctx_, file().c_str(), nullptr, &r), 0);
  EXPECT_EQ(ckptio_reader_compression(r, nullptr, nullptr, nullptr), 0);
  ckptio_reader_close(r);
}

TEST_F(Options, PerCallLoadMethodIsHonoured) {
  for (ckptio_load_method m : {CKPTIO_LOAD_PREAD, CKPTIO_LOAD_MMAP}) {
    SCOPED_TRACE(m);
    ckptio_options o = CKPTIO_OPTIONS_INIT;
    o.load_method = m;
    ckptio_stats st = CKPTIO_STATS_INIT;
    ASSERT_EQ(load_all(file(), &o, &st), 0);
    EXPECT_EQ(st.load_methods, 1u << m);
  }
}

TEST_F(Options, PerCallFsyncIsHonouredBothWays) {
  // The next fdatasync fails: a save that skips it succeeds, one that does
  // not fails with it.
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  o.fsync = 0;
  ckptio_fault_arm(CKPTIO_FAULT_FSYNC, 1, EIO);
  EXPECT_EQ(save(ctx_, dir_.file("nosync.safetensors"), ts_, &o), 0) << "fsync 0 per call was not honoured";
  ckptio_fault_clear();

  ckptio_options ctx_nosync = small_options();
  ctx_nosync.fsync = 0;
  ckptio_ctx *nosync = nullptr;
  ASSERT_EQ(ckptio_ctx_create(&ctx_nosync, &nosync), 0);
  ckptio_fault_arm(CKPTIO_FAULT_FSYNC, 1, EIO);
  EXPECT_EQ(save(nosync, dir_.file("a.safetensors"), ts_), 0) << "the context's fsync 0";
  ckptio_fault_clear();
  o.fsync = 1;
  ckptio_fault_arm(CKPTIO_FAULT_FSYNC, 1, EIO);
  std::string err;
  EXPECT_EQ(save(nosync, dir_.file("b.safetensors"), ts_, &o, &err), -EIO) << "fsync 1 per call was not honoured";
  EXPECT_TRUE(contains(err, "fdatasync")) << err;
  ckptio_fault_clear();
  ckptio_ctx_free(nosync);
}
