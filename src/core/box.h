/* Boxes of a tensor (offsets and sizes per dimension): whether a set of
 * them covers a tensor exactly, each inside it and none overlapping. Pure
 * arithmetic, bounded for any input: what the multi-rank index parser and
 * the multi-rank save's agreement both check. */
#ifndef CKPTIO_CORE_BOX_H
#define CKPTIO_CORE_BOX_H

#include <stddef.h>
#include <stdint.h>

#include "ckptio.h"

typedef enum {
  CKPTIO_BOX_OK = 0,
  CKPTIO_BOX_OUTSIDE,      /* box *a leaves the shape (or has a negative value) */
  CKPTIO_BOX_OVERLAP,      /* boxes *a and *b share elements (identical boxes too) */
  CKPTIO_BOX_HOLE,         /* some element is in no box */
  CKPTIO_BOX_TOO_COMPLEX,  /* not a grid and beyond the pairwise budget */
  CKPTIO_BOX_NOMEM,
} ckptio_box_result;

/* Pairwise comparisons allowed when the boxes do not form a grid. */
#define CKPTIO_BOX_PAIR_BUDGET (1u << 26)

/*! Checks n boxes (off[i][d], size[i][d] for d < ndim) of a tensor of
 *  `shape`. Boxes that form a grid (the cut points of every dimension, and
 *  each box a union of cells: what tensor-parallel, FSDP and mesh splits
 *  give) are checked in O(n log n + cells) with cells <= 4n + 4096; other
 *  layouts by sorted pairwise comparison within CKPTIO_BOX_PAIR_BUDGET.
 *  Boxes of no elements are ignored for overlap and cover. */
ckptio_box_result ckptio_box_cover_check(int ndim, const int64_t *shape, const int64_t (*off)[CKPTIO_MAX_DIMS],
                                         const int64_t (*size)[CKPTIO_MAX_DIMS], size_t n, size_t *a, size_t *b);

/*! The box both [alo, ahi) and [blo, bhi) hold, into [lo, hi).
 *  @return 1 when it holds an element (a 0-d box always does), else 0. */
int ckptio_box_meet(int ndim, const int64_t *alo, const int64_t *ahi, const int64_t *blo, const int64_t *bhi,
                    int64_t *lo, int64_t *hi);

/* A contiguous run of a region copied between two arrays: `n` bytes at
 * byte `a` of the one and byte `b` of the other. @return 0 or a code that
 * stops the walk. */
typedef int (*ckptio_box_run_fn)(void *arg, uint64_t a, uint64_t b, uint64_t n);

/*! Walks the region [lo, hi) (inside both arrays) of two row-major arrays
 *  of `bits`-bit elements, array a holding the box at a_off of sizes
 *  a_size and b the box at b_off of sizes b_size, as runs as long as both
 *  layouts allow, in row-major order of the region. @return 0, emit's
 *  code, or CKPTIO_E_MISALIGNED (a run off a byte boundary). */
int ckptio_box_runs(int ndim, int bits, const int64_t *lo, const int64_t *hi, const int64_t *a_off,
                    const int64_t *a_size, const int64_t *b_off, const int64_t *b_size, ckptio_box_run_fn emit,
                    void *arg);

/*! Elements of a box; 0 with *overflow = 1 when they overflow 64 bits. */
uint64_t ckptio_box_volume(int ndim, const int64_t *size, int *overflow);

#endif
