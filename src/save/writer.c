/* The save pipeline: plan every offset up front, cut the data region of the
 * file into chunks, and for each chunk borrow a staging slot, copy the
 * tensors' bytes into it, CRC each piece and pwrite the slot at its planned
 * offset, all on the worker pool. A coordinator thread queues the chunks
 * (blocking on the bounded ring), then combines the CRCs, writes the header
 * and commits the temp file. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/shuffle.h"
#include "core/align.h"
#include "core/crc32.h"
#include "core/error.h"
#include "core/nameset.h"
#include "core/stats.h"
#include "core/trace.h"
#include "device/transfer.h"
#include "formats/layout.h"
#include "formats/safetensors.h"
#include "formats/torch_write.h"
#include "ctx/ctx.h"
#include "io/file.h"
#include "io/publish.h"
#include "save/save.h"
#include "save/zsave.h"

typedef struct file_writer file_writer;

typedef struct wtensor {
  char *name;
  ckptio_tensor t;
  uint64_t nbytes;
  ckptio_fill fill;       /* fill.fn: the bytes come from it, not t.data */
} wtensor;

typedef struct chunk_job {
  file_writer *w;
  uint64_t index;
  unsigned char *slot;
  uint64_t gpu_mask;      /* GPUs with copies into this slot in flight */
  uint64_t tensor_bytes;  /* of tensors, in the chunk (progress) */
  unsigned char *held;    /* an object's chunk that holds CRCs: its slot,
                             written once they are in (write_held) */
  int crc_later;          /* copied while writes were deferred: the pieces'
                             CRCs are taken from the slot before its write */
  struct chunk_job *next_deferred;
} chunk_job;

#define MAX_GPUS CKPTIO_GPU_MAX /* gpu_mask bits */

struct file_writer {
  ckptio_writer base;     /* first: the public handle is this struct */
  ckptio_ctx *ctx;
  ckptio_options opts;
  char *path;
  wtensor *tensors;
  size_t count, cap;
  ckptio_kv *meta;       /* strings owned by the writer */
  size_t nmeta, meta_cap;
  uint8_t *pickle;        /* the caller's data.pkl (ckptio_writer_set_torch_pickle), or NULL */
  size_t pickle_len;
  ckptio_nameset names;   /* the tensors' names, for O(1) duplicate checks */

  /* GPU tensors: the training loop's streams, and per GPU the event
   * recorded on it at commit, which the copy streams wait for. */
  void *user_stream[MAX_GPUS];
  void *start_event[MAX_GPUS];
  uint64_t gpus_used;

  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int snapshot_done, durable_done, result;
  _Atomic uint64_t done_bytes;
  uint64_t total_bytes;
  _Atomic uint64_t chunks_copied;
  ckptio_timers timers;

  /* Valid while a commit runs. Tensor k means the k-th in file order. */
  ckptio_format format;
  ckptio_layout layout;
  ckptio_tmpfile file;
  int hold;               /* ckptio_file_writer_hold_publish: stop at a synced temp */
  uint64_t chunk_bytes, nchunks;
  /* Copies first (commit_async): a copied chunk's write, and its CRC,
   * wait on `deferred` until the snapshot point, so the copies of a state
   * the ring holds have the CPUs and the memory bus to themselves and the
   * caller resumes sooner. The coordinator ends the wait before it would
   * block on the ring (the writes free the slots), and so does a failure.
   * Under mu. */
  int writes_deferred;
  chunk_job *deferred;    /* newest first */
  uint64_t *first_chunk;  /* [k]: chunk holding tensor k's first byte */
  size_t *piece_base;     /* [k]: index of tensor k's first piece CRC */
  uint32_t *piece_crc;    /* one CRC per (tensor, chunk) overlap */
  chunk_job *jobs;
  ckptio_zsave *zs;       /* compressed saves: chunks are its frames */
  ckptio_batch batch;
  /* An object whose layout's CRCs trail (a .pt): a chunk holding CRCs is
   * sent once every chunk before it is copied (early), not at the end, so
   * the ring does not fill with held chunks. Under flush_mu. */
  int early;
  pthread_mutex_t flush_mu;
  uint8_t *copied;        /* [c]: chunk c's bytes and piece CRCs are in */
  uint64_t prefix;        /* chunks [0, prefix) are all copied */
  uint64_t flushed;       /* held chunks before this were looked at */
  size_t crc_next;        /* tensors (file order) before this have their CRC set */
};

static const ckptio_writer_ops file_ops;

int ckptio_file_writer_open(ckptio_ctx *ctx, const char *path, ckptio_format format, const ckptio_options *opts,
                            char *err, ckptio_writer **out) {
  if (!out) return CKPTIO_E_INVALID_ARG;
  *out = NULL;
  if (!ctx || !path || !*path) return CKPTIO_E_INVALID_ARG;
  if (format != CKPTIO_FORMAT_SAFETENSORS && format != CKPTIO_FORMAT_PYTORCH)
    return ckptio_err_fmt(err, CKPTIO_ERRLEN, CKPTIO_E_FORMAT, "%s: unknown format %d (safetensors or PyTorch)", path,
                          (int)format);
  file_writer *w = calloc(1, sizeof(*w));
  if (!w) return -ENOMEM;
  int rc = ckptio_options_for_call(ctx, opts, &w->opts, w->base.err);
  if (rc == 0 && w->opts.compress_level) rc = ckptio_zsave_check_level(w->opts.compress_level, w->base.err, sizeof(w->base.err));
  if (rc == 0 && w->opts.compress_level && format != CKPTIO_FORMAT_SAFETENSORS)
    rc = ckptio_err_fmt(w->base.err, sizeof(w->base.err), CKPTIO_E_FORMAT,
                        "%s: only safetensors files can be compressed (compress_level %d)", path,
                        w->opts.compress_level);
  if (rc == 0 && w->opts.shuffle && !w->opts.compress_level)
    rc = ckptio_err_fmt(w->base.err, sizeof(w->base.err), CKPTIO_E_INVALID_ARG, "%s: shuffle needs compress_level", path);
  const ckptio_storage *st = NULL;
  int object = rc == 0 ? ckptio_storages_find(ctx->storages, path, &st, w->base.err, sizeof(w->base.err)) : 0;
  if (object < 0) rc = object;
  else if (object && w->opts.compress_level && !ckptio_storage_unsized(st))
    /* A compressed file's size is known only at its end; a storage's
     * create verb takes the size first. The built-in S3 one also takes an
     * object of unknown size (storage.h). */
    rc = ckptio_err_fmt(w->base.err, sizeof(w->base.err), CKPTIO_E_FORMAT,
                        "%s: compressed files are saved to s3:// objects and local files only: this storage's "
                        "create verb needs the size before the first byte, known only after compression",
                        path);
  if (rc < 0 && w->base.err[0]) snprintf(err, CKPTIO_ERRLEN, "%s", w->base.err);
  if (rc < 0 || !(w->path = strdup(path))) {
    free(w);
    return rc < 0 ? rc : -ENOMEM;
  }
  w->base.ops = &file_ops;
  w->base.ctx = ctx;
  w->base.where = w->path;
  w->ctx = ctx;
  w->format = format;
  w->file.fd = w->file.fd_direct = -1;
  pthread_mutex_init(&w->mu, NULL);
  pthread_mutex_init(&w->flush_mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  *out = &w->base;
  return 0;
}

static int add_metadata(file_writer *w, const char *key, const char *value, int reserved_ok) {
  if (!w || !key || !value) return CKPTIO_E_INVALID_ARG;
  if (!reserved_ok && strncmp(key, "ckptio.", 7) == 0)
    return ckptio_fail(w->base.err, CKPTIO_E_INVALID_ARG, "metadata key '%s' is reserved (prefix 'ckptio.')", key);
  for (size_t i = 0; i < w->nmeta; i++)
    if (strcmp(w->meta[i].key, key) == 0)
      return ckptio_fail(w->base.err, CKPTIO_E_DUPLICATE, "metadata key '%s' set twice", key);
  if (ckptio_array_grow((void **)&w->meta, &w->meta_cap, w->nmeta, sizeof(*w->meta)) < 0) return -ENOMEM;
  char *k = strdup(key), *v = strdup(value);
  if (!k || !v) {
    free(k);
    free(v);
    return -ENOMEM;
  }
  w->meta[w->nmeta++] = (ckptio_kv){k, v};
  return 0;
}

static int file_set_metadata(ckptio_writer *base, const char *key, const char *value) {
  file_writer *w = (file_writer *)base;
  return add_metadata(w, key, value, 0);
}

int ckptio_file_writer_set_reserved_metadata(ckptio_writer *base, const char *key, const char *value) {
  file_writer *w = (file_writer *)base;
  return add_metadata(w, key, value, 1);
}

static const ckptio_writer_ops file_ops;

int ckptio_file_writer_set_pickle(ckptio_writer *base, const void *pickle, size_t len) {
  file_writer *w = (file_writer *)base;
  if (base->ops != &file_ops || w->format != CKPTIO_FORMAT_PYTORCH)
    return ckptio_fail(base->err, CKPTIO_E_INVALID_ARG,
                       "a data.pkl is given to a writer of one PyTorch file (ckptio_writer_open, CKPTIO_FORMAT_PYTORCH)");
  if (w->base.state != CKPTIO_WRITER_OPEN) return ckptio_fail(base->err, CKPTIO_E_STATE, "the save has started");
  uint8_t *copy = malloc(len ? len : 1);
  if (!copy) return ckptio_fail(base->err, -ENOMEM, "out of memory");
  memcpy(copy, pickle, len);
  free(w->pickle);
  w->pickle = copy;
  w->pickle_len = len;
  return 0;
}

int ckptio_file_writer_hold_publish(ckptio_writer *base) {
  file_writer *w = (file_writer *)base;
  if (!w || w->base.state != CKPTIO_WRITER_OPEN) return CKPTIO_E_STATE;
  w->hold = 1;
  return 0;
}

int ckptio_file_writer_take_file(ckptio_writer *base, ckptio_tmpfile *out) {
  file_writer *w = (file_writer *)base;
  if (!w || !w->hold || w->base.state != CKPTIO_WRITER_RUNNING || !w->durable_done || w->result < 0 || (!w->file.tmp && !w->file.obj))
    return CKPTIO_E_STATE;
  *out = w->file;
  memset(&w->file, 0, sizeof(w->file));
  w->file.fd = w->file.fd_direct = -1;
  return 0;
}

/* The descriptor's device must be where the pointer really lives: a host
 * pointer named as GPU memory (or the reverse) would make the copy engine
 * read garbage or fault, so it is refused here with both places named. */
static int check_pointer(file_writer *w, const ckptio_tensor *t, int64_t nbytes) {
  int ord = -1;
  char msg[CKPTIO_ERRLEN];
  if (t->device != CKPTIO_DEVICE_HOST) {
    if (ckptio_ctx_gpu_ordinal(w->ctx, t->device, &ord, msg, sizeof(msg)) < 0)
      return ckptio_fail(w->base.err, CKPTIO_E_DEVICE, "tensor '%s': %s", t->name, msg);
    if (ord >= MAX_GPUS)
      return ckptio_fail(w->base.err, CKPTIO_E_DEVICE, "tensor '%s': ckptio handles GPUs 0 to 63", t->name);
  }
  if (!w->ctx->gpu || !nbytes) return 0;
  int where = -1;
  int rc = ckptio_gpu_where(w->ctx->gpu, t->data, &where, msg, sizeof(msg));
  if (rc < 0) return ckptio_fail(w->base.err, rc, "tensor '%s': %s", t->name, msg);
  if (where != ord && where >= 0 && ord >= 0)
    return ckptio_fail(w->base.err, CKPTIO_E_DEVICE, "tensor '%s': data is on GPU %d but the descriptor says GPU %d",
                       t->name, where, ord);
  if (where != ord)
    return ckptio_fail(w->base.err, CKPTIO_E_DEVICE, "tensor '%s': data is %s memory but the descriptor says %s",
                       t->name, where < 0 ? "host" : "GPU", ord < 0 ? "host" : "GPU");
  return 0;
}

static int file_set_stream(ckptio_writer *base, int device, void *stream) {
  file_writer *w = (file_writer *)base;
  int ord;
  char msg[CKPTIO_ERRLEN];
  if (!w) return CKPTIO_E_INVALID_ARG;
  if (ckptio_ctx_gpu_ordinal(w->ctx, device, &ord, msg, sizeof(msg)) < 0)
    return ckptio_fail(w->base.err, CKPTIO_E_DEVICE, "%s: %s", w->path, msg);
  if (ord >= MAX_GPUS) return ckptio_fail(w->base.err, CKPTIO_E_DEVICE, "%s: ckptio handles GPUs 0 to 63", w->path);
  w->user_stream[ord] = stream;
  return 0;
}

static const char *wtensor_name(const void *items, size_t i) { return ((const wtensor *)items)[i].name; }

static int file_add(ckptio_writer *base, const ckptio_tensor *t, ckptio_fill fill) {
  file_writer *w = (file_writer *)base;
  if (!w || !t || !t->name) return CKPTIO_E_INVALID_ARG;
  int64_t nbytes = ckptio_tensor_nbytes(t->dtype, t->ndim, t->shape);
  if (nbytes < 0)
    return ckptio_fail(w->base.err, (int)nbytes, "tensor '%s': %s (dtype, shape or byte count)", t->name,
                       ckptio_strerror((int)nbytes));
  int rc = fill.fn ? 0 : check_pointer(w, t, nbytes);
  if (rc < 0) return rc;
  if (!t->data && !fill.fn && nbytes)
    return ckptio_fail(w->base.err, CKPTIO_E_INVALID_ARG, "tensor '%s': NULL data for a non-empty tensor", t->name);
  if (strcmp(t->name, "__metadata__") == 0)
    return ckptio_fail(w->base.err, CKPTIO_E_INVALID_ARG, "tensor name '%s' is reserved by safetensors", t->name);
  if (ckptio_array_grow((void **)&w->tensors, &w->cap, w->count, sizeof(*w->tensors)) < 0) return -ENOMEM;
  wtensor *wt = &w->tensors[w->count];
  if (!(wt->name = strdup(t->name))) return -ENOMEM;
  rc = ckptio_nameset_insert(&w->names, wt->name, w->count, wtensor_name, w->tensors);
  if (rc <= 0) {
    free(wt->name);
    return rc < 0 ? rc : ckptio_fail(w->base.err, CKPTIO_E_DUPLICATE, "tensor '%s' added twice", t->name);
  }
  wt->t = *t;
  wt->t.name = wt->name;
  wt->nbytes = (uint64_t)nbytes;
  wt->fill = fill;
  if (t->device != CKPTIO_DEVICE_HOST) w->gpus_used |= 1ull << (t->device - CKPTIO_DEVICE_CUDA(0));
  w->count++;
  w->total_bytes += (uint64_t)nbytes;
  return 0;
}

static const wtensor *tensor_at(const file_writer *w, size_t k) { return &w->tensors[w->layout.order[k]]; }
static uint64_t offset_at(const file_writer *w, size_t k) { return w->layout.offset[w->layout.order[k]]; }

static void chunk_write_run(void *arg);

/* A copied chunk's write to the pool (or run here if it cannot be queued). */
static void queue_write(file_writer *w, chunk_job *j) {
  if (ckptio_pool_add(w->ctx->pool, chunk_write_run, j) < 0) chunk_write_run(j);
}

/* Ends the deferral of writes: those deferred so far are queued in file
 * order, later ones at once. */
static void release_writes(file_writer *w) {
  pthread_mutex_lock(&w->mu);
  chunk_job *j = w->deferred, *order = NULL;
  w->deferred = NULL;
  w->writes_deferred = 0;
  pthread_mutex_unlock(&w->mu);
  while (j) {
    chunk_job *next = j->next_deferred;
    j->next_deferred = order;
    order = j;
    j = next;
  }
  while (order) {
    chunk_job *next = order->next_deferred;
    queue_write(w, order);
    order = next;
  }
}

/* A copied chunk's write: deferred while copies come first, else queued. */
static void write_when_due(file_writer *w, chunk_job *j) {
  pthread_mutex_lock(&w->mu);
  int defer = w->writes_deferred;
  if (defer) j->next_deferred = w->deferred, w->deferred = j;
  pthread_mutex_unlock(&w->mu);
  if (!defer) queue_write(w, j);
}

static int writes_deferred(file_writer *w) {
  pthread_mutex_lock(&w->mu);
  int defer = w->writes_deferred;
  pthread_mutex_unlock(&w->mu);
  return defer;
}

static void mark_snapshot(file_writer *w) {
  w->timers.snapshot_ns = ckptio_now_ns();
  pthread_mutex_lock(&w->mu);
  w->snapshot_done = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  release_writes(w);
}

/* The first tensor (file order) whose bytes end after file offset pos. */
static size_t first_tensor_after(const file_writer *w, uint64_t pos) {
  size_t lo = 0, hi = w->count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (offset_at(w, mid) + tensor_at(w, mid)->nbytes <= pos) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* The pieces of one chunk: the overlaps of [start, end) with the tensors,
 * in file order. Empty tensors have none. */
typedef struct piece_iter {
  const file_writer *w;
  uint64_t start, end;
  size_t k;           /* tensor of the current piece */
  uint64_t a, b;      /* its file range */
} piece_iter;

static void pieces_begin(piece_iter *it, const file_writer *w, uint64_t start, uint64_t end) {
  *it = (piece_iter){w, start, end, first_tensor_after(w, start), 0, 0};
  it->k--; /* pieces_next moves to the first */
}

static int pieces_next(piece_iter *it) {
  const file_writer *w = it->w;
  while (++it->k < w->count && offset_at(w, it->k) < it->end) {
    uint64_t off = offset_at(w, it->k), n = tensor_at(w, it->k)->nbytes;
    it->a = off > it->start ? off : it->start;
    it->b = off + n < it->end ? off + n : it->end;
    if (it->b > it->a) return 1;
  }
  return 0;
}

static const unsigned char *piece_src(const piece_iter *it) {
  return (const unsigned char *)tensor_at(it->w, it->k)->t.data + (it->a - offset_at(it->w, it->k));
}

/* Coordinator side: starts the GPU-to-slot copies of one chunk on the copy
 * streams and records the slot's event on each GPU used. On failure, waits
 * for the copies already started so the slot can be reused safely. */
static int start_gpu_copies(file_writer *w, chunk_job *j, uint64_t start, uint64_t end) {
  ckptio_gpu *g = w->ctx->gpu;
  piece_iter it;
  char msg[CKPTIO_ERRLEN];
  int rc = 0;
  pieces_begin(&it, w, start, end);
  while (rc == 0 && pieces_next(&it)) {
    const wtensor *t = tensor_at(w, it.k);
    if (t->t.device == CKPTIO_DEVICE_HOST) continue;
    int ord = t->t.device - CKPTIO_DEVICE_CUDA(0);
    j->gpu_mask |= 1ull << ord; /* drained below even if the copy was refused */
    rc = ckptio_gpu_d2h_start(g, ord, j->slot + (it.a - start), piece_src(&it), it.b - it.a, msg, sizeof(msg));
  }
  if (rc == 0) rc = ckptio_gpu_mark_slot(g, j->gpu_mask, ckptio_ring_slot_index(w->ctx->ring, j->slot), msg, sizeof(msg));
  if (rc == 0) return 0;
  snprintf(w->base.err, sizeof(w->base.err), "%s: tensor '%s': %s", w->path,
           it.k < w->count ? tensor_at(w, it.k)->name : "?", msg);
  ckptio_gpu_drain_d2h(g, j->gpu_mask);
  return rc;
}

/* The first extent ending after start (extents are sorted, apart): a
 * .pt has two per tensor, so chunks look theirs up, not through all. */
static size_t extent_after(const file_writer *w, uint64_t start) {
  const ckptio_extent *x = w->layout.extents;
  size_t lo = 0, hi = w->layout.nextents;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (x[mid].offset + x[mid].len <= start) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* The format's own bytes (headers, zip records) that fall in [start, end). */
static void copy_extents(const file_writer *w, unsigned char *slot, uint64_t start, uint64_t end) {
  /* Early flushes patch the CRC extents into the held chunk (under
   * flush_mu) while set_crc may be writing them: not copied here. */
  const ckptio_extent *x = w->layout.extents;
  for (size_t lo = extent_after(w, start); lo < w->layout.nextents && x[lo].offset < end; lo++) {
    if (w->early && x[lo].holds_crc) continue;
    uint64_t a = x[lo].offset > start ? x[lo].offset : start;
    uint64_t b = x[lo].offset + x[lo].len < end ? x[lo].offset + x[lo].len : end;
    memcpy(slot + (a - start), x[lo].bytes + (a - x[lo].offset), b - a);
  }
}

/* Worker side: waits for the slot's GPU copies, copies the host tensors'
 * bytes and the format's, CRCs every piece and counts the tensor bytes.
 * @return 0 or a GPU error, described in msg. */
/* One more chunk is out of the caller's memory; the last one is the
 * snapshot point. */
static void chunk_copied(file_writer *w) {
  if (atomic_fetch_add(&w->chunks_copied, 1) + 1 == w->nchunks) mark_snapshot(w);
}

static uint32_t *piece_crc(file_writer *w, const chunk_job *j, const piece_iter *it) {
  return w->opts.crc ? &w->piece_crc[w->piece_base[it->k] + (j->index - w->first_chunk[it->k])] : NULL;
}

/* The CRCs of a filled slot's pieces, from the slot: those that came from
 * GPUs (gpu_only), or all. */
static void crc_slot(file_writer *w, chunk_job *j, uint64_t start, uint64_t end, int gpu_only) {
  if (!w->opts.crc) return;
  ckptio_span span = ckptio_trace_begin("save.crc");
  piece_iter it;
  pieces_begin(&it, w, start, end);
  while (pieces_next(&it))
    if (!gpu_only || tensor_at(w, it.k)->t.device != CKPTIO_DEVICE_HOST)
      *piece_crc(w, j, &it) = ckptio_crc32(0, j->slot + (it.a - start), it.b - it.a);
  ckptio_trace_end(&span, end - start, NULL);
}

/* Worker side: waits for the slot's GPU copies, copies the host tensors'
 * bytes (with their CRC, unless crc_later) and the format's, counts the
 * chunk copied — the caller's memory is no longer read — then CRCs the
 * pieces that came from GPUs, off the snapshot's path. @return 0 or a GPU
 * error, described in msg. */
static int fill_chunk(file_writer *w, chunk_job *j, uint64_t start, uint64_t end, uint64_t *tensor_bytes,
                      char *msg, size_t len) {
  uint64_t t = ckptio_now_ns();
  if (j->gpu_mask) {
    char detail[CKPTIO_ERRLEN];
    int rc = ckptio_gpu_wait_slot(w->ctx->gpu, j->gpu_mask, ckptio_ring_slot_index(w->ctx->ring, j->slot), detail,
                                  sizeof(detail));
    if (rc < 0) return ckptio_err_fmt(msg, len, rc, "%s: %s", w->path, detail);
    ckptio_lap(&w->timers.device_ns, &t);
  }
  piece_iter it;
  pieces_begin(&it, w, start, end);
  while (pieces_next(&it)) {
    const wtensor *wt = tensor_at(w, it.k);
    unsigned char *dst = j->slot + (it.a - start);
    *tensor_bytes += it.b - it.a;
    uint32_t *crc = piece_crc(w, j, &it);
    if (crc) *crc = 0;
    if (wt->fill.fn) {
      char why[CKPTIO_ERRLEN] = "";
      int rc = wt->fill.fn(wt->fill.arg, it.a - offset_at(w, it.k), dst, it.b - it.a, why, sizeof(why));
      if (rc < 0)
        return ckptio_err_fmt(msg, len, rc, "%s: tensor '%s': %s", w->path, wt->name, *why ? why : ckptio_strerror(rc));
      if (crc && !j->crc_later) *crc = ckptio_crc32(0, dst, it.b - it.a);
    } else if (wt->t.device == CKPTIO_DEVICE_HOST) {
      ckptio_copy_crc(dst, piece_src(&it), it.b - it.a, j->crc_later ? NULL : crc);
    }
  }
  copy_extents(w, j->slot, start, end);
  chunk_copied(w);
  if (j->gpu_mask && !j->crc_later) crc_slot(w, j, start, end, 1);
  ckptio_lap(&w->timers.copy_ns, &t);
  return 0;
}

/* fill_chunk as the stage "save.snapshot" of a trace (trace.h). */
static int snapshot_chunk(file_writer *w, chunk_job *j, uint64_t start, uint64_t end, char *msg, size_t len) {
  ckptio_span span = ckptio_trace_begin("save.snapshot");
  int rc = fill_chunk(w, j, start, end, &j->tensor_bytes, msg, len);
  ckptio_trace_end(&span, j->tensor_bytes, NULL);
  return rc;
}

/* Chunks are fixed slices of the file, or a compressed save's frames. */
static uint64_t chunk_start(const file_writer *w, uint64_t index) {
  if (w->zs) return ckptio_zsave_start(w->zs, index);
  return index * w->chunk_bytes < w->layout.file_size ? index * w->chunk_bytes : w->layout.file_size;
}

static uint64_t chunk_of(const file_writer *w, uint64_t pos) {
  return w->zs ? ckptio_zsave_frame_of(w->zs, pos) : pos / w->chunk_bytes;
}

static void chunk_range(const file_writer *w, uint64_t index, uint64_t *start, uint64_t *end) {
  *start = chunk_start(w, index);
  *end = chunk_start(w, index + 1);
}

/* A chunk's last step: its slot (if it had one) back to the ring, its
 * result to the batch. */
static void chunk_end(chunk_job *j, int rc, const char *msg) {
  file_writer *w = j->w;
  if (w->zs && (rc < 0 || ckptio_batch_failed(&w->batch))) ckptio_zsave_abort(w->zs, rc); /* wake the coordinator */
  if (j->slot) ckptio_ring_release(w->ctx->ring, j->slot);
  /* A failed save never reaches its snapshot point: its deferred writes
   * go now, to end (unwritten) as every job of a failed batch does. */
  if (rc < 0 || ckptio_batch_failed(&w->batch)) release_writes(w);
  ckptio_batch_done(&w->batch, rc, msg);
}

/* The bytes of a chunk, at `from`, to the file at its offset. */
static int write_chunk(file_writer *w, const unsigned char *from, size_t len, uint64_t start, char *msg, size_t mlen) {
  uint64_t t = ckptio_now_ns();
  msg[0] = '\0';
  ckptio_span span = ckptio_trace_begin("save.write");
  int rc = ckptio_tmpfile_write(&w->file, from, len, start, msg, mlen);
  ckptio_trace_end(&span, len, NULL);
  ckptio_lap(&w->timers.write_ns, &t);
  if (rc < 0 && !msg[0])
    snprintf(msg, mlen, "%s: write of %zu bytes at offset %llu failed: %s", w->path, len, (unsigned long long)start,
             ckptio_strerror(rc));
  return rc;
}

/* Whether [start, end) holds bytes that change once the CRCs are known
 * (the header): an object cannot be written twice, so such a chunk waits. */
static int holds_crcs(const file_writer *w, uint64_t start, uint64_t end) {
  for (size_t x = extent_after(w, start); x < w->layout.nextents && w->layout.extents[x].offset < end; x++)
    if (w->layout.extents[x].holds_crc) return 1;
  return 0;
}

/* Whether O_DIRECT can write a chunk from the caller's memory itself: host
 * tensors' pieces that fill it, each on a page there and whole pages long
 * (tensors of whole pages, which the layout puts on pages of the file).
 * Only chunks beyond what the ring holds: a state the ring holds is still
 * copied, so its snapshot point comes before any write (a training loop
 * resumes sooner); past that the snapshot waits for the last writes anyway,
 * and a chunk written in place costs no copy and holds no slot.
 * Except, for a caller of ckptio_writer_commit (who waits for the writes
 * whatever the snapshot), the chunks whose slots were never touched
 * (`touched`: ckptio_ring_touched at the start): copying into them is the
 * first touch of that memory, the worst of a process's first save here
 * (two ranks saving 1 GiB from page-aligned memory: 0.61-3.26 s through a
 * fresh ring, 0.55-0.63 s in place). The save then has those slots
 * prepared behind it (queue_chunks), since later saves write faster from
 * the ring's huge pages than from the caller's small ones. */
static int in_place(const file_writer *w, uint64_t c, uint64_t touched, uint64_t start, uint64_t end) {
  if (w->zs || w->file.fd_direct < 0) return 0;
  if (c < ckptio_ring_slots(w->ctx->ring) && !(w->base.sync && c >= touched)) return 0;
  piece_iter it;
  uint64_t at = start;
  pieces_begin(&it, w, start, end);
  while (pieces_next(&it)) {
    if (it.a != at || tensor_at(w, it.k)->t.device != CKPTIO_DEVICE_HOST || tensor_at(w, it.k)->fill.fn ||
        ((uintptr_t)piece_src(&it) | (it.b - it.a)) % CKPTIO_IO_ALIGN)
      return 0;
    at = it.b;
  }
  return at == end;
}

/* Worker side, a chunk written in place: each piece's CRC from the caller's
 * memory, then its write from there; only then is the chunk out of the
 * caller's memory. */
static void chunk_in_place_run(void *arg) {
  chunk_job *j = arg;
  file_writer *w = j->w;
  uint64_t start, end;
  chunk_range(w, j->index, &start, &end);
  int rc = 0;
  char msg[CKPTIO_ERRLEN] = "";
  piece_iter it;
  pieces_begin(&it, w, start, end);
  while (rc == 0 && !ckptio_batch_failed(&w->batch) && pieces_next(&it)) {
    uint32_t *crc = piece_crc(w, j, &it);
    uint64_t t = ckptio_now_ns();
    ckptio_span span = ckptio_trace_begin("save.crc");
    if (crc) *crc = ckptio_crc32(0, piece_src(&it), (size_t)(it.b - it.a));
    ckptio_trace_end(&span, it.b - it.a, NULL);
    ckptio_lap(&w->timers.copy_ns, &t);
    if ((rc = write_chunk(w, piece_src(&it), (size_t)(it.b - it.a), it.a, msg, sizeof(msg))) == 0)
      atomic_fetch_add(&w->timers.direct_bytes, it.b - it.a);
  }
  if (rc == 0 && !ckptio_batch_failed(&w->batch)) {
    atomic_fetch_add(&w->done_bytes, end - start);
    chunk_copied(w);
  }
  chunk_end(j, rc, msg);
}

static int flush_early(file_writer *w, char *msg, size_t mlen);

/* Worker side, second half: the filled slot to the file at its offset. */
static void chunk_write_run(void *arg) {
  chunk_job *j = arg;
  file_writer *w = j->w;
  uint64_t start, end;
  chunk_range(w, j->index, &start, &end);
  int rc = 0;
  char msg[CKPTIO_ERRLEN] = "";
  if (j->crc_later && !ckptio_batch_failed(&w->batch)) {
    uint64_t t = ckptio_now_ns();
    crc_slot(w, j, start, end, 0);
    ckptio_lap(&w->timers.copy_ns, &t);
  }
  if (!ckptio_batch_failed(&w->batch) && w->file.store && holds_crcs(w, start, end)) {
    if (w->early) pthread_mutex_lock(&w->flush_mu);
    j->held = j->slot; /* kept from the ring until an early flush or write_held */
    j->slot = NULL;
    if (w->early) w->copied[j->index] = 1, pthread_mutex_unlock(&w->flush_mu);
    atomic_fetch_add(&w->done_bytes, j->tensor_bytes);
  } else if (!ckptio_batch_failed(&w->batch)) {
    if (w->early) {
      pthread_mutex_lock(&w->flush_mu);
      w->copied[j->index] = 1;
      pthread_mutex_unlock(&w->flush_mu);
    }
    size_t len = (size_t)(end - start);
    if (w->file.fd_direct >= 0) {
      /* O_DIRECT wants whole pages: the tail is padded with zeros and the
       * file truncated to its real size at commit. */
      size_t padded = (len + CKPTIO_IO_ALIGN - 1) & ~(size_t)(CKPTIO_IO_ALIGN - 1);
      memset(j->slot + len, 0, padded - len);
      len = padded;
    }
    if ((rc = write_chunk(w, j->slot, len, start, msg, sizeof(msg))) == 0)
      atomic_fetch_add(&w->done_bytes, j->tensor_bytes);
  }
  if (rc == 0 && w->early) rc = flush_early(w, msg, sizeof(msg));
  chunk_end(j, rc, msg);
}

/* Worker side, first half: the chunk's bytes into its slot. The write is
 * queued behind, at the back, while the coordinator queues copies at the
 * front: every slot the save holds is filled before any write waits for the
 * disk, so the snapshot point comes after the copies of the whole state when
 * the ring holds it (snapshot memory), and never waits for writes it need
 * not wait for. A compressed chunk is compressed and written here. */
static void chunk_copy_run(void *arg) {
  chunk_job *j = arg;
  file_writer *w = j->w;
  uint64_t start, end;
  chunk_range(w, j->index, &start, &end);
  int rc = 0;
  char msg[CKPTIO_ERRLEN] = "";
  j->tensor_bytes = 0;
  j->crc_later = w->opts.crc && writes_deferred(w);
  if (ckptio_batch_failed(&w->batch) || (rc = snapshot_chunk(w, j, start, end, msg, sizeof(msg))) < 0) {
    chunk_end(j, rc, msg);
    return;
  }
  if (w->zs) {
    uint64_t t = ckptio_now_ns();
    ckptio_span span = ckptio_trace_begin("save.compress");
    rc = ckptio_zsave_frame(w->zs, j->index, j->slot, (size_t)(end - start), msg, sizeof(msg));
    ckptio_trace_end(&span, end - start, NULL);
    ckptio_lap(&w->timers.write_ns, &t);
    if (rc < 0) { /* the codec's message does not know the file: name it, as plain writes do */
      char inner[sizeof(msg)];
      snprintf(inner, sizeof(inner), "%s", msg);
      snprintf(msg, sizeof(msg), "%s: %s", w->path, inner);
    }
    if (rc == 0) atomic_fetch_add(&w->done_bytes, j->tensor_bytes);
    chunk_end(j, rc, msg);
  } else {
    write_when_due(w, j);
  }
}

/* Chunk bookkeeping for the planned file: which chunks each tensor spans
 * and where its piece CRCs go. */
static int plan_chunks(file_writer *w) {
  uint64_t data_bytes = w->layout.file_size;
  w->chunk_bytes = ckptio_ring_slot_bytes(w->ctx->ring);
  w->nchunks = w->zs ? ckptio_zsave_frames(w->zs) : (data_bytes + w->chunk_bytes - 1) / w->chunk_bytes;
  w->first_chunk = calloc(w->count + 1, sizeof(uint64_t));
  w->piece_base = calloc(w->count + 1, sizeof(size_t));
  w->jobs = calloc(w->nchunks + 1, sizeof(chunk_job));
  if (!w->first_chunk || !w->piece_base || !w->jobs) return -ENOMEM;
  size_t pieces = 0;
  for (size_t k = 0; k < w->count; k++) {
    uint64_t rel = offset_at(w, k), n = tensor_at(w, k)->nbytes;
    w->first_chunk[k] = chunk_of(w, rel);
    w->piece_base[k] = pieces;
    if (n) pieces += chunk_of(w, rel + n - 1) - w->first_chunk[k] + 1;
  }
  /* Tensors and extents must cover the file exactly: a hole would be
   * written with whatever a reused slot held before. */
  uint64_t covered = 0;
  for (size_t k = 0; k < w->count; k++) covered += tensor_at(w, k)->nbytes;
  for (size_t x = 0; x < w->layout.nextents; x++) covered += w->layout.extents[x].len;
  if (covered != w->layout.file_size) {
    snprintf(w->base.err, sizeof(w->base.err), "%s: internal error: layout covers %llu of %llu bytes", w->path,
             (unsigned long long)covered, (unsigned long long)w->layout.file_size);
    return CKPTIO_E_FORMAT;
  }
  w->piece_crc = calloc(pieces + 1, sizeof(uint32_t));
  w->early = w->file.store && w->layout.crcs_trail && !w->zs;
  if (w->early && !(w->copied = calloc(w->nchunks + 1, 1))) return -ENOMEM;
  return w->piece_crc ? 0 : -ENOMEM;
}

/* Joins the piece CRCs of tensor k (file order) into the layout. */
static void combine_crc(file_writer *w, size_t k) {
  uint64_t off = offset_at(w, k), n = tensor_at(w, k)->nbytes, pos = off;
  uint32_t crc = 0;
  for (size_t p = w->piece_base[k]; pos < off + n; p++) {
    uint64_t chunk_end = chunk_start(w, w->first_chunk[k] + (p - w->piece_base[k]) + 1);
    uint64_t b = chunk_end < off + n ? chunk_end : off + n;
    crc = ckptio_crc32_combine(crc, w->piece_crc[p], b - pos);
    pos = b;
  }
  w->layout.set_crc(&w->layout, w->layout.order[k], crc);
}

/* Every tensor's, in order, into the header. */
/* The tensors' CRCs from their pieces' (the bytes' CRCs were taken with
 * the snapshot): the save's stage "save.crc" after its chunks. */
static void combine_crcs(file_writer *w) {
  ckptio_span span = ckptio_trace_begin("save.crc");
  for (size_t k = 0; k < w->count; k++) combine_crc(w, k);
  ckptio_trace_end(&span, 0, NULL);
}

/* After the data: the extents that changed when the CRCs were patched in
 * (a safetensors header, zip data descriptors and directory). Whole pages go
 * through O_DIRECT; the rest through the page cache, which reads back the
 * pages the chunks wrote directly (they are complete by now). */
static int rewrite_crc_extents(file_writer *w) {
  for (size_t x = 0; x < w->layout.nextents; x++) {
    const ckptio_extent *e = &w->layout.extents[x];
    if (!e->holds_crc) continue;
    int aligned = w->file.fd_direct >= 0 && e->offset % CKPTIO_IO_ALIGN == 0 && e->len % CKPTIO_IO_ALIGN == 0;
    void *buf = e->bytes;
    if (aligned) {
      if (posix_memalign(&buf, CKPTIO_IO_ALIGN, (size_t)e->len)) return -ENOMEM;
      memcpy(buf, e->bytes, (size_t)e->len);
    }
    int rc = ckptio_pwrite_full(aligned ? w->file.fd_direct : w->file.fd, buf, (size_t)e->len, e->offset);
    if (aligned) free(buf);
    if (rc < 0) {
      snprintf(w->base.err, sizeof(w->base.err), "%s: write of the %llu-byte header at offset %llu failed: %s", w->path,
               (unsigned long long)e->len, (unsigned long long)e->offset, ckptio_strerror(rc));
      return rc;
    }
  }
  return 0;
}

/* The CRC extents of chunk c patched into its held slot. */
static void patch_held(file_writer *w, uint64_t c, unsigned char *slot) {
  uint64_t start, end;
  chunk_range(w, c, &start, &end);
  for (size_t x = extent_after(w, start); x < w->layout.nextents && w->layout.extents[x].offset < end; x++) {
    const ckptio_extent *e = &w->layout.extents[x];
    uint64_t a = e->offset > start ? e->offset : start, b = e->offset + e->len < end ? e->offset + e->len : end;
    if (e->holds_crc && a < b) memcpy(slot + (a - start), e->bytes + (a - e->offset), (size_t)(b - a));
  }
}

/* An object's chunks that waited for the CRCs (all of them, or what early
 * flushes left): the extents patched in their slots, then each written once. */
static int write_held(file_writer *w) {
  int rc = 0;
  for (uint64_t c = 0; c < w->nchunks && rc == 0; c++) {
    unsigned char *slot = w->jobs[c].held;
    if (!slot) continue;
    uint64_t start, end;
    chunk_range(w, c, &start, &end);
    patch_held(w, c, slot);
    rc = write_chunk(w, slot, (size_t)(end - start), start, w->base.err, sizeof(w->base.err));
  }
  return rc;
}

/* The last chunk holding a byte of tensor k (file order). */
static uint64_t last_chunk(const file_writer *w, size_t k) {
  uint64_t off = offset_at(w, k), n = tensor_at(w, k)->nbytes;
  return chunk_of(w, n ? off + n - 1 : off);
}

/* Early flushes (w->early), on the worker that ended a chunk, before it
 * counts the chunk done (so none runs once the batch is over): the copied
 * prefix grows, the tensors inside it get their CRCs, and each held chunk
 * inside it is patched and sent, its slot back to the ring. A held chunk
 * is inside the prefix once every chunk up to it is copied, which always
 * comes: those chunks took their slots before it. */
static int flush_early(file_writer *w, char *msg, size_t mlen) {
  int rc = 0;
  while (rc == 0) {
    unsigned char *slot = NULL;
    uint64_t c = 0;
    pthread_mutex_lock(&w->flush_mu);
    while (w->prefix < w->nchunks && w->copied[w->prefix]) w->prefix++;
    for (; w->layout.set_crc && w->crc_next < w->count && last_chunk(w, w->crc_next) < w->prefix; w->crc_next++)
      combine_crc(w, w->crc_next);
    for (; !slot && w->flushed < w->prefix; w->flushed++)
      if ((slot = w->jobs[w->flushed].held)) {
        c = w->flushed;
        w->jobs[c].held = NULL;
        patch_held(w, c, slot);
      }
    pthread_mutex_unlock(&w->flush_mu);
    if (!slot) return 0;
    uint64_t start, end;
    chunk_range(w, c, &start, &end);
    if (!ckptio_batch_failed(&w->batch)) rc = write_chunk(w, slot, (size_t)(end - start), start, msg, mlen);
    ckptio_ring_release(w->ctx->ring, slot);
  }
  return rc;
}

/* The held slots back to the ring, whatever became of the save. */
static void release_held(file_writer *w) {
  for (uint64_t c = 0; w->jobs && c < w->nchunks; c++)
    if (w->jobs[c].held) {
      ckptio_ring_release(w->ctx->ring, w->jobs[c].held);
      w->jobs[c].held = NULL;
    }
}

/* On the caller's thread, at the commit call: an event on each GPU's
 * producing stream marks the work the snapshot must include (the caller's
 * current GPU is restored: a library must not move it). The coordinator's
 * copy streams wait for these marks (queue_chunks). */
static int mark_callers(file_writer *w) {
  char msg[CKPTIO_ERRLEN];
  int rc = ckptio_gpu_mark_callers(w->ctx->gpu, w->gpus_used, w->user_stream, w->start_event, msg, sizeof(msg));
  return rc < 0 ? ckptio_fail(w->base.err, rc, "%s: recording the snapshot event: %s", w->path, msg) : 0;
}

/* A slot a load released while its copies to a GPU still read it: those
 * copies end before this save writes into it. */
static int slot_copied(file_writer *w, void *slot) {
  uint64_t gpus = ckptio_ring_take_copying(w->ctx->ring, slot);
  char msg[CKPTIO_ERRLEN];
  size_t i = ckptio_ring_slot_index(w->ctx->ring, slot);
  int rc = gpus ? ckptio_gpu_wait_slot(w->ctx->gpu, gpus, i, msg, sizeof(msg)) : 0;
  return rc < 0 ? ckptio_fail(w->base.err, rc, "%s: waiting for an earlier load's copy from staging: %s", w->path, msg)
                : 0;
}

static void prepare_run(void *ring) { (void)ckptio_ring_prepare(ring); }

/* The next chunk's slot. Before waiting for one, this save's deferred
 * writes go out: they are what frees slots (this save's, or another's that
 * waits on them). */
static void *acquire_slot(file_writer *w) {
  void *slot = ckptio_ring_try_acquire(w->ctx->ring);
  if (slot) return slot;
  release_writes(w);
  return ckptio_ring_acquire(w->ctx->ring);
}

/* Queues every chunk, blocking on the ring when all slots are in flight. */
static int queue_chunks(file_writer *w) {
  if (w->gpus_used) {
    char msg[CKPTIO_ERRLEN];
    int rc = ckptio_gpu_wait_marks(w->ctx->gpu, w->gpus_used, CKPTIO_GPU_D2H, w->start_event, msg, sizeof(msg));
    if (rc < 0) return ckptio_fail(w->base.err, rc, "%s: %s", w->path, msg);
  }
  /* A compressed save's frame 0, the header, is written at the end. */
  uint64_t first = w->zs ? 1 : 0;
  atomic_store(&w->chunks_copied, first);
  /* A compressed chunk is written by its copy's job; a caller of
   * ckptio_writer_commit waits for the writes whatever the snapshot. */
  w->writes_deferred = !w->zs && !w->base.sync;
  if (w->nchunks == first) mark_snapshot(w);
  uint64_t touched = ckptio_ring_touched(w->ctx->ring), skipped = 0;
  for (uint64_t c = first; c < w->nchunks && !ckptio_batch_failed(&w->batch); c++) {
    if (w->zs && ckptio_zsave_reserve(w->zs, c) < 0) break; /* a frame failed: the batch has its error */
    chunk_job *j = &w->jobs[c];
    uint64_t start, end;
    chunk_range(w, c, &start, &end);
    if (in_place(w, c, touched, start, end)) { /* no slot: at the back, behind the copies */
      skipped += c < ckptio_ring_slots(w->ctx->ring);
      *j = (chunk_job){.w = w, .index = c};
      ckptio_batch_add(&w->batch, 1);
      if (ckptio_pool_add(w->ctx->pool, chunk_in_place_run, j) < 0) chunk_in_place_run(j);
      continue;
    }
    *j = (chunk_job){.w = w, .index = c, .slot = acquire_slot(w)};
    int rc = slot_copied(w, j->slot);
    if (rc == 0 && w->gpus_used) rc = start_gpu_copies(w, j, start, end);
    if (rc < 0) {
      ckptio_ring_release(w->ctx->ring, j->slot);
      ckptio_batch_fail(&w->batch, rc, w->base.err);
      break;
    }
    ckptio_batch_add(&w->batch, 1);
    rc = ckptio_pool_add_first(w->ctx->pool, chunk_copy_run, j);
    if (rc < 0) {
      ckptio_ring_release(w->ctx->ring, j->slot);
      ckptio_batch_done(&w->batch, rc, "cannot queue a chunk: out of memory");
    }
  }
  if (ckptio_batch_failed(&w->batch)) release_writes(w); /* copies done before it failed may be waiting */
  int rc = ckptio_batch_wait(&w->batch);
  if (rc < 0) snprintf(w->base.err, sizeof(w->base.err), "%s", w->batch.err);
  if (skipped) { /* on a worker, while this save commits */
    ckptio_ring_prepare_more(w->ctx->ring, (size_t)(touched + skipped));
    (void)ckptio_pool_add(w->ctx->pool, prepare_run, w->ctx->ring);
  }
  return rc;
}

static int make_layout(file_writer *w) {
  ckptio_layout_input *in = calloc(w->count + 1, sizeof(*in));
  if (!in) return -ENOMEM;
  for (size_t i = 0; i < w->count; i++)
    in[i] = (ckptio_layout_input){w->tensors[i].name, w->tensors[i].t.dtype, w->tensors[i].t.ndim,
                                  w->tensors[i].t.shape, w->tensors[i].nbytes};
  int rc;
  if (w->format == CKPTIO_FORMAT_PYTORCH) {
    /* torch.save names the archive folder after the file: basename without
     * its last extension (readers take it from the file, so this is cosmetic). */
    const char *base = strrchr(w->path, '/') ? strrchr(w->path, '/') + 1 : w->path;
    char *archive = strdup(base);
    if (!archive) {
      free(in);
      return -ENOMEM;
    }
    char *dot = strrchr(archive, '.');
    if (dot && dot != archive) *dot = '\0';
    rc = ckptio_torch_layout_pickle(in, w->count, w->pickle, w->pickle_len, w->meta, w->nmeta, w->opts.crc,
                                    archive, &w->layout, w->base.err, sizeof(w->base.err));
    free(archive);
  } else {
    /* The filter is recorded so that loads undo it. */
    ckptio_kv *meta = calloc(w->nmeta + 1, sizeof(*meta));
    if (!meta) {
      free(in);
      return -ENOMEM;
    }
    if (w->nmeta) memcpy(meta, w->meta, w->nmeta * sizeof(*meta));
    size_t nmeta = w->nmeta;
    if (w->opts.compress_level && w->opts.shuffle) meta[nmeta++] = (ckptio_kv){CKPTIO_FILTER_KEY, CKPTIO_FILTER_SHUFFLE};
    rc = ckptio_st_layout(in, w->count, meta, nmeta, w->opts.crc, CKPTIO_IO_ALIGN, &w->layout, w->base.err,
                          sizeof(w->base.err));
    free(meta);
  }
  free(in);
  return rc;
}

/* Compressed saves cut the planned file into frames (save/zsave.c);
 * frames land at offsets known only after compression, so through the
 * page cache, or into an object of a size known only at its end. */
static int zsave_open(file_writer *w) {
  ckptio_zsave_tensor *t = calloc(w->count + 1, sizeof(*t));
  if (!t) return -ENOMEM;
  for (size_t k = 0; k < w->count; k++) {
    t[k] = (ckptio_zsave_tensor){offset_at(w, k), tensor_at(w, k)->nbytes,
                                 ckptio_shuffle_elem(ckptio_dtype_bits(tensor_at(w, k)->t.dtype))};
  }
  int jobs = ckptio_codec_jobs(w->ctx);
  size_t slots = ckptio_ring_slots(w->ctx->ring), frames = (size_t)jobs + 2;
  ckptio_zsave_params p = {w->opts.compress_level, w->opts.shuffle, jobs, &w->file,
                           w->layout.extents[0].len, w->layout.file_size, ckptio_ring_slot_bytes(w->ctx->ring),
                           slots < frames ? slots : frames, t, w->count};
  int rc = ckptio_zsave_open(&p, &w->zs, w->base.err, sizeof(w->base.err));
  free(t);
  return rc;
}

/* The file (or an object of a storage: the same chunks, written through
 * its verbs, never in place, the header's chunk last) planned, its chunks
 * queued, the CRCs put in, then synced and held for the set's owner, or
 * committed. */
static int save_run(file_writer *w) {
  int rc = make_layout(w);
  if (rc < 0) return rc;
  int compress = w->opts.compress_level != 0;
  uint64_t final_size = w->layout.file_size;
  int direct = compress ? 0 : w->opts.direct_io;
  uint64_t size = compress ? 0 : w->layout.file_size;
  const ckptio_storage *st = NULL;
  int object = ckptio_storages_find(w->ctx->storages, w->path, &st, w->base.err, sizeof(w->base.err));
  if (object < 0) return object;
  if (object)
    rc = ckptio_tmpfile_open_object(&w->file, w->path, compress ? CKPTIO_STORAGE_UNSIZED : size,
                                    ckptio_ring_slot_bytes(w->ctx->ring), &st->ops, st->self, w->base.err,
                                    sizeof(w->base.err));
  else
    rc = ckptio_tmpfile_open(&w->file, w->path, direct, size, w->base.err, sizeof(w->base.err));
  /* No space yet: the blocks of files that earlier saves replaced may still
   * be on their way back (the context's closer, core/hold.h). */
  if (rc == -ENOSPC && !object && ckptio_closer_wait(&w->ctx->closer))
    rc = ckptio_tmpfile_open(&w->file, w->path, direct, size, w->base.err, sizeof(w->base.err));
  if (rc < 0) return rc;
  if (compress && (rc = zsave_open(w)) < 0) goto fail;
  if ((rc = plan_chunks(w)) < 0) goto fail;
  if ((rc = queue_chunks(w)) < 0) goto fail;
  uint64_t t = ckptio_now_ns();
  if (w->layout.set_crc) combine_crcs(w);
  ckptio_span span = ckptio_trace_begin("save.header");
  if (compress) rc = ckptio_zsave_finish(w->zs, w->layout.extents[0].bytes, &final_size, w->base.err, sizeof(w->base.err));
  else if (object) rc = write_held(w);
  else if (w->layout.set_crc) rc = rewrite_crc_extents(w);
  release_held(w);
  ckptio_trace_end(&span, 0, NULL);
  if (rc < 0) goto fail;
  ckptio_lap(&w->timers.write_ns, &t);
  span = ckptio_trace_begin("save.commit");
  if (w->hold) {
    /* Synced, not renamed (an object: written, not published): the set's
     * owner publishes all files together. */
    rc = ckptio_tmpfile_sync(&w->file, final_size, w->opts.fsync, w->base.err, sizeof(w->base.err));
  } else {
    ckptio_held held = {0};
    rc = ckptio_tmpfile_commit(&w->file, final_size, w->opts.fsync, &held, w->base.err, sizeof(w->base.err));
    if (rc == 0 && !object) ckptio_remove_stray_temps_of(w->path); /* what a killed save of this file left */
    ckptio_closer_add(&w->ctx->closer, &held);
  }
  ckptio_trace_end(&span, final_size, w->path);
  if (rc < 0 && w->hold) goto fail;
  ckptio_lap(&w->timers.commit_ns, &t);
  return rc;
fail:
  release_held(w);
  ckptio_tmpfile_abort(&w->file);
  return rc;
}

static void *save_main(void *arg) {
  file_writer *w = arg;
  ckptio_trace_thread_name("ckptio save");
  ckptio_span span = ckptio_trace_begin("save");
  int rc = save_run(w);
  ckptio_trace_end(&span, w->total_bytes, w->path);
  if (rc < 0 && !w->base.err[0])
    snprintf(w->base.err, sizeof(w->base.err), "%s: save failed: %s", w->path, ckptio_strerror(rc));
  w->timers.end_ns = ckptio_now_ns();
  pthread_mutex_lock(&w->mu);
  w->result = rc;
  w->snapshot_done = w->durable_done = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

static int file_commit_async(ckptio_writer *base) {
  file_writer *w = (file_writer *)base;
  if (!w) return CKPTIO_E_INVALID_ARG;
  int rc = w->gpus_used ? mark_callers(w) : 0;
  if (rc < 0) return rc;
  ckptio_batch_init(&w->batch);
  w->base.state = CKPTIO_WRITER_RUNNING;
  w->timers.start_ns = ckptio_now_ns();
  rc = pthread_create(&w->thread, NULL, save_main, w);
  if (rc) {
    w->base.state = CKPTIO_WRITER_OPEN;
    ckptio_batch_destroy(&w->batch);
    return ckptio_fail(w->base.err, -rc, "%s: cannot start the save thread: %s", w->path, ckptio_errno_text(rc));
  }
  return 0;
}

/* Nothing was started, so nothing is written; the state keeps every later
 * verb but close from starting a save (the open created no file). */
static int file_abort(ckptio_writer *base, int code, const char *why) {
  file_writer *w = (file_writer *)base;
  w->base.state = CKPTIO_WRITER_ABORTED;
  return ckptio_fail(w->base.err, code, "save abandoned by its caller: %s", why && *why ? why : ckptio_strerror(code));
}

/* The snapshot flag, or with `durable` the durable one. */
static int wait_flag(file_writer *w, int durable) {
  if (w->base.state != CKPTIO_WRITER_RUNNING) return CKPTIO_E_STATE;
  const int *flag = durable ? &w->durable_done : &w->snapshot_done;
  pthread_mutex_lock(&w->mu);
  while (!*flag) pthread_cond_wait(&w->cv, &w->mu);
  int rc = w->durable_done ? w->result : 0;
  pthread_mutex_unlock(&w->mu);
  return rc;
}

static int poll_flag(file_writer *w, int durable) {
  if (w->base.state != CKPTIO_WRITER_RUNNING) return CKPTIO_E_STATE;
  pthread_mutex_lock(&w->mu);
  int rc = w->durable_done && w->result < 0 ? w->result : durable ? w->durable_done : w->snapshot_done;
  pthread_mutex_unlock(&w->mu);
  return rc;
}

static int file_wait_snapshot(ckptio_writer *base) { return wait_flag((file_writer *)base, 0); }
static int file_wait_durable(ckptio_writer *base) { return wait_flag((file_writer *)base, 1); }
static int file_poll_snapshot(ckptio_writer *base) { return poll_flag((file_writer *)base, 0); }
static int file_poll_durable(ckptio_writer *base) { return poll_flag((file_writer *)base, 1); }

static void file_progress(ckptio_writer *base, uint64_t *done, uint64_t *total) {
  file_writer *w = (file_writer *)base;
  if (done) *done = atomic_load(&w->done_bytes);
  if (total) *total = w->total_bytes;
}

static int file_stats(const ckptio_writer *base, ckptio_stats *out) {
  const file_writer *w = (const file_writer *)base;
  return ckptio_timers_report(&w->timers, atomic_load(&w->done_bytes), w->ctx->opts.threads,
                              ckptio_ring_slots(w->ctx->ring) * w->ctx->opts.chunk_bytes, out);
}

static size_t file_shard_count(const ckptio_writer *base) {
  (void)base;
  return 1;
}

static int file_close(ckptio_writer *base) {
  file_writer *w = (file_writer *)base;
  int rc = 0;
  if (w->base.state == CKPTIO_WRITER_RUNNING) {
    rc = wait_flag(w, 1);
    pthread_join(w->thread, NULL);
    ckptio_batch_destroy(&w->batch);
  }
  ckptio_gpu_events_free(w->ctx->gpu, w->start_event);
  ckptio_tmpfile_abort(&w->file); /* a held temp nobody took; else a no-op */
  ckptio_layout_free(&w->layout);
  ckptio_zsave_free(w->zs);
  free(w->first_chunk);
  free(w->piece_base);
  free(w->piece_crc);
  free(w->copied);
  free(w->jobs);
  for (size_t i = 0; i < w->count; i++) free(w->tensors[i].name);
  for (size_t i = 0; i < w->nmeta; i++) {
    free((char *)w->meta[i].key);
    free((char *)w->meta[i].value);
  }
  free(w->tensors);
  ckptio_nameset_free(&w->names);
  free(w->meta);
  free(w->pickle);
  free(w->path);
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
  pthread_mutex_destroy(&w->flush_mu);
  free(w);
  return rc;
}

static const ckptio_writer_ops file_ops = {
    .set_metadata = file_set_metadata,
    .set_stream = file_set_stream,
    .add = file_add,
    .commit_async = file_commit_async,
    .wait_snapshot = file_wait_snapshot,
    .wait_durable = file_wait_durable,
    .poll_snapshot = file_poll_snapshot,
    .poll_durable = file_poll_durable,
    .progress = file_progress,
    .stats = file_stats,
    .shard_count = file_shard_count,
    .close = file_close,
    .add_part = NULL, /* tensors whole only: the front takes whole boxes as add */
    .abort = file_abort,
};
