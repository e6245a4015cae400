/* Inside the S3 room: the client's state, one request with its retries,
 * and the helpers the verbs share. Not for other rooms (they use s3.h). */
#ifndef CKPTIO_S3_REQUEST_H
#define CKPTIO_S3_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include <pthread.h>
#include <stdatomic.h>

#include "s3/s3.h"

/* A libcurl easy handle kept between requests: its connection stays open
 * (keep-alive) for the next request that takes it. */
typedef struct ckptio_s3_handle {
  void *curl; /* CURL * */
  struct ckptio_s3_handle *next;
} ckptio_s3_handle;

struct ckptio_s3_client {
  const struct ckptio_curl_api *curl; /* libcurl's functions (curl_api.h) */
  char *endpoint; /* without a trailing '/'; NULL: AWS, virtual-host */
  char *region, *access_key, *secret_key, *session_token;
  char sigv4[128]; /* CURLOPT_AWS_SIGV4: "aws:amz:REGION:s3" */
  int max_attempts, backoff_base_ms, backoff_max_ms;
  int connect_timeout_ms, low_speed_seconds, low_speed_bytes;
  char page_size[16]; /* list_page_size as text, "" for the default */
  pthread_mutex_t lock; /* guards idle */
  ckptio_s3_handle *idle;
  _Atomic uint64_t requests, attempts, retries, connects, bytes_in, bytes_out;
};

/* A handle from the pool (a new one when all are busy), and back. NULL
 * when libcurl cannot make one. */
ckptio_s3_handle *ckptio_s3_handle_take(ckptio_s3_client *c);
void ckptio_s3_handle_give(ckptio_s3_client *c, ckptio_s3_handle *h);

/* SigV4 percent-encoding of s into out (keep_slash: a path). @return the
 * length, or -1 when out is too small. */
int ckptio_s3_encode(const char *s, int keep_slash, char *out, size_t outlen);
/* A canonical query string (sorted, encoded, every name=value) of n
 * (n <= 8) name/value pairs; a NULL value is "". @return length or -1. */
int ckptio_s3_query(const char *const (*params)[2], int n, char *out, size_t outlen);

/* A growable byte buffer (XML replies, error bodies), NUL-terminated. */
typedef struct ckptio_s3_buf {
  char *data;
  size_t len, cap;
} ckptio_s3_buf;
void ckptio_s3_buf_free(ckptio_s3_buf *b);

/* One S3 request: what to send, and what came back. */
typedef struct ckptio_s3_req {
  const char *verb;    /* the verb's name for messages ("GetObject") */
  const char *method;  /* GET PUT POST DELETE HEAD */
  const char *bucket;
  const char *key;     /* NULL or "": the bucket itself */
  const char *query;   /* canonical (ckptio_s3_query), or NULL */
  const void *body;    /* PUT / POST body, body_len bytes, borrowed */
  size_t body_len;
  const ckptio_scatter *dst; /* GET: where the body's bytes go, in order */
  size_t dst_len;      /* bytes from range_off: the spans' lengths summed,
                          which bounds the walk over them */
  uint64_t range_off;
  const char *if_match; /* an ETag (unquoted) the object must still have */
  /* filled by ckptio_s3_request */
  long status;
  ckptio_s3_buf resp;  /* the body when it is not going into dst */
  char etag[CKPTIO_S3_ETAG_MAX];
  char content_range[128];
  int64_t content_length;
  size_t dst_got;
  size_t span, span_got; /* the span the next body byte goes to, and how far */
  int overflow;
  int attempts;
} ckptio_s3_req;

/* Sends r, retrying what is worth retrying, and checks a ranged GET got
 * exactly its bytes. @return 0 on a 2xx (r->status, r->resp filled), or the
 * error code with the message in err. The caller frees r->resp. */
int ckptio_s3_request(ckptio_s3_client *c, ckptio_s3_req *r, char *err, size_t errlen);

/* The message prefix for r: "S3 GetObject GET http://host/bucket/key". */
void ckptio_s3_describe(ckptio_s3_client *c, const ckptio_s3_req *r, char *out, size_t outlen);

/* ------------------------------------------------------------ xml.c */

/* The first <tag>...</tag> (or <tag/>) in [p, end): its body in *body,
 * *body_end; @return the position after it, or NULL when there is none. */
const char *ckptio_s3_xml_find(const char *p, const char *end, const char *tag, const char **body,
                               const char **body_end);
/* The text of the first <tag> in [p, end), entities decoded, into out.
 * @return its length, -1 when absent, -2 when longer than outlen - 1. */
int ckptio_s3_xml_text(const char *p, const char *end, const char *tag, char *out, size_t outlen);

#endif
