/* Group loads: the rounds (group.h has the plan). In round k each rank
 * reads its batch k into a read buffer (on a thread of its own, one round
 * ahead of the exchange), then every rank packs for each other rank the
 * pieces of its boxes that the batch holds, one alltoallv moves them, and
 * each rank copies its pieces into its boxes. Every message starts with
 * its sender's status, so a failure anywhere stops every rank after the
 * same round; a last status exchange names who failed and why. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/box.h"
#include "core/collective.h"
#include "core/crc32.h"
#include "core/error.h"
#include "core/sized.h"
#include "load/box.h"
#include "load/group.h"

/* The status word at the head of every message. */
typedef struct ghdr {
  int32_t status, pad;
} ghdr;

/* One batch's read, on its own thread. */
typedef struct gread {
  ckptio_reader *r;
  const ckptio_gplan *p;
  ckptio_gunit *units;      /* this rank's copy: the running CRCs */
  size_t first, end;        /* the chunks */
  unsigned char *buf;
  int keep_stats;
  int rc;
  char msg[CKPTIO_ERRLEN];
  uint64_t read;
} gread;

typedef struct group {
  ckptio_reader *r;
  const ckptio_comm *comm;
  ckptio_gplan p;
  ckptio_box_request *reqs;
  int *gpu;                 /* [request]: its GPU, or -1 */
  unsigned char *rbuf[2];
  unsigned char *send, *recv;
  size_t send_cap, recv_cap;
  size_t *send_counts, *recv_counts;
  int status;               /* this rank's first failure */
  char why[CKPTIO_ERRLEN];
} group;

/* ------------------------------------------------------------ read */

static void *read_batch(void *arg) {
  gread *g = arg;
  ckptio_reader *r = g->r;
  const ckptio_gplan *p = g->p;
  ckptio_xreqs v = {0};
  int rc = 0;
  for (size_t c = g->first; c < g->end && rc == 0; c++) {
    const ckptio_gchunk *ch = &p->chunks[c];
    int64_t lo[CKPTIO_MAX_DIMS], hi[CKPTIO_MAX_DIMS];
    ckptio_gchunk_box(p, ch, lo, hi);
    rc = ckptio_box_reqs(r, p->units[ch->unit].index, lo, hi, g->buf + ch->at, -1, r->opts.crc, &v, NULL);
  }
  /* The reader's progress and stats count what lands in this rank's boxes:
   * the reads keep their own counts (the timers are the reader's). */
  _Atomic uint64_t done = 0, total = 0;
  ckptio_exec_out out = {r->err, &done, &total, &r->timers, r->user_stream, g->keep_stats};
  if (rc == 0) rc = ckptio_exec(r->ctx, &r->opts, v.q, v.n, &out);
  for (size_t i = 0; i < v.n; i++) g->read += atomic_load(&v.q[i].read);
  free(v.q);
  /* A unit read in several chunks: its CRC over them, in order (a chunk
   * that is the whole part was checked by the executor). */
  for (size_t c = g->first; c < g->end && rc == 0 && r->opts.crc; c++) {
    const ckptio_gchunk *ch = &p->chunks[c];
    ckptio_gunit *u = &g->units[ch->unit];
    if (ch->first && ch->last) continue;
    u->crc = ckptio_crc32(ch->first ? 0 : u->crc, g->buf + ch->at, ch->bytes);
    if (ch->last && u->e->has_crc && u->crc != u->e->crc)
      rc = ckptio_fail(r->err, CKPTIO_E_CHECKSUM, "%s: tensor '%s': checksum mismatch in %s (stored %08x, read %08x)",
                       r->src->path, ckptio_reader_entry(r, u->index)->name, u->part.src->path, u->e->crc, u->crc);
  }
  g->rc = rc;
  if (rc < 0) snprintf(g->msg, sizeof(g->msg), "%s", r->err);
  return NULL;
}

/* ------------------------------------------------------------ pieces */

/* Calls fn for each piece of round `round` from owner `o` to rank `to`:
 * the part of each of `to`'s boxes that each chunk of o's batch holds, in
 * the order both sides walk them. @return fn's first failure, or 0. */
typedef int (*piece_fn)(group *g, const ckptio_gchunk *c, const ckptio_gwant *w, const int64_t *lo,
                        const int64_t *hi, uint64_t bytes, void *arg);

static int pieces(group *g, size_t round, int o, int to, piece_fn fn, void *arg) {
  const ckptio_gplan *p = &g->p;
  if (round >= p->nbatches[o]) return 0;
  for (size_t c = p->batch[o][round]; c < p->batch[o][round + 1]; c++) {
    const ckptio_gchunk *ch = &p->chunks[c];
    const ckptio_gunit *u = &p->units[ch->unit];
    int64_t clo[CKPTIO_MAX_DIMS], chi[CKPTIO_MAX_DIMS];
    ckptio_gchunk_box(p, ch, clo, chi);
    size_t first, end;
    ckptio_gplan_wants_of(p, u->index, &first, &end);
    for (size_t i = first; i < end; i++) {
      const ckptio_gwant *w = &p->wants[i];
      int64_t lo[CKPTIO_MAX_DIMS], hi[CKPTIO_MAX_DIMS], sz[CKPTIO_MAX_DIMS];
      if (w->rank != to || !ckptio_box_meet(u->e->ndim, w->box->start, w->box->stop, clo, chi, lo, hi)) continue;
      for (int d = 0; d < u->e->ndim; d++) sz[d] = hi[d] - lo[d];
      int64_t nb = ckptio_tensor_nbytes(u->e->dtype, u->e->ndim, sz);
      int rc = nb < 0 ? (int)nb : fn(g, ch, w, lo, hi, (uint64_t)nb, arg);
      if (rc) return rc;
    }
  }
  return 0;
}

static int count_piece(group *g, const ckptio_gchunk *c, const ckptio_gwant *w, const int64_t *lo,
                       const int64_t *hi, uint64_t bytes, void *arg) {
  (void)g, (void)c, (void)w, (void)lo, (void)hi;
  *(size_t *)arg += (size_t)bytes;
  return 0;
}

/* Copies runs between two host arrays, or into a GPU destination. */
typedef struct runs {
  group *g;
  unsigned char *to;        /* the destination array */
  const unsigned char *from;
  int gpu;                  /* of `to`, or -1 */
} runs;

static int copy_run(void *arg, uint64_t a, uint64_t b, uint64_t n) {
  runs *x = arg;
  if (x->gpu < 0) {
    memcpy(x->to + b, x->from + a, n);
    return 0;
  }
  return ckptio_gpu_copy_sync(x->g->r->ctx->gpu, x->gpu, CKPTIO_GPU_H2D, x->to + b, x->from + a, n, x->g->r->err,
                              CKPTIO_ERRLEN);
}

/* Packing: the piece from its chunk (in the read buffer) into the message. */
typedef struct packing {
  const unsigned char *chunks; /* the read buffer */
  size_t at;                   /* the message's next byte */
} packing;

static int pack_piece(group *g, const ckptio_gchunk *c, const ckptio_gwant *w, const int64_t *lo,
                      const int64_t *hi, uint64_t bytes, void *arg) {
  (void)w;
  packing *out = arg;
  const ckptio_gunit *u = &g->p.units[c->unit];
  int64_t clo[CKPTIO_MAX_DIMS], chi[CKPTIO_MAX_DIMS], csz[CKPTIO_MAX_DIMS], sz[CKPTIO_MAX_DIMS];
  ckptio_gchunk_box(&g->p, c, clo, chi);
  for (int d = 0; d < u->e->ndim; d++) csz[d] = chi[d] - clo[d], sz[d] = hi[d] - lo[d];
  runs x = {g, g->send + out->at, out->chunks + c->at, -1};
  out->at += (size_t)bytes;
  return ckptio_box_runs(u->e->ndim, ckptio_dtype_bits(u->e->dtype), lo, hi, clo, csz, lo, sz, copy_run, &x);
}

/* Landing: a piece, from a message or straight from this rank's read
 * buffer, into the box that asked for it. */
typedef struct landing {
  const unsigned char *buf; /* the messages, or the read buffer */
  int packed;               /* 1: pieces packed one after another from `at` */
  size_t at;
} landing;

static int land_piece(group *g, const ckptio_gchunk *c, const ckptio_gwant *w, const int64_t *lo,
                      const int64_t *hi, uint64_t bytes, void *arg) {
  landing *in = arg;
  const ckptio_gunit *u = &g->p.units[c->unit];
  int nd = u->e->ndim;
  ckptio_box_request *q = &g->reqs[w->k];
  int64_t qsz[CKPTIO_MAX_DIMS], from_lo[CKPTIO_MAX_DIMS], from_hi[CKPTIO_MAX_DIMS], from_sz[CKPTIO_MAX_DIMS];
  runs x = {g, q->dst, NULL, g->gpu[w->k]};
  if (in->packed) { /* the piece on its own */
    memcpy(from_lo, lo, sizeof(from_lo));
    memcpy(from_hi, hi, sizeof(from_hi));
    x.from = in->buf + in->at;
    in->at += (size_t)bytes;
  } else { /* the piece inside its chunk */
    ckptio_gchunk_box(&g->p, c, from_lo, from_hi);
    x.from = in->buf + c->at;
  }
  for (int d = 0; d < nd; d++) qsz[d] = q->stop[d] - q->start[d], from_sz[d] = from_hi[d] - from_lo[d];
  int rc = ckptio_box_runs(nd, ckptio_dtype_bits(u->e->dtype), lo, hi, from_lo, from_sz, q->start, qsz, copy_run, &x);
  if (rc == 0) atomic_fetch_add(&g->r->done_bytes, bytes);
  return rc;
}

/* ------------------------------------------------------------ a round */

/* The bytes of round `round`'s messages to and from each rank (each
 * opens with a status word); their sums in *send, *recv. */
static void count_round(group *g, size_t round, size_t *send, size_t *recv) {
  int nr = g->comm->nranks, me = g->comm->rank;
  *send = *recv = 0;
  for (int j = 0; j < nr; j++) {
    g->send_counts[j] = g->recv_counts[j] = sizeof(ghdr);
    if (j != me) {
      pieces(g, round, me, j, count_piece, &g->send_counts[j]);
      pieces(g, round, j, me, count_piece, &g->recv_counts[j]);
    }
    *send += g->send_counts[j], *recv += g->recv_counts[j];
  }
}

/* Exchanges round `round` (this rank's batch read into `mine`). *stop is
 * set when any rank reported a failure. A failure here (a destination
 * copy) becomes this rank's status, which the others learn next round.
 * @return 0, or the communicator's failure: this rank can take no further
 * part. */
static int exchange(group *g, size_t round, const unsigned char *mine, int *stop) {
  int nr = g->comm->nranks, me = g->comm->rank, rc = 0;
  size_t send_total, recv_total;
  count_round(g, round, &send_total, &recv_total);
  packing out = {mine, 0};
  for (int j = 0; j < nr; j++) {
    ghdr h = {g->status, 0};
    size_t end = out.at + g->send_counts[j];
    memcpy(g->send + out.at, &h, sizeof(h));
    out.at += sizeof(h);
    if (j != me && g->status == 0 && (rc = pieces(g, round, me, j, pack_piece, &out)) < 0) g->status = rc;
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
  landing self = {mine, 0, 0};
  rc = pieces(g, round, me, me, land_piece, &self);
  at = 0;
  for (int s = 0; s < nr && rc == 0; s++) {
    landing in = {g->recv, 1, at + sizeof(ghdr)};
    if (s != me) rc = pieces(g, round, s, me, land_piece, &in);
    at += g->recv_counts[s];
  }
  if (rc < 0) {
    g->status = rc;
    snprintf(g->why, sizeof(g->why), "%s", g->r->err);
  }
  return 0;
}

/* ------------------------------------------------------------ rounds */

static void batch_of(const ckptio_gplan *p, size_t round, size_t *first, size_t *end) {
  int me = p->rank;
  *first = *end = 0;
  if (round < p->nbatches[me]) *first = p->batch[me][round], *end = p->batch[me][round + 1];
}

static uint64_t batch_bytes(const ckptio_gplan *p, size_t first, size_t end) {
  return first < end ? p->chunks[end - 1].at + p->chunks[end - 1].bytes : 0;
}

/* The buffers of every round, sized for the largest, allocated before the
 * first (a rank that cannot have them says so before any exchange).
 * @return 0 or -ENOMEM. */
static int buffers(group *g) {
  ckptio_gplan *p = &g->p;
  size_t nr = (size_t)g->comm->nranks, most_send = 0, most_recv = 0;
  uint64_t most = 0;
  if (!(g->send_counts = calloc(nr, sizeof(size_t))) || !(g->recv_counts = calloc(nr, sizeof(size_t))))
    return -ENOMEM;
  for (size_t k = 0; k < p->rounds; k++) {
    size_t first, end, s, r;
    batch_of(p, k, &first, &end);
    uint64_t b = batch_bytes(p, first, end);
    most = b > most ? b : most;
    count_round(g, k, &s, &r);
    most_send = s > most_send ? s : most_send;
    most_recv = r > most_recv ? r : most_recv;
  }
  for (int i = 0; i < 2; i++)
    if (most && posix_memalign((void **)&g->rbuf[i], 4096, most)) return -ENOMEM;
  if (!(g->send = malloc(most_send + 1)) || !(g->recv = malloc(most_recv + 1))) return -ENOMEM;
  return 0;
}

static void read_into(group *g, gread *rd, size_t round) {
  *rd = (gread){.r = g->r, .p = &g->p, .units = g->p.units, .buf = g->rbuf[round & 1], .keep_stats = round > 0};
  batch_of(&g->p, round, &rd->first, &rd->end);
}

/* A finished read: its bytes counted, its failure this rank's status. */
static void absorb(group *g, const gread *rd, uint64_t *read) {
  *read += rd->read;
  if (rd->rc < 0 && g->status == 0) {
    g->status = rd->rc;
    snprintf(g->why, sizeof(g->why), "%s", rd->msg);
  }
}

/* Runs every round, the read of round k + 1 on a thread beside the
 * exchange of round k. @return 0, or the communicator's failure. */
static int run_rounds(group *g, uint64_t *read) {
  ckptio_gplan *p = &g->p;
  gread rd[2];
  int rc = 0, stop = 0;
  if (p->rounds == 0) return 0;
  read_into(g, &rd[0], 0);
  read_batch(&rd[0]);
  absorb(g, &rd[0], read);
  for (size_t k = 0; k < p->rounds && rc == 0 && !stop; k++) {
    pthread_t th;
    int running = 0;
    if (k + 1 < p->rounds && g->status == 0) {
      read_into(g, &rd[(k + 1) & 1], k + 1);
      running = pthread_create(&th, NULL, read_batch, &rd[(k + 1) & 1]) == 0;
      if (!running) read_batch(&rd[(k + 1) & 1]);
    }
    rc = exchange(g, k, g->rbuf[k & 1], &stop);
    if (running) pthread_join(th, NULL);
    if (k + 1 < p->rounds && g->status == 0) absorb(g, &rd[(k + 1) & 1], read);
  }
  return rc;
}

/* ------------------------------------------------------------ public */

/* This rank's boxes, checked; *status and why say what is wrong. */
static int check_boxes(group *g, ckptio_box_request *reqs, size_t n, ckptio_gbox *out) {
  ckptio_reader *r = g->r;
  for (size_t i = 0; i < n; i++) {
    ckptio_box_request *q = &reqs[i];
    uint64_t nb;
    q->verified = 0, q->bytes_read = 0;
    int rc = ckptio_box_check(r, q->index, q->start, q->stop, &nb);
    if (rc < 0) return rc;
    const ckptio_entry *e = ckptio_reader_entry(r, q->index);
    if (q->dst_bytes < nb || (!q->dst && nb))
      return ckptio_fail(r->err, CKPTIO_E_BUFFER_TOO_SMALL,
                         "%s: tensor '%s': the box needs %llu bytes, the destination has %llu", r->src->path, e->name,
                         (unsigned long long)nb, (unsigned long long)(q->dst ? q->dst_bytes : 0));
    if (ckptio_dtype_bits(e->dtype) % 8)
      return ckptio_fail(r->err, CKPTIO_E_INVALID_ARG,
                         "%s: tensor '%s': a group load takes whole-byte dtypes (%s is %d bits); load it alone",
                         r->src->path, e->name, ckptio_dtype_name(e->dtype), ckptio_dtype_bits(e->dtype));
    if ((rc = ckptio_reader_check_device(r, e, q->dst, q->device, nb, "box destination", &g->gpu[i])) < 0) return rc;
    out[i].index = q->index;
    for (int d = 0; d < CKPTIO_MAX_DIMS; d++)
      out[i].start[d] = d < e->ndim ? q->start[d] : 0, out[i].stop[d] = d < e->ndim ? q->stop[d] : 0;
    atomic_fetch_add(&r->total_bytes, nb);
  }
  return 0;
}

/* verified and bytes_read of each box, once every rank succeeded. */
static void report(group *g, size_t n, uint64_t read) {
  const ckptio_gplan *p = &g->p;
  for (size_t i = 0; i < n; i++) g->reqs[i].verified = 1;
  int charged = 0;
  for (size_t u = 0; u < p->nunits; u++) {
    const ckptio_gunit *un = &p->units[u];
    size_t first, end;
    ckptio_gplan_wants_of(p, un->index, &first, &end);
    for (size_t i = first; i < end; i++) {
      const ckptio_gwant *w = &p->wants[i];
      int64_t lo[CKPTIO_MAX_DIMS], hi[CKPTIO_MAX_DIMS];
      if (w->rank != p->rank || !ckptio_box_meet(un->e->ndim, w->box->start, w->box->stop, un->lo, un->hi, lo, hi))
        continue;
      if (!un->e->has_crc || !g->r->opts.crc) g->reqs[w->k].verified = 0;
    }
  }
  /* What this rank read, under its first box (the reads are the group's). */
  for (size_t i = 0; i < n && !charged; i++) g->reqs[i].bytes_read = read, charged = 1;
}

int ckptio_reader_load_boxes_group(ckptio_reader *r, const ckptio_comm *comm, ckptio_box_request *reqs, size_t n,
                                   uint64_t staging_bytes) {
  if (!r || !comm || (n && !reqs)) return CKPTIO_E_INVALID_ARG;
  ckptio_comm c;
  memset(&c, 0, sizeof(c));
  int rc = ckptio_sized_in(comm, &c, sizeof(c), "ckptio_comm", r->err, CKPTIO_ERRLEN);
  if (rc < 0) return rc;
  if (c.nranks < 1 || c.rank < 0 || c.rank >= c.nranks || !c.allgather || !c.alltoallv)
    return ckptio_fail(r->err, CKPTIO_E_INVALID_ARG,
                       "%s: a group load needs a communicator with 0 <= rank < nranks, allgather and alltoallv (a "
                       "1.0 communicator has no alltoallv; its size %zu)",
                       r->src->path, comm->size);
  group g = {.r = r, .comm = &c, .reqs = reqs};
  ckptio_gbox *mine = calloc(n + 1, sizeof(*mine));
  g.gpu = calloc(n + 1, sizeof(int));
  atomic_store(&r->done_bytes, 0);
  atomic_store(&r->total_bytes, 0);
  int status = mine && g.gpu ? check_boxes(&g, reqs, n, mine) : -ENOMEM;
  uint64_t read = 0;
  rc = ckptio_gplan_make(r, &c, mine, n, staging_bytes, status, r->err, &g.p);
  if (rc == 0) {
    int alloc = buffers(&g);
    if (alloc < 0) ckptio_fail(r->err, alloc, "%s: rank %d: out of memory for a group load's buffers", r->src->path,
                               c.rank);
    rc = ckptio_comm_status_exchange(&c, alloc, r->err, r->src->path, r->err);
  }
  if (rc == 0 && (rc = run_rounds(&g, &read)) == 0) {
    /* (A communicator that failed can agree on nothing more.) */
    rc = ckptio_comm_status_exchange(&c, g.status, g.why, r->src->path, r->err);
    if (rc < 0 && rc == g.status) snprintf(r->err, CKPTIO_ERRLEN, "%s", g.why);
  }
  if (rc == 0) report(&g, n, read);
  else
    for (size_t i = 0; i < n; i++) reqs[i].verified = 0;
  ckptio_gplan_free(&g.p);
  free(g.rbuf[0]);
  free(g.rbuf[1]);
  free(g.send);
  free(g.recv);
  free(g.send_counts);
  free(g.recv_counts);
  free(g.gpu);
  free(mine);
  return rc;
}
