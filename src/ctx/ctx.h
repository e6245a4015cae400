/* What the writer, the reader and the context share inside the library. */
#ifndef CKPTIO_CTX_CTX_H
#define CKPTIO_CTX_CTX_H

#include <sys/types.h>

#include "ckptio.h"
#include "core/error.h"
#include "core/hold.h"
#include "device/gpu.h"
#include "pool/pool.h"
#include "staging/ring.h"
#include "storage/storage.h"

/* Workers: each holds one read or write of a chunk while it runs, so they
 * are the queue depth the disk sees. 32 requests of 8 MiB in flight is what
 * the raw limits are measured with and what the disk needs (4 GiB, against
 * the raw limits of the same run: 8 workers saved at 0.64-0.87x and loaded
 * cold at 0.58-0.87x; 32 at 0.89-0.93x and 0.83-0.99x; bench/RESULTS.md). */
#define CKPTIO_DEFAULT_THREADS 32
/* Compressions or decompressions at once, at most: CPU work, each holding a
 * zstd context and a frame's buffers, so more workers than this add memory,
 * not speed. */
#define CKPTIO_CODEC_JOBS 8
#define CKPTIO_DEFAULT_CHUNK (8u << 20)
#define CKPTIO_DEFAULT_STAGING (256u << 20)

struct ckptio_ctx {
  ckptio_options opts; /* defaults resolved */
  ckptio_pool *pool;
  ckptio_ring *ring;   /* slots of opts.chunk_bytes */
  ckptio_gpu *gpu;     /* NULL when CUDA is off or unavailable */
  ckptio_storages *storages; /* what serves "SCHEME://" paths */
  char cuda_why[CKPTIO_ERRLEN];
  char numa_report[CKPTIO_ERRLEN];
  ckptio_closer closer; /* the files its saves replaced, closed after them */
  pthread_t preparer;  /* faults in (and pins) snapshot memory; see ctx.c */
  int preparing;       /* preparer started: join it at free */
  pid_t pid;           /* the creating process: its threads are not a forked child's */
};

/* 0 in the process that created ctx; in a forked child, whose copy of the
 * context has no workers (fork copies only the calling thread),
 * CKPTIO_E_STATE with the advice to create a context there, in err. */
int ckptio_ctx_check_process(const ckptio_ctx *ctx, char *err, size_t errlen);

/* Compressions or decompressions ctx runs at once: its workers, at most
 * CKPTIO_CODEC_JOBS. */
static inline int ckptio_codec_jobs(const ckptio_ctx *ctx) {
  int t = ctx->opts.threads;
  return t < 1 ? 1 : t < CKPTIO_CODEC_JOBS ? t : CKPTIO_CODEC_JOBS;
}

/* The options of one save or load: the context's, with the per-call
 * fields (crc, direct_io, fsync, load_method, compress_level, shuffle,
 * open_flags) of
 * `call` when not NULL. A refused struct (core/sized.h), value or
 * context-only field that differs from the context's (core/options.h) is
 * said in err (CKPTIO_ERRLEN bytes). */
int ckptio_options_for_call(const ckptio_ctx *ctx, const ckptio_options *call, ckptio_options *out, char *err);

/* 0 and the GPU ordinal of a CKPTIO_DEVICE_CUDA(n) value, or
 * CKPTIO_E_DEVICE with the reason (CUDA unavailable, no such GPU) in err. */
int ckptio_ctx_gpu_ordinal(const ckptio_ctx *ctx, int device, int *ordinal, char *err, size_t errlen);

#endif
