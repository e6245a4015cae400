/* N like things (workspaces, buffers) lent to threads one at a time: a
 * thread borrows a free one, waiting while every one is out, and returns
 * it when done. What the things are stays with the caller, who keeps them
 * in an array and gets indexes here: the compressed save and the
 * compressed load each lend their codec workspaces this way, so the
 * compression never holds more of them than it made. */
#ifndef CKPTIO_CORE_LENDER_H
#define CKPTIO_CORE_LENDER_H

#include <pthread.h>

typedef struct ckptio_lender {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int nfree;
  int *free; /* free[0..nfree): the indexes in hand */
} ckptio_lender;

/* Indexes 0..n-1, all free. @return 0 or -ENOMEM. fini is safe on a
 * zeroed lender and after a failed init. */
int ckptio_lender_init(ckptio_lender *l, int n);
void ckptio_lender_fini(ckptio_lender *l);
/* A free index; waits while there is none. */
int ckptio_lender_borrow(ckptio_lender *l);
void ckptio_lender_return(ckptio_lender *l, int i);

#endif
