/* Devices and versions, error names, the _ptds / _ptsz aliases of the
 * per-thread-default-stream build of the headers, the copy-engine hold,
 * the statistics written at exit for a test that runs a program in another
 * process, and the leak report that fails a leaking test at exit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

static _Thread_local int cur_dev;  /* cudaSetDevice is per thread */

int fc_current_device(void) { return cur_dev; }

cudaError_t fc_need_device(void) {
  fc_init();
  return fc_cfg.ndev ? cudaSuccess : cudaErrorNoDevice;
}

cudaError_t CUDARTAPI cudaGetDeviceCount(int *count) {
  cudaError_t e = fc_enter(FC_cudaGetDeviceCount, NULL);
  if (e) return fc_ret(e);
  if (!count) return fc_ret(cudaErrorInvalidValue);
  *count = fc_cfg.ndev;
  return fc_ret(fc_need_device());
}

cudaError_t CUDARTAPI cudaSetDevice(int device) {
  cudaError_t e = fc_enter(FC_cudaSetDevice, NULL);
  if (e || (e = fc_need_device())) return fc_ret(e);
  if (device < 0 || device >= fc_cfg.ndev) return fc_ret(cudaErrorInvalidDevice);
  cur_dev = device;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetDevice(int *device) {
  cudaError_t e = fc_enter(FC_cudaGetDevice, NULL);
  if (e || (e = fc_need_device())) return fc_ret(e);
  if (!device) return fc_ret(cudaErrorInvalidValue);
  *device = cur_dev;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDeviceGetPCIBusId(char *pciBusId, int len, int device) {
  cudaError_t e = fc_enter(FC_cudaDeviceGetPCIBusId, NULL);
  if (e || (e = fc_need_device())) return fc_ret(e);
  if (device < 0 || device >= fc_cfg.ndev) return fc_ret(cudaErrorInvalidDevice);
  if (!pciBusId || len <= 0) return fc_ret(cudaErrorInvalidValue);
  /* Device 0 is 0000:3b:00.0, the next ones count up the bus (then the domain). */
  unsigned bus = 0x3bu + (unsigned)device;
  snprintf(pciBusId, (size_t)len, "%04x:%02x:00.0", bus >> 8, bus & 0xffu);
  return cudaSuccess;
}

/* The name says what this is, so whatever prints a GPU's name (a
 * benchmark's report) labels figures from the fake without knowing of it. */
#define FAKE_GPU_NAME "fake CUDA GPU (tests/fake_cudart), not a GPU"

cudaError_t CUDARTAPI cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
  cudaError_t e = fc_enter(FC_cudaGetDeviceProperties, NULL);
  if (e || (e = fc_need_device())) return fc_ret(e);
  if (device < 0 || device >= fc_cfg.ndev) return fc_ret(cudaErrorInvalidDevice);
  if (!prop) return fc_ret(cudaErrorInvalidValue);
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "%s", FAKE_GPU_NAME);
  prop->totalGlobalMem = fc_cfg.mem_bytes;
  prop->major = 9;
  prop->pciBusID = 0x3b + device;
  return cudaSuccess;
}

/* CUDA 12's name for the same call (its headers #define one to the other). */
cudaError_t CUDARTAPI cudaGetDeviceProperties_v2(struct cudaDeviceProp *prop, int device);
cudaError_t CUDARTAPI cudaGetDeviceProperties_v2(struct cudaDeviceProp *prop, int device) {
  return cudaGetDeviceProperties(prop, device);
}

cudaError_t CUDARTAPI cudaRuntimeGetVersion(int *runtimeVersion) {
  cudaError_t e = fc_enter(FC_cudaRuntimeGetVersion, NULL);
  if (e) return fc_ret(e);
  if (!runtimeVersion) return fc_ret(cudaErrorInvalidValue);
  *runtimeVersion = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDriverGetVersion(int *driverVersion) {
  cudaError_t e = fc_enter(FC_cudaDriverGetVersion, NULL);
  if (e) return fc_ret(e);
  if (!driverVersion) return fc_ret(cudaErrorInvalidValue);
  *driverVersion = fc_cfg.driver_version;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetLastError(void) {
  cudaError_t e = fc_enter(FC_cudaGetLastError, NULL);
  return e ? e : fc_take_last_error();
}

const char *CUDARTAPI cudaGetErrorName(cudaError_t error) { return fc_error_name(error); }

const char *CUDARTAPI cudaGetErrorString(cudaError_t error) { return fc_error_string(error); }

/* ------------------------------------------------------------ aliases
 * With CUDA_API_PER_THREAD_DEFAULT_STREAM the header renames these calls
 * (api ## _ptds / _ptsz). The fake has one default stream per device, so the
 * aliases are the same functions; they count as the plain name. */

cudaError_t CUDARTAPI cudaMemcpy_ptds(void *dst, const void *src, size_t count,
                                      enum cudaMemcpyKind kind);
cudaError_t CUDARTAPI cudaMemset_ptds(void *devPtr, int value, size_t count);
cudaError_t CUDARTAPI cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t count,
                                           enum cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t CUDARTAPI cudaMemsetAsync_ptsz(void *devPtr, int value, size_t count,
                                           cudaStream_t stream);
cudaError_t CUDARTAPI cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream);
cudaError_t CUDARTAPI cudaStreamWaitEvent_ptsz(cudaStream_t stream, cudaEvent_t event,
                                               unsigned int flags);
cudaError_t CUDARTAPI cudaStreamSynchronize_ptsz(cudaStream_t stream);

cudaError_t CUDARTAPI cudaMemcpy_ptds(void *dst, const void *src, size_t count,
                                      enum cudaMemcpyKind kind) {
  return cudaMemcpy(dst, src, count, kind);
}

cudaError_t CUDARTAPI cudaMemset_ptds(void *devPtr, int value, size_t count) {
  return cudaMemset(devPtr, value, count);
}

cudaError_t CUDARTAPI cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t count,
                                           enum cudaMemcpyKind kind, cudaStream_t stream) {
  return cudaMemcpyAsync(dst, src, count, kind, stream);
}

cudaError_t CUDARTAPI cudaMemsetAsync_ptsz(void *devPtr, int value, size_t count,
                                           cudaStream_t stream) {
  return cudaMemsetAsync(devPtr, value, count, stream);
}

cudaError_t CUDARTAPI cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream) {
  return cudaEventRecord(event, stream);
}

cudaError_t CUDARTAPI cudaStreamWaitEvent_ptsz(cudaStream_t stream, cudaEvent_t event,
                                               unsigned int flags) {
  return cudaStreamWaitEvent(stream, event, flags);
}

cudaError_t CUDARTAPI cudaStreamSynchronize_ptsz(cudaStream_t stream) {
  return cudaStreamSynchronize(stream);
}

/* ------------------------------------------------------------ test API */

void fake_cudart_hold(int on) {
  fc_init();
  pthread_mutex_lock(&fc_lock);
  fc_held = on != 0;
  pthread_cond_broadcast(&fc_progress);
  pthread_mutex_unlock(&fc_lock);
}

int fake_cudart_leaks(void) {
  int n = 0;
  fc_init();
  pthread_mutex_lock(&fc_lock);
  fc_memory_leaks(&n);
  fc_streams_leaks(&n);
  pthread_mutex_unlock(&fc_lock);
  return n;
}

/* FAKE_CUDART_STATS_FILE=path: the counters as "name value" lines at exit,
 * for a test that runs a program (the ckptio command) in another process
 * and cannot call fake_cudart_stats itself. Read at exit, like the leak
 * report, so a test may set it for itself. */
static void write_stats_at_exit(void) {
  const char *path = getenv("FAKE_CUDART_STATS_FILE");
  if (!path || !*path) return;
  struct fake_cudart_stats s = FAKE_CUDART_STATS_INIT;
  fake_cudart_stats(&s);
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "fake_cudart: FAKE_CUDART_STATS_FILE=%s: cannot write it\n", path);
    return;
  }
#define W(field) fprintf(f, "%s %llu\n", #field, (unsigned long long)s.field);
  W(async_copies) W(sync_copies) W(pageable_copies) W(memsets) W(bytes_h2d) W(bytes_d2h)
  W(bytes_d2d) W(bytes_h2h) W(frees_while_busy) W(exec_failures) W(pinned_allocs)
  W(pinned_bytes) W(registered_ranges) W(registered_bytes) W(device_allocs) W(device_bytes)
  W(streams) W(events) W(peak_pinned_bytes) W(peak_locked_bytes) W(peak_device_bytes)
#undef W
  fclose(f);
}

/* Read at exit, not at start, so a test may turn it on for itself. */
__attribute__((destructor)) static void report_leaks_at_exit(void) {
  write_stats_at_exit();
  const char *s = getenv("FAKE_CUDART_REPORT_LEAKS");
  if (!s || strcmp(s, "1")) return;
  int n = fake_cudart_leaks();
  if (n) {
    fprintf(stderr, "fake_cudart: %d CUDA object(s) leaked at exit\n", n);
    fflush(stderr);
    _exit(3);
  }
}
