/* The device interface: the few operations the pipelines need from a GPU
 * runtime, as one table of functions. The host table is always there; the
 * CUDA table (cuda/) is filled from the CUDA runtime loaded at run time.
 * Nothing outside cuda/ sees a CUDA type: streams and events are opaque.
 *
 * Every operation returns 0 or a positive runtime error number; error_name
 * turns that number into the runtime's name for it ("cudaErrorLaunchFailure"),
 * which the pipelines put in their messages, and failed_call names the runtime
 * function that returned it. */
#ifndef CKPTIO_DEVICE_DEVICE_H
#define CKPTIO_DEVICE_DEVICE_H

#include <stddef.h>

typedef struct ckptio_device_ops {
  const char *name;
  /* GPUs visible. */
  int (*count)(int *n);
  /* The calling thread's current GPU (cudaSetDevice is per thread). */
  int (*set_device)(int ordinal);
  int (*get_device)(int *ordinal);
  /* Pins an existing host range for fast, async DMA, or unpins it. */
  int (*host_register)(void *p, size_t n, int read_only);
  int (*host_unregister)(void *p);
  int (*mem_alloc)(int ordinal, size_t n, void **p);
  int (*mem_free)(int ordinal, void *p);
  /* Streams and events of the calling thread's current GPU. */
  int (*stream_create)(void **stream);
  int (*stream_destroy)(void *stream);
  int (*event_create)(void **event);
  int (*event_destroy)(void *event);
  int (*event_record)(void *event, void *stream);
  int (*event_sync)(void *event);
  int (*stream_wait_event)(void *stream, void *event);
  int (*stream_sync)(void *stream);
  /* Async copies on a stream; host memory must be pinned for them to be
   * truly asynchronous. */
  int (*copy_d2h)(void *dst, const void *src, size_t n, void *stream);
  int (*copy_h2d)(void *dst, const void *src, size_t n, void *stream);
  /* Where p lives: -1 host (pinned or not), else the GPU ordinal. */
  int (*pointer_device)(const void *p, int *ordinal);
  /* PCI bus id "dddd:bb:dd.f" of a GPU, for NUMA placement. */
  int (*pci_bus_id)(int ordinal, char *buf, int len);
  const char *(*error_name)(int err);
  /* The runtime function ("cudaStreamCreateWithFlags") whose failure with
   * `err` is this thread's most recent failed call, or NULL when the last
   * failure had another number. Lets a message name the call even when the
   * failure surfaced through a helper that made several. */
  const char *(*failed_call)(int err);
  /* The runtime's name for a GPU ("NVIDIA H100 80GB HBM3"), what a report
   * labels its figures with. */
  int (*device_name)(int ordinal, char *buf, int len);
  /* The file the runtime was loaded from (its name when the loader cannot
   * say): which of several installed runtimes a report's figures are of. */
  const char *(*runtime_file)(void);
} ckptio_device_ops;

/* The CUDA table, loaded once (dlopen of $CKPTIO_CUDART, libcudart.so.13,
 * libcudart.so.12). @return the table, or NULL with the reason in why
 * ("CUDA unavailable: ..."). Thread-safe; the result is cached. */
const ckptio_device_ops *ckptio_cuda_ops(const char **why);

#endif
