/* Boxes: an N-dimensional box of a tensor, loaded from the stored parts
 * that overlap it (one part for a tensor stored whole, several for a tensor
 * of a multi-rank checkpoint). Each part's share of the box is a few
 * geometries of equal runs (source.h) landing at a pitch in the destination;
 * the executor runs them like any load, reading only the bytes they name. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "load/box.h"

int ckptio_xreqs_push(ckptio_xreqs *v, const ckptio_xreq *q) {
  if (v->n == v->cap) {
    size_t cap = v->cap ? 2 * v->cap : 16;
    ckptio_xreq *p = realloc(v->q, cap * sizeof(*p));
    if (!p) return -ENOMEM;
    v->q = p, v->cap = cap;
  }
  memcpy(&v->q[v->n++], q, sizeof(*q));
  return 0;
}

size_t ckptio_reader_parts_of(const ckptio_reader *r, size_t index, const ckptio_spart **out, ckptio_spart *one) {
  size_t n = r->src->ops->parts ? r->src->ops->parts(r->src, index, out) : 0;
  if (n) return n;
  memset(one, 0, sizeof(*one));
  one->src = r->src->ops->member(r->src, index, &one->local, NULL);
  *out = one;
  return 1;
}

/* ------------------------------------------------------------ geometry */

/* Elements to bytes; *bad set when they do not end on a byte boundary. */
static uint64_t to_bytes(uint64_t elems, int bits, int *bad) {
  if ((elems % 8) * (uint64_t)bits % 8) *bad = 1;
  return elems / 8 * (uint64_t)bits + elems % 8 * (uint64_t)bits / 8;
}

/* Row-major element strides of a shape. */
static void strides(int nd, const int64_t *shape, uint64_t *st) {
  uint64_t s = 1;
  for (int d = nd - 1; d >= 0; d--) {
    st[d] = s;
    s *= (uint64_t)shape[d];
  }
}

typedef struct cut {
  int nd, k, j;            /* runs along dims > k (and k's span); counted over j..k-1 */
  int64_t s[CKPTIO_MAX_DIMS], pl[CKPTIO_MAX_DIMS], dl[CKPTIO_MAX_DIMS];
  uint64_t ps[CKPTIO_MAX_DIMS], ds[CKPTIO_MAX_DIMS];
} cut;

/* The part of a box [start, stop) that a stored part (offsets off, shape
 * shape) holds: *empty when none. Runs are as long as the dimensions that
 * both the part and the box hold whole allow. */
static void cut_of(int nd, const int64_t *start, const int64_t *stop, const int64_t *off, const int64_t *shape, cut *c,
                   int *empty) {
  int64_t box[CKPTIO_MAX_DIMS];
  memset(c, 0, sizeof(*c));
  c->nd = nd;
  *empty = 0;
  for (int d = 0; d < nd; d++) {
    int64_t lo = start[d] > off[d] ? start[d] : off[d];
    int64_t hi = stop[d] < off[d] + shape[d] ? stop[d] : off[d] + shape[d];
    if (hi <= lo) *empty = 1;
    c->s[d] = hi > lo ? hi - lo : 0;
    c->pl[d] = lo - off[d];
    c->dl[d] = lo - start[d];
    box[d] = stop[d] - start[d];
  }
  strides(nd, shape, c->ps);
  strides(nd, box, c->ds);
#define WHOLE(d) (c->s[d] == shape[d] && c->s[d] == box[d])
  c->k = nd ? nd - 1 : 0;
  while (c->k > 0 && WHOLE(c->k)) c->k--;
  c->j = c->k;
  if (c->k > 0) {
    c->j = c->k - 1;
    while (c->j > 0 && WHOLE(c->j)) c->j--;
  }
#undef WHOLE
}

/* One geometry per index of the outer dims 0..j-1. */
static int emit_cut(ckptio_reader *r, const cut *c, const ckptio_spart *p, const ckptio_entry *e, unsigned char *dst,
                    int gpu, int check, ckptio_xreqs *v, size_t *made) {
  int bits = ckptio_dtype_bits(e->dtype), bad = 0;
  uint64_t run = c->nd ? (uint64_t)c->s[c->k] * c->ps[c->k] : 1, count = 1;
  for (int d = c->j; d < c->k; d++) count *= (uint64_t)c->s[d];
  uint64_t pitch = c->k > 0 ? c->ps[c->k - 1] : run, dpitch = c->k > 0 ? c->ds[c->k - 1] : run;
  uint64_t outer = 1, idx[CKPTIO_MAX_DIMS] = {0};
  for (int d = 0; d < c->j; d++) outer *= (uint64_t)c->s[d];
  ckptio_geom g = {0};
  g.run = to_bytes(run, bits, &bad);
  g.pitch = to_bytes(pitch, bits, &bad);
  g.count = count;
  uint64_t dp = to_bytes(dpitch, bits, &bad), drun = g.run;
  if (g.count == 1 || dp == g.run) dp = 0; /* lands contiguous */
  if (g.count > 1 && g.run == g.pitch) g.run *= g.count, g.count = 1; /* read as one stretch */
  g.nbytes = g.run * g.count;
  g.full = 1;
  for (int d = 0; d < c->nd; d++) g.full &= c->s[d] == e->shape[d];
  for (uint64_t o = 0; o < outer; o++) {
    uint64_t src = 0, at = 0;
    for (int d = 0; d < c->nd; d++) {
      uint64_t i = d < c->j ? idx[d] : 0;
      src += ((uint64_t)c->pl[d] + i) * c->ps[d];
      at += ((uint64_t)c->dl[d] + i) * c->ds[d];
    }
    g.src0 = to_bytes(src, bits, &bad);
    uint64_t dst_off = to_bytes(at, bits, &bad);
    if (bad)
      return ckptio_fail(r->err, CKPTIO_E_MISALIGNED,
                         "%s: tensor '%s': the box cuts %s elements (%d bits) off a byte boundary", r->src->path,
                         e->name, ckptio_dtype_name(e->dtype), bits);
    ckptio_xreq q = {.src = p->src, .e = e, .dst = dst ? dst + dst_off : NULL, .gpu = gpu, .g = g, .dpitch = dp,
                     .drun = drun,
                     .check = check && g.full && outer == 1 && e->has_crc && !e->strided};
    if (ckptio_xreqs_push(v, &q) < 0) return -ENOMEM;
    (*made)++;
    for (int d = c->j - 1; d >= 0; d--) { /* next outer index */
      if (++idx[d] < (uint64_t)c->s[d]) break;
      idx[d] = 0;
    }
  }
  return 0;
}

int ckptio_box_check(ckptio_reader *r, size_t index, const int64_t *start, const int64_t *stop, uint64_t *nbytes) {
  if (index >= r->src->idx.count)
    return ckptio_fail(r->err, CKPTIO_E_INVALID_ARG, "%s: no tensor at index %zu (there are %zu)", r->src->path, index,
                       r->src->idx.count);
  const ckptio_entry *e = ckptio_reader_entry(r, index);
  int64_t shape[CKPTIO_MAX_DIMS];
  if (!start || !stop) return CKPTIO_E_INVALID_ARG;
  for (int d = 0; d < e->ndim; d++) {
    if (start[d] < 0 || start[d] > stop[d] || stop[d] > e->shape[d])
      return ckptio_fail(r->err, CKPTIO_E_INVALID_ARG,
                         "%s: tensor '%s': box %lld:%lld of dim %d is outside the tensor (0 <= start <= stop <= %lld)",
                         r->src->path, e->name, (long long)start[d], (long long)stop[d], d, (long long)e->shape[d]);
    shape[d] = stop[d] - start[d];
  }
  int64_t nb = ckptio_tensor_nbytes(e->dtype, e->ndim, shape);
  if (nb < 0)
    return ckptio_fail(r->err, (int)nb, "%s: tensor '%s': the box's bytes: %s", r->src->path, e->name,
                       ckptio_strerror((int)nb));
  *nbytes = (uint64_t)nb;
  return 0;
}

int ckptio_box_reqs(ckptio_reader *r, size_t index, const int64_t *start, const int64_t *stop, unsigned char *dst,
                    int gpu, int check, ckptio_xreqs *v, int *verified) {
  const ckptio_entry *te = ckptio_reader_entry(r, index);
  const ckptio_spart *parts;
  ckptio_spart one;
  size_t n = ckptio_reader_parts_of(r, index, &parts, &one);
  int all = check, rc;
  for (size_t i = 0; i < n; i++) {
    const ckptio_entry *e = &parts[i].src->idx.entries[parts[i].local];
    cut c;
    int empty;
    cut_of(te->ndim, start, stop, parts[i].off, e->shape, &c, &empty);
    if (empty) continue;
    size_t made = 0, first = v->n;
    if ((rc = emit_cut(r, &c, &parts[i], e, dst, gpu, check, v, &made)) < 0) return rc;
    int full = v->q[first].g.full;
    if (!full || !e->has_crc) {
      all = 0;
    } else if (check && (made > 1 || e->strided)) {
      /* The part lands in pieces (or gathered from a storage): its CRC is
       * checked by a read of its stored bytes on their own. */
      ckptio_xreq q = {.src = parts[i].src, .e = e, .gpu = -1, .raw = 1, .check = 1,
                       .g = {0, e->nbytes, e->nbytes, e->nbytes ? 1 : 0, e->nbytes, 1}};
      if (ckptio_xreqs_push(v, &q) < 0) return -ENOMEM;
    }
  }
  if (verified) *verified = all;
  return 0;
}

int ckptio_box_check_reqs(ckptio_reader *r, size_t index, const int64_t *start, const int64_t *stop,
                          ckptio_xreqs *v, int *verified) {
  const ckptio_entry *te = ckptio_reader_entry(r, index);
  const ckptio_spart *parts;
  ckptio_spart one;
  size_t n = ckptio_reader_parts_of(r, index, &parts, &one);
  int all = 1;
  for (size_t i = 0; i < n; i++) {
    const ckptio_entry *e = &parts[i].src->idx.entries[parts[i].local];
    cut c;
    int empty, whole = 1;
    cut_of(te->ndim, start, stop, parts[i].off, e->shape, &c, &empty);
    if (empty) continue;
    for (int d = 0; d < te->ndim; d++) whole &= c.s[d] == e->shape[d];
    if (!e->has_crc) all = 0;
    if (whole || !e->has_crc) continue; /* a whole part is checked as it is read */
    ckptio_xreq q = {.src = parts[i].src, .e = e, .gpu = -1, .raw = 1, .check = 1,
                     .g = {0, e->nbytes, e->nbytes, e->nbytes ? 1 : 0, e->nbytes, 1}};
    if (ckptio_xreqs_push(v, &q) < 0) return -ENOMEM;
  }
  *verified = all;
  return 0;
}

/* ------------------------------------------------------------ public */

int64_t ckptio_reader_box_nbytes(ckptio_reader *r, size_t index, const int64_t *start, const int64_t *stop) {
  if (!r) return CKPTIO_E_INVALID_ARG;
  uint64_t nb;
  int rc = ckptio_box_check(r, index, start, stop, &nb);
  return rc < 0 ? rc : (int64_t)nb;
}

int ckptio_reader_load_boxes(ckptio_reader *r, ckptio_box_request *reqs, size_t n) {
  if (!r || (n && !reqs)) return CKPTIO_E_INVALID_ARG;
  ckptio_xreqs v = {0};
  size_t *first = calloc(n + 1, sizeof(size_t));
  int rc = first ? 0 : -ENOMEM;
  for (size_t i = 0; i < n && rc == 0; i++) {
    ckptio_box_request *q = &reqs[i];
    uint64_t nb;
    int gpu;
    q->verified = 0;
    q->bytes_read = 0;
    first[i] = v.n;
    if ((rc = ckptio_box_check(r, q->index, q->start, q->stop, &nb)) < 0) break;
    const ckptio_entry *e = ckptio_reader_entry(r, q->index);
    if (q->dst_bytes < nb || (!q->dst && nb)) {
      rc = ckptio_fail(r->err, CKPTIO_E_BUFFER_TOO_SMALL,
                       "%s: tensor '%s': the box needs %llu bytes, the destination has %llu", r->src->path, e->name,
                       (unsigned long long)nb, (unsigned long long)(q->dst ? q->dst_bytes : 0));
      break;
    }
    if ((rc = ckptio_reader_check_device(r, e, q->dst, q->device, nb, "box destination", &gpu)) < 0) break;
    if (nb) rc = ckptio_box_reqs(r, q->index, q->start, q->stop, q->dst, gpu, r->opts.crc, &v, &q->verified);
  }
  if (first) first[n] = v.n;
  if (rc == 0) rc = ckptio_reader_exec(r, v.q, v.n, 0);
  for (size_t i = 0; first && i < n; i++)
    for (size_t k = first[i]; k < first[i + 1]; k++) reqs[i].bytes_read += atomic_load(&v.q[k].read);
  if (rc < 0)
    for (size_t i = 0; i < n; i++) reqs[i].verified = 0;
  free(v.q);
  free(first);
  return rc;
}

size_t ckptio_reader_part_count(const ckptio_reader *r, size_t index) {
  if (!r || index >= r->src->idx.count) return 0;
  const ckptio_spart *parts;
  ckptio_spart one;
  return ckptio_reader_parts_of(r, index, &parts, &one);
}

int ckptio_reader_part(const ckptio_reader *r, size_t index, size_t k, const char **path, int64_t *offsets,
                       int64_t *sizes) {
  if (!r || index >= r->src->idx.count) return CKPTIO_E_INVALID_ARG;
  const ckptio_spart *parts;
  ckptio_spart one;
  size_t n = ckptio_reader_parts_of(r, index, &parts, &one);
  if (k >= n) return CKPTIO_E_INVALID_ARG;
  const ckptio_entry *e = &parts[k].src->idx.entries[parts[k].local];
  if (path) *path = parts[k].src->path;
  for (int d = 0; d < e->ndim; d++) {
    if (offsets) offsets[d] = parts[k].off[d];
    if (sizes) sizes[d] = e->shape[d];
  }
  return 0;
}
