// The worker pool runs every job once, grows to its size as jobs wait and
// drains on free; a batch keeps its first error; the staging ring blocks when empty and hands out aligned,
// distinct slots, the first of them in small pages.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <set>
#include <thread>

extern "C" {
#include "pool/pool.h"
#include "staging/ring.h"
}

namespace {
struct Counter {
  std::atomic<int> n{0};
  ckptio_batch *batch;
  int fail_at;
};
void count_job(void *arg) {
  auto *c = static_cast<Counter *>(arg);
  int k = ++c->n;
  ckptio_batch_done(c->batch, k == c->fail_at ? -5 : 0, k == c->fail_at ? "job failed" : nullptr);
}

// /proc/self/smaps' THPeligible of the mapping holding p: 1 when the kernel
// may back it with transparent huge pages, 0 when not, -1 when not found.
int thp_eligible(const void *p) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in = false;
  uintptr_t a = (uintptr_t)p;
  while (std::getline(smaps, line)) {
    unsigned long lo, hi;
    char dash;
    std::istringstream head(line);
    if (line.find(':') > line.find(' ') && head >> std::hex >> lo >> dash >> hi && dash == '-') {
      in = lo <= a && a < hi;
    } else if (in && line.rfind("THPeligible:", 0) == 0) {
      return std::stoi(line.substr(12));
    }
  }
  return -1;
}

std::string thp_mode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string s;
  std::getline(f, s);
  return s;
}
}  // namespace

TEST(Pool, RunsEveryJobAndKeepsFirstError) {
  ckptio_pool *p;
  ASSERT_EQ(ckptio_pool_create(3, &p), 0);
  ckptio_batch b;
  ckptio_batch_init(&b);
  Counter c;
  c.batch = &b;
  c.fail_at = 500;
  for (int i = 0; i < 1000; i++) {  // more than the initial queue: it grows
    ckptio_batch_add(&b, 1);
    ASSERT_EQ(ckptio_pool_add(p, count_job, &c), 0);
  }
  EXPECT_EQ(ckptio_batch_wait(&b), -5);
  EXPECT_STREQ(b.err, "job failed");
  EXPECT_EQ(c.n.load(), 1000);
  ckptio_batch_destroy(&b);
  ckptio_pool_free(p);
}

TEST(Pool, FreeDrainsQueuedJobs) {
  ckptio_pool *p;
  ASSERT_EQ(ckptio_pool_create(1, &p), 0);
  ckptio_batch b;
  ckptio_batch_init(&b);
  Counter c;
  c.batch = &b;
  c.fail_at = -1;
  ckptio_batch_add(&b, 200);
  for (int i = 0; i < 200; i++) ASSERT_EQ(ckptio_pool_add(p, count_job, &c), 0);
  ckptio_pool_free(p);
  EXPECT_EQ(c.n.load(), 200);
  ckptio_batch_destroy(&b);
  EXPECT_EQ(ckptio_pool_create(0, &p), -EINVAL);
}

// Jobs that each hold their worker (as a blocking read does) until all of
// them run at once.
struct Rendezvous {
  std::atomic<int> arrived{0};
  int want;
  ckptio_batch *batch;
};
void rendezvous_job(void *arg) {
  auto *r = static_cast<Rendezvous *>(arg);
  r->arrived++;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (r->arrived.load() < r->want && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ckptio_batch_done(r->batch, r->arrived.load() >= r->want ? 0 : -1, "not every job ran at once");
}

// A context's pool starts two workers (a one-shot save does not pay for 32)
// and starts the rest as jobs wait: n blocking jobs all run at once, which
// is the queue depth the disk sees.
TEST(Pool, StartsFewWorkersAndGrowsToItsSizeAsJobsWait) {
  ckptio_pool *p;
  ASSERT_EQ(ckptio_pool_create(12, &p), 0);
  EXPECT_EQ(ckptio_pool_threads(p), 2);
  ckptio_batch b;
  ckptio_batch_init(&b);
  Rendezvous r;
  r.want = 12;
  r.batch = &b;
  ckptio_batch_add(&b, 12);
  for (int i = 0; i < 12; i++) ASSERT_EQ(ckptio_pool_add(p, rendezvous_job, &r), 0);
  EXPECT_EQ(ckptio_batch_wait(&b), 0) << b.err;
  EXPECT_EQ(ckptio_pool_threads(p), 12);
  ckptio_batch_destroy(&b);
  ckptio_pool_free(p);
}

// The queuing thread can wait for some of a batch's jobs to end (a GPU
// load's slow start): it wakes once that many have, not before and not only
// when all have; a failure wakes it too.
TEST(Pool, BatchWaitsUntilSomeJobsEnded) {
  ckptio_batch b;
  ckptio_batch_init(&b);
  ckptio_batch_add(&b, 5);
  std::atomic<int> ended{0};
  std::atomic<bool> woke{false};
  std::thread ender([&] {
    for (int i = 0; i < 3; i++) {
      // The third job ends only once the waiter has woken (or 5 s later, if
      // it never wakes at the second): no timing in the assertions.
      auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (i == 2 && !woke.load() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ended++;
      ckptio_batch_done(&b, 0, nullptr);
    }
  });
  ckptio_batch_wait_ended(&b, 2);
  EXPECT_EQ(ended.load(), 2) << "woke before the second job ended, or only after the third";
  woke = true;
  ender.join();
  ckptio_batch_wait_ended(&b, 3);  // already there: returns at once
  ckptio_batch_done(&b, -7, "job failed");
  ckptio_batch_wait_ended(&b, 5);  // one still pending, but the batch failed
  EXPECT_EQ(ckptio_batch_failed(&b), -7);
  ckptio_batch_done(&b, 0, nullptr);
  EXPECT_EQ(ckptio_batch_wait(&b), -7);
  ckptio_batch_destroy(&b);
}

TEST(Ring, BlocksWhenEmptyAndSlotsAreAligned) {
  ckptio_ring *r;
  ASSERT_EQ(ckptio_ring_create(3, 64 << 10, 1, &r), 0);
  std::set<void *> slots;
  for (int i = 0; i < 3; i++) {
    void *s = ckptio_ring_acquire(r);
    EXPECT_EQ((uintptr_t)s % CKPTIO_IO_ALIGN, 0u);
    slots.insert(s);
  }
  EXPECT_EQ(slots.size(), 3u);
  std::atomic<bool> got{false};
  std::thread t([&] {
    void *s = ckptio_ring_acquire(r);
    got = true;
    ckptio_ring_release(r, s);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(got.load()) << "acquire must block while every slot is out";
  ckptio_ring_release(r, *slots.begin());
  t.join();
  EXPECT_TRUE(got.load());
  for (auto it = std::next(slots.begin()); it != slots.end(); ++it) ckptio_ring_release(r, *it);
  ckptio_ring_free(r);
  EXPECT_EQ(ckptio_ring_create(2, 1000, 0, &r), -EINVAL);
}

// A small save touches a few KiB of the first slot handed out: as a huge
// page, that first touch would zero 2 MiB (a third of a one-shot small
// save). The rest of the ring keeps its huge pages.
TEST(Ring, TheFirstSlotIsInSmallPagesTheRestInHugePages) {
  ckptio_ring *r;
  ASSERT_EQ(ckptio_ring_create(4, 8 << 20, 0, &r), 0);
  unsigned char *base = (unsigned char *)ckptio_ring_base(r);
  void *first = ckptio_ring_acquire(r);
  EXPECT_EQ(first, base);
  EXPECT_EQ(thp_eligible(base), 0);
  EXPECT_EQ(thp_eligible(base + (2 << 20) - 1), 0);
  std::string mode = thp_mode();  // empty: a kernel without transparent huge pages
  if (!mode.empty() && mode.find("[never]") == std::string::npos) {
    EXPECT_EQ(thp_eligible(base + (2 << 20)), 1);
    EXPECT_EQ(thp_eligible(base + (32 << 20) - 1), 1);
  } else {
    std::printf("transparent huge pages are off here: only the small pages were checked\n");
  }
  ckptio_ring_release(r, first);
  ckptio_ring_free(r);
}
