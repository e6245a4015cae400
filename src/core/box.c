/* Exact cover of a tensor by boxes (box.h). A grid of the boxes' cut points
 * answers most layouts cell by cell; the rest is compared pairwise, sorted
 * on the first dimension, within a budget. */
#include "core/box.h"

#include <stdlib.h>
#include <string.h>

uint64_t ckptio_box_volume(int ndim, const int64_t *size, int *overflow) {
  uint64_t v = 1;
  for (int d = 0; d < ndim; d++)
    if (__builtin_mul_overflow(v, (uint64_t)size[d], &v)) {
      *overflow = 1;
      return 0;
    }
  return v;
}

static int cmp_i64(const void *x, const void *y) {
  int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
  return (a > b) - (a < b);
}

/* Index of v in the sorted cuts (it is there). */
static size_t cut_index(const int64_t *cuts, size_t n, int64_t v) {
  size_t lo = 0, hi = n;
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (cuts[mid] <= v) lo = mid;
    else hi = mid;
  }
  return lo;
}

typedef struct grid {
  int ndim;
  int64_t *cuts[CKPTIO_MAX_DIMS];
  size_t ncuts[CKPTIO_MAX_DIMS];
  uint64_t cells;
} grid;

static void grid_free(grid *g) {
  for (int d = 0; d < g->ndim; d++) free(g->cuts[d]);
}

/* The distinct cut points per dimension; 0 when the cells would exceed cap. */
static ckptio_box_result grid_make(grid *g, int ndim, const int64_t *shape, const int64_t (*off)[CKPTIO_MAX_DIMS],
                                   const int64_t (*size)[CKPTIO_MAX_DIMS], const size_t *live, size_t n, uint64_t cap,
                                   int *fits) {
  memset(g, 0, sizeof(*g));
  g->ndim = ndim;
  g->cells = 1;
  *fits = 1;
  for (int d = 0; d < ndim; d++) {
    int64_t *c = malloc((2 * n + 2) * sizeof(int64_t));
    if (!c) return CKPTIO_BOX_NOMEM;
    g->cuts[d] = c;
    size_t m = 0;
    c[m++] = 0;
    c[m++] = shape[d];
    for (size_t i = 0; i < n; i++) {
      c[m++] = off[live[i]][d];
      c[m++] = off[live[i]][d] + size[live[i]][d];
    }
    qsort(c, m, sizeof(int64_t), cmp_i64);
    size_t u = 0;
    for (size_t i = 0; i < m; i++)
      if (u == 0 || c[u - 1] != c[i]) c[u++] = c[i];
    g->ncuts[d] = u;
    if (__builtin_mul_overflow(g->cells, (uint64_t)(u - 1), &g->cells) || g->cells > cap) *fits = 0;
  }
  return CKPTIO_BOX_OK;
}

static ckptio_box_result by_grid(const grid *g, const int64_t (*off)[CKPTIO_MAX_DIMS],
                                 const int64_t (*size)[CKPTIO_MAX_DIMS], const size_t *live, size_t n, size_t *a,
                                 size_t *b) {
  size_t *owner = malloc((size_t)g->cells * sizeof(size_t));
  if (!owner) return CKPTIO_BOX_NOMEM;
  memset(owner, 0xff, (size_t)g->cells * sizeof(size_t));
  ckptio_box_result res = CKPTIO_BOX_OK;
  for (size_t k = 0; k < n && res == CKPTIO_BOX_OK; k++) {
    size_t i = live[k], lo[CKPTIO_MAX_DIMS], hi[CKPTIO_MAX_DIMS], at[CKPTIO_MAX_DIMS];
    for (int d = 0; d < g->ndim; d++) {
      lo[d] = at[d] = cut_index(g->cuts[d], g->ncuts[d], off[i][d]);
      hi[d] = cut_index(g->cuts[d], g->ncuts[d], off[i][d] + size[i][d]);
    }
    for (;;) { /* every cell of the box, row-major */
      uint64_t cell = 0;
      for (int d = 0; d < g->ndim; d++) cell = cell * (g->ncuts[d] - 1) + at[d];
      if (owner[cell] != SIZE_MAX) {
        *a = owner[cell], *b = i;
        res = CKPTIO_BOX_OVERLAP;
        break;
      }
      owner[cell] = i;
      int d = g->ndim - 1;
      while (d >= 0 && ++at[d] == hi[d]) at[d] = lo[d], d--;
      if (d < 0) break;
    }
  }
  for (uint64_t c = 0; c < g->cells && res == CKPTIO_BOX_OK; c++)
    if (owner[c] == SIZE_MAX) res = CKPTIO_BOX_HOLE;
  free(owner);
  return res;
}

static int cmp_first(const void *x, const void *y, void *arg) {
  const int64_t(*off)[CKPTIO_MAX_DIMS] = arg;
  int64_t a = off[*(const size_t *)x][0], b = off[*(const size_t *)y][0];
  return (a > b) - (a < b);
}

static ckptio_box_result by_pairs(int ndim, const int64_t (*off)[CKPTIO_MAX_DIMS],
                                  const int64_t (*size)[CKPTIO_MAX_DIMS], size_t *live, size_t n, size_t *a,
                                  size_t *b) {
  qsort_r(live, n, sizeof(size_t), cmp_first, (void *)off);
  uint64_t budget = CKPTIO_BOX_PAIR_BUDGET;
  for (size_t x = 0; x < n; x++) {
    size_t i = live[x];
    for (size_t y = x + 1; y < n && off[live[y]][0] < off[i][0] + size[i][0]; y++) {
      if (budget-- == 0) return CKPTIO_BOX_TOO_COMPLEX;
      size_t j = live[y];
      int meet = 1;
      for (int d = 1; d < ndim && meet; d++)
        meet = off[i][d] < off[j][d] + size[j][d] && off[j][d] < off[i][d] + size[i][d];
      if (meet) {
        *a = i < j ? i : j, *b = i < j ? j : i;
        return CKPTIO_BOX_OVERLAP;
      }
    }
  }
  return CKPTIO_BOX_OK;
}

ckptio_box_result ckptio_box_cover_check(int ndim, const int64_t *shape, const int64_t (*off)[CKPTIO_MAX_DIMS],
                                         const int64_t (*size)[CKPTIO_MAX_DIMS], size_t n, size_t *a, size_t *b) {
  size_t dummy;
  if (!a) a = &dummy;
  if (!b) b = &dummy;
  *a = *b = 0;
  int over = 0;
  for (size_t i = 0; i < n; i++)
    for (int d = 0; d < ndim; d++) {
      int64_t end;
      if (off[i][d] < 0 || size[i][d] < 0 || __builtin_add_overflow(off[i][d], size[i][d], &end) || end > shape[d]) {
        *a = i;
        return CKPTIO_BOX_OUTSIDE;
      }
    }
  uint64_t total = ckptio_box_volume(ndim, shape, &over), sum = 0;
  if (over) return CKPTIO_BOX_TOO_COMPLEX;
  if (total == 0) return CKPTIO_BOX_OK; /* nothing to cover, and every box is empty */
  size_t *live = malloc((n + 1) * sizeof(size_t)), nl = 0;
  if (!live) return CKPTIO_BOX_NOMEM;
  for (size_t i = 0; i < n; i++) {
    uint64_t v = ckptio_box_volume(ndim, size[i], &over);
    if (v) live[nl++] = i;
    sum += v; /* each v <= total, n is bounded by memory: no wrap in practice, and checked below */
  }
  ckptio_box_result res;
  grid g;
  int fits;
  uint64_t cap = 4 * (uint64_t)nl + 4096;
  if ((res = grid_make(&g, ndim, shape, off, size, live, nl, cap, &fits)) == CKPTIO_BOX_OK) {
    if (fits) res = by_grid(&g, off, size, live, nl, a, b);
    else if ((res = by_pairs(ndim, off, size, live, nl, a, b)) == CKPTIO_BOX_OK && sum != total)
      res = CKPTIO_BOX_HOLE; /* no overlap: the volumes add up exactly when they cover */
  }
  grid_free(&g);
  free(live);
  return res;
}

/* ------------------------------------------------------------ runs */

int ckptio_box_meet(int ndim, const int64_t *alo, const int64_t *ahi, const int64_t *blo, const int64_t *bhi,
                    int64_t *lo, int64_t *hi) {
  int any = 1;
  for (int d = 0; d < ndim; d++) {
    lo[d] = alo[d] > blo[d] ? alo[d] : blo[d];
    hi[d] = ahi[d] < bhi[d] ? ahi[d] : bhi[d];
    if (hi[d] <= lo[d]) any = 0;
  }
  return any;
}

/* Elements to bytes, failing when they end off a byte boundary. */
static int bits_to_bytes(uint64_t elems, int bits, uint64_t *out) {
  if ((elems % 8) * (uint64_t)bits % 8) return CKPTIO_E_MISALIGNED;
  *out = elems / 8 * (uint64_t)bits + elems % 8 * (uint64_t)bits / 8;
  return 0;
}

int ckptio_box_runs(int ndim, int bits, const int64_t *lo, const int64_t *hi, const int64_t *a_off,
                    const int64_t *a_size, const int64_t *b_off, const int64_t *b_size, ckptio_box_run_fn emit,
                    void *arg) {
  uint64_t as[CKPTIO_MAX_DIMS], bs[CKPTIO_MAX_DIMS], idx[CKPTIO_MAX_DIMS] = {0}, s[CKPTIO_MAX_DIMS];
  uint64_t sa = 1, sb = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    if (hi[d] <= lo[d]) return 0;
    s[d] = (uint64_t)(hi[d] - lo[d]);
    as[d] = sa, bs[d] = sb;
    sa *= (uint64_t)a_size[d], sb *= (uint64_t)b_size[d];
  }
  /* The run: dimensions from k on, which the region holds whole in both
   * arrays (but k itself), and k's span. */
  int k = ndim ? ndim - 1 : 0;
  while (k > 0 && s[k] == (uint64_t)a_size[k] && s[k] == (uint64_t)b_size[k]) k--;
  uint64_t run = 1;
  for (int d = k; d < ndim; d++) run *= s[d];
  uint64_t run_bytes;
  int rc = bits_to_bytes(run, bits, &run_bytes);
  for (;;) {
    uint64_t a = 0, b = 0, ab, bb;
    for (int d = 0; d < ndim; d++) {
      uint64_t i = d < k ? idx[d] : 0;
      a += ((uint64_t)(lo[d] - a_off[d]) + i) * as[d];
      b += ((uint64_t)(lo[d] - b_off[d]) + i) * bs[d];
    }
    if (rc || (rc = bits_to_bytes(a, bits, &ab)) || (rc = bits_to_bytes(b, bits, &bb)) ||
        (rc = emit(arg, ab, bb, run_bytes)))
      return rc;
    int d = k - 1;
    for (; d >= 0; d--) { /* next index of the outer dimensions */
      if (++idx[d] < s[d]) break;
      idx[d] = 0;
    }
    if (d < 0) return 0;
  }
}
