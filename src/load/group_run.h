/* Group loads, the rounds (group.h has the plan): the state of one call
 * and what its ways share. group.c is the call (checks, the shared page
 * cache, the verdict); group_rounds.c reads a round's batch on a thread
 * beside the round before, walks the pieces both sides agree on and lands
 * them in the boxes; group_exchange.c moves pieces with the
 * communicator's alltoallv; group_window.c through windows of shared
 * memory, where the ranks share a machine. */
#ifndef CKPTIO_LOAD_GROUP_RUN_H
#define CKPTIO_LOAD_GROUP_RUN_H

#include "load/group.h"

/* One batch's read, on its own thread. */
typedef struct ckptio_gread {
  ckptio_reader *r;
  const ckptio_gplan *p;
  ckptio_gunit *units;      /* this rank's copy: the running CRCs */
  size_t first, end;        /* the chunks */
  unsigned char *const *where; /* [chunk]: where its bytes are read to */
  ckptio_options opts;      /* the reads' (their method) */
  int keep_stats;
  int rc;
  char msg[CKPTIO_ERRLEN];
  uint64_t read;
} ckptio_gread;

typedef struct ckptio_group {
  ckptio_reader *r;
  const ckptio_comm *comm;
  ckptio_gplan p;
  ckptio_box_request *reqs;
  int *gpu;                 /* [request]: its GPU, or -1 */
  unsigned char *rbuf[2];   /* the chunks this rank reads for others alone */
  size_t rbuf_bytes;
  unsigned char **where;    /* [chunk]: where this rank's chunk is read to,
                               its own destination when one of its boxes
                               holds the chunk's bytes contiguous */
  size_t *direct;           /* [chunk]: that box's index, or SIZE_MAX */
  unsigned char *send, *recv;
  size_t send_bytes, recv_bytes;
  size_t *send_counts, *recv_counts;
  ckptio_options read_opts; /* this rank's reads of its spans */
  unsigned char *window;    /* group_window.c: the shared mapping */
  size_t window_bytes;
  int status;               /* this rank's first failure */
  char why[CKPTIO_ERRLEN];
} ckptio_group;

/* What to do with one piece: the part [lo, hi) of want w's box that
 * chunk c holds, `bytes` bytes. @return 0 or a code that stops the walk. */
typedef int (*ckptio_grp_piece_fn)(struct ckptio_group *g, const ckptio_gchunk *c, const ckptio_gwant *w,
                                   const int64_t *lo, const int64_t *hi, uint64_t bytes, void *arg);

/* Chunks [*first, *end) of owner o's batch `round` (empty past its last). */
void ckptio_grp_batch(const ckptio_gplan *p, int o, size_t round, size_t *first, size_t *end);

/* Chunk c's box in its tensor, and the wants of that tensor:
 * p->wants[*first, *end). */
void ckptio_grp_chunk(const ckptio_gplan *p, size_t c, int64_t *lo, int64_t *hi, size_t *first, size_t *end);

/* Calls fn for each piece of round `round` from owner `o` to rank `to`:
 * the part of each of `to`'s boxes that each chunk of o's batch holds, in
 * the order both sides walk them. @return fn's first failure, or 0. */
int ckptio_grp_pieces(ckptio_group *g, size_t round, int o, int to, ckptio_grp_piece_fn fn, void *arg);

/* A piece fn: counts the bytes into *(size_t *)arg. */
int ckptio_grp_count(ckptio_group *g, const ckptio_gchunk *c, const ckptio_gwant *w, const int64_t *lo,
                     const int64_t *hi, uint64_t bytes, void *arg);

/* Landing: a piece, from a message (buf: pieces packed one after another
 * from `at`) or from where its chunk was read (buf NULL: g->where), into
 * the box that asked for it. */
typedef struct ckptio_landing {
  const unsigned char *buf;
  size_t at;
} ckptio_landing;
int ckptio_grp_land(ckptio_group *g, const ckptio_gchunk *c, const ckptio_gwant *w, const int64_t *lo,
                    const int64_t *hi, uint64_t bytes, void *arg);

/* Copies `n` bytes of a run from byte a of x->from to byte b of x->to (on
 * the host, or to GPU x->gpu). A ckptio_box_run_fn. */
typedef struct ckptio_grp_runs {
  ckptio_group *g;
  unsigned char *to;
  const unsigned char *from;
  int gpu;
} ckptio_grp_runs;
int ckptio_grp_copy_run(void *arg, uint64_t a, uint64_t b, uint64_t n);

/* Runs every round: this rank's batch k + 1 read on a thread (where
 * place(g, k + 1) put its chunks) beside step(g, k, &stop), which moves
 * round k's pieces and sets stop when any rank failed. *read counts the
 * bytes read. @return 0, or step's failure (the communicator's: this rank
 * can take no further part). */
int ckptio_grp_rounds(ckptio_group *g, uint64_t *read, void (*place)(ckptio_group *g, size_t round),
                      int (*step)(ckptio_group *g, size_t round, int *stop));

/* The ways. @return 0 or the group's failure, the same verdict on every
 * rank (group.c's). load_windows returns 1 when the ranks cannot share
 * memory after all (each sees it alike): then the caller exchanges. */
int ckptio_grp_load_exchanged(ckptio_group *g, uint64_t *read);
int ckptio_grp_load_windows(ckptio_group *g, uint64_t *read);

#endif
