/* Shared state of the fake CUDA runtime. One mutex (fc_lock) guards all of
 * it: devices, host ranges, streams, events, counters and fault rules; stream
 * workers drop it only to sleep and copy. Everything named fc_* stays local
 * to the library through fake_cudart.map. */
#ifndef FAKE_CUDART_INTERNAL_H
#define FAKE_CUDART_INTERNAL_H

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "fake_cudart.h"

/* The entry points of the subset, for call counting and fault rules. */
#define FC_FUNCS(X)                                                                  \
  X(cudaGetDeviceCount) X(cudaSetDevice) X(cudaGetDevice) X(cudaMalloc) X(cudaFree)  \
  X(cudaHostAlloc) X(cudaFreeHost) X(cudaMallocHost) X(cudaHostRegister)             \
  X(cudaHostUnregister) X(cudaStreamCreateWithFlags) X(cudaStreamDestroy)            \
  X(cudaStreamSynchronize) X(cudaStreamWaitEvent) X(cudaEventCreateWithFlags)        \
  X(cudaEventDestroy) X(cudaEventRecord) X(cudaEventSynchronize) X(cudaEventQuery)   \
  X(cudaEventElapsedTime) X(cudaMemcpyAsync) X(cudaMemcpy) X(cudaMemsetAsync)        \
  X(cudaMemset) X(cudaDeviceSynchronize) X(cudaPointerGetAttributes)                 \
  X(cudaGetLastError) X(cudaRuntimeGetVersion) X(cudaDriverGetVersion)               \
  X(cudaDeviceGetPCIBusId) X(cudaGetDeviceProperties)

enum fc_fn {
#define FC_ENUM(n) FC_##n,
  FC_FUNCS(FC_ENUM)
#undef FC_ENUM
  FC_NFN
};

/* ------------------------------------------------------------ faults.c */

struct fc_config {
  int ndev;               /* FAKE_CUDART_DEVICES */
  size_t mem_bytes;       /* FAKE_CUDART_MEM_MB, per device */
  int driver_version;     /* FAKE_CUDART_DRIVER_VERSION */
};
extern struct fc_config fc_cfg;
extern pthread_mutex_t fc_lock;
extern pthread_cond_t fc_progress;  /* broadcast whenever a queued op completes */
extern struct fake_cudart_stats fc_st;
extern long fc_delay_us;            /* atomic */
extern long fc_mbps;                /* atomic: modeled copy bandwidth, MB/s (0: unlimited) */
extern int fc_held;                 /* fake_cudart_hold; under fc_lock */

/* Reads the environment once (aborts on a malformed FAKE_CUDART_FAIL). */
void fc_init(void);

/* Starts an API call: counts it and applies the fault rules. @return the
 * injected error, or cudaSuccess. With exec_err non-NULL an ":exec" rule
 * stores its error there and the call proceeds. Takes fc_lock itself. */
cudaError_t fc_enter(enum fc_fn fn, cudaError_t *exec_err);

/* Records e as the calling thread's last error (not cudaSuccess or
 * cudaErrorNotReady) and returns it. */
cudaError_t fc_ret(cudaError_t e);
cudaError_t fc_take_last_error(void);

const char *fc_error_name(cudaError_t e);
const char *fc_error_string(cudaError_t e);
void fc_faults_reset_counts(void);  /* under fc_lock */

/* Peaks follow the live counters; call after changing them, under fc_lock. */
void fc_note_peaks(void);

/* ------------------------------------------------------------ memory.c */

struct fc_alloc {
  size_t off, size;       /* size as requested; the next one starts 256-aligned */
};

struct fc_dev {
  int ready;              /* arena mapped */
  int fd;
  char *dview;            /* PROT_NONE: the addresses cudaMalloc hands out */
  char *hview;            /* read-write alias used by the copy engine only */
  size_t size;
  struct fc_alloc *allocs;/* sorted by off */
  size_t nallocs, cap;
  size_t cursor;          /* next-fit start */
  struct fc_stream *null_stream; /* the default stream, created on first use */
  cudaError_t sticky;     /* first execution error of any stream on this device */
};
extern struct fc_dev *fc_devs;  /* [fc_cfg.ndev] */

enum { FC_MEM_BAD = -1, FC_MEM_HOST = 0, FC_MEM_DEVICE = 1 };

/* Under fc_lock. Classifies [p, p + n): FC_MEM_DEVICE when inside one live
 * device allocation (*dev, *access = the read-write alias), FC_MEM_HOST when
 * outside every arena (*access = p), FC_MEM_BAD when it touches an arena but
 * not inside a live allocation. */
int fc_classify(const void *p, size_t n, int *dev, char **access);
/* Under fc_lock: [p, p + n) lies inside one pinned or registered range that
 * counts as pinned for a copy on device dev. */
int fc_host_locked(const void *p, size_t n, int dev);
/* [p, p + n) is mapped (not checked: that it is writable). */
int fc_host_mapped(const void *p, size_t n);
void fc_memory_leaks(int *count);   /* under fc_lock; prints */

/* ------------------------------------------------------------ streams.c */

struct fc_stream;

/* Under fc_lock: the stream a handle names; 0, cudaStreamLegacy and
 * cudaStreamPerThread are the current device's default stream. */
cudaError_t fc_stream_get(cudaStream_t h, struct fc_stream **out);
int fc_stream_device(const struct fc_stream *s);
cudaError_t fc_stream_sticky(const struct fc_stream *s);
/* Under fc_lock: queues a copy (memset when src is NULL) of n bytes between
 * the alias addresses, udst / usrc being the caller's. @return the stream's
 * sticky error or cudaErrorMemoryAllocation, else cudaSuccess and *ticket. */
cudaError_t fc_stream_push_copy(struct fc_stream *s, char *dst, const char *src, int value,
                                size_t n, uintptr_t udst, uintptr_t usrc, cudaError_t exec_err,
                                uint64_t *ticket);
/* Under fc_lock: waits until the stream has run everything up to ticket. */
void fc_stream_wait(struct fc_stream *s, uint64_t ticket);

/* Under fc_lock: blocks until no queued operation touches [a, a + n).
 * @return 1 if it had to wait. */
int fc_wait_range_idle(uintptr_t a, size_t n);
void fc_streams_clear_sticky(void); /* under fc_lock */
void fc_streams_leaks(int *count);  /* under fc_lock; prints */

/* ------------------------------------------------------------ api.c */

int fc_current_device(void);
/* cudaSuccess, or cudaErrorNoDevice when FAKE_CUDART_DEVICES=0. */
cudaError_t fc_need_device(void);

#endif
