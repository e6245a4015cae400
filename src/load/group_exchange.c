/* Group loads exchanged (group_run.h): in round k each rank reads its
 * batch k (on a thread, one round ahead), packs for each other rank the
 * pieces of its boxes that the batch holds after a status word, one
 * alltoallv moves them, and each rank lands its pieces in its boxes. A
 * status that is not 0 stops every rank after that round. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bigbuf.h"
#include "core/box.h"
#include "core/collective.h"
#include "core/error.h"
#include "load/group_run.h"

/* The status word at the head of every message. */
typedef struct ghdr {
  int32_t status, pad;
} ghdr;

/* Packing: the piece from its chunk (where it was read) into the message. */
typedef struct packing {
  size_t at;                   /* the message's next byte */
} packing;

static int pack_piece(ckptio_group *g, const ckptio_gchunk *c, const ckptio_gwant *w, const int64_t *lo,
                      const int64_t *hi, uint64_t bytes, void *arg) {
  (void)w;
  packing *out = arg;
  const ckptio_gunit *u = &g->p.units[c->unit];
  int64_t clo[CKPTIO_MAX_DIMS], chi[CKPTIO_MAX_DIMS], csz[CKPTIO_MAX_DIMS], sz[CKPTIO_MAX_DIMS];
  ckptio_gchunk_box(&g->p, c, clo, chi);
  for (int d = 0; d < u->e->ndim; d++) csz[d] = chi[d] - clo[d], sz[d] = hi[d] - lo[d];
  ckptio_grp_runs x = {g, g->send + out->at, g->where[c - g->p.chunks], -1};
  out->at += (size_t)bytes;
  return ckptio_box_runs(u->e->ndim, ckptio_dtype_bits(u->e->dtype), lo, hi, clo, csz, lo, sz, ckptio_grp_copy_run, &x);
}

/* The bytes of round `round`'s messages to and from each rank (each
 * opens with a status word); their sums in *send, *recv. */
static void count_round(ckptio_group *g, size_t round, size_t *send, size_t *recv) {
  int nr = g->comm->nranks, me = g->comm->rank;
  *send = *recv = 0;
  for (int j = 0; j < nr; j++) {
    g->send_counts[j] = g->recv_counts[j] = sizeof(ghdr);
    if (j != me) {
      ckptio_grp_pieces(g, round, me, j, ckptio_grp_count, &g->send_counts[j]);
      ckptio_grp_pieces(g, round, j, me, ckptio_grp_count, &g->recv_counts[j]);
    }
    *send += g->send_counts[j], *recv += g->recv_counts[j];
  }
}

/* Exchanges round `round` (this rank's batch read). *stop is
 * set when any rank reported a failure. A failure here (a destination
 * copy) becomes this rank's status, which the others learn next round.
 * @return 0, or the communicator's failure: this rank can take no further
 * part. */
static int exchange(ckptio_group *g, size_t round, int *stop) {
  int nr = g->comm->nranks, me = g->comm->rank, rc = 0;
  size_t send_total, recv_total;
  count_round(g, round, &send_total, &recv_total);
  packing out = {0};
  for (int j = 0; j < nr; j++) {
    ghdr h = {g->status, 0};
    size_t end = out.at + g->send_counts[j];
    memcpy(g->send + out.at, &h, sizeof(h));
    out.at += sizeof(h);
    if (j != me && g->status == 0 && (rc = ckptio_grp_pieces(g, round, me, j, pack_piece, &out)) < 0) g->status = rc;
    out.at = end;
  }
  if ((rc = g->comm->alltoallv(g->comm->user, g->send, g->send_counts, g->recv, g->recv_counts)) < 0)
    return ckptio_fail(g->r->err, rc, "%s: rank %d: the communicator's alltoallv failed: %s", g->r->src->path, me,
                       ckptio_strerror(rc));
  size_t at = 0;
  *stop = g->status != 0;
  for (int s = 0; s < nr; s++) {
    ghdr h;
    memcpy(&h, g->recv + at, sizeof(h));
    *stop |= h.status != 0;
    at += g->recv_counts[s];
  }
  if (*stop) return 0;
  ckptio_landing self = {NULL, 0};
  rc = ckptio_grp_pieces(g, round, me, me, ckptio_grp_land, &self);
  at = 0;
  for (int s = 0; s < nr && rc == 0; s++) {
    ckptio_landing in = {g->recv, at + sizeof(ghdr)};
    if (s != me) rc = ckptio_grp_pieces(g, round, s, me, ckptio_grp_land, &in);
    at += g->recv_counts[s];
  }
  if (rc < 0) {
    g->status = rc;
    snprintf(g->why, sizeof(g->why), "%s", g->r->err);
  }
  return 0;
}

/* ------------------------------------------------------------ rounds */

/* The box of this rank's that holds chunk c's bytes contiguous in host
 * memory, where the chunk can be read straight into: *at is its offset
 * there. @return the box's index, or SIZE_MAX. */
static size_t direct_box(const ckptio_group *g, size_t c, uint64_t *at) {
  const ckptio_gplan *p = &g->p;
  const ckptio_gunit *u = &p->units[p->chunks[c].unit];
  int64_t clo[CKPTIO_MAX_DIMS], chi[CKPTIO_MAX_DIMS];
  size_t first, end;
  ckptio_grp_chunk(p, c, clo, chi, &first, &end);
  for (size_t i = first; i < end; i++) {
    const ckptio_gwant *w = &p->wants[i];
    const ckptio_box_request *q = &g->reqs[w->k];
    if (w->rank != p->rank || g->gpu[w->k] >= 0 || !q->dst || u->e->strided || u->e->byteswap) continue;
    int fits = u->e->ndim == 0 || (w->box->start[0] <= clo[0] && chi[0] <= w->box->stop[0]);
    uint64_t row = (uint64_t)ckptio_dtype_bits(u->e->dtype) / 8;
    for (int d = 1; d < u->e->ndim && fits; d++) {
      fits = w->box->start[d] == clo[d] && w->box->stop[d] == chi[d];
      row *= (uint64_t)(chi[d] - clo[d]);
    }
    if (fits) {
      *at = u->e->ndim ? (uint64_t)(clo[0] - w->box->start[0]) * row : 0;
      return w->k;
    }
  }
  return SIZE_MAX;
}

/* Where each chunk of this rank's batch `round` is read to: a box of its
 * own, else the read buffer `buf` (set 0: only count). @return the read
 * buffer's bytes it takes. */
static uint64_t place(ckptio_group *g, size_t round, int set, unsigned char *buf) {
  size_t first, end;
  uint64_t staged = 0;
  ckptio_grp_batch(&g->p, g->p.rank, round, &first, &end);
  for (size_t c = first; c < end; c++) {
    uint64_t at = 0;
    size_t k = direct_box(g, c, &at);
    if (set) {
      g->direct[c] = k;
      g->where[c] = k != SIZE_MAX ? (unsigned char *)g->reqs[k].dst + at : buf + staged;
    }
    if (k == SIZE_MAX) staged += g->p.chunks[c].bytes;
  }
  return staged;
}

/* The buffers of every round, sized for the largest, allocated before the
 * first (a rank that cannot have them says so before any exchange).
 * @return 0 or -ENOMEM. */
static int buffers(ckptio_group *g) {
  ckptio_gplan *p = &g->p;
  size_t nr = (size_t)g->comm->nranks;
  if (!(g->send_counts = calloc(nr, sizeof(size_t))) || !(g->recv_counts = calloc(nr, sizeof(size_t))) ||
      !(g->where = calloc(p->nchunks + 1, sizeof(*g->where))) ||
      !(g->direct = calloc(p->nchunks + 1, sizeof(size_t))))
    return -ENOMEM;
  for (size_t k = 0; k < p->rounds; k++) {
    size_t s, r;
    uint64_t b = place(g, k, 0, NULL);
    g->rbuf_bytes = b > g->rbuf_bytes ? b : g->rbuf_bytes;
    count_round(g, k, &s, &r);
    g->send_bytes = s > g->send_bytes ? s : g->send_bytes;
    g->recv_bytes = r > g->recv_bytes ? r : g->recv_bytes;
  }
  for (int i = 0; i < 2; i++)
    if (g->rbuf_bytes && !(g->rbuf[i] = ckptio_bigbuf_alloc(g->rbuf_bytes))) return -ENOMEM;
  if ((g->send_bytes && !(g->send = ckptio_bigbuf_alloc(g->send_bytes))) ||
      (g->recv_bytes && !(g->recv = ckptio_bigbuf_alloc(g->recv_bytes))))
    return -ENOMEM;
  return 0;
}

static void place_exchanged(ckptio_group *g, size_t round) { place(g, round, 1, g->rbuf[round & 1]); }

int ckptio_grp_load_exchanged(ckptio_group *g, uint64_t *read) {
  ckptio_reader *r = g->r;
  int alloc = buffers(g);
  if (alloc < 0) ckptio_fail(r->err, alloc, "%s: rank %d: out of memory for a group load's buffers", r->src->path,
                             g->comm->rank);
  int rc = ckptio_comm_status_exchange(g->comm, alloc, r->err, r->src->path, r->err);
  return rc < 0 ? rc : ckptio_grp_rounds(g, read, place_exchanged, exchange);
}
