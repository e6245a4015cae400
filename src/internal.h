/* What the writer, the reader and the context share inside the library. */
#ifndef CKPTIO_INTERNAL_H
#define CKPTIO_INTERNAL_H

#include "ckptio.h"
#include "pool/pool.h"
#include "staging/ring.h"

#define CKPTIO_DEFAULT_THREADS 8
#define CKPTIO_DEFAULT_CHUNK (8u << 20)
#define CKPTIO_DEFAULT_STAGING (256u << 20)

struct ckptio_ctx {
  ckptio_options opts; /* defaults resolved */
  ckptio_pool *pool;
  ckptio_ring *ring;   /* slots of opts.chunk_bytes */
};

/* The options of one save or load: the context's, overridden by the
 * per-call fields that make sense per call (crc, direct_io, fsync, load). */
int ckptio_options_for_call(const ckptio_ctx *ctx, const ckptio_options *call, ckptio_options *out);

#endif
