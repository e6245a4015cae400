/* The reader: the public front of the load pipeline. It validates what the
 * caller asks, turns it into executor requests against its source, and
 * answers questions about the checkpoint. reader.c opens and loads,
 * slice.c and plan.c turn slices into requests and file ranges. */
#ifndef CKPTIO_LOAD_READER_H
#define CKPTIO_LOAD_READER_H

#include <stdatomic.h>
#include <stdint.h>

#include "core/error.h"
#include "core/stats.h"
#include "device/transfer.h"
#include "load/exec.h"
#include "load/source.h"

struct ckptio_reader {
  ckptio_ctx *ctx;
  ckptio_options opts;
  ckptio_source *src;
  size_t *by_name;        /* entry indices sorted by name */
  _Atomic uint64_t done_bytes;
  _Atomic uint64_t total_bytes;
  ckptio_timers timers;
  void *user_stream[CKPTIO_GPU_MAX]; /* set_stream; NULL: legacy default */
  char err[CKPTIO_ERRLEN];
};

/* Entry `index` of the checkpoint (validated by the caller). */
static inline const ckptio_entry *ckptio_reader_entry(const ckptio_reader *r, size_t index) {
  return &r->src->idx.entries[index];
}

/* `dst` must be memory of `device` when need > 0 (`what` names it in the
 * message); *gpu is the GPU ordinal, or -1 for the host. */
int ckptio_reader_check_device(ckptio_reader *r, const ckptio_entry *e, const void *dst, int device, uint64_t need,
                               const char *what, int *gpu);

/* Appends to v the executor requests for tensor `index` whole (dst NULL:
 * read and check only): one stored entry (a view gathered, its storage
 * record checked by a second request), or every part of a split tensor.
 * @return 0 or a code. */
struct ckptio_xreqs;
int ckptio_reader_tensor_reqs(ckptio_reader *r, size_t index, void *dst, int gpu, int check, struct ckptio_xreqs *v);

/* Runs executor requests, reporting into the reader's stats (added to
 * them with keep_stats). */
int ckptio_reader_exec(ckptio_reader *r, ckptio_xreq *qs, size_t n, int keep_stats);

#endif
