/* One S3 request over libcurl: the URL, SigV4 signing by libcurl
 * (CURLOPT_AWS_SIGV4), the reply's status, headers and body, the check of
 * a ranged GET, retries with backoff, and the message a user can act on. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "ckptio.h"
#include "core/error.h"
#include "s3/curl_api.h"
#include "s3/request.h"
#include "s3/s3.h"

#define URL_MAX 8192
#define RESP_MAX (64u << 20) /* an XML reply larger than this is refused */

void ckptio_s3_buf_free(ckptio_s3_buf *b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
}

static int buf_add(ckptio_s3_buf *b, const char *p, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n + 1) cap *= 2;
    if (cap > RESP_MAX) return -1;
    char *d = realloc(b->data, cap);
    if (!d) return -1;
    b->data = d;
    b->cap = cap;
  }
  memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = '\0';
  return 0;
}

/* ------------------------------------------------------------ the URL */

static int build_url(ckptio_s3_client *c, const ckptio_s3_req *r, char *url, size_t n) {
  char key[3 * CKPTIO_S3_KEY_MAX + 1] = "";
  if (r->key && ckptio_s3_encode(r->key, 1, key, sizeof(key)) < 0) return -1;
  int k;
  if (c->endpoint) {
    /* Path-style: what S3-compatible servers all take. */
    k = snprintf(url, n, "%s/%s%s%s", c->endpoint, r->bucket, r->key && *r->key ? "/" : "", key);
  } else if (!strchr(r->bucket, '.')) {
    /* AWS itself: virtual-host (a dotted bucket breaks the TLS name). */
    k = snprintf(url, n, "https://%s.s3.%s.amazonaws.com/%s", r->bucket, c->region, key);
  } else {
    k = snprintf(url, n, "https://s3.%s.amazonaws.com/%s%s%s", c->region, r->bucket,
                 r->key && *r->key ? "/" : "", key);
  }
  if (k < 0 || (size_t)k >= n) return -1;
  if (r->query && *r->query) {
    int q = snprintf(url + k, n - (size_t)k, "?%s", r->query);
    if (q < 0 || (size_t)q >= n - (size_t)k) return -1;
  }
  return 0;
}

void ckptio_s3_describe(ckptio_s3_client *c, const ckptio_s3_req *r, char *out, size_t outlen) {
  char url[URL_MAX];
  if (build_url(c, r, url, sizeof(url)) < 0) snprintf(url, sizeof(url), "s3://%s/%.200s", r->bucket, r->key ? r->key : "");
  size_t n = strlen(url);
  if (n > 240) {
    /* A long key or upload id would push S3's error out of a CKPTIO_ERRLEN
     * message: keep the URL's two ends. */
    memmove(url + 120, "...", 3);
    memmove(url + 123, url + n - 117, 118);
  }
  if (r->dst && r->dst_len)
    snprintf(out, outlen, "S3 %s %s %s (bytes %" PRIu64 "-%" PRIu64 ")", r->verb, r->method, url, r->range_off,
             r->range_off + r->dst_len - 1);
  else
    snprintf(out, outlen, "S3 %s %s %s", r->verb, r->method, url);
}

/* ------------------------------------------------------------ callbacks */

typedef struct {
  ckptio_s3_req *r;
  size_t sent; /* of the body */
  int resp_full;
} xfer;

static size_t on_header(char *p, size_t size, size_t n, void *arg) {
  xfer *x = arg;
  ckptio_s3_req *r = x->r;
  size_t len = size * n;
  if (len >= 5 && strncmp(p, "HTTP/", 5) == 0) {
    /* A new status line (after a 100 Continue too): a new set of headers. */
    const char *sp = memchr(p, ' ', len);
    r->status = sp ? strtol(sp + 1, NULL, 10) : 0;
    r->etag[0] = r->content_range[0] = '\0';
    r->content_length = -1;
    return len;
  }
  const char *colon = memchr(p, ':', len);
  if (!colon) return len;
  size_t name = (size_t)(colon - p);
  const char *v = colon + 1, *end = p + len;
  while (v < end && (*v == ' ' || *v == '\t')) v++;
  while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ')) end--;
  size_t vlen = (size_t)(end - v);
  if (name == 4 && strncasecmp(p, "ETag", 4) == 0) {
    if (vlen >= 2 && v[0] == '"' && end[-1] == '"') v++, vlen -= 2;
    if (vlen >= sizeof(r->etag)) vlen = sizeof(r->etag) - 1;
    memcpy(r->etag, v, vlen);
    r->etag[vlen] = '\0';
  } else if (name == 13 && strncasecmp(p, "Content-Range", 13) == 0) {
    if (vlen >= sizeof(r->content_range)) vlen = sizeof(r->content_range) - 1;
    memcpy(r->content_range, v, vlen);
    r->content_range[vlen] = '\0';
  } else if (name == 14 && strncasecmp(p, "Content-Length", 14) == 0) {
    r->content_length = strtoll(v, NULL, 10);
  }
  return len;
}

static size_t on_body(char *p, size_t size, size_t n, void *arg) {
  xfer *x = arg;
  ckptio_s3_req *r = x->r;
  size_t len = size * n;
  if (r->dst && r->status / 100 == 2) {
    /* Straight into the caller's memory; never past its end. */
    if (len > r->dst_len - r->dst_got) {
      r->overflow = 1;
      return 0; /* CURLE_WRITE_ERROR: stops the transfer */
    }
    r->dst_got += len;
    while (len) { /* to the spans in order; a span without a place drops its bytes */
      const ckptio_scatter *s = &r->dst[r->span];
      size_t k = s->len - r->span_got < len ? s->len - r->span_got : len;
      if (s->dst) memcpy((char *)s->dst + r->span_got, p, k);
      p += k, len -= k;
      if ((r->span_got += k) == s->len) r->span++, r->span_got = 0;
    }
    return size * n;
  }
  if (buf_add(&r->resp, p, len) < 0) {
    x->resp_full = 1;
    return 0;
  }
  return len;
}

static size_t on_read(char *p, size_t size, size_t n, void *arg) {
  xfer *x = arg;
  size_t left = x->r->body_len - x->sent, len = size * n;
  if (len > left) len = left;
  memcpy(p, (const char *)x->r->body + x->sent, len);
  x->sent += len;
  return len;
}

static int on_seek(void *arg, curl_off_t off, int origin) {
  /* libcurl rewinds the body to send it again (a redirect, an auth retry). */
  xfer *x = arg;
  if (origin != SEEK_SET || off < 0 || (uint64_t)off > x->r->body_len) return CURL_SEEKFUNC_FAIL;
  x->sent = (size_t)off;
  return CURL_SEEKFUNC_OK;
}

/* ------------------------------------------------------------ one attempt */

static void reset_reply(ckptio_s3_req *r) {
  r->status = 0;
  r->resp.len = 0;
  if (r->resp.data) r->resp.data[0] = '\0';
  r->etag[0] = r->content_range[0] = '\0';
  r->content_length = -1;
  r->dst_got = r->span = r->span_got = 0;
  r->overflow = 0;
}

static CURLcode attempt(ckptio_s3_client *c, CURL *h, ckptio_s3_req *r, const char *url, xfer *x,
                        char *curl_err, long *os_errno) {
  const ckptio_curl_api *cu = c->curl;
  struct curl_slist *hdr = NULL, *t;
  char token[4096 + 32], range[64], match[CKPTIO_S3_ETAG_MAX + 16];
  CURLcode cc = CURLE_OUT_OF_MEMORY;
  cu->easy_reset(h); /* keeps the connection and the DNS cache */
  curl_err[0] = '\0';
  /* curl 7.88 signs the payload's SHA-256 only for bodies it holds itself;
   * UNSIGNED-PAYLOAD (a signed header) is what S3 takes for any body. */
  if (!(t = cu->slist_append(hdr, "x-amz-content-sha256: UNSIGNED-PAYLOAD"))) goto done;
  hdr = t;
  if (c->session_token) {
    snprintf(token, sizeof(token), "x-amz-security-token: %s", c->session_token);
    if (!(t = cu->slist_append(hdr, token))) goto done;
    hdr = t;
  }
  if (r->if_match && *r->if_match) {
    snprintf(match, sizeof(match), "If-Match: \"%s\"", r->if_match);
    if (!(t = cu->slist_append(hdr, match))) goto done;
    hdr = t;
  }
  if (r->body && strcmp(r->method, "POST") == 0) {
    if (!(t = cu->slist_append(hdr, "Content-Type: application/xml"))) goto done;
    hdr = t;
  }
  cu->easy_setopt(h, CURLOPT_URL, url);
  cu->easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
  cu->easy_setopt(h, CURLOPT_AWS_SIGV4, c->sigv4);
  cu->easy_setopt(h, CURLOPT_USERNAME, c->access_key);
  cu->easy_setopt(h, CURLOPT_PASSWORD, c->secret_key);
  cu->easy_setopt(h, CURLOPT_NOSIGNAL, 1L); /* threads: no SIGALRM for timeouts */
  cu->easy_setopt(h, CURLOPT_ERRORBUFFER, curl_err);
  cu->easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)c->connect_timeout_ms);
  cu->easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, (long)c->low_speed_bytes);
  cu->easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)c->low_speed_seconds);
  cu->easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  cu->easy_setopt(h, CURLOPT_HEADERDATA, x);
  cu->easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  cu->easy_setopt(h, CURLOPT_WRITEDATA, x);
  cu->easy_setopt(h, CURLOPT_BUFFERSIZE, 512L * 1024);
  if (strcmp(r->method, "HEAD") == 0) {
    cu->easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (strcmp(r->method, "PUT") == 0) {
    cu->easy_setopt(h, CURLOPT_UPLOAD, 1L);
    cu->easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)r->body_len);
    cu->easy_setopt(h, CURLOPT_READFUNCTION, on_read);
    cu->easy_setopt(h, CURLOPT_READDATA, x);
    cu->easy_setopt(h, CURLOPT_SEEKFUNCTION, on_seek);
    cu->easy_setopt(h, CURLOPT_SEEKDATA, x);
    cu->easy_setopt(h, CURLOPT_UPLOAD_BUFFERSIZE, 2L * 1024 * 1024);
  } else if (strcmp(r->method, "POST") == 0) {
    cu->easy_setopt(h, CURLOPT_POST, 1L);
    cu->easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->body_len);
    cu->easy_setopt(h, CURLOPT_POSTFIELDS, r->body ? (const char *)r->body : "");
  } else if (strcmp(r->method, "GET") != 0) {
    cu->easy_setopt(h, CURLOPT_CUSTOMREQUEST, r->method);
  }
  if (r->dst) {
    snprintf(range, sizeof(range), "%" PRIu64 "-%" PRIu64, r->range_off, r->range_off + r->dst_len - 1);
    cu->easy_setopt(h, CURLOPT_RANGE, range);
  }
  cc = cu->easy_perform(h);
  *os_errno = 0;
  if (cc != CURLE_OK) cu->easy_getinfo(h, CURLINFO_OS_ERRNO, os_errno);
  long connects = 0;
  if (cu->easy_getinfo(h, CURLINFO_NUM_CONNECTS, &connects) == CURLE_OK && connects > 0)
    atomic_fetch_add(&c->connects, (uint64_t)connects);
done:
  cu->easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
  cu->easy_setopt(h, CURLOPT_ERRORBUFFER, NULL);
  cu->slist_free_all(hdr);
  return cc;
}

/* ------------------------------------------------------------ outcome */

enum { OK, RETRY, FAIL };

typedef struct {
  int code;      /* the error code were it the last attempt */
  char msg[400]; /* what went wrong, after the request's description */
} outcome;

static int transport_code(CURLcode cc, long os_errno) {
  if (os_errno == ECONNREFUSED || os_errno == ECONNRESET || os_errno == ETIMEDOUT || os_errno == EPIPE ||
      os_errno == EHOSTUNREACH || os_errno == ENETUNREACH)
    return (int)-os_errno;
  switch (cc) {
    case CURLE_COULDNT_CONNECT: return -ECONNREFUSED;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY: return -EHOSTUNREACH;
    case CURLE_OPERATION_TIMEDOUT: return -ETIMEDOUT;
    case CURLE_PARTIAL_FILE: return CKPTIO_E_SHORT_IO;
    case CURLE_OUT_OF_MEMORY: return -ENOMEM;
    default: return -ECONNRESET;
  }
}

static int transport_retryable(CURLcode cc) {
  switch (cc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR: return 1;
    default: return 0;
  }
}

/* The code for an S3 error reply (status, S3's Code). */
static int s3_code(long status, const char *code) {
  if (status == 404 || !strcmp(code, "NoSuchKey") || !strcmp(code, "NoSuchBucket") || !strcmp(code, "NoSuchUpload"))
    return CKPTIO_E_NOT_FOUND;
  if (status == 403 || status == 401) return -EACCES;
  if (status == 412) return -ESTALE; /* replaced since its ETag was taken */
  if (status == 416) return CKPTIO_E_SHORT_IO;
  if (status == 503 || status == 429 || !strcmp(code, "SlowDown")) return -EAGAIN;
  if (status >= 400 && status < 500) return CKPTIO_E_INVALID_ARG;
  return -EIO;
}

static int s3_retryable(long status, const char *code) {
  return status == 500 || status == 502 || status == 503 || status == 504 || status == 429 ||
         !strcmp(code, "SlowDown") || !strcmp(code, "InternalError") || !strcmp(code, "RequestTimeout");
}

/* An S3 error reply's Code and Message (and the request id for support). */
static void error_reply(const ckptio_s3_req *r, char *code, size_t codelen, outcome *o) {
  char msg[256] = "", rid[96] = "";
  const char *p = r->resp.data, *end = p ? p + r->resp.len : NULL;
  code[0] = '\0';
  if (p) {
    ckptio_s3_xml_text(p, end, "Code", code, codelen);
    ckptio_s3_xml_text(p, end, "Message", msg, sizeof(msg));
    ckptio_s3_xml_text(p, end, "RequestId", rid, sizeof(rid));
  }
  if (code[0])
    snprintf(o->msg, sizeof(o->msg), "HTTP %ld %s: %s%s%s%s", r->status, code, msg, rid[0] ? " (request id " : "",
             rid, rid[0] ? ")" : "");
  else if (strcmp(r->method, "HEAD") == 0)
    snprintf(o->msg, sizeof(o->msg), "HTTP %ld%s (a HEAD reply has no body to say more)", r->status,
             r->status == 404 ? " Not Found" : r->status == 403 ? " Forbidden" : "");
  else
    snprintf(o->msg, sizeof(o->msg), "HTTP %ld (no S3 error in the reply: %.120s)", r->status,
             p && *p ? p : "empty body");
}

/* A 2xx GET into dst must be exactly the range asked. */
static int check_range(const ckptio_s3_req *r, outcome *o) {
  uint64_t first = r->range_off, last = r->range_off + r->dst_len - 1;
  if (r->status == 206) {
    uint64_t a = 0, b = 0;
    if (sscanf(r->content_range, "bytes %" SCNu64 "-%" SCNu64, &a, &b) != 2 || a != first || b != last) {
      snprintf(o->msg, sizeof(o->msg), "the reply's Content-Range '%s' is not the range asked (bytes %" PRIu64
               "-%" PRIu64 ")", r->content_range, first, last);
      return -1;
    }
  } else if (r->status != 200 || first != 0 || r->content_length != (int64_t)r->dst_len) {
    /* 200 is the whole object: only right when it is exactly the range. */
    snprintf(o->msg, sizeof(o->msg), "HTTP %ld with %" PRId64 " bytes instead of the %zu asked (range ignored?)",
             r->status, r->content_length, r->dst_len);
    return -1;
  }
  if (r->dst_got != r->dst_len) {
    snprintf(o->msg, sizeof(o->msg), "%zu bytes arrived of the %zu asked (Content-Length %" PRId64 ")",
             r->dst_got, r->dst_len, r->content_length);
    return -1;
  }
  return 0;
}

static int judge(const ckptio_curl_api *cu, ckptio_s3_req *r, CURLcode cc, long os_errno, const char *curl_err,
                 const xfer *x, outcome *o) {
  o->msg[0] = '\0';
  if (r->overflow) {
    o->code = CKPTIO_E_SHORT_IO;
    snprintf(o->msg, sizeof(o->msg), "the server sent more than the %zu bytes asked (Content-Length %" PRId64 ")",
             r->dst_len, r->content_length);
    return FAIL;
  }
  if (x->resp_full) {
    o->code = -EIO;
    snprintf(o->msg, sizeof(o->msg), "the reply is larger than %u MiB", RESP_MAX >> 20);
    return FAIL;
  }
  if (cc != CURLE_OK) {
    o->code = transport_code(cc, os_errno);
    snprintf(o->msg, sizeof(o->msg), "%s%s%s: %s", cu->easy_strerror(cc), os_errno ? ", " : "",
             os_errno ? ckptio_errno_text((int)os_errno) : "", curl_err[0] ? curl_err : "no detail");
    return transport_retryable(cc) ? RETRY : FAIL;
  }
  if (r->status / 100 != 2) {
    char code[64];
    error_reply(r, code, sizeof(code), o);
    o->code = s3_code(r->status, code);
    return s3_retryable(r->status, code) ? RETRY : FAIL;
  }
  if (r->dst && check_range(r, o) < 0) {
    o->code = CKPTIO_E_SHORT_IO;
    return RETRY; /* a cut body: the next try may get it whole */
  }
  return OK;
}

/* Full jitter (a wait drawn from 0 .. min(cap, base * 2^retry)): many
 * threads throttled at once do not come back at once. */
static void backoff(ckptio_s3_client *c, int retry) {
  static _Thread_local uint64_t seed;
  if (!seed) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    seed = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)(uintptr_t)&seed ^ (uint64_t)ts.tv_sec;
    if (!seed) seed = 1;
  }
  seed ^= seed << 13;
  seed ^= seed >> 7;
  seed ^= seed << 17;
  uint64_t cap = (uint64_t)c->backoff_base_ms << (retry < 20 ? retry : 20);
  if (cap > (uint64_t)c->backoff_max_ms) cap = (uint64_t)c->backoff_max_ms;
  uint64_t ms = cap ? seed % (cap + 1) : 0;
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

int ckptio_s3_request(ckptio_s3_client *c, ckptio_s3_req *r, char *err, size_t errlen) {
  char url[URL_MAX], what[URL_MAX + 128], curl_err[CURL_ERROR_SIZE];
  outcome first = {0, ""}, last = {0, ""};
  r->attempts = 0;
  if (build_url(c, r, url, sizeof(url)) < 0)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "S3 %s s3://%s/%.200s: the URL is too long", r->verb,
                          r->bucket, r->key ? r->key : "");
  ckptio_s3_handle *h = ckptio_s3_handle_take(c);
  if (!h) return ckptio_err_fmt(err, errlen, -ENOMEM, "S3 %s %s: libcurl could not make a handle", r->verb, url);
  atomic_fetch_add(&c->requests, 1);
  int verdict = FAIL;
  for (int i = 0; i < c->max_attempts; i++) {
    if (i > 0) {
      atomic_fetch_add(&c->retries, 1);
      backoff(c, i - 1);
    }
    xfer x = {r, 0, 0};
    reset_reply(r);
    r->attempts++;
    atomic_fetch_add(&c->attempts, 1);
    long os_errno = 0;
    CURLcode cc = attempt(c, h->curl, r, url, &x, curl_err, &os_errno);
    verdict = judge(c->curl, r, cc, os_errno, curl_err, &x, &last);
    if (cc == CURLE_OK) {
      atomic_fetch_add(&c->bytes_out, x.sent + (r->body && !strcmp(r->method, "POST") ? r->body_len : 0));
      atomic_fetch_add(&c->bytes_in, r->dst ? r->dst_got : r->resp.len);
    }
    if (i == 0) first = last;
    if (verdict != RETRY) break;
  }
  ckptio_s3_handle_give(c, h);
  if (verdict == OK) return 0;
  ckptio_s3_describe(c, r, what, sizeof(what));
  if (r->attempts > 1 && strcmp(first.msg, last.msg) != 0)
    return ckptio_err_fmt(err, errlen, last.code, "%s: %s (after %d attempts; the first: %s)", what, last.msg,
                          r->attempts, first.msg);
  if (r->attempts > 1)
    return ckptio_err_fmt(err, errlen, last.code, "%s: %s (after %d attempts)", what, last.msg, r->attempts);
  return ckptio_err_fmt(err, errlen, last.code, "%s: %s", what, last.msg);
}
