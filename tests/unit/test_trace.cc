// The trace file (issue 44, core/trace.c): a save and a load traced with
// ckptio_trace_start, read back as JSON: the stages of the save are there,
// each inside the save, nested per thread, in pipeline order (snapshot
// before write, the chunks before the CRCs are combined, the header before
// the commit); every thread is named; several saves make one valid file.
#define CKPTIO_EXPERIMENTAL
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt_fixture.h"
extern "C" {
#include "formats/json.h"
}

using namespace ckptio_test;

namespace {

struct Event {
  std::string name, ph, detail, thread;  // thread: a "thread_name" M event's args.name
  uint64_t ts = 0, dur = 0, pid = 0, tid = 0, bytes = 0;
  uint64_t end() const { return ts + dur; }
};

// The args object: bytes, detail (X events) or name (M events).
int parse_args(ckptio_json *j, Event *e) {
  size_t n = 0;
  const char *key, *s;
  size_t len;
  int rc = ckptio_json_object_begin(j);
  while (rc == 0 && (rc = ckptio_json_object_next(j, &n, &key)) == 1) {
    std::string k = key;
    if (k == "bytes") rc = ckptio_json_u64(j, &e->bytes);
    else if ((k == "detail" || k == "name") && (rc = ckptio_json_string(j, &s, &len)) == 0)
      (k == "detail" ? e->detail : e->thread) = std::string(s, len);
    else if (k != "detail" && k != "name") rc = ckptio_json_skip_value(j);
  }
  return rc < 0 ? rc : 0;
}

int parse_event(ckptio_json *j, Event *e) {
  size_t n = 0;
  const char *key, *s;
  size_t len;
  int rc = ckptio_json_object_begin(j);
  while (rc == 0 && (rc = ckptio_json_object_next(j, &n, &key)) == 1) {
    std::string k = key;
    uint64_t *num = k == "ts" ? &e->ts : k == "dur" ? &e->dur : k == "pid" ? &e->pid : k == "tid" ? &e->tid : nullptr;
    if (num) rc = ckptio_json_u64(j, num);
    else if (k == "args") rc = parse_args(j, e);
    else if ((k == "name" || k == "ph") && (rc = ckptio_json_string(j, &s, &len)) == 0)
      (k == "name" ? e->name : e->ph) = std::string(s, len);
    else if (k != "name" && k != "ph") rc = ckptio_json_skip_value(j);
  }
  return rc < 0 ? rc : 0;
}

// The trace at path, which must be one JSON array of events (UTF-8,
// nothing after it).
std::vector<Event> read_trace(const std::string &path) {
  std::vector<uint8_t> bytes = read_file(path);
  std::vector<Event> events;
  size_t bad = 0;
  EXPECT_EQ(ckptio_utf8_check(bytes.data(), bytes.size(), &bad), 0) << "byte " << bad;
  char err[256] = "";
  ckptio_json j;
  ckptio_json_init(&j, bytes.data(), bytes.size(), err, sizeof(err));
  size_t n = 0;
  int rc = ckptio_json_array_begin(&j);
  while (rc == 0 && (rc = ckptio_json_array_next(&j, &n)) == 1) {
    events.emplace_back();
    rc = parse_event(&j, &events.back());
  }
  EXPECT_EQ(rc, 0) << err;
  EXPECT_EQ(ckptio_json_peek(&j), -1) << "bytes after the array";
  ckptio_json_free(&j);
  return events;
}

std::vector<Event> named(const std::vector<Event> &evs, const std::string &name) {
  std::vector<Event> out;
  for (const Event &e : evs)
    if (e.ph == "X" && e.name == name) out.push_back(e);
  return out;
}

bool inside(const Event &e, const Event &outer) { return e.ts >= outer.ts && e.end() <= outer.end(); }

// Spans of one thread are disjoint or one holds the other, and every
// thread that ran one is named once.
void expect_nested_and_named(const std::vector<Event> &evs) {
  std::map<uint64_t, int> names;
  for (const Event &e : evs)
    if (e.ph == "M" && e.name == "thread_name") names[e.tid]++;
  for (const Event &a : evs) {
    if (a.ph != "X") continue;
    EXPECT_EQ(names[a.tid], 1) << "thread " << a.tid << " of " << a.name << " named once";
    for (const Event &b : evs) {
      if (b.ph == "X" && &a != &b && a.tid == b.tid && a.ts < b.end() && b.ts < a.end()) {
        EXPECT_TRUE(inside(a, b) || inside(b, a)) << a.name << " and " << b.name << " overlap on thread " << a.tid;
      }
    }
  }
}

std::vector<Tensor> model() {
  std::vector<Tensor> ts;
  for (int i = 0; i < 12; i++) ts.push_back(make_tensor("w" + std::to_string(i), CKPTIO_BF16, {i * 97 + 1, 33}, i));
  ts.push_back(make_tensor("big", CKPTIO_F32, {300001}, 7));  // many 64 KiB chunks
  ts.push_back(make_tensor("weird \"name\"\\ é\n", CKPTIO_I8, {5}, 8));  // escaped in the load's details
  return ts;
}

}  // namespace

TEST(Trace, StagesOfOneSaveArePresentNestedAndOrdered) {
  TempDir dir;
  std::string trace = dir.file("trace.json"), path = dir.file("m.safetensors");
  auto ts = model();
  TestContext c(small_options());
  ASSERT_EQ(ckptio_trace_start(trace.c_str()), 0);
  EXPECT_EQ(ckptio_trace_start(trace.c_str()), CKPTIO_E_STATE);  // one trace at a time
  // Every chunk through the ring, so each has every stage: without
  // O_DIRECT no chunk is written in place from page-aligned tensors (CRC
  // and write, no snapshot), which the allocator may or may not give.
  ckptio_options o = small_options();
  o.direct_io = 0;
  std::string err;
  ASSERT_EQ(save(c.ctx, path, ts, &o, &err), 0) << err;
  expect_loads(c.ctx, path, ts, CKPTIO_LOAD_AUTO);
  ASSERT_EQ(ckptio_trace_stop(), 0);
  EXPECT_EQ(ckptio_trace_stop(), CKPTIO_E_STATE);

  std::vector<Event> evs = read_trace(trace);
  expect_nested_and_named(evs);
  auto saves = named(evs, "save");
  ASSERT_EQ(saves.size(), 1u);
  const Event &s = saves[0];
  EXPECT_EQ(s.detail, path);
  auto snapshots = named(evs, "save.snapshot"), writes = named(evs, "save.write"), crcs = named(evs, "save.crc"),
       headers = named(evs, "save.header"), commits = named(evs, "save.commit");
  ASSERT_FALSE(snapshots.empty());
  ASSERT_FALSE(writes.empty());
  // The bytes' CRCs are taken with the snapshot (a GPU's pieces in a pass
  // of their own inside it); the save's thread combines them once.
  std::vector<Event> combine;
  for (const Event &e : crcs) {
    if (e.tid == s.tid) {
      combine.push_back(e);
      continue;
    }
    bool in_snapshot = false;
    for (const Event &p : snapshots) in_snapshot |= p.tid == e.tid && inside(e, p);
    EXPECT_TRUE(in_snapshot) << "a chunk's CRC outside its snapshot";
  }
  ASSERT_EQ(combine.size(), 1u);
  ASSERT_EQ(headers.size(), 1u);
  ASSERT_EQ(commits.size(), 1u);
  uint64_t first_snapshot = UINT64_MAX, first_write = UINT64_MAX, chunks_end = 0, copied = 0, written = 0;
  for (const Event &e : snapshots) first_snapshot = std::min(first_snapshot, e.ts), copied += e.bytes;
  for (const Event &e : writes) first_write = std::min(first_write, e.ts), written += e.bytes;
  for (const auto *v : {&snapshots, &writes})
    for (const Event &e : *v) {
      EXPECT_TRUE(inside(e, s)) << e.name << " outside the save";
      EXPECT_NE(e.tid, s.tid) << e.name << " on a worker, not the save's thread";
      chunks_end = std::max(chunks_end, e.end());
    }
  EXPECT_LE(first_snapshot, first_write);
  EXPECT_EQ(copied, s.bytes);  // every tensor byte went through a snapshot
  EXPECT_GE(written, s.bytes);
  // On the save's thread after the chunks: combine the CRCs, write the
  // header, commit, in that order, inside the save.
  const Event *order[] = {&combine[0], &headers[0], &commits[0]};
  uint64_t at = chunks_end;
  for (const Event *e : order) {
    EXPECT_EQ(e->tid, s.tid) << e->name;
    EXPECT_TRUE(inside(*e, s)) << e->name;
    EXPECT_GE(e->ts, at) << e->name << " before the stage it follows";
    at = e->end();
  }
  EXPECT_EQ(commits[0].detail, path);

  // The load: opened on the caller's thread, read by workers inside it,
  // checked at its end.
  auto loads = named(evs, "load"), opens = named(evs, "load.open"), reads = named(evs, "load.read"),
       checks = named(evs, "load.check");
  ASSERT_FALSE(loads.empty());
  ASSERT_FALSE(opens.empty());
  ASSERT_FALSE(reads.empty());
  EXPECT_EQ(opens[0].detail, path);
  EXPECT_LE(opens[0].end(), loads[0].ts);
  bool weird = false;
  for (const Event &r : reads) {
    bool in_one = false;
    for (const Event &l : loads) in_one |= inside(r, l);
    EXPECT_TRUE(in_one) << "a read outside every load";
    weird |= r.detail == "weird \"name\"\\ é\n";
  }
  EXPECT_TRUE(weird) << "a tensor name with quotes, a backslash, a newline and UTF-8 comes back as it was";
  for (const Event &k : checks) EXPECT_EQ(k.tid, loads[0].tid);
  if (on_gpu()) {
    EXPECT_FALSE(named(evs, "load.to_device").empty());
  }
}

TEST(Trace, SeveralContextsAndSavesMakeOneValidFile) {
  TempDir dir;
  std::string trace = dir.file("trace.json");
  auto ts = model();
  ASSERT_EQ(ckptio_trace_start(trace.c_str()), 0);
  for (int k = 0; k < 2; k++) {
    TestContext c(small_options());
    for (int i = 0; i < 2; i++) {
      std::string err;
      ASSERT_EQ(save(c.ctx, dir.file("m" + std::to_string(k) + std::to_string(i) + ".safetensors"), ts, nullptr, &err), 0)
          << err;
    }
  }
  ASSERT_EQ(ckptio_trace_stop(), 0);
  std::vector<Event> evs = read_trace(trace);
  EXPECT_EQ(named(evs, "save").size(), 4u);
  expect_nested_and_named(evs);

  // A second trace starts a new file, with its threads named again.
  std::string again = dir.file("again.json");
  TestContext c(small_options());
  ASSERT_EQ(ckptio_trace_start(again.c_str()), 0);
  ASSERT_EQ(save(c.ctx, dir.file("x.safetensors"), ts), 0);
  ASSERT_EQ(ckptio_trace_stop(), 0);
  evs = read_trace(again);
  EXPECT_EQ(named(evs, "save").size(), 1u);
  expect_nested_and_named(evs);
}

TEST(Trace, PercentPIsTheProcessId) {
  TempDir dir;
  ASSERT_EQ(ckptio_trace_start(dir.file("t-%p.json").c_str()), 0);
  ASSERT_EQ(ckptio_trace_stop(), 0);
  std::string want = dir.file("t-" + std::to_string(getpid()) + ".json");
  EXPECT_TRUE(read_trace(want).empty());  // "[\n]": no stage ran
}

TEST(Trace, Refusals) {
  EXPECT_EQ(ckptio_trace_start(std::string(5000, 'x').c_str()), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(ckptio_trace_start(nullptr), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(ckptio_trace_start(""), CKPTIO_E_INVALID_ARG);
  EXPECT_EQ(ckptio_trace_start("/nonexistent-dir/trace.json"), -ENOENT);
  EXPECT_EQ(ckptio_trace_stop(), CKPTIO_E_STATE);
}

// NVTX (core/trace_nvtx.c) through a fake tool (unit/fake_nvtx_tool.c) that
// logs every range: run by the test test_trace_nvtx, which injects it as
// Nsight Systems injects its own (NVTX_INJECTION64_PATH).
TEST(TraceNvtx, RangesOfASaveAndALoadBalancedPerThread) {
  const char *log = getenv("FAKE_NVTX_LOG");
  if (!getenv("NVTX_INJECTION64_PATH") || !log) GTEST_SKIP() << "run by test_trace_nvtx (a fake NVTX tool injected)";
  unlink(log);  // the tool opens it at the process's first context, below
  {
    TempDir dir;
    auto ts = model();
    TestContext c(small_options());
    std::string err, path = dir.file("m.safetensors");
    ASSERT_EQ(save(c.ctx, path, ts, nullptr, &err), 0) << err;
    expect_loads(c.ctx, path, ts, CKPTIO_LOAD_AUTO);
  }
  std::ifstream in(log);
  std::string line;
  std::map<std::string, int> depth;
  std::set<std::string> domains, ranges;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string tid, verb, name;
    words >> tid;
    if (tid == "domain") {
      words >> name;
      domains.insert(name);
      continue;
    }
    words >> verb >> name;
    ASSERT_TRUE(verb == "push" || verb == "pop") << line;
    ASSERT_EQ(line.find("another domain"), std::string::npos) << line;
    if (verb == "push") ranges.insert(name);
    depth[tid] += verb == "push" ? 1 : -1;
    ASSERT_GE(depth[tid], 0) << "a pop without its push on thread " << tid;
  }
  EXPECT_EQ(domains, std::set<std::string>{"ckptio"});
  for (const auto &d : depth) EXPECT_EQ(d.second, 0) << "ranges left open on thread " << d.first;
  for (const char *stage : {"save", "save.snapshot", "save.crc", "save.write", "save.header", "save.commit", "load.open",
                            "load", "load.read", "load.check"})
    EXPECT_EQ(ranges.count(stage), 1u) << stage;
}
