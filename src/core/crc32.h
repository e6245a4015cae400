/* CRC-32 with the zip polynomial (reflected 0xEDB88320), as zip, zlib and
 * safetensors' users expect it. ISA-L computes it at memory speed; combine
 * joins the CRCs of adjacent pieces computed on different threads. */
#ifndef CKPTIO_CORE_CRC32_H
#define CKPTIO_CORE_CRC32_H

#include <stddef.h>
#include <stdint.h>

/* crc of (previous bytes || buf), starting from crc = 0. */
uint32_t ckptio_crc32(uint32_t crc, const void *buf, size_t len);
/* crc of (A || B) from crc(A), crc(B) and len(B). */
uint32_t ckptio_crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

/* Bytes per step when copying and checksumming together: small enough that
 * the copy reads what the CRC just read from cache, not from memory. On
 * these machines memory bandwidth, not the CRC, is the limit. */
#define CKPTIO_CRC_STEP (256u << 10)

/* memcpy(dst, src, n) through ckptio_stream_copy, and if crc is not NULL,
 * *crc continued over the source's bytes, one cache-sized step at a time
 * (the copy's streaming stores leave the destination out of the cache). */
void ckptio_copy_crc(void *dst, const void *src, size_t n, uint32_t *crc);

#endif
