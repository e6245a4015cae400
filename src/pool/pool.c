/* Worker pool and batch. Jobs sit in a growable circular queue; workers
 * sleep on one condition variable and are started as the queue needs them,
 * up to the pool's size. Freeing drains the queue first so no queued job
 * is dropped with its resources. */
#include "pool/pool.h"

#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "core/trace.h"

typedef struct job {
  ckptio_job_fn fn;
  void *arg;
} job;

struct ckptio_pool {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  job *queue;
  size_t cap, head, len;
  int stopping;
  int nthreads, max_threads, idle;  /* started, allowed, waiting for a job */
  pthread_t *threads;
};

/* Workers a context starts with: a small save or load runs on these, and a
 * one-shot script does not pay for starting the full queue depth. */
#define POOL_FIRST_THREADS 2

static void *worker_main(void *arg) {
  ckptio_pool *p = arg;
  ckptio_trace_thread_name("ckptio worker");
  pthread_mutex_lock(&p->mu);
  for (;;) {
    p->idle++;
    while (p->len == 0 && !p->stopping) pthread_cond_wait(&p->cv, &p->mu);
    p->idle--;
    if (p->len == 0) break; /* stopping and drained */
    job j = p->queue[p->head];
    p->head = (p->head + 1) % p->cap;
    p->len--;
    pthread_mutex_unlock(&p->mu);
    j.fn(j.arg);
    pthread_mutex_lock(&p->mu);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

int ckptio_pool_create(int threads, ckptio_pool **out) {
  *out = NULL;
  if (threads < 1) return -EINVAL;
  ckptio_pool *p = calloc(1, sizeof(*p));
  if (!p) return -ENOMEM;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  p->cap = 64;
  p->queue = malloc(p->cap * sizeof(job));
  p->threads = calloc((size_t)threads, sizeof(pthread_t));
  if (!p->queue || !p->threads) goto fail;
  p->max_threads = threads;
  int rc = ckptio_pool_start(p, threads < POOL_FIRST_THREADS ? threads : POOL_FIRST_THREADS);
  if (rc < 0) {
    ckptio_pool_free(p);
    return rc;
  }
  *out = p;
  return 0;
fail:
  ckptio_pool_free(p);
  return -ENOMEM;
}

/* Under p->mu: one more worker. @return 0 or -errno. */
static int start_one(ckptio_pool *p) {
  int rc = pthread_create(&p->threads[p->nthreads], NULL, worker_main, p);
  if (rc) return -rc;
  p->nthreads++;
  return 0;
}

int ckptio_pool_start(ckptio_pool *p, int n) {
  pthread_mutex_lock(&p->mu);
  int rc = 0;
  while (rc == 0 && p->nthreads < n && p->nthreads < p->max_threads) rc = start_one(p);
  pthread_mutex_unlock(&p->mu);
  return rc;
}

static int add(ckptio_pool *p, ckptio_job_fn fn, void *arg, int first) {
  pthread_mutex_lock(&p->mu);
  if (p->len == p->cap) {
    size_t ncap = p->cap * 2;
    job *nq = malloc(ncap * sizeof(job));
    if (!nq) {
      pthread_mutex_unlock(&p->mu);
      return -ENOMEM;
    }
    for (size_t i = 0; i < p->len; i++) nq[i] = p->queue[(p->head + i) % p->cap];
    free(p->queue);
    p->queue = nq;
    p->cap = ncap;
    p->head = 0;
  }
  if (first) {
    p->head = (p->head + p->cap - 1) % p->cap;
    p->queue[p->head] = (job){fn, arg};
  } else {
    p->queue[(p->head + p->len) % p->cap] = (job){fn, arg};
  }
  p->len++;
  /* More jobs waiting than workers to take them: start one (a failure is
   * harmless, the started workers run the job later). */
  if (p->len > (size_t)p->idle && p->nthreads < p->max_threads) (void)start_one(p);
  pthread_cond_signal(&p->cv);
  pthread_mutex_unlock(&p->mu);
  return 0;
}

int ckptio_pool_add(ckptio_pool *p, ckptio_job_fn fn, void *arg) { return add(p, fn, arg, 0); }

int ckptio_pool_add_first(ckptio_pool *p, ckptio_job_fn fn, void *arg) { return add(p, fn, arg, 1); }

void ckptio_pool_free(ckptio_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->stopping = 1;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->nthreads; i++) pthread_join(p->threads[i], NULL);
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->mu);
  free(p->threads);
  free(p->queue);
  free(p);
}

int ckptio_pool_threads(const ckptio_pool *p) { return p->nthreads; }
const pthread_t *ckptio_pool_handles(const ckptio_pool *p) { return p->threads; }

void ckptio_batch_init(ckptio_batch *b) {
  memset(b, 0, sizeof(*b));
  pthread_mutex_init(&b->mu, NULL);
  pthread_cond_init(&b->cv, NULL);
}

void ckptio_batch_destroy(ckptio_batch *b) {
  pthread_cond_destroy(&b->cv);
  pthread_mutex_destroy(&b->mu);
}

void ckptio_batch_add(ckptio_batch *b, uint64_t n) {
  pthread_mutex_lock(&b->mu);
  b->pending += n;
  pthread_mutex_unlock(&b->mu);
}

static void record_locked(ckptio_batch *b, int rc, const char *msg) {
  if (rc < 0 && b->error == 0) {
    b->error = rc;
    snprintf(b->err, sizeof(b->err), "%s", msg ? msg : "");
  }
}

void ckptio_batch_done(ckptio_batch *b, int rc, const char *msg) {
  pthread_mutex_lock(&b->mu);
  record_locked(b, rc, msg);
  b->ended++;
  if (--b->pending == 0 || b->ended == b->wake_at || rc < 0) pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->mu);
}

void ckptio_batch_fail(ckptio_batch *b, int rc, const char *msg) {
  pthread_mutex_lock(&b->mu);
  record_locked(b, rc, msg);
  pthread_mutex_unlock(&b->mu);
}

int ckptio_batch_failed(ckptio_batch *b) {
  pthread_mutex_lock(&b->mu);
  int e = b->error;
  pthread_mutex_unlock(&b->mu);
  return e;
}

void ckptio_batch_wait_ended(ckptio_batch *b, uint64_t n) {
  pthread_mutex_lock(&b->mu);
  b->wake_at = n;
  while (b->ended < n && !b->error) pthread_cond_wait(&b->cv, &b->mu);
  b->wake_at = 0;
  pthread_mutex_unlock(&b->mu);
}

int ckptio_batch_wait(ckptio_batch *b) {
  pthread_mutex_lock(&b->mu);
  while (b->pending) pthread_cond_wait(&b->cv, &b->mu);
  int e = b->error;
  pthread_mutex_unlock(&b->mu);
  return e;
}
