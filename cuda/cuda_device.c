/* The CUDA implementation of the device interface. The runtime library is
 * loaded at run time, once: $CKPTIO_CUDART first, then libcudart.so.13, then
 * libcudart.so.12 (never the development-only libcudart.so). Every symbol
 * goes into one table; a missing one unloads the library and CUDA is
 * reported unavailable with the reason, leaving the host path untouched.
 * This is the only file of the library that includes a CUDA header. */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"

/* X(name, return, params): the runtime functions ckptio calls. */
#define CUDART_SYMBOLS(X)                                                                   \
  X(cudaGetDeviceCount, (int *))                                                            \
  X(cudaSetDevice, (int))                                                                   \
  X(cudaGetDevice, (int *))                                                                 \
  X(cudaHostRegister, (void *, size_t, unsigned int))                                       \
  X(cudaHostUnregister, (void *))                                                           \
  X(cudaMalloc, (void **, size_t))                                                          \
  X(cudaFree, (void *))                                                                     \
  X(cudaStreamCreateWithFlags, (cudaStream_t *, unsigned int))                              \
  X(cudaStreamDestroy, (cudaStream_t))                                                      \
  X(cudaStreamSynchronize, (cudaStream_t))                                                  \
  X(cudaStreamWaitEvent, (cudaStream_t, cudaEvent_t, unsigned int))                         \
  X(cudaEventCreateWithFlags, (cudaEvent_t *, unsigned int))                                \
  X(cudaEventDestroy, (cudaEvent_t))                                                        \
  X(cudaEventRecord, (cudaEvent_t, cudaStream_t))                                           \
  X(cudaEventSynchronize, (cudaEvent_t))                                                    \
  X(cudaMemcpyAsync, (void *, const void *, size_t, enum cudaMemcpyKind, cudaStream_t))     \
  X(cudaPointerGetAttributes, (struct cudaPointerAttributes *, const void *))               \
  X(cudaDeviceGetPCIBusId, (char *, int, int))                                              \
  X(cudaGetLastError, (void))

static struct {
#define X(name, params) cudaError_t (*name) params;
  CUDART_SYMBOLS(X)
#undef X
  const char *(*cudaGetErrorName)(cudaError_t);
  /* Optional (a GPU's name only): CUDA 12's headers rename the call to
   * _v2, 13 has the plain name alone. */
  cudaError_t (*cudaGetDeviceProperties)(void *, int);
} rt;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static void *handle;
static char why_buf[512];
static char runtime_path[512]; /* the file loaded, for reports */

static int try_open(const char *name) {
  handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    size_t used = strlen(why_buf);
    snprintf(why_buf + used, sizeof(why_buf) - used, "%s%s", used ? "; " : "", dlerror());
  }
  return handle != NULL;
}

/* Whether the NVIDIA driver's library loads: every runtime works through
 * it. Asked before the runtime because a machine without a GPU may still
 * have the toolkit's runtime on its loader path (this one does), and
 * loading that runtime to hear it has no driver costs a fresh process
 * 0.2-0.5 ms where the failed look for the driver costs 0.1 ms. On a GPU
 * machine the runtime would load the driver anyway. */
static int driver_loads(void) {
  void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (!driver) {
    snprintf(why_buf, sizeof(why_buf), "no NVIDIA driver: %s", dlerror());
    return 0;
  }
  dlclose(driver);
  return 1;
}

static void load(void) {
  const char *env = getenv("CKPTIO_CUDART");
  if (env && *env) {
    if (!try_open(env)) return; /* an explicit runtime (a test's fake) brings its own driver */
  } else if (!driver_loads() || (!try_open("libcudart.so.13") && !try_open("libcudart.so.12"))) {
    return;
  }
  why_buf[0] = '\0';
#define X(name, params)                                                          \
  if (!(*(void **)&rt.name = dlsym(handle, #name))) {                             \
    snprintf(why_buf, sizeof(why_buf), "the CUDA runtime lacks %s", #name);    \
    goto fail;                                                                   \
  }
  CUDART_SYMBOLS(X)
  X(cudaGetErrorName, ())
#undef X
  if (!(*(void **)&rt.cudaGetDeviceProperties = dlsym(handle, "cudaGetDeviceProperties_v2")))
    *(void **)&rt.cudaGetDeviceProperties = dlsym(handle, "cudaGetDeviceProperties");
  struct link_map *lm = NULL;
  snprintf(runtime_path, sizeof(runtime_path), "%s",
           dlinfo(handle, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name[0] ? lm->l_name
           : env && *env                                                     ? env
                                                                             : "libcudart");
  int n = 0;
  cudaError_t e = rt.cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    snprintf(why_buf, sizeof(why_buf), "%s", rt.cudaGetErrorName(e));
    goto fail;
  }
  if (n == 0) {
    snprintf(why_buf, sizeof(why_buf), "no GPU found");
    goto fail;
  }
  return;
fail:
  dlclose(handle);
  handle = NULL;
  memset(&rt, 0, sizeof(rt));
}

/* This thread's last failed runtime call: a helper such as mem_alloc makes
 * two, and the message should say which one failed. */
static _Thread_local struct {
  int err;
  const char *call;
} last_failure;

static int note(const char *call, int e) {
  if (e) last_failure.err = e, last_failure.call = call;
  return e;
}

static const char *failed_call(int e) { return e && last_failure.err == e ? last_failure.call : NULL; }

#define CALL(name, args) note(#name, (int)rt.name args)

static int count(int *n) { return CALL(cudaGetDeviceCount, (n)); }
static int set_device(int ordinal) { return CALL(cudaSetDevice, (ordinal)); }
static int get_device(int *ordinal) { return CALL(cudaGetDevice, (ordinal)); }

/* Portable: the ring and a mapped file serve every GPU of the process, and
 * memory registered without it counts as pinned only in the context current
 * at the time (a copy on another GPU would run as a synchronous pageable one). */
static int host_register(void *p, size_t n, int read_only) {
  unsigned flags = cudaHostRegisterPortable;
  int e = rt.cudaHostRegister(p, n, flags | (read_only ? cudaHostRegisterReadOnly : 0));
  if (e != cudaSuccess && read_only) {
    /* Read-only registration is not supported everywhere; the default
     * registration of a read-only mapping still works for host-to-device. */
    rt.cudaGetLastError();
    e = rt.cudaHostRegister(p, n, flags);
  }
  return note("cudaHostRegister", e);
}

static int host_unregister(void *p) { return CALL(cudaHostUnregister, (p)); }

static int mem_alloc(int ordinal, size_t n, void **p) {
  int e = CALL(cudaSetDevice, (ordinal));
  return e ? e : CALL(cudaMalloc, (p, n));
}

static int mem_free(int ordinal, void *p) {
  int e = CALL(cudaSetDevice, (ordinal));
  return e ? e : CALL(cudaFree, (p));
}

static int stream_create(void **s) {
  /* Non-blocking: our copies must not serialise with the legacy default
   * stream the training loop may be using. */
  return CALL(cudaStreamCreateWithFlags, ((cudaStream_t *)s, cudaStreamNonBlocking));
}
static int stream_destroy(void *s) { return CALL(cudaStreamDestroy, (s)); }
static int event_create(void **ev) {
  return CALL(cudaEventCreateWithFlags, ((cudaEvent_t *)ev, cudaEventDisableTiming));
}
static int event_destroy(void *ev) { return CALL(cudaEventDestroy, (ev)); }
static int event_record(void *ev, void *s) { return CALL(cudaEventRecord, (ev, s)); }
static int event_sync(void *ev) { return CALL(cudaEventSynchronize, (ev)); }
static int stream_wait_event(void *s, void *ev) { return CALL(cudaStreamWaitEvent, (s, ev, 0)); }
static int stream_sync(void *s) { return CALL(cudaStreamSynchronize, (s)); }

static int copy_d2h(void *dst, const void *src, size_t n, void *s) {
  return CALL(cudaMemcpyAsync, (dst, src, n, cudaMemcpyDeviceToHost, s));
}
static int copy_h2d(void *dst, const void *src, size_t n, void *s) {
  return CALL(cudaMemcpyAsync, (dst, src, n, cudaMemcpyHostToDevice, s));
}

static int pointer_device(const void *p, int *ordinal) {
  struct cudaPointerAttributes a;
  memset(&a, 0, sizeof(a));
  /* Since CUDA 11 plain host memory is a success (cudaMemoryTypeUnregistered);
   * the runtimes we load (12, 13) report a real failure only. */
  int e = CALL(cudaPointerGetAttributes, (&a, p));
  if (e) return e;
  *ordinal = (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) ? a.device : -1;
  return 0;
}

static int pci_bus_id(int ordinal, char *buf, int len) { return CALL(cudaDeviceGetPCIBusId, (buf, len, ordinal)); }

static const char *error_name(int e) { return rt.cudaGetErrorName ? rt.cudaGetErrorName(e) : "cudaError?"; }

static int device_name(int ordinal, char *buf, int len) {
  /* The properties struct grows with every CUDA version and the runtime
   * fills its own version's whole: a buffer larger than any (about 1 KiB
   * today) rather than this header's sizeof. Its first field is the name,
   * char[256], in every version. */
  enum { PROP_BYTES = 16384, NAME_BYTES = 256 };
  if (!rt.cudaGetDeviceProperties) return note("cudaGetDeviceProperties", (int)cudaErrorNotSupported);
  char *prop = calloc(1, PROP_BYTES);
  if (!prop) return note("cudaGetDeviceProperties", (int)cudaErrorMemoryAllocation);
  int e = CALL(cudaGetDeviceProperties, (prop, ordinal));
  if (!e) {
    prop[NAME_BYTES - 1] = '\0';
    snprintf(buf, (size_t)len, "%s", prop);
  }
  free(prop);
  return e;
}

static const char *runtime_file(void) { return runtime_path; }

static const ckptio_device_ops cuda_ops = {
    "cuda",         count,          set_device,   get_device,        host_register,     host_unregister,
    mem_alloc,      mem_free,       stream_create, stream_destroy,   event_create,
    event_destroy,  event_record,   event_sync,   stream_wait_event, stream_sync,
    copy_d2h,       copy_h2d,       pointer_device, pci_bus_id,      error_name,
    failed_call,    device_name,    runtime_file,
};

const ckptio_device_ops *ckptio_cuda_ops(const char **why) {
  pthread_once(&load_once, load);
  if (!handle) {
    if (why) *why = why_buf;
    return NULL;
  }
  return &cuda_ops;
}
