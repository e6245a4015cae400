/* Stage timing for ckptio_stats: busy nanoseconds summed across threads in
 * atomics, so workers add to them without locks. */
#ifndef CKPTIO_CORE_STATS_H
#define CKPTIO_CORE_STATS_H

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "ckptio.h"

typedef struct ckptio_timers {
  _Atomic uint64_t device_ns, copy_ns, write_ns, commit_ns;
  _Atomic uint64_t direct_bytes; /* moved with no staging copy */
  _Atomic uint32_t methods;      /* load: 1 << each ckptio_load_method the jobs used */
  uint64_t start_ns, snapshot_ns, end_ns;
} ckptio_timers;

static inline uint64_t ckptio_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Adds the time since *since to *acc and moves *since to now. */
static inline void ckptio_lap(_Atomic uint64_t *acc, uint64_t *since) {
  uint64_t now = ckptio_now_ns();
  atomic_fetch_add_explicit(acc, now - *since, memory_order_relaxed);
  *since = now;
}

/* Fills the public struct (up to its size) from the timers. */
int ckptio_timers_report(const ckptio_timers *t, uint64_t bytes, int threads, uint64_t staging,
                         ckptio_stats *out);

#endif
