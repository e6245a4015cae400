/* GPU state of a context. Streams and events are created lazily, per GPU,
 * under one mutex, because a context may never touch most GPUs of a node;
 * once created they live as long as the context so saves pay nothing. */
#include "device/gpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckptio.h"
#include "core/error.h"

int ckptio_gpu_fail(const ckptio_gpu *g, int rt_err, char *err, size_t errlen, const char *what) {
  const char *call = g->ops->failed_call ? g->ops->failed_call(rt_err) : NULL;
  if (call && !strstr(what, call))
    return ckptio_err_fmt(err, errlen, CKPTIO_E_DEVICE, "%s: %s: %s", what, call, g->ops->error_name(rt_err));
  return ckptio_err_fmt(err, errlen, CKPTIO_E_DEVICE, "%s: %s", what, g->ops->error_name(rt_err));
}

/* Under g->mu (or before g is shared). */
static int pin_ring(ckptio_gpu *g) {
  if (g->ring_pinned) return 0;
  int e = g->ops->host_register(g->ring, g->ring_bytes, 0);
  g->ring_pinned = !e;
  return e;
}

int ckptio_gpu_pin(ckptio_gpu *g) {
  pthread_mutex_lock(&g->mu);
  int e = pin_ring(g);
  pthread_mutex_unlock(&g->mu);
  return e;
}

int ckptio_gpu_open(ckptio_gpu **out, void *ring, size_t ring_bytes, size_t nslots, char *err, size_t errlen) {
  *out = NULL;
  const char *why = "";
  const ckptio_device_ops *ops = ckptio_cuda_ops(&why);
  if (!ops) return ckptio_err_fmt(err, errlen, CKPTIO_E_DEVICE, "CUDA unavailable: %s", why);
  ckptio_gpu *g = calloc(1, sizeof(*g));
  if (!g) return ckptio_err_fmt(err, errlen, CKPTIO_E_DEVICE, "CUDA unavailable: out of memory");
  g->ops = ops;
  g->nslots = nslots;
  g->ring = ring;
  g->ring_bytes = ring_bytes;
  pthread_mutex_init(&g->mu, NULL);
  int e = ops->count(&g->ndev);
  int rc = 0;
  if (e) {
    rc = ckptio_gpu_fail(g, e, err, errlen, "CUDA unavailable: cudaGetDeviceCount");
    goto fail;
  }
  if (!(g->dev = calloc((size_t)g->ndev + 1, sizeof(ckptio_gpu_dev)))) {
    rc = ckptio_err_fmt(err, errlen, CKPTIO_E_DEVICE, "CUDA unavailable: out of memory");
    goto fail;
  }
  *out = g;
  return 0;
fail:
  ckptio_gpu_close(g);
  return rc;
}

void ckptio_gpu_close(ckptio_gpu *g) {
  if (!g) return;
  for (int d = 0; g->dev && d < g->ndev; d++) {
    ckptio_gpu_dev *v = &g->dev[d];
    if (!v->ready && !v->d2h && !v->h2d && !v->slot_events) continue;
    g->ops->set_device(d);
    if (v->d2h) g->ops->stream_sync(v->d2h), g->ops->stream_destroy(v->d2h);
    if (v->h2d) g->ops->stream_sync(v->h2d), g->ops->stream_destroy(v->h2d);
    for (size_t s = 0; v->slot_events && s < g->nslots; s++)
      if (v->slot_events[s]) g->ops->event_destroy(v->slot_events[s]);
    free(v->slot_events);
  }
  if (g->ring_pinned) g->ops->host_unregister(g->ring);
  free(g->dev);
  pthread_mutex_destroy(&g->mu);
  free(g);
}

/* Creates whatever is still missing, so a retry after a failure neither
 * leaks nor duplicates. *call names what failed. */
static int create_dev(ckptio_gpu *g, ckptio_gpu_dev *v, const char **call) {
  int e;
  *call = "cudaStreamCreateWithFlags";
  if (!v->d2h && (e = g->ops->stream_create(&v->d2h))) return e;
  if (!v->h2d && (e = g->ops->stream_create(&v->h2d))) return e;
  *call = "calloc (slot events)";
  if (!v->slot_events && !(v->slot_events = calloc(g->nslots, sizeof(void *))))
    return 2; /* cudaErrorMemoryAllocation */
  *call = "cudaEventCreateWithFlags";
  for (size_t s = 0; s < g->nslots; s++)
    if (!v->slot_events[s] && (e = g->ops->event_create(&v->slot_events[s]))) return e;
  v->ready = 1;
  return 0;
}

/* @return 0 or a runtime error number, with *call the call that failed. */
static int use(ckptio_gpu *g, int ordinal, ckptio_gpu_dev **out, const char **call) {
  *call = "cudaSetDevice";
  if (ordinal < 0 || ordinal >= g->ndev) return 101; /* cudaErrorInvalidDevice */
  int e = g->ops->set_device(ordinal);
  if (e) return e;
  ckptio_gpu_dev *v = &g->dev[ordinal];
  pthread_mutex_lock(&g->mu);
  *call = "cudaHostRegister (the staging ring)";
  e = pin_ring(g);
  if (!e && !v->ready) e = create_dev(g, v, call);
  pthread_mutex_unlock(&g->mu);
  *out = v;
  return e;
}

int ckptio_gpu_select(ckptio_gpu *g, int ordinal, ckptio_gpu_dev **out, char *err, size_t errlen) {
  const char *call;
  int e = use(g, ordinal, out, &call);
  if (!e) return 0;
  if (e == 101 && (ordinal < 0 || ordinal >= g->ndev))
    return ckptio_err_fmt(err, errlen, CKPTIO_E_DEVICE, "cudaSetDevice(%d): no such GPU (%d visible)",
                          ordinal, g->ndev);
  return ckptio_err_fmt(err, errlen, CKPTIO_E_DEVICE, "%s: %s", call, g->ops->error_name(e));
}
