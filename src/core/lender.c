#include "core/lender.h"

#include <errno.h>
#include <stdlib.h>

int ckptio_lender_init(ckptio_lender *l, int n) {
  l->nfree = 0;
  l->free = calloc(n > 0 ? (size_t)n : 1, sizeof(int));
  if (!l->free) return -ENOMEM;
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->cv, NULL);
  for (int i = 0; i < n; i++) l->free[l->nfree++] = i;
  return 0;
}

void ckptio_lender_fini(ckptio_lender *l) {
  if (!l->free) return; /* zeroed, or its init failed */
  free(l->free);
  l->free = NULL;
  pthread_cond_destroy(&l->cv);
  pthread_mutex_destroy(&l->mu);
}

int ckptio_lender_borrow(ckptio_lender *l) {
  pthread_mutex_lock(&l->mu);
  while (!l->nfree) pthread_cond_wait(&l->cv, &l->mu);
  int i = l->free[--l->nfree];
  pthread_mutex_unlock(&l->mu);
  return i;
}

void ckptio_lender_return(ckptio_lender *l, int i) {
  pthread_mutex_lock(&l->mu);
  l->free[l->nfree++] = i;
  pthread_cond_signal(&l->cv);
  pthread_mutex_unlock(&l->mu);
}
