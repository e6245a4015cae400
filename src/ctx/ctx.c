/* The context: options resolved once, the worker pool and the staging ring,
 * created and touched once and shared by every save and load. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/align.h"
#include "core/options.h"
#include "core/sized.h"
#include "core/trace.h"
#include "device/numa.h"
#include "device/transfer.h"
#include "ctx/ctx.h"

unsigned ckptio_version_number(void) { return CKPTIO_VERSION_NUMBER; }

#define STR_(x) #x
#define STR(x) STR_(x)
const char *ckptio_version_string(void) {
  return STR(CKPTIO_VERSION_MAJOR) "." STR(CKPTIO_VERSION_MINOR) "." STR(CKPTIO_VERSION_PATCH);
}

/* The caller's options by the rule of versioned structs (core/sized.h):
 * fields past an older caller's size keep CKPTIO_OPTIONS_INIT's values. */
static int copy_options(const ckptio_options *in, ckptio_options *out, char *err) {
  ckptio_options defaults = CKPTIO_OPTIONS_INIT;
  *out = defaults;
  int rc = ckptio_sized_in(in, out, sizeof(*out), "ckptio_options", err, CKPTIO_ERRLEN);
  return rc < 0 ? rc : ckptio_options_check(out, err, CKPTIO_ERRLEN);
}

/* Staging and workers near the first GPU: the one a single-GPU process
 * (the common case: one process per GPU) drives. */
static void place_near_gpu(ckptio_ctx *ctx) {
  char busid[32] = "", msg[CKPTIO_ERRLEN];
  if (ckptio_gpu_pci_bus_id(ctx->gpu, 0, busid, sizeof(busid), msg, sizeof(msg)) < 0) {
    snprintf(ctx->numa_report, sizeof(ctx->numa_report), "NUMA: no PCI bus id for GPU 0 (%s); nothing placed", msg);
    return;
  }
  /* Every worker now, so that every one is bound. */
  if (ckptio_pool_start(ctx->pool, ctx->opts.threads) < 0) {
    snprintf(ctx->numa_report, sizeof(ctx->numa_report), "NUMA: could not start the workers; nothing placed");
    return;
  }
  ckptio_numa_place(busid, ckptio_ring_base(ctx->ring), ckptio_ring_slots(ctx->ring) * ctx->opts.chunk_bytes,
                    ckptio_pool_handles(ctx->pool), ckptio_pool_threads(ctx->pool), ctx->numa_report,
                    sizeof(ctx->numa_report));
}

/* Snapshot memory (1 GiB: 0.2-0.35 s of page faults here, and with CUDA
 * a cudaHostRegister) is made ready behind the caller's back, so that
 * neither ckptio_ctx_create nor a first save that starts at once waits for
 * all of it: that save faults in the slots it takes that this thread has
 * not reached (never writing a byte, the preparing cannot race with it) and
 * a GPU copy waits for the pin under the device's mutex. */
static void *prepare_main(void *arg) {
  ckptio_ctx *ctx = arg;
  if (ckptio_ring_prepare(ctx->ring) == 0 && ctx->gpu) (void)ckptio_gpu_pin(ctx->gpu);
  return NULL;
}

static int ctx_create(const ckptio_options *opts, ckptio_ctx **out) {
  if (!out) return CKPTIO_E_INVALID_ARG;
  *out = NULL;
  ckptio_trace_init(); /* CKPTIO_TRACE and NVTX, at the process's first context */
  ckptio_ctx *ctx = calloc(1, sizeof(*ctx));
  if (!ctx) return -ENOMEM;
  ckptio_closer_init(&ctx->closer);
  ctx->pid = getpid();
  char why[CKPTIO_ERRLEN];
  int rc = copy_options(opts, &ctx->opts, why);
  if (rc < 0) {
    ckptio_set_open_error(why);
    goto fail;
  }
  ckptio_options *o = &ctx->opts;
  if (!o->threads) o->threads = CKPTIO_DEFAULT_THREADS;
  if (!o->chunk_bytes) o->chunk_bytes = CKPTIO_DEFAULT_CHUNK;
  if (!o->staging_bytes) o->staging_bytes = CKPTIO_DEFAULT_STAGING;
  /* Chunks are the unit of O_DIRECT writes: page multiples, and at least
   * two slots so copying and writing overlap. */
  if (o->chunk_bytes % CKPTIO_IO_ALIGN || o->chunk_bytes < 64 * 1024 ||
      o->staging_bytes < 2 * o->chunk_bytes || o->threads > 1024) {
    rc = CKPTIO_E_INVALID_ARG;
    ckptio_set_open_error("ckptio_ctx_create: options: chunk_bytes must be a multiple of 4096 and at least "
                          "64 KiB, staging_bytes at least two chunks, threads at most 1024");
    goto fail;
  }
  if ((rc = ckptio_pool_create(o->threads, &ctx->pool)) < 0) goto fail;
  if ((rc = ckptio_storages_create(&ctx->storages)) < 0) goto fail;
  o->snapshot_bytes = ckptio_options_snapshot_bytes(o->snapshot_bytes, o->chunk_bytes);
  /* Snapshot memory is more slots of the same ring: a save takes slots in
   * file order, copies into every one it gets at once and writes behind
   * (save/writer.c), so the slots beyond staging_bytes are what lets a
   * whole state be copied before the disk has taken any of it. */
  if ((rc = ckptio_ring_create((o->staging_bytes + o->snapshot_bytes) / o->chunk_bytes, o->chunk_bytes,
                                o->snapshot_bytes / o->chunk_bytes, &ctx->ring)) < 0)
    goto fail;
  if (o->cuda) {
    rc = ckptio_gpu_open(&ctx->gpu, ckptio_ring_base(ctx->ring),
                         ckptio_ring_slots(ctx->ring) * o->chunk_bytes, ckptio_ring_slots(ctx->ring),
                         ctx->cuda_why, sizeof(ctx->cuda_why));
    if (rc < 0 && o->cuda == 1) {
      ckptio_set_open_error(ctx->cuda_why);
      goto fail;
    }
    rc = 0;
    if (ctx->gpu && o->numa) place_near_gpu(ctx);
  } else {
    snprintf(ctx->cuda_why, sizeof(ctx->cuda_why), "CUDA unavailable: turned off by the options");
  }
  /* After NUMA placement, which binds pages not yet faulted. Where no
   * thread can be started, the slots are faulted in by their first user. */
  if (o->snapshot_bytes && (ckptio_ring_unprepared(ctx->ring) || ctx->gpu))
    ctx->preparing = pthread_create(&ctx->preparer, NULL, prepare_main, ctx) == 0;
  *out = ctx;
  return 0;
fail:
  ckptio_ctx_free(ctx);
  return rc;
}

int ckptio_ctx_create(const ckptio_options *opts, ckptio_ctx **out) {
  ckptio_open_error_clear();
  int rc = ctx_create(opts, out);
  return ckptio_open_error_end(rc, "ckptio_ctx_create", ckptio_last_open_error());
}

int ckptio_ctx_check_process(const ckptio_ctx *ctx, char *err, size_t errlen) {
  if (ctx->pid == getpid()) return 0;
  return ckptio_err_fmt(err, errlen, CKPTIO_E_STATE,
                        "this context was created by process %d, before a fork: a forked child has none of its "
                        "worker threads (nor its GPU state); create a context in the child (ckptio_ctx_create "
                        "after fork)",
                        (int)ctx->pid);
}

void ckptio_ctx_free(ckptio_ctx *ctx) {
  /* A parent's context in a forked child: its threads and GPU state are
   * not there to stop, and its memory is the parent's, copied on write.
   * Left as it is: joining or freeing it could wait forever. */
  if (!ctx || ctx->pid != getpid()) return;
  /* The preparer first (told to stop between slots: a context freed at
   * once does not fault in memory it will never use); then the workers: a
   * queued job may still hold a slot of the ring; then the GPU streams,
   * which may still be copying into it. */
  if (ctx->ring) ckptio_ring_prepare_stop(ctx->ring); /* also queued saves' preparing jobs */
  if (ctx->preparing) pthread_join(ctx->preparer, NULL);
  ckptio_pool_free(ctx->pool);
  ckptio_closer_fini(&ctx->closer); /* after the workers: a commit there may still hand files over */
  ckptio_gpu_close(ctx->gpu);
  ckptio_ring_free(ctx->ring);
  ckptio_storages_free(ctx->storages);
  free(ctx);
}

int ckptio_ctx_storage_register(ckptio_ctx *ctx, const char *scheme, const ckptio_storage_ops *ops, void *self) {
  ckptio_open_error_clear();
  char why[CKPTIO_ERRLEN] = "no context";
  int rc = ctx ? ckptio_storages_register(ctx->storages, scheme, ops, self, why, sizeof(why)) : CKPTIO_E_INVALID_ARG;
  return ckptio_open_error_end(rc, "ckptio_ctx_storage_register", why);
}

int ckptio_ctx_storage(ckptio_ctx *ctx, const char *path, const ckptio_storage_ops **ops, void **self, char *err,
                       size_t errlen) {
  if (ops) *ops = NULL;
  if (self) *self = NULL;
  if (!ctx || !path || !ops || !self)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "ckptio_ctx_storage: a NULL argument");
  const ckptio_storage *st = NULL;
  int rc = ckptio_storages_find(ctx->storages, path, &st, err, errlen);
  if (rc == 1) {
    *ops = &st->ops;
    *self = st->self;
  }
  return rc;
}

int ckptio_ctx_options(const ckptio_ctx *ctx, ckptio_options *out) {
  const ckptio_options init = CKPTIO_OPTIONS_INIT; /* no context: nothing resolved */
  return ckptio_sized_out(out, ctx ? &ctx->opts : &init, sizeof(init), "ckptio_options", NULL, 0);
}

const char *ckptio_ctx_numa_report(const ckptio_ctx *ctx) { return ctx ? ctx->numa_report : ""; }

int ckptio_ctx_cuda(const ckptio_ctx *ctx, const char **why) {
  if (ctx && ctx->gpu) return 1;
  if (why) *why = ctx ? ctx->cuda_why : "CUDA unavailable: no context";
  return 0;
}

/* Checks a device argument against the context: 0 and the GPU ordinal, or
 * CKPTIO_E_DEVICE with the reason in err. */
int ckptio_ctx_gpu_ordinal(const ckptio_ctx *ctx, int device, int *ordinal, char *err, size_t errlen) {
  if (!ctx->gpu) return ckptio_err_fmt(err, errlen, CKPTIO_E_DEVICE, "%s", ctx->cuda_why);
  *ordinal = device - CKPTIO_DEVICE_CUDA(0);
  if (*ordinal < 0 || *ordinal >= ctx->gpu->ndev)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_DEVICE, "no GPU %d (this machine has %d)", *ordinal,
                          ctx->gpu->ndev);
  return 0;
}

int ckptio_device_alloc(ckptio_ctx *ctx, int device, uint64_t nbytes, void **ptr) {
  int ord;
  if (!ctx || !ptr) return CKPTIO_E_INVALID_ARG;
  *ptr = NULL;
  if (ckptio_ctx_gpu_ordinal(ctx, device, &ord, NULL, 0) < 0) return CKPTIO_E_DEVICE;
  return ckptio_gpu_alloc(ctx->gpu, ord, (size_t)nbytes, ptr, NULL, 0);
}

int ckptio_device_free(ckptio_ctx *ctx, int device, void *ptr) {
  int ord;
  if (!ctx) return CKPTIO_E_INVALID_ARG;
  if (!ptr) return 0;
  if (ckptio_ctx_gpu_ordinal(ctx, device, &ord, NULL, 0) < 0) return CKPTIO_E_DEVICE;
  return ckptio_gpu_free(ctx->gpu, ord, ptr, NULL, 0);
}

int ckptio_options_for_call(const ckptio_ctx *ctx, const ckptio_options *call, ckptio_options *out, char *err) {
  *out = ctx->opts;
  int forked = ckptio_ctx_check_process(ctx, err, CKPTIO_ERRLEN);
  if (forked < 0) return forked;
  if (!call) return 0;
  ckptio_options c;
  int rc = copy_options(call, &c, err);
  if (rc == 0) rc = ckptio_options_check_call(&ctx->opts, &c, err, CKPTIO_ERRLEN);
  if (rc < 0) return rc;
  /* The context-only fields were just found to be the context's (or left
   * at their initial values): a call shares the pool, the ring and the GPU
   * state, it does not choose them. */
  ckptio_options_merge_call(&ctx->opts, &c, out);
  return 0;
}
