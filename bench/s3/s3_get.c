/* The server's own ceiling for bench/s3 (issue 27): one object read by
 * parallel ranged GETs from a plain libcurl client, nothing else (no
 * checkpoint format, no staging ring, no CRC), so a loader's figure can be
 * set beside what the server gives the simplest client in the same minute.
 *
 *   s3_get BUCKET KEY THREADS CHUNK_BYTES [SINK]
 *
 * SINK: "discard" (the default: the body is dropped in the write callback),
 * "buffer" (every byte copied to its place in one buffer of the object's
 * size, touched before the clock starts) or "fresh" (the same buffer left
 * untouched, so its page faults are inside the time, as a loader that
 * fills new tensors pays them) or "thp" (as fresh, the buffer 2 MiB aligned
 * and madvise(MADV_HUGEPAGE)d: one fault per 2 MiB where THP is on). Settings from the environment as
 * AWS tools take them: AWS_ENDPOINT_URL (path-style), AWS_ACCESS_KEY_ID,
 * AWS_SECRET_ACCESS_KEY, AWS_REGION; requests signed by libcurl's own SigV4.
 * Each thread keeps one easy handle, so one keep-alive connection, and takes
 * the next range from a shared counter until none is left.
 *
 * Prints one JSON object: {"bytes", "seconds", "requests", "threads",
 * "chunk", "sink"}; the time runs from the first GET to the last byte (the
 * HEAD that finds the size is outside it). Exit 1 with a sentence on any
 * failure. Built by bench/s3/run.sh with `cc -O2 ... -lcurl -lpthread`. */
#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

typedef struct job {
  char url[2048];
  char sigv4[128];
  const char *key, *secret;
  uint64_t size, chunk;
  atomic_uint_fast64_t next;   /* index of the next range to fetch */
  atomic_int failed;
  unsigned char *buf;          /* NULL: discard */
} job;

typedef struct sink {
  unsigned char *dst; /* where the next body byte goes; NULL: discard */
  uint64_t got;
} sink;

static size_t on_body(char *p, size_t sz, size_t n, void *arg) {
  sink *s = arg;
  size_t len = sz * n;
  if (s->dst) memcpy(s->dst + s->got, p, len);
  s->got += len;
  return len;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static CURL *handle(const job *j) {
  CURL *h = curl_easy_init();
  if (!h) return NULL;
  curl_easy_setopt(h, CURLOPT_URL, j->url);
  curl_easy_setopt(h, CURLOPT_AWS_SIGV4, j->sigv4);
  curl_easy_setopt(h, CURLOPT_USERNAME, j->key);
  curl_easy_setopt(h, CURLOPT_PASSWORD, j->secret);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 512L * 1024); /* as src/s3: fewer callbacks */
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  return h;
}

static void *worker(void *arg) {
  job *j = arg;
  CURL *h = handle(j);
  if (!h) {
    atomic_store(&j->failed, 1);
    return NULL;
  }
  for (;;) {
    uint64_t i = atomic_fetch_add(&j->next, 1), off = i * j->chunk;
    if (off >= j->size || atomic_load(&j->failed)) break;
    uint64_t len = j->size - off < j->chunk ? j->size - off : j->chunk;
    char range[64];
    snprintf(range, sizeof(range), "%llu-%llu", (unsigned long long)off, (unsigned long long)(off + len - 1));
    sink s = {j->buf ? j->buf + off : NULL, 0};
    curl_easy_setopt(h, CURLOPT_RANGE, range);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
    long status = 0;
    CURLcode rc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    if (rc != CURLE_OK || status != 206 || s.got != len) {
      fprintf(stderr, "s3_get: GET %s range %s: %s, HTTP %ld, %llu of %llu bytes\n", j->url, range,
              curl_easy_strerror(rc), status, (unsigned long long)s.got, (unsigned long long)len);
      atomic_store(&j->failed, 1);
      break;
    }
  }
  curl_easy_cleanup(h);
  return NULL;
}

/* The object's size, from a HEAD. */
static int head_size(job *j) {
  CURL *h = handle(j);
  if (!h) return -1;
  curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  long status = 0;
  curl_off_t len = -1;
  CURLcode rc = curl_easy_perform(h);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_getinfo(h, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &len);
  curl_easy_cleanup(h);
  if (rc != CURLE_OK || status != 200 || len < 0) {
    fprintf(stderr, "s3_get: HEAD %s: %s, HTTP %ld\n", j->url, curl_easy_strerror(rc), status);
    return -1;
  }
  j->size = (uint64_t)len;
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 5 || argc > 6) {
    fprintf(stderr, "usage: s3_get BUCKET KEY THREADS CHUNK_BYTES [discard|buffer|fresh|thp]\n");
    return 2;
  }
  const char *ep = getenv("AWS_ENDPOINT_URL"), *region = getenv("AWS_REGION");
  static job j;
  j.key = getenv("AWS_ACCESS_KEY_ID");
  j.secret = getenv("AWS_SECRET_ACCESS_KEY");
  if (!ep || !j.key || !j.secret) {
    fprintf(stderr, "s3_get: set AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY\n");
    return 2;
  }
  int threads = atoi(argv[3]);
  j.chunk = strtoull(argv[4], NULL, 10);
  const char *mode = argc == 6 ? argv[5] : "discard";
  if (threads < 1 || threads > 1024 || j.chunk == 0 ||
      (strcmp(mode, "discard") && strcmp(mode, "buffer") && strcmp(mode, "fresh") && strcmp(mode, "thp"))) {
    fprintf(stderr, "s3_get: bad THREADS, CHUNK_BYTES or SINK\n");
    return 2;
  }
  snprintf(j.url, sizeof(j.url), "%s/%s/%s", ep, argv[1], argv[2]);
  snprintf(j.sigv4, sizeof(j.sigv4), "aws:amz:%s:s3", region ? region : "us-east-1");
  curl_global_init(CURL_GLOBAL_DEFAULT);
  if (head_size(&j) < 0) return 1;
  if (!strcmp(mode, "thp")) {
    void *p = NULL;
    if (posix_memalign(&p, 2u << 20, j.size ? j.size : 1)) return 1;
    j.buf = p;
    madvise(p, j.size, MADV_HUGEPAGE); /* a hint: fails harmlessly where THP is off */
  } else if (strcmp(mode, "discard")) {
    if (!(j.buf = malloc(j.size ? j.size : 1))) return 1;
    if (!strcmp(mode, "buffer")) memset(j.buf, 1, j.size); /* page faults out of the time */
  }
  pthread_t *t = calloc((size_t)threads, sizeof(*t));
  double t0 = now();
  int started = 0;
  for (; started < threads; started++)
    if (pthread_create(&t[started], NULL, worker, &j)) break;
  for (int i = 0; i < started; i++) pthread_join(t[i], NULL);
  double dt = now() - t0;
  if (started < threads || atomic_load(&j.failed)) return 1;
  printf("{\"bytes\": %llu, \"seconds\": %.6f, \"requests\": %llu, \"threads\": %d, \"chunk\": %llu, "
         "\"sink\": \"%s\"}\n",
         (unsigned long long)j.size, dt, (unsigned long long)((j.size + j.chunk - 1) / j.chunk), threads,
         (unsigned long long)j.chunk, mode);
  free(t);
  free(j.buf);
  curl_global_cleanup();
  return 0;
}
