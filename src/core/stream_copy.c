/* Streaming copies (stream_copy.h): SSE2's non-temporal 16-byte stores,
 * which every x86-64 CPU has; memcpy on other architectures. */
#include "core/stream_copy.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <emmintrin.h>

void ckptio_stream_copy(void *dst, const void *src, size_t n) {
  unsigned char *d = dst;
  const unsigned char *s = src;
  if (n < CKPTIO_STREAM_COPY_MIN) {
    memcpy(d, s, n);
    return;
  }
  /* Streaming stores need a 16-byte aligned destination; the loads do not. */
  size_t head = (16 - ((uintptr_t)d & 15)) & 15;
  memcpy(d, s, head);
  d += head, s += head, n -= head;
  size_t body = n & ~(size_t)63;
  for (size_t i = 0; i < body; i += 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
    __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
    __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
    _mm_stream_si128((__m128i *)(d + i), a);
    _mm_stream_si128((__m128i *)(d + i + 16), b);
    _mm_stream_si128((__m128i *)(d + i + 32), c);
    _mm_stream_si128((__m128i *)(d + i + 48), e);
  }
  /* Streaming stores are weakly ordered: fenced before whoever this thread
   * signals next (a job's end, a mutex) can read the bytes. */
  _mm_sfence();
  memcpy(d + body, s + body, n - body);
}
#else
void ckptio_stream_copy(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
#endif
