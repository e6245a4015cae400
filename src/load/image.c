/* An object's image for a header parse (image.h). */
#include "load/image.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/error.h"
#include "ctx/ctx.h"

/* One ranged read into the image, the storage's sentence kept. */
static int read_into(const ckptio_image *im, uint64_t off, uint64_t len, char *err) {
  char why[CKPTIO_ERRLEN] = "";
  int rc = len ? ckptio_rfile_pread(im->f, im->base + off, (size_t)len, off, why, sizeof(why)) : 0;
  if (rc < 0)
    return why[0] ? ckptio_fail(err, rc, "%s", why)
                  : ckptio_fail(err, rc, "%s: reading the index: %s", im->f->path, ckptio_strerror(rc));
  return 0;
}

static int note(ckptio_image *im, uint64_t off, uint64_t len) {
  if (im->nhave == im->cap) {
    size_t cap = im->cap ? 2 * im->cap : 16;
    void *n = realloc(im->have, cap * sizeof(*im->have));
    if (!n) return -ENOMEM;
    im->have = n, im->cap = cap;
  }
  im->have[im->nhave][0] = off, im->have[im->nhave][1] = off + len;
  im->nhave++;
  im->reads++;
  return 0;
}

static int fetch_one(ckptio_image *im, uint64_t off, uint64_t len, char *err) {
  int rc = read_into(im, off, len, err);
  return rc < 0 ? rc : note(im, off, len);
}

int ckptio_image_has(const ckptio_image *im, uint64_t off, uint64_t len) {
  for (size_t i = 0; i < im->nhave; i++)
    if (im->have[i][0] <= off && off + len <= im->have[i][1]) return 1;
  return 0;
}

int ckptio_image_open(ckptio_image *im, const ckptio_rfile *f, ckptio_pool *pool, uint64_t head, uint64_t tail,
                      char *err) {
  memset(im, 0, sizeof(*im));
  im->f = f;
  im->pool = pool;
  im->size = f->size;
  if (!f->size) return 0;
  if ((uint64_t)(size_t)f->size != f->size)
    return ckptio_fail(err, CKPTIO_E_OVERFLOW, "%s: %llu bytes do not fit this address space", f->path,
                       (unsigned long long)f->size);
  void *m = mmap(NULL, (size_t)f->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) {
    int e = errno;
    return ckptio_fail(err, -e, "%s: no address space for the index of a %llu-byte object: %s", f->path,
                       (unsigned long long)f->size, ckptio_strerror(-e));
  }
  im->base = m;
  if (head > f->size) head = f->size;
  if (tail > f->size) tail = f->size;
  if (head + tail >= f->size) return fetch_one(im, 0, f->size, err);
  int rc = fetch_one(im, 0, head, err);
  return rc < 0 ? rc : fetch_one(im, f->size - tail, tail, err);
}

static int by_off(const void *a, const void *b) {
  const ckptio_span *x = a, *y = b;
  return (x->off > y->off) - (x->off < y->off);
}

/* A fetch's reads, run by pool jobs and the calling thread alike. */
typedef struct fetch_run {
  const ckptio_image *im;
  const ckptio_span *reads;
  size_t n;
  _Atomic size_t next;
  ckptio_batch batch;
} fetch_run;

static void fetch_some(fetch_run *r) {
  char err[CKPTIO_ERRLEN];
  for (size_t i; !ckptio_batch_failed(&r->batch) && (i = atomic_fetch_add(&r->next, 1)) < r->n;) {
    int rc = read_into(r->im, r->reads[i].off, r->reads[i].len, err);
    if (rc < 0) ckptio_batch_fail(&r->batch, rc, err);
  }
}

static void fetch_job(void *arg) {
  fetch_run *r = arg;
  fetch_some(r);
  ckptio_batch_done(&r->batch, 0, NULL);
}

int ckptio_image_fetch(ckptio_image *im, ckptio_span *spans, size_t n, uint64_t gap, uint64_t cap, char *err) {
  size_t k = 0, m = 0;
  for (size_t i = 0; i < n; i++) { /* clamp; drop what is there already */
    ckptio_span s = spans[i];
    if (s.off >= im->size) continue;
    if (s.len > im->size - s.off) s.len = im->size - s.off;
    if (s.len && !ckptio_image_has(im, s.off, s.len)) spans[k++] = s;
  }
  qsort(spans, k, sizeof(*spans), by_off);
  for (size_t i = 0; i < k;) { /* merged in place: spans[0, m) are the reads */
    uint64_t a = spans[i].off, b = a + spans[i].len;
    for (i++; i < k && spans[i].off <= b + gap && spans[i].off + spans[i].len - a <= cap; i++)
      if (spans[i].off + spans[i].len > b) b = spans[i].off + spans[i].len;
    spans[m++] = (ckptio_span){a, b - a};
  }
  if (!m) return 0;
  fetch_run r = {.im = im, .reads = spans, .n = m};
  atomic_init(&r.next, 0);
  ckptio_batch_init(&r.batch);
  /* Helpers on the pool, one per read beyond the caller's own (the pool
   * caps how many run); the caller reads too, so a busy pool only slows. */
  size_t helpers = m - 1 < 31 ? m - 1 : 31;
  for (size_t i = 0; i < helpers; i++) {
    ckptio_batch_add(&r.batch, 1);
    if (ckptio_pool_add(im->pool, fetch_job, &r) < 0) {
      ckptio_batch_done(&r.batch, 0, NULL);
      break;
    }
  }
  fetch_some(&r);
  int rc = ckptio_batch_wait(&r.batch);
  if (rc < 0) ckptio_fail(err, rc, "%s", r.batch.err);
  ckptio_batch_destroy(&r.batch);
  for (size_t i = 0; rc == 0 && i < m; i++) rc = note(im, spans[i].off, spans[i].len);
  return rc;
}

void ckptio_image_close(ckptio_image *im) {
  if (im->base) munmap(im->base, (size_t)im->size);
  free(im->have);
  memset(im, 0, sizeof(*im));
}
