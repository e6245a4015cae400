/* The pipelines' GPU verbs (transfer.h) over the device table. */
#include "device/transfer.h"

#include <stdio.h>

#include "core/error.h"

int ckptio_gpu_mark_callers(ckptio_gpu *g, uint64_t mask, void *const *streams, void **events, char *err,
                            size_t errlen) {
  int current = 0, e = g->ops->get_device(&current), rc = 0;
  if (e) return ckptio_gpu_fail(g, e, err, errlen, "cudaGetDevice");
  for (int ord = 0; ord < CKPTIO_GPU_MAX && !rc; ord++) {
    if (!(mask >> ord & 1)) continue;
    ckptio_gpu_dev *v;
    if ((rc = ckptio_gpu_select(g, ord, &v, err, errlen))) break;
    if ((e = g->ops->event_create(&events[ord])))
      rc = ckptio_gpu_fail(g, e, err, errlen, "cudaEventCreateWithFlags");
    else if ((e = g->ops->event_record(events[ord], streams[ord])))
      rc = ckptio_gpu_fail(g, e, err, errlen, "cudaEventRecord (caller's stream)");
  }
  g->ops->set_device(current);
  return rc;
}

int ckptio_gpu_wait_marks(ckptio_gpu *g, uint64_t mask, ckptio_gpu_dir dir, void *const *events, char *err,
                          size_t errlen) {
  for (int ord = 0; ord < CKPTIO_GPU_MAX; ord++) {
    if (!(mask >> ord & 1)) continue;
    ckptio_gpu_dev *v;
    int rc = ckptio_gpu_select(g, ord, &v, err, errlen), e;
    if (rc) return rc;
    if ((e = g->ops->stream_wait_event(dir == CKPTIO_GPU_H2D ? v->h2d : v->d2h, events[ord])))
      return ckptio_gpu_fail(g, e, err, errlen, "cudaStreamWaitEvent");
  }
  return 0;
}

int ckptio_gpu_after_callers(ckptio_gpu *g, uint64_t mask, void *const *streams, ckptio_gpu_dir dir,
                             void **events, char *err, size_t errlen) {
  int current = 0, e = g->ops->get_device(&current);
  if (e) return ckptio_gpu_fail(g, e, err, errlen, "cudaGetDevice");
  int rc = ckptio_gpu_mark_callers(g, mask, streams, events, err, errlen);
  if (rc == 0) rc = ckptio_gpu_wait_marks(g, mask, dir, events, err, errlen);
  g->ops->set_device(current); /* wait_marks moved it */
  return rc;
}

void ckptio_gpu_events_free(ckptio_gpu *g, void **events) {
  for (int ord = 0; g && ord < CKPTIO_GPU_MAX; ord++)
    if (events[ord]) g->ops->event_destroy(events[ord]), events[ord] = NULL;
}

int ckptio_gpu_h2d_start(ckptio_gpu *g, int gpu, size_t slot, void *dst, const void *src, size_t n, char *err,
                         size_t errlen) {
  ckptio_gpu_dev *v;
  int rc = ckptio_gpu_select(g, gpu, &v, err, errlen);
  if (rc) return rc;
  const char *call = "cudaMemcpyAsync (host to device)";
  int e = g->ops->copy_h2d(dst, src, n, v->h2d);
  if (!e) call = "cudaEventRecord", e = g->ops->event_record(v->slot_events[slot], v->h2d);
  return e ? ckptio_gpu_fail(g, e, err, errlen, call) : 0;
}

int ckptio_gpu_h2d_slot(ckptio_gpu *g, int gpu, size_t slot, void *dst, const void *src, size_t n, char *err,
                        size_t errlen) {
  int rc = ckptio_gpu_h2d_start(g, gpu, slot, dst, src, n, err, errlen), e;
  if (rc == 0 && (e = g->ops->event_sync(g->dev[gpu].slot_events[slot])))
    rc = ckptio_gpu_fail(g, e, err, errlen, "cudaEventSynchronize");
  return rc;
}

int ckptio_gpu_register(ckptio_gpu *g, const void *p, size_t n, int read_only, char *err, size_t errlen) {
  int e = g->ops->host_register((void *)p, n, read_only);
  return e ? ckptio_gpu_fail(g, e, err, errlen, "cudaHostRegister") : 0;
}

int ckptio_gpu_unregister_checked(ckptio_gpu *g, const void *p, char *err, size_t errlen) {
  int e = g->ops->host_unregister((void *)p);
  return e ? ckptio_gpu_fail(g, e, err, errlen, "cudaHostUnregister") : 0;
}

void ckptio_gpu_unregister(ckptio_gpu *g, const void *p) { (void)ckptio_gpu_unregister_checked(g, p, NULL, 0); }

int ckptio_gpu_where(ckptio_gpu *g, const void *p, int *ordinal, char *err, size_t errlen) {
  int e = g->ops->pointer_device(p, ordinal);
  return e ? ckptio_gpu_fail(g, e, err, errlen, "cudaPointerGetAttributes") : 0;
}

int ckptio_gpu_d2h_start(ckptio_gpu *g, int gpu, void *dst, const void *src, size_t n, char *err,
                         size_t errlen) {
  ckptio_gpu_dev *v;
  int rc = ckptio_gpu_select(g, gpu, &v, err, errlen);
  if (rc < 0) return rc;
  int e = g->ops->copy_d2h(dst, src, n, v->d2h);
  return e ? ckptio_gpu_fail(g, e, err, errlen, "cudaMemcpyAsync (device to host)") : 0;
}

int ckptio_gpu_mark_slot(ckptio_gpu *g, uint64_t mask, size_t slot, char *err, size_t errlen) {
  for (int ord = 0; ord < CKPTIO_GPU_MAX; ord++) {
    if (!(mask >> ord & 1)) continue;
    ckptio_gpu_dev *v;
    int e, rc = ckptio_gpu_select(g, ord, &v, err, errlen);
    if (rc < 0) return rc;
    if ((e = g->ops->event_record(v->slot_events[slot], v->d2h)))
      return ckptio_gpu_fail(g, e, err, errlen, "cudaEventRecord");
  }
  return 0;
}

int ckptio_gpu_wait_slot(ckptio_gpu *g, uint64_t mask, size_t slot, char *err, size_t errlen) {
  for (int ord = 0; ord < CKPTIO_GPU_MAX; ord++) {
    if (!(mask >> ord & 1)) continue;
    /* The event exists: mark_slot or h2d_start made this GPU ready. No device switch:
     * an event is waited for from any current GPU. */
    int e = g->ops->event_sync(g->dev[ord].slot_events[slot]);
    if (e) {
      char what[64];
      snprintf(what, sizeof(what), "GPU %d: cudaEventSynchronize (staging copy)", ord);
      return ckptio_gpu_fail(g, e, err, errlen, what);
    }
  }
  return 0;
}

void ckptio_gpu_drain_d2h(ckptio_gpu *g, uint64_t mask) {
  for (int ord = 0; ord < CKPTIO_GPU_MAX && ord < g->ndev; ord++)
    if (mask >> ord & 1 && g->dev[ord].d2h) g->ops->set_device(ord), g->ops->stream_sync(g->dev[ord].d2h);
}

int ckptio_gpu_copy_sync(ckptio_gpu *g, int gpu, ckptio_gpu_dir dir, void *dst, const void *src, size_t n,
                         char *err, size_t errlen) {
  int current = 0, e = g->ops->get_device(&current);
  if (e) return ckptio_gpu_fail(g, e, err, errlen, "cudaGetDevice");
  ckptio_gpu_dev *v;
  int rc = ckptio_gpu_select(g, gpu, &v, err, errlen);
  if (rc == 0) {
    void *stream = dir == CKPTIO_GPU_H2D ? v->h2d : v->d2h;
    e = dir == CKPTIO_GPU_H2D ? g->ops->copy_h2d(dst, src, n, stream) : g->ops->copy_d2h(dst, src, n, stream);
    if (e)
      rc = ckptio_gpu_fail(g, e, err, errlen,
                           dir == CKPTIO_GPU_H2D ? "cudaMemcpyAsync (host to device)" : "cudaMemcpyAsync (device to host)");
    else if ((e = g->ops->stream_sync(stream)))
      rc = ckptio_gpu_fail(g, e, err, errlen, "cudaStreamSynchronize");
  }
  g->ops->set_device(current);
  return rc;
}

int ckptio_gpu_name(ckptio_gpu *g, int gpu, char *buf, size_t len, char *err, size_t errlen) {
  int e = g->ops->device_name(gpu, buf, len > 0x7fffffff ? 0x7fffffff : (int)len);
  return e ? ckptio_gpu_fail(g, e, err, errlen, "cudaGetDeviceProperties") : 0;
}

const char *ckptio_gpu_runtime_file(const ckptio_gpu *g) { return g->ops->runtime_file(); }

int ckptio_gpu_pci_bus_id(ckptio_gpu *g, int gpu, char *buf, size_t len, char *err, size_t errlen) {
  int e = g->ops->pci_bus_id(gpu, buf, len > 0x7fffffff ? 0x7fffffff : (int)len);
  return e ? ckptio_gpu_fail(g, e, err, errlen, "cudaDeviceGetPCIBusId") : 0;
}

int ckptio_gpu_alloc(ckptio_gpu *g, int gpu, size_t n, void **p, char *err, size_t errlen) {
  int e = g->ops->mem_alloc(gpu, n, p);
  return e ? ckptio_gpu_fail(g, e, err, errlen, "cudaMalloc") : 0;
}

int ckptio_gpu_free(ckptio_gpu *g, int gpu, void *p, char *err, size_t errlen) {
  int e = g->ops->mem_free(gpu, p);
  return e ? ckptio_gpu_fail(g, e, err, errlen, "cudaFree") : 0;
}
