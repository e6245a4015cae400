/* What writers of several files gather before commit (collect.h). */
#include "save/collect.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "ctx/ctx.h"

int ckptio_collect_stream(ckptio_collect *c, ckptio_ctx *ctx, int device, void *stream, const char *where,
                          char *err) {
  int ord;
  char msg[CKPTIO_ERRLEN];
  if (ckptio_ctx_gpu_ordinal(ctx, device, &ord, msg, sizeof(msg)) < 0)
    return ckptio_err_fmt(err, CKPTIO_ERRLEN, CKPTIO_E_DEVICE, "%s: %s", where, msg);
  if (ord < 0 || ord >= 64) return ckptio_err_fmt(err, CKPTIO_ERRLEN, CKPTIO_E_DEVICE, "%s: a stream needs a GPU 0 to 63", where);
  c->user_stream[ord] = stream;
  return 0;
}

int ckptio_collect_metadata(ckptio_collect *c, const char *key, const char *value, char *err) {
  if (strncmp(key, "ckptio.", 7) == 0)
    return ckptio_err_fmt(err, CKPTIO_ERRLEN, CKPTIO_E_INVALID_ARG, "metadata key '%s' is reserved (prefix 'ckptio.')", key);
  for (size_t i = 0; i < c->nmeta2; i += 2)
    if (strcmp(c->meta[i], key) == 0) return ckptio_err_fmt(err, CKPTIO_ERRLEN, CKPTIO_E_DUPLICATE, "metadata key '%s' set twice", key);
  if (ckptio_array_grow((void **)&c->meta, &c->meta_cap, c->nmeta2 + 1, sizeof(char *)) < 0) return -ENOMEM;
  char *k = strdup(key), *v = strdup(value);
  if (!k || !v) {
    free(k);
    free(v);
    return -ENOMEM;
  }
  c->meta[c->nmeta2++] = k;
  c->meta[c->nmeta2++] = v;
  return 0;
}

static const char *ctensor_name(const void *items, size_t i) { return ((const ckptio_ctensor *)items)[i].t.name; }

/* The box must lie inside the global shape, computed without overflow. */
static int check_box(const ckptio_tensor *t, const int64_t *global, const int64_t *offsets, char *err) {
  int64_t end;
  for (int d = 0; d < t->ndim; d++)
    if (global[d] < 0 || offsets[d] < 0 || __builtin_add_overflow(offsets[d], t->shape[d], &end) || end > global[d])
      return ckptio_err_fmt(err, CKPTIO_ERRLEN, CKPTIO_E_INVALID_ARG,
                            "tensor '%s': dim %d of the part, [%lld, %lld + %lld), is outside the global size %lld",
                            t->name, d, (long long)offsets[d], (long long)offsets[d], (long long)t->shape[d],
                            (long long)global[d]);
  return 0;
}

int ckptio_collect_add(ckptio_collect *c, const ckptio_tensor *t, const int64_t *global, const int64_t *offsets,
                       ckptio_fill fill, char *err) {
  int64_t nbytes = ckptio_tensor_nbytes(t->dtype, t->ndim, t->shape);
  if (nbytes < 0)
    return ckptio_err_fmt(err, CKPTIO_ERRLEN, (int)nbytes, "tensor '%s': %s (dtype, shape or byte count)", t->name,
                          ckptio_strerror((int)nbytes));
  if (!t->data && !fill.fn && nbytes)
    return ckptio_err_fmt(err, CKPTIO_ERRLEN, CKPTIO_E_INVALID_ARG, "tensor '%s': NULL data for a non-empty tensor", t->name);
  if (strcmp(t->name, "__metadata__") == 0)
    return ckptio_err_fmt(err, CKPTIO_ERRLEN, CKPTIO_E_INVALID_ARG, "tensor name '%s' is reserved by safetensors", t->name);
  int rc;
  if (global && (rc = check_box(t, global, offsets, err)) < 0) return rc;
  if (global && ckptio_tensor_nbytes(t->dtype, t->ndim, global) < 0)
    return ckptio_err_fmt(err, CKPTIO_ERRLEN, CKPTIO_E_OVERFLOW, "tensor '%s': the global shape's byte count overflows", t->name);
  if (ckptio_array_grow((void **)&c->tensors, &c->cap, c->count, sizeof(*c->tensors)) < 0) return -ENOMEM;
  char *name = strdup(t->name);
  if (!name) return -ENOMEM;
  ckptio_ctensor *s = &c->tensors[c->count];
  memset(s, 0, sizeof(*s));
  s->t = *t;
  s->t.name = name;
  s->fill = fill;
  for (int d = 0; d < t->ndim; d++) {
    s->global[d] = global ? global[d] : t->shape[d];
    s->offsets[d] = global ? offsets[d] : 0;
  }
  if ((rc = ckptio_nameset_insert(&c->names, name, c->count, ctensor_name, c->tensors)) <= 0) {
    free(name);
    return rc < 0 ? rc : ckptio_err_fmt(err, CKPTIO_ERRLEN, CKPTIO_E_DUPLICATE, "tensor '%s' added twice", t->name);
  }
  s->nbytes = (uint64_t)nbytes;
  c->count++;
  c->total_bytes += (uint64_t)nbytes;
  return 0;
}

int ckptio_collect_apply(const ckptio_collect *c, ckptio_writer *sub) {
  int rc = 0;
  for (size_t i = 0; i < c->nmeta2 && rc == 0; i += 2) rc = sub->ops->set_metadata(sub, c->meta[i], c->meta[i + 1]);
  for (int ord = 0; ord < 64 && rc == 0; ord++)
    if (c->user_stream[ord]) rc = sub->ops->set_stream(sub, CKPTIO_DEVICE_CUDA(ord), c->user_stream[ord]);
  return rc;
}

void ckptio_collect_free(ckptio_collect *c) {
  for (size_t i = 0; i < c->count; i++) free((char *)c->tensors[i].t.name);
  for (size_t i = 0; i < c->nmeta2; i++) free(c->meta[i]);
  free(c->tensors);
  free(c->meta);
  ckptio_nameset_free(&c->names);
  memset(c, 0, sizeof(*c));
}

void ckptio_save_id_make(char out[33]) {
  unsigned char b[16];
  if (getrandom(b, sizeof(b), 0) != (ssize_t)sizeof(b)) {
    /* Only collisions between saves matter, not secrecy. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec << 30 ^ (uint64_t)getpid() << 48;
    for (int i = 0; i < 16; i++) b[i] = (unsigned char)(x >> (i % 8 * 8) ^ (uint64_t)i * 0x9e);
  }
  for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static int check_dir(const char *dir, const char *prefix, int object, char *msg, size_t len) {
  struct stat st;
  if (!*prefix || strchr(prefix, '/') || !strcmp(prefix, ".") || !strcmp(prefix, ".."))
    return ckptio_err_fmt(msg, len, CKPTIO_E_INVALID_ARG, "prefix '%s': must be a plain, non-empty file name", prefix);
  if (object) return 0; /* a storage's prefix: nothing to stat */
  if (stat(dir, &st) < 0) return ckptio_err_fmt(msg, len, -errno, "%s: %s", dir, ckptio_errno_text(errno));
  if (!S_ISDIR(st.st_mode)) return ckptio_err_fmt(msg, len, -ENOTDIR, "%s: %s", dir, ckptio_errno_text(ENOTDIR));
  return 0;
}

int ckptio_many_open(size_t size, ckptio_ctx *ctx, const ckptio_writer_ops *ops, const ckptio_options *opts,
                     const char *dir, const char *prefix, const char *kind, ckptio_many_writer **out, char *msg) {
  const ckptio_storage *store = NULL;
  int object = ckptio_storages_find(ctx->storages, dir, &store, msg, CKPTIO_ERRLEN);
  int rc = object < 0 ? object : check_dir(dir, prefix, object, msg, CKPTIO_ERRLEN);
  if (rc < 0) return rc;
  ckptio_many_writer *m = calloc(1, size);
  if (!m) return -ENOMEM;
  if ((rc = ckptio_options_for_call(ctx, opts, &m->opts, msg)) < 0) goto fail;
  if (m->opts.compress_level) {
    rc = CKPTIO_E_FORMAT;
    snprintf(msg, CKPTIO_ERRLEN, "%s: %s are plain safetensors; compress single files", dir, kind);
    goto fail;
  }
  rc = -ENOMEM;
  if (!(m->dir = strdup(dir)) || !(m->prefix = strdup(prefix))) goto fail;
  m->base.ops = ops;
  m->base.ctx = ctx;
  m->base.where = m->dir;
  m->ctx = ctx;
  m->store = object ? store : NULL;
  *out = m;
  return 0;
fail:
  ckptio_many_free(m);
  return rc;
}

void ckptio_many_free(ckptio_many_writer *m) {
  if (!m) return;
  ckptio_collect_free(&m->c);
  free(m->dir);
  free(m->prefix);
  free(m);
}

int ckptio_many_set_stream(ckptio_writer *base, int device, void *stream) {
  ckptio_many_writer *m = (ckptio_many_writer *)base;
  return ckptio_collect_stream(&m->c, m->ctx, device, stream, m->dir, m->base.err);
}

int ckptio_many_set_metadata(ckptio_writer *base, const char *key, const char *value) {
  ckptio_many_writer *m = (ckptio_many_writer *)base;
  if (!key || !value) return CKPTIO_E_INVALID_ARG;
  return ckptio_collect_metadata(&m->c, key, value, m->base.err);
}
