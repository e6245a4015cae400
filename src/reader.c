/* The load pipeline: parse and validate the header at open, map the file,
 * and load tensors by cutting them into pieces that the worker pool copies
 * (pread straight into the destination, memcpy from the map, or O_DIRECT
 * reads through staging slots), CRC-checking each piece as it lands. */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/crc32.h"
#include "core/error.h"
#include "core/stats.h"
#include "formats/safetensors.h"
#include "internal.h"
#include "io/file.h"

struct ckptio_reader {
  ckptio_ctx *ctx;
  ckptio_options opts;
  char *path;
  int fd, fd_direct;
  uint64_t file_size;
  ckptio_st_index idx;
  size_t *by_name;        /* entry indices sorted by name */
  const unsigned char *map;
  _Atomic uint64_t done_bytes;
  _Atomic uint64_t total_bytes;
  ckptio_timers timers;
  char err[CKPTIO_ERRLEN];
};

/* One piece of one tensor, copied (or only checked) by one job. */
typedef struct piece {
  ckptio_reader *r;
  ckptio_batch *batch;
  const ckptio_st_entry *e;
  unsigned char *dst;     /* the tensor's destination, or NULL to only check */
  unsigned char *slot;    /* staging slot: DIRECT reads, checks, GPU copies */
  int gpu;                /* ordinal of a GPU destination, or -1 */
  ckptio_load_method method;
  uint64_t off, len;      /* within the tensor */
  int check;
  uint32_t crc;
} piece;

static int rfail(ckptio_reader *r, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int rfail(ckptio_reader *r, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->err, sizeof(r->err), fmt, ap);
  va_end(ap);
  return code;
}

static const ckptio_reader *sort_reader; /* qsort has no context argument */
static pthread_mutex_t sort_mu = PTHREAD_MUTEX_INITIALIZER;
static int cmp_by_name(const void *a, const void *b) {
  return strcmp(sort_reader->idx.entries[*(const size_t *)a].name,
                sort_reader->idx.entries[*(const size_t *)b].name);
}

static int read_header(ckptio_reader *r) {
  uint8_t prefix[8] = {0};
  uint64_t n;
  int rc = ckptio_pread_full(r->fd, prefix, r->file_size < 8 ? (size_t)r->file_size : 8, 0);
  if (rc < 0) return rfail(r, rc, "%s: reading the header: %s", r->path, ckptio_strerror(rc));
  char msg[CKPTIO_ERRLEN];
  if ((rc = ckptio_st_header_length(prefix, r->file_size, &n, msg, sizeof(msg))) < 0)
    return rfail(r, rc, "%s: %s", r->path, msg);
  uint8_t *hdr = malloc(n ? n : 1);
  if (!hdr) return -ENOMEM;
  rc = ckptio_pread_full(r->fd, hdr, (size_t)n, 8);
  if (rc < 0) {
    free(hdr);
    return rfail(r, rc, "%s: reading the header: %s", r->path, ckptio_strerror(rc));
  }
  rc = ckptio_st_parse(hdr, n, r->file_size, &r->idx, msg, sizeof(msg));
  free(hdr);
  if (rc < 0) return rfail(r, rc, "%s: %s", r->path, msg);
  return 0;
}

int ckptio_reader_open(ckptio_ctx *ctx, const char *path, const ckptio_options *opts,
                       ckptio_reader **out) {
  if (!out) return CKPTIO_E_INVALID_ARG;
  *out = NULL;
  if (!ctx || !path) return CKPTIO_E_INVALID_ARG;
  ckptio_reader *r = calloc(1, sizeof(*r));
  if (!r) return -ENOMEM;
  r->ctx = ctx;
  r->fd = r->fd_direct = -1;
  int rc = ckptio_options_for_call(ctx, opts, &r->opts);
  if (rc < 0) goto fail;
  if (!(r->path = strdup(path))) {
    rc = -ENOMEM;
    goto fail;
  }
  struct stat st;
  if ((r->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0 || fstat(r->fd, &st) < 0) {
    rc = rfail(r, -errno, "%s: %s", path, strerror(errno));
    goto fail;
  }
  if (!S_ISREG(st.st_mode)) {
    rc = rfail(r, CKPTIO_E_INVALID_ARG, "%s: not a regular file", path);
    goto fail;
  }
  r->file_size = (uint64_t)st.st_size;
  if ((rc = read_header(r)) < 0) goto fail;
  if (r->file_size) {
    void *m = mmap(NULL, (size_t)r->file_size, PROT_READ, MAP_SHARED, r->fd, 0);
    if (m == MAP_FAILED) {
      rc = rfail(r, -errno, "%s: mmap: %s", path, strerror(errno));
      goto fail;
    }
    r->map = m;
  }
  if (!(r->by_name = malloc((r->idx.count + 1) * sizeof(size_t)))) {
    rc = -ENOMEM;
    goto fail;
  }
  for (size_t i = 0; i < r->idx.count; i++) r->by_name[i] = i;
  pthread_mutex_lock(&sort_mu);
  sort_reader = r;
  qsort(r->by_name, r->idx.count, sizeof(size_t), cmp_by_name);
  pthread_mutex_unlock(&sort_mu);
  *out = r;
  return 0;
fail:
  ckptio_set_open_error(r->err[0] ? r->err : ckptio_strerror(rc));
  ckptio_reader_close(r);
  return rc;
}

void ckptio_reader_close(ckptio_reader *r) {
  if (!r) return;
  if (r->map) munmap((void *)r->map, (size_t)r->file_size);
  if (r->fd_direct >= 0) close(r->fd_direct);
  if (r->fd >= 0) close(r->fd);
  ckptio_st_index_free(&r->idx);
  free(r->by_name);
  free(r->path);
  free(r);
}

size_t ckptio_reader_count(const ckptio_reader *r) { return r ? r->idx.count : 0; }

int ckptio_reader_info(const ckptio_reader *r, size_t index, ckptio_tensor_info *out) {
  if (!r || !out || index >= r->idx.count) return CKPTIO_E_INVALID_ARG;
  const ckptio_st_entry *e = &r->idx.entries[index];
  memset(out, 0, sizeof(*out));
  out->name = e->name;
  out->dtype = e->dtype;
  out->ndim = e->ndim;
  memcpy(out->shape, e->shape, sizeof(out->shape));
  out->nbytes = e->end - e->begin;
  out->offset = r->idx.data_start + e->begin;
  out->has_crc = e->has_crc;
  out->crc32 = e->crc;
  return 0;
}

int64_t ckptio_reader_find(const ckptio_reader *r, const char *name) {
  if (!r || !name) return CKPTIO_E_INVALID_ARG;
  size_t lo = 0, hi = r->idx.count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(r->idx.entries[r->by_name[mid]].name, name);
    if (c == 0) return (int64_t)r->by_name[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return CKPTIO_E_NOT_FOUND;
}

size_t ckptio_reader_metadata_count(const ckptio_reader *r) { return r ? r->idx.meta_count : 0; }

int ckptio_reader_metadata_at(const ckptio_reader *r, size_t index, const char **key,
                              const char **value) {
  if (!r || index >= r->idx.meta_count) return CKPTIO_E_INVALID_ARG;
  if (key) *key = r->idx.meta[index].key;
  if (value) *value = r->idx.meta[index].value;
  return 0;
}

const char *ckptio_reader_metadata_get(const ckptio_reader *r, const char *key) {
  for (size_t i = 0; r && key && i < r->idx.meta_count; i++)
    if (strcmp(r->idx.meta[i].key, key) == 0) return r->idx.meta[i].value;
  return NULL;
}

int ckptio_reader_view(ckptio_reader *r, size_t index, const void **data, uint64_t *nbytes) {
  if (!r || !data || index >= r->idx.count) return CKPTIO_E_INVALID_ARG;
  const ckptio_st_entry *e = &r->idx.entries[index];
  *data = r->map ? r->map + r->idx.data_start + e->begin : NULL;
  if (nbytes) *nbytes = e->end - e->begin;
  return 0;
}

void ckptio_reader_progress(ckptio_reader *r, uint64_t *done, uint64_t *total) {
  if (done) *done = r ? atomic_load(&r->done_bytes) : 0;
  if (total) *total = r ? atomic_load(&r->total_bytes) : 0;
}

const char *ckptio_reader_last_error(const ckptio_reader *r) { return r ? r->err : ""; }

int ckptio_reader_stats(const ckptio_reader *r, ckptio_stats *out) {
  if (!r) return CKPTIO_E_INVALID_ARG;
  const ckptio_options *o = &r->ctx->opts;
  return ckptio_timers_report(&r->timers, atomic_load(&r->done_bytes), o->threads,
                              o->staging_bytes / o->chunk_bytes * o->chunk_bytes, out);
}

/* ---------------------------------------------------------------- pieces */

/* O_DIRECT read of the pages around [abs, abs+len) into the slot; the last
 * page may run past the end of the file. @return the bytes' position in the
 * slot, or a negative code. */
static int64_t read_direct(ckptio_reader *r, unsigned char *slot, uint64_t abs, uint64_t len) {
  uint64_t a = abs & ~(uint64_t)(CKPTIO_IO_ALIGN - 1);
  uint64_t e = (abs + len + CKPTIO_IO_ALIGN - 1) & ~(uint64_t)(CKPTIO_IO_ALIGN - 1);
  int rc = ckptio_pread_min(r->fd_direct, slot, (size_t)(e - a), a, (size_t)(abs + len - a));
  return rc < 0 ? rc : (int64_t)(abs - a);
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
  if (p->method == CKPTIO_LOAD_MMAP) {
    src = r->map + abs;
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

/* Host to GPU from pinned bytes (the slot or the registered map), waiting
 * on the slot's own event so other pieces' copies are never waited for. */
static int copy_to_gpu(piece *p, const unsigned char *bytes, char *msg, size_t len) {
  ckptio_gpu *g = p->r->ctx->gpu;
  ckptio_gpu_dev *v;
  void *ev = NULL;
  const char *what = "cudaSetDevice";
  int e = ckptio_gpu_use(g, p->gpu, &v);
  if (!e) {
    ev = v->slot_events[ckptio_ring_slot_index(p->r->ctx->ring, p->slot)];
    what = "cudaMemcpyAsync (host to device)";
    e = g->ops->copy_h2d(p->dst + p->off, bytes, (size_t)p->len, v->h2d);
  }
  if (!e) what = "cudaEventRecord", e = g->ops->event_record(ev, v->h2d);
  if (!e) what = "cudaEventSynchronize", e = g->ops->event_sync(ev);
  if (!e) return 0;
  char detail[CKPTIO_ERRLEN];
  int rc = ckptio_gpu_fail(g, e, detail, sizeof(detail), what);
  snprintf(msg, len, "%s: tensor '%s' to GPU %d: %s", p->r->path, p->e->name, p->gpu, detail);
  return rc;
}

static void piece_run(void *arg) {
  piece *p = arg;
  ckptio_reader *r = p->r;
  int rc = 0;
  char msg[CKPTIO_ERRLEN] = "";
  if (!ckptio_batch_failed(p->batch)) {
    uint64_t abs = r->idx.data_start + p->e->begin + p->off;
    const unsigned char *bytes = NULL;
    uint64_t t = ckptio_now_ns();
    rc = read_piece(p, abs, &bytes);
    ckptio_lap(&r->timers.copy_ns, &t);
    if (rc < 0) {
      snprintf(msg, sizeof(msg), "%s: tensor '%s': read of %llu bytes at offset %llu failed: %s",
               r->path, p->e->name, (unsigned long long)p->len, (unsigned long long)abs,
               ckptio_strerror(rc));
    } else {
      if (p->gpu >= 0) {
        rc = copy_to_gpu(p, bytes, msg, sizeof(msg));
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

/* Cuts the requested tensors into pieces, runs them, and checks the CRCs
 * of those that have one when `check` is set. A request with a NULL dst
 * only checks. The requests are already validated. */
static int load_entries(ckptio_reader *r, const ckptio_load_request *reqs, size_t n, int check) {
  ckptio_load_method method = r->opts.load_method == CKPTIO_LOAD_AUTO ? CKPTIO_LOAD_PREAD : r->opts.load_method;
  if (method == CKPTIO_LOAD_DIRECT && r->fd_direct < 0) {
    r->fd_direct = open(r->path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (r->fd_direct < 0) method = CKPTIO_LOAD_PREAD; /* e.g. tmpfs: the page cache is the disk */
  }
  uint64_t step = ckptio_ring_slot_bytes(r->ctx->ring);
  if (method == CKPTIO_LOAD_DIRECT) step -= 2 * CKPTIO_IO_ALIGN; /* room for the page edges */
  size_t total = 0;
  uint64_t bytes = 0;
  int any_gpu = 0, registered = 0;
  for (size_t i = 0; i < n; i++) {
    const ckptio_st_entry *e = &r->idx.entries[reqs[i].index];
    total += (size_t)((e->end - e->begin + step - 1) / step);
    bytes += e->end - e->begin;
    any_gpu |= reqs[i].device != CKPTIO_DEVICE_HOST;
  }
  piece *pieces = calloc(total + 1, sizeof(piece));
  size_t *first = calloc(n + 1, sizeof(size_t));
  int rc = 0;
  if (!pieces || !first) {
    rc = -ENOMEM;
    goto out;
  }
  if (any_gpu && method == CKPTIO_LOAD_MMAP && r->map) {
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
    const ckptio_st_entry *e = &r->idx.entries[reqs[i].index];
    int gpu = reqs[i].device == CKPTIO_DEVICE_HOST ? -1 : reqs[i].device - CKPTIO_DEVICE_CUDA(0);
    first[i] = k;
    for (uint64_t off = 0; off < e->end - e->begin; off += step) {
      uint64_t left = e->end - e->begin - off;
      pieces[k++] = (piece){.r = r, .e = e, .dst = reqs[i].dst, .gpu = gpu, .method = method,
                            .off = off, .len = left < step ? left : step, .check = check && e->has_crc};
    }
  }
  rc = run_pieces(r, pieces, total);
  r->timers.end_ns = ckptio_now_ns();
  if (registered) r->ctx->gpu->ops->host_unregister((void *)r->map);
  if (rc < 0) goto out;
  for (size_t i = 0; i < n; i++) {
    const ckptio_st_entry *e = &r->idx.entries[reqs[i].index];
    if (!check || !e->has_crc) continue;
    uint32_t crc = 0;
    size_t end = i + 1 < n ? first[i + 1] : total;
    for (size_t j = first[i]; j < end; j++) crc = ckptio_crc32_combine(crc, pieces[j].crc, pieces[j].len);
    if (crc != e->crc) {
      rc = rfail(r, CKPTIO_E_CHECKSUM, "%s: tensor '%s': checksum mismatch (recorded %08x, data %08x)",
                 r->path, e->name, e->crc, crc);
      goto out;
    }
  }
out:
  free(pieces);
  free(first);
  return rc;
}

/* A destination must be memory of the device the request names. */
static int check_request(ckptio_reader *r, const ckptio_load_request *q, size_t i) {
  if (q->index >= r->idx.count)
    return rfail(r, CKPTIO_E_INVALID_ARG, "%s: request %zu: no tensor at index %zu", r->path, i, q->index);
  const ckptio_st_entry *e = &r->idx.entries[q->index];
  uint64_t need = e->end - e->begin;
  if (q->dst_bytes < need || (!q->dst && need))
    return rfail(r, CKPTIO_E_BUFFER_TOO_SMALL, "%s: tensor '%s' needs %llu bytes, destination has %llu",
                 r->path, e->name, (unsigned long long)need,
                 (unsigned long long)(q->dst ? q->dst_bytes : 0));
  int ord = -1, where = -1;
  char msg[CKPTIO_ERRLEN];
  if (q->device != CKPTIO_DEVICE_HOST && ckptio_ctx_gpu_ordinal(r->ctx, q->device, &ord, msg, sizeof(msg)) < 0)
    return rfail(r, CKPTIO_E_DEVICE, "%s: tensor '%s': %s", r->path, e->name, msg);
  if (!r->ctx->gpu || !need) return 0;
  int err = r->ctx->gpu->ops->pointer_device(q->dst, &where);
  if (err) return rfail(r, ckptio_gpu_fail(r->ctx->gpu, err, msg, sizeof(msg), "cudaPointerGetAttributes"),
                        "%s: tensor '%s': %s", r->path, e->name, msg);
  if (where != ord)
    return rfail(r, CKPTIO_E_DEVICE, "%s: tensor '%s': destination is %s memory but the request says %s",
                 r->path, e->name, where < 0 ? "host" : "GPU", ord < 0 ? "host" : "GPU");
  return 0;
}

int ckptio_reader_load_many(ckptio_reader *r, const ckptio_load_request *reqs, size_t n) {
  if (!r || (n && !reqs)) return CKPTIO_E_INVALID_ARG;
  for (size_t i = 0; i < n; i++) {
    int rc = check_request(r, &reqs[i], i);
    if (rc < 0) return rc;
  }
  return load_entries(r, reqs, n, r->opts.crc);
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
  int rc = load_entries(r, reqs, n, 1);
  free(reqs);
  if (unchecked) *unchecked = r->idx.count - n;
  return rc;
}
