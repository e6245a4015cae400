/* Device memory, pinned and registered host memory. Each device is a memfd
 * arena mapped twice: PROT_NONE at the addresses cudaMalloc returns (a host
 * dereference is a SIGSEGV) and read-write at a hidden address only the copy
 * engine uses. Host ranges are kept sorted so copies can tell pinned from
 * pageable memory. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

#define DEV_ALIGN 256

struct hrange {
  uintptr_t base;
  size_t size;        /* as requested */
  size_t maplen;      /* pinned: the mmap length; registered: 0 */
  int device;         /* current device when pinned / registered */
  unsigned flags;
};

/* Sorted by base, never overlapping. */
static struct hrange *hr;
static size_t nhr, hcap;

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

/* ------------------------------------------------------------ device arenas */

static cudaError_t dev_ready(int d) {
  struct fc_dev *v = &fc_devs[d];
  if (v->ready) return cudaSuccess;
  char name[32];
  snprintf(name, sizeof name, "fake_cudart_dev%d", d);
  v->fd = memfd_create(name, MFD_CLOEXEC);
  if (v->fd < 0) goto fail;
  v->size = fc_cfg.mem_bytes;
  if (ftruncate(v->fd, (off_t)v->size)) goto fail_fd;
  v->dview = mmap(NULL, v->size, PROT_NONE, MAP_SHARED | MAP_NORESERVE, v->fd, 0);
  if (v->dview == MAP_FAILED) goto fail_fd;
  v->hview = mmap(NULL, v->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, v->fd, 0);
  if (v->hview == MAP_FAILED) goto fail_dview;
  v->ready = 1;
  return cudaSuccess;
fail_dview:
  munmap(v->dview, v->size);
fail_fd:
  close(v->fd);
fail:
  fprintf(stderr, "fake_cudart: cannot map the arena of device %d: %s\n", d, strerror(errno));
  return cudaErrorMemoryAllocation;
}

/* Index of the allocation with the greatest off <= o, or -1. */
static long alloc_at_or_below(const struct fc_dev *v, size_t o) {
  long lo = 0, hi = (long)v->nallocs - 1, best = -1;
  while (lo <= hi) {
    long mid = lo + (hi - lo) / 2;
    if (v->allocs[mid].off <= o) best = mid, lo = mid + 1;
    else hi = mid - 1;
  }
  return best;
}

static int arena_of(const void *p) {
  uintptr_t a = (uintptr_t)p;
  for (int d = 0; d < fc_cfg.ndev; d++) {
    const struct fc_dev *v = &fc_devs[d];
    if (v->ready && a >= (uintptr_t)v->dview && a - (uintptr_t)v->dview < v->size) return d;
  }
  return -1;
}

int fc_classify(const void *p, size_t n, int *dev, char **access) {
  int d = arena_of(p);
  if (d < 0) {
    uintptr_t a = (uintptr_t)p;
    /* A host range that runs into an arena is as wrong as a bad device pointer. */
    for (int i = 0; n && i < fc_cfg.ndev; i++) {
      const struct fc_dev *v = &fc_devs[i];
      if (v->ready && a < (uintptr_t)v->dview && a + n > (uintptr_t)v->dview) return FC_MEM_BAD;
    }
    *access = (char *)p;
    return FC_MEM_HOST;
  }
  const struct fc_dev *v = &fc_devs[d];
  size_t o = (size_t)((const char *)p - v->dview);
  long i = alloc_at_or_below(v, o);
  if (i < 0) return FC_MEM_BAD;
  const struct fc_alloc *al = &v->allocs[i];
  if (o - al->off >= al->size || n > al->size - (o - al->off)) return FC_MEM_BAD;
  *dev = d;
  *access = v->hview + o;
  return FC_MEM_DEVICE;
}

/* Next-fit from the cursor, so a freed address is not handed out again soon
 * and a stale device pointer stays invalid. */
static cudaError_t dev_alloc(int d, size_t n, void **out) {
  struct fc_dev *v = &fc_devs[d];
  if (n > v->size - DEV_ALIGN) return cudaErrorMemoryAllocation;
  size_t need = (n + DEV_ALIGN - 1) & ~(size_t)(DEV_ALIGN - 1);
  if (v->nallocs == v->cap) {
    size_t cap = v->cap ? v->cap * 2 : 64;
    struct fc_alloc *a = realloc(v->allocs, cap * sizeof *a);
    if (!a) return cudaErrorMemoryAllocation;
    v->allocs = a;
    v->cap = cap;
  }
  for (int pass = 0; pass < 2; pass++) {
    size_t from = pass ? 0 : v->cursor;
    size_t prev_end = 0, i;
    for (i = 0; i <= v->nallocs; i++) {
      size_t next = i < v->nallocs ? v->allocs[i].off : v->size;
      size_t start = prev_end > from ? prev_end : from;
      if (next >= start && next - start >= need) {
        memmove(&v->allocs[i + 1], &v->allocs[i], (v->nallocs - i) * sizeof v->allocs[0]);
        v->allocs[i] = (struct fc_alloc){start, n};
        v->nallocs++;
        v->cursor = start + need;
        *out = v->dview + start;
        return cudaSuccess;
      }
      if (i < v->nallocs)
        prev_end = (v->allocs[i].off + v->allocs[i].size + DEV_ALIGN - 1) & ~(size_t)(DEV_ALIGN - 1);
    }
  }
  return cudaErrorMemoryAllocation;
}

cudaError_t CUDARTAPI cudaMalloc(void **devPtr, size_t size) {
  cudaError_t e = fc_enter(FC_cudaMalloc, NULL);
  if (e) return fc_ret(e);
  if ((e = fc_need_device())) return fc_ret(e);
  if (!devPtr) return fc_ret(cudaErrorInvalidValue);
  if (size == 0) {
    *devPtr = NULL;
    return cudaSuccess;
  }
  int d = fc_current_device();
  pthread_mutex_lock(&fc_lock);
  e = dev_ready(d);
  if (!e) e = dev_alloc(d, size, devPtr);
  if (!e) {
    fc_st.device_allocs++;
    fc_st.device_bytes += size;
    fc_note_peaks();
  }
  pthread_mutex_unlock(&fc_lock);
  return fc_ret(e);
}

cudaError_t CUDARTAPI cudaFree(void *devPtr) {
  cudaError_t e = fc_enter(FC_cudaFree, NULL);
  if (e) return fc_ret(e);
  if (!devPtr) return cudaSuccess;
  pthread_mutex_lock(&fc_lock);
  int d = arena_of(devPtr);
  struct fc_dev *v = d >= 0 ? &fc_devs[d] : NULL;
  size_t o = v ? (size_t)((char *)devPtr - v->dview) : 0;
  long i = v ? alloc_at_or_below(v, o) : -1;
  if (i < 0 || v->allocs[i].off != o) {
    pthread_mutex_unlock(&fc_lock);
    return fc_ret(cudaErrorInvalidValue);
  }
  /* Real cudaFree synchronises; a queued copy still using the block is
   * counted so a test can insist the library waited first. */
  if (fc_wait_range_idle((uintptr_t)devPtr, v->allocs[i].size)) {
    fc_st.frees_while_busy++;
    i = alloc_at_or_below(v, o);
    if (i < 0 || v->allocs[i].off != o) { /* freed by another thread meanwhile */
      pthread_mutex_unlock(&fc_lock);
      return fc_ret(cudaErrorInvalidValue);
    }
  }
  size_t n = v->allocs[i].size;
  /* Give the pages back; the next user of these addresses sees zeros. */
  fallocate(v->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)o, (off_t)n);
  memmove(&v->allocs[i], &v->allocs[i + 1], (v->nallocs - (size_t)i - 1) * sizeof v->allocs[0]);
  v->nallocs--;
  fc_st.device_allocs--;
  fc_st.device_bytes -= n;
  pthread_mutex_unlock(&fc_lock);
  return cudaSuccess;
}

/* ------------------------------------------------------------ host ranges */

int fc_host_mapped(const void *p, size_t n) {
  size_t pg = page_size();
  uintptr_t first = (uintptr_t)p & ~(pg - 1);
  if (!p || n > UINTPTR_MAX - pg || (uintptr_t)p > UINTPTR_MAX - pg - n) return 0;
  size_t span = (((uintptr_t)p + n + pg - 1) & ~(pg - 1)) - first;
  /* msync(MS_ASYNC) does no I/O here; it fails with ENOMEM on unmapped pages. */
  return !(msync((void *)first, span, MS_ASYNC) && errno == ENOMEM);
}

/* Index of the range with the greatest base <= a, or -1. */
static long range_at_or_below(uintptr_t a) {
  long lo = 0, hi = (long)nhr - 1, best = -1;
  while (lo <= hi) {
    long mid = lo + (hi - lo) / 2;
    if (hr[mid].base <= a) best = mid, lo = mid + 1;
    else hi = mid - 1;
  }
  return best;
}

static long range_containing(const void *p) {
  uintptr_t a = (uintptr_t)p;
  long i = range_at_or_below(a);
  return i >= 0 && a - hr[i].base < hr[i].size ? i : -1;
}

/* Page-locked for a copy on device `dev`: as the CUDA documentation has it,
 * memory pinned or registered without the Portable flag counts as pinned
 * only by the context current when it was (a copy on another GPU treats it
 * as pageable: synchronous, not overlapped). */
int fc_host_locked(const void *p, size_t n, int dev) {
  long i = range_containing(p);
  return i >= 0 && n <= hr[i].size - ((uintptr_t)p - hr[i].base) &&
         (hr[i].device == dev || (hr[i].flags & cudaHostRegisterPortable));
}

static int range_overlaps(uintptr_t a, size_t n) {
  long i = range_at_or_below(a);
  if (i >= 0 && a - hr[i].base < hr[i].size) return 1;
  size_t j = (size_t)(i + 1);
  return j < nhr && hr[j].base - a < n;
}

static cudaError_t range_insert(struct hrange r) {
  if (nhr == hcap) {
    size_t cap = hcap ? hcap * 2 : 64;
    struct hrange *a = realloc(hr, cap * sizeof *a);
    if (!a) return cudaErrorMemoryAllocation;
    hr = a;
    hcap = cap;
  }
  size_t i = (size_t)(range_at_or_below(r.base) + 1);
  memmove(&hr[i + 1], &hr[i], (nhr - i) * sizeof hr[0]);
  hr[i] = r;
  nhr++;
  return cudaSuccess;
}

static void range_remove(long i) {
  memmove(&hr[i], &hr[i + 1], (nhr - (size_t)i - 1) * sizeof hr[0]);
  nhr--;
}

/* Under fc_lock: the range starting exactly at p of the wanted kind, after
 * waiting for queued copies that still use it. */
static long range_for_release(void *p, int pinned) {
  long i = range_containing(p);
  if (i < 0 || hr[i].base != (uintptr_t)p || (hr[i].maplen != 0) != pinned) return -1;
  if (fc_wait_range_idle(hr[i].base, hr[i].size)) {
    fc_st.frees_while_busy++;
    i = range_containing(p);
    if (i < 0 || hr[i].base != (uintptr_t)p || (hr[i].maplen != 0) != pinned) return -1;
  }
  return i;
}

static cudaError_t host_alloc(void **pHost, size_t size, unsigned int flags) {
  if (!pHost || (flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocMapped |
                                     cudaHostAllocWriteCombined)))
    return cudaErrorInvalidValue;
  cudaError_t e = fc_need_device();
  if (e) return e;
  if (size == 0) {
    *pHost = NULL;
    return cudaSuccess;
  }
  size_t pg = page_size();
  if (size > SIZE_MAX - pg) return cudaErrorMemoryAllocation;
  size_t len = (size + pg - 1) & ~(pg - 1);
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return cudaErrorMemoryAllocation;
  pthread_mutex_lock(&fc_lock);
  e = range_insert((struct hrange){(uintptr_t)p, size, len, fc_current_device(), flags});
  if (!e) {
    fc_st.pinned_allocs++;
    fc_st.pinned_bytes += size;
    fc_note_peaks();
  }
  pthread_mutex_unlock(&fc_lock);
  if (e) munmap(p, len);
  else *pHost = p;
  return e;
}

cudaError_t CUDARTAPI cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
  cudaError_t e = fc_enter(FC_cudaHostAlloc, NULL);
  return fc_ret(e ? e : host_alloc(pHost, size, flags));
}

cudaError_t CUDARTAPI cudaMallocHost(void **ptr, size_t size) {
  cudaError_t e = fc_enter(FC_cudaMallocHost, NULL);
  return fc_ret(e ? e : host_alloc(ptr, size, cudaHostAllocDefault));
}

cudaError_t CUDARTAPI cudaFreeHost(void *ptr) {
  cudaError_t e = fc_enter(FC_cudaFreeHost, NULL);
  if (e) return fc_ret(e);
  if (!ptr) return cudaSuccess;
  pthread_mutex_lock(&fc_lock);
  long i = range_for_release(ptr, 1);
  if (i < 0) {
    pthread_mutex_unlock(&fc_lock);
    return fc_ret(cudaErrorInvalidValue);
  }
  struct hrange r = hr[i];
  range_remove(i);
  fc_st.pinned_allocs--;
  fc_st.pinned_bytes -= r.size;
  pthread_mutex_unlock(&fc_lock);
  /* Unmapped, so a use after cudaFreeHost faults instead of reading old data. */
  munmap((void *)r.base, r.maplen);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaHostRegister(void *ptr, size_t size, unsigned int flags) {
  cudaError_t e = fc_enter(FC_cudaHostRegister, NULL);
  if (e) return fc_ret(e);
  if ((e = fc_need_device())) return fc_ret(e);
  if (flags & cudaHostRegisterIoMemory) return fc_ret(cudaErrorNotSupported);
  if (!ptr || !size || (uintptr_t)ptr > UINTPTR_MAX - size ||
      (flags & ~(unsigned)(cudaHostRegisterPortable | cudaHostRegisterMapped |
                           cudaHostRegisterReadOnly)))
    return fc_ret(cudaErrorInvalidValue);
  /* Real registration pins the pages, so unmapped memory is refused. */
  if (!fc_host_mapped(ptr, size)) return fc_ret(cudaErrorInvalidValue);
  int dev;
  char *access;
  pthread_mutex_lock(&fc_lock);
  if (fc_classify(ptr, size, &dev, &access) != FC_MEM_HOST) e = cudaErrorInvalidValue;
  else if (range_overlaps((uintptr_t)ptr, size)) e = cudaErrorHostMemoryAlreadyRegistered;
  else e = range_insert((struct hrange){(uintptr_t)ptr, size, 0, fc_current_device(), flags});
  if (!e) {
    fc_st.registered_ranges++;
    fc_st.registered_bytes += size;
    fc_note_peaks();
  }
  pthread_mutex_unlock(&fc_lock);
  return fc_ret(e);
}

cudaError_t CUDARTAPI cudaHostUnregister(void *ptr) {
  cudaError_t e = fc_enter(FC_cudaHostUnregister, NULL);
  if (e) return fc_ret(e);
  pthread_mutex_lock(&fc_lock);
  long i = ptr ? range_for_release(ptr, 0) : -1;
  if (i < 0) {
    pthread_mutex_unlock(&fc_lock);
    return fc_ret(cudaErrorHostMemoryNotRegistered);
  }
  fc_st.registered_ranges--;
  fc_st.registered_bytes -= hr[i].size;
  range_remove(i);
  pthread_mutex_unlock(&fc_lock);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaPointerGetAttributes(struct cudaPointerAttributes *attributes,
                                               const void *ptr) {
  cudaError_t e = fc_enter(FC_cudaPointerGetAttributes, NULL);
  if (e) return fc_ret(e);
  if (!attributes) return fc_ret(cudaErrorInvalidValue);
  /* CUDA 13's struct ends in long reserved[8]; all of it is written, as the
   * real runtime does, so a caller with a smaller (older) struct overflows
   * visibly under ASan. */
  memset(attributes, 0, sizeof *attributes);
  attributes->type = cudaMemoryTypeUnregistered;
  attributes->device = cudaInvalidDeviceId;
  attributes->hostPointer = (void *)ptr;
  int dev;
  char *access;
  pthread_mutex_lock(&fc_lock);
  long i;
  if (fc_classify(ptr, 1, &dev, &access) == FC_MEM_DEVICE) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->device = dev;
    attributes->devicePointer = (void *)ptr;
    attributes->hostPointer = NULL;
  } else if ((i = range_containing(ptr)) >= 0) {
    attributes->type = cudaMemoryTypeHost;
    attributes->device = hr[i].device;
    attributes->devicePointer = (void *)ptr;  /* unified addressing */
  }
  pthread_mutex_unlock(&fc_lock);
  return cudaSuccess;
}

void fc_memory_leaks(int *count) {
  for (size_t i = 0; i < nhr; i++, (*count)++)
    fprintf(stderr, "fake_cudart: leaked %s %p, %zu bytes\n",
            hr[i].maplen ? "pinned allocation" : "host registration", (void *)hr[i].base,
            hr[i].size);
  for (int d = 0; d < fc_cfg.ndev; d++)
    for (size_t i = 0; i < fc_devs[d].nallocs; i++, (*count)++)
      fprintf(stderr, "fake_cudart: leaked device %d allocation %p, %zu bytes\n", d,
              (void *)(fc_devs[d].dview + fc_devs[d].allocs[i].off), fc_devs[d].allocs[i].size);
}
