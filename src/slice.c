/* Partial loads: a range of one dimension of a tensor, read without the
 * rest. A slice is a set of equal runs of the tensor's row-major bytes
 * (slice.h); jobs of at most one staging slot of output bytes run on the
 * pool and read their runs with the reader's method — pread or memcpy from
 * the map straight into a host destination, O_DIRECT through a slot, a
 * PyTorch view gathered from the map — then swap big-endian elements and,
 * for a GPU, copy the slot to the device. A slice that is the whole tensor
 * and has a CRC to check goes through load.c's ordinary load instead. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compress/zload.h"
#include "io/file.h"
#include "load_share.h"
#include "shard.h"
#include "slice.h"

#define rfail ckptio_reader_fail
#define ALIGN_DOWN(x) ((x) & ~(uint64_t)(CKPTIO_IO_ALIGN - 1))
#define ALIGN_UP(x) ALIGN_DOWN((x) + CKPTIO_IO_ALIGN - 1)

/* Runs below this go through AUTO as pread even from a cold file: one
 * O_DIRECT request per small run costs more than the bytes it saves. */
#define DIRECT_MIN_RUN (1u << 20)
/* Mapped runs from this size on are populated and dropped like load.c's. */
#define MAP_POPULATE_MIN (64u << 10)

/* Bytes of elems elements of `bits` bits: elems * bits / 8 without the product overflowing. */
static uint64_t bytes_of(uint64_t elems, int bits) {
  return elems / 8 * (uint64_t)bits + elems % 8 * (uint64_t)bits / 8;
}

int ckptio_slice_geom_of(ckptio_reader *r, size_t index, int dim, int64_t start, int64_t stop,
                         ckptio_slice_geom *g) {
  memset(g, 0, sizeof(*g));
  if (index >= r->idx.count)
    return rfail(r, CKPTIO_E_INVALID_ARG, "%s: no tensor at index %zu (the file has %zu)", r->path, index,
                 r->idx.count);
  const ckptio_entry *e = &r->idx.entries[index];
  if (dim < 0 || dim >= e->ndim)
    return rfail(r, CKPTIO_E_INVALID_ARG, "%s: tensor '%s' has %d dims: there is no dim %d to slice", r->path,
                 e->name, e->ndim, dim);
  int64_t size = e->shape[dim];
  if (start < 0 || start > stop || stop > size)
    return rfail(r, CKPTIO_E_INVALID_ARG,
                 "%s: tensor '%s': slice %lld:%lld of dim %d is outside the tensor (a slice needs "
                 "0 <= start <= stop <= %lld)",
                 r->path, e->name, (long long)start, (long long)stop, dim, (long long)size);
  g->full = start == 0 && stop == size;
  for (int d = 0; d < e->ndim; d++)
    if (e->shape[d] == 0) return 0; /* no elements: nothing to read, whatever the other dims */
  int bits = ckptio_dtype_bits(e->dtype);
  uint64_t outer = 1, inner = 1, first, len = (uint64_t)(stop - start), whole;
  int over = 0;
  for (int d = 0; d < dim; d++) over |= __builtin_mul_overflow(outer, (uint64_t)e->shape[d], &outer);
  for (int d = dim + 1; d < e->ndim; d++) over |= __builtin_mul_overflow(inner, (uint64_t)e->shape[d], &inner);
  over |= __builtin_mul_overflow(inner, (uint64_t)size, &whole);
  over |= __builtin_mul_overflow(inner, (uint64_t)start, &first);
  if (over) /* cannot happen: a tensor's numel x bits was checked at open; kept for a format that forgets */
    return rfail(r, CKPTIO_E_OVERFLOW, "%s: tensor '%s': the shape's element counts overflow 64 bits", r->path,
                 e->name);
  /* Every run starts at first + k * whole elements and holds len * inner:
   * all of them on byte boundaries, or the slice cannot be cut from bytes. */
  if (bits % 8 && ((first % 8) * (uint64_t)bits % 8 || (len % 8) * (inner % 8) * (uint64_t)bits % 8 ||
                   (outer > 1 && (whole % 8) * (uint64_t)bits % 8)))
    return rfail(r, CKPTIO_E_MISALIGNED,
                 "%s: tensor '%s': slice %lld:%lld of dim %d does not start and end on byte boundaries "
                 "(%s has %d bits per element)",
                 r->path, e->name, (long long)start, (long long)stop, dim, ckptio_dtype_name(e->dtype), bits);
  if (e->strided && bits % 8)
    return rfail(r, CKPTIO_E_MISALIGNED, "%s: tensor '%s': a view of a sub-byte dtype cannot be sliced", r->path,
                 e->name);
  g->src0 = bytes_of(first, bits);
  g->run = bytes_of(len * inner, bits);
  g->pitch = bytes_of(whole, bits);
  g->count = g->run ? outer : 0;
  if (g->count > 1 && g->run == g->pitch) { /* whole rows: one run */
    g->run *= g->count;
    g->count = 1;
  }
  g->nbytes = g->run * g->count;
  return 0;
}

int64_t ckptio_reader_slice_nbytes(ckptio_reader *r, size_t index, int dim, int64_t start, int64_t stop) {
  if (!r) return CKPTIO_E_INVALID_ARG;
  ckptio_slice_geom g;
  int rc = ckptio_slice_geom_of(r, index, dim, start, stop, &g);
  return rc < 0 ? rc : (int64_t)g.nbytes;
}

/* Output bytes [off, off + len) of one slice, moved by one pool job. */
typedef struct sjob {
  ckptio_reader *r;
  ckptio_batch *batch;
  const ckptio_entry *e;
  const ckptio_slice_geom *g;
  unsigned char *dst;       /* the request's destination (host or GPU) */
  _Atomic uint64_t *read;   /* the request's bytes_read */
  int gpu;                  /* ordinal, or -1 for the host */
  ckptio_load_method method;
  uint64_t off, len;
  unsigned char *slot;
  uint64_t half;            /* DIRECT to a GPU: [0, half) stages the output,
                               the rest takes the O_DIRECT reads */
} sjob;

/* One O_DIRECT read of the pages [ga, ge) into the bounce buffer, then the
 * sub-runs of output [x0, x1) copied out of it. */
static int direct_flush(sjob *j, unsigned char *out, unsigned char *bounce, uint64_t x0, uint64_t x1,
                        uint64_t ga, uint64_t ge, uint64_t last, uint64_t *read) {
  int rc = ckptio_pread_min(j->r->fd_direct, bounce, (size_t)(ge - ga), ga, (size_t)(last - ga));
  if (rc < 0) return rc;
  *read += ge - ga;
  uint64_t src, nb;
  for (uint64_t x = x0; x < x1; x += nb) {
    ckptio_slice_subrun(j->g, x, x1, &src, &nb);
    memcpy(out + (x - j->off), bounce + (j->e->offset + src - ga), (size_t)nb);
  }
  return 0;
}

/* O_DIRECT: runs whose pages touch or overlap are read by one request (a
 * shared page is read once); a page-sized gap starts a new one. */
static int read_direct_runs(sjob *j, unsigned char *out, uint64_t *read) {
  size_t slot_bytes = ckptio_ring_slot_bytes(j->r->ctx->ring);
  unsigned char *bounce = j->gpu >= 0 ? j->slot + j->half : j->slot;
  uint64_t cap = j->gpu >= 0 ? slot_bytes - j->half : slot_bytes;
  uint64_t end = j->off + j->len, gx0 = j->off, ga = 0, ge = 0, last = 0, src, nb;
  for (uint64_t x = j->off; x < end; x += nb) {
    ckptio_slice_subrun(j->g, x, end, &src, &nb);
    uint64_t abs = j->e->offset + src, a = ALIGN_DOWN(abs), b = ALIGN_UP(abs + nb);
    if (x > gx0 && (a > ge || b - ga > cap)) {
      int rc = direct_flush(j, out, bounce, gx0, x, ga, ge, last, read);
      if (rc < 0) return rc;
      gx0 = x;
    }
    if (x == gx0) ga = a, ge = b;
    else if (b > ge) ge = b;
    last = abs + nb;
  }
  return direct_flush(j, out, bounce, gx0, end, ga, ge, last, read);
}

/* Brings the job's output bytes into out (the host destination or the
 * slot), counting the bytes taken from the file in *read. */
static int read_job(sjob *j, unsigned char *out, uint64_t *read) {
  ckptio_reader *r = j->r;
  const ckptio_entry *e = j->e;
  uint64_t end = j->off + j->len, src, nb;
  if (e->strided) {
    uint64_t es = (uint64_t)ckptio_dtype_bits(e->dtype) / 8;
    for (uint64_t x = j->off; x < end; x += nb) {
      ckptio_slice_subrun(j->g, x, end, &src, &nb);
      ckptio_load_gather(out + (x - j->off), r->map + e->offset, e, src / es, nb / es);
      *read += nb;
    }
    return 0;
  }
  if (j->method == CKPTIO_LOAD_DIRECT) return read_direct_runs(j, out, read);
  if (j->method == CKPTIO_LOAD_PREAD && j->g->count > 1 && j->g->run < DIRECT_MIN_RUN) {
    /* Many small runs: one blocking pread after another keeps a single
     * request in flight per worker, and from a cold file that ran 3x slower
     * than reading the whole tensor (bench/RESULTS_SLICE.md). Asking for
     * all of the job's runs first puts them in flight together; the preads
     * then mostly find them in the cache. Best effort: a refusal only costs
     * the speed. */
    for (uint64_t x = j->off; x < end; x += nb) {
      ckptio_slice_subrun(j->g, x, end, &src, &nb);
      posix_fadvise(r->fd, (off_t)(e->offset + src), (off_t)nb, POSIX_FADV_WILLNEED);
    }
  }
  for (uint64_t x = j->off; x < end; x += nb) {
    ckptio_slice_subrun(j->g, x, end, &src, &nb);
    uint64_t abs = e->offset + src;
    if (j->method == CKPTIO_LOAD_MMAP) {
      int big = nb >= MAP_POPULATE_MIN;
      if (big) {
        int rc = ckptio_load_populate(r->map + abs, nb);
        if (rc < 0) return rc;
      }
      memcpy(out + (x - j->off), r->map + abs, (size_t)nb);
      if (big) ckptio_load_unmap(r->map + abs, nb);
    } else {
      int rc = ckptio_pread_full(r->fd, out + (x - j->off), (size_t)nb, abs);
      if (rc < 0) return rc;
    }
    *read += nb;
  }
  return 0;
}

static void job_run(void *arg) {
  sjob *j = arg;
  ckptio_reader *r = j->r;
  int rc = 0;
  char msg[CKPTIO_ERRLEN] = "";
  if (!ckptio_batch_failed(j->batch)) {
    unsigned char *out = j->gpu >= 0 ? j->slot : j->dst + j->off;
    uint64_t read = 0, t = ckptio_now_ns();
    rc = read_job(j, out, &read);
    ckptio_lap(&r->timers.copy_ns, &t);
    atomic_fetch_add(j->read, read);
    if (rc < 0) {
      snprintf(msg, sizeof(msg), "%s: tensor '%s': reading bytes %llu to %llu of a slice failed: %s", r->path,
               j->e->name, (unsigned long long)j->off, (unsigned long long)(j->off + j->len), ckptio_strerror(rc));
    } else {
      ckptio_load_byteswap(j->e, out, j->len); /* the destination (or slot) is ours to write */
      if (j->gpu >= 0) {
        rc = ckptio_load_h2d(r, j->gpu, j->slot, j->dst + j->off, out, j->len, "slice of ", j->e->name, msg,
                             sizeof(msg));
        ckptio_lap(&r->timers.device_ns, &t);
      }
      if (rc == 0) atomic_fetch_add(&r->done_bytes, j->len);
    }
  }
  if (j->slot) ckptio_ring_release(r->ctx->ring, j->slot);
  ckptio_batch_done(j->batch, rc, msg);
}

/* Output bytes one job moves: a slot, less room for page edges where the
 * slot takes O_DIRECT reads; a multiple of the page, so of any element. */
static uint64_t job_cap(const ckptio_entry *e, ckptio_load_method method, int gpu, uint64_t slot,
                        uint64_t half) {
  if (e->strided || method != CKPTIO_LOAD_DIRECT) return slot;
  return (gpu >= 0 ? half : slot) - 2 * CKPTIO_IO_ALIGN;
}

static ckptio_load_method pick_method(ckptio_reader *r, const ckptio_slice_request *reqs,
                                      const ckptio_slice_geom *geoms, const char *skip, size_t n) {
  ckptio_load_method method = r->opts.load_method;
  if (method == CKPTIO_LOAD_AUTO) {
    ckptio_load_request *lr = calloc(n + 1, sizeof(*lr));
    uint64_t min_run = UINT64_MAX;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
      if (skip[i] || !geoms[i].nbytes) continue;
      if (geoms[i].run < min_run) min_run = geoms[i].run;
      if (lr) lr[m++].index = reqs[i].index;
    }
    method = !lr || min_run < DIRECT_MIN_RUN || ckptio_load_mostly_cached(r, lr, m) ? CKPTIO_LOAD_PREAD
                                                                                    : CKPTIO_LOAD_DIRECT;
    free(lr);
  }
  if (method == CKPTIO_LOAD_DIRECT && r->fd_direct < 0) {
    r->fd_direct = open(r->path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (r->fd_direct < 0) method = CKPTIO_LOAD_PREAD; /* e.g. tmpfs: the page cache is the disk */
  }
  if (method == CKPTIO_LOAD_MMAP && !r->map) method = CKPTIO_LOAD_PREAD;
  return method;
}

/* Loads the requests not marked in skip (validated) as jobs on the pool. */
static int run_slices(ckptio_reader *r, ckptio_slice_request *reqs, const ckptio_slice_geom *geoms,
                      const char *skip, size_t n) {
  ckptio_load_method method = pick_method(r, reqs, geoms, skip, n);
  uint64_t slot = ckptio_ring_slot_bytes(r->ctx->ring), half = ALIGN_DOWN(slot / 2);
  size_t njobs = 0;
  uint64_t bytes = 0, gpus = 0;
  void *events[CKPTIO_READER_MAX_GPUS] = {0};
  for (size_t i = 0; i < n; i++) {
    if (skip[i] || !geoms[i].nbytes) continue;
    int gpu = reqs[i].device == CKPTIO_DEVICE_HOST ? -1 : reqs[i].device - CKPTIO_DEVICE_CUDA(0);
    uint64_t cap = job_cap(&r->idx.entries[reqs[i].index], method, gpu, slot, half);
    njobs += (size_t)((geoms[i].nbytes + cap - 1) / cap);
    bytes += geoms[i].nbytes;
    if (gpu >= 0) gpus |= 1ull << gpu;
  }
  sjob *jobs = calloc(njobs + 1, sizeof(*jobs));
  _Atomic uint64_t *read = calloc(n + 1, sizeof(*read));
  ckptio_batch batch;
  ckptio_batch_init(&batch);
  int rc = 0;
  if (!jobs || !read) {
    rc = -ENOMEM;
    goto out;
  }
  if (gpus && (rc = ckptio_load_order_after_caller(r, gpus, events)) < 0) goto out;
  atomic_store(&r->done_bytes, 0);
  atomic_store(&r->total_bytes, bytes);
  memset(&r->timers, 0, sizeof(r->timers));
  r->timers.start_ns = ckptio_now_ns();
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (skip[i] || !geoms[i].nbytes) continue;
    const ckptio_entry *e = &r->idx.entries[reqs[i].index];
    int gpu = reqs[i].device == CKPTIO_DEVICE_HOST ? -1 : reqs[i].device - CKPTIO_DEVICE_CUDA(0);
    uint64_t cap = job_cap(e, method, gpu, slot, half);
    for (uint64_t off = 0; off < geoms[i].nbytes; off += cap)
      jobs[k++] = (sjob){.r = r, .batch = &batch, .e = e, .g = &geoms[i], .dst = reqs[i].dst, .read = &read[i],
                         .gpu = gpu, .method = method, .off = off,
                         .len = geoms[i].nbytes - off < cap ? geoms[i].nbytes - off : cap, .half = half};
  }
  /* Slots are taken here, on the queuing thread, so the ring bounds what
   * is in flight and a job never waits for a second slot. */
  for (size_t i = 0; i < k && !ckptio_batch_failed(&batch); i++) {
    sjob *j = &jobs[i];
    if (j->gpu >= 0 || (j->method == CKPTIO_LOAD_DIRECT && !j->e->strided)) j->slot = ckptio_ring_acquire(r->ctx->ring);
    ckptio_batch_add(&batch, 1);
    int qrc = ckptio_pool_add(r->ctx->pool, job_run, j);
    if (qrc < 0) {
      if (j->slot) ckptio_ring_release(r->ctx->ring, j->slot);
      ckptio_batch_done(&batch, qrc, "cannot queue a read: out of memory");
    }
  }
  rc = ckptio_batch_wait(&batch);
  r->timers.end_ns = ckptio_now_ns();
  if (rc < 0) snprintf(r->err, sizeof(r->err), "%s", batch.err);
  for (size_t i = 0; i < n; i++)
    if (!skip[i]) reqs[i].bytes_read = atomic_load(&read[i]);
out:
  ckptio_batch_destroy(&batch);
  for (int ord = 0; ord < CKPTIO_READER_MAX_GPUS; ord++)
    if (events[ord]) r->ctx->gpu->ops->event_destroy(events[ord]);
  free(jobs);
  free((void *)read);
  return rc;
}

/* Partial slices of a compressed file: every run of every slice becomes a
 * plain byte range, and one pass decompresses each frame that holds any of
 * them once, delivering its runs (compress/zload.c). bytes_read is the
 * plain bytes of the frames a slice needed. */
static int compressed_slices(ckptio_reader *r, ckptio_slice_request *reqs, const ckptio_slice_geom *geoms,
                             const char *skip, size_t n) {
  size_t runs = 0;
  uint64_t gpus = 0;
  void *events[CKPTIO_READER_MAX_GPUS] = {0};
  for (size_t i = 0; i < n; i++) {
    if (skip[i] || !geoms[i].nbytes) continue;
    runs += (size_t)geoms[i].count;
    if (reqs[i].device != CKPTIO_DEVICE_HOST) gpus |= 1ull << (reqs[i].device - CKPTIO_DEVICE_CUDA(0));
  }
  ckptio_load_request *lr = calloc(runs + 1, sizeof(*lr));
  uint64_t *from = calloc(2 * runs + 1, sizeof(uint64_t)), *to = from ? from + runs : NULL;
  int rc = 0;
  if (!lr || !from) {
    rc = -ENOMEM;
    goto out;
  }
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (skip[i] || !geoms[i].nbytes) continue;
    const ckptio_slice_geom *g = &geoms[i];
    uint64_t base = r->idx.entries[reqs[i].index].offset + g->src0;
    size_t first = k;
    for (uint64_t x = 0; x < g->count; x++, k++) {
      lr[k] = (ckptio_load_request){reqs[i].index, (unsigned char *)reqs[i].dst + x * g->run, g->run, reqs[i].device};
      from[k] = base + x * g->pitch;
      to[k] = from[k] + g->run;
    }
    reqs[i].bytes_read = ckptio_zread_frame_bytes(r, from + first, to + first, k - first);
  }
  if (gpus && (rc = ckptio_load_order_after_caller(r, gpus, events)) < 0) goto out;
  rc = ckptio_zread_ranges(r, lr, from, to, runs);
out:
  for (int ord = 0; ord < CKPTIO_READER_MAX_GPUS; ord++)
    if (events[ord]) r->ctx->gpu->ops->event_destroy(events[ord]);
  free(lr);
  free(from);
  return rc;
}

/* The slice's geometry, and a destination of the device the request names
 * that holds it. */
static int check_slice(ckptio_reader *r, const ckptio_slice_request *q, ckptio_slice_geom *g) {
  int rc = ckptio_slice_geom_of(r, q->index, q->dim, q->start, q->stop, g);
  if (rc < 0) return rc;
  const ckptio_entry *e = &r->idx.entries[q->index];
  if (q->dst_bytes < g->nbytes || (!q->dst && g->nbytes))
    return rfail(r, CKPTIO_E_BUFFER_TOO_SMALL,
                 "%s: tensor '%s': slice %lld:%lld of dim %d needs %llu bytes, destination has %llu", r->path,
                 e->name, (long long)q->start, (long long)q->stop, q->dim, (unsigned long long)g->nbytes,
                 (unsigned long long)(q->dst ? q->dst_bytes : 0));
  return ckptio_load_check_device(r, e, q->dst, q->device, g->nbytes, "slice destination");
}

int ckptio_reader_load_slices(ckptio_reader *r, ckptio_slice_request *reqs, size_t n) {
  if (!r || (n && !reqs)) return CKPTIO_E_INVALID_ARG;
  if (r->set) return ckptio_shard_load_slices(r, reqs, n);
  ckptio_slice_geom *geoms = calloc(n + 1, sizeof(*geoms));
  char *whole = calloc(n + 1, 1);
  ckptio_load_request *lr = calloc(n + 1, sizeof(*lr));
  size_t nwhole = 0, npart = 0;
  int rc = 0;
  if (!geoms || !whole || !lr) {
    rc = -ENOMEM;
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    reqs[i].verified = 0;
    reqs[i].bytes_read = 0;
    if ((rc = check_slice(r, &reqs[i], &geoms[i])) < 0) goto out;
    const ckptio_entry *e = &r->idx.entries[reqs[i].index];
    /* A slice that is the whole tensor can be checked: load it as a tensor;
     * so must a compressed file's, whose bytes are only in its frames. */
    whole[i] = geoms[i].full && ((r->opts.crc && e->has_crc) || r->z);
    if (whole[i]) lr[nwhole++] = (ckptio_load_request){reqs[i].index, reqs[i].dst, reqs[i].dst_bytes, reqs[i].device};
    else npart++;
  }
  if (npart && (rc = (r->z ? compressed_slices : run_slices)(r, reqs, geoms, whole, n)) < 0) goto out;
  if (nwhole) {
    ckptio_timers t = r->timers;
    uint64_t done = npart ? atomic_load(&r->done_bytes) : 0, total = npart ? atomic_load(&r->total_bytes) : 0;
    if ((rc = ckptio_reader_run(r, lr, nwhole, r->opts.crc)) < 0) goto out;
    if (npart) { /* the stats cover both parts */
      r->timers.start_ns = t.start_ns;
      atomic_fetch_add(&r->timers.copy_ns, atomic_load(&t.copy_ns));
      atomic_fetch_add(&r->timers.device_ns, atomic_load(&t.device_ns));
      atomic_fetch_add(&r->done_bytes, done);
      atomic_fetch_add(&r->total_bytes, total);
    }
    for (size_t i = 0; i < n; i++) {
      if (!whole[i]) continue;
      const ckptio_entry *e = &r->idx.entries[reqs[i].index];
      reqs[i].verified = r->opts.crc && e->has_crc;
      reqs[i].bytes_read = e->nbytes + (e->strided ? geoms[i].nbytes : 0); /* a view: gathered, then its record checked */
    }
  }
out:
  free(geoms);
  free(whole);
  free(lr);
  return rc;
}

int ckptio_reader_load_slice(ckptio_reader *r, size_t index, int dim, int64_t start, int64_t stop, void *dst,
                             uint64_t dst_bytes, int *verified) {
  ckptio_slice_request q = {.index = index, .dim = dim, .start = start, .stop = stop, .dst = dst,
                            .dst_bytes = dst_bytes, .device = CKPTIO_DEVICE_HOST};
  int rc = ckptio_reader_load_slices(r, &q, 1);
  if (verified) *verified = rc == 0 && q.verified;
  return rc;
}
