/* CRC-32 (zip polynomial) through ISA-L, plus combine for parallel pieces.
 * Combine works in GF(2)[x] modulo the reflected polynomial: crc(A||B) =
 * crc(A) * x^(8*len(B)) + crc(B), with x^(2^k) precomputed by squaring. */
#include "core/crc32.h"

#include "core/stream_copy.h"

#include <isa-l/crc.h>
#include <pthread.h>
#include <string.h>

#define POLY 0xedb88320u

uint32_t ckptio_crc32(uint32_t crc, const void *buf, size_t len) {
  return crc32_gzip_refl(crc, (const unsigned char *)buf, (uint64_t)len);
}

void ckptio_copy_crc(void *dst, const void *src, size_t n, uint32_t *crc) {
  unsigned char *d = dst;
  const unsigned char *s = src;
  for (size_t off = 0; off < n; off += CKPTIO_CRC_STEP) {
    size_t len = n - off < CKPTIO_CRC_STEP ? n - off : CKPTIO_CRC_STEP;
    if (crc) *crc = ckptio_crc32(*crc, s + off, len);
    ckptio_stream_copy(d + off, s + off, len);
  }
}

/* a * b modulo POLY; bit 31 is x^0 in the reflected representation. */
static uint32_t multmodp(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ POLY : b >> 1;
  }
  return p;
}

static uint32_t x2n_table[32];
static pthread_once_t x2n_once = PTHREAD_ONCE_INIT;

static void x2n_init(void) {
  uint32_t p = 1u << 30; /* x^1 */
  x2n_table[0] = p;
  for (int k = 1; k < 32; k++) x2n_table[k] = p = multmodp(p, p);
}

/* x^(n * 2^k) modulo POLY. */
static uint32_t x2nmodp(uint64_t n, unsigned k) {
  uint32_t p = 1u << 31; /* x^0 */
  while (n) {
    if (n & 1) p = multmodp(x2n_table[k & 31], p);
    n >>= 1;
    k++;
  }
  return p;
}

uint32_t ckptio_crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  pthread_once(&x2n_once, x2n_init);
  return multmodp(x2nmodp(len_b, 3), crc_a) ^ crc_b;
}
