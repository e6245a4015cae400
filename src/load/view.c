/* The strided-view walk (view.h). */
#include "load/view.h"

#include <string.h>

#include "load/source.h"

void ckptio_view_runs(const ckptio_entry *e, uint64_t first, uint64_t count,
                      void (*run)(void *arg, uint64_t off, uint64_t len), void *arg) {
  uint64_t es = (uint64_t)ckptio_entry_elem(e);
  int nd = e->ndim;
  int64_t idx[CKPTIO_MAX_DIMS];
  uint64_t rem = first;
  for (int d = nd - 1; d >= 0; d--) {
    idx[d] = (int64_t)(rem % (uint64_t)e->shape[d]);
    rem /= (uint64_t)e->shape[d];
  }
  while (count) {
    int64_t pos = (int64_t)e->elem_offset;
    for (int d = 0; d < nd; d++) pos += idx[d] * e->stride[d];
    uint64_t n = 1;
    if (nd > 0 && e->stride[nd - 1] == 1) {
      n = (uint64_t)(e->shape[nd - 1] - idx[nd - 1]);
      if (n > count) n = count;
    }
    run(arg, (uint64_t)pos * es, n * es);
    count -= n;
    if (nd == 0) break;
    idx[nd - 1] += (int64_t)n;
    for (int d = nd - 1; d > 0 && idx[d] >= e->shape[d]; d--) {
      idx[d] = 0;
      idx[d - 1]++;
    }
  }
}

typedef struct gather_to {
  unsigned char *dst;
  const unsigned char *base;
} gather_to;

static void gather_run(void *arg, uint64_t off, uint64_t len) {
  gather_to *g = arg;
  memcpy(g->dst, g->base + off, (size_t)len);
  g->dst += len;
}

void ckptio_view_gather(unsigned char *dst, const unsigned char *base, const ckptio_entry *e, uint64_t first,
                        uint64_t count) {
  gather_to g = {dst, base};
  ckptio_view_runs(e, first, count, gather_run, &g);
}
