/* The S3 client (src/s3) against a real server (SeaweedFS, started by
 * tests/s3/weed_server.py, which sets AWS_ENDPOINT_URL, the credentials and
 * CKPTIO_S3_BUCKET), and the parts that need no server (URLs, retries to a
 * port that refuses connections, replies no real server gives on demand).
 *
 *   test_s3 GROUP            run one group: url retry server kill freeze
 *   test_s3 has-s3           exit 0 in a build with S3, else 77 saying why
 *   test_s3 no-libcurl EXPECT  with CKPTIO_FAULT_LIBCURL set: the error every
 *                            s3:// open gives when libcurl cannot be loaded
 *   test_s3 cat KEY          the object's bytes to stdout (interop tests)
 *   test_s3 put KEY FILE     one PUT
 *   test_s3 upload KEY FILE THREADS  a multipart upload (5 MiB parts)
 *   test_s3 bench KEY SIZE_MIB THREADS CHUNK_MIB   upload and GET rates
 *                                          (bench/s3/client_bench.py)
 *
 * Exit 0 pass, 1 fail, 77 skip (no server, or no libcurl in this build). */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ckptio.h"
#include "core/error.h"
#include "s3/request.h"
#include "s3/s3.h"

static int failures;
#define CHECK(cond, ...)                                              \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                   \
      fprintf(stderr, "\n");                                          \
      failures++;                                                     \
    }                                                                 \
  } while (0)

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static const char *bucket(void) {
  const char *b = getenv("CKPTIO_S3_BUCKET");
  return b && *b ? b : "ckptio-test";
}

/* Deterministic bytes: a position's byte depends on the seed and position. */
static void fill(unsigned char *p, size_t n, uint64_t seed, uint64_t pos) {
  for (size_t i = 0; i < n; i++) {
    uint64_t x = (pos + i) * 0x9E3779B97F4A7C15ull + seed;
    x ^= x >> 29;
    p[i] = (unsigned char)(x ^ (x >> 17));
  }
}

static ckptio_s3_client *client_or_die(const ckptio_s3_config *cfg) {
  char err[CKPTIO_ERRLEN];
  ckptio_s3_client *c = NULL;
  int rc = ckptio_s3_client_create(cfg, &c, err, sizeof(err));
  if (rc == CKPTIO_E_FORMAT) {
    printf("SKIP: %s\n", err);
    exit(77);
  }
  if (rc < 0) {
    fprintf(stderr, "FAIL: client: %s\n", err);
    exit(1);
  }
  return c;
}

/* ------------------------------------------------------------ url */

static void test_url(void) {
  ckptio_s3_url u;
  char err[CKPTIO_ERRLEN];
  CHECK(ckptio_s3_is_url("s3://b/k") && !ckptio_s3_is_url("/tmp/x") && !ckptio_s3_is_url(NULL), "is_url");
  CHECK(ckptio_s3_url_parse("s3://my-bucket/a/b c/d.safetensors", &u, err, sizeof(err)) == 0, "%s", err);
  CHECK(!strcmp(u.bucket, "my-bucket") && !strcmp(u.key, "a/b c/d.safetensors"), "%s %s", u.bucket, u.key);
  CHECK(ckptio_s3_url_parse("s3://bkt", &u, err, sizeof(err)) == 0 && !strcmp(u.key, ""), "bucket only");
  CHECK(ckptio_s3_url_parse("s3://bkt/", &u, err, sizeof(err)) == 0 && !strcmp(u.key, ""), "bucket/");
  struct {
    const char *url, *says;
  } bad[] = {{"http://bkt/k", "not an S3 URL"},       {"s3://", "no bucket"},
             {"s3:///key", "no bucket"},               {"s3://ab/k", "3 to 63"},
             {"s3://Upper/k", "a-z 0-9"},              {"s3://bad_name/k", "a-z 0-9"},
             {"s3://-bkt/k", "begins and ends"},       {"s3://bkt./k", "begins and ends"}};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    err[0] = '\0';
    int rc = ckptio_s3_url_parse(bad[i].url, &u, err, sizeof(err));
    CHECK(rc == CKPTIO_E_INVALID_ARG && strstr(err, bad[i].says), "%s -> %d '%s'", bad[i].url, rc, err);
  }
  char longkey[1100] = "s3://bkt/";
  memset(longkey + 9, 'k', 1025);
  longkey[9 + 1025] = '\0';
  CHECK(ckptio_s3_url_parse(longkey, &u, err, sizeof(err)) == CKPTIO_E_INVALID_ARG && strstr(err, "1024"), "%s",
        err);

  char out[256];
  CHECK(ckptio_s3_encode("a b/c+d=é~_.-", 1, out, sizeof(out)) > 0 && !strcmp(out, "a%20b/c%2Bd%3D%C3%A9~_.-"),
        "%s", out);
  CHECK(ckptio_s3_encode("a/b", 0, out, sizeof(out)) > 0 && !strcmp(out, "a%2Fb"), "%s", out);
  CHECK(ckptio_s3_encode("abcdef", 0, out, 4) == -1, "too small");
  /* SigV4's canonical query: sorted by name, every value present. */
  const char *q[][2] = {{"uploadId", "x/y+z"}, {"partNumber", "7"}, {"uploads", NULL}};
  CHECK(ckptio_s3_query(q, 3, out, sizeof(out)) > 0 && !strcmp(out, "partNumber=7&uploadId=x%2Fy%2Bz&uploads="),
        "%s", out);

  /* Part sizes: S3's minimum, the 10,000-part cap, whole MiB, 5 GiB. */
  CHECK(ckptio_s3_part_size(100, 0) == CKPTIO_S3_PART_MIN, "small");
  CHECK(ckptio_s3_part_size(1ull << 30, 64u << 20) == 64u << 20, "preferred kept");
  CHECK(ckptio_s3_part_size(1ull << 30, (8u << 20) + 1) == 9u << 20, "rounded to a MiB");
  uint64_t big = 1ull << 40, ps = ckptio_s3_part_size(big, 8u << 20);
  CHECK((big + ps - 1) / ps <= CKPTIO_S3_PARTS_MAX && ps % (1u << 20) == 0 && ps < (big / 9000),
        "1 TiB: %" PRIu64, ps);
  CHECK(ckptio_s3_part_size(CKPTIO_S3_OBJECT_MAX, 0) == 525u << 20, "5 TiB: %" PRIu64,
        ckptio_s3_part_size(CKPTIO_S3_OBJECT_MAX, 0));
  CHECK(ckptio_s3_part_size(0, 1ull << 40) == CKPTIO_S3_PART_MAX, "capped at 5 GiB");

  const char xml[] = "<R><KeyCount>2</KeyCount><Key>a&amp;b &lt;&#34;&#x41;&quot;</Key><E/><Key>second</Key></R>";
  const char *end = xml + sizeof(xml) - 1, *b, *e;
  CHECK(ckptio_s3_xml_text(xml, end, "Key", out, sizeof(out)) == 8 && !strcmp(out, "a&b <\"A\""), "%s", out);
  CHECK(ckptio_s3_xml_text(xml, end, "E", out, sizeof(out)) == 0, "empty element");
  CHECK(ckptio_s3_xml_text(xml, end, "Missing", out, sizeof(out)) == -1, "absent");
  CHECK(ckptio_s3_xml_text(xml, end, "Key", out, 4) == -2 && strlen(out) == 3, "cut");
  const char *p = ckptio_s3_xml_find(xml, end, "Key", &b, &e);
  CHECK(p && ckptio_s3_xml_text(p, end, "Key", out, sizeof(out)) == 6 && !strcmp(out, "second"), "second: %s", out);
}

/* ------------------------------------------------------------ retries */

static int closed_port(void) {
  /* A port nothing listens on: bound, then closed. */
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof(a);
  bind(s, (struct sockaddr *)&a, sizeof(a));
  getsockname(s, (struct sockaddr *)&a, &len);
  close(s);
  return ntohs(a.sin_port);
}

/* A one-reply-per-connection HTTP server on 127.0.0.1: every request gets
 * `reply` (then the connection closes), for replies a real server gives
 * only when it breaks: 503 SlowDown, a cut body, a wrong Content-Range.
 * With `then`, every request after the first gets that instead. */
typedef struct {
  int fd, port, served, stop;
  const char *reply, *then;
  pthread_t thread;
} liar;

static void *liar_main(void *arg) {
  liar *l = arg;
  for (;;) {
    int cfd = accept(l->fd, NULL, NULL);
    if (cfd < 0 || __atomic_load_n(&l->stop, __ATOMIC_SEQ_CST)) {
      if (cfd >= 0) close(cfd);
      return NULL;
    }
    char buf[8192];
    size_t got = 0;
    while (got < sizeof(buf) - 1) { /* the request's headers */
      ssize_t k = recv(cfd, buf + got, sizeof(buf) - 1 - got, 0);
      if (k <= 0) break;
      got += (size_t)k;
      buf[got] = '\0';
      if (strstr(buf, "\r\n\r\n")) break;
    }
    const char *reply = __atomic_add_fetch(&l->served, 1, __ATOMIC_SEQ_CST) > 1 && l->then ? l->then : l->reply;
    ssize_t w = send(cfd, reply, strlen(reply), MSG_NOSIGNAL);
    (void)w;
    shutdown(cfd, SHUT_RDWR);
    close(cfd);
  }
}

static void liar_start_then(liar *l, const char *reply, const char *then) {
  memset(l, 0, sizeof(*l));
  l->reply = reply;
  l->then = then;
  l->fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof(a);
  int one = 1;
  setsockopt(l->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(l->fd, (struct sockaddr *)&a, sizeof(a)) || listen(l->fd, 16) ||
      getsockname(l->fd, (struct sockaddr *)&a, &len)) {
    perror("liar");
    exit(1);
  }
  l->port = ntohs(a.sin_port);
  pthread_create(&l->thread, NULL, liar_main, l);
}

static void liar_start(liar *l, const char *reply) { liar_start_then(l, reply, NULL); }

static void liar_stop(liar *l) {
  __atomic_store_n(&l->stop, 1, __ATOMIC_SEQ_CST);
  int s = socket(AF_INET, SOCK_STREAM, 0); /* wake accept() */
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                          .sin_port = htons((uint16_t)l->port)};
  connect(s, (struct sockaddr *)&a, sizeof(a));
  close(s);
  pthread_join(l->thread, NULL);
  close(l->fd);
}

static ckptio_s3_client *client_at(int port, int attempts) {
  char endpoint[64];
  snprintf(endpoint, sizeof(endpoint), "http://127.0.0.1:%d", port);
  ckptio_s3_config cfg = {.endpoint = endpoint, .region = "us-east-1", .access_key = "k", .secret_key = "s",
                          .max_attempts = attempts, .backoff_base_ms = 1, .backoff_max_ms = 20,
                          .connect_timeout_ms = 2000, .low_speed_seconds = 2};
  return client_or_die(&cfg);
}

static void test_retry(void) {
  char err[CKPTIO_ERRLEN];
  unsigned char buf[100];
  ckptio_s3_stats st;

  /* Refused connections: retried up to max_attempts, then reported. */
  ckptio_s3_client *c = client_at(closed_port(), 4);
  double t0 = now();
  int rc = ckptio_s3_get_range(c, "bkt", "key", 0, sizeof(buf), buf, err, sizeof(err));
  ckptio_s3_client_stats(c, &st);
  CHECK(rc == -ECONNREFUSED, "rc %d: %s", rc, err);
  CHECK(st.requests == 1 && st.attempts == 4 && st.retries == 3, "requests %" PRIu64 " attempts %" PRIu64
        " retries %" PRIu64, st.requests, st.attempts, st.retries);
  CHECK(strstr(err, "after 4 attempts") && strstr(err, "GetObject GET http://127.0.0.1:") &&
        strstr(err, "/bkt/key (bytes 0-99)") && strstr(err, "onnect"), "%s", err);
  CHECK(now() - t0 < 5, "4 refused attempts took %.1f s", now() - t0);
  printf("refused: %s\n", err);
  ckptio_s3_client_free(c);

  /* Throttling: 503 SlowDown every time, retried, then -EAGAIN naming it. */
  liar l;
  liar_start(&l, "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: 87\r\n"
                 "Connection: close\r\n\r\n"
                 "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>");
  c = client_at(l.port, 3);
  rc = ckptio_s3_put_object(c, "bkt", "k", "abc", 3, NULL, err, sizeof(err));
  ckptio_s3_client_stats(c, &st);
  CHECK(rc == -EAGAIN && strstr(err, "HTTP 503 SlowDown: Please reduce") && strstr(err, "after 3 attempts"),
        "rc %d: %s", rc, err);
  CHECK(st.attempts == 3 && __atomic_load_n(&l.served, __ATOMIC_SEQ_CST) == 3, "attempts %" PRIu64 ", served %d", st.attempts, l.served);
  printf("throttled: %s\n", err);
  ckptio_s3_client_free(c);
  liar_stop(&l);

  /* 500 InternalError and 429 are retried too; then -EIO / -EAGAIN. A
   * connection closed with no reply (a reset) is retried, then
   * -ECONNRESET. A 400 is not retried. */
  struct {
    const char *reply, *says;
    int attempts, code;
  } more[] = {
      {"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 84\r\n\r\n"
       "<Error><Code>InternalError</Code><Message>We encountered an error.</Message></Error>",
       "HTTP 500 InternalError: We encountered an error.", 3, -EIO},
      {"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 0\r\n\r\n", "HTTP 429", 3, -EAGAIN},
      {"", "Empty reply from server", 3, -ECONNRESET},
      {"HTTP/1.1 400 Bad Request\r\nContent-Length: 75\r\n\r\n"
       "<Error><Code>InvalidArgument</Code><Message>Bad argument.</Message></Error>",
       "HTTP 400 InvalidArgument: Bad argument.", 1, CKPTIO_E_INVALID_ARG},
  };
  for (size_t k = 0; k < sizeof(more) / sizeof(more[0]); k++) {
    liar_start(&l, more[k].reply);
    c = client_at(l.port, 3);
    rc = ckptio_s3_get_range(c, "bkt", "k", 0, 10, buf, err, sizeof(err));
    ckptio_s3_client_stats(c, &st);
    CHECK(rc == more[k].code && strstr(err, more[k].says), "case %zu: rc %d: %s", k, rc, err);
    CHECK(st.attempts == (uint64_t)more[k].attempts && __atomic_load_n(&l.served, __ATOMIC_SEQ_CST) == more[k].attempts,
          "case %zu: %" PRIu64 " attempts, %d served", k, st.attempts, l.served);
    ckptio_s3_client_free(c);
    liar_stop(&l);
  }

  /* A body cut short of its Content-Length: an error, never short data. */
  liar_start(&l, "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-99/1000\r\nContent-Length: 100\r\n\r\n"
                 "only fifty bytes of the hundred promised, then....");
  c = client_at(l.port, 2);
  memset(buf, 0, sizeof(buf));
  rc = ckptio_s3_get_range(c, "bkt", "k", 0, 100, buf, err, sizeof(err));
  CHECK(rc == CKPTIO_E_SHORT_IO && strstr(err, "after 2 attempts"), "rc %d: %s", rc, err);
  printf("cut body: %s\n", err);
  ckptio_s3_client_free(c);
  liar_stop(&l);

  /* A cut body, then the whole one: the retry's bytes, all of them, in
   * place of the first attempt's. */
  const char *body = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                     "0123456789abcdefghijklmnopqrstuvwxyzAB"; /* 100 bytes */
  char cut[256], whole[256];
  const char *head = "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-99/1000\r\nContent-Length: 100\r\n\r\n";
  snprintf(cut, sizeof(cut), "%s%.50s", head, "the first fifty bytes, which a retry must replace.");
  snprintf(whole, sizeof(whole), "%s%s", head, body);
  liar_start_then(&l, cut, whole);
  c = client_at(l.port, 2);
  memset(buf, 0, sizeof(buf));
  rc = ckptio_s3_get_range(c, "bkt", "k", 0, 100, buf, err, sizeof(err));
  CHECK(rc == 0 && memcmp(buf, body, 100) == 0, "rc %d: %s", rc, err);
  CHECK(__atomic_load_n(&l.served, __ATOMIC_SEQ_CST) == 2, "served %d", l.served);
  ckptio_s3_client_free(c);
  liar_stop(&l);

  /* A lying Content-Length (50 bytes sent as the whole 100-byte range). */
  liar_start(&l, "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-99/1000\r\nContent-Length: 50\r\n\r\n"
                 "only fifty bytes of the hundred promised, then....");
  c = client_at(l.port, 1);
  rc = ckptio_s3_get_range(c, "bkt", "k", 0, 100, buf, err, sizeof(err));
  CHECK(rc == CKPTIO_E_SHORT_IO && strstr(err, "50 bytes arrived of the 100 asked"), "rc %d: %s", rc, err);
  printf("lying length: %s\n", err);
  ckptio_s3_client_free(c);
  liar_stop(&l);

  /* Another range than the one asked. */
  liar_start(&l, "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 10-19/1000\r\nContent-Length: 10\r\n\r\n"
                 "0123456789");
  c = client_at(l.port, 1);
  rc = ckptio_s3_get_range(c, "bkt", "k", 0, 10, buf, err, sizeof(err));
  CHECK(rc == CKPTIO_E_SHORT_IO && strstr(err, "is not the range asked"), "rc %d: %s", rc, err);
  ckptio_s3_client_free(c);
  liar_stop(&l);

  /* More bytes than asked: stopped at the buffer's end. */
  liar_start(&l, "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-9/1000\r\nContent-Length: 20\r\n\r\n"
                 "0123456789abcdefghij");
  c = client_at(l.port, 1);
  unsigned char small[10 + 16];
  memset(small, 0x5a, sizeof(small));
  rc = ckptio_s3_get_range(c, "bkt", "k", 0, 10, small, err, sizeof(err));
  CHECK(rc == CKPTIO_E_SHORT_IO && strstr(err, "more than the 10 bytes"), "rc %d: %s", rc, err);
  CHECK(small[10] == 0x5a && small[25] == 0x5a, "wrote past the range");
  ckptio_s3_client_free(c);
  liar_stop(&l);

  /* A 200 "with an error in the body" from CompleteMultipartUpload. */
  liar_start(&l, "HTTP/1.1 200 OK\r\nContent-Length: 84\r\n\r\n"
                 "<Error><Code>InternalError</Code><Message>We encountered an error.</Message></Error>");
  c = client_at(l.port, 1);
  ckptio_s3_part part = {1, "abc"};
  rc = ckptio_s3_multipart_complete(c, "bkt", "k", "id", &part, 1, err, sizeof(err));
  CHECK(rc == -EIO && strstr(err, "error in the body: InternalError"), "rc %d: %s", rc, err);
  ckptio_s3_client_free(c);
  liar_stop(&l);
}

/* ------------------------------------------------------------ server */

#define PART (5u << 20)

typedef struct {
  ckptio_s3_client *c;
  const char *key, *upload_id;
  const unsigned char *data;
  size_t size, part;
  int nparts, next;
  ckptio_s3_part *parts;
  pthread_mutex_t lock;
  int rc;
  char err[CKPTIO_ERRLEN];
} upload_job;

static void *upload_worker(void *arg) {
  upload_job *j = arg;
  for (;;) {
    pthread_mutex_lock(&j->lock);
    int i = j->next++;
    pthread_mutex_unlock(&j->lock);
    if (i >= j->nparts) return NULL;
    size_t off = (size_t)i * j->part, len = j->size - off < j->part ? j->size - off : j->part;
    char err[CKPTIO_ERRLEN];
    j->parts[i].number = i + 1;
    int rc = ckptio_s3_multipart_upload_part(j->c, bucket(), j->key, j->upload_id, i + 1, j->data + off, len,
                                             j->parts[i].etag, err, sizeof(err));
    if (rc < 0) {
      pthread_mutex_lock(&j->lock);
      if (!j->rc) {
        j->rc = rc;
        snprintf(j->err, sizeof(j->err), "%s", err);
      }
      pthread_mutex_unlock(&j->lock);
    }
  }
}

/* A multipart upload of data in parts of part_size bytes from `threads`
 * threads; 0 or the error. */
static int upload_parts(ckptio_s3_client *c, const char *key, const unsigned char *data, size_t size,
                        size_t part_size, int threads, char *err, size_t errlen) {
  char id[CKPTIO_S3_UPLOAD_ID_MAX];
  int rc = ckptio_s3_multipart_create(c, bucket(), key, id, err, errlen);
  if (rc < 0) return rc;
  upload_job j = {.c = c, .key = key, .upload_id = id, .data = data, .size = size, .part = part_size,
                  .nparts = size ? (int)((size + part_size - 1) / part_size) : 1};
  j.parts = calloc((size_t)j.nparts, sizeof(*j.parts));
  pthread_mutex_init(&j.lock, NULL);
  pthread_t t[16];
  for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, upload_worker, &j);
  for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
  rc = j.rc;
  if (rc < 0) {
    snprintf(err, errlen, "%s", j.err);
    char aerr[CKPTIO_ERRLEN];
    ckptio_s3_multipart_abort(c, bucket(), key, id, aerr, sizeof(aerr));
  } else {
    rc = ckptio_s3_multipart_complete(c, bucket(), key, id, j.parts, j.nparts, err, errlen);
  }
  pthread_mutex_destroy(&j.lock);
  free(j.parts);
  return rc;
}

static int upload(ckptio_s3_client *c, const char *key, const unsigned char *data, size_t size, int threads,
                  char *err, size_t errlen) {
  return upload_parts(c, key, data, size, PART, threads, err, errlen);
}

typedef struct {
  ckptio_s3_client *c;
  const char *key;
  const unsigned char *want;
  size_t size, chunk;
  int tid, nthreads, bad;
  char err[CKPTIO_ERRLEN];
} read_job;

/* Every byte by ranged GETs of `chunk` bytes, chunks dealt round-robin. */
static void *read_worker(void *arg) {
  read_job *j = arg;
  unsigned char *buf = malloc(j->chunk);
  for (size_t k = (size_t)j->tid; k * j->chunk < j->size; k += (size_t)j->nthreads) {
    size_t off = k * j->chunk, len = j->size - off < j->chunk ? j->size - off : j->chunk;
    int rc = ckptio_s3_get_range(j->c, bucket(), j->key, off, len, buf, j->err, sizeof(j->err));
    if (rc < 0 || memcmp(buf, j->want + off, len) != 0) {
      if (rc == 0) snprintf(j->err, sizeof(j->err), "bytes %zu.. differ", off);
      j->bad = 1;
      break;
    }
  }
  free(buf);
  return NULL;
}

static int count_object(void *arg, const char *key, uint64_t size, const char *etag) {
  (void)key, (void)size, (void)etag;
  ++*(int *)arg;
  return 0;
}

typedef struct {
  int n;
  char keys[64][128];
} names;

static int name_object(void *arg, const char *key, uint64_t size, const char *etag) {
  names *n = arg;
  (void)size, (void)etag;
  if (n->n < 64) snprintf(n->keys[n->n], sizeof(n->keys[0]), "%s", key);
  n->n++;
  return 0;
}
static int name_upload(void *arg, const char *key, const char *id) {
  (void)id;
  return name_object(arg, key, 0, NULL);
}

static void test_server(void) {
  char err[CKPTIO_ERRLEN];
  ckptio_s3_stats st;
  ckptio_s3_client *c = client_or_die(NULL);
  const char *b = bucket();

  /* Multipart: 3 whole parts + a short last one, from 4 threads, read back
   * by ranged GETs of every byte from 4 threads. */
  size_t size = 3 * (size_t)PART + 1234567;
  unsigned char *data = malloc(size);
  fill(data, size, 1, 0);
  double t0 = now();
  int rc = upload(c, "mp/obj.bin", data, size, 4, err, sizeof(err));
  CHECK(rc == 0, "multipart upload: %s", err);
  printf("multipart upload of %zu bytes in 4 parts from 4 threads: %.2f s\n", size, now() - t0);
  ckptio_s3_object o;
  CHECK(ckptio_s3_head(c, b, "mp/obj.bin", &o, err, sizeof(err)) == 0 && o.size == size && strchr(o.etag, '-'),
        "head: %s size %" PRIu64 " etag %s", err, o.size, o.etag);
  size_t chunks[] = {1u << 20, 999983, 4096 + 7};
  for (size_t k = 0; k < sizeof(chunks) / sizeof(chunks[0]); k++) {
    read_job jobs[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
      jobs[i] = (read_job){.c = c, .key = "mp/obj.bin", .want = data, .size = k == 2 ? 300000 : size,
                           .chunk = chunks[k], .tid = i, .nthreads = 4};
      pthread_create(&t[i], NULL, read_worker, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) {
      pthread_join(t[i], NULL);
      CHECK(!jobs[i].bad, "ranged GETs of %zu: %s", chunks[k], jobs[i].err);
    }
  }
  /* Keep-alive: hundreds of GETs above, a handful of connections. */
  ckptio_s3_client_stats(c, &st);
  printf("after the reads: %" PRIu64 " requests, %" PRIu64 " attempts, %" PRIu64 " connections\n", st.requests,
         st.attempts, st.connects);
  CHECK(st.attempts > 100 && st.connects <= 16, "connections %" PRIu64 " for %" PRIu64 " requests", st.connects,
        st.attempts);
  CHECK(st.retries == 0, "retries %" PRIu64, st.retries);
  /* A range past the end: an error, not short data. */
  unsigned char tail[100];
  rc = ckptio_s3_get_range(c, b, "mp/obj.bin", size - 50, 100, tail, err, sizeof(err));
  CHECK(rc == CKPTIO_E_SHORT_IO, "past the end: rc %d: %s", rc, err);
  rc = ckptio_s3_get_range(c, b, "mp/obj.bin", size + 10, 10, tail, err, sizeof(err));
  CHECK(rc == CKPTIO_E_SHORT_IO && strstr(err, "416"), "beyond the end: rc %d: %s", rc, err);

  /* A part under 5 MiB but the last: S3 refuses at complete, and the
   * message says what S3 said. */
  char id[CKPTIO_S3_UPLOAD_ID_MAX];
  ckptio_s3_part parts[2] = {{1, ""}, {2, ""}};
  CHECK(ckptio_s3_multipart_create(c, b, "mp/small-parts", id, err, sizeof(err)) == 0, "%s", err);
  CHECK(ckptio_s3_multipart_upload_part(c, b, "mp/small-parts", id, 1, data, 1000, parts[0].etag, err, sizeof(err)) == 0,
        "%s", err);
  CHECK(ckptio_s3_multipart_upload_part(c, b, "mp/small-parts", id, 2, data, 1000, parts[1].etag, err, sizeof(err)) == 0,
        "%s", err);
  rc = ckptio_s3_multipart_complete(c, b, "mp/small-parts", id, parts, 2, err, sizeof(err));
  CHECK(rc == CKPTIO_E_INVALID_ARG && strstr(err, "HTTP 400 EntityTooSmall"), "small parts: %d %s", rc, err);
  ckptio_s3_delete_object(c, b, "mp/small-parts", err, sizeof(err));
  ckptio_s3_multipart_abort(c, b, "mp/small-parts", id, err, sizeof(err));

  /* PUT and GET of a small object under a key that needs encoding. */
  const char *odd = "odd keys/a b+c=d&e%f é~!.txt";
  CHECK(ckptio_s3_put_object(c, b, odd, "hello, s3", 9, o.etag, err, sizeof(err)) == 0 && o.etag[0], "put: %s",
        err);
  char got[16] = "";
  CHECK(ckptio_s3_get_range(c, b, odd, 0, 9, got, err, sizeof(err)) == 0 && !memcmp(got, "hello, s3", 9), "get: %s",
        err);
  CHECK(ckptio_s3_get_range(c, b, odd, 7, 2, got, err, sizeof(err)) == 0 && !memcmp(got, "s3", 2), "get: %s", err);
  CHECK(ckptio_s3_put_object(c, b, "empty", NULL, 0, NULL, err, sizeof(err)) == 0, "empty put: %s", err);

  /* Reads pinned to the version opened: a replaced object is -ESTALE. */
  ckptio_s3_object v1;
  CHECK(ckptio_s3_put_object(c, b, "versioned", "version one", 11, NULL, err, sizeof(err)) == 0, "%s", err);
  CHECK(ckptio_s3_head(c, b, "versioned", &v1, err, sizeof(err)) == 0 && v1.etag[0], "%s", err);
  CHECK(ckptio_s3_get_range_if(c, b, "versioned", v1.etag, 0, 7, got, err, sizeof(err)) == 0 &&
            !memcmp(got, "version", 7), "same version: %s", err);
  CHECK(ckptio_s3_put_object(c, b, "versioned", "VERSION TWO", 11, NULL, err, sizeof(err)) == 0, "%s", err);
  rc = ckptio_s3_get_range_if(c, b, "versioned", v1.etag, 0, 7, got, err, sizeof(err));
  CHECK(rc == -ESTALE && strstr(err, "HTTP 412 PreconditionFailed"), "replaced: %d %s", rc, err);
  printf("replaced under a read: %s\n", err);
  CHECK(ckptio_s3_get_range_if(c, b, "versioned", NULL, 0, 7, got, err, sizeof(err)) == 0 &&
            !memcmp(got, "VERSION", 7), "any version: %s", err);
  CHECK(ckptio_s3_head(c, b, "empty", &o, err, sizeof(err)) == 0 && o.size == 0, "empty head: %s", err);

  /* A key near S3's 1024-byte limit: the message keeps S3's error. */
  char longkey[1025];
  memset(longkey, 'k', 1024);
  longkey[1024] = '\0';
  rc = ckptio_s3_get_range(c, b, longkey, 0, 10, tail, err, sizeof(err));
  CHECK(rc == CKPTIO_E_NOT_FOUND && strstr(err, "HTTP 404 NoSuchKey") && strstr(err, "kkk...kkk"), "%d %s", rc, err);

  /* list (paged: 3 keys a page) and delete. */
  ckptio_s3_config small_pages = {.list_page_size = 3};
  ckptio_s3_client *pc = client_or_die(&small_pages);
  char key[64];
  for (int i = 0; i < 10; i++) {
    snprintf(key, sizeof(key), "list/k%02d", i);
    CHECK(ckptio_s3_put_object(c, b, key, key, strlen(key), NULL, err, sizeof(err)) == 0, "%s", err);
  }
  names n = {0};
  uint64_t before = (ckptio_s3_client_stats(pc, &st), st.requests);
  CHECK(ckptio_s3_list_objects(pc, b, "list/", name_object, &n, err, sizeof(err)) == 0, "%s", err);
  ckptio_s3_client_stats(pc, &st);
  CHECK(n.n == 10 && !strcmp(n.keys[0], "list/k00") && !strcmp(n.keys[9], "list/k09"), "listed %d: %s..%s", n.n,
        n.keys[0], n.keys[9]);
  CHECK(st.requests - before >= 4, "10 keys at 3 a page in %" PRIu64 " requests", st.requests - before);
  n.n = 0;
  CHECK(ckptio_s3_list_objects(c, b, "odd keys/", name_object, &n, err, sizeof(err)) == 0 && n.n == 1 &&
            !strcmp(n.keys[0], odd), "odd key listed as '%s'", n.keys[0]);
  for (int i = 0; i < 10; i += 2) {
    snprintf(key, sizeof(key), "list/k%02d", i);
    CHECK(ckptio_s3_delete_object(c, b, key, err, sizeof(err)) == 0, "%s", err);
  }
  int count = 0;
  CHECK(ckptio_s3_list_objects(c, b, "list/", count_object, &count, err, sizeof(err)) == 0 && count == 5,
        "after deleting 5 of 10: %d", count);
  rc = ckptio_s3_head(c, b, "list/k00", &o, err, sizeof(err));
  CHECK(rc == CKPTIO_E_NOT_FOUND && strstr(err, "404"), "head of a deleted key: %d %s", rc, err);

  /* Abort: an open upload listed, then gone; abort_uploads sweeps a prefix
   * (through 2-a-page listings, which SeaweedFS pages wrongly: it pages
   * uploads by id, not key, and names no NextKeyMarker). */
  char ids[5][CKPTIO_S3_UPLOAD_ID_MAX];
  for (int i = 0; i < 5; i++) {
    snprintf(key, sizeof(key), "crashed/save-%d", i);
    CHECK(ckptio_s3_multipart_create(c, b, key, ids[i], err, sizeof(err)) == 0, "%s", err);
    CHECK(ckptio_s3_multipart_upload_part(c, b, key, ids[i], 1, data, PART, parts[0].etag, err, sizeof(err)) == 0,
          "%s", err);
  }
  CHECK(ckptio_s3_multipart_create(c, b, "kept/upload", id, err, sizeof(err)) == 0, "%s", err);
  n.n = 0;
  CHECK(ckptio_s3_list_uploads(c, b, "crashed/", name_upload, &n, err, sizeof(err)) == 0 && n.n == 5,
        "open uploads under crashed/: %d (%s)", n.n, err);
  n.n = 0;
  CHECK(ckptio_s3_list_uploads(pc, b, "crashed/", name_upload, &n, err, sizeof(err)) == 0 && n.n >= 3,
        "open uploads under crashed/, 3 a page: %d (%s)", n.n, err);
  printf("open uploads listed 3 a page: %d of 5\n", n.n);
  CHECK(ckptio_s3_multipart_abort(c, b, "crashed/save-0", ids[0], err, sizeof(err)) == 0, "%s", err);
  n.n = 0;
  CHECK(ckptio_s3_list_uploads(c, b, "crashed/", name_upload, &n, err, sizeof(err)) == 0 && n.n == 4,
        "after one abort: %d", n.n);
  for (int i = 0; i < n.n && i < 4; i++) CHECK(strcmp(n.keys[i], "crashed/save-0"), "the aborted upload is listed");
  CHECK(ckptio_s3_multipart_abort(c, b, "crashed/save-0", ids[0], err, sizeof(err)) == 0, "abort twice: %s", err);
  rc = ckptio_s3_abort_uploads(pc, b, "crashed/", err, sizeof(err));
  CHECK(rc == 4, "abort_uploads: %d %s", rc, err);
  n.n = 0;
  CHECK(ckptio_s3_list_uploads(c, b, "", name_upload, &n, err, sizeof(err)) == 0 && n.n == 1 &&
            !strcmp(n.keys[0], "kept/upload"), "left open: %d %s", n.n, n.n ? n.keys[0] : "");
  count = 0;
  CHECK(ckptio_s3_list_objects(c, b, "crashed/", count_object, &count, err, sizeof(err)) == 0 && count == 0,
        "aborted uploads left %d objects", count);
  CHECK(ckptio_s3_abort_uploads(c, b, "kept/", err, sizeof(err)) == 1, "%s", err);

  /* Errors a user understands. */
  rc = ckptio_s3_get_range(c, b, "no/such/key", 0, 10, tail, err, sizeof(err));
  CHECK(rc == CKPTIO_E_NOT_FOUND && strstr(err, "HTTP 404 NoSuchKey") && strstr(err, "/no/such/key"), "%d %s", rc,
        err);
  printf("missing key: %s\n", err);
  rc = ckptio_s3_get_range(c, "no-such-bucket", "k", 0, 10, tail, err, sizeof(err));
  CHECK(rc == CKPTIO_E_NOT_FOUND && strstr(err, "HTTP 404 NoSuchBucket"), "%d %s", rc, err);
  printf("missing bucket: %s\n", err);
  rc = ckptio_s3_put_object(c, "no-such-bucket-either", "k", "x", 1, NULL, err, sizeof(err));
  CHECK(rc == CKPTIO_E_NOT_FOUND && strstr(err, "NoSuchBucket"), "put to a missing bucket: %d %s", rc, err);
  rc = ckptio_s3_multipart_create(c, "no-such-bucket-either", "k", id, err, sizeof(err));
  CHECK(rc == CKPTIO_E_NOT_FOUND && strstr(err, "NoSuchBucket"), "multipart to a missing bucket: %d %s", rc, err);
  ckptio_s3_config wrong = {.secret_key = "not-the-secret"};
  ckptio_s3_client *w = client_or_die(&wrong);
  rc = ckptio_s3_get_range(w, b, "mp/obj.bin", 0, 10, tail, err, sizeof(err));
  CHECK(rc == -EACCES && strstr(err, "HTTP 403 SignatureDoesNotMatch"), "%d %s", rc, err);
  printf("wrong secret: %s\n", err);
  rc = ckptio_s3_put_object(w, b, "should-not-exist", "x", 1, NULL, err, sizeof(err));
  CHECK(rc == -EACCES, "put with a wrong secret: %d %s", rc, err);
  CHECK(ckptio_s3_head(c, b, "should-not-exist", &o, err, sizeof(err)) == CKPTIO_E_NOT_FOUND,
        "a refused put made the object");
  ckptio_s3_client_free(w);
  ckptio_s3_config unknown = {.access_key = "AKIDUNKNOWN"};
  w = client_or_die(&unknown);
  rc = ckptio_s3_head(w, b, "mp/obj.bin", &o, err, sizeof(err));
  CHECK(rc == -EACCES && strstr(err, "HTTP 403") && strstr(err, "InvalidAccessKeyId"), "%d %s", rc, err);
  printf("head, unknown key: %s\n", err);
  rc = ckptio_s3_list_objects(w, b, "", count_object, &count, err, sizeof(err));
  CHECK(rc == -EACCES && strstr(err, "InvalidAccessKeyId"), "%d %s", rc, err);
  printf("unknown key: %s\n", err);
  ckptio_s3_client_free(w);
  ckptio_s3_config token = {.session_token = "not-a-token"};
  w = client_or_die(&token);
  rc = ckptio_s3_get_range(w, b, "mp/obj.bin", 0, 10, tail, err, sizeof(err));
  CHECK(rc == -EACCES && strstr(err, "403"), "a bad session token is sent and refused: %d %s", rc, err);
  ckptio_s3_client_free(w);

  ckptio_s3_client_free(pc);
  ckptio_s3_client_free(c);
  free(data);
}

/* ------------------------------------------------------------ kill */

typedef struct {
  ckptio_s3_client *c;
  int upload; /* else GET */
  const char *key;
  const unsigned char *data;
  size_t size;
  int rc, ok;
  double ended;
  char err[CKPTIO_ERRLEN];
  char upload_id[CKPTIO_S3_UPLOAD_ID_MAX];
} busy_job;

/* Transfers in a loop until one fails (the server is killed under it). */
static void *busy_worker(void *arg) {
  busy_job *j = arg;
  unsigned char *buf = j->upload ? NULL : malloc(j->size);
  char etag[CKPTIO_S3_ETAG_MAX];
  for (int part = 1; part <= 10000; part++) {
    j->rc = j->upload ? ckptio_s3_multipart_upload_part(j->c, bucket(), j->key, j->upload_id, part, j->data, j->size,
                                                         etag, j->err, sizeof(j->err))
                      : ckptio_s3_get_range(j->c, bucket(), j->key, 0, j->size, buf, j->err, sizeof(j->err));
    if (j->rc < 0) break;
    if (!j->upload && memcmp(buf, j->data, j->size) != 0) {
      j->rc = -1000000;
      snprintf(j->err, sizeof(j->err), "a GET succeeded with wrong bytes");
      break;
    }
    __atomic_add_fetch(&j->ok, 1, __ATOMIC_SEQ_CST);
  }
  j->ended = now();
  free(buf);
  return NULL;
}

/* Until every thread has moved a whole object or part (so the next one is
 * under way), at most 10 s (a sanitizer build is slow). */
static void wait_busy(busy_job *jobs, int n) {
  double t0 = now();
  for (int i = 0; i < n && now() - t0 < 10; i++) {
    while (__atomic_load_n(&jobs[i].ok, __ATOMIC_SEQ_CST) == 0 && now() - t0 < 10) usleep(20000);
  }
  usleep(100000);
}

static void test_kill(void) {
  const char *pid_s = getenv("CKPTIO_WEED_PID");
  if (!pid_s) {
    printf("SKIP: CKPTIO_WEED_PID is not set (run under tests/s3/weed_server.py)\n");
    exit(77);
  }
  char err[CKPTIO_ERRLEN];
  ckptio_s3_config cfg = {.max_attempts = 3, .backoff_base_ms = 20, .backoff_max_ms = 200,
                          .connect_timeout_ms = 2000, .low_speed_seconds = 3};
  ckptio_s3_client *c = client_or_die(&cfg);
  size_t size = 32u << 20;
  unsigned char *data = malloc(size);
  fill(data, size, 7, 0);
  CHECK(upload(c, "kill/obj", data, size, 4, err, sizeof(err)) == 0, "%s", err);
  enum { N = 6 };
  busy_job jobs[N];
  pthread_t t[N];
  for (int i = 0; i < N; i++) {
    jobs[i] = (busy_job){.c = c, .upload = i % 2, .key = i % 2 ? "kill/upload" : "kill/obj", .data = data,
                         .size = i % 2 ? PART : size};
    if (jobs[i].upload)
      CHECK(ckptio_s3_multipart_create(c, bucket(), "kill/upload", jobs[i].upload_id, err, sizeof(err)) == 0, "%s",
            err);
  }
  for (int i = 0; i < N; i++) pthread_create(&t[i], NULL, busy_worker, &jobs[i]);
  wait_busy(jobs, N);
  double killed = now();
  CHECK(kill(-atoi(pid_s), SIGKILL) == 0, "kill the server's group %s: %s", pid_s, strerror(errno));
  for (int i = 0; i < N; i++) {
    pthread_join(t[i], NULL);
    const char *what = jobs[i].upload ? "UploadPart" : "GetObject";
    printf("%s after %d good transfers: failed %.2f s after the kill: %s\n", what, jobs[i].ok,
           jobs[i].ended - killed, jobs[i].err);
    CHECK(jobs[i].ok > 0, "%s: no transfer before the kill", what);
    CHECK(jobs[i].rc == -ECONNREFUSED || jobs[i].rc == -ECONNRESET || jobs[i].rc == CKPTIO_E_SHORT_IO,
          "%s: rc %d: %s", what, jobs[i].rc, jobs[i].err);
    CHECK(strstr(jobs[i].err, what) && strstr(jobs[i].err, "http://127.0.0.1:"), "%s", jobs[i].err);
    CHECK(jobs[i].ended - killed < 10, "%s took %.1f s to fail", what, jobs[i].ended - killed);
  }
  ckptio_s3_client_free(c);
  free(data);
}

/* A server that stops answering (SIGSTOP: its sockets stay open, the
 * kernel still accepts connections) must not hang a transfer: the
 * low-speed limit ends each attempt, and the attempts are bounded. */
static void test_freeze(void) {
  const char *pid_s = getenv("CKPTIO_WEED_PID");
  if (!pid_s) {
    printf("SKIP: CKPTIO_WEED_PID is not set (run under tests/s3/weed_server.py)\n");
    exit(77);
  }
  char err[CKPTIO_ERRLEN];
  /* 64 KiB/s: a stopped server's kernel still trickles an upload into its
   * socket buffers for a while, which a 1 byte/s floor would wait out. */
  ckptio_s3_config cfg = {.max_attempts = 2, .backoff_base_ms = 10, .backoff_max_ms = 50,
                          .connect_timeout_ms = 2000, .low_speed_seconds = 2, .low_speed_bytes = 64 << 10};
  ckptio_s3_client *c = client_or_die(&cfg);
  size_t size = 32u << 20;
  unsigned char *data = malloc(size);
  fill(data, size, 9, 0);
  CHECK(upload(c, "freeze/obj", data, size, 4, err, sizeof(err)) == 0, "%s", err);
  enum { N = 4 };
  busy_job jobs[N];
  pthread_t t[N];
  for (int i = 0; i < N; i++) {
    jobs[i] = (busy_job){.c = c, .upload = i % 2, .key = i % 2 ? "freeze/upload" : "freeze/obj", .data = data,
                         .size = i % 2 ? PART : size};
    if (jobs[i].upload)
      CHECK(ckptio_s3_multipart_create(c, bucket(), "freeze/upload", jobs[i].upload_id, err, sizeof(err)) == 0,
            "%s", err);
  }
  for (int i = 0; i < N; i++) pthread_create(&t[i], NULL, busy_worker, &jobs[i]);
  wait_busy(jobs, N);
  double stopped = now();
  CHECK(kill(-atoi(pid_s), SIGSTOP) == 0, "stop the server's group %s: %s", pid_s, strerror(errno));
  for (int i = 0; i < N; i++) {
    pthread_join(t[i], NULL);
    const char *what = jobs[i].upload ? "UploadPart" : "GetObject";
    printf("%s after %d good transfers: failed %.2f s after the server froze: %s\n", what, jobs[i].ok,
           jobs[i].ended - stopped, jobs[i].err);
    CHECK(jobs[i].rc == -ETIMEDOUT && strstr(jobs[i].err, "after 2 attempts"), "%s: rc %d: %s", what, jobs[i].rc,
          jobs[i].err);
    /* Bounded: libcurl judges the speed by its average over the last ~5 s,
     * so an attempt that was moving ends 5 + 2 s after the freeze; an
     * upload also waits 1 s for "100 Continue". 2 attempts: < 20 s. */
    CHECK(jobs[i].ended - stopped < 20, "%s took %.1f s to fail", what, jobs[i].ended - stopped);
  }
  kill(-atoi(pid_s), SIGCONT);
  ckptio_s3_client_free(c);
  free(data);
}

/* ------------------------------------------------------------ no libcurl */

/* What a machine without a usable libcurl gets. Run with
 * CKPTIO_FAULT_LIBCURL naming a library that is not one (a build with fault
 * injection tries it instead of libcurl.so.4): the client, and every
 * s3:// open through the public API, fail with one sentence saying libcurl
 * 4 is needed, why it did not load (`expect`) and how to install it, the
 * same every time; the process never maps a libcurl (the library does not
 * link it). */
static void test_no_libcurl(const char *expect) {
  const char *fault = getenv("CKPTIO_FAULT_LIBCURL");
  if (!fault || !*fault) {
    fprintf(stderr, "FAIL: test_s3 no-libcurl runs with CKPTIO_FAULT_LIBCURL set\n");
    failures++;
    return;
  }
  char err[CKPTIO_ERRLEN];
  ckptio_s3_config creds = {.access_key = "k", .secret_key = "s"};
  for (int i = 1; i <= 2; i++) { /* the second answer is the first one, kept */
    ckptio_s3_client *c = NULL;
    err[0] = '\0';
    int rc = ckptio_s3_client_create(&creds, &c, err, sizeof(err));
    printf("client #%d: rc %d: %s\n", i, rc, err);
    CHECK(rc == CKPTIO_E_FORMAT && !c, "client #%d: rc %d", i, rc);
    CHECK(strstr(err, "needs libcurl 4") && strstr(err, fault) && strstr(err, expect), "%s", err);
    CHECK(strstr(err, "apt-get install libcurl4") && strstr(err, "dnf install libcurl"), "no install hint: %s", err);
    if (c) ckptio_s3_client_free(c);
  }
  ckptio_ctx *ctx = NULL;
  CHECK(ckptio_ctx_create(NULL, &ctx) == 0, "ckptio_ctx_create: %s", ckptio_last_open_error());
  if (!ctx) return;
  ckptio_reader *r = NULL;
  int rc = ckptio_reader_open(ctx, "s3://ckptio-test/m.safetensors", NULL, &r);
  const char *msg = ckptio_last_open_error();
  printf("reader open: rc %d: %s\n", rc, msg);
  CHECK(rc == CKPTIO_E_FORMAT && !r && strstr(msg, "s3://ckptio-test/m.safetensors: ") &&
            strstr(msg, "needs libcurl 4") && strstr(msg, expect) && strstr(msg, "apt-get install libcurl4"),
        "reader open: rc %d: %s", rc, msg);
  if (r) ckptio_reader_close(r);
  ckptio_writer *w = NULL;
  rc = ckptio_writer_open(ctx, "s3://ckptio-test/w.safetensors", CKPTIO_FORMAT_SAFETENSORS, NULL, &w);
  msg = ckptio_last_open_error();
  printf("writer open: rc %d: %s\n", rc, msg);
  CHECK(rc == CKPTIO_E_FORMAT && !w && strstr(msg, "s3://ckptio-test/w.safetensors: ") &&
            strstr(msg, "needs libcurl 4") && strstr(msg, expect),
        "writer open: rc %d: %s", rc, msg);
  if (w) ckptio_writer_close(w);
  ckptio_ctx_free(ctx);
  FILE *maps = fopen("/proc/self/maps", "r");
  CHECK(maps != NULL, "/proc/self/maps: %s", strerror(errno));
  char line[4096];
  while (maps && fgets(line, sizeof(line), maps)) CHECK(!strstr(line, "/libcurl"), "libcurl is mapped: %s", line);
  if (maps) fclose(maps);
}

/* ------------------------------------------------------------ tools */

static unsigned char *slurp(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *p = malloc((size_t)n + 1);
  *size = fread(p, 1, (size_t)n, f);
  fclose(f);
  return p;
}

typedef struct {
  ckptio_s3_client *c;
  const char *key;
  unsigned char *buf;
  size_t size, chunk;
  int next, rc;
  pthread_mutex_t lock;
} bench_job;

static void *bench_get_worker(void *arg) {
  bench_job *j = arg;
  char err[CKPTIO_ERRLEN];
  for (;;) {
    pthread_mutex_lock(&j->lock);
    size_t off = (size_t)j->next++ * j->chunk;
    pthread_mutex_unlock(&j->lock);
    if (off >= j->size) return NULL;
    size_t len = j->size - off < j->chunk ? j->size - off : j->chunk;
    int rc = ckptio_s3_get_range(j->c, bucket(), j->key, off, len, j->buf + off, err, sizeof(err));
    if (rc < 0) {
      fprintf(stderr, "%s\n", err);
      j->rc = rc;
      return NULL;
    }
  }
}

/* bench KEY SIZE_MIB THREADS CHUNK_MIB: a multipart upload of SIZE_MIB
 * (CHUNK_MIB parts, at least 5 MiB, from THREADS threads), then every byte read back by
 * ranged GETs of CHUNK_MIB from THREADS threads; prints both rates. */
static int bench(char **argv) {
  char err[CKPTIO_ERRLEN];
  ckptio_s3_client *c = client_or_die(NULL);
  size_t size = (size_t)atol(argv[3]) << 20, chunk = (size_t)atol(argv[5]) << 20;
  int threads = atoi(argv[4]);
  if (threads < 1 || threads > 16 || !size || !chunk) return 2;
  unsigned char *data = malloc(size), *back = malloc(size);
  fill(data, size, 3, 0);
  double t0 = now();
  int rc = upload_parts(c, argv[2], data, size, chunk < PART ? PART : chunk, threads, err, sizeof(err));
  double up = now() - t0;
  if (rc < 0) fprintf(stderr, "upload: %s\n", err);
  bench_job j = {.c = c, .key = argv[2], .buf = back, .size = size, .chunk = chunk};
  pthread_mutex_init(&j.lock, NULL);
  pthread_t t[16];
  t0 = now();
  for (int i = 0; i < threads && rc == 0; i++) pthread_create(&t[i], NULL, bench_get_worker, &j);
  for (int i = 0; i < threads && rc == 0; i++) pthread_join(t[i], NULL);
  double down = now() - t0;
  if (rc == 0) rc = j.rc;
  if (rc == 0 && memcmp(data, back, size) != 0) rc = -1;
  ckptio_s3_stats st;
  ckptio_s3_client_stats(c, &st);
  if (rc == 0)
    printf("ckptio_s3 upload_MBps %.1f get_MBps %.1f (size %zu MiB, %d threads, %zu MiB ranges, %" PRIu64
           " connections, %" PRIu64 " retries)\n", size / up / 1e6, size / down / 1e6, size >> 20, threads,
           chunk >> 20, st.connects, st.retries);
  pthread_mutex_destroy(&j.lock);
  free(data);
  free(back);
  ckptio_s3_client_free(c);
  return rc < 0 ? 1 : 0;
}

static int tool(int argc, char **argv) {
  if (!strcmp(argv[1], "bench")) {
    if (argc != 6) {
      fprintf(stderr, "usage: test_s3 bench KEY SIZE_MIB THREADS CHUNK_MIB\n");
      return 2;
    }
    return bench(argv);
  }
  char err[CKPTIO_ERRLEN];
  ckptio_s3_client *c = client_or_die(NULL);
  int rc = CKPTIO_E_INVALID_ARG;
  snprintf(err, sizeof(err), "usage: test_s3 cat KEY | put KEY FILE | upload KEY FILE THREADS");
  if (!strcmp(argv[1], "cat") && argc == 3) {
    ckptio_s3_object o;
    rc = ckptio_s3_head(c, bucket(), argv[2], &o, err, sizeof(err));
    unsigned char *buf = rc == 0 ? malloc(o.size + 1) : NULL;
    if (rc == 0) rc = ckptio_s3_get_range(c, bucket(), argv[2], 0, o.size, buf, err, sizeof(err));
    if (rc == 0 && fwrite(buf, 1, o.size, stdout) != o.size) rc = -EIO;
    free(buf);
  } else if ((!strcmp(argv[1], "put") && argc == 4) || (!strcmp(argv[1], "upload") && argc == 5)) {
    size_t size = 0;
    unsigned char *data = slurp(argv[3], &size);
    if (!data) {
      fprintf(stderr, "cannot read %s\n", argv[3]);
      return 1;
    }
    if (argv[1][0] == 'p') {
      rc = ckptio_s3_put_object(c, bucket(), argv[2], data, size, NULL, err, sizeof(err));
    } else {
      int threads = atoi(argv[4]);
      rc = upload(c, argv[2], data, size, threads < 1 ? 1 : threads > 16 ? 16 : threads, err, sizeof(err));
    }
    free(data);
  }
  ckptio_s3_client_free(c);
  if (rc < 0) fprintf(stderr, "test_s3 %s: %s\n", argv[1], err);
  return rc < 0 ? 1 : 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 2) {
    fprintf(stderr, "usage: test_s3 url|retry|server|kill|freeze|no-libcurl EXPECT, or a tool (see the file's head)\n");
    return 2;
  }
  if (!strcmp(argv[1], "has-s3")) {
    /* 0 when this build has the S3 client, else 77 with absent.c's reason. */
    ckptio_s3_config creds = {.access_key = "k", .secret_key = "s"};
    ckptio_s3_client_free(client_or_die(&creds));
    return 0;
  }
  if (!strcmp(argv[1], "cat") || !strcmp(argv[1], "put") || !strcmp(argv[1], "upload") || !strcmp(argv[1], "bench"))
    return tool(argc, argv);
  if (strcmp(argv[1], "url") != 0 && strcmp(argv[1], "retry") != 0 && !getenv("AWS_ENDPOINT_URL")) {
    if (strcmp(argv[1], "server") == 0 || strcmp(argv[1], "kill") == 0 || strcmp(argv[1], "freeze") == 0) {
      printf("SKIP: AWS_ENDPOINT_URL is not set (run under tests/s3/weed_server.py)\n");
      return 77;
    }
  }
  double t0 = now();
  if (!strcmp(argv[1], "url")) test_url();
  else if (!strcmp(argv[1], "retry")) test_retry();
  else if (!strcmp(argv[1], "server")) test_server();
  else if (!strcmp(argv[1], "kill")) test_kill();
  else if (!strcmp(argv[1], "freeze")) test_freeze();
  else if (!strcmp(argv[1], "no-libcurl") && argc == 3) test_no_libcurl(argv[2]);
  else {
    fprintf(stderr, "unknown group %s\n", argv[1]);
    return 2;
  }
  printf("%s: %s in %.1f s (%d failures)\n", argv[1], failures ? "FAIL" : "ok", now() - t0, failures);
  return failures ? 1 : 0;
}
