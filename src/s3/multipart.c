/* Multipart uploads: create, parts from many threads, complete (the
 * atomic commit), abort, and the listing and abort of the uploads a
 * crashed save left open. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckptio.h"
#include "core/error.h"
#include "s3/request.h"
#include "s3/s3.h"

static int need(const char *verb, const void *a, const char *bucket, const char *key, char *err, size_t errlen) {
  if (!a || !bucket || !*bucket || !key || !*key)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "S3 %s: NULL argument, or no bucket or key", verb);
  if (strlen(key) > CKPTIO_S3_KEY_MAX)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "S3 %s s3://%s/%.64s...: a key is at most %d bytes",
                          verb, bucket, key, CKPTIO_S3_KEY_MAX);
  return 0;
}

int ckptio_s3_multipart_create(ckptio_s3_client *c, const char *bucket, const char *key,
                               char *upload_id, char *err, size_t errlen) {
  int rc = need("CreateMultipartUpload", c && upload_id ? c : NULL, bucket, key, err, errlen);
  if (rc < 0) return rc;
  const char *params[][2] = {{"uploads", ""}};
  char query[32], what[512];
  ckptio_s3_query(params, 1, query, sizeof(query));
  ckptio_s3_req r = {.verb = "CreateMultipartUpload", .method = "POST", .bucket = bucket, .key = key,
                     .query = query};
  rc = ckptio_s3_request(c, &r, err, errlen);
  if (rc == 0 && ckptio_s3_xml_text(r.resp.data, r.resp.data + r.resp.len, "UploadId", upload_id,
                                    CKPTIO_S3_UPLOAD_ID_MAX) <= 0) {
    ckptio_s3_describe(c, &r, what, sizeof(what));
    rc = ckptio_err_fmt(err, errlen, -EIO, "%s: no usable UploadId in the reply: %.120s", what,
                        r.resp.data ? r.resp.data : "empty");
  }
  ckptio_s3_buf_free(&r.resp);
  return rc;
}

int ckptio_s3_multipart_upload_part(ckptio_s3_client *c, const char *bucket, const char *key,
                                    const char *upload_id, int part, const void *buf, size_t len,
                                    char *etag, char *err, size_t errlen) {
  int rc = need("UploadPart", c && upload_id && etag && (buf || !len) ? c : NULL, bucket, key, err, errlen);
  if (rc < 0) return rc;
  if (part < 1 || part > CKPTIO_S3_PARTS_MAX)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "S3 UploadPart s3://%s/%s: part number %d outside 1..%d",
                          bucket, key, part, CKPTIO_S3_PARTS_MAX);
  char num[16], query[3 * CKPTIO_S3_UPLOAD_ID_MAX + 64], what[512];
  snprintf(num, sizeof(num), "%d", part);
  const char *params[][2] = {{"partNumber", num}, {"uploadId", upload_id}};
  if (ckptio_s3_query(params, 2, query, sizeof(query)) < 0)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "S3 UploadPart: upload id too long");
  ckptio_s3_req r = {.verb = "UploadPart", .method = "PUT", .bucket = bucket, .key = key, .query = query,
                     .body = buf ? buf : "", .body_len = len};
  rc = ckptio_s3_request(c, &r, err, errlen);
  if (rc == 0 && !r.etag[0]) {
    ckptio_s3_describe(c, &r, what, sizeof(what));
    rc = ckptio_err_fmt(err, errlen, -EIO, "%s: HTTP %ld without an ETag for part %d", what, r.status, part);
  }
  if (rc == 0) snprintf(etag, CKPTIO_S3_ETAG_MAX, "%s", r.etag);
  ckptio_s3_buf_free(&r.resp);
  return rc;
}

int ckptio_s3_multipart_complete(ckptio_s3_client *c, const char *bucket, const char *key,
                                 const char *upload_id, const ckptio_s3_part *parts, int nparts,
                                 char *err, size_t errlen) {
  int rc = need("CompleteMultipartUpload", c && upload_id && parts ? c : NULL, bucket, key, err, errlen);
  if (rc < 0) return rc;
  if (nparts < 1 || nparts > CKPTIO_S3_PARTS_MAX)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG,
                          "S3 CompleteMultipartUpload s3://%s/%s: %d parts, S3 takes 1..%d", bucket, key, nparts,
                          CKPTIO_S3_PARTS_MAX);
  /* Part records are < 256 bytes each: an ETag is quoted, never escaped
   * (S3's are hex, and a '"', '<' or '&' is refused below). */
  size_t cap = 128 + (size_t)nparts * (64 + CKPTIO_S3_ETAG_MAX);
  char *xml = malloc(cap), query[3 * CKPTIO_S3_UPLOAD_ID_MAX + 32], what[512];
  if (!xml) return ckptio_err_fmt(err, errlen, -ENOMEM, "S3 CompleteMultipartUpload: out of memory");
  size_t n = (size_t)snprintf(xml, cap, "<CompleteMultipartUpload>");
  for (int i = 0; i < nparts; i++) {
    if (strpbrk(parts[i].etag, "\"<>&") || (i > 0 && parts[i].number <= parts[i - 1].number)) {
      rc = ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG,
                          "S3 CompleteMultipartUpload s3://%s/%s: part %d (number %d) is out of order or has a "
                          "bad ETag", bucket, key, i, parts[i].number);
      goto done;
    }
    n += (size_t)snprintf(xml + n, cap - n, "<Part><PartNumber>%d</PartNumber><ETag>\"%s\"</ETag></Part>",
                          parts[i].number, parts[i].etag);
  }
  n += (size_t)snprintf(xml + n, cap - n, "</CompleteMultipartUpload>");
  const char *params[][2] = {{"uploadId", upload_id}};
  if (ckptio_s3_query(params, 1, query, sizeof(query)) < 0) {
    rc = ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "S3 CompleteMultipartUpload: upload id too long");
    goto done;
  }
  ckptio_s3_req r = {.verb = "CompleteMultipartUpload", .method = "POST", .bucket = bucket, .key = key,
                     .query = query, .body = xml, .body_len = n};
  rc = ckptio_s3_request(c, &r, err, errlen);
  if (rc == CKPTIO_E_NOT_FOUND && r.attempts > 1) {
    /* The first try may have committed with its reply lost; the upload is
     * then gone. Say so rather than guess. */
    size_t len = err ? strlen(err) : 0;
    if (err && len + 1 < errlen)
      snprintf(err + len, errlen - len, " (an earlier attempt may have completed the upload before its reply was lost)");
  }
  if (rc == 0) {
    /* S3 may answer 200 and put the failure in the body. */
    char code[64] = "", msg[256] = "";
    const char *p = r.resp.data, *end = p ? p + r.resp.len : NULL;
    if (p && strstr(p, "<Error>")) {
      ckptio_s3_xml_text(p, end, "Code", code, sizeof(code));
      ckptio_s3_xml_text(p, end, "Message", msg, sizeof(msg));
      ckptio_s3_describe(c, &r, what, sizeof(what));
      rc = ckptio_err_fmt(err, errlen, -EIO, "%s: HTTP %ld with an error in the body: %s: %s", what, r.status, code, msg);
    } else if (!p || !strstr(p, "CompleteMultipartUploadResult")) {
      ckptio_s3_describe(c, &r, what, sizeof(what));
      rc = ckptio_err_fmt(err, errlen, -EIO, "%s: HTTP %ld without a CompleteMultipartUploadResult: %.120s", what,
                          r.status, p ? p : "empty");
    }
  }
  ckptio_s3_buf_free(&r.resp);
done:
  free(xml);
  return rc;
}

int ckptio_s3_multipart_abort(ckptio_s3_client *c, const char *bucket, const char *key,
                              const char *upload_id, char *err, size_t errlen) {
  int rc = need("AbortMultipartUpload", c && upload_id ? c : NULL, bucket, key, err, errlen);
  if (rc < 0) return rc;
  char query[3 * CKPTIO_S3_UPLOAD_ID_MAX + 32];
  const char *params[][2] = {{"uploadId", upload_id}};
  if (ckptio_s3_query(params, 1, query, sizeof(query)) < 0)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "S3 AbortMultipartUpload: upload id too long");
  ckptio_s3_req r = {.verb = "AbortMultipartUpload", .method = "DELETE", .bucket = bucket, .key = key,
                     .query = query};
  rc = ckptio_s3_request(c, &r, err, errlen);
  ckptio_s3_buf_free(&r.resp);
  if (rc == CKPTIO_E_NOT_FOUND && r.status == 404) {
    /* Already gone: what abort wanted, unless the bucket is what is missing. */
    if (!err || !strstr(err, "NoSuchBucket")) {
      if (err && errlen) err[0] = '\0';
      rc = 0;
    }
  }
  return rc;
}

int ckptio_s3_list_uploads(ckptio_s3_client *c, const char *bucket, const char *prefix,
                           ckptio_s3_upload_fn fn, void *arg, char *err, size_t errlen) {
  if (!c || !fn || !bucket || !*bucket)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "S3 ListMultipartUploads: NULL argument or no bucket");
  char key_marker[CKPTIO_S3_KEY_MAX + 1] = "", id_marker[CKPTIO_S3_UPLOAD_ID_MAX] = "", query[8192];
  char key[CKPTIO_S3_KEY_MAX + 1], id[CKPTIO_S3_UPLOAD_ID_MAX], truncated[16], what[512];
  int rc = 0, more;
  do {
    const char *params[5][2] = {{"uploads", ""}, {"prefix", prefix ? prefix : ""}};
    int n = 2;
    if (c->page_size[0]) params[n][0] = "max-uploads", params[n++][1] = c->page_size;
    if (key_marker[0]) {
      params[n][0] = "key-marker", params[n++][1] = key_marker;
      params[n][0] = "upload-id-marker", params[n++][1] = id_marker;
    }
    if (ckptio_s3_query((const char *const(*)[2])params, n, query, sizeof(query)) < 0)
      return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "S3 ListMultipartUploads s3://%s: query too long",
                            bucket);
    ckptio_s3_req r = {.verb = "ListMultipartUploads", .method = "GET", .bucket = bucket, .query = query};
    rc = ckptio_s3_request(c, &r, err, errlen);
    more = 0;
    if (rc == 0) {
      const char *p = r.resp.data, *end = p ? p + r.resp.len : NULL, *b, *e;
      ckptio_s3_describe(c, &r, what, sizeof(what));
      if (!p || !strstr(p, "ListMultipartUploadsResult"))
        rc = ckptio_err_fmt(err, errlen, -EIO, "%s: the reply is not a ListMultipartUploadsResult: %.120s", what,
                            p ? p : "empty");
      key[0] = id[0] = '\0';
      while (rc == 0 && (p = ckptio_s3_xml_find(p, end, "Upload", &b, &e)) != NULL) {
        if (ckptio_s3_xml_text(b, e, "Key", key, sizeof(key)) < 0 ||
            ckptio_s3_xml_text(b, e, "UploadId", id, sizeof(id)) <= 0)
          rc = ckptio_err_fmt(err, errlen, -EIO, "%s: an <Upload> without a Key and UploadId", what);
        else
          rc = fn(arg, key, id);
      }
      const char *all = r.resp.data;
      if (rc == 0 && ckptio_s3_xml_text(all, end, "IsTruncated", truncated, sizeof(truncated)) > 0 &&
          strcmp(truncated, "true") == 0) {
        /* The next page starts after the markers, or (SeaweedFS 4.48 sends
         * none) after the last upload of this page. */
        char next_key[sizeof(key_marker)], next_id[sizeof(id_marker)];
        if (ckptio_s3_xml_text(all, end, "NextKeyMarker", next_key, sizeof(next_key)) <= 0)
          snprintf(next_key, sizeof(next_key), "%s", key);
        if (ckptio_s3_xml_text(all, end, "NextUploadIdMarker", next_id, sizeof(next_id)) <= 0)
          snprintf(next_id, sizeof(next_id), "%s", id);
        if (!next_key[0] || (!strcmp(next_key, key_marker) && !strcmp(next_id, id_marker)))
          rc = ckptio_err_fmt(err, errlen, -EIO, "%s: a truncated listing that does not say where the next page "
                              "starts", what);
        snprintf(key_marker, sizeof(key_marker), "%s", next_key);
        snprintf(id_marker, sizeof(id_marker), "%s", next_id);
        more = rc == 0;
      }
    }
    ckptio_s3_buf_free(&r.resp);
  } while (more);
  return rc;
}

typedef struct {
  char **keys, **ids;
  int n, cap, oom;
} upload_list;

static int collect(void *arg, const char *key, const char *id) {
  upload_list *l = arg;
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 16;
    char **k = realloc(l->keys, (size_t)cap * sizeof(*k));
    if (k) l->keys = k;
    char **i = k ? realloc(l->ids, (size_t)cap * sizeof(*i)) : NULL;
    if (i) l->ids = i;
    if (!k || !i) return l->oom = -ENOMEM;
    l->cap = cap;
  }
  l->keys[l->n] = strdup(key);
  l->ids[l->n] = strdup(id);
  if (!l->keys[l->n] || !l->ids[l->n]) {
    free(l->keys[l->n]);
    free(l->ids[l->n]);
    return l->oom = -ENOMEM;
  }
  l->n++;
  return 0;
}

int ckptio_s3_abort_uploads(ckptio_s3_client *c, const char *bucket, const char *prefix, char *err,
                            size_t errlen) {
  /* List, then abort what was listed (aborting while paging would move the
   * markers under the listing), and list again until nothing is left: a
   * server whose paging skips uploads (SeaweedFS 4.48 pages them by upload
   * id but takes a key marker) still gets swept. Stops when a round
   * aborts nothing. */
  int aborted = 0, first = 0, rc = 0;
  char one[CKPTIO_ERRLEN];
  for (int round = 0; round < 100 && rc == 0 && !first; round++) {
    upload_list l = {0};
    rc = ckptio_s3_list_uploads(c, bucket, prefix, collect, &l, err, errlen);
    if (rc == -ENOMEM && l.oom) ckptio_err_fmt(err, errlen, rc, "S3 abort uploads s3://%s: out of memory", bucket);
    int this_round = 0;
    for (int i = 0; i < l.n; i++) {
      if (rc == 0) {
        int r = ckptio_s3_multipart_abort(c, bucket, l.keys[i], l.ids[i], one, sizeof(one));
        if (r == 0) {
          this_round++;
        } else if (!first) {
          first = r;
          if (err && errlen) snprintf(err, errlen, "%s", one);
        }
      }
      free(l.keys[i]);
      free(l.ids[i]);
    }
    free(l.keys);
    free(l.ids);
    aborted += this_round;
    if (this_round == 0) break;
  }
  if (rc < 0) return rc;
  return first < 0 ? first : aborted;
}
