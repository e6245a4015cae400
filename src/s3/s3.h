/* The S3 client room (issue 27): the verbs an S3-compatible storage backend
 * needs, over libcurl with its built-in AWS SigV4 signing (libcurl loaded
 * at run time by the first client: curl_api.h). Calls core and libc and
 * libcurl only; knows nothing of checkpoints.
 *
 * Every call returns 0 (or a count) or a negative code, and on failure
 * writes one sentence into err naming the method, the URL, the HTTP status
 * and S3's error Code and Message (or curl's text for a transport failure):
 *   CKPTIO_E_NOT_FOUND     NoSuchBucket, NoSuchKey, NoSuchUpload (404)
 *   -EACCES                InvalidAccessKeyId, SignatureDoesNotMatch,
 *                          AccessDenied, ExpiredToken (403)
 *   CKPTIO_E_INVALID_ARG   a malformed URL or argument; S3's 400s
 *                          (EntityTooSmall, InvalidPart, ...)
 *   CKPTIO_E_SHORT_IO      a body shorter or longer than the range asked,
 *                          a Content-Range that is not the range asked,
 *                          a range past the object's end (416)
 *   CKPTIO_E_FORMAT        this build has no S3 support (no libcurl
 *                          headers), or libcurl 4 could not be loaded at
 *                          run time (curl_api.h)
 *   -ECONNREFUSED, -ECONNRESET, -ETIMEDOUT, -EHOSTUNREACH   transport
 *   -ESTALE                the object changed since the ETag a read was
 *                          made against (412 PreconditionFailed)
 *   -EAGAIN                still throttled (503 SlowDown, 429) after retries
 *   -EIO                   still a server error (5xx) after retries, or
 *                          another HTTP status
 * Throttling, 5xx, resets, refused connections and truncated bodies are
 * retried with capped exponential backoff and full jitter, up to
 * max_attempts attempts in all; the message then says how many. */
#ifndef CKPTIO_S3_S3_H
#define CKPTIO_S3_S3_H

#include <stddef.h>
#include <stdint.h>

#include "core/scatter.h"

#define CKPTIO_S3_BUCKET_MAX 63
#define CKPTIO_S3_KEY_MAX 1024
#define CKPTIO_S3_ETAG_MAX 128
#define CKPTIO_S3_UPLOAD_ID_MAX 1024
#define CKPTIO_S3_PART_MIN (5u << 20)  /* S3's smallest part but the last */
#define CKPTIO_S3_PARTS_MAX 10000
#define CKPTIO_S3_PART_MAX (5ull << 30) /* S3's largest part */
#define CKPTIO_S3_OBJECT_MAX (5ull << 40) /* and object (5 TiB) */

/* ------------------------------------------------------------ url (url.c) */

/* s3://bucket/key split. The key may be empty ("s3://bucket" or
 * "s3://bucket/": a prefix); a caller that needs an object checks it. */
typedef struct ckptio_s3_url {
  char bucket[CKPTIO_S3_BUCKET_MAX + 1];
  char key[CKPTIO_S3_KEY_MAX + 1];
} ckptio_s3_url;

/* 1 when path starts with "s3://" (the caller should take the S3 road). */
int ckptio_s3_is_url(const char *path);
/* Parses s3://bucket[/key]: the bucket by S3's naming rules (3-63 of
 * a-z 0-9 . -, a letter or digit at each end), the key at most 1024 bytes.
 * @return 0, or CKPTIO_E_INVALID_ARG with why. Needs no libcurl. */
int ckptio_s3_url_parse(const char *url, ckptio_s3_url *out, char *err, size_t errlen);

/* ------------------------------------------------------------ config */

/* Where and as whom. A NULL string is taken from the environment as AWS
 * tools take it: AWS_ENDPOINT_URL_S3 then AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
 * AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION then
 * AWS_DEFAULT_REGION (then "us-east-1"). Strings are copied at create. A
 * zero number takes its default. */
typedef struct ckptio_s3_config {
  const char *endpoint;      /* "http://127.0.0.1:8333": path-style
                                addressing; NULL and none in the
                                environment: AWS itself,
                                https://BUCKET.s3.REGION.amazonaws.com */
  const char *region;
  const char *access_key;
  const char *secret_key;
  const char *session_token; /* sent as x-amz-security-token */
  int max_attempts;          /* tries per request in all; default 5 */
  int backoff_base_ms;       /* first retry waits up to this; default 50 */
  int backoff_max_ms;        /* cap of one wait; default 5000 */
  int connect_timeout_ms;    /* default 10000 */
  int low_speed_seconds;     /* a transfer slower than low_speed_bytes per
                                second for this long fails (a server gone
                                silent); default 30 */
  int low_speed_bytes;       /* default 1 */
  int list_page_size;        /* max-keys / max-uploads of a listing page;
                                0: the server's default (1000) */
} ckptio_s3_config;

/* ------------------------------------------------------------ client */

/* A client: the credentials, and a pool of libcurl handles each keeping
 * its connection alive between requests. Every call below may run on many
 * threads at once on one client (each takes its own handle from the pool);
 * create and free may not race with them. */
typedef struct ckptio_s3_client ckptio_s3_client;

/* cfg NULL: everything from the environment. The first call of the process
 * loads libcurl (curl_api.h). Fails with CKPTIO_E_INVALID_ARG when no
 * credentials are found, CKPTIO_E_FORMAT in a build without libcurl's
 * headers or when libcurl 4 cannot be loaded (the sentence says how to
 * install it). */
int ckptio_s3_client_create(const ckptio_s3_config *cfg, ckptio_s3_client **out, char *err,
                            size_t errlen);
void ckptio_s3_client_free(ckptio_s3_client *c); /* NULL accepted */

/* What the client did, summed over every thread (for tests and benches). */
typedef struct ckptio_s3_stats {
  uint64_t requests; /* calls that sent at least one request */
  uint64_t attempts; /* HTTP requests sent, retries included */
  uint64_t retries;  /* attempts that were retries */
  uint64_t connects; /* new connections opened (the rest reused one) */
  uint64_t bytes_in, bytes_out; /* bodies */
} ckptio_s3_stats;
void ckptio_s3_client_stats(ckptio_s3_client *c, ckptio_s3_stats *out);

/* ------------------------------------------------------------ objects */

typedef struct ckptio_s3_object {
  uint64_t size;
  char etag[CKPTIO_S3_ETAG_MAX]; /* with S3's quotes removed */
} ckptio_s3_object;

/* HEAD: the object's size and ETag. A missing one: CKPTIO_E_NOT_FOUND. */
int ckptio_s3_head(ckptio_s3_client *c, const char *bucket, const char *key, ckptio_s3_object *out,
                   char *err, size_t errlen);

/* GET of bytes [offset, offset + len) into buf (the caller's, len bytes).
 * Succeeds only when exactly those bytes arrived: a 206 whose Content-Range
 * is the range asked and a body of len bytes (a whole-object 200 only for
 * offset 0 and an object of len bytes). len 0 sends nothing. */
int ckptio_s3_get_range(ckptio_s3_client *c, const char *bucket, const char *key, uint64_t offset,
                        size_t len, void *buf, char *err, size_t errlen);

/* The same, only while the object still has ETag etag (from head; NULL
 * or "": any): a load's many GETs all read the object it opened, and one
 * replaced meanwhile by a new save fails with -ESTALE (S3's 412
 * PreconditionFailed) instead of mixing two versions' bytes. */
int ckptio_s3_get_range_if(ckptio_s3_client *c, const char *bucket, const char *key, const char *etag,
                           uint64_t offset, size_t len, void *buf, char *err, size_t errlen);

/* ckptio_s3_get_range_if of bytes [offset, offset + the spans' lengths)
 * with one GET, its body scattered to the spans in order: the bytes of
 * several tensors that lie in one stretch of the object go straight to
 * their destinations. */
int ckptio_s3_get_spans_if(ckptio_s3_client *c, const char *bucket, const char *key, const char *etag,
                           uint64_t offset, const ckptio_scatter *spans, size_t nspans, char *err, size_t errlen);

/* PUT of a whole small object (an index, a `latest` record). etag_out may
 * be NULL; else CKPTIO_S3_ETAG_MAX bytes. */
int ckptio_s3_put_object(ckptio_s3_client *c, const char *bucket, const char *key, const void *buf,
                         size_t len, char *etag_out, char *err, size_t errlen);

/* DELETE. S3 answers 204 for a key that is not there too. */
int ckptio_s3_delete_object(ckptio_s3_client *c, const char *bucket, const char *key, char *err,
                            size_t errlen);

/* Every object under prefix ("" for all), in key order, page after page;
 * fn's nonzero return stops the walk and is returned. key is borrowed for
 * the call. @return 0, fn's value, or an error. */
typedef int (*ckptio_s3_object_fn)(void *arg, const char *key, uint64_t size, const char *etag);
int ckptio_s3_list_objects(ckptio_s3_client *c, const char *bucket, const char *prefix,
                           ckptio_s3_object_fn fn, void *arg, char *err, size_t errlen);

/* ------------------------------------------------------------ multipart */

/* The part size for an object of total bytes (limits.c, no libcurl): the
 * caller's preferred size, raised to S3's 5 MiB minimum and to what fits
 * the object in 10,000 parts, rounded up to a MiB, at most 5 GiB (an
 * object over 5 TiB does not fit: check total against
 * CKPTIO_S3_OBJECT_MAX first). */
uint64_t ckptio_s3_part_size(uint64_t total, uint64_t preferred);

/* CreateMultipartUpload: upload_id gets CKPTIO_S3_UPLOAD_ID_MAX bytes. */
int ckptio_s3_multipart_create(ckptio_s3_client *c, const char *bucket, const char *key,
                               char *upload_id, char *err, size_t errlen);

/* UploadPart number part (1..10000) of len bytes from buf (borrowed for the
 * call); etag gets CKPTIO_S3_ETAG_MAX bytes, to hand to complete. Parts may
 * go up from many threads at once and in any order; every part but the
 * last must be at least CKPTIO_S3_PART_MIN bytes (S3 says so at complete). */
int ckptio_s3_multipart_upload_part(ckptio_s3_client *c, const char *bucket, const char *key,
                                    const char *upload_id, int part, const void *buf, size_t len,
                                    char *etag, char *err, size_t errlen);

typedef struct ckptio_s3_part {
  int number;
  char etag[CKPTIO_S3_ETAG_MAX];
} ckptio_s3_part;

/* CompleteMultipartUpload, the atomic commit: the object appears (or is
 * replaced) whole here and not before. parts in increasing number order.
 * S3's "200 with an Error body" counts as the error it is. A retry that
 * finds NoSuchUpload says the first try may have committed. */
int ckptio_s3_multipart_complete(ckptio_s3_client *c, const char *bucket, const char *key,
                                 const char *upload_id, const ckptio_s3_part *parts, int nparts,
                                 char *err, size_t errlen);

/* AbortMultipartUpload: the parts are dropped; an upload already gone
 * (NoSuchUpload) counts as aborted. */
int ckptio_s3_multipart_abort(ckptio_s3_client *c, const char *bucket, const char *key,
                              const char *upload_id, char *err, size_t errlen);

/* Every upload still open under prefix ("" for all), page after page. */
typedef int (*ckptio_s3_upload_fn)(void *arg, const char *key, const char *upload_id);
int ckptio_s3_list_uploads(ckptio_s3_client *c, const char *bucket, const char *prefix,
                           ckptio_s3_upload_fn fn, void *arg, char *err, size_t errlen);

/* Aborts every upload open under prefix (what a crashed save left billed).
 * @return how many were aborted, or the first error (after trying all). */
int ckptio_s3_abort_uploads(ckptio_s3_client *c, const char *bucket, const char *prefix, char *err,
                            size_t errlen);

#endif
