/* PyTorch views: a tensor whose elements sit at strides inside a larger
 * storage. The walk in row-major order that gathers and plans share. */
#ifndef CKPTIO_LOAD_VIEW_H
#define CKPTIO_LOAD_VIEW_H

#include <stdint.h>

#include "formats/index.h"

/* Calls run(arg, storage byte offset, bytes) for each stretch of logical
 * elements [first, first + count) that is contiguous in its storage: a run
 * along a unit-stride last dimension, else one element. The parser has
 * checked every index is inside the storage. */
void ckptio_view_runs(const ckptio_entry *e, uint64_t first, uint64_t count,
                      void (*run)(void *arg, uint64_t off, uint64_t len), void *arg);
/* Logical elements [first, first + count), row-major, from the storage at
 * base into dst. */
void ckptio_view_gather(unsigned char *dst, const unsigned char *base, const ckptio_entry *e, uint64_t first,
                        uint64_t count);

#endif
