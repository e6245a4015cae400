/* See real_gpu.h. The same order as cuda/cuda_device.c: the driver's
 * library first (libcuda.so.1), then the runtime ($CKPTIO_CUDART, else
 * libcudart.so.13, then .12). The GPUs are counted by the driver
 * (cuInit, cuDeviceGetCount), not by the runtime the library loads. */
#include "real_gpu.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

static void *open_runtime(char *why, size_t len) {
  const char *env = getenv("CKPTIO_CUDART");
  if (env && *env) {
    void *h = dlopen(env, RTLD_LAZY | RTLD_LOCAL);
    if (!h) snprintf(why, len, "CKPTIO_CUDART does not load: %s", dlerror());
    return h;
  }
  void *h = dlopen("libcudart.so.13", RTLD_LAZY | RTLD_LOCAL);
  if (!h) h = dlopen("libcudart.so.12", RTLD_LAZY | RTLD_LOCAL);
  if (!h) snprintf(why, len, "no CUDA runtime loads (libcudart.so.13 or .12): %s", dlerror());
  return h;
}

int ckptio_test_real_gpus(char *why, size_t len) {
#ifndef CKPTIO_TEST_HAVE_CUDA
  snprintf(why, len, "this build of ckptio has no CUDA device (no CUDA toolkit at build time)");
  return 0;
#else
  int n = 0;
  void *runtime = NULL;
  void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!driver) {
    snprintf(why, len, "no NVIDIA driver: %s", dlerror());
    return 0;
  }
  int (*cu_init)(unsigned) = (int (*)(unsigned))dlsym(driver, "cuInit");
  int (*cu_count)(int *) = (int (*)(int *))dlsym(driver, "cuDeviceGetCount");
  if (!cu_init || !cu_count) {
    snprintf(why, len, "libcuda.so.1 lacks cuInit or cuDeviceGetCount");
    goto done;
  }
  int e = cu_init(0);
  if (e) {
    snprintf(why, len, "the NVIDIA driver loads but cuInit fails (CUresult %d): no usable GPU", e);
    goto done;
  }
  if ((e = cu_count(&n)) != 0 || n <= 0) {
    snprintf(why, len, "the NVIDIA driver sees no GPU (cuDeviceGetCount: CUresult %d, %d GPUs)", e, n);
    n = 0;
    goto done;
  }
  runtime = open_runtime(why, len);
  if (!runtime) {
    n = 0;
    goto done;
  }
  dlclose(runtime);
done:
  dlclose(driver);
  return n;
#endif
}
