/* ckptio_stats from the pipelines' timers. */
#include "core/stats.h"

#include <string.h>

int ckptio_timers_report(const ckptio_timers *t, uint64_t bytes, int threads, uint64_t staging,
                         ckptio_stats *out) {
  if (!out || out->size < sizeof(size_t)) return CKPTIO_E_INVALID_ARG;
  ckptio_stats s;
  memset(&s, 0, sizeof(s));
  s.size = out->size < sizeof(s) ? out->size : sizeof(s);
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
  memcpy(out, &s, s.size);
  return 0;
}
