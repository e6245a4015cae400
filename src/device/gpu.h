/* A context's GPU state: the loaded device table, a device-to-host and a
 * host-to-device copy stream per GPU and one event per (GPU, staging slot),
 * created on first use and reused by every save and load, and the staging
 * ring pinned (registered) for async DMA: at the first use of any GPU, so a
 * context on a GPU machine that only ever saves and loads host memory pins
 * (and touches) nothing; when the ring holds snapshot memory, by the
 * context's preparing thread once it has faulted that memory in. */
#ifndef CKPTIO_DEVICE_GPU_H
#define CKPTIO_DEVICE_GPU_H

#include <pthread.h>
#include <stddef.h>

#include "device/device.h"

typedef struct ckptio_gpu_dev {
  void *d2h, *h2d;       /* copy streams */
  void **slot_events;    /* [slot] */
  int ready;
} ckptio_gpu_dev;

typedef struct ckptio_gpu {
  const ckptio_device_ops *ops;
  int ndev;
  ckptio_gpu_dev *dev;   /* [ndev] */
  size_t nslots;
  void *ring;            /* the staging ring ... */
  size_t ring_bytes;     /* ... and its size */
  int ring_pinned;       /* registered (cudaHostRegister) */
  pthread_mutex_t mu;
} ckptio_gpu;

/* Loads the CUDA table; [ring, ring + ring_bytes) is pinned by
 * ckptio_gpu_pin or at the first ckptio_gpu_select. @return 0, or
 * CKPTIO_E_DEVICE with "CUDA unavailable: <reason>" in err. */
int ckptio_gpu_open(ckptio_gpu **out, void *ring, size_t ring_bytes, size_t nslots, char *err, size_t errlen);
/* Pins the ring now (from any thread: a GPU copy that starts meanwhile
 * waits for it). @return 0 or a runtime error number; a failure is tried
 * again, and reported, by the first GPU use. */
int ckptio_gpu_pin(ckptio_gpu *g);
/* Synchronises and destroys the streams and events, unpins. Accepts NULL. */
void ckptio_gpu_close(ckptio_gpu *g);

/* Makes `ordinal` current in the calling thread and returns its streams,
 * creating them (and pinning the ring) on first use. @return 0, or
 * CKPTIO_E_DEVICE with "<runtime call>: <runtime error name>" in err, the call
 * being the one that failed (cudaSetDevice, cudaHostRegister,
 * cudaStreamCreateWithFlags, cudaEventCreateWithFlags). */
int ckptio_gpu_select(ckptio_gpu *g, int ordinal, ckptio_gpu_dev **out, char *err, size_t errlen);
/* Formats "what: <runtime error name>" into err, or "what: <call>:
 * <runtime error name>" when the runtime call that failed with rt_err in
 * this thread is not already named in what; @return CKPTIO_E_DEVICE. */
int ckptio_gpu_fail(const ckptio_gpu *g, int rt_err, char *err, size_t errlen, const char *what);

#endif
