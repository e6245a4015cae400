/* The server's own upload ceiling for bench/s3 (issue 27): one multipart
 * upload of BYTES bytes by a plain libcurl client, PART_BYTES parts from
 * THREADS threads at once, nothing else (no checkpoint format, no staging
 * ring, no CRC), so a saver's figure can be set beside what the server
 * takes from the simplest client in the same minute.
 *
 *   s3_put BUCKET KEY BYTES THREADS PART_BYTES
 *
 * The bytes: one buffer, filled with pseudo-random bytes and touched
 * before the clock starts (a server that compresses or dedups gains
 * nothing). The time runs from CreateMultipartUpload to the reply of
 * CompleteMultipartUpload: what a save has inside its own time. Settings
 * from the environment as AWS tools take them: AWS_ENDPOINT_URL
 * (path-style), AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION;
 * requests signed by libcurl's own SigV4 with an unsigned payload (as
 * src/s3 and boto3 send parts), libcurl's defaults otherwise (its
 * "Expect: 100-continue" on a part included: removing the header with an
 * empty "Expect:" breaks the signature, curl 7.88 signs it). Each thread keeps one easy
 * handle, so one keep-alive connection, and takes the next part from a
 * shared counter until none is left. The object is left in place (the
 * caller removes it).
 *
 * Prints one JSON object: {"bytes", "seconds", "cpu_s" (user + system of
 * every thread, inside the time), "parts", "threads",
 * "part_bytes"}. Exit 1 with a sentence on any failure. Built by
 * bench/s3/run.sh with `cc -O2 ... -lcurl -lpthread`. */
#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <time.h>

#define ETAG_MAX 128

typedef struct job {
  char url[2048];
  char sigv4[128];
  char upload_id[1024]; /* URL-escaped */
  const char *key, *secret;
  uint64_t size, part;
  int nparts;
  char (*etags)[ETAG_MAX];
  atomic_int next; /* index of the next part */
  atomic_int failed;
  const unsigned char *buf;
} job;

typedef struct body {
  const unsigned char *p;
  size_t len, sent;
} body;

typedef struct reply {
  char text[64 * 1024]; /* the reply body, cut (an UploadId or an error) */
  size_t len;
  char etag[ETAG_MAX];
} reply;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static size_t on_body(char *p, size_t sz, size_t n, void *arg) {
  reply *r = arg;
  size_t len = sz * n, room = sizeof(r->text) - 1 - r->len;
  memcpy(r->text + r->len, p, len < room ? len : room);
  r->len += len < room ? len : room;
  r->text[r->len] = '\0';
  return len;
}

static size_t on_header(char *p, size_t sz, size_t n, void *arg) {
  reply *r = arg;
  size_t len = sz * n;
  if (len > 5 && !strncasecmp(p, "etag:", 5)) {
    const char *v = p + 5, *end = p + len;
    while (v < end && (*v == ' ' || *v == '"')) v++;
    size_t k = 0;
    while (v + k < end && v[k] != '"' && v[k] != '\r' && v[k] != '\n' && k + 1 < ETAG_MAX) k++;
    memcpy(r->etag, v, k);
    r->etag[k] = '\0';
  }
  return len;
}

static size_t on_read(char *p, size_t sz, size_t n, void *arg) {
  body *b = arg;
  size_t len = sz * n, left = b->len - b->sent;
  if (len > left) len = left;
  memcpy(p, b->p + b->sent, len);
  b->sent += len;
  return len;
}

/* A handle for the object's URL plus `query`, signed, its reply into r. */
static CURL *handle(const job *j, CURL *h, const char *query, reply *r, struct curl_slist *hdr) {
  char url[4096];
  snprintf(url, sizeof(url), "%s%s%s", j->url, query ? "?" : "", query ? query : "");
  curl_easy_reset(h); /* keeps the connection */
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_AWS_SIGV4, j->sigv4);
  curl_easy_setopt(h, CURLOPT_USERNAME, j->key);
  curl_easy_setopt(h, CURLOPT_PASSWORD, j->secret);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
  return h;
}

static struct curl_slist *headers(const char *content_type) {
  struct curl_slist *h = curl_slist_append(NULL, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
  if (content_type) h = curl_slist_append(h, content_type);
  return h;
}

static int perform(CURL *h, const char *what, reply *r) {
  long status = 0;
  CURLcode rc = curl_easy_perform(h);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  if (rc != CURLE_OK || status != 200) {
    fprintf(stderr, "s3_put: %s: %s, HTTP %ld: %.300s\n", what, curl_easy_strerror(rc), status, r->text);
    return -1;
  }
  return 0;
}

static void *worker(void *arg) {
  job *j = arg;
  CURL *h = curl_easy_init();
  struct curl_slist *hdr = headers(NULL);
  static _Thread_local reply r;
  for (; h && hdr;) {
    int i = atomic_fetch_add(&j->next, 1);
    if (i >= j->nparts || atomic_load(&j->failed)) break;
    uint64_t off = (uint64_t)i * j->part, len = j->size - off < j->part ? j->size - off : j->part;
    char query[1200];
    snprintf(query, sizeof(query), "partNumber=%d&uploadId=%s", i + 1, j->upload_id);
    r.len = 0;
    r.text[0] = r.etag[0] = '\0';
    body b = {j->buf + off, (size_t)len, 0};
    handle(j, h, query, &r, hdr);
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)len);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
    curl_easy_setopt(h, CURLOPT_READDATA, &b);
    curl_easy_setopt(h, CURLOPT_UPLOAD_BUFFERSIZE, 2L * 1024 * 1024);
    if (perform(h, "UploadPart", &r) < 0 || !r.etag[0]) {
      if (!r.etag[0]) fprintf(stderr, "s3_put: UploadPart %d: no ETag\n", i + 1);
      atomic_store(&j->failed, 1);
      break;
    }
    snprintf(j->etags[i], ETAG_MAX, "%s", r.etag);
  }
  if (!h || !hdr) atomic_store(&j->failed, 1);
  curl_slist_free_all(hdr);
  if (h) curl_easy_cleanup(h);
  return NULL;
}

/* The text of <tag> in s, or NULL. */
static int xml_text(const char *s, const char *tag, char *out, size_t cap) {
  char open[64], close[64];
  snprintf(open, sizeof(open), "<%s>", tag);
  snprintf(close, sizeof(close), "</%s>", tag);
  const char *b = strstr(s, open), *e = b ? strstr(b, close) : NULL;
  if (!b || !e) return -1;
  b += strlen(open);
  size_t n = (size_t)(e - b);
  if (n + 1 > cap) return -1;
  memcpy(out, b, n);
  out[n] = '\0';
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: s3_put BUCKET KEY BYTES THREADS PART_BYTES\n");
    return 2;
  }
  const char *ep = getenv("AWS_ENDPOINT_URL"), *region = getenv("AWS_REGION");
  static job j;
  j.key = getenv("AWS_ACCESS_KEY_ID");
  j.secret = getenv("AWS_SECRET_ACCESS_KEY");
  if (!ep || !j.key || !j.secret) {
    fprintf(stderr, "s3_put: set AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY\n");
    return 2;
  }
  j.size = strtoull(argv[3], NULL, 10);
  int threads = atoi(argv[4]);
  j.part = strtoull(argv[5], NULL, 10);
  if (!j.size || threads < 1 || threads > 1024 || j.part < (5u << 20)) {
    fprintf(stderr, "s3_put: bad BYTES, THREADS or PART_BYTES (at least 5 MiB)\n");
    return 2;
  }
  j.nparts = (int)((j.size + j.part - 1) / j.part);
  if (j.nparts > 10000) {
    fprintf(stderr, "s3_put: more than 10,000 parts\n");
    return 2;
  }
  snprintf(j.url, sizeof(j.url), "%s/%s/%s", ep, argv[1], argv[2]);
  snprintf(j.sigv4, sizeof(j.sigv4), "aws:amz:%s:s3", region ? region : "us-east-1");
  unsigned char *buf = malloc(j.size);
  j.etags = calloc((size_t)j.nparts, ETAG_MAX);
  if (!buf || !j.etags) return 1;
  uint64_t x = 0x9e3779b97f4a7c15ull; /* xorshift64: incompressible, and every page touched */
  for (uint64_t i = 0; i + 8 <= j.size; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    memcpy(buf + i, &x, 8);
  }
  memset(buf + j.size / 8 * 8, 7, j.size % 8);
  j.buf = buf;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  CURL *h = curl_easy_init();
  static reply r;
  struct curl_slist *hdr = headers(NULL), *xml_hdr = headers("Content-Type: application/xml");
  pthread_t *t = calloc((size_t)threads, sizeof(*t));
  char id[1024];
  if (!h || !hdr || !xml_hdr || !t) return 1;

  struct rusage ru0, ru1;
  getrusage(RUSAGE_SELF, &ru0);
  double t0 = now();
  handle(&j, h, "uploads=", &r, hdr);
  curl_easy_setopt(h, CURLOPT_POST, 1L);
  curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, 0L);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
  if (perform(h, "CreateMultipartUpload", &r) < 0) return 1;
  if (xml_text(r.text, "UploadId", id, sizeof(id)) < 0) {
    fprintf(stderr, "s3_put: no UploadId in %.300s\n", r.text);
    return 1;
  }
  char *esc = curl_easy_escape(h, id, 0);
  snprintf(j.upload_id, sizeof(j.upload_id), "%s", esc);
  curl_free(esc);
  int started = 0;
  for (; started < threads; started++)
    if (pthread_create(&t[started], NULL, worker, &j)) break;
  for (int i = 0; i < started; i++) pthread_join(t[i], NULL);
  if (started < threads || atomic_load(&j.failed)) return 1;
  size_t cap = 128 + (size_t)j.nparts * (64 + ETAG_MAX), n = 0;
  char *xml = malloc(cap), query[1200];
  if (!xml) return 1;
  n += (size_t)snprintf(xml + n, cap - n, "<CompleteMultipartUpload>");
  for (int i = 0; i < j.nparts; i++)
    n += (size_t)snprintf(xml + n, cap - n, "<Part><PartNumber>%d</PartNumber><ETag>\"%s\"</ETag></Part>", i + 1,
                          j.etags[i]);
  n += (size_t)snprintf(xml + n, cap - n, "</CompleteMultipartUpload>");
  snprintf(query, sizeof(query), "uploadId=%s", j.upload_id);
  memset(&r, 0, sizeof(r));
  handle(&j, h, query, &r, xml_hdr);
  curl_easy_setopt(h, CURLOPT_POST, 1L);
  curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)n);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, xml);
  if (perform(h, "CompleteMultipartUpload", &r) < 0) return 1;
  if (!strstr(r.text, "CompleteMultipartUploadResult")) {
    fprintf(stderr, "s3_put: CompleteMultipartUpload: %.300s\n", r.text);
    return 1;
  }
  double dt = now() - t0;
  getrusage(RUSAGE_SELF, &ru1);
  double cpu = (double)(ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec + ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec) +
               (double)(ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec + ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec) /
                   1e6;
  printf("{\"bytes\": %llu, \"seconds\": %.6f, \"cpu_s\": %.3f, \"parts\": %d, \"threads\": %d, "
         "\"part_bytes\": %llu}\n", (unsigned long long)j.size, dt, cpu, j.nparts, threads, (unsigned long long)j.part);
  free(xml);
  free(t);
  free(buf);
  free(j.etags);
  curl_slist_free_all(hdr);
  curl_slist_free_all(xml_hdr);
  curl_easy_cleanup(h);
  curl_global_cleanup();
  return 0;
}
