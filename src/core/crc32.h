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

#endif
