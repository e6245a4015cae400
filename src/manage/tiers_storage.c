/* The storage tier (tiers.h): a step's parts as objects STORAGE_DIR/step-N/
 * rank-R.safetensors of a storage (s3://, or a scheme registered on the
 * context), moved by the storage's own verbs (ckptio_ctx_storage). Objects
 * cannot be renamed or listed as directories, so:
 *   - a part appears whole at its publish (S3's multipart completion);
 *   - a step is published by one object, STORAGE_DIR/step-N/PUBLISHED,
 *     that rank 0 writes once every rank agreed its part is there, and
 *     removes first when the step is saved again;
 *   - the steps are what a listing of STORAGE_DIR/ finds.
 * Uploads and downloads go by TRANSFER_CHUNK pieces on a few threads (the
 * verbs are thread-safe), each with one buffer. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "manage/manage.h"
#include "manage/tiers.h"

#define TRANSFER_CHUNK ((uint64_t)16 << 20)
#define TRANSFER_THREADS 4

int tiers_obj_open(ckptio_tiers *t, char *why) {
  int rc = ckptio_ctx_storage(t->ctx, t->o.storage_dir, &t->st, &t->st_self, why, CKPTIO_ERRLEN);
  if (rc == 0) return ckptio_fail(why, CKPTIO_E_INVALID_ARG, "storage_dir %s is a local path: give it as "
                                  "durable_dir, or a storage's prefix (s3://bucket/job) here", t->o.storage_dir);
  if (rc < 0) return rc;
  const ckptio_storage_ops *s = t->st;
  if (!s->create || !s->list || !s->remove)
    return ckptio_fail(why, CKPTIO_E_INVALID_ARG, "storage_dir %s: its storage cannot create, list or remove "
                       "objects", t->o.storage_dir);
  return 0;
}

int64_t tiers_obj_size(ckptio_tiers *t, const char *path) {
  char err[CKPTIO_ERRLEN];
  void *obj;
  uint64_t size;
  int rc = t->st->open_read(t->st_self, path, &obj, &size, err, sizeof(err));
  if (rc < 0) return rc;
  t->st->close_read(t->st_self, obj);
  return (int64_t)size;
}

/* ------------------------------------------------------------- transfer */

/* One upload or download, shared by its threads. */
typedef struct transfer {
  ckptio_tiers *t;
  void *obj;
  int fd;            /* the local file */
  int upload;        /* 1: fd -> obj; 0: obj -> fd */
  uint64_t size;
  uint64_t next;     /* the next chunk's offset, under mu */
  pthread_mutex_t mu;
  int rc;            /* the first failure, under mu */
  char why[CKPTIO_ERRLEN];
} transfer;

static int move_chunk(transfer *x, unsigned char *buf, uint64_t off, size_t len, char *err) {
  const ckptio_storage_ops *s = x->t->st;
  if (x->upload) {
    for (size_t got = 0; got < len;) {
      ssize_t r = pread(x->fd, buf + got, len - got, (off_t)(off + got));
      int e = r < 0 ? -errno : -EIO;
      if (r <= 0) return ckptio_fail(err, e, "reading the local part: %s",
                                     r < 0 ? ckptio_strerror(e) : "it is shorter than it was");
      got += (size_t)r;
    }
    return s->write(x->t->st_self, x->obj, buf, len, off, err, CKPTIO_ERRLEN);
  }
  int rc = s->read(x->t->st_self, x->obj, buf, len, off, err, CKPTIO_ERRLEN);
  for (size_t put = 0; rc == 0 && put < len;) {
    ssize_t w = pwrite(x->fd, buf + put, len - put, (off_t)(off + put));
    int e = w < 0 ? -errno : -EIO;
    if (w <= 0) return ckptio_fail(err, e, "writing the local part: %s", ckptio_strerror(e));
    put += (size_t)w;
  }
  return rc;
}

static void *transfer_worker(void *arg) {
  transfer *x = arg;
  unsigned char *buf = malloc((size_t)TRANSFER_CHUNK);
  char err[CKPTIO_ERRLEN] = "";
  int rc = buf ? 0 : ckptio_fail(err, -ENOMEM, "no memory for a transfer buffer");
  for (;;) {
    pthread_mutex_lock(&x->mu);
    if (rc < 0 && x->rc == 0) x->rc = rc, memcpy(x->why, err, sizeof(err));
    uint64_t off = x->next;
    int stop = x->rc < 0 || off >= x->size;
    if (!stop) x->next += TRANSFER_CHUNK;
    pthread_mutex_unlock(&x->mu);
    if (stop) break;
    uint64_t len = x->size - off < TRANSFER_CHUNK ? x->size - off : TRANSFER_CHUNK;
    rc = move_chunk(x, buf, off, (size_t)len, err);
  }
  free(buf);
  return NULL;
}

/* Every chunk of x moved, on up to TRANSFER_THREADS threads (the caller's
 * one of them). @return 0 or the first failure, with x->why. */
static int run_transfer(transfer *x) {
  pthread_t th[TRANSFER_THREADS - 1];
  int started = 0;
  pthread_mutex_init(&x->mu, NULL);
  uint64_t chunks = (x->size + TRANSFER_CHUNK - 1) / TRANSFER_CHUNK;
  for (; started < TRANSFER_THREADS - 1 && (uint64_t)started + 1 < chunks; started++)
    if (pthread_create(&th[started], NULL, transfer_worker, x) != 0) break;
  transfer_worker(x);
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  pthread_mutex_destroy(&x->mu);
  return x->rc;
}

/* why = "PATH: <errno's text>". @return -errno. */
static int fail_errno(char *why, const char *path) {
  int e = -errno;
  return ckptio_fail(why, e, "%s: %s", path, ckptio_strerror(e));
}

int tiers_obj_upload(ckptio_tiers *t, const char *src, const char *dst, char *why) {
  transfer x = {.t = t, .upload = 1};
  int64_t size = tiers_file_size(src);
  if (size < 0) return ckptio_fail(why, (int)size, "%s: %s", src, ckptio_strerror((int)size));
  x.size = (uint64_t)size;
  if ((x.fd = open(src, O_RDONLY | O_CLOEXEC)) < 0) return fail_errno(why, src);
  int rc = t->st->create(t->st_self, dst, x.size, TRANSFER_CHUNK, &x.obj, why, CKPTIO_ERRLEN);
  if (rc == 0) {
    rc = run_transfer(&x);
    if (rc < 0) {
      ckptio_fail(why, rc, "uploading %s to %s: %s", src, dst, x.why);
      t->st->abandon(t->st_self, x.obj);
    } else {
      rc = t->st->publish(t->st_self, x.obj, why, CKPTIO_ERRLEN);
    }
  }
  close(x.fd);
  return rc;
}

int tiers_obj_download(ckptio_tiers *t, const char *src, const char *dst, char *why) {
  transfer x = {.t = t};
  char tmp[4200];
  int rc = t->st->open_read(t->st_self, src, &x.obj, &x.size, why, CKPTIO_ERRLEN);
  if (rc < 0) return rc;
  snprintf(tmp, sizeof(tmp), "%s.%d.tmp", dst, (int)getpid());
  if ((x.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666)) < 0) {
    rc = fail_errno(why, tmp);
  } else {
    rc = run_transfer(&x);
    if (rc < 0) ckptio_fail(why, rc, "downloading %s: %s", src, x.why);
    if (close(x.fd) != 0 && rc == 0) rc = fail_errno(why, tmp);
    if (rc == 0 && rename(tmp, dst) != 0) rc = fail_errno(why, dst);
    if (rc < 0) unlink(tmp);
  }
  t->st->close_read(t->st_self, x.obj);
  return rc;
}

/* ---------------------------------------------------------------- marks */

int tiers_obj_mark(ckptio_tiers *t, uint64_t step, char *why) {
  char path[4096], text[32];
  int rc = tiers_mark_path(path, sizeof(path), t->o.storage_dir, step, TIERS_PUBLISHED);
  if (rc < 0) return ckptio_fail(why, rc, "%s: the path is too long", t->o.storage_dir);
  int n = snprintf(text, sizeof(text), "%" PRIu64 "\n", step);
  void *obj;
  rc = t->st->create(t->st_self, path, (uint64_t)n, (uint64_t)n, &obj, why, CKPTIO_ERRLEN);
  if (rc < 0) return rc;
  rc = t->st->write(t->st_self, obj, text, (size_t)n, 0, why, CKPTIO_ERRLEN);
  if (rc < 0) {
    t->st->abandon(t->st_self, obj);
    return rc;
  }
  return t->st->publish(t->st_self, obj, why, CKPTIO_ERRLEN);
}

void tiers_obj_unmark(ckptio_tiers *t, uint64_t step) {
  char path[4096], err[CKPTIO_ERRLEN];
  if (tiers_mark_path(path, sizeof(path), t->o.storage_dir, step, TIERS_PUBLISHED) == 0)
    t->st->remove(t->st_self, path, err, sizeof(err));
}

/* -------------------------------------------------------------- listing */

int tiers_obj_scan(ckptio_tiers *t, mgr_objs *o, char *why) {
  char base[4096];
  if (snprintf(base, sizeof(base), "%s/", t->o.storage_dir) >= (int)sizeof(base)) {
    memset(o, 0, sizeof(*o));
    return ckptio_fail(why, -ENAMETOOLONG, "%s: the path is too long", t->o.storage_dir);
  }
  return mgr_objs_list(t->st, t->st_self, t->o.storage_dir, base, o, why, CKPTIO_ERRLEN);
}

int64_t tiers_objs_size(const mgr_objs *o, uint64_t step, const char *name) {
  for (size_t i = 0; i < o->n; i++)
    if (o->v[i].step == step && !strcmp(o->v[i].name, name)) return (int64_t)o->v[i].size;
  return -ENOENT;
}

/* Removes the objects v[0, n) of one step: the mark first, so the step stops
 * being published before any part of it goes; then what an upload of it
 * left unpublished. */
static void remove_step(ckptio_tiers *t, const mgr_obj *v, size_t n) {
  char dir[4096], path[8192], err[CKPTIO_ERRLEN];
  uint64_t step = v[0].step;
  if (tiers_path(dir, sizeof(dir), t->o.storage_dir, step, NULL, 0) < 0) return;
  tiers_obj_unmark(t, step);
  for (size_t i = 0; i < n; i++) {
    if (strcmp(v[i].name, TIERS_PUBLISHED) == 0) continue;
    snprintf(path, sizeof(path), "%s/%s", dir, v[i].name);
    t->st->remove(t->st_self, path, err, sizeof(err));
  }
  if (t->st->sweep) {
    snprintf(path, sizeof(path), "%s/", dir);
    t->st->sweep(t->st_self, path, err, sizeof(err));
  }
}

void tiers_obj_retire(ckptio_tiers *t, uint64_t current) {
  mgr_objs o;
  char why[CKPTIO_ERRLEN];
  if (t->comm.rank != 0 || tiers_obj_scan(t, &o, why) < 0) return;
  int kept = 0;
  /* The listing is sorted by step: its groups of one step, newest first. */
  for (size_t end = o.n, start; end > 0; end = start) {
    uint64_t step = o.v[end - 1].step;
    for (start = end; start > 0 && o.v[start - 1].step == step;) start--;
    if (step > current) continue; /* a save under way (see tiers_retire) */
    int marked = tiers_objs_size(&o, step, TIERS_PUBLISHED) >= 0;
    if (step == current || (marked && kept < t->o.storage_keep)) {
      kept += marked;
      continue;
    }
    remove_step(t, o.v + start, end - start);
  }
  mgr_objs_free(&o);
}
