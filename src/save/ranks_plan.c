/* The agreement of a multi-rank save (ranks.h). Each rank describes its
 * parts in a small byte string; an all-gather gives every rank all of them,
 * and every rank runs the same checks and the same plan over the same bytes,
 * so they agree without a coordinator. The byte strings use the machine's
 * byte order: the ranks of one save run one build on one kind of machine. */
#include "save/ranks.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/box.h"
#include "core/collective.h"
#include "core/error.h"

/* ------------------------------------------------------------ bytes */

typedef struct bytes {
  unsigned char *p;
  size_t len, cap;
} bytes;

static int put(bytes *b, const void *x, size_t n) {
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n) cap *= 2;
    unsigned char *q = realloc(b->p, cap);
    if (!q) return -ENOMEM;
    b->p = q, b->cap = cap;
  }
  memcpy(b->p + b->len, x, n);
  b->len += n;
  return 0;
}

typedef struct reader {
  const unsigned char *p;
  size_t len, pos;
} reader;

static int take(reader *r, void *x, size_t n) {
  if (r->len - r->pos < n) return -1;
  memcpy(x, r->p + r->pos, n);
  r->pos += n;
  return 0;
}

/* A status first (so a rank that failed before the gather still takes part
 * in it), then the save id and the tensors. */
static int describe(const ckptio_collect *c, int status, const char *msg, const char *save_id, bytes *b) {
  int32_t st = status;
  uint32_t mlen = msg ? (uint32_t)strlen(msg) : 0, count = (uint32_t)c->count;
  int rc = put(b, &st, 4) | put(b, &mlen, 4) | put(b, msg ? msg : "", mlen) | put(b, save_id, 32) | put(b, &count, 4);
  for (size_t i = 0; i < c->count && rc == 0; i++) {
    const ckptio_ctensor *t = &c->tensors[i];
    uint32_t nlen = (uint32_t)strlen(t->t.name) + 1;
    int32_t dtype = t->t.dtype, ndim = t->t.ndim;
    size_t dims = (size_t)ndim * 8;
    rc = put(b, &nlen, 4) | put(b, t->t.name, nlen) | put(b, &dtype, 4) | put(b, &ndim, 4) | put(b, t->global, dims) |
         put(b, t->offsets, dims) | put(b, t->t.shape, dims);
  }
  return rc ? -ENOMEM : 0;
}

/* ------------------------------------------------------------ plan */

typedef struct entry {
  const char *name;
  int rank;
  size_t local;
  ckptio_dtype dtype;
  int ndim;
  int64_t global[CKPTIO_MAX_DIMS], off[CKPTIO_MAX_DIMS], size[CKPTIO_MAX_DIMS];
} entry;

static int cmp_dims(const int64_t *a, const int64_t *b, int n) {
  for (int d = 0; d < n; d++)
    if (a[d] != b[d]) return a[d] < b[d] ? -1 : 1;
  return 0;
}

static int same_box(const entry *a, const entry *b) {
  return a->ndim == b->ndim && !cmp_dims(a->off, b->off, a->ndim) && !cmp_dims(a->size, b->size, a->ndim);
}

static int cmp_entry(const void *x, const void *y) {
  const entry *a = x, *b = y;
  int c = strcmp(a->name, b->name);
  if (c) return c;
  int n = a->ndim < b->ndim ? a->ndim : b->ndim;
  if ((c = cmp_dims(a->off, b->off, n)) || (c = cmp_dims(a->size, b->size, n))) return c;
  return a->rank - b->rank;
}

static void dims_text(const int64_t *v, int n, char *buf, size_t len) {
  size_t at = (size_t)snprintf(buf, len, "[");
  for (int d = 0; d < n && at < len; d++) at += (size_t)snprintf(buf + at, len - at, d ? ", %lld" : "%lld", (long long)v[d]);
  if (at < len) snprintf(buf + at, len - at, "]");
}

/* Reads rank r's description; a failed rank's status comes back as its rc. */
static int parse_rank(const unsigned char *p, uint64_t len, int r, entry **ents, size_t *n, size_t *cap,
                      char *save_id, char *err) {
  reader rd = {p, (size_t)len, 0};
  int32_t st;
  uint32_t mlen, count;
  if (take(&rd, &st, 4) || take(&rd, &mlen, 4) || mlen > len - rd.pos) goto bad;
  if (st < 0) /* the first failed rank is named; a failed rank keeps its own code (its caller's) */
    return ckptio_err_fmt(err, CKPTIO_ERRLEN, CKPTIO_E_RANK, "rank %d failed before the save began: %.*s", r,
                          (int)(mlen < 400 ? mlen : 400), (const char *)p + rd.pos);
  rd.pos += mlen;
  char id[32];
  if (take(&rd, id, 32) || take(&rd, &count, 4)) goto bad;
  if (r == 0) memcpy(save_id, id, 32), save_id[32] = '\0';
  for (uint32_t i = 0; i < count; i++) {
    uint32_t nlen;
    int32_t dtype, ndim;
    if (take(&rd, &nlen, 4) || nlen == 0 || nlen > len - rd.pos || p[rd.pos + nlen - 1] != '\0') goto bad;
    const char *name = (const char *)p + rd.pos;
    rd.pos += nlen;
    if (take(&rd, &dtype, 4) || take(&rd, &ndim, 4) || ndim < 0 || ndim > CKPTIO_MAX_DIMS) goto bad;
    if (*n == *cap) {
      size_t c2 = *cap ? 2 * *cap : 64;
      entry *e2 = realloc(*ents, c2 * sizeof(entry));
      if (!e2) return -ENOMEM;
      *ents = e2, *cap = c2;
    }
    entry *e = &(*ents)[(*n)++];
    memset(e, 0, sizeof(*e));
    e->name = name, e->rank = r, e->local = i, e->dtype = (ckptio_dtype)dtype, e->ndim = ndim;
    size_t dims = (size_t)ndim * 8;
    if (take(&rd, e->global, dims) || take(&rd, e->off, dims) || take(&rd, e->size, dims)) goto bad;
  }
  return 0;
bad:
  return ckptio_err_fmt(err, CKPTIO_ERRLEN, CKPTIO_E_RANK, "rank %d sent a malformed description of its tensors", r);
}

/* One tensor's entries [a, b): the same dtype and global shape everywhere,
 * distinct boxes covering it exactly. Appends its distinct boxes. */
static int plan_tensor(ckptio_rplan *pl, entry *e, size_t a, size_t b, int **holders, size_t *hcount, char *err) {
  const entry *f = &e[a];
  char s1[256], s2[256];
  for (size_t i = a + 1; i < b; i++)
    if (e[i].dtype != f->dtype || e[i].ndim != f->ndim || cmp_dims(e[i].global, f->global, f->ndim)) {
      dims_text(f->global, f->ndim, s1, sizeof(s1));
      dims_text(e[i].global, e[i].ndim, s2, sizeof(s2));
      return ckptio_err_fmt(err, CKPTIO_ERRLEN, CKPTIO_E_RANK,
                            "tensor '%s': rank %d has it as %s %s, rank %d as %s %s", f->name, f->rank,
                            ckptio_dtype_name(f->dtype) ? ckptio_dtype_name(f->dtype) : "?", s1, e[i].rank,
                            ckptio_dtype_name(e[i].dtype) ? ckptio_dtype_name(e[i].dtype) : "?", s2);
    }
  size_t first = pl->nboxes, nd = 0;
  int64_t(*off)[CKPTIO_MAX_DIMS] = calloc(b - a, sizeof(*off));
  int64_t(*size)[CKPTIO_MAX_DIMS] = calloc(b - a, sizeof(*size));
  int rc = off && size ? 0 : -ENOMEM;
  for (size_t i = a; i < b && rc == 0; i++) {
    if (i > a && same_box(&e[i], &e[i - 1])) { /* a replica: one more holder of the last box */
      holders[pl->nboxes - 1][hcount[pl->nboxes - 1]++] = e[i].rank;
      continue;
    }
    ckptio_rbox *x = &pl->boxes[pl->nboxes];
    memset(x, 0, sizeof(*x));
    x->name = e[i].name, x->dtype = e[i].dtype, x->ndim = e[i].ndim;
    memcpy(x->global, e[i].global, sizeof(x->global));
    memcpy(x->off, e[i].off, sizeof(x->off));
    memcpy(x->size, e[i].size, sizeof(x->size));
    x->nbytes = (uint64_t)ckptio_tensor_nbytes(x->dtype, x->ndim, x->size);
    memcpy(off[nd], x->off, sizeof(off[nd]));
    memcpy(size[nd], x->size, sizeof(size[nd]));
    holders[pl->nboxes][0] = e[i].rank;
    hcount[pl->nboxes] = 1;
    pl->nboxes++, nd++;
  }
  size_t ia = 0, ib = 0;
  ckptio_box_result why = rc == 0 ? ckptio_box_cover_check(f->ndim, f->global, off, size, nd, &ia, &ib) : CKPTIO_BOX_OK;
  if (rc == 0 && why != CKPTIO_BOX_OK) {
    const ckptio_rbox *x = &pl->boxes[first + ia], *y = &pl->boxes[first + (why == CKPTIO_BOX_OVERLAP ? ib : ia)];
    dims_text(x->off, x->ndim, s1, sizeof(s1));
    dims_text(y->off, y->ndim, s2, sizeof(s2));
    dims_text(f->global, f->ndim, s2 + 128, 128);
    rc = why == CKPTIO_BOX_NOMEM ? -ENOMEM
         : why == CKPTIO_BOX_OVERLAP
             ? ckptio_err_fmt(err, CKPTIO_ERRLEN, CKPTIO_E_RANK,
                              "tensor '%s': the part at %s (rank %d) overlaps the part at %s (rank %d)", f->name, s1,
                              holders[first + ia][0], s2, holders[first + ib][0])
         : why == CKPTIO_BOX_HOLE
             ? ckptio_err_fmt(err, CKPTIO_ERRLEN, CKPTIO_E_RANK,
                              "tensor '%s': the ranks' parts leave a hole in its shape %s", f->name, s2 + 128)
         : why == CKPTIO_BOX_OUTSIDE
             ? ckptio_err_fmt(err, CKPTIO_ERRLEN, CKPTIO_E_RANK, "tensor '%s': the part at %s (rank %d) is outside %s",
                              f->name, s1, holders[first + ia][0], s2 + 128)
             : ckptio_err_fmt(err, CKPTIO_ERRLEN, CKPTIO_E_RANK,
                              "tensor '%s': too many parts to check their cover (%zu)", f->name, nd);
  }
  free(off);
  free(size);
  return rc;
}

/* Who writes each box: its only holder, or among a replica's holders the
 * one with the fewest bytes so far (the lowest rank on a tie), boxes taken
 * in plan order; the same on every rank because the input is. */
static int assign(ckptio_rplan *pl, int **holders, const size_t *hcount, const entry *e, size_t ne, int nranks) {
  uint64_t *load = calloc((size_t)nranks, sizeof(uint64_t));
  if (!load) return -ENOMEM;
  for (size_t k = 0; k < pl->nboxes; k++)
    if (hcount[k] == 1) load[holders[k][0]] += pl->boxes[k].nbytes;
  for (size_t k = 0; k < pl->nboxes; k++) {
    int best = holders[k][0];
    for (size_t h = 1; h < hcount[k]; h++)
      if (load[holders[k][h]] < load[best]) best = holders[k][h];
    if (hcount[k] > 1) load[best] += pl->boxes[k].nbytes;
    pl->boxes[k].writer = best;
  }
  free(load);
  /* The writer's own index of each box, from its entry. */
  for (size_t i = 0; i < ne; i++) {
    /* Entries and boxes are both in (name, box) order: find e[i]'s box. */
    size_t lo = 0, hi = pl->nboxes;
    while (lo < hi) {
      size_t mid = (lo + hi) / 2;
      const ckptio_rbox *x = &pl->boxes[mid];
      int c = strcmp(x->name, e[i].name);
      if (!c) c = cmp_dims(x->off, e[i].off, x->ndim < e[i].ndim ? x->ndim : e[i].ndim);
      if (!c) c = cmp_dims(x->size, e[i].size, x->ndim < e[i].ndim ? x->ndim : e[i].ndim);
      if (c < 0) lo = mid + 1;
      else hi = mid;
    }
    if (lo < pl->nboxes && pl->boxes[lo].writer == e[i].rank) pl->boxes[lo].local = e[i].local;
  }
  return 0;
}

int ckptio_rplan_make(const ckptio_comm *comm, const ckptio_collect *mine, int status, const char *why,
                      const char *save_id, ckptio_rplan *out, char *err) {
  memset(out, 0, sizeof(*out));
  bytes b = {0};
  int local = status < 0 ? describe(&(ckptio_collect){0}, status, why, save_id, &b)
                         : describe(mine, 0, NULL, save_id, &b);
  if (local < 0) { /* still take part in the gather, so the others learn why */
    b.len = 0;
    local = describe(&(ckptio_collect){0}, -ENOMEM, "out of memory describing its tensors", save_id, &b);
    if (local < 0) return -ENOMEM; /* not even a status fits: the others will wait on this rank */
  }
  uint64_t *lens = NULL, stride = 0;
  int rc = ckptio_comm_gather(comm, b.p, b.len, &out->buf, &lens, &stride, err);
  free(b.p);
  entry *e = NULL;
  size_t ne = 0, cap = 0, nr = (size_t)comm->nranks;
  int **holders = NULL;
  size_t *hcount = NULL;
  for (size_t r = 0; r < nr && rc == 0; r++)
    rc = parse_rank(out->buf + r * stride, lens[r], (int)r, &e, &ne, &cap, out->save_id, err);
  if (rc < 0) goto out;
  qsort(e, ne, sizeof(*e), cmp_entry);
  rc = -ENOMEM;
  out->boxes = calloc(ne + 1, sizeof(*out->boxes));
  out->first = calloc(ne + 2, sizeof(size_t));
  out->file_of = calloc(nr, sizeof(int));
  holders = calloc(ne + 1, sizeof(*holders));
  hcount = calloc(ne + 1, sizeof(size_t));
  if (!out->boxes || !out->first || !out->file_of || !holders || !hcount) goto out;
  for (size_t i = 0; i < ne; i++)
    if (!(holders[i] = calloc(nr, sizeof(int)))) goto out;
  rc = 0;
  for (size_t a = 0, b2; a < ne && rc == 0; a = b2) {
    for (b2 = a + 1; b2 < ne && !strcmp(e[b2].name, e[a].name);) b2++;
    out->first[out->ntensors++] = out->nboxes;
    rc = plan_tensor(out, e, a, b2, holders, hcount, err);
    if (rc == 0) {
      int64_t nb = ckptio_tensor_nbytes(e[a].dtype, e[a].ndim, e[a].global);
      out->total_bytes += nb > 0 ? (uint64_t)nb : 0;
    }
  }
  out->first[out->ntensors] = out->nboxes;
  if (rc < 0) goto out;
  if ((rc = assign(out, holders, hcount, e, ne, comm->nranks)) < 0) goto out;
  for (size_t r = 0; r < nr; r++) out->file_of[r] = -1;
  for (size_t k = 0; k < out->nboxes; k++) out->file_of[out->boxes[k].writer] = 0;
  for (size_t r = 0; r < nr; r++)
    if (out->file_of[r] == 0) out->file_of[r] = (int)out->nfiles++;
out:
  for (size_t i = 0; holders && i < ne; i++) free(holders[i]);
  free(holders);
  free(hcount);
  free(e);
  free(lens);
  if (rc == -ENOMEM && !err[0]) snprintf(err, CKPTIO_ERRLEN, "rank %d: out of memory planning the save", comm->rank);
  if (rc < 0) ckptio_rplan_free(out);
  return rc;
}

void ckptio_rplan_free(ckptio_rplan *p) {
  free(p->buf);
  free(p->boxes);
  free(p->first);
  free(p->file_of);
  memset(p, 0, sizeof(*p));
}
