/* A context's GPU state: the loaded device table, a device-to-host and a
 * host-to-device copy stream per GPU and one event per (GPU, staging slot),
 * created on first use and reused by every save and load, and the staging
 * ring pinned (registered) for async DMA. */
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
  void *pinned;          /* the registered ring, or NULL */
  pthread_mutex_t mu;
} ckptio_gpu;

/* Loads the CUDA table and pins [ring, ring + ring_bytes). @return 0, or
 * CKPTIO_E_DEVICE with "CUDA unavailable: <reason>" in err. */
int ckptio_gpu_open(ckptio_gpu **out, void *ring, size_t ring_bytes, size_t nslots, char *err,
                    size_t errlen);
/* Synchronises and destroys the streams and events, unpins. Accepts NULL. */
void ckptio_gpu_close(ckptio_gpu *g);

/* Makes `ordinal` current in the calling thread and returns its streams,
 * creating them on first use. @return 0 or a runtime error number. */
int ckptio_gpu_use(ckptio_gpu *g, int ordinal, ckptio_gpu_dev **out);
/* The same, with *call set to the runtime call that failed
 * ("cudaSetDevice", "cudaStreamCreate", "cudaEventCreate"). */
int ckptio_gpu_use_call(ckptio_gpu *g, int ordinal, ckptio_gpu_dev **out, const char **call);

/* Formats "what: <runtime error name>" into err; @return CKPTIO_E_DEVICE. */
int ckptio_gpu_fail(const ckptio_gpu *g, int rt_err, char *err, size_t errlen, const char *what);

#endif
