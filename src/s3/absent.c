/* The S3 verbs in a build without libcurl's headers (CKPTIO_S3=OFF, or no
 * libcurl4-openssl-dev): each says so, so an s3:// path fails with one clear
 * sentence instead of a missing symbol. (With the headers, a machine without
 * libcurl gets curl_api.c's sentence instead, at run time.) */
#include "ckptio.h"
#include "core/error.h"
#include "s3/s3.h"

#define ABSENT(err, errlen)                                                                     \
  ckptio_err_fmt(err, errlen, CKPTIO_E_FORMAT,                                                  \
                 "S3 (s3://) is not supported by this build of ckptio: libcurl's headers were " \
                 "not found when it was built (install libcurl4-openssl-dev and rebuild)")

int ckptio_s3_client_create(const ckptio_s3_config *cfg, ckptio_s3_client **out, char *err, size_t errlen) {
  (void)cfg;
  if (out) *out = NULL;
  return ABSENT(err, errlen);
}
void ckptio_s3_client_free(ckptio_s3_client *c) { (void)c; }
void ckptio_s3_client_stats(ckptio_s3_client *c, ckptio_s3_stats *out) {
  (void)c;
  if (out) *out = (ckptio_s3_stats){0};
}
int ckptio_s3_head(ckptio_s3_client *c, const char *b, const char *k, ckptio_s3_object *o, char *err, size_t errlen) {
  (void)c, (void)b, (void)k, (void)o;
  return ABSENT(err, errlen);
}
int ckptio_s3_get_range(ckptio_s3_client *c, const char *b, const char *k, uint64_t off, size_t len, void *buf,
                        char *err, size_t errlen) {
  (void)c, (void)b, (void)k, (void)off, (void)len, (void)buf;
  return ABSENT(err, errlen);
}
int ckptio_s3_get_range_if(ckptio_s3_client *c, const char *b, const char *k, const char *etag, uint64_t off,
                           size_t len, void *buf, char *err, size_t errlen) {
  (void)c, (void)b, (void)k, (void)etag, (void)off, (void)len, (void)buf;
  return ABSENT(err, errlen);
}
int ckptio_s3_put_object(ckptio_s3_client *c, const char *b, const char *k, const void *buf, size_t len, char *etag,
                         char *err, size_t errlen) {
  (void)c, (void)b, (void)k, (void)buf, (void)len, (void)etag;
  return ABSENT(err, errlen);
}
int ckptio_s3_delete_object(ckptio_s3_client *c, const char *b, const char *k, char *err, size_t errlen) {
  (void)c, (void)b, (void)k;
  return ABSENT(err, errlen);
}
int ckptio_s3_list_objects(ckptio_s3_client *c, const char *b, const char *p, ckptio_s3_object_fn fn, void *arg,
                           char *err, size_t errlen) {
  (void)c, (void)b, (void)p, (void)fn, (void)arg;
  return ABSENT(err, errlen);
}
int ckptio_s3_multipart_create(ckptio_s3_client *c, const char *b, const char *k, char *id, char *err, size_t errlen) {
  (void)c, (void)b, (void)k, (void)id;
  return ABSENT(err, errlen);
}
int ckptio_s3_multipart_upload_part(ckptio_s3_client *c, const char *b, const char *k, const char *id, int part,
                                    const void *buf, size_t len, char *etag, char *err, size_t errlen) {
  (void)c, (void)b, (void)k, (void)id, (void)part, (void)buf, (void)len, (void)etag;
  return ABSENT(err, errlen);
}
int ckptio_s3_multipart_complete(ckptio_s3_client *c, const char *b, const char *k, const char *id,
                                 const ckptio_s3_part *parts, int n, char *err, size_t errlen) {
  (void)c, (void)b, (void)k, (void)id, (void)parts, (void)n;
  return ABSENT(err, errlen);
}
int ckptio_s3_multipart_abort(ckptio_s3_client *c, const char *b, const char *k, const char *id, char *err,
                              size_t errlen) {
  (void)c, (void)b, (void)k, (void)id;
  return ABSENT(err, errlen);
}
int ckptio_s3_list_uploads(ckptio_s3_client *c, const char *b, const char *p, ckptio_s3_upload_fn fn, void *arg,
                           char *err, size_t errlen) {
  (void)c, (void)b, (void)p, (void)fn, (void)arg;
  return ABSENT(err, errlen);
}
int ckptio_s3_abort_uploads(ckptio_s3_client *c, const char *b, const char *p, char *err, size_t errlen) {
  (void)c, (void)b, (void)p;
  return ABSENT(err, errlen);
}
