/* Partial loads: a range start:stop of one dimension of a tensor, read
 * without the rest. A slice is a geometry of equal runs of the tensor's
 * row-major bytes (source.h); the executor runs it like any load. A slice
 * that is the whole tensor with a CRC to check is loaded as the tensor. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "load/box.h"
#include "load/reader.h"
#include "load/slice.h"

/* Bytes of elems elements of `bits` bits without the product overflowing. */
static uint64_t bytes_of(uint64_t elems, int bits) {
  return elems / 8 * (uint64_t)bits + elems % 8 * (uint64_t)bits / 8;
}

int ckptio_slice_geom_of(ckptio_reader *r, size_t index, int dim, int64_t start, int64_t stop, ckptio_geom *g) {
  memset(g, 0, sizeof(*g));
  const char *path = r->src->path;
  if (index >= r->src->idx.count)
    return ckptio_fail(r->err, CKPTIO_E_INVALID_ARG, "%s: no tensor at index %zu (the %s has %zu)", path, index,
                       r->src->ops->noun, r->src->idx.count);
  const ckptio_entry *e = ckptio_reader_entry(r, index);
  if (dim < 0 || dim >= e->ndim)
    return ckptio_fail(r->err, CKPTIO_E_INVALID_ARG, "%s: tensor '%s' has %d dims: there is no dim %d to slice", path,
                       e->name, e->ndim, dim);
  int64_t size = e->shape[dim];
  if (start < 0 || start > stop || stop > size)
    return ckptio_fail(r->err, CKPTIO_E_INVALID_ARG,
                       "%s: tensor '%s': slice %lld:%lld of dim %d is outside the tensor (a slice needs "
                       "0 <= start <= stop <= %lld)",
                       path, e->name, (long long)start, (long long)stop, dim, (long long)size);
  g->full = start == 0 && stop == size;
  for (int d = 0; d < e->ndim; d++)
    if (e->shape[d] == 0) return 0; /* no elements: nothing to read, whatever the other dims */
  int bits = ckptio_dtype_bits(e->dtype);
  uint64_t outer = 1, inner = 1, first, len = (uint64_t)(stop - start), whole;
  int over = 0;
  for (int d = 0; d < dim; d++) over |= __builtin_mul_overflow(outer, (uint64_t)e->shape[d], &outer);
  for (int d = dim + 1; d < e->ndim; d++) over |= __builtin_mul_overflow(inner, (uint64_t)e->shape[d], &inner);
  over |= __builtin_mul_overflow(inner, (uint64_t)size, &whole);
  over |= __builtin_mul_overflow(inner, (uint64_t)start, &first);
  if (over) /* cannot happen: a tensor's numel x bits was checked at open; kept for a format that forgets */
    return ckptio_fail(r->err, CKPTIO_E_OVERFLOW, "%s: tensor '%s': the shape's element counts overflow 64 bits", path,
                       e->name);
  /* Every run starts at first + k * whole elements and holds len * inner:
   * all of them on byte boundaries, or the slice cannot be cut from bytes. */
  if (bits % 8 && ((first % 8) * (uint64_t)bits % 8 || (len % 8) * (inner % 8) * (uint64_t)bits % 8 ||
                   (outer > 1 && (whole % 8) * (uint64_t)bits % 8)))
    return ckptio_fail(r->err, CKPTIO_E_MISALIGNED,
                       "%s: tensor '%s': slice %lld:%lld of dim %d does not start and end on byte boundaries "
                       "(%s has %d bits per element)",
                       path, e->name, (long long)start, (long long)stop, dim, ckptio_dtype_name(e->dtype), bits);
  if (e->strided && bits % 8)
    return ckptio_fail(r->err, CKPTIO_E_MISALIGNED, "%s: tensor '%s': a view of a sub-byte dtype cannot be sliced",
                       path, e->name);
  g->src0 = bytes_of(first, bits);
  g->run = bytes_of(len * inner, bits);
  g->pitch = bytes_of(whole, bits);
  g->count = g->run ? outer : 0;
  if (g->count > 1 && g->run == g->pitch) { /* whole rows: one run */
    g->run *= g->count;
    g->count = 1;
  }
  g->nbytes = g->run * g->count;
  return 0;
}

int64_t ckptio_reader_slice_nbytes(ckptio_reader *r, size_t index, int dim, int64_t start, int64_t stop) {
  if (!r) return CKPTIO_E_INVALID_ARG;
  ckptio_geom g;
  int rc = ckptio_slice_geom_of(r, index, dim, start, stop, &g);
  return rc < 0 ? rc : (int64_t)g.nbytes;
}

/* The slice's geometry, and a destination of the device the request names
 * that holds it. */
static int check_slice(ckptio_reader *r, const ckptio_slice_request *q, ckptio_geom *g, int *gpu) {
  int rc = ckptio_slice_geom_of(r, q->index, q->dim, q->start, q->stop, g);
  if (rc < 0) return rc;
  const ckptio_entry *e = ckptio_reader_entry(r, q->index);
  if (q->dst_bytes < g->nbytes || (!q->dst && g->nbytes))
    return ckptio_fail(r->err, CKPTIO_E_BUFFER_TOO_SMALL,
                       "%s: tensor '%s': slice %lld:%lld of dim %d needs %llu bytes, destination has %llu",
                       r->src->path, e->name, (long long)q->start, (long long)q->stop, q->dim,
                       (unsigned long long)g->nbytes, (unsigned long long)(q->dst ? q->dst_bytes : 0));
  return ckptio_reader_check_device(r, e, q->dst, q->device, g->nbytes, "slice destination", gpu);
}

int ckptio_reader_load_slices(ckptio_reader *r, ckptio_slice_request *reqs, size_t n) {
  if (!r || (n && !reqs)) return CKPTIO_E_INVALID_ARG;
  ckptio_xreqs v = {0};
  size_t *first = calloc(n + 1, sizeof(size_t));
  int rc = first ? 0 : -ENOMEM;
  for (size_t i = 0; i < n && rc == 0; i++) {
    ckptio_geom g;
    int gpu;
    reqs[i].verified = 0;
    reqs[i].bytes_read = 0;
    first[i] = v.n;
    if ((rc = check_slice(r, &reqs[i], &g, &gpu)) < 0) break;
    const ckptio_entry *e = ckptio_reader_entry(r, reqs[i].index);
    const ckptio_spart *parts;
    ckptio_spart one;
    if (ckptio_reader_parts_of(r, reqs[i].index, &parts, &one) > 1 || parts != &one) {
      /* Stored in parts: the slice is a box */
      int64_t start[CKPTIO_MAX_DIMS] = {0}, stop[CKPTIO_MAX_DIMS];
      memcpy(stop, e->shape, sizeof(stop));
      start[reqs[i].dim] = reqs[i].start;
      stop[reqs[i].dim] = reqs[i].stop;
      if (g.nbytes) rc = ckptio_box_reqs(r, reqs[i].index, start, stop, reqs[i].dst, gpu, r->opts.crc, &v, &reqs[i].verified);
    } else if (g.full && r->opts.crc && e->has_crc) { /* can be checked: load it as the tensor */
      rc = ckptio_reader_tensor_reqs(r, reqs[i].index, reqs[i].dst, gpu, 1, &v);
      reqs[i].verified = 1;
    } else if (g.nbytes) {
      size_t local;
      ckptio_source *src = r->src->ops->member(r->src, reqs[i].index, &local, NULL);
      ckptio_xreq q = {.src = src, .e = &src->idx.entries[local], .dst = reqs[i].dst, .gpu = gpu, .g = g};
      rc = ckptio_xreqs_push(&v, &q);
    }
  }
  if (first) first[n] = v.n;
  if (rc == 0) rc = ckptio_reader_exec(r, v.q, v.n, 0);
  for (size_t i = 0; first && i < n; i++)
    for (size_t k = first[i]; k < first[i + 1]; k++) reqs[i].bytes_read += atomic_load(&v.q[k].read);
  free(v.q);
  free(first);
  return rc;
}

int ckptio_reader_load_slice(ckptio_reader *r, size_t index, int dim, int64_t start, int64_t stop, void *dst,
                             uint64_t dst_bytes, int *verified) {
  ckptio_slice_request q = {.index = index, .dim = dim, .start = start, .stop = stop, .dst = dst,
                            .dst_bytes = dst_bytes, .device = CKPTIO_DEVICE_HOST};
  int rc = ckptio_reader_load_slices(r, &q, 1);
  if (verified) *verified = rc == 0 && q.verified;
  return rc;
}
