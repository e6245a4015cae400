/* Spans of the pipelines' stages, for profilers (issue 44): each span is
 * one stage (a chunk's snapshot, a write, the commit; a load's read, its
 * copy to a GPU) begun and ended on the calling thread. Two sinks:
 *   - a trace file in the Chrome trace-event format (a JSON array of "X"
 *     events, one per span, and "M" events naming the threads), opened by
 *     CKPTIO_TRACE=FILE at the first context or by ckptio_trace_start, and
 *     closed (made valid JSON) by ckptio_trace_stop or at exit;
 *   - NVTX ranges in the domain "ckptio" (trace_nvtx.c), on when a tool
 *     injects NVTX (Nsight Systems sets NVTX_INJECTION64_PATH).
 * With both off a span costs one load of a global flag and a branch. */
#ifndef CKPTIO_CORE_TRACE_H
#define CKPTIO_CORE_TRACE_H

#include <stdatomic.h>
#include <stdint.h>

enum { CKPTIO_TRACE_FILE = 1, CKPTIO_TRACE_NVTX = 2 };

/* The sinks on (CKPTIO_TRACE_*); read on every span, hence a global. */
extern _Atomic int ckptio_trace_sinks;

/* A span begun: its name (a string literal: kept, never copied), its start
 * and the sinks it was begun in (ended in the same ones: an NVTX range
 * pushed is popped even if tracing stopped meanwhile). */
typedef struct ckptio_span {
  const char *name;
  uint64_t t0;
  int sinks;
} ckptio_span;

ckptio_span ckptio_trace_begin_on(const char *name, int sinks);
void ckptio_trace_end_on(const ckptio_span *s, uint64_t bytes, const char *detail);

static inline ckptio_span ckptio_trace_begin(const char *name) {
  int sinks = atomic_load_explicit(&ckptio_trace_sinks, memory_order_relaxed);
  if (__builtin_expect(sinks == 0, 1)) return (ckptio_span){name, 0, 0};
  return ckptio_trace_begin_on(name, sinks);
}

/* Ends s; bytes (0: none) and detail (NULL: none; a path, a tensor name:
 * copied) go into the file event's args. */
static inline void ckptio_trace_end(const ckptio_span *s, uint64_t bytes, const char *detail) {
  if (__builtin_expect(s->sinks != 0, 0)) ckptio_trace_end_on(s, bytes, detail);
}

/* Names the calling thread ("ckptio worker"), in the trace file and for
 * the system (pthread_setname_np: what Nsight, perf and gdb show). */
void ckptio_trace_thread_name(const char *name);

/* Once per process, at the first context: CKPTIO_TRACE and NVTX. */
void ckptio_trace_init(void);

/* trace_nvtx.c: whether NVTX is injected (loads the tool once), and a
 * range of the domain "ckptio" pushed and popped on the calling thread. */
int ckptio_nvtx_start(void);
void ckptio_nvtx_push(const char *name);
void ckptio_nvtx_pop(void);

#endif
