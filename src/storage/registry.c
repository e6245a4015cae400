/* The storages of a context (storage.h). */
#include "storage/storage.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/sized.h"

#define SCHEMES_MAX 16
#define SCHEME_MAX 31

typedef struct entry {
  char scheme[SCHEME_MAX + 1];
  ckptio_storage st;
  int builtin;  /* made by find (self freed with the table) */
} entry;

struct ckptio_storages {
  pthread_mutex_t mu;  /* the built-in S3 storage is made by the first open */
  entry e[SCHEMES_MAX];
  size_t n;
};

int ckptio_storages_create(ckptio_storages **out) {
  ckptio_storages *t = calloc(1, sizeof(*t));
  if (!t) return -ENOMEM;
  pthread_mutex_init(&t->mu, NULL);
  *out = t;
  return 0;
}

void ckptio_storages_free(ckptio_storages *t) {
  if (!t) return;
  for (size_t i = 0; i < t->n; i++)
    if (t->e[i].builtin) ckptio_s3_storage_free(t->e[i].st.self);
  pthread_mutex_destroy(&t->mu);
  free(t);
}

/* RFC 3986's scheme (a letter, then letters, digits, '+', '-', '.') and
 * "://": the one rule of what is a storage's path, for the library, the
 * manager, the command and the Python package. */
size_t ckptio_path_scheme(const char *path) {
  if (!path) return 0;
  size_t n = 0;
  while ((path[n] >= 'a' && path[n] <= 'z') || (path[n] >= 'A' && path[n] <= 'Z') ||
         (n && ((path[n] >= '0' && path[n] <= '9') || path[n] == '+' || path[n] == '-' || path[n] == '.')))
    n++;
  return n && !strncmp(path + n, "://", 3) ? n : 0;
}

static entry *lookup(ckptio_storages *t, const char *scheme, size_t len) {
  for (size_t i = 0; i < t->n; i++)
    if (strlen(t->e[i].scheme) == len && !strncmp(t->e[i].scheme, scheme, len)) return &t->e[i];
  return NULL;
}

int ckptio_storages_register(ckptio_storages *t, const char *scheme, const ckptio_storage_ops *ops, void *self,
                             char *err, size_t errlen) {
  char probe[SCHEME_MAX + 4];
  size_t len = scheme ? strlen(scheme) : 0;
  if (!len || len > SCHEME_MAX || !ops)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "storage scheme %s%s%s: %s", scheme ? "'" : "",
                          scheme ? scheme : "NULL", scheme ? "'" : "",
                          !ops ? "no table of verbs" : "1 to 31 letters, digits, '+', '-' or '.'");
  memcpy(probe, scheme, len);
  memcpy(probe + len, "://", 4);
  if (ckptio_path_scheme(probe) != len || !strcmp(scheme, "file"))
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG,
                          "storage scheme '%s': a letter then letters, digits, '+', '-' or '.', and not \"file\"",
                          scheme);
  ckptio_storage_ops o;
  memset(&o, 0, sizeof(o));
  int rc = ckptio_sized_in(ops, &o, sizeof(o), "ckptio_storage_ops", err, errlen);
  if (rc < 0) return rc;
  int writes = !!o.create + !!o.write + !!o.publish + !!o.abandon;
  if (!o.open_read || !o.read || !o.close_read || (writes && writes != 4))
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG,
                          "storage '%s': open_read, read and close_read are required, and create, write, "
                          "publish and abandon all or none",
                          scheme);
  pthread_mutex_lock(&t->mu);
  entry *e = lookup(t, scheme, len);
  if (!e && t->n == SCHEMES_MAX) rc = -ENOMEM;
  if (!e && !rc) e = &t->e[t->n++];
  if (e) {
    if (e->builtin) ckptio_s3_storage_free(e->st.self);
    memset(e, 0, sizeof(*e));
    memcpy(e->scheme, scheme, len);
    e->st.ops = o;
    e->st.self = self;
  }
  pthread_mutex_unlock(&t->mu);
  if (rc < 0) ckptio_err_fmt(err, errlen, rc, "storage '%s': %d schemes are registered already", scheme, SCHEMES_MAX);
  return rc;
}

int ckptio_storages_find(ckptio_storages *t, const char *path, const ckptio_storage **out, char *err,
                         size_t errlen) {
  size_t len = ckptio_path_scheme(path);
  if (!len || (len == 4 && !strncmp(path, "file", 4))) return 0;
  int rc = 1;
  pthread_mutex_lock(&t->mu);
  entry *e = lookup(t, path, len);
  if (!e && len == 2 && !strncmp(path, "s3", 2)) {
    void *self = NULL;
    if (t->n == SCHEMES_MAX) rc = ckptio_err_fmt(err, errlen, -ENOMEM, "%s: no room for the S3 storage", path);
    else if ((rc = ckptio_s3_storage_create(&self, err, errlen)) < 0) {
      /* The client's sentence (no libcurl, no credentials) names no path:
       * say which open it failed. */
      char why[CKPTIO_ERRLEN];
      snprintf(why, sizeof(why), "%s", err ? err : "");
      ckptio_err_fmt(err, errlen, rc, "%s: %s", path, why);
    } else {
      e = &t->e[t->n++];
      memset(e, 0, sizeof(*e));
      memcpy(e->scheme, "s3", 2);
      e->st.ops = ckptio_s3_storage_ops;
      e->st.self = self;
      e->builtin = 1;
      rc = 1;
    }
  } else if (!e) {
    rc = ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG,
                        "%s: no storage is registered for '%.*s://' on this context (ckptio_ctx_storage_register)",
                        path, (int)len, path);
  }
  if (e) *out = &e->st;
  pthread_mutex_unlock(&t->mu);
  return rc;
}
