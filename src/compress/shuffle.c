/* Byte shuffle and its inverse, with the common element sizes unrolled so
 * the compiler keeps the inner loops branch-free. */
#include "compress/shuffle.h"

#define SHUF(ES)                                                   \
  for (size_t i = 0; i < n; i++)                                   \
    for (size_t k = 0; k < (ES); k++) dst[k * n + i] = src[i * (ES) + k];

void ckptio_shuffle(uint8_t *dst, const uint8_t *src, size_t len, size_t es) {
  size_t n = len / es;
  if (es == 2) { SHUF(2) }
  else if (es == 4) { SHUF(4) }
  else if (es == 8) { SHUF(8) }
  else { SHUF(es) }
}

#define UNSHUF(ES)                                                          \
  for (size_t i = first; i < first + count; i++)                            \
    for (size_t k = 0; k < (ES); k++) dst[(i - first) * (ES) + k] = src[k * n + i];

void ckptio_unshuffle(uint8_t *dst, const uint8_t *src, size_t len, size_t es, size_t first, size_t count) {
  size_t n = len / es;
  if (es == 2) { UNSHUF(2) }
  else if (es == 4) { UNSHUF(4) }
  else if (es == 8) { UNSHUF(8) }
  else { UNSHUF(es) }
}
