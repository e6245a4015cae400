/* The agreement of a multi-rank save: every rank's parts gathered through
 * the caller's communicator, checked, and planned the same way on every
 * rank (who writes which box, which files exist); and the status exchanges
 * of the commit. ranks_plan.c; the writer is ranks.c. */
#ifndef CKPTIO_SAVE_RANKS_H
#define CKPTIO_SAVE_RANKS_H

#include <stddef.h>
#include <stdint.h>

#include "ckptio.h"
#include "save/collect.h"

/* One distinct box of a global tensor, and who writes it. */
typedef struct ckptio_rbox {
  const char *name;        /* into the plan's gathered bytes */
  ckptio_dtype dtype;
  int ndim;
  int64_t global[CKPTIO_MAX_DIMS];
  int64_t off[CKPTIO_MAX_DIMS];
  int64_t size[CKPTIO_MAX_DIMS];
  uint64_t nbytes;
  int writer;              /* the rank that writes it */
  size_t local;            /* the writer's index of it in its collect */
} ckptio_rbox;

typedef struct ckptio_rplan {
  unsigned char *buf;      /* every rank's description, gathered */
  ckptio_rbox *boxes;      /* sorted by name, then offsets */
  size_t nboxes;
  size_t *first;           /* boxes of tensor t: [first[t], first[t + 1]) */
  size_t ntensors;
  int *file_of;            /* [rank]: its file (0-based), or -1: writes none */
  size_t nfiles;
  uint64_t total_bytes;    /* of the global tensors */
  char save_id[33];        /* rank 0's */
} ckptio_rplan;

/* Collective. Gathers every rank's tensors of `mine` (or, with status < 0,
 * this rank's failure `why` instead: every rank then fails naming it), checks that they
 * agree (dtype and global shape per tensor; boxes inside, not overlapping
 * unless identical, covering each tensor) and plans the save. Rank 0's
 * save_id becomes everyone's. @return 0, CKPTIO_E_RANK (the same verdict
 * on every rank, the reason in err), or this rank's own failure (-ENOMEM,
 * the communicator's code), which the others learn at the agreement. */
int ckptio_rplan_make(const ckptio_comm *comm, const ckptio_collect *mine, int status, const char *why,
                      const char *save_id, ckptio_rplan *out, char *err);
void ckptio_rplan_free(ckptio_rplan *p);

#endif
