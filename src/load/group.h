/* Group loads (ckptio_reader_load_boxes_group): the plan every rank makes
 * alike from every rank's boxes (group_plan.c), and the rounds that read
 * each stored part once and exchange the bytes (group.c).
 *
 * The plan. Every rank opens the same checkpoint and gathers every rank's
 * boxes. A unit is a stored part that some box touches (a tensor stored
 * whole is one part); units are ordered as they lie in the files and given
 * to owners in contiguous spans balanced by bytes. An owner reads its units
 * in chunks (whole rows of dimension 0, a unit's chunks read in order by
 * its owner, so its CRC is computed across them), and its chunks in
 * batches of at most `chunk` bytes: batch k of every owner is round k.
 * Every rank derives the same plan from the same gathered bytes, so every
 * rank knows what every other sends it in every round without asking. */
#ifndef CKPTIO_LOAD_GROUP_H
#define CKPTIO_LOAD_GROUP_H

#include "load/reader.h"

/* A box of some rank, as the wire carries it. */
typedef struct ckptio_gbox {
  uint64_t index;
  int64_t start[CKPTIO_MAX_DIMS], stop[CKPTIO_MAX_DIMS];
} ckptio_gbox;

/* A box of any rank, with who asked for it (sorted by tensor, then rank). */
typedef struct ckptio_gwant {
  const ckptio_gbox *box;
  int rank;
  size_t k;                 /* its position in that rank's list */
} ckptio_gwant;

/* A stored part some box needs. */
typedef struct ckptio_gunit {
  size_t index;             /* the tensor */
  ckptio_spart part;
  const ckptio_entry *e;    /* the part's entry */
  int64_t lo[CKPTIO_MAX_DIMS], hi[CKPTIO_MAX_DIMS]; /* its box in the tensor */
  uint64_t bytes;
  uint64_t file, offset;    /* where it lies: the order of the spans */
  int owner;
  uint32_t crc;             /* the owner's CRC so far, over its chunks */
} ckptio_gunit;

/* Rows [row0, row1) of dimension 0 of a unit (all of a 0-d one). */
typedef struct ckptio_gchunk {
  size_t unit;
  int64_t row0, row1;
  uint64_t bytes;
  int first, last;          /* the unit's first / last chunk */
} ckptio_gchunk;

typedef struct ckptio_gplan {
  int nranks, rank;
  ckptio_gwant *wants;      /* every rank's boxes */
  size_t nwants;
  ckptio_gunit *units;
  size_t nunits;
  ckptio_gchunk *chunks;    /* by owner, in its reading order */
  size_t nchunks;
  size_t **batch;           /* [owner][k]: its chunks of round k start at
                               batch[o][k], end at batch[o][k + 1] */
  size_t *nbatches;         /* [owner] */
  size_t rounds;            /* the most batches of any owner */
  uint64_t chunk;           /* the batch limit, bytes */
  int node;                 /* every rank runs on one machine (one boot id) */
  int shared;               /* every rank opened one local file on one
                               machine, and it fits in the page cache,
                               which they then share */
  unsigned char *gathered;  /* the gathered bytes the wants point into */
  uint64_t *lens;
} ckptio_gplan;

/* Collective. Gathers every rank's boxes (this rank's `mine`, checked;
 * `status` < 0 when they are not, with `why`: every rank then fails naming
 * this rank), checks that every rank opened the same checkpoint, and plans.
 * @return 0, CKPTIO_E_RANK (the same verdict on every rank, in r->err),
 * or this rank's own failure. */
int ckptio_gplan_make(ckptio_reader *r, const ckptio_comm *comm, const ckptio_gbox *mine, size_t n,
                      uint64_t staging, int status, const char *why, ckptio_gplan *p);
void ckptio_gplan_free(ckptio_gplan *p);

/* The wants of tensor `index`: [*first, *end) of p->wants. */
void ckptio_gplan_wants_of(const ckptio_gplan *p, size_t index, size_t *first, size_t *end);

/* The box of chunk c in its tensor. */
void ckptio_gchunk_box(const ckptio_gplan *p, const ckptio_gchunk *c, int64_t *lo, int64_t *hi);

#endif
