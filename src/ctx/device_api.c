/* The experimental device calls of ckptio.h: what a tool that measures or
 * stages GPU memory itself needs beside the pipelines (the `ckptio bench`
 * command: the GPU's name, its own pinned buffer, uploads of a synthetic
 * model and the raw copy limits), over the context's own GPU state, so
 * that no program loads a second copy of the CUDA runtime to do it. Every
 * call here is open-type: the detail of a failure is in
 * ckptio_last_open_error, as there is no handle to hold it. The stable
 * device calls (ckptio_ctx_cuda, ckptio_device_alloc / _free) are in ctx.c. */
#include <stdint.h>
#include <stdio.h>

#include "core/error.h"
#include "core/sized.h"
#include "device/transfer.h"
#include "ctx/ctx.h"

/* The context's GPU `device` (CKPTIO_DEVICE_CUDA(n)): 0 and its ordinal,
 * or an error naming the call in err. */
static int gpu_of(const ckptio_ctx *ctx, const char *call, int device, int *ord, char *err, size_t errlen) {
  char why[CKPTIO_ERRLEN];
  if (ckptio_ctx_gpu_ordinal(ctx, device, ord, why, sizeof(why)) < 0)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_DEVICE, "%s: %s", call, why);
  return 0;
}

/* A failure of the device room's verb on GPU `ord`, said with the call and
 * the GPU. */
static int on_gpu(int rc, const char *call, int ord, const char *why, char *err, size_t errlen) {
  return rc < 0 ? ckptio_err_fmt(err, errlen, rc, "%s: GPU %d: %s", call, ord, why) : rc;
}

int ckptio_device_describe(const ckptio_ctx *ctx, int device, ckptio_device_info *out) {
  static const char call[] = "ckptio_device_describe";
  ckptio_open_error_clear();
  char err[CKPTIO_ERRLEN] = "", why[CKPTIO_ERRLEN] = "";
  int ord = 0, rc;
  if (!ctx || !out) {
    rc = ckptio_err_fmt(err, sizeof(err), CKPTIO_E_INVALID_ARG, "%s: %s is NULL", call, ctx ? "out" : "ctx");
  } else if ((rc = ckptio_sized_check(out, sizeof(ckptio_device_info), "ckptio_device_info", why, sizeof(why))) < 0) {
    /* A size never set is said as such, before any GPU question. */
    ckptio_err_fmt(err, sizeof(err), rc, "%s: %s", call, why);
  } else if ((rc = gpu_of(ctx, call, device, &ord, err, sizeof(err))) == 0) {
    ckptio_device_info info = CKPTIO_DEVICE_INFO_INIT;
    /* A runtime without cudaGetDeviceProperties leaves the name ""; the bus
     * id every runtime ckptio loads has. */
    (void)ckptio_gpu_name(ctx->gpu, ord, info.name, sizeof(info.name), NULL, 0);
    rc = on_gpu(ckptio_gpu_pci_bus_id(ctx->gpu, ord, info.pci_bus_id, sizeof(info.pci_bus_id), why, sizeof(why)),
                call, ord, why, err, sizeof(err));
    snprintf(info.runtime, sizeof(info.runtime), "%s", ckptio_gpu_runtime_file(ctx->gpu));
    if (rc == 0 && (rc = ckptio_sized_out(out, &info, sizeof(info), "ckptio_device_info", why, sizeof(why))) < 0)
      ckptio_err_fmt(err, sizeof(err), rc, "%s: %s", call, why);
  }
  return ckptio_open_error_end(rc, call, err);
}

int ckptio_device_copy(ckptio_ctx *ctx, void *dst, int dst_device, const void *src, int src_device,
                       uint64_t nbytes) {
  static const char call[] = "ckptio_device_copy";
  ckptio_open_error_clear();
  char err[CKPTIO_ERRLEN] = "", why[CKPTIO_ERRLEN] = "";
  int to_gpu = src_device == CKPTIO_DEVICE_HOST, ord = 0, rc;
  if (!ctx || (nbytes && (!dst || !src)))
    rc = ckptio_err_fmt(err, sizeof(err), CKPTIO_E_INVALID_ARG, "%s: %s is NULL", call,
                        !ctx ? "ctx" : !dst ? "dst" : "src");
  else if ((dst_device == CKPTIO_DEVICE_HOST) == to_gpu)
    rc = ckptio_err_fmt(err, sizeof(err), CKPTIO_E_INVALID_ARG,
                        "%s: one side must be the host and the other a GPU (dst_device %d, src_device %d)", call,
                        dst_device, src_device);
  else if (nbytes > SIZE_MAX)
    rc = ckptio_err_fmt(err, sizeof(err), CKPTIO_E_OVERFLOW, "%s: %llu bytes do not fit a size_t", call,
                        (unsigned long long)nbytes);
  else if ((rc = gpu_of(ctx, call, to_gpu ? dst_device : src_device, &ord, err, sizeof(err))) == 0 && nbytes)
    rc = on_gpu(ckptio_gpu_copy_sync(ctx->gpu, ord, to_gpu ? CKPTIO_GPU_H2D : CKPTIO_GPU_D2H, dst, src,
                                     (size_t)nbytes, why, sizeof(why)),
                call, ord, why, err, sizeof(err));
  return ckptio_open_error_end(rc, call, err);
}

int ckptio_host_pin(ckptio_ctx *ctx, void *ptr, uint64_t nbytes) {
  static const char call[] = "ckptio_host_pin";
  ckptio_open_error_clear();
  char err[CKPTIO_ERRLEN] = "", why[CKPTIO_ERRLEN] = "";
  int rc;
  if (!ctx || !ptr || !nbytes || nbytes > SIZE_MAX)
    rc = ckptio_err_fmt(err, sizeof(err), CKPTIO_E_INVALID_ARG, "%s: %s", call,
                        !ctx ? "ctx is NULL" : !ptr ? "ptr is NULL" : "nbytes is 0 or does not fit a size_t");
  else if (!ctx->gpu)
    rc = ckptio_err_fmt(err, sizeof(err), CKPTIO_E_DEVICE, "%s: %s", call, ctx->cuda_why);
  else if ((rc = ckptio_gpu_register(ctx->gpu, ptr, (size_t)nbytes, 0, why, sizeof(why))) < 0)
    ckptio_err_fmt(err, sizeof(err), rc, "%s: %s", call, why);
  return ckptio_open_error_end(rc, call, err);
}

int ckptio_host_unpin(ckptio_ctx *ctx, void *ptr) {
  static const char call[] = "ckptio_host_unpin";
  ckptio_open_error_clear();
  char err[CKPTIO_ERRLEN] = "", why[CKPTIO_ERRLEN] = "";
  int rc;
  if (!ctx || !ptr)
    rc = ckptio_err_fmt(err, sizeof(err), CKPTIO_E_INVALID_ARG, "%s: %s is NULL", call, ctx ? "ptr" : "ctx");
  else if (!ctx->gpu)
    rc = ckptio_err_fmt(err, sizeof(err), CKPTIO_E_DEVICE, "%s: %s", call, ctx->cuda_why);
  else if ((rc = ckptio_gpu_unregister_checked(ctx->gpu, ptr, why, sizeof(why))) < 0)
    ckptio_err_fmt(err, sizeof(err), rc, "%s: %s", call, why);
  return ckptio_open_error_end(rc, call, err);
}
