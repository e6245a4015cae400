/* A stretch of a scattered read, shared by the rooms that scatter one:
 * the S3 client (one GET's body) and the storage interface (one read of an
 * object), so a load's spans pass from one to the other as they are. */
#ifndef CKPTIO_CORE_SCATTER_H
#define CKPTIO_CORE_SCATTER_H

#include <stddef.h>
#include <stdint.h>

/* len bytes to dst, or read and dropped (dst NULL: bytes between the ones
 * wanted). crc (only with a dst; NULL: none) receives the CRC32 of the
 * span's bytes, taken by the S3 client as they land, while they are in
 * cache, rather than in a second pass over memory after the read. */
typedef struct ckptio_scatter {
  void *dst;
  size_t len;
  uint32_t *crc;
} ckptio_scatter;

#endif
