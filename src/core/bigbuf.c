/* Huge-page scratch buffers (bigbuf.h): one huge page more is mapped, the
 * pointer rounded up to a 2 MiB boundary, and the lead and tail around the
 * rounded size unmapped at once, so a buffer is exactly its rounded size
 * from a 2 MiB boundary and is freed by that alone. */
#include "core/bigbuf.h"

#include <stdint.h>
#include <sys/mman.h>

#define HUGE_PAGE ((size_t)2 << 20)

void *ckptio_bigbuf_alloc(size_t bytes) {
  if (!bytes) return NULL;
  size_t len = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE + HUGE_PAGE;
  unsigned char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return NULL;
  unsigned char *p = (unsigned char *)(((uintptr_t)m + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
  /* Give back the lead and the tail past the rounded size. */
  size_t lead = (size_t)(p - m), body = len - HUGE_PAGE;
  if (lead) munmap(m, lead);
  if (HUGE_PAGE - lead) munmap(p + body, HUGE_PAGE - lead);
#ifdef MADV_HUGEPAGE
  (void)madvise(p, body, MADV_HUGEPAGE);
#endif
  return p;
}

void ckptio_bigbuf_free(void *p, size_t bytes) {
  if (p && bytes) munmap(p, (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE);
}
