/* A slice start:stop of one dimension of a tensor, as the runs of the
 * tensor's row-major bytes it is made of. slice.c loads them; plan.c names
 * them as file byte ranges for tensor-parallel loaders. */
#ifndef CKPTIO_SLICE_H
#define CKPTIO_SLICE_H

#include <stdint.h>

#include "reader_internal.h"

/* Output byte x of the slice is byte src0 + (x / run) * pitch + x % run of
 * the tensor's row-major bytes (for a PyTorch view: of its logical bytes,
 * gathered from the storage). count runs of run bytes; one run when the
 * slice is contiguous in the tensor. */
typedef struct ckptio_slice_geom {
  uint64_t src0, run, pitch, count;
  uint64_t nbytes;   /* run * count */
  int full;          /* the slice is the whole tensor */
} ckptio_slice_geom;

/* Checks the slice against tensor `index` and describes it; failures set
 * the reader's message. @return 0, CKPTIO_E_INVALID_ARG, CKPTIO_E_MISALIGNED
 * or CKPTIO_E_OVERFLOW. */
int ckptio_slice_geom_of(ckptio_reader *r, size_t index, int dim, int64_t start, int64_t stop,
                         ckptio_slice_geom *g);

/* The part of output bytes [x, end) that lies in one run: *n bytes from
 * byte *src of the tensor's row-major bytes. */
static inline void ckptio_slice_subrun(const ckptio_slice_geom *g, uint64_t x, uint64_t end,
                                       uint64_t *src, uint64_t *n) {
  uint64_t k = x / g->run, within = x % g->run;
  *n = g->run - within < end - x ? g->run - within : end - x;
  *src = g->src0 + k * g->pitch + within;
}

#endif
