/* The built-in S3 storage (storage.h): the public verbs over the S3
 * client room, one client (with its pool of keep-alive connections) per
 * context, made from the environment on the first s3:// open.
 *
 * Saves: an object of one chunk is held and PUT at publish; a larger one
 * is a multipart upload whose parts are whole runs of m chunks (m = 1
 * unless a chunk is under S3's 5 MiB part minimum or the object would need
 * more than 10,000 parts), each uploaded from the worker that wrote its
 * last chunk: straight from the caller's buffer when m = 1, else from a
 * part buffer the chunks are copied into. CompleteMultipartUpload is the
 * atomic publish; every failure aborts the upload, and a publish aborts
 * the uploads of the same key that crashed saves left open.
 *
 * An object of unknown size (CKPTIO_STORAGE_UNSIZED: a compressed save,
 * whose frames land at offsets known only once the frames before them are
 * compressed, and whose header frame at offset 0 is written last) is a
 * multipart upload whose part boundaries do not depend on the size: part i
 * is base x (1 + i / 1000) bytes (base: a chunk, at least S3's 5 MiB
 * minimum), so 10,000 parts hold 55,000 x base. Writes of any length at
 * any offset are copied into their parts' buffers; a part is uploaded by
 * whoever fills it, and the last one, shorter, at publish, which also
 * sends the first part (held until the header frame is in). Memory: the
 * first part and the parts being filled, a few, as frames come in order. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "s3/s3.h"
#include "storage/storage.h"

typedef struct s3_object {
  ckptio_s3_url url;
  uint64_t size;
  char etag[CKPTIO_S3_ETAG_MAX]; /* what was opened: every read asks for it */
} s3_object;

int ckptio_s3_storage_create(void **self, char *err, size_t errlen) {
  ckptio_s3_client *c = NULL;
  int rc = ckptio_s3_client_create(NULL, &c, err, errlen);
  if (rc == 0) *self = c;
  return rc;
}

void ckptio_s3_storage_free(void *self) { ckptio_s3_client_free(self); }

static int s3_open_read(void *self, const char *path, void **obj, uint64_t *size, char *err, size_t errlen) {
  s3_object *o = calloc(1, sizeof(*o));
  if (!o) return -ENOMEM;
  int rc = ckptio_s3_url_parse(path, &o->url, err, errlen);
  if (rc == 0 && !o->url.key[0])
    rc = ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "%s: names a bucket, not an object", path);
  ckptio_s3_object head;
  if (rc == 0) rc = ckptio_s3_head(self, o->url.bucket, o->url.key, &head, err, errlen);
  /* A missing object is a missing file to the caller (-ENOENT: Python's
   * FileNotFoundError); the sentence says what S3 answered. */
  if (rc == CKPTIO_E_NOT_FOUND) rc = -ENOENT;
  if (rc < 0) {
    free(o);
    return rc;
  }
  o->size = head.size;
  memcpy(o->etag, head.etag, sizeof(o->etag));
  *obj = o;
  *size = head.size;
  return 0;
}

static int s3_read(void *self, void *obj, void *buf, size_t len, uint64_t offset, char *err, size_t errlen) {
  s3_object *o = obj;
  /* Only from the object opened: one replaced by a save meanwhile fails
   * (-ESTALE) rather than mixing two versions' bytes under the CRCs. */
  return ckptio_s3_get_range_if(self, o->url.bucket, o->url.key, o->etag, offset, len, buf, err, errlen);
}

int ckptio_storage_read_spans(const ckptio_storage_ops *ops, void *self, void *obj, const ckptio_scatter *spans,
                              size_t n, uint64_t offset, char *err, size_t errlen) {
  if (ops->read != s3_read) {
    for (size_t i = 0; i < n; offset += spans[i++].len) {
      int rc = spans[i].dst && spans[i].len ? ops->read(self, obj, spans[i].dst, spans[i].len, offset, err, errlen) : 0;
      if (rc < 0) return rc;
    }
    return 0;
  }
  s3_object *o = obj;
  return ckptio_s3_get_spans_if(self, o->url.bucket, o->url.key, o->etag, offset, spans, n, err, errlen);
}

static void s3_close_read(void *self, void *obj) {
  (void)self;
  free(obj);
}

/* ------------------------------------------------------------ saves */

typedef struct s3_upload {
  ckptio_s3_url url;
  uint64_t size, part;       /* part: bytes of every part but the last;
                                unsized: the base of the schedule */
  int unsized;               /* size unknown: size is what was written so far */
  int nparts;                /* 0: one PUT of `whole` at publish; unsized:
                                CKPTIO_S3_PARTS_MAX, the most it may use */
  char upload_id[CKPTIO_S3_UPLOAD_ID_MAX];
  ckptio_s3_part *parts;     /* [nparts]: etag set once uploaded */
  pthread_mutex_t mu;        /* the part buffers and their fill counts */
  unsigned char **buf;       /* [nparts] when a part is several chunks */
  uint64_t *filled;
  unsigned char *whole;
} s3_upload;

/* Where part i starts, and its length when full (unsized objects). */
static uint64_t sched_start(const s3_upload *u, int i) {
  uint64_t q = (uint64_t)i / 1000, r = (uint64_t)i % 1000;
  return u->part * (1000 * q * (q + 1) / 2 + r * (q + 1));
}

static uint64_t sched_len(const s3_upload *u, int i) { return u->part * (1 + (uint64_t)i / 1000); }

static int sched_part(const s3_upload *u, uint64_t off) {
  int i = 0;
  while (i + 1000 <= CKPTIO_S3_PARTS_MAX && sched_start(u, i + 1000) <= off) i += 1000;
  i += (int)((off - sched_start(u, i)) / sched_len(u, i));
  return i;
}

static uint64_t part_start(const s3_upload *u, int i) {
  return u->unsized ? sched_start(u, i) : (uint64_t)i * u->part;
}

static uint64_t part_len(const s3_upload *u, int i) {
  uint64_t at = part_start(u, i), full = u->unsized ? sched_len(u, i) : u->part;
  return u->size - at < full ? u->size - at : full;
}

static void upload_free(s3_upload *u) {
  for (int i = 0; u->buf && i < u->nparts; i++) free(u->buf[i]);
  free(u->buf);
  free(u->filled);
  free(u->parts);
  free(u->whole);
  pthread_mutex_destroy(&u->mu);
  free(u);
}

static int s3_create(void *self, const char *path, uint64_t size, uint64_t chunk, void **obj, char *err,
                     size_t errlen) {
  s3_upload *u = calloc(1, sizeof(*u));
  if (!u) return -ENOMEM;
  pthread_mutex_init(&u->mu, NULL);
  u->size = size;
  int rc = ckptio_s3_url_parse(path, &u->url, err, errlen);
  if (rc == 0 && !u->url.key[0])
    rc = ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "%s: names a bucket, not an object", path);
  if (rc == 0 && size == CKPTIO_STORAGE_UNSIZED) {
    u->unsized = 1;
    u->size = 0;
    u->part = chunk > CKPTIO_S3_PART_MIN ? chunk : CKPTIO_S3_PART_MIN;
    u->nparts = CKPTIO_S3_PARTS_MAX;
    u->parts = calloc((size_t)u->nparts, sizeof(*u->parts));
    u->buf = calloc((size_t)u->nparts, sizeof(*u->buf));
    u->filled = calloc((size_t)u->nparts, sizeof(*u->filled));
    if (!u->parts || !u->buf || !u->filled) rc = -ENOMEM;
    if (rc == 0) rc = ckptio_s3_multipart_create(self, u->url.bucket, u->url.key, u->upload_id, err, errlen);
  } else if (rc == 0 && size <= chunk) {
    if (!(u->whole = malloc(size ? size : 1))) rc = -ENOMEM;
  } else if (rc == 0) {
    uint64_t m = (CKPTIO_S3_PART_MIN + chunk - 1) / chunk, per = chunk * CKPTIO_S3_PARTS_MAX;
    if ((size + per - 1) / per > m) m = (size + per - 1) / per;
    u->part = m * chunk;
    u->nparts = (int)((size + u->part - 1) / u->part);
    u->parts = calloc((size_t)u->nparts, sizeof(*u->parts));
    if (m > 1) {
      u->buf = calloc((size_t)u->nparts, sizeof(*u->buf));
      u->filled = calloc((size_t)u->nparts, sizeof(*u->filled));
    }
    if (!u->parts || (m > 1 && (!u->buf || !u->filled))) rc = -ENOMEM;
    if (rc == 0) rc = ckptio_s3_multipart_create(self, u->url.bucket, u->url.key, u->upload_id, err, errlen);
  }
  if (rc < 0) {
    upload_free(u);
    return rc;
  }
  *obj = u;
  return 0;
}

static int upload_part(void *self, s3_upload *u, int i, const void *buf, char *err, size_t errlen) {
  u->parts[i].number = i + 1;
  return ckptio_s3_multipart_upload_part(self, u->url.bucket, u->url.key, u->upload_id, i + 1, buf,
                                         (size_t)part_len(u, i), u->parts[i].etag, err, errlen);
}

/* An unsized object's bytes: each piece into its part's buffer, a part
 * uploaded by the write that fills it. */
static int unsized_write(void *self, s3_upload *u, const unsigned char *buf, size_t len, uint64_t offset, char *err,
                         size_t errlen) {
  uint64_t limit = sched_start(u, CKPTIO_S3_PARTS_MAX);
  if (offset > limit || len > limit - offset)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_OVERFLOW,
                          "s3://%s/%s: a compressed object past %llu bytes needs more than %d parts", u->url.bucket,
                          u->url.key, (unsigned long long)limit, CKPTIO_S3_PARTS_MAX);
  while (len) {
    int i = sched_part(u, offset);
    uint64_t at = sched_start(u, i), full = sched_len(u, i), n = at + full - offset < len ? at + full - offset : len;
    pthread_mutex_lock(&u->mu);
    if (!u->buf[i] && !u->parts[i].etag[0]) u->buf[i] = malloc((size_t)full);
    unsigned char *b = u->buf[i];
    if (offset + n > u->size) u->size = offset + n;
    pthread_mutex_unlock(&u->mu);
    if (!b)
      return ckptio_err_fmt(err, errlen, -ENOMEM, "s3://%s/%s: no memory for part %d (%llu bytes)%s", u->url.bucket,
                            u->url.key, i + 1, (unsigned long long)full,
                            u->parts[i].etag[0] ? ": written twice" : "");
    memcpy(b + (offset - at), buf, (size_t)n);
    pthread_mutex_lock(&u->mu);
    int filled = (u->filled[i] += n) == full;
    pthread_mutex_unlock(&u->mu);
    if (filled) {
      u->parts[i].number = i + 1;
      int rc = ckptio_s3_multipart_upload_part(self, u->url.bucket, u->url.key, u->upload_id, i + 1, b,
                                               (size_t)full, u->parts[i].etag, err, errlen);
      pthread_mutex_lock(&u->mu);
      free(u->buf[i]);
      u->buf[i] = NULL;
      pthread_mutex_unlock(&u->mu);
      if (rc < 0) return rc;
    }
    buf += n, offset += n, len -= (size_t)n;
  }
  return 0;
}

/* At publish: the size is what was written; the parts not full (the last,
 * and any the size cut short) go now, each whole or it is an error. */
static int unsized_finish(void *self, s3_upload *u, char *err, size_t errlen) {
  int n = u->size ? sched_part(u, u->size - 1) + 1 : 1;
  for (int i = 0; i < n; i++) {
    if (u->parts[i].etag[0]) continue;
    uint64_t want = part_len(u, i);
    if (u->filled[i] != want || (want && !u->buf[i]))
      return ckptio_err_fmt(err, errlen, CKPTIO_E_STATE, "s3://%s/%s: part %d holds %llu of its %llu bytes",
                            u->url.bucket, u->url.key, i + 1, (unsigned long long)u->filled[i],
                            (unsigned long long)want);
    u->parts[i].number = i + 1;
    int rc = ckptio_s3_multipart_upload_part(self, u->url.bucket, u->url.key, u->upload_id, i + 1,
                                             u->buf[i] ? u->buf[i] : (const void *)"", (size_t)want,
                                             u->parts[i].etag, err, errlen);
    if (rc < 0) return rc;
  }
  u->nparts = n;
  return 0;
}

static int s3_write(void *self, void *obj, const void *buf, size_t len, uint64_t offset, char *err, size_t errlen) {
  s3_upload *u = obj;
  if (u->unsized) return unsized_write(self, u, buf, len, offset, err, errlen);
  if (offset > u->size || len > u->size - offset)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "s3://%s/%s: %zu bytes at %llu pass its %llu bytes",
                          u->url.bucket, u->url.key, len, (unsigned long long)offset, (unsigned long long)u->size);
  if (u->whole) {
    memcpy(u->whole + offset, buf, len);
    return 0;
  }
  int i = (int)(offset / u->part);
  if (!u->buf) return upload_part(self, u, i, buf, err, errlen); /* a chunk is a part */
  /* A part of several chunks: copied into its buffer; whoever completes it
   * uploads it. Chunks never straddle parts (a part is whole chunks). */
  pthread_mutex_lock(&u->mu);
  if (!u->buf[i]) u->buf[i] = malloc((size_t)part_len(u, i));
  unsigned char *b = u->buf[i];
  pthread_mutex_unlock(&u->mu);
  if (!b) return -ENOMEM;
  memcpy(b + (offset - (uint64_t)i * u->part), buf, len);
  pthread_mutex_lock(&u->mu);
  int full = (u->filled[i] += len) == part_len(u, i);
  pthread_mutex_unlock(&u->mu);
  if (!full) return 0;
  int rc = upload_part(self, u, i, b, err, errlen);
  pthread_mutex_lock(&u->mu);
  free(u->buf[i]);
  u->buf[i] = NULL;
  pthread_mutex_unlock(&u->mu);
  return rc;
}

/* After a publish: uploads of the same key left open by saves that died
 * before their own publish or abort (they would stay stored, and billed).
 * Best effort: the new object is in place whatever this finds. */
typedef struct sweep {
  void *self;
  const s3_upload *u;
} sweep;

static int sweep_one(void *arg, const char *key, const char *upload_id) {
  sweep *w = arg;
  char ignored[256];
  if (!strcmp(key, w->u->url.key) && strcmp(upload_id, w->u->upload_id))
    ckptio_s3_multipart_abort(w->self, w->u->url.bucket, key, upload_id, ignored, sizeof(ignored));
  return 0;
}

int ckptio_storage_unsized(const ckptio_storage *st) { return st && st->ops.create == s3_create; }

static int s3_publish(void *self, void *obj, char *err, size_t errlen) {
  s3_upload *u = obj;
  int rc = 0;
  if (u->whole) {
    rc = ckptio_s3_put_object(self, u->url.bucket, u->url.key, u->whole, (size_t)u->size, NULL, err, errlen);
  } else {
    if (u->unsized) rc = unsized_finish(self, u, err, errlen);
    for (int i = 0; i < u->nparts && rc == 0; i++)
      if (!u->parts[i].etag[0])
        rc = ckptio_err_fmt(err, errlen, CKPTIO_E_STATE, "s3://%s/%s: part %d of %d was never written",
                            u->url.bucket, u->url.key, i + 1, u->nparts);
    if (rc == 0)
      rc = ckptio_s3_multipart_complete(self, u->url.bucket, u->url.key, u->upload_id, u->parts, u->nparts, err,
                                        errlen);
    if (rc < 0) {
      char ignored[256];
      ckptio_s3_multipart_abort(self, u->url.bucket, u->url.key, u->upload_id, ignored, sizeof(ignored));
    }
  }
  if (rc == 0) {
    char ignored[256];
    sweep w = {self, u};
    ckptio_s3_list_uploads(self, u->url.bucket, u->url.key, sweep_one, &w, ignored, sizeof(ignored));
  }
  upload_free(u);
  return rc;
}

static void s3_abandon(void *self, void *obj) {
  s3_upload *u = obj;
  char ignored[256];
  if (u->upload_id[0]) ckptio_s3_multipart_abort(self, u->url.bucket, u->url.key, u->upload_id, ignored, sizeof(ignored));
  upload_free(u);
}

/* ------------------------------------------------------------ listing */

typedef struct walk {
  const char *bucket;
  int (*fn)(void *arg, const char *path, uint64_t size);
  void *arg;
} walk;

static int walk_one(void *arg, const char *key, uint64_t size, const char *etag) {
  walk *w = arg;
  char path[CKPTIO_S3_BUCKET_MAX + CKPTIO_S3_KEY_MAX + 8];
  (void)etag;
  snprintf(path, sizeof(path), "s3://%s/%s", w->bucket, key);
  return w->fn(w->arg, path, size);
}

static int s3_list(void *self, const char *prefix, int (*fn)(void *arg, const char *path, uint64_t size), void *arg,
                   char *err, size_t errlen) {
  ckptio_s3_url u;
  int rc = ckptio_s3_url_parse(prefix, &u, err, errlen);
  walk w = {u.bucket, fn, arg};
  return rc < 0 ? rc : ckptio_s3_list_objects(self, u.bucket, u.key, walk_one, &w, err, errlen);
}

static int s3_remove(void *self, const char *path, char *err, size_t errlen) {
  ckptio_s3_url u;
  int rc = ckptio_s3_url_parse(path, &u, err, errlen);
  return rc < 0 ? rc : ckptio_s3_delete_object(self, u.bucket, u.key, err, errlen);
}

static int s3_sweep(void *self, const char *prefix, char *err, size_t errlen) {
  ckptio_s3_url u;
  int rc = ckptio_s3_url_parse(prefix, &u, err, errlen);
  rc = rc < 0 ? rc : ckptio_s3_abort_uploads(self, u.bucket, u.key, err, errlen);
  return rc < 0 ? rc : 0;
}

const ckptio_storage_ops ckptio_s3_storage_ops = {
    .size = sizeof(ckptio_storage_ops),
    .open_read = s3_open_read,
    .read = s3_read,
    .close_read = s3_close_read,
    .create = s3_create,
    .write = s3_write,
    .publish = s3_publish,
    .abandon = s3_abandon,
    .list = s3_list,
    .remove = s3_remove,
    .sweep = s3_sweep,
};
