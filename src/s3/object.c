/* Whole-object verbs: HEAD, ranged GET into the caller's buffer, PUT of a
 * small object, DELETE, and the paged ListObjectsV2. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckptio.h"
#include "core/error.h"
#include "s3/request.h"
#include "s3/s3.h"

static int check_names(const char *verb, const char *bucket, const char *key, int need_key, char *err,
                       size_t errlen) {
  if (!bucket || !*bucket)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "S3 %s: no bucket", verb);
  if (need_key && (!key || !*key))
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "S3 %s s3://%s/: no key (an object is needed)",
                          verb, bucket);
  if (key && strlen(key) > CKPTIO_S3_KEY_MAX)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "S3 %s s3://%s/%.64s...: a key is at most %d bytes",
                          verb, bucket, key, CKPTIO_S3_KEY_MAX);
  return 0;
}

int ckptio_s3_head(ckptio_s3_client *c, const char *bucket, const char *key, ckptio_s3_object *out,
                   char *err, size_t errlen) {
  if (!c || !out) return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "S3 HeadObject: NULL argument");
  int rc = check_names("HeadObject", bucket, key, 1, err, errlen);
  if (rc < 0) return rc;
  ckptio_s3_req r = {.verb = "HeadObject", .method = "HEAD", .bucket = bucket, .key = key};
  rc = ckptio_s3_request(c, &r, err, errlen);
  if (rc == 0 && r.content_length < 0) {
    char what[512];
    ckptio_s3_describe(c, &r, what, sizeof(what));
    rc = ckptio_err_fmt(err, errlen, -EIO, "%s: HTTP %ld without a Content-Length", what, r.status);
  }
  if (rc == -EACCES && err && errlen) {
    /* A HEAD reply has no body, so no S3 error Code: a one-byte GET of the
     * same key asks for it (SignatureDoesNotMatch or InvalidAccessKeyId
     * tell the user what to fix; a bare 403 does not). */
    char byte, why[CKPTIO_ERRLEN];
    const char *http;
    if (ckptio_s3_get_range(c, bucket, key, 0, 1, &byte, why, sizeof(why)) == -EACCES &&
        (http = strstr(why, ": HTTP ")) != NULL) {
      size_t len = strlen(err);
      snprintf(err + len, errlen - len, "; a GET of it says%s", http + 1);
    }
  }
  if (rc == 0) {
    out->size = (uint64_t)r.content_length;
    snprintf(out->etag, sizeof(out->etag), "%s", r.etag);
  }
  ckptio_s3_buf_free(&r.resp);
  return rc;
}

int ckptio_s3_get_range(ckptio_s3_client *c, const char *bucket, const char *key, uint64_t offset,
                        size_t len, void *buf, char *err, size_t errlen) {
  return ckptio_s3_get_range_if(c, bucket, key, NULL, offset, len, buf, err, errlen);
}

int ckptio_s3_get_range_if(ckptio_s3_client *c, const char *bucket, const char *key, const char *etag,
                           uint64_t offset, size_t len, void *buf, char *err, size_t errlen) {
  ckptio_scatter whole = {buf, len};
  if (!buf && len) return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "S3 GetObject: NULL argument");
  return ckptio_s3_get_spans_if(c, bucket, key, etag, offset, &whole, 1, err, errlen);
}

int ckptio_s3_get_spans_if(ckptio_s3_client *c, const char *bucket, const char *key, const char *etag,
                           uint64_t offset, const ckptio_scatter *spans, size_t nspans, char *err, size_t errlen) {
  if (!c || (!spans && nspans)) return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "S3 GetObject: NULL argument");
  size_t len = 0;
  for (size_t i = 0; i < nspans; i++) {
    if (spans[i].len > SIZE_MAX - len)
      return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "S3 GetObject: the spans' lengths overflow");
    len += spans[i].len;
  }
  int rc = check_names("GetObject", bucket, key, 1, err, errlen);
  if (rc < 0 || len == 0) return rc;
  if (offset + len < offset)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "S3 GetObject s3://%s/%s: range overflows", bucket,
                          key);
  ckptio_s3_req r = {.verb = "GetObject", .method = "GET", .bucket = bucket, .key = key,
                     .dst = spans, .dst_len = len, .range_off = offset, .if_match = etag};
  rc = ckptio_s3_request(c, &r, err, errlen);
  ckptio_s3_buf_free(&r.resp);
  return rc;
}

int ckptio_s3_put_object(ckptio_s3_client *c, const char *bucket, const char *key, const void *buf,
                         size_t len, char *etag_out, char *err, size_t errlen) {
  if (!c || (!buf && len)) return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "S3 PutObject: NULL argument");
  int rc = check_names("PutObject", bucket, key, 1, err, errlen);
  if (rc < 0) return rc;
  ckptio_s3_req r = {.verb = "PutObject", .method = "PUT", .bucket = bucket, .key = key,
                     .body = buf ? buf : "", .body_len = len};
  rc = ckptio_s3_request(c, &r, err, errlen);
  if (rc == 0 && etag_out) snprintf(etag_out, CKPTIO_S3_ETAG_MAX, "%s", r.etag);
  ckptio_s3_buf_free(&r.resp);
  return rc;
}

int ckptio_s3_delete_object(ckptio_s3_client *c, const char *bucket, const char *key, char *err,
                            size_t errlen) {
  if (!c) return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "S3 DeleteObject: NULL argument");
  int rc = check_names("DeleteObject", bucket, key, 1, err, errlen);
  if (rc < 0) return rc;
  ckptio_s3_req r = {.verb = "DeleteObject", .method = "DELETE", .bucket = bucket, .key = key};
  rc = ckptio_s3_request(c, &r, err, errlen);
  ckptio_s3_buf_free(&r.resp);
  return rc;
}

/* One page's <Contents> records to fn; the continuation token of the next
 * page into next (empty when this was the last). */
static int objects_page(ckptio_s3_client *c, const ckptio_s3_req *r, ckptio_s3_object_fn fn, void *arg,
                        char *next, size_t nextlen, char *err, size_t errlen) {
  const char *p = r->resp.data, *end = p ? p + r->resp.len : NULL, *b, *e;
  char key[CKPTIO_S3_KEY_MAX + 1], size[32], etag[CKPTIO_S3_ETAG_MAX], truncated[16], what[512];
  ckptio_s3_describe(c, r, what, sizeof(what));
  if (!p || !strstr(p, "ListBucketResult"))
    return ckptio_err_fmt(err, errlen, -EIO, "%s: the reply is not a ListBucketResult: %.120s", what,
                          p ? p : "empty");
  while ((p = ckptio_s3_xml_find(p, end, "Contents", &b, &e)) != NULL) {
    if (ckptio_s3_xml_text(b, e, "Key", key, sizeof(key)) < 0 || ckptio_s3_xml_text(b, e, "Size", size, sizeof(size)) < 0)
      return ckptio_err_fmt(err, errlen, -EIO, "%s: a <Contents> without a Key and Size", what);
    if (ckptio_s3_xml_text(b, e, "ETag", etag, sizeof(etag)) < 0) etag[0] = '\0';
    size_t n = strlen(etag);
    if (n >= 2 && etag[0] == '"' && etag[n - 1] == '"') {
      memmove(etag, etag + 1, n - 2);
      etag[n - 2] = '\0';
    }
    int stop = fn(arg, key, strtoull(size, NULL, 10), etag);
    if (stop) return stop;
  }
  next[0] = '\0';
  const char *all = r->resp.data;
  if (ckptio_s3_xml_text(all, all + r->resp.len, "IsTruncated", truncated, sizeof(truncated)) > 0 &&
      strcmp(truncated, "true") == 0 &&
      ckptio_s3_xml_text(all, all + r->resp.len, "NextContinuationToken", next, nextlen) <= 0)
    return ckptio_err_fmt(err, errlen, -EIO, "%s: a truncated listing without a usable NextContinuationToken", what);
  return 0;
}

int ckptio_s3_list_objects(ckptio_s3_client *c, const char *bucket, const char *prefix,
                           ckptio_s3_object_fn fn, void *arg, char *err, size_t errlen) {
  if (!c || !fn) return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "S3 ListObjectsV2: NULL argument");
  int rc = check_names("ListObjectsV2", bucket, prefix, 0, err, errlen);
  if (rc < 0) return rc;
  char token[2048] = "", query[8192];
  do {
    const char *params[4][2] = {{"list-type", "2"}, {"prefix", prefix ? prefix : ""}};
    int n = 2;
    if (c->page_size[0]) params[n][0] = "max-keys", params[n++][1] = c->page_size;
    if (token[0]) params[n][0] = "continuation-token", params[n++][1] = token;
    if (ckptio_s3_query((const char *const(*)[2])params, n, query, sizeof(query)) < 0)
      return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "S3 ListObjectsV2 s3://%s: the query is too long",
                            bucket);
    ckptio_s3_req r = {.verb = "ListObjectsV2", .method = "GET", .bucket = bucket, .query = query};
    rc = ckptio_s3_request(c, &r, err, errlen);
    if (rc == 0) rc = objects_page(c, &r, fn, arg, token, sizeof(token), err, errlen);
    ckptio_s3_buf_free(&r.resp);
  } while (rc == 0 && token[0]);
  return rc;
}
