/* What the reader's two rooms share: reader.c opens a checkpoint and
 * answers questions about it; load.c moves its bytes. */
#ifndef CKPTIO_READER_INTERNAL_H
#define CKPTIO_READER_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

#include "core/error.h"
#include "core/stats.h"
#include "formats/index.h"
#include "internal.h"

#define CKPTIO_READER_MAX_GPUS 64

struct ckptio_reader {
  ckptio_ctx *ctx;
  ckptio_options opts;
  char *path;
  int fd, fd_direct;
  uint64_t file_size;
  ckptio_index idx;
  size_t *by_name;        /* entry indices sorted by name */
  const unsigned char *map;
  _Atomic uint64_t done_bytes;
  _Atomic uint64_t total_bytes;
  ckptio_timers timers;
  void *user_stream[CKPTIO_READER_MAX_GPUS]; /* set_stream; NULL: legacy default */
  struct ckptio_shard_set *set; /* a sharded checkpoint (shard.h), else NULL */
  struct ckptio_zsrc *z;        /* a zstd seekable file (compress/zload.c), else NULL */
  char err[CKPTIO_ERRLEN];
};

/* Sets the reader's message; @return code. */
int ckptio_reader_fail(ckptio_reader *r, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Loads (or, with a NULL dst, only checks) validated requests; checks the
 * recorded CRCs when check is set. */
int ckptio_reader_run(ckptio_reader *r, const ckptio_load_request *reqs, size_t n, int check);

#endif
