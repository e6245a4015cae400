/* The context: options resolved once, the worker pool and the staging ring,
 * created and touched once and shared by every save and load. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

unsigned ckptio_version_number(void) { return CKPTIO_VERSION_NUMBER; }

#define STR_(x) #x
#define STR(x) STR_(x)
const char *ckptio_version_string(void) {
  return STR(CKPTIO_VERSION_MAJOR) "." STR(CKPTIO_VERSION_MINOR) "." STR(CKPTIO_VERSION_PATCH);
}

/* Copies the caller's struct up to its own size, so an older caller with a
 * shorter struct still works. */
static int copy_options(const ckptio_options *in, ckptio_options *out) {
  ckptio_options defaults = CKPTIO_OPTIONS_INIT;
  *out = defaults;
  if (!in) return 0;
  if (in->size < offsetof(ckptio_options, threads) + sizeof(int)) return CKPTIO_E_INVALID_ARG;
  memcpy(out, in, in->size < sizeof(*out) ? in->size : sizeof(*out));
  out->size = sizeof(*out);
  if (out->direct_io < CKPTIO_AUTO || out->direct_io > 1 || out->load_method < CKPTIO_LOAD_AUTO ||
      out->load_method > CKPTIO_LOAD_DIRECT || out->threads < 0)
    return CKPTIO_E_INVALID_ARG;
  return 0;
}

int ckptio_ctx_create(const ckptio_options *opts, ckptio_ctx **out) {
  if (!out) return CKPTIO_E_INVALID_ARG;
  *out = NULL;
  ckptio_ctx *ctx = calloc(1, sizeof(*ctx));
  if (!ctx) return -ENOMEM;
  int rc = copy_options(opts, &ctx->opts);
  if (rc < 0) goto fail;
  ckptio_options *o = &ctx->opts;
  if (!o->threads) o->threads = CKPTIO_DEFAULT_THREADS;
  if (!o->chunk_bytes) o->chunk_bytes = CKPTIO_DEFAULT_CHUNK;
  if (!o->staging_bytes) o->staging_bytes = CKPTIO_DEFAULT_STAGING;
  /* Chunks are the unit of O_DIRECT writes: page multiples, and at least
   * two slots so copying and writing overlap. */
  if (o->chunk_bytes % CKPTIO_IO_ALIGN || o->chunk_bytes < 64 * 1024 ||
      o->staging_bytes < 2 * o->chunk_bytes || o->threads > 1024) {
    rc = CKPTIO_E_INVALID_ARG;
    goto fail;
  }
  if ((rc = ckptio_pool_create(o->threads, &ctx->pool)) < 0) goto fail;
  if ((rc = ckptio_ring_create(o->staging_bytes / o->chunk_bytes, o->chunk_bytes, &ctx->ring)) < 0)
    goto fail;
  *out = ctx;
  return 0;
fail:
  ckptio_ctx_free(ctx);
  return rc;
}

void ckptio_ctx_free(ckptio_ctx *ctx) {
  if (!ctx) return;
  /* Workers first: a queued job may still hold a slot of the ring. */
  ckptio_pool_free(ctx->pool);
  ckptio_ring_free(ctx->ring);
  free(ctx);
}

void ckptio_ctx_options(const ckptio_ctx *ctx, ckptio_options *out) { *out = ctx->opts; }

int ckptio_options_for_call(const ckptio_ctx *ctx, const ckptio_options *call, ckptio_options *out) {
  *out = ctx->opts;
  if (!call) return 0;
  ckptio_options c;
  int rc = copy_options(call, &c);
  if (rc < 0) return rc;
  out->crc = c.crc;
  out->direct_io = c.direct_io;
  out->fsync = c.fsync;
  out->load_method = c.load_method;
  return 0;
}
