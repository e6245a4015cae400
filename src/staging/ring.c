/* Staging ring: one aligned allocation cut into slots, a stack of free slots
 * behind a mutex. Slots are handed out blocking, so producers slow down to
 * the pace of the disk instead of allocating more. */
#include "staging/ring.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

struct ckptio_ring {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  unsigned char *base;
  void *map;               /* the mapping base sits in */
  size_t map_bytes;
  size_t slot_bytes, nslots;
  size_t nfree;
  void **free_slots;   /* a stack: the top is handed out next */
  uint64_t *copying;   /* per slot: GPUs still copying from it */
  const void **owner;  /* per slot: who released it copying */
  /* Slots are first handed out in address order (the stack's bottom), so
   * the ones ever used or being prepared are [0, touched); ckptio_ring_prepare
   * faults in [touched, target). Both under mu. */
  size_t touched, target;
  atomic_int stop;     /* ckptio_ring_prepare_stop was called */
};

#define HUGE_PAGE (2u << 20)

/* The slots' memory: an anonymous mapping with its start rounded up to a
 * 2 MiB boundary and transparent huge pages asked for, so that the first
 * touch of each slot costs one fault per 2 MiB instead of one per 4 KiB
 * (first touch of 256 MiB here: 0.20 s in 4 KiB pages, 0.045 s in huge
 * pages). Except the first 2 MiB: the first slot handed out starts there,
 * and a small file's save or load touches a few KiB of it, which as one huge
 * page would cost zeroing all 2 MiB (0.25-0.3 ms of a 16-byte one-shot save
 * of about 1.5 ms here); a large save pays 512 small faults once instead.
 * Where THP is off the advice is ignored and pages are 4 KiB. */
static int map_slots(ckptio_ring *r, size_t bytes) {
  r->map_bytes = bytes + HUGE_PAGE;
  r->map = mmap(NULL, r->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (r->map == MAP_FAILED) return -ENOMEM;
  r->base = (unsigned char *)(((uintptr_t)r->map + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
#if defined(MADV_HUGEPAGE) && defined(MADV_NOHUGEPAGE)
  (void)madvise(r->base, bytes < HUGE_PAGE ? bytes : HUGE_PAGE, MADV_NOHUGEPAGE); /* THP "always" too */
  if (bytes > HUGE_PAGE) (void)madvise(r->base + HUGE_PAGE, bytes - HUGE_PAGE, MADV_HUGEPAGE);
#endif
  return 0;
}

/* Faults [p, p + n) in as writable pages without changing a byte.
 * @return 0, or -errno (EINVAL: a kernel without MADV_POPULATE_WRITE). */
static int populate(void *p, size_t n) {
#ifdef MADV_POPULATE_WRITE
  return madvise(p, n, MADV_POPULATE_WRITE) == 0 ? 0 : -errno;
#else
  (void)p, (void)n;
  return -EINVAL;
#endif
}

int ckptio_ring_create(size_t nslots, size_t slot_bytes, size_t prefault, ckptio_ring **out) {
  *out = NULL;
  if (!nslots || !slot_bytes || slot_bytes % CKPTIO_IO_ALIGN) return -EINVAL;
  ckptio_ring *r = calloc(1, sizeof(*r));
  if (!r) return -ENOMEM;
  r->slot_bytes = slot_bytes;
  r->nslots = nslots;
  r->free_slots = calloc(nslots, sizeof(void *));
  r->copying = calloc(nslots, sizeof(uint64_t));
  r->owner = calloc(nslots, sizeof(void *));
  if (!r->free_slots || !r->copying || !r->owner || map_slots(r, nslots * slot_bytes) < 0) {
    free(r->free_slots);
    free(r->copying);
    free(r->owner);
    free(r);
    return -ENOMEM;
  }
  /* A first touch costs ~20 us per 4 KiB page here (0.2-0.35 s per GiB in
   * huge pages): the slots asked for are left to ckptio_ring_prepare, on
   * the caller's thread of choice, when the kernel can fault pages in
   * without writing them (MADV_POPULATE_WRITE, Linux 5.14): then preparing
   * cannot race with a slot already in use. Where it cannot (probed on the
   * first page), they are touched here, before any slot is handed out. */
  r->target = prefault < nslots ? prefault : nslots;
  if (r->target && populate(r->base, CKPTIO_IO_ALIGN) < 0) {
    memset(r->base, 0, r->target * slot_bytes);
    r->touched = r->target;
  }
  atomic_init(&r->stop, 0);
  for (size_t i = 0; i < nslots; i++) r->free_slots[i] = r->base + (nslots - 1 - i) * slot_bytes;
  r->nfree = nslots;
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  *out = r;
  return 0;
}

/* Slot by slot, in the order they are first handed out, so a save that
 * starts meanwhile finds its first slots ready and faults the others in
 * itself (two threads faulting one page in wait for each other, never fault
 * it twice). A slot counts as touched once claimed here. */
int ckptio_ring_prepare(ckptio_ring *r) {
  for (;;) {
    if (atomic_load_explicit(&r->stop, memory_order_relaxed)) return -ECANCELED;
    pthread_mutex_lock(&r->mu);
    size_t i = r->touched < r->target ? r->touched++ : r->nslots;
    pthread_mutex_unlock(&r->mu);
    if (i == r->nslots) return 0;
    int rc = populate(r->base + i * r->slot_bytes, r->slot_bytes);
    if (rc < 0) return rc;
  }
}

void ckptio_ring_prepare_more(ckptio_ring *r, size_t n) {
  pthread_mutex_lock(&r->mu);
  if (n > r->nslots) n = r->nslots;
  if (n > r->target) r->target = n;
  pthread_mutex_unlock(&r->mu);
}

void ckptio_ring_prepare_stop(ckptio_ring *r) { atomic_store_explicit(&r->stop, 1, memory_order_relaxed); }

size_t ckptio_ring_touched(ckptio_ring *r) {
  pthread_mutex_lock(&r->mu);
  size_t n = r->touched;
  pthread_mutex_unlock(&r->mu);
  return n;
}

size_t ckptio_ring_unprepared(ckptio_ring *r) {
  pthread_mutex_lock(&r->mu);
  size_t n = r->target > r->touched ? r->target - r->touched : 0;
  pthread_mutex_unlock(&r->mu);
  return n;
}

void ckptio_ring_free(ckptio_ring *r) {
  if (!r) return;
  pthread_cond_destroy(&r->cv);
  pthread_mutex_destroy(&r->mu);
  munmap(r->map, r->map_bytes);
  free(r->free_slots);
  free(r->copying);
  free(r->owner);
  free(r);
}

/* Under r->mu, a slot free. */
static void *take_free(ckptio_ring *r) {
  void *slot = r->free_slots[--r->nfree];
  size_t i = ckptio_ring_slot_index(r, slot);
  if (i >= r->touched) r->touched = i + 1;
  return slot;
}

void *ckptio_ring_acquire(ckptio_ring *r) {
  pthread_mutex_lock(&r->mu);
  while (r->nfree == 0) pthread_cond_wait(&r->cv, &r->mu);
  void *slot = take_free(r);
  pthread_mutex_unlock(&r->mu);
  return slot;
}

void *ckptio_ring_try_acquire(ckptio_ring *r) {
  pthread_mutex_lock(&r->mu);
  void *slot = r->nfree ? take_free(r) : NULL;
  pthread_mutex_unlock(&r->mu);
  return slot;
}

void ckptio_ring_release(ckptio_ring *r, void *slot) {
  pthread_mutex_lock(&r->mu);
  r->free_slots[r->nfree++] = slot;
  pthread_cond_signal(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

void ckptio_ring_release_copying(ckptio_ring *r, void *slot, uint64_t gpus, const void *owner) {
  if (!gpus) {
    ckptio_ring_release(r, slot);
    return;
  }
  size_t i = ckptio_ring_slot_index(r, slot);
  pthread_mutex_lock(&r->mu);
  r->copying[i] = gpus, r->owner[i] = owner;
  /* At the bottom of the stack: the slots whose copies are done go first. */
  memmove(r->free_slots + 1, r->free_slots, r->nfree * sizeof(void *));
  r->free_slots[0] = slot;
  r->nfree++;
  pthread_cond_signal(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

uint64_t ckptio_ring_take_copying(ckptio_ring *r, void *slot) {
  pthread_mutex_lock(&r->mu);
  size_t i = ckptio_ring_slot_index(r, slot);
  uint64_t gpus = r->copying[i];
  r->copying[i] = 0;
  r->owner[i] = NULL;
  pthread_mutex_unlock(&r->mu);
  return gpus;
}

void ckptio_ring_clear_copying(ckptio_ring *r, size_t i, const void *owner) {
  pthread_mutex_lock(&r->mu);
  if (r->owner[i] == owner) r->copying[i] = 0, r->owner[i] = NULL;
  pthread_mutex_unlock(&r->mu);
}

size_t ckptio_ring_slot_bytes(const ckptio_ring *r) { return r->slot_bytes; }
size_t ckptio_ring_slots(const ckptio_ring *r) { return r->nslots; }
void *ckptio_ring_base(const ckptio_ring *r) { return r->base; }
size_t ckptio_ring_slot_index(const ckptio_ring *r, const void *slot) {
  return (size_t)((const unsigned char *)slot - r->base) / r->slot_bytes;
}
