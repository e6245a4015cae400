/* Moving a checkpoint's bytes: loads and verifies are cut into pieces that
 * the worker pool runs — pread straight into the destination, memcpy from
 * the map, or O_DIRECT reads through staging slots — checksumming each
 * piece as it lands; GPU destinations get their piece from a pinned slot
 * (or the registered map) with an async copy waited on by that slot's
 * event. PyTorch views into larger storages are gathered from the map;
 * big-endian files are swapped after the checksum. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "compress/zload.h"
#include "core/crc32.h"
#include "io/file.h"
#include "load_share.h"
#include "reader_internal.h"
#include "shard.h"

#define rfail ckptio_reader_fail

/* One piece of one tensor, copied (or only checked) by one job. */
typedef struct piece {
  ckptio_reader *r;
  ckptio_batch *batch;
  const ckptio_entry *e;
  unsigned char *dst;     /* the tensor's destination, or NULL to only check */
  unsigned char *slot;    /* staging slot: DIRECT reads, checks, GPU copies */
  int gpu;                /* ordinal of a GPU destination, or -1 */
  ckptio_load_method method;
  uint64_t off, len;      /* within the tensor (or its storage record) */
  int check;
  int gather;             /* a strided view: off/len count the tensor's own
                             row-major bytes, gathered from its storage */
  uint32_t crc;
} piece;


/* O_DIRECT read of the pages around [abs, abs+len) into the slot; the last
 * page may run past the end of the file. @return the bytes' position in the
 * slot, or a negative code. */
static int64_t read_direct(ckptio_reader *r, unsigned char *slot, uint64_t abs, uint64_t len) {
  uint64_t a = abs & ~(uint64_t)(CKPTIO_IO_ALIGN - 1);
  uint64_t e = (abs + len + CKPTIO_IO_ALIGN - 1) & ~(uint64_t)(CKPTIO_IO_ALIGN - 1);
  int rc = ckptio_pread_min(r->fd_direct, slot, (size_t)(e - a), a, (size_t)(abs + len - a));
  return rc < 0 ? rc : (int64_t)(abs - a);
}

static size_t elem_size(const ckptio_entry *e) { return (size_t)ckptio_dtype_bits(e->dtype) / 8; }

/* Walks logical elements [first, first + count) of a strided view in
 * row-major order and calls run(arg, storage byte offset, bytes) for each
 * stretch that is contiguous in its storage: a run along a unit-stride last
 * dimension, else one element. The parser has checked every index is
 * inside the storage. */
void ckptio_view_runs(const ckptio_entry *e, uint64_t first, uint64_t count,
                      void (*run)(void *arg, uint64_t off, uint64_t len), void *arg) {
  uint64_t es = (uint64_t)elem_size(e);
  int nd = e->ndim;
  int64_t idx[CKPTIO_MAX_DIMS];
  uint64_t rem = first;
  for (int d = nd - 1; d >= 0; d--) {
    idx[d] = (int64_t)(rem % (uint64_t)e->shape[d]);
    rem /= (uint64_t)e->shape[d];
  }
  while (count) {
    int64_t pos = (int64_t)e->elem_offset;
    for (int d = 0; d < nd; d++) pos += idx[d] * e->stride[d];
    uint64_t n = 1;
    if (nd > 0 && e->stride[nd - 1] == 1) {
      n = (uint64_t)(e->shape[nd - 1] - idx[nd - 1]);
      if (n > count) n = count;
    }
    run(arg, (uint64_t)pos * es, n * es);
    count -= n;
    if (nd == 0) break;
    idx[nd - 1] += (int64_t)n;
    for (int d = nd - 1; d > 0 && idx[d] >= e->shape[d]; d--) {
      idx[d] = 0;
      idx[d - 1]++;
    }
  }
}

typedef struct gather_to {
  unsigned char *dst;
  const unsigned char *base;
} gather_to;

static void gather_run(void *arg, uint64_t off, uint64_t len) {
  gather_to *g = arg;
  memcpy(g->dst, g->base + off, (size_t)len);
  g->dst += len;
}

/* Logical elements [first, first + count) of a strided view, row-major,
 * from its storage at base into dst. */
static void gather(unsigned char *dst, const unsigned char *base, const ckptio_entry *e, uint64_t first,
                   uint64_t count) {
  gather_to g = {dst, base};
  ckptio_view_runs(e, first, count, gather_run, &g);
}

/* Big-endian elements to little-endian, in place. */
static void byteswap(unsigned char *p, uint64_t len, size_t es) {
  for (uint64_t i = 0; i + es <= len; i += es)
    for (size_t a = 0, b = es - 1; a < b; a++, b--) {
      unsigned char c = p[i + a];
      p[i + a] = p[i + b];
      p[i + b] = c;
    }
}

/* Maps the piece's pages in one call instead of one fault per few pages
 * (a fault costs microseconds; copying a page, a fraction of one). Best
 * effort: kernels before 5.14 lack it and the copy just faults. */
static int populate(const unsigned char *p, uint64_t len) {
#ifdef MADV_POPULATE_READ
  /* EFAULT: some page is past the end of the file (it shrank since it was
   * opened); reading it would raise SIGBUS. */
  uintptr_t a = (uintptr_t)p & ~(uintptr_t)(CKPTIO_IO_ALIGN - 1);
  if (madvise((void *)a, (size_t)((uintptr_t)p + len - a), MADV_POPULATE_READ) != 0 && errno == EFAULT)
    return CKPTIO_E_SHORT_IO;
#else
  (void)p, (void)len;
#endif
  return 0;
}

/* Drops the piece's pages from this process's mapping once copied: mapped
 * file pages count in RSS, and a load must not hold the file twice (once
 * mapped, once in the destination). They stay in the page cache, and a
 * later touch (a view) maps them again. Only whole pages inside the piece:
 * the edges may be shared with the neighbours being copied. */
static void unmap_pages(const unsigned char *p, uint64_t len) {
  uintptr_t a = ((uintptr_t)p + CKPTIO_IO_ALIGN - 1) & ~(uintptr_t)(CKPTIO_IO_ALIGN - 1);
  uintptr_t b = ((uintptr_t)p + len) & ~(uintptr_t)(CKPTIO_IO_ALIGN - 1);
  if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

/* Brings the piece's bytes to host memory: into the host destination when
 * there is one, else into the slot (or, mapped, leaves them in the map),
 * and continues p->crc over them in cache-sized steps when checking.
 * @return 0 and *bytes, or a negative code. */
static int read_piece(piece *p, uint64_t abs, const unsigned char **bytes) {
  ckptio_reader *r = p->r;
  unsigned char *host_dst = p->gpu < 0 && p->dst ? p->dst + p->off : NULL;
  uint32_t *crc = p->check ? &p->crc : NULL;
  const unsigned char *src = NULL;
  if (p->gather) {
    unsigned char *to = host_dst ? host_dst : p->slot;
    size_t es = elem_size(p->e);
    gather(to, r->map + p->e->offset, p->e, p->off / es, p->len / es);
    *bytes = to;
    return 0;
  }
  if (p->method == CKPTIO_LOAD_MMAP && host_dst) {
    /* A step at a time: map, copy with the CRC, unmap, so what is mapped at
     * once is a few steps per worker, not a piece. */
    for (uint64_t off = 0; off < p->len; off += CKPTIO_CRC_STEP) {
      size_t len = (size_t)(p->len - off < CKPTIO_CRC_STEP ? p->len - off : CKPTIO_CRC_STEP);
      int rc = populate(r->map + abs + off, len);
      if (rc < 0) return rc;
      ckptio_copy_crc(host_dst + off, r->map + abs + off, len, crc);
      unmap_pages(r->map + abs + off, len);
    }
    *bytes = host_dst;
    return 0;
  }
  if (p->method == CKPTIO_LOAD_MMAP) {
    src = r->map + abs;
    int rc = populate(src, p->len);
    if (rc < 0) return rc;
  } else if (p->method == CKPTIO_LOAD_DIRECT) {
    int64_t at = read_direct(r, p->slot, abs, p->len);
    if (at < 0) return (int)at;
    src = p->slot + at;
  } else {
    unsigned char *to = host_dst ? host_dst : p->slot;
    for (uint64_t off = 0; off < p->len; off += CKPTIO_CRC_STEP) {
      size_t len = (size_t)(p->len - off < CKPTIO_CRC_STEP ? p->len - off : CKPTIO_CRC_STEP);
      int rc = ckptio_pread_full(r->fd, to + off, len, abs + off);
      if (rc < 0) return rc;
      if (crc) *crc = ckptio_crc32(*crc, to + off, len);
    }
    *bytes = to;
    return 0;
  }
  if (host_dst) {
    ckptio_copy_crc(host_dst, src, (size_t)p->len, crc);
    src = host_dst;
  } else if (crc) {
    *crc = ckptio_crc32(0, src, (size_t)p->len);
  }
  *bytes = src;
  return 0;
}

static void piece_run(void *arg) {
  piece *p = arg;
  ckptio_reader *r = p->r;
  int rc = 0;
  char msg[CKPTIO_ERRLEN] = "";
  if (!ckptio_batch_failed(p->batch)) {
    uint64_t abs = p->e->offset + p->off;
    const unsigned char *bytes = NULL;
    uint64_t t = ckptio_now_ns();
    rc = read_piece(p, abs, &bytes);
    ckptio_lap(&r->timers.copy_ns, &t);
    if (rc < 0) {
      snprintf(msg, sizeof(msg), "%s: tensor '%s': read of %llu bytes at offset %llu failed: %s",
               r->path, p->e->name, (unsigned long long)p->len, (unsigned long long)abs,
               ckptio_strerror(rc));
    } else {
      if (p->dst && p->e->byteswap && elem_size(p->e) > 1) {
        /* After the CRC, which covers the file's bytes; a check has nothing
         * to swap (and, mapped, no slot to swap in). Mapped bytes are
         * read-only: a GPU piece swaps in its slot. */
        unsigned char *w = (unsigned char *)bytes;
        if (bytes >= r->map && bytes < r->map + r->file_size) w = memcpy(p->slot, bytes, (size_t)p->len);
        /* A complex number is two floats, each swapped on its own. */
        byteswap(w, p->len, p->e->dtype == CKPTIO_C64 ? 4 : elem_size(p->e));
        bytes = w;
      }
      if (p->gpu >= 0) {
        rc = ckptio_load_h2d(r, p->gpu, p->slot, p->dst + p->off, bytes, p->len, "", p->e->name, msg, sizeof(msg));
        ckptio_lap(&r->timers.device_ns, &t);
      }
      if (rc == 0) atomic_fetch_add(&r->done_bytes, p->len);
    }
  }
  if (p->slot) ckptio_ring_release(r->ctx->ring, p->slot);
  ckptio_batch_done(p->batch, rc, msg);
}

/* Runs the pieces on the pool; those that need a staging slot take one
 * first, so a check of a file larger than memory stays bounded. */
static int run_pieces(ckptio_reader *r, piece *pieces, size_t n) {
  ckptio_batch batch;
  ckptio_batch_init(&batch);
  for (size_t i = 0; i < n && !ckptio_batch_failed(&batch); i++) {
    piece *p = &pieces[i];
    p->batch = &batch;
    /* A GPU piece holds a slot even when mapped: its event tracks the copy,
     * and the ring bounds how many copies are in flight. */
    int need_slot = p->method == CKPTIO_LOAD_DIRECT || p->gpu >= 0 ||
                    (!p->dst && p->method != CKPTIO_LOAD_MMAP);
    p->slot = need_slot ? ckptio_ring_acquire(r->ctx->ring) : NULL;
    ckptio_batch_add(&batch, 1);
    int rc = ckptio_pool_add(r->ctx->pool, piece_run, p);
    if (rc < 0) {
      if (p->slot) ckptio_ring_release(r->ctx->ring, p->slot);
      ckptio_batch_done(&batch, rc, "cannot queue a read: out of memory");
    }
  }
  int rc = ckptio_batch_wait(&batch);
  if (rc < 0) snprintf(r->err, sizeof(r->err), "%s", batch.err);
  ckptio_batch_destroy(&batch);
  return rc;
}

/* Pins the whole mapping so GPU copies can read the file's pages directly;
 * read-only where the runtime allows it. */
static int register_map(ckptio_reader *r, char *msg, size_t len) {
  ckptio_gpu *g = r->ctx->gpu;
  size_t n = (size_t)((r->file_size + CKPTIO_IO_ALIGN - 1) & ~(uint64_t)(CKPTIO_IO_ALIGN - 1));
  int e = g->ops->host_register((void *)r->map, n, 1);
  return e ? ckptio_gpu_fail(g, e, msg, len, "cudaHostRegister of the file mapping") : 0;
}

/* Appends the pieces covering len bytes; @return the new count. */
static size_t cut(piece *pieces, size_t k, piece proto, uint64_t len, uint64_t step) {
  for (uint64_t off = 0; off < len; off += step) {
    pieces[k] = proto;
    pieces[k].off = off;
    pieces[k].len = len - off < step ? len - off : step;
    k++;
  }
  return k;
}

/* Bytes a request moves: a strided view's own bytes, else its range. */
static uint64_t view_bytes(const ckptio_entry *e) {
  return e->strided ? (uint64_t)ckptio_tensor_nbytes(e->dtype, e->ndim, e->shape) : e->nbytes;
}

/* On the caller's thread, as the load starts: each GPU's host-to-device
 * stream waits on an event recorded on the caller's stream, so work queued
 * before the load that still uses the destinations finishes first. The
 * caller's current GPU is restored. */
static int order_after_caller(ckptio_reader *r, uint64_t gpus, void **events) {
  ckptio_gpu *g = r->ctx->gpu;
  int current = 0, e = g->ops->get_device(&current);
  const char *what = "cudaGetDevice";
  for (int ord = 0; ord < CKPTIO_READER_MAX_GPUS && !e; ord++) {
    if (!(gpus >> ord & 1)) continue;
    ckptio_gpu_dev *v;
    what = "ordering the load after the caller's stream";
    if (!(e = ckptio_gpu_use(g, ord, &v)) && !(e = g->ops->event_create(&events[ord])) &&
        !(e = g->ops->event_record(events[ord], r->user_stream[ord])))
      e = g->ops->stream_wait_event(v->h2d, events[ord]);
  }
  g->ops->set_device(current);
  if (!e) return 0;
  char msg[CKPTIO_ERRLEN];
  return rfail(r, ckptio_gpu_fail(g, e, msg, sizeof(msg), what), "%s: %s", r->path, msg);
}

/* Whether the page cache holds most of what the requests read, from a
 * sample of up to 64 pages across them (mincore on the map: no I/O). A cold
 * file is read with O_DIRECT, many large requests in flight (0.90x of the
 * raw read in bench/RESULTS.md); a warm one with pread, which copies from
 * the cache at memory speed. */
static int mostly_cached(ckptio_reader *r, const ckptio_load_request *reqs, size_t n) {
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) total += r->idx.entries[reqs[i].index].nbytes;
  if (!r->map || total == 0) return 1;
  int samples = 0, resident = 0;
  uint64_t stride = total / 64 + 1, at = 0, seen = 0;
  for (size_t i = 0; i < n && samples < 64; i++) {
    const ckptio_entry *e = &r->idx.entries[reqs[i].index];
    for (; at < seen + e->nbytes && samples < 64; at += stride, samples++) {
      uintptr_t page = (uintptr_t)(r->map + e->offset + (at - seen)) & ~(uintptr_t)(CKPTIO_IO_ALIGN - 1);
      unsigned char v = 0;
      resident += mincore((void *)page, CKPTIO_IO_ALIGN, &v) == 0 && (v & 1);
    }
    seen += e->nbytes;
  }
  return samples == 0 || resident * 2 >= samples;
}

/* Cuts the requested tensors into pieces, runs them, and checks the CRCs
 * of those that have one when `check` is set. A request with a NULL dst
 * only checks. A strided view is gathered in pieces of its own bytes, and
 * its storage record, which the CRC covers, is checked by pieces of its
 * own. The requests are already validated. */
int ckptio_reader_run(ckptio_reader *r, const ckptio_load_request *reqs, size_t n, int check) {
  if (r->set) return ckptio_shard_run(r, reqs, n, check);
  /* AUTO: pread from a warm cache, O_DIRECT from a cold one. Never the map:
   * with its pages populated a piece at a time and dropped once copied (so
   * RSS stays bounded) MMAP measured the same as pread within the noise here
   * (bench/RESULTS.md), and pread wins on what matters beyond speed: a file
   * cut short under us is a clean read error, not a SIGBUS, and GPU loads
   * need no registration of the file's pages. */
  ckptio_load_method method = r->opts.load_method;
  if (method == CKPTIO_LOAD_AUTO && !r->z) /* compressed files sample no plain pages */
    method = mostly_cached(r, reqs, n) ? CKPTIO_LOAD_PREAD : CKPTIO_LOAD_DIRECT;
  if (method == CKPTIO_LOAD_DIRECT && r->fd_direct < 0) {
    r->fd_direct = open(r->path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (r->fd_direct < 0) method = CKPTIO_LOAD_PREAD; /* e.g. tmpfs: the page cache is the disk */
  }
  uint64_t step = ckptio_ring_slot_bytes(r->ctx->ring);
  if (method == CKPTIO_LOAD_DIRECT) step -= 2 * CKPTIO_IO_ALIGN; /* room for the page edges */
  size_t total = 0;
  uint64_t bytes = 0;
  int registered = 0;
  uint64_t gpus = 0;
  void *events[CKPTIO_READER_MAX_GPUS] = {0};
  for (size_t i = 0; i < n; i++) {
    const ckptio_entry *e = &r->idx.entries[reqs[i].index];
    int gathered = e->strided && reqs[i].dst;
    total += (size_t)((e->nbytes + step - 1) / step);
    if (gathered) total += (size_t)((view_bytes(e) + step - 1) / step);
    bytes += gathered ? view_bytes(e) : e->nbytes;
    if (reqs[i].device != CKPTIO_DEVICE_HOST) gpus |= 1ull << (reqs[i].device - CKPTIO_DEVICE_CUDA(0));
  }
  piece *pieces = calloc(total + 1, sizeof(piece));
  size_t *crc_first = calloc(n + 1, sizeof(size_t)), *crc_end = calloc(n + 1, sizeof(size_t));
  int rc = 0;
  if (!pieces || !crc_first || !crc_end) {
    rc = -ENOMEM;
    goto out;
  }
  if (gpus && (rc = order_after_caller(r, gpus, events)) < 0) goto out;
  if (r->z) { rc = ckptio_zread_run(r, reqs, n, check); goto out; } /* compressed: compress/zload.c */
  if (gpus && method == CKPTIO_LOAD_MMAP && r->map) {
    char msg[CKPTIO_ERRLEN];
    if ((rc = register_map(r, msg, sizeof(msg))) < 0) {
      rfail(r, rc, "%s: %s", r->path, msg);
      goto out;
    }
    registered = 1;
  }
  atomic_store(&r->done_bytes, 0);
  atomic_store(&r->total_bytes, bytes);
  memset(&r->timers, 0, sizeof(r->timers));
  r->timers.start_ns = ckptio_now_ns();
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    const ckptio_entry *e = &r->idx.entries[reqs[i].index];
    int gpu = reqs[i].device == CKPTIO_DEVICE_HOST ? -1 : reqs[i].device - CKPTIO_DEVICE_CUDA(0);
    piece proto = {.r = r, .e = e, .dst = reqs[i].dst, .gpu = gpu, .method = method, .check = check && e->has_crc};
    if (e->strided && reqs[i].dst) {
      piece g = proto;
      g.gather = 1;
      g.check = 0;
      k = cut(pieces, k, g, view_bytes(e), step);
      proto.dst = NULL; /* then check the storage record */
      proto.gpu = -1;
      if (!proto.check) continue;
    }
    crc_first[i] = k;
    k = cut(pieces, k, proto, e->nbytes, step);
    crc_end[i] = k;
  }
  rc = run_pieces(r, pieces, k);
  r->timers.end_ns = ckptio_now_ns();
  if (registered) r->ctx->gpu->ops->host_unregister((void *)r->map);
  if (rc < 0) goto out;
  for (size_t i = 0; i < n; i++) {
    const ckptio_entry *e = &r->idx.entries[reqs[i].index];
    if (!check || !e->has_crc) continue;
    uint32_t crc = 0;
    for (size_t j = crc_first[i]; j < crc_end[i]; j++) crc = ckptio_crc32_combine(crc, pieces[j].crc, pieces[j].len);
    if (crc != e->crc) {
      rc = rfail(r, CKPTIO_E_CHECKSUM, "%s: tensor '%s': checksum mismatch (recorded %08x, data %08x)",
                 r->path, e->name, e->crc, crc);
      goto out;
    }
  }
out:
  for (int ord = 0; ord < CKPTIO_READER_MAX_GPUS; ord++)
    if (events[ord]) r->ctx->gpu->ops->event_destroy(events[ord]);
  free(pieces);
  free(crc_first);
  free(crc_end);
  return rc;
}

/* A destination must be memory of the device the request names. */
static int check_request(ckptio_reader *r, const ckptio_load_request *q, size_t i) {
  if (q->index >= r->idx.count)
    return rfail(r, CKPTIO_E_INVALID_ARG, "%s: request %zu: no tensor at index %zu", r->path, i, q->index);
  const ckptio_entry *e = &r->idx.entries[q->index];
  uint64_t need = view_bytes(e);
  if (q->dst_bytes < need || (!q->dst && need))
    return rfail(r, CKPTIO_E_BUFFER_TOO_SMALL, "%s: tensor '%s' needs %llu bytes, destination has %llu",
                 r->path, e->name, (unsigned long long)need,
                 (unsigned long long)(q->dst ? q->dst_bytes : 0));
  return ckptio_load_check_device(r, e, q->dst, q->device, need, "destination");
}

int ckptio_load_h2d(ckptio_reader *r, int gpu, const void *slot, void *dst, const void *src, uint64_t n,
                    const char *what, const char *name, char *msg, size_t len) {
  ckptio_gpu *g = r->ctx->gpu;
  ckptio_gpu_dev *v;
  void *ev = NULL;
  const char *call = "cudaSetDevice";
  int e = ckptio_gpu_use(g, gpu, &v);
  if (!e) {
    ev = v->slot_events[ckptio_ring_slot_index(r->ctx->ring, slot)];
    call = "cudaMemcpyAsync (host to device)";
    e = g->ops->copy_h2d(dst, src, (size_t)n, v->h2d);
  }
  if (!e) call = "cudaEventRecord", e = g->ops->event_record(ev, v->h2d);
  if (!e) call = "cudaEventSynchronize", e = g->ops->event_sync(ev);
  if (!e) return 0;
  char detail[CKPTIO_ERRLEN];
  int rc = ckptio_gpu_fail(g, e, detail, sizeof(detail), call);
  snprintf(msg, len, "%s: %stensor '%s' to GPU %d: %s", r->path, what, name, gpu, detail);
  return rc;
}

static const char *memory_name(int ord, char *buf, size_t len) {
  if (ord < 0) return "host memory";
  snprintf(buf, len, "memory of GPU %d", ord);
  return buf;
}

int ckptio_load_check_device(ckptio_reader *r, const ckptio_entry *e, const void *dst, int device, uint64_t need,
                             const char *what) {
  int ord = -1, where = -1;
  char msg[CKPTIO_ERRLEN];
  if (device != CKPTIO_DEVICE_HOST && ckptio_ctx_gpu_ordinal(r->ctx, device, &ord, msg, sizeof(msg)) < 0)
    return rfail(r, CKPTIO_E_DEVICE, "%s: tensor '%s': %s", r->path, e->name, msg);
  if (ord >= CKPTIO_READER_MAX_GPUS)
    return rfail(r, CKPTIO_E_DEVICE, "%s: tensor '%s': ckptio handles GPUs 0 to 63", r->path, e->name);
  if (!r->ctx->gpu || !need) return 0;
  int err = r->ctx->gpu->ops->pointer_device(dst, &where);
  if (err)
    return rfail(r, ckptio_gpu_fail(r->ctx->gpu, err, msg, sizeof(msg), "cudaPointerGetAttributes"),
                 "%s: tensor '%s': %s", r->path, e->name, msg);
  char a[32], b[32];
  if (where != ord)
    return rfail(r, CKPTIO_E_DEVICE, "%s: tensor '%s': %s is %s but the request says %s", r->path, e->name, what,
                 memory_name(where, a, sizeof(a)), memory_name(ord, b, sizeof(b)));
  return 0;
}

int ckptio_reader_load_many(ckptio_reader *r, const ckptio_load_request *reqs, size_t n) {
  if (!r || (n && !reqs)) return CKPTIO_E_INVALID_ARG;
  for (size_t i = 0; i < n; i++) {
    int rc = check_request(r, &reqs[i], i);
    if (rc < 0) return rc;
  }
  return ckptio_reader_run(r, reqs, n, r->opts.crc);
}

int ckptio_reader_load(ckptio_reader *r, size_t index, void *dst, uint64_t dst_bytes) {
  ckptio_load_request req = {index, dst, dst_bytes, CKPTIO_DEVICE_HOST};
  return ckptio_reader_load_many(r, &req, 1);
}

int ckptio_reader_verify(ckptio_reader *r, size_t *unchecked) {
  if (!r) return CKPTIO_E_INVALID_ARG;
  ckptio_load_request *reqs = calloc(r->idx.count + 1, sizeof(*reqs));
  if (!reqs) return -ENOMEM;
  size_t n = 0;
  for (size_t i = 0; i < r->idx.count; i++)
    if (r->idx.entries[i].has_crc) reqs[n++].index = i; /* dst NULL: check only */
  int rc = ckptio_reader_run(r, reqs, n, 1);
  free(reqs);
  if (unchecked) *unchecked = r->idx.count - n;
  return rc;
}

/* ---- the helpers above, for slice.c (declared in load_share.h) */

void ckptio_load_gather(unsigned char *dst, const unsigned char *base, const ckptio_entry *e,
                        uint64_t first, uint64_t count) {
  gather(dst, base, e, first, count);
}

void ckptio_load_byteswap(const ckptio_entry *e, unsigned char *p, uint64_t len) {
  if (e->byteswap && elem_size(e) > 1) byteswap(p, len, e->dtype == CKPTIO_C64 ? 4 : elem_size(e));
}

int ckptio_load_populate(const unsigned char *p, uint64_t len) { return populate(p, len); }

void ckptio_load_unmap(const unsigned char *p, uint64_t len) { unmap_pages(p, len); }

int ckptio_load_order_after_caller(ckptio_reader *r, uint64_t gpus, void **events) {
  return order_after_caller(r, gpus, events);
}

int ckptio_load_mostly_cached(ckptio_reader *r, const ckptio_load_request *reqs, size_t n) {
  return mostly_cached(r, reqs, n);
}
