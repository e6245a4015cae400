/* Plans for tensor-parallel loaders: which range of a dimension a rank
 * owns (torch.chunk's rule) and which bytes of the file hold a slice, so a
 * loader can schedule its reads before making them. The byte ranges are
 * the runs slice.c reads, named by file offset; for a compressed file, the
 * frames holding those runs (a frame is read whole). */
#include <stdio.h>
#include <string.h>

#include "compress/zload.h"
#include "load_share.h"
#include "shard.h"
#include "slice.h"

#define rfail ckptio_reader_fail

int ckptio_split_rank(int64_t size, int rank, int nranks, int64_t *start, int64_t *stop) {
  if (!start || !stop || size < 0 || nranks < 1 || rank < 0 || rank >= nranks) return CKPTIO_E_INVALID_ARG;
  int64_t chunk = size / nranks + (size % nranks != 0), a, b;
  /* Past the end (or past int64) means the rank's chunk starts after the
   * last one: empty, at size. */
  if (__builtin_mul_overflow((int64_t)rank, chunk, &a) || a > size) a = size;
  if (__builtin_mul_overflow((int64_t)rank + 1, chunk, &b) || b > size) b = size;
  *start = a;
  *stop = b;
  return 0;
}

/* Collects ranges, merging each with the previous one when adjacent, and
 * counts them all while writing only the first cap. */
typedef struct emitter {
  ckptio_byte_range *out;
  size_t cap;
  int64_t count;      /* ranges closed so far */
  int open;
  uint64_t off, len;  /* the range being grown */
} emitter;

static void close_range(emitter *m) {
  if (!m->open) return;
  if ((uint64_t)m->count < m->cap) m->out[m->count] = (ckptio_byte_range){0, m->off, m->len};
  m->count++;
  m->open = 0;
}

static void emit(emitter *m, uint64_t off, uint64_t len) {
  if (!len) return;
  if (m->open && m->off + m->len == off) {
    m->len += len;
    return;
  }
  close_range(m);
  m->open = 1;
  m->off = off;
  m->len = len;
}

static void emit_cb(void *m, uint64_t off, uint64_t len) { emit(m, off, len); }

typedef struct view_emit {
  emitter *m;
  uint64_t base;
} view_emit;

static void emit_view_run(void *arg, uint64_t off, uint64_t len) {
  view_emit *v = arg;
  emit(v->m, v->base + off, len);
}

/* The storage bytes of a view's logical elements [first, first + count),
 * in their row-major order (load.c's gather walk). */
static void emit_view(emitter *m, const ckptio_entry *e, uint64_t first, uint64_t count) {
  view_emit v = {m, e->offset};
  ckptio_view_runs(e, first, count, emit_view_run, &v);
}

int64_t ckptio_reader_slice_ranges(ckptio_reader *r, size_t index, int dim, int64_t start, int64_t stop,
                                   ckptio_byte_range *ranges, size_t cap) {
  if (!r || (cap && !ranges)) return CKPTIO_E_INVALID_ARG;
  if (r->set) return ckptio_shard_slice_ranges(r, index, dim, start, stop, ranges, cap);
  ckptio_slice_geom g;
  int rc = ckptio_slice_geom_of(r, index, dim, start, stop, &g);
  if (rc < 0) return rc;
  const ckptio_entry *e = &r->idx.entries[index];
  emitter m = {.out = ranges, .cap = cap};
  uint64_t es = (uint64_t)ckptio_dtype_bits(e->dtype) / 8;
  size_t last = (size_t)-1;
  for (uint64_t k = 0; k < g.count; k++) {
    uint64_t src = g.src0 + k * g.pitch;
    if (r->z) ckptio_zread_frames_of(r, e->offset + src, e->offset + src + g.run, &last, emit_cb, &m);
    else if (e->strided) emit_view(&m, e, src / es, g.run / es);
    else emit(&m, e->offset + src, g.run);
  }
  close_range(&m);
  return m.count;
}

int64_t ckptio_reader_plan_rank(ckptio_reader *r, size_t index, int dim, int rank, int nranks, int64_t *start,
                                int64_t *stop, ckptio_byte_range *ranges, size_t cap) {
  if (!r) return CKPTIO_E_INVALID_ARG;
  ckptio_slice_geom g;
  int rc = ckptio_slice_geom_of(r, index, dim, 0, 0, &g); /* the tensor and the dim exist */
  if (rc < 0) return rc;
  const ckptio_entry *e = &r->idx.entries[index];
  int64_t a, b;
  if (ckptio_split_rank(e->shape[dim], rank, nranks, &a, &b) < 0)
    return rfail(r, CKPTIO_E_INVALID_ARG, "%s: tensor '%s': no rank %d of %d (ranks count from 0, nranks >= 1)",
                 r->path, e->name, rank, nranks);
  if (start) *start = a;
  if (stop) *stop = b;
  return ckptio_reader_slice_ranges(r, index, dim, a, b, ranges, cap);
}
