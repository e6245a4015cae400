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

typedef struct close_job {
  size_t n;
  int fds[];
} close_job;

static void close_run(void *arg) {
  close_job *j = arg;
  for (size_t i = 0; i < j->n; i++) ckptio_held_close(j->fds[i]);
  free(j);
  pthread_mutex_lock(&mu);
  if (--pending == 0) pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
}

void ckptio_close_later(ckptio_pool *pool, const int *fds, size_t n) {
  size_t held = 0;
  for (size_t i = 0; i < n; i++) held += fds[i] >= 0;
  if (!held) return;
  close_job *j = malloc(sizeof(*j) + held * sizeof(int));
  if (!j) {
    for (size_t i = 0; i < n; i++)
      if (fds[i] >= 0) ckptio_held_close(fds[i]);
    return;
  }
  j->n = 0;
  for (size_t i = 0; i < n; i++)
    if (fds[i] >= 0) j->fds[j->n++] = fds[i];
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
