/* Opening a checkpoint: detect its format, parse and validate its header
 * into the format-neutral index, map the file; then answer questions about
 * it (count, find, info, metadata, views). Moving bytes is load.c's. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compress/zload.h"
#include "formats/safetensors.h"
#include "formats/zstd_seekable.h"
#include "formats/torch_read.h"
#include "io/file.h"
#include "reader_internal.h"
#include "shard.h"

int ckptio_reader_fail(ckptio_reader *r, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->err, sizeof(r->err), fmt, ap);
  va_end(ap);
  return code;
}
#define rfail ckptio_reader_fail

/* safetensors' own index, moved into the neutral one (names and metadata
 * change owner; nothing is copied twice). */
static int adopt_safetensors(ckptio_reader *r, ckptio_st_index *st) {
  ckptio_index *idx = &r->idx;
  idx->format = "safetensors";
  idx->header_bytes = st->data_start;
  if (!(idx->entries = calloc(st->count + 1, sizeof(ckptio_entry)))) return -ENOMEM;
  for (size_t i = 0; i < st->count; i++) {
    const ckptio_st_entry *e = &st->entries[i];
    ckptio_entry *d = &idx->entries[i];
    d->name = e->name;
    d->dtype = e->dtype;
    d->ndim = e->ndim;
    memcpy(d->shape, e->shape, sizeof(d->shape));
    d->offset = st->data_start + e->begin;
    d->nbytes = e->end - e->begin;
    d->has_crc = e->has_crc;
    d->crc = e->crc;
    st->entries[i].name = NULL;
  }
  idx->count = st->count;
  idx->meta = (ckptio_meta *)st->meta; /* same layout: two owned strings */
  idx->meta_count = st->meta_count;
  st->meta = NULL;
  st->meta_count = 0;
  return 0;
}

static int parse_safetensors(ckptio_reader *r) {
  uint8_t prefix[8] = {0};
  uint64_t n;
  char msg[CKPTIO_ERRLEN];
  int rc = ckptio_pread_full(r->fd, prefix, r->file_size < 8 ? (size_t)r->file_size : 8, 0);
  if (rc < 0) return rfail(r, rc, "%s: reading the header: %s", r->path, ckptio_strerror(rc));
  if ((rc = ckptio_st_header_length(prefix, r->file_size, &n, msg, sizeof(msg))) < 0)
    return rfail(r, rc, "%s: %s", r->path, msg);
  uint8_t *hdr = malloc(n ? n : 1);
  if (!hdr) return -ENOMEM;
  ckptio_st_index st;
  memset(&st, 0, sizeof(st));
  rc = ckptio_pread_full(r->fd, hdr, (size_t)n, 8);
  if (rc < 0) rfail(r, rc, "%s: reading the header: %s", r->path, ckptio_strerror(rc));
  else if ((rc = ckptio_st_parse(hdr, n, r->file_size, &st, msg, sizeof(msg))) < 0)
    rfail(r, rc, "%s: %s", r->path, msg);
  else
    rc = adopt_safetensors(r, &st);
  free(hdr);
  ckptio_st_index_free(&st);
  return rc;
}

/* A zstd seekable file holds a safetensors file: its header is parsed as
 * the plain file's, with offsets in the decompressed stream. */
static int parse_compressed(ckptio_reader *r) {
  uint8_t *hdr = NULL;
  uint64_t n = 0, plain = 0;
  char msg[CKPTIO_ERRLEN];
  ckptio_st_index st;
  memset(&st, 0, sizeof(st));
  int rc = ckptio_zread_open(r, &hdr, &n, &plain);
  if (rc == 0 && (rc = ckptio_st_parse(hdr, n, plain, &st, msg, sizeof(msg))) < 0)
    rfail(r, rc, "%s: decompressed: %s", r->path, msg);
  else if (rc == 0 && (rc = adopt_safetensors(r, &st)) == 0)
    rc = ckptio_zread_adopt(r);
  free(hdr);
  ckptio_st_index_free(&st);
  return rc;
}

/* A zip is a PyTorch archive (the parser refuses other zips and names
 * what it found); anything else is taken for safetensors, whose checks
 * explain what is wrong with a file that is neither. */
static int parse_header(ckptio_reader *r) {
  if (ckptio_zs_detect(r->map, r->file_size)) return parse_compressed(r);
  if (r->file_size >= 4 && memcmp(r->map, "PK\x03\x04", 4) == 0) {
    char msg[CKPTIO_ERRLEN];
    int rc = ckptio_torch_parse(r->map, r->file_size, &r->idx, msg, sizeof(msg));
    return rc < 0 ? rfail(r, rc, "%s: %s", r->path, msg) : 0;
  }
  return parse_safetensors(r);
}

static const ckptio_reader *sort_reader; /* qsort has no context argument */
static pthread_mutex_t sort_mu = PTHREAD_MUTEX_INITIALIZER;
static int open_file(ckptio_reader *r);
static int cmp_by_name(const void *a, const void *b) {
  return strcmp(sort_reader->idx.entries[*(const size_t *)a].name,
                sort_reader->idx.entries[*(const size_t *)b].name);
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
  /* An index or a directory: a set of shards, or the directory's one file. */
  if ((rc = ckptio_shard_open(r)) < 0) goto fail;
  if (rc == 0 && (rc = open_file(r)) < 0) goto fail;
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

/* One file at r->path: open, map, parse its header. */
static int open_file(ckptio_reader *r) {
  const char *path = r->path;
  int rc;
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
  if (r->file_size) {
    void *m = mmap(NULL, (size_t)r->file_size, PROT_READ, MAP_SHARED, r->fd, 0);
    if (m == MAP_FAILED) {
      rc = rfail(r, -errno, "%s: mmap: %s", path, strerror(errno));
      goto fail;
    }
    r->map = m;
  }
  return parse_header(r);
fail:
  return rc;
}

void ckptio_reader_close(ckptio_reader *r) {
  if (!r) return;
  ckptio_shard_close(r);
  if (r->map) munmap((void *)r->map, (size_t)r->file_size);
  if (r->fd_direct >= 0) close(r->fd_direct);
  if (r->fd >= 0) close(r->fd);
  ckptio_index_free(&r->idx);
  ckptio_zread_free(r->z);
  free(r->by_name);
  free(r->path);
  free(r);
}

size_t ckptio_reader_count(const ckptio_reader *r) { return r ? r->idx.count : 0; }

const char *ckptio_reader_format(const ckptio_reader *r) { return r && r->idx.format ? r->idx.format : ""; }

uint64_t ckptio_reader_header_bytes(const ckptio_reader *r) { return r ? r->idx.header_bytes : 0; }

int ckptio_reader_info(const ckptio_reader *r, size_t index, ckptio_tensor_info *out) {
  if (!r || !out || index >= r->idx.count) return CKPTIO_E_INVALID_ARG;
  const ckptio_entry *e = &r->idx.entries[index];
  memset(out, 0, sizeof(*out));
  out->name = e->name;
  out->dtype = e->dtype;
  out->ndim = e->ndim;
  memcpy(out->shape, e->shape, sizeof(out->shape));
  /* A strided view's own byte count, not its storage's. */
  int64_t n = ckptio_tensor_nbytes(e->dtype, e->ndim, e->shape);
  out->nbytes = e->strided && n >= 0 ? (uint64_t)n : e->nbytes;
  out->offset = e->offset;
  out->has_crc = e->has_crc;
  out->crc32 = e->crc;
  out->strided = e->strided;
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
  if (r->set) return ckptio_shard_view(r, index, data, nbytes);
  const ckptio_entry *e = &r->idx.entries[index];
  if (r->z)
    return rfail(r, CKPTIO_E_FORMAT, "%s: tensor '%s': a compressed file has no plain bytes to view: load it",
                 r->path, e->name);
  if (e->strided || e->byteswap)
    return rfail(r, CKPTIO_E_FORMAT, "%s: tensor '%s' is %s in the file: load it instead of viewing it",
                 r->path, e->name, e->strided ? "a strided view" : "big-endian");
  *data = r->map ? r->map + e->offset : NULL;
  if (nbytes) *nbytes = e->nbytes;
  return 0;
}

void ckptio_reader_progress(ckptio_reader *r, uint64_t *done, uint64_t *total) {
  if (done) *done = r ? atomic_load(&r->done_bytes) : 0;
  if (total) *total = r ? atomic_load(&r->total_bytes) : 0;
}

const char *ckptio_reader_last_error(const ckptio_reader *r) { return r ? r->err : ""; }

int ckptio_reader_set_stream(ckptio_reader *r, int device, void *stream) {
  int ord;
  char msg[CKPTIO_ERRLEN];
  if (!r) return CKPTIO_E_INVALID_ARG;
  if (ckptio_ctx_gpu_ordinal(r->ctx, device, &ord, msg, sizeof(msg)) < 0)
    return rfail(r, CKPTIO_E_DEVICE, "%s: %s", r->path, msg);
  if (ord >= CKPTIO_READER_MAX_GPUS) return rfail(r, CKPTIO_E_DEVICE, "%s: ckptio handles GPUs 0 to 63", r->path);
  r->user_stream[ord] = stream;
  return r->set ? ckptio_shard_set_stream(r, device, stream) : 0;
}

int ckptio_reader_stats(const ckptio_reader *r, ckptio_stats *out) {
  if (!r) return CKPTIO_E_INVALID_ARG;
  const ckptio_options *o = &r->ctx->opts;
  return ckptio_timers_report(&r->timers, atomic_load(&r->done_bytes), o->threads,
                              o->staging_bytes / o->chunk_bytes * o->chunk_bytes, out);
}

int ckptio_reader_compression(const ckptio_reader *r, uint64_t *frames, uint64_t *compressed_bytes,
                              uint64_t *decompressed_bytes) {
  ckptio_zread_describe(r ? r->z : NULL, frames, compressed_bytes, decompressed_bytes);
  return r && r->z ? 1 : 0;
}
