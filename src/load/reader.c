/* The reader's front: open a checkpoint through its source, answer
 * questions about it, and turn loads and verifies into executor requests. */
#include "load/reader.h"

#include "io/cache.h"
#include "core/trace.h"
#include "load/box.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *rpath(const ckptio_reader *r) { return r->src->path; }

static int cmp_by_name(const void *a, const void *b, void *r) {
  return strcmp(ckptio_reader_entry(r, *(const size_t *)a)->name, ckptio_reader_entry(r, *(const size_t *)b)->name);
}

/* A DCP checkpoint when the path names one (a directory holding .metadata),
 * a set when it names one (an index, or a directory holding one), else one
 * file: the path, or a directory's only safetensors file. Any of these may
 * be objects of a storage ("SCHEME://..."), opened as its files are. */
static int open_source(ckptio_reader *r, const char *path) {
  char *file = NULL;
  int rc = ckptio_dcp_open(r->ctx, &r->opts, path, r->err, &r->src);
  if (rc != 0) return rc < 0 ? rc : 0;
  rc = ckptio_set_open(r->ctx, &r->opts, path, r->err, &r->src, &file);
  if (rc == 0) rc = ckptio_source_open_file(r->ctx, &r->opts, file, r->err, &r->src);
  free(file);
  return rc < 0 ? rc : 0;
}

int ckptio_reader_open(ckptio_ctx *ctx, const char *path, const ckptio_options *opts, ckptio_reader **out) {
  static const char call[] = "ckptio_reader_open";
  ckptio_open_error_clear();
  if (!out) return ckptio_open_error_end(CKPTIO_E_INVALID_ARG, call, NULL);
  *out = NULL;
  if (!ctx || !path) return ckptio_open_error_end(CKPTIO_E_INVALID_ARG, call, NULL);
  ckptio_reader *r = calloc(1, sizeof(*r));
  if (!r) return ckptio_open_error_end(-ENOMEM, call, NULL);
  r->ctx = ctx;
  int rc = ckptio_options_for_call(ctx, opts, &r->opts, r->err);
  ckptio_span span = ckptio_trace_begin("load.open");
  if (rc == 0) rc = open_source(r, path);
  ckptio_trace_end(&span, 0, path);
  if (rc < 0) goto fail;
  size_t n = r->src->idx.count;
  if (!(r->by_name = malloc((n + 1) * sizeof(size_t)))) {
    rc = -ENOMEM;
    goto fail;
  }
  for (size_t i = 0; i < n; i++) r->by_name[i] = i;
  qsort_r(r->by_name, n, sizeof(size_t), cmp_by_name, r);
  *out = r;
  return 0;
fail:
  ckptio_open_error_end(rc, call, r->err);
  ckptio_reader_close(r);
  return rc;
}

void ckptio_reader_close(ckptio_reader *r) {
  if (!r) return;
  ckptio_source_close(r->src);
  free(r->by_name);
  free(r);
}

size_t ckptio_reader_count(const ckptio_reader *r) { return r ? r->src->idx.count : 0; }

const char *ckptio_reader_format(const ckptio_reader *r) {
  return r ? ckptio_index_format_name(r->src->idx.format) : "";
}

uint64_t ckptio_reader_header_bytes(const ckptio_reader *r) { return r ? r->src->idx.header_bytes : 0; }

int ckptio_reader_info(const ckptio_reader *r, size_t index, ckptio_tensor_info *out) {
  if (!r || !out || index >= r->src->idx.count) return CKPTIO_E_INVALID_ARG;
  const ckptio_entry *e = ckptio_reader_entry(r, index);
  memset(out, 0, sizeof(*out));
  out->name = e->name;
  out->dtype = e->dtype;
  out->ndim = e->ndim;
  memcpy(out->shape, e->shape, sizeof(out->shape));
  out->nbytes = ckptio_entry_view_bytes(e); /* a strided view's own bytes, not its storage's */
  out->offset = e->offset;
  out->has_crc = e->has_crc;
  out->crc32 = e->crc;
  out->strided = e->strided;
  return 0;
}

int64_t ckptio_reader_find(const ckptio_reader *r, const char *name) {
  if (!r || !name) return CKPTIO_E_INVALID_ARG;
  size_t lo = 0, hi = r->src->idx.count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(ckptio_reader_entry(r, r->by_name[mid])->name, name);
    if (c == 0) return (int64_t)r->by_name[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return CKPTIO_E_NOT_FOUND;
}

size_t ckptio_reader_metadata_count(const ckptio_reader *r) { return r ? r->src->idx.meta_count : 0; }

int ckptio_reader_metadata_at(const ckptio_reader *r, size_t index, const char **key, const char **value) {
  if (!r || index >= r->src->idx.meta_count) return CKPTIO_E_INVALID_ARG;
  if (key) *key = r->src->idx.meta[index].key;
  if (value) *value = r->src->idx.meta[index].value;
  return 0;
}

const char *ckptio_reader_metadata_get(const ckptio_reader *r, const char *key) {
  for (size_t i = 0; r && key && i < r->src->idx.meta_count; i++)
    if (strcmp(r->src->idx.meta[i].key, key) == 0) return r->src->idx.meta[i].value;
  return NULL;
}

int ckptio_reader_view(ckptio_reader *r, size_t index, const void **data, uint64_t *nbytes) {
  if (!r || !data || index >= r->src->idx.count) return CKPTIO_E_INVALID_ARG;
  return r->src->ops->view(r->src, index, data, nbytes);
}

void ckptio_reader_progress(ckptio_reader *r, uint64_t *done, uint64_t *total) {
  if (done) *done = r ? atomic_load(&r->done_bytes) : 0;
  if (total) *total = r ? atomic_load(&r->total_bytes) : 0;
}

const char *ckptio_reader_last_error(const ckptio_reader *r) { return r ? r->err : ""; }

static int gpu_ordinal(ckptio_reader *r, int device, int *ord, const char *name) {
  char msg[CKPTIO_ERRLEN];
  if (ckptio_ctx_gpu_ordinal(r->ctx, device, ord, msg, sizeof(msg)) < 0)
    return name ? ckptio_fail(r->err, CKPTIO_E_DEVICE, "%s: tensor '%s': %s", rpath(r), name, msg)
                : ckptio_fail(r->err, CKPTIO_E_DEVICE, "%s: %s", rpath(r), msg);
  if (*ord >= CKPTIO_GPU_MAX)
    return name ? ckptio_fail(r->err, CKPTIO_E_DEVICE, "%s: tensor '%s': ckptio handles GPUs 0 to 63", rpath(r), name)
                : ckptio_fail(r->err, CKPTIO_E_DEVICE, "%s: ckptio handles GPUs 0 to 63", rpath(r));
  return 0;
}

int ckptio_reader_set_stream(ckptio_reader *r, int device, void *stream) {
  int ord;
  if (!r) return CKPTIO_E_INVALID_ARG;
  int rc = gpu_ordinal(r, device, &ord, NULL);
  if (rc < 0) return rc;
  r->user_stream[ord] = stream;
  return 0;
}

int ckptio_reader_stats(const ckptio_reader *r, ckptio_stats *out) {
  if (!r) return CKPTIO_E_INVALID_ARG;
  const ckptio_options *o = &r->ctx->opts;
  return ckptio_timers_report(&r->timers, atomic_load(&r->done_bytes), o->threads,
                              ckptio_ring_slots(r->ctx->ring) * o->chunk_bytes, out);
}

int ckptio_reader_compression(const ckptio_reader *r, uint64_t *frames, uint64_t *compressed_bytes,
                              uint64_t *decompressed_bytes) {
  uint64_t f = 0, c = 0, d = 0;
  int z = r && r->src->ops->compression;
  if (z) r->src->ops->compression(r->src, &f, &c, &d);
  if (frames) *frames = f;
  if (compressed_bytes) *compressed_bytes = c;
  if (decompressed_bytes) *decompressed_bytes = d;
  return z;
}

/* ------------------------------------------------------------ sets */

size_t ckptio_reader_shard_count(const ckptio_reader *r) { return r && r->src->ops->shards ? r->src->nfiles : 0; }

int ckptio_reader_shard(const ckptio_reader *r, size_t k, const char **path, size_t *tensors, uint64_t *bytes) {
  if (!r || k >= r->src->nfiles) return CKPTIO_E_INVALID_ARG;
  ckptio_source *f = r->src->ops->file(r->src, k);
  uint64_t b = 0;
  for (size_t i = 0; i < f->idx.count; i++) b += f->idx.entries[i].nbytes;
  if (path) *path = f->path;
  if (tensors) *tensors = f->idx.count;
  if (bytes) *bytes = b;
  return 0;
}

int64_t ckptio_reader_shard_of(const ckptio_reader *r, size_t index) {
  if (!r || index >= r->src->idx.count) return CKPTIO_E_INVALID_ARG;
  size_t local, k;
  r->src->ops->member(r->src, index, &local, &k);
  return (int64_t)k;
}

/* ------------------------------------------------------------ loads */

static const char *memory_name(int ord, char *buf, size_t len) {
  if (ord < 0) return "host memory";
  snprintf(buf, len, "memory of GPU %d", ord);
  return buf;
}

int ckptio_reader_check_device(ckptio_reader *r, const ckptio_entry *e, const void *dst, int device, uint64_t need,
                               const char *what, int *gpu) {
  int ord = -1, where = -1;
  *gpu = -1;
  if (device != CKPTIO_DEVICE_HOST) {
    int rc = gpu_ordinal(r, device, &ord, e->name);
    if (rc < 0) return rc;
  }
  *gpu = ord;
  if (!r->ctx->gpu || !need) return 0;
  char msg[CKPTIO_ERRLEN], a[32], b[32];
  int rc = ckptio_gpu_where(r->ctx->gpu, dst, &where, msg, sizeof(msg));
  if (rc < 0) return ckptio_fail(r->err, rc, "%s: tensor '%s': %s", rpath(r), e->name, msg);
  if (where != ord)
    return ckptio_fail(r->err, CKPTIO_E_DEVICE, "%s: tensor '%s': %s is %s but the request says %s", rpath(r), e->name,
                       what, memory_name(where, a, sizeof(a)), memory_name(ord, b, sizeof(b)));
  return 0;
}

/* A stored entry whole: a view is gathered, and its storage record checked
 * by a second request. */
static int entry_reqs(ckptio_source *m, const ckptio_entry *e, unsigned char *dst, int gpu, int check,
                      ckptio_xreqs *v) {
  check = check && e->has_crc;
  uint64_t view = ckptio_entry_view_bytes(e);
  if (e->strided && dst) { /* gathered from its storage; the CRC covers the storage record */
    ckptio_xreq q = {.src = m, .e = e, .dst = dst, .gpu = gpu, .g = {0, view, view, view ? 1 : 0, view, 1}};
    if (ckptio_xreqs_push(v, &q) < 0) return -ENOMEM;
    if (!check) return 0;
    dst = NULL;
    gpu = -1;
  }
  ckptio_xreq q = {.src = m, .e = e, .dst = dst, .gpu = gpu, .raw = !dst, .check = check,
                   .g = {0, e->nbytes, e->nbytes, e->nbytes ? 1 : 0, e->nbytes, 1}};
  return ckptio_xreqs_push(v, &q);
}

int ckptio_reader_tensor_reqs(ckptio_reader *r, size_t index, void *dst, int gpu, int check, ckptio_xreqs *v) {
  const ckptio_spart *parts;
  ckptio_spart one;
  size_t n = ckptio_reader_parts_of(r, index, &parts, &one);
  if (parts == &one) return entry_reqs(one.src, &one.src->idx.entries[one.local], dst, gpu, check, v);
  const ckptio_entry *e = ckptio_reader_entry(r, index);
  if (!dst) { /* a check: every part whole */
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
      rc = entry_reqs(parts[i].src, &parts[i].src->idx.entries[parts[i].local], NULL, -1, check, v);
    return rc;
  }
  int64_t start[CKPTIO_MAX_DIMS] = {0};
  return ckptio_box_reqs(r, index, start, e->shape, dst, gpu, check, v, NULL);
}

int ckptio_reader_exec(ckptio_reader *r, ckptio_xreq *qs, size_t n, int keep_stats) {
  ckptio_exec_out out = {r->err, &r->done_bytes, &r->total_bytes, &r->timers, r->user_stream, keep_stats};
  return ckptio_exec(r->ctx, &r->opts, qs, n, &out);
}

/* A destination must hold the tensor and be memory of the device the
 * request names. */
static int check_request(ckptio_reader *r, const ckptio_load_request *q, size_t i, int *gpu) {
  if (q->index >= r->src->idx.count)
    return ckptio_fail(r->err, CKPTIO_E_INVALID_ARG, "%s: request %zu: no tensor at index %zu", rpath(r), i, q->index);
  const ckptio_entry *e = ckptio_reader_entry(r, q->index);
  uint64_t need = ckptio_entry_view_bytes(e);
  if (q->dst_bytes < need || (!q->dst && need))
    return ckptio_fail(r->err, CKPTIO_E_BUFFER_TOO_SMALL, "%s: tensor '%s' needs %llu bytes, destination has %llu",
                       rpath(r), e->name, (unsigned long long)need, (unsigned long long)(q->dst ? q->dst_bytes : 0));
  return ckptio_reader_check_device(r, e, q->dst, q->device, need, "destination", gpu);
}

int ckptio_reader_load_many(ckptio_reader *r, const ckptio_load_request *reqs, size_t n) {
  if (!r || (n && !reqs)) return CKPTIO_E_INVALID_ARG;
  ckptio_xreqs v = {0};
  int rc = 0;
  for (size_t i = 0; i < n && rc == 0; i++) {
    int gpu;
    if ((rc = check_request(r, &reqs[i], i, &gpu)) == 0)
      rc = ckptio_reader_tensor_reqs(r, reqs[i].index, reqs[i].dst, gpu, r->opts.crc, &v);
  }
  if (rc == 0) rc = ckptio_reader_exec(r, v.q, v.n, 0);
  free(v.q);
  return rc;
}

int ckptio_reader_load(ckptio_reader *r, size_t index, void *dst, uint64_t dst_bytes) {
  ckptio_load_request req = {index, dst, dst_bytes, CKPTIO_DEVICE_HOST};
  return ckptio_reader_load_many(r, &req, 1);
}

/* A tensor is checked when every stored part of it has a CRC. */
static int all_parts_crc(const ckptio_reader *r, size_t index) {
  const ckptio_spart *parts;
  ckptio_spart one;
  size_t n = ckptio_reader_parts_of(r, index, &parts, &one);
  for (size_t i = 0; i < n; i++)
    if (!parts[i].src->idx.entries[parts[i].local].has_crc) return 0;
  return 1;
}

int ckptio_reader_verify(ckptio_reader *r, size_t *unchecked) {
  if (!r) return CKPTIO_E_INVALID_ARG;
  size_t count = r->src->idx.count, checked = 0;
  ckptio_xreqs v = {0};
  int rc = 0;
  for (size_t i = 0; i < count && rc == 0; i++)
    if (all_parts_crc(r, i)) {
      rc = ckptio_reader_tensor_reqs(r, i, NULL, -1, 1, &v);
      checked++;
    }
  if (rc == 0) rc = ckptio_reader_exec(r, v.q, v.n, 0);
  free(v.q);
  if (unchecked) *unchecked = count - checked;
  return rc;
}

int ckptio_reader_map_private(ckptio_reader *r, void **base, uint64_t *size) {
  if (!base || !size) return CKPTIO_E_INVALID_ARG;
  *base = NULL;
  *size = 0;
  if (!r) return CKPTIO_E_INVALID_ARG;
  /* One mapping holds one file whose bytes are the tensors' own. */
  if (!r->src->ops->map_private)
    return ckptio_fail(r->err, CKPTIO_E_FORMAT,
                       "%s: a %s has no file holding the tensors' bytes as they are; load them", rpath(r),
                       r->src->ops->noun);
  ckptio_exec_out out = {r->err, &r->done_bytes, &r->total_bytes, &r->timers, r->user_stream, 0};
  return r->src->ops->map_private(r->src, &out, base, size);
}

int ckptio_reader_resident(ckptio_reader *r, double *share) {
  if (!r || !share) return CKPTIO_E_INVALID_ARG;
  double held = 0, total = 0;
  for (size_t k = 0; k < r->src->nfiles; k++) {
    ckptio_source *f = r->src->ops->file(r->src, k);
    uint64_t bytes = 0;
    ckptio_reader_shard(r, k, NULL, NULL, &bytes);
    held += f->ops->resident ? f->ops->resident(f) * (double)bytes : 0;
    total += (double)bytes;
  }
  *share = total > 0 ? held / total : 1;
  return 0;
}

int ckptio_reader_fits_cache(ckptio_reader *r) {
  if (!r) return CKPTIO_E_INVALID_ARG;
  uint64_t total = 0;
  for (size_t k = 0; k < r->src->nfiles; k++) {
    uint64_t bytes = 0;
    ckptio_reader_shard(r, k, NULL, NULL, &bytes);
    total += bytes;
  }
  return ckptio_cache_fits(total);
}

int ckptio_map_free(void *base, uint64_t size) {
  return ckptio_rfile_unmap(base, size);
}
