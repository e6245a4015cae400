/* Plans for tensor-parallel loaders: which range of a dimension a rank
 * owns (torch.chunk's rule) and which bytes of which file hold a slice, so
 * a loader can schedule its reads before making them. The source names the
 * bytes: the runs a load reads, a view's storage runs, or for a compressed
 * file the frames holding them (a frame is read whole). */
#include "load/slice.h"

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

/* Collects ranges, merging each with the previous one when adjacent in the
 * same file, and counts them all while writing only the first cap. */
typedef struct emitter {
  ckptio_byte_range *out;
  size_t cap;
  int64_t count;      /* ranges closed so far */
  int open;
  ckptio_byte_range cur;
} emitter;

static void close_range(emitter *m) {
  if (!m->open) return;
  if ((uint64_t)m->count < m->cap) m->out[m->count] = m->cur;
  m->count++;
  m->open = 0;
}

static void emit(void *arg, uint32_t file, uint64_t off, uint64_t len) {
  emitter *m = arg;
  if (!len) return;
  if (m->open && m->cur.file == file && m->cur.offset + m->cur.length == off) {
    m->cur.length += len;
    return;
  }
  close_range(m);
  m->open = 1;
  m->cur = (ckptio_byte_range){file, off, len};
}

int64_t ckptio_reader_slice_ranges(ckptio_reader *r, size_t index, int dim, int64_t start, int64_t stop,
                                   ckptio_byte_range *ranges, size_t cap) {
  if (!r || (cap && !ranges)) return CKPTIO_E_INVALID_ARG;
  ckptio_geom g;
  int rc = ckptio_slice_geom_of(r, index, dim, start, stop, &g);
  if (rc < 0) return rc;
  if (ckptio_reader_part_count(r, index) > 1)
    return ckptio_fail(r->err, CKPTIO_E_FORMAT,
                       "%s: tensor '%s' is stored in %zu parts: list them with ckptio_reader_part, load with "
                       "ckptio_reader_load_boxes",
                       r->src->path, ckptio_reader_entry(r, index)->name, ckptio_reader_part_count(r, index));
  emitter m = {.out = ranges, .cap = cap};
  r->src->ops->ranges(r->src, index, &g, emit, &m);
  close_range(&m);
  return m.count;
}

int64_t ckptio_reader_plan_rank(ckptio_reader *r, size_t index, int dim, int rank, int nranks, int64_t *start,
                                int64_t *stop, ckptio_byte_range *ranges, size_t cap) {
  if (!r) return CKPTIO_E_INVALID_ARG;
  ckptio_geom g;
  int rc = ckptio_slice_geom_of(r, index, dim, 0, 0, &g); /* the tensor and the dim exist */
  if (rc < 0) return rc;
  const ckptio_entry *e = ckptio_reader_entry(r, index);
  int64_t a, b;
  if (ckptio_split_rank(e->shape[dim], rank, nranks, &a, &b) < 0)
    return ckptio_fail(r->err, CKPTIO_E_INVALID_ARG,
                       "%s: tensor '%s': no rank %d of %d (ranks count from 0, nranks >= 1)", r->src->path, e->name,
                       rank, nranks);
  if (start) *start = a;
  if (stop) *stop = b;
  return ckptio_reader_slice_ranges(r, index, dim, a, b, ranges, cap);
}
