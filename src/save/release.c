/* Deferred closes of replaced files (see release.h). The count is the
 * process's, not a context's: the space they free is the filesystem's. */
#include "save/release.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/hold.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static uint64_t pending; /* jobs queued, not yet run */

static void close_run(void *arg) {
  ckptio_held_close_all(arg);
  free(arg);
  pthread_mutex_lock(&mu);
  if (--pending == 0) pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
}

void ckptio_close_later(ckptio_pool *pool, ckptio_held *h) {
  if (!h->n) return;
  ckptio_held *j = malloc(sizeof(*j));
  if (!j) {
    ckptio_held_close_all(h);
    return;
  }
  *j = *h;
  *h = (ckptio_held){0};
  pthread_mutex_lock(&mu);
  pending++;
  pthread_mutex_unlock(&mu);
  if (ckptio_pool_add(pool, close_run, j) < 0) close_run(j);
}

int ckptio_closes_wait(void) {
  pthread_mutex_lock(&mu);
  int any = pending > 0;
  while (pending) pthread_cond_wait(&cv, &mu);
  pthread_mutex_unlock(&mu);
  return any;
}
