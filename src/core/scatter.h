/* A stretch of a scattered read, shared by the rooms that scatter one:
 * the S3 client (one GET's body) and the storage interface (one read of an
 * object), so a load's spans pass from one to the other as they are. */
#ifndef CKPTIO_CORE_SCATTER_H
#define CKPTIO_CORE_SCATTER_H

#include <stddef.h>

/* len bytes to dst, or read and dropped (dst NULL: bytes between the ones
 * wanted). */
typedef struct ckptio_scatter {
  void *dst;
  size_t len;
} ckptio_scatter;

#endif
