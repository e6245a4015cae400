/* Built instead of cuda_device.c when the CUDA toolkit is not found: the
 * library still works on the host and says why CUDA is not there. */
#include <stddef.h>

#include "device/device.h"

const ckptio_device_ops *ckptio_cuda_ops(const char **why) {
  if (why) *why = "this build of ckptio has no CUDA support (the CUDA toolkit was not found at build time)";
  return NULL;
}
