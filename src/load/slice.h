/* A slice start:stop of one dimension of a tensor, as a geometry of runs of
 * the tensor's row-major bytes: slice.c loads it, plan.c names its bytes. */
#ifndef CKPTIO_LOAD_SLICE_H
#define CKPTIO_LOAD_SLICE_H

#include "load/reader.h"

/* Checks the slice against tensor `index` and describes it; failures set
 * the reader's message. @return 0, CKPTIO_E_INVALID_ARG, CKPTIO_E_MISALIGNED
 * or CKPTIO_E_OVERFLOW. */
int ckptio_slice_geom_of(ckptio_reader *r, size_t index, int dim, int64_t start, int64_t stop, ckptio_geom *g);

#endif
