/* Deferred closes of replaced files (see release.h). The count is the
 * process's, not a context's: the space they free is the filesystem's. */
#include "save/release.h"

#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

#include "io/fault.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static uint64_t pending;

static void close_job(void *arg) {
  ckptio_fault_close_time();
  close((int)(intptr_t)arg);
  pthread_mutex_lock(&mu);
  if (--pending == 0) pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
}

void ckptio_close_later(ckptio_pool *pool, int fd) {
  if (fd < 0) return;
  pthread_mutex_lock(&mu);
  pending++;
  pthread_mutex_unlock(&mu);
  if (ckptio_pool_add(pool, close_job, (void *)(intptr_t)fd) < 0) close_job((void *)(intptr_t)fd);
}

int ckptio_closes_wait(void) {
  pthread_mutex_lock(&mu);
  int any = pending > 0;
  while (pending) pthread_cond_wait(&cv, &mu);
  pthread_mutex_unlock(&mu);
  return any;
}
