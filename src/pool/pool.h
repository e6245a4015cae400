/* The worker pool: up to a fixed number of threads running queued jobs,
 * started as jobs wait for them and kept, and a batch
 * that counts a group of jobs to completion and keeps its first error.
 * Shape taken from zstd's lib/common/pool.h: create, add, free. */
#ifndef CKPTIO_POOL_POOL_H
#define CKPTIO_POOL_POOL_H

#include <pthread.h>
#include <stdint.h>

#include "core/error.h"

typedef struct ckptio_pool ckptio_pool;
typedef void (*ckptio_job_fn)(void *arg);

/* A pool of at most `threads` workers; the first few start now, the rest
 * when more jobs are queued than workers wait for. @return 0 or -errno. */
int ckptio_pool_create(int threads, ckptio_pool **out);
/* Starts workers until n run (at most the pool's size). @return 0 or -errno. */
int ckptio_pool_start(ckptio_pool *p, int n);
/* Queues fn(arg); never blocks on the workers. @return 0 or -ENOMEM. */
int ckptio_pool_add(ckptio_pool *p, ckptio_job_fn fn, void *arg);
/* The same at the front of the queue: runs before everything queued (a
 * save's copies go before its writes, so its snapshot is not behind them). */
int ckptio_pool_add_first(ckptio_pool *p, ckptio_job_fn fn, void *arg);
/* Runs the queued jobs to the end, joins the workers, frees. Accepts NULL. */
void ckptio_pool_free(ckptio_pool *p);
/* Workers started so far. */
int ckptio_pool_threads(const ckptio_pool *p);
/* The started workers' thread handles (for CPU binding); ckptio_pool_threads
 * of them. */
const pthread_t *ckptio_pool_handles(const ckptio_pool *p);

/* A batch: add() before queueing each job, done() at the end of each job,
 * wait() for all of them. The first failure wins; later jobs can ask
 * failed() and skip their work. */
typedef struct ckptio_batch {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t pending;
  uint64_t ended;       /* jobs ended so far */
  uint64_t wake_at;     /* a waiter for `ended` to reach this, or 0 */
  int error;
  char err[CKPTIO_ERRLEN];
} ckptio_batch;

void ckptio_batch_init(ckptio_batch *b);
void ckptio_batch_destroy(ckptio_batch *b);
void ckptio_batch_add(ckptio_batch *b, uint64_t n);
/* Ends one job; rc < 0 records the failure with msg (may be NULL). */
void ckptio_batch_done(ckptio_batch *b, int rc, const char *msg);
/* Records a failure without ending a job (for the thread that queues). */
void ckptio_batch_fail(ckptio_batch *b, int rc, const char *msg);
int ckptio_batch_failed(ckptio_batch *b);
/* Blocks until every job has ended. @return 0 or the first error. */
int ckptio_batch_wait(ckptio_batch *b);
/* Blocks until at least n jobs have ended, or one failed (one waiter at a
 * time: the thread that queues). */
void ckptio_batch_wait_ended(ckptio_batch *b, uint64_t n);

#endif
