/* The page cache filled ahead of a load's copies (io/fill.h). */
#include "io/fill.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>

#define HUGE (2ull << 20)
/* Populated by one call: a call reads its pages before returning. */
#define FILL_STEP (8ull << 20)
/* Steps in flight at once. One thread left the disk idle whenever the
 * load's copying workers held every core: 1 GiB in 1.1x the time of two,
 * four no faster than two (medians of 6 rotated rounds, fresh processes,
 * memory primed as bench/peers does, 2026-11-29). */
#define FILL_THREADS 2
/* Fillers running at once in the process. A load of a set or of a DCP
 * checkpoint starts one per member file; hundreds of files would start
 * hundreds of threads. Past this, ckptio_fill_start declines and the file
 * loads as it did before the filler (pread through the page cache). */
#define FILL_MAX_ACTIVE 4

static _Atomic int active;
/* A child of fork() has none of its parent's filler threads. */
static void fill_forked(void) { atomic_store(&active, 0); }
__attribute__((constructor)) static void fill_atfork(void) { pthread_atfork(NULL, NULL, fill_forked); }

typedef struct span {
  uint64_t off, end;
} span;

struct ckptio_fill {
  const unsigned char *map;
  span *steps;         /* in file order, each at most FILL_STEP */
  unsigned char *done; /* per step */
  size_t n, next, passed;
  pthread_t thread[FILL_THREADS];
  int threads;
  pthread_mutex_t mu;
  pthread_cond_t moved;
  uint64_t mark; /* every span byte before it is in (UINT64_MAX: stopped) */
  int stop, unmap;
};

static int by_off(const void *a, const void *b) {
  uint64_t x = ((const span *)a)->off, y = ((const span *)b)->off;
  return x < y ? -1 : x > y;
}

static void *fill_main(void *arg) {
  ckptio_fill *fl = arg;
  pthread_mutex_lock(&fl->mu);
  while (!fl->stop && fl->next < fl->n) {
    size_t i = fl->next++;
    pthread_mutex_unlock(&fl->mu);
    const unsigned char *at = fl->map + fl->steps[i].off;
    uint64_t len = fl->steps[i].end - fl->steps[i].off;
    /* Read in, then unmapped (the page cache keeps it; the copies map what
     * they take a step at a time): a mapping of what the copies have yet to
     * take would count in the process's RSS, up to the whole load where
     * the copies fall behind. Left mapped, 1 GiB loaded in 0.87-0.93x the
     * time of unmapped (medians of 8 and 10 rotated rounds). */
    int rc = ckptio_rfile_populate(at, len);
    if (fl->unmap) ckptio_rfile_drop(at, len);
    pthread_mutex_lock(&fl->mu);
    if (rc < 0) fl->stop = 1; /* cut short: the copies say so */
    fl->done[i] = 1;
    while (fl->passed < fl->n && fl->done[fl->passed]) fl->passed++;
    if (fl->mark != UINT64_MAX) fl->mark = fl->passed < fl->n ? fl->steps[fl->passed].off : UINT64_MAX;
    pthread_cond_broadcast(&fl->moved);
  }
  if (fl->stop) fl->mark = UINT64_MAX; /* no one waits on a stopped filler */
  pthread_cond_broadcast(&fl->moved);
  pthread_mutex_unlock(&fl->mu);
  return NULL;
}

/* The spans sorted, merged where they overlap or touch, and cut in steps. */
static int make_steps(ckptio_fill *fl, const uint64_t *off, const uint64_t *len, size_t n) {
  span *s = malloc((n + 1) * sizeof(span));
  size_t m = 0, k = 0, steps = 0;
  if (!s) return -1;
  for (size_t i = 0; i < n; i++)
    if (len[i]) s[k++] = (span){off[i], off[i] + len[i]};
  qsort(s, k, sizeof(span), by_off);
  for (size_t i = 0; i < k; i++) {
    if (m && s[i].off <= s[m - 1].end) {
      if (s[i].end > s[m - 1].end) s[m - 1].end = s[i].end;
    } else {
      s[m++] = s[i];
    }
  }
  for (size_t i = 0; i < m; i++) steps += (size_t)((s[i].end - s[i].off + FILL_STEP - 1) / FILL_STEP);
  fl->steps = malloc((steps + 1) * sizeof(span));
  fl->done = calloc(steps + 1, 1);
  if (!fl->steps || !fl->done) {
    free(s);
    return -1;
  }
  for (size_t i = 0; i < m; i++)
    for (uint64_t at = s[i].off; at < s[i].end; at += FILL_STEP)
      fl->steps[fl->n++] = (span){at, s[i].end - at < FILL_STEP ? s[i].end : at + FILL_STEP};
  free(s);
  return 0;
}

/* The map's huge-page-aligned stretch over the steps, advised huge pages. */
static void advise_huge(const ckptio_rfile *f, const ckptio_fill *fl) {
#ifdef MADV_HUGEPAGE
  uintptr_t a = ((uintptr_t)f->map + fl->steps[0].off) & ~(uintptr_t)(HUGE - 1);
  uintptr_t b = ((uintptr_t)f->map + fl->steps[fl->n - 1].end + HUGE - 1) & ~(uintptr_t)(HUGE - 1);
  uintptr_t lo = (uintptr_t)f->map, hi = ((uintptr_t)f->map + f->size + 4095) & ~(uintptr_t)4095;
  (void)madvise((void *)(a < lo ? lo : a), (b > hi ? hi : b) - (a < lo ? lo : a), MADV_HUGEPAGE);
#else
  (void)f, (void)fl;
#endif
}

static void fill_free(ckptio_fill *fl) {
  atomic_fetch_sub(&active, 1);
  pthread_mutex_destroy(&fl->mu);
  pthread_cond_destroy(&fl->moved);
  free(fl->steps);
  free(fl->done);
  free(fl);
}

ckptio_fill *ckptio_fill_start(const ckptio_rfile *f, const uint64_t *off, const uint64_t *len, size_t n, int unmap) {
  if (!f->map || !n) return NULL;
  if (atomic_fetch_add(&active, 1) >= FILL_MAX_ACTIVE) {
    atomic_fetch_sub(&active, 1);
    return NULL;
  }
  ckptio_fill *fl = calloc(1, sizeof(*fl));
  if (!fl) {
    atomic_fetch_sub(&active, 1);
    return NULL;
  }
  pthread_mutex_init(&fl->mu, NULL);
  pthread_cond_init(&fl->moved, NULL);
  if (make_steps(fl, off, len, n) < 0 || !fl->n) {
    fill_free(fl);
    return NULL;
  }
  fl->map = f->map;
  fl->unmap = unmap;
  advise_huge(f, fl);
  while (fl->threads < FILL_THREADS && pthread_create(&fl->thread[fl->threads], NULL, fill_main, fl) == 0) fl->threads++;
  if (!fl->threads) {
    fill_free(fl);
    return NULL;
  }
  return fl;
}

void ckptio_fill_wait(ckptio_fill *fl, uint64_t end) {
  pthread_mutex_lock(&fl->mu);
  while (fl->mark < end) pthread_cond_wait(&fl->moved, &fl->mu);
  pthread_mutex_unlock(&fl->mu);
}

void ckptio_fill_stop(ckptio_fill *fl) {
  if (!fl) return;
  pthread_mutex_lock(&fl->mu);
  fl->stop = 1;
  pthread_mutex_unlock(&fl->mu);
  for (int i = 0; i < fl->threads; i++) pthread_join(fl->thread[i], NULL);
  fill_free(fl);
}
