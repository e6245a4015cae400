/* The verbs the save and load pipelines use on GPUs: order the library's
 * copy streams after the caller's stream, copy one staging slot to or from
 * a device, pin a range, ask where a pointer lives. Only src/device calls
 * the device table (ops->); everything else speaks these verbs. Every verb
 * returns 0 or CKPTIO_E_DEVICE with "<runtime call>: <runtime error name>"
 * in err, and leaves the calling thread's current GPU as it found it only
 * where it says so. */
#ifndef CKPTIO_DEVICE_TRANSFER_H
#define CKPTIO_DEVICE_TRANSFER_H

#include <stddef.h>
#include <stdint.h>

#include "device/gpu.h"

/* GPUs one save or load may touch: a bit per ordinal. */
#define CKPTIO_GPU_MAX 64

/* Which of a GPU's two copy streams. */
typedef enum { CKPTIO_GPU_D2H = 0, CKPTIO_GPU_H2D = 1 } ckptio_gpu_dir;

/* On the caller's thread: records, for each GPU in `mask`, an event on the
 * caller's stream for it (streams[ord]; NULL is the legacy default stream)
 * into events[ord] (created here; free with ckptio_gpu_events_free). The
 * caller's current GPU is restored. */
int ckptio_gpu_mark_callers(ckptio_gpu *g, uint64_t mask, void *const *streams, void **events, char *err,
                            size_t errlen);
/* Makes each GPU's `dir` copy stream wait for events[ord]: copies queued
 * there afterwards start after the caller's work that was marked. */
int ckptio_gpu_wait_marks(ckptio_gpu *g, uint64_t mask, ckptio_gpu_dir dir, void *const *events, char *err,
                          size_t errlen);
/* Both at once, on the caller's thread (what a load does as it starts). */
int ckptio_gpu_after_callers(ckptio_gpu *g, uint64_t mask, void *const *streams, ckptio_gpu_dir dir,
                             void **events, char *err, size_t errlen);
/* Destroys the events that are set and clears them. Accepts g NULL. */
void ckptio_gpu_events_free(ckptio_gpu *g, void **events);

/* Queues a copy of n bytes at src (inside staging slot `slot`, or in
 * memory registered with ckptio_gpu_register) to dst on GPU `gpu` on its
 * H2D stream and records the slot's event after it: src may be written
 * again once ckptio_gpu_wait_slot of that GPU returns. Leaves `gpu`
 * current. */
int ckptio_gpu_h2d_start(ckptio_gpu *g, int gpu, size_t slot, void *dst, const void *src, size_t n, char *err,
                         size_t errlen);
/* The same, then waits for that copy alone through the slot's event, so src
 * may be reused as soon as this returns. */
int ckptio_gpu_h2d_slot(ckptio_gpu *g, int gpu, size_t slot, void *dst, const void *src, size_t n, char *err,
                        size_t errlen);

/* Any thread: blocks until slot `slot`'s event of each GPU in `mask` has
 * completed (the copies of a save's or a load's slot). On failure err reads
 * "GPU <n>: cudaEventSynchronize ...". */
int ckptio_gpu_wait_slot(ckptio_gpu *g, uint64_t mask, size_t slot, char *err, size_t errlen);

/* Pins / unpins an existing host range for async DMA. The pipelines unpin
 * best effort; the checked form says why an unpin failed (a range never
 * pinned). */
int ckptio_gpu_register(ckptio_gpu *g, const void *p, size_t n, int read_only, char *err, size_t errlen);
void ckptio_gpu_unregister(ckptio_gpu *g, const void *p);
int ckptio_gpu_unregister_checked(ckptio_gpu *g, const void *p, char *err, size_t errlen);

/* *ordinal: -1 for host memory (pinned or not), else the GPU holding p. */
int ckptio_gpu_where(ckptio_gpu *g, const void *p, int *ordinal, char *err, size_t errlen);

/* ---- save side: device -> staging slot, and the context's needs ---- */

/* Queues an async copy of n bytes from src on GPU `gpu` to dst (pinned
 * staging) on that GPU's D2H stream; it completes when the slot's event on
 * that GPU (ckptio_gpu_mark_slot) does. Leaves `gpu` current. */
int ckptio_gpu_d2h_start(ckptio_gpu *g, int gpu, void *dst, const void *src, size_t n, char *err,
                         size_t errlen);
/* Records staging slot `slot`'s event on the D2H stream of each GPU in
 * `mask`, after the copies queued there. */
int ckptio_gpu_mark_slot(ckptio_gpu *g, uint64_t mask, size_t slot, char *err, size_t errlen);
/* After a failure: waits for every copy queued on the D2H streams of the
 * GPUs in `mask`, so the staging they target may be reused. Best effort. */
void ckptio_gpu_drain_d2h(ckptio_gpu *g, uint64_t mask);

/* The PCI bus id "dddd:bb:dd.f" of a GPU (NUMA placement). */
int ckptio_gpu_pci_bus_id(ckptio_gpu *g, int gpu, char *buf, size_t len, char *err, size_t errlen);
/* ---- the public device calls (src/ctx/device_api.c) ---- */

/* Copies n bytes between host memory and GPU `gpu` on that GPU's copy
 * stream of direction `dir` (CKPTIO_GPU_H2D: src on the host), after the
 * copies saves and loads queued there, and waits for them. The calling
 * thread's current GPU is restored. */
int ckptio_gpu_copy_sync(ckptio_gpu *g, int gpu, ckptio_gpu_dir dir, void *dst, const void *src, size_t n,
                         char *err, size_t errlen);
/* The runtime's name for GPU `gpu` into buf. */
int ckptio_gpu_name(ckptio_gpu *g, int gpu, char *buf, size_t len, char *err, size_t errlen);
/* The file the runtime was loaded from. */
const char *ckptio_gpu_runtime_file(const ckptio_gpu *g);

/* Device memory on GPU `gpu`, and its release. */
int ckptio_gpu_alloc(ckptio_gpu *g, int gpu, size_t n, void **p, char *err, size_t errlen);
int ckptio_gpu_free(ckptio_gpu *g, int gpu, void *p, char *err, size_t errlen);

#endif
