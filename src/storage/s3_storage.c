/* The built-in S3 storage (storage.h): the public verbs over the S3
 * client room, one client (with its pool of keep-alive connections) per
 * context, made from the environment on the first s3:// open. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "s3/s3.h"
#include "storage/storage.h"

typedef struct s3_object {
  ckptio_s3_url url;
  uint64_t size;
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
  *obj = o;
  *size = head.size;
  return 0;
}

static int s3_read(void *self, void *obj, void *buf, size_t len, uint64_t offset, char *err, size_t errlen) {
  s3_object *o = obj;
  return ckptio_s3_get_range(self, o->url.bucket, o->url.key, offset, len, buf, err, errlen);
}

static void s3_close_read(void *self, void *obj) {
  (void)self;
  free(obj);
}

const ckptio_storage_ops ckptio_s3_storage_ops = {
    .size = sizeof(ckptio_storage_ops),
    .open_read = s3_open_read,
    .read = s3_read,
    .close_read = s3_close_read,
};
