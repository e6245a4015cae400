/* ckptio_stats from the pipelines' timers. */
#include "core/stats.h"

#include "core/sized.h"

int ckptio_timers_report(const ckptio_timers *t, uint64_t bytes, int threads, uint64_t staging,
                         ckptio_stats *out) {
  ckptio_stats s = CKPTIO_STATS_INIT;
  s.bytes = bytes;
  uint64_t end = t->end_ns ? t->end_ns : ckptio_now_ns();
  s.seconds = t->start_ns ? (double)(end - t->start_ns) / 1e9 : 0;
  s.snapshot_seconds = t->snapshot_ns ? (double)(t->snapshot_ns - t->start_ns) / 1e9 : 0;
  s.device_seconds = (double)atomic_load(&t->device_ns) / 1e9;
  s.copy_seconds = (double)atomic_load(&t->copy_ns) / 1e9;
  s.write_seconds = (double)atomic_load(&t->write_ns) / 1e9;
  s.commit_seconds = (double)atomic_load(&t->commit_ns) / 1e9;
  s.threads = threads;
  s.staging_bytes = staging;
  s.direct_bytes = atomic_load(&t->direct_bytes);
  s.load_methods = atomic_load(&t->methods);
  return ckptio_sized_out(out, &s, sizeof(s), "ckptio_stats", NULL, 0);
}
