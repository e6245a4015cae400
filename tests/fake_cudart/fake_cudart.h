/* Test controls of the fake CUDA runtime (libfake_cudart.so, also installed
 * as libcudart.so.13 in its build directory): counters, fault injection, a
 * copy-engine hold and leak accounting. Plain C. Call these by linking the
 * fake, or through dlsym on the handle that dlopened it; both name the same
 * instance because libcudart.so.13 is a symlink to the one file.
 *
 * Every function here may be called from any thread, concurrently with the
 * CUDA entry points. */
#ifndef FAKE_CUDART_H
#define FAKE_CUDART_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A snapshot of the fake's accounting. Set `size` first (FAKE_CUDART_STATS_INIT)
 * so that a caller built against an older copy of this header still works. */
struct fake_cudart_stats {
  size_t size;
  /* Counters since process start or the last fake_cudart_reset_stats(). */
  uint64_t async_copies;      /* cudaMemcpyAsync calls accepted */
  uint64_t sync_copies;       /* cudaMemcpy calls accepted */
  uint64_t pageable_copies;   /* device<->host copies whose host side is neither
                                 pinned nor registered (still done, still async) */
  uint64_t memsets;           /* cudaMemset / cudaMemsetAsync calls accepted */
  uint64_t bytes_h2d, bytes_d2h, bytes_d2d, bytes_h2h;
  uint64_t frees_while_busy;  /* cudaFree / cudaFreeHost / cudaHostUnregister of
                                 memory that a queued copy still used (the call
                                 waited for it, as real CUDA's implicit sync does) */
  uint64_t exec_failures;     /* queued operations failed by an ":exec" rule */
  /* Live objects (not reset). */
  uint64_t pinned_allocs, pinned_bytes;         /* cudaHostAlloc / cudaMallocHost */
  uint64_t registered_ranges, registered_bytes; /* cudaHostRegister */
  uint64_t device_allocs, device_bytes;         /* cudaMalloc, all devices */
  uint64_t streams, events;                     /* created and not destroyed */
  /* High-water marks since start or reset (a reset restarts them at the live value). */
  uint64_t peak_pinned_bytes;  /* pinned allocations */
  uint64_t peak_locked_bytes;  /* pinned allocations + registered ranges */
  uint64_t peak_device_bytes;
};

#ifdef __cplusplus
#define FAKE_CUDART_STATS_INIT fake_cudart_stats_init()
static inline struct fake_cudart_stats fake_cudart_stats_init(void) {
  struct fake_cudart_stats s = {};
  s.size = sizeof s;
  return s;
}
#else
#define FAKE_CUDART_STATS_INIT {.size = sizeof(struct fake_cudart_stats)}
#endif

/* Fills *st (up to st->size bytes). @return 0, or -EINVAL when st is NULL or
 * st->size is too small to hold the size field. */
int fake_cudart_stats(struct fake_cudart_stats *st);

/* Zeroes the counters and per-function call counts, restarts the peaks at
 * the live values, and clears sticky execution errors on every stream and
 * device. Fault rules stay. */
void fake_cudart_reset_stats(void);

/* Makes the nth call (1-based, counted from now) of `func` return `err`
 * without doing anything; nth == 0 means every call from now on. err == 0
 * removes the rules for func; func == NULL removes all rules. Restarts every
 * call count. `func` is a CUDA entry point of the fake ("cudaMemcpyAsync";
 * a _ptds / _ptsz name means the same function). @return 0 or -EINVAL. */
int fake_cudart_set_fail(const char *func, long nth, int err);

/* Replaces all rules with those of `spec`, the FAKE_CUDART_FAIL syntax:
 * comma-separated "func:nth:error[:exec]", error by name
 * ("cudaErrorLaunchFailure") or number. ":exec" (cudaMemcpyAsync, cudaMemcpy,
 * cudaMemsetAsync, cudaMemset only) accepts the call and fails the operation
 * when the stream runs it: nothing is copied, and the error sticks to the
 * stream and device, returned by every later sync of them, by the events
 * recorded after it and by later enqueues on that stream, until
 * fake_cudart_reset_stats(). Restarts every call count. @return 0 or -EINVAL
 * (the rules are then unchanged). */
int fake_cudart_set_fail_spec(const char *spec);

/* Calls of `func` since the last reset / set_fail, or -1 for an unknown name. */
long fake_cudart_calls(const char *func);

/* Microseconds each copy and memset sleeps before it runs (default
 * FAKE_CUDART_DELAY_US or 2000). Applies to operations started afterwards. */
void fake_cudart_set_delay_us(long us);

/* The modeled bandwidth of copies and memsets, in MB/s (10^6 bytes): each
 * operation of n bytes takes at least n / bandwidth after its delay, as one
 * copy engine per stream would (default FAKE_CUDART_MBPS or 20000, PCIe 4.0
 * x16 in one direction; 0: as fast as memcpy). Applies to operations
 * started afterwards. */
void fake_cudart_set_bandwidth_mbps(long mbps);

/* hold(1): queued copies and memsets do not start until hold(0); event
 * records and waits queued behind them wait too. Lets a test observe the
 * "not yet copied" state deterministically. While held, anything that waits
 * for a queued copy (a sync, cudaMemcpy, cudaMemset, freeing or unregistering
 * memory a queued copy uses) blocks until hold(0) from another thread. */
void fake_cudart_hold(int on);

/* Prints every live pinned allocation, registered range, device allocation,
 * stream and event to stderr. @return how many there are. The same check
 * runs at exit when FAKE_CUDART_REPORT_LEAKS=1 and then _exit(3)s if any.
 * Before it, with FAKE_CUDART_STATS_FILE=path, the fields of
 * struct fake_cudart_stats are written to path as "name value" lines, for a
 * test that runs the library in another process. */
int fake_cudart_leaks(void);

#ifdef __cplusplus
}
#endif

#endif
