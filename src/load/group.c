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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bigbuf.h"
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
  unsigned char *const *where; /* [chunk]: where its bytes are read to */
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
  unsigned char *rbuf[2];   /* the chunks this rank reads for others alone */
  size_t rbuf_bytes;
  unsigned char **where;    /* [chunk]: where this rank's chunk is read to,
                               its own destination when one of its boxes
                               holds the chunk's bytes contiguous */
  size_t *direct;           /* [chunk]: that box's index, or SIZE_MAX */
  unsigned char *send, *recv;
  size_t send_bytes, recv_bytes;
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
    rc = ckptio_box_reqs(r, p->units[ch->unit].index, lo, hi, g->where[c], -1, r->opts.crc, &v, NULL);
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
    u->crc = ckptio_crc32(ch->first ? 0 : u->crc, g->where[c], ch->bytes);
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

/* Packing: the piece from its chunk (where it was read) into the message. */
typedef struct packing {
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
  runs x = {g, g->send + out->at, g->where[c - g->p.chunks], -1};
  out->at += (size_t)bytes;
  return ckptio_box_runs(u->e->ndim, ckptio_dtype_bits(u->e->dtype), lo, hi, clo, csz, lo, sz, copy_run, &x);
}

/* Landing: a piece, from a message or straight from this rank's read
 * buffer, into the box that asked for it. */
typedef struct landing {
  const unsigned char *buf; /* the messages, or NULL: this rank's chunks */
  size_t at;                /* the next piece in the messages */
} landing;

static int land_piece(group *g, const ckptio_gchunk *c, const ckptio_gwant *w, const int64_t *lo,
                      const int64_t *hi, uint64_t bytes, void *arg) {
  landing *in = arg;
  const ckptio_gunit *u = &g->p.units[c->unit];
  int nd = u->e->ndim;
  ckptio_box_request *q = &g->reqs[w->k];
  int64_t qsz[CKPTIO_MAX_DIMS], from_lo[CKPTIO_MAX_DIMS], from_hi[CKPTIO_MAX_DIMS], from_sz[CKPTIO_MAX_DIMS];
  runs x = {g, q->dst, NULL, g->gpu[w->k]};
  if (!in->buf && g->direct[c - g->p.chunks] == w->k) { /* read into this box */
    atomic_fetch_add(&g->r->done_bytes, bytes);
    return 0;
  }
  if (in->buf) { /* the piece on its own */
    memcpy(from_lo, lo, sizeof(from_lo));
    memcpy(from_hi, hi, sizeof(from_hi));
    x.from = in->buf + in->at;
    in->at += (size_t)bytes;
  } else { /* the piece inside its chunk */
    ckptio_gchunk_box(&g->p, c, from_lo, from_hi);
    x.from = g->where[c - g->p.chunks];
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

/* Exchanges round `round` (this rank's batch read). *stop is
 * set when any rank reported a failure. A failure here (a destination
 * copy) becomes this rank's status, which the others learn next round.
 * @return 0, or the communicator's failure: this rank can take no further
 * part. */
static int exchange(group *g, size_t round, int *stop) {
  int nr = g->comm->nranks, me = g->comm->rank, rc = 0;
  size_t send_total, recv_total;
  count_round(g, round, &send_total, &recv_total);
  packing out = {0};
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
  landing self = {NULL, 0};
  rc = pieces(g, round, me, me, land_piece, &self);
  at = 0;
  for (int s = 0; s < nr && rc == 0; s++) {
    landing in = {g->recv, at + sizeof(ghdr)};
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

/* The box of this rank's that holds chunk c's bytes contiguous in host
 * memory, where the chunk can be read straight into: *at is its offset
 * there. @return the box's index, or SIZE_MAX. */
static size_t direct_box(const group *g, size_t c, uint64_t *at) {
  const ckptio_gplan *p = &g->p;
  const ckptio_gchunk *ch = &p->chunks[c];
  const ckptio_gunit *u = &p->units[ch->unit];
  int64_t clo[CKPTIO_MAX_DIMS], chi[CKPTIO_MAX_DIMS];
  ckptio_gchunk_box(p, ch, clo, chi);
  size_t first, end;
  ckptio_gplan_wants_of(p, u->index, &first, &end);
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
static uint64_t place(group *g, size_t round, int set, unsigned char *buf) {
  size_t first, end;
  uint64_t staged = 0;
  batch_of(&g->p, round, &first, &end);
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
static int buffers(group *g) {
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

static void read_into(group *g, gread *rd, size_t round) {
  place(g, round, 1, g->rbuf[round & 1]);
  *rd = (gread){.r = g->r, .p = &g->p, .units = g->p.units, .where = g->where, .keep_stats = round > 0};
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
    rc = exchange(g, k, &stop);
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

/* Ranks that share one machine's page cache and one file: each loads its
 * own boxes through that cache (PREAD), which reads each stored byte from
 * storage once for all of them and copies nothing between them; each
 * checks the CRC of every part its boxes touch.
 * @return 0 or this rank's failure (message in r->err). */
static int load_shared(group *g, size_t n) {
  ckptio_reader *r = g->r;
  ckptio_xreqs v = {0};
  size_t *first = calloc(n + 1, sizeof(size_t));
  int rc = first ? 0 : -ENOMEM;
  for (size_t i = 0; i < n && rc == 0; i++) {
    ckptio_box_request *q = &g->reqs[i];
    uint64_t nb = 0;
    first[i] = v.n;
    if (ckptio_box_check(r, q->index, q->start, q->stop, &nb) < 0) continue;
    if (!nb) {
      q->verified = 1; /* nothing to check */
      continue;
    }
    rc = ckptio_box_reqs(r, q->index, q->start, q->stop, q->dst, g->gpu[i], r->opts.crc, &v, NULL);
    /* Every part the box touches is checked, as the exchange checks it
     * (the cache holds the rest of the part: reading it costs no I/O). */
    if (rc == 0 && r->opts.crc) rc = ckptio_box_check_reqs(r, q->index, q->start, q->stop, &v, &q->verified);
  }
  if (first) first[n] = v.n;
  ckptio_options o = r->opts;
  o.load_method = CKPTIO_LOAD_PREAD;
  ckptio_exec_out out = {r->err, &r->done_bytes, &r->total_bytes, &r->timers, r->user_stream, 0};
  if (rc == 0) rc = ckptio_exec(r->ctx, &o, v.q, v.n, &out);
  for (size_t i = 0; first && i < n; i++)
    for (size_t k = first[i]; k < first[i + 1]; k++) g->reqs[i].bytes_read += atomic_load(&v.q[k].read);
  free(v.q);
  free(first);
  return rc;
}

/* The exchange: every round, then the verdict. @return 0 or the group's
 * failure. */
static int load_exchanged(group *g, size_t n) {
  ckptio_reader *r = g->r;
  const ckptio_comm *c = g->comm;
  uint64_t read = 0;
  int alloc = buffers(g);
  if (alloc < 0) ckptio_fail(r->err, alloc, "%s: rank %d: out of memory for a group load's buffers", r->src->path,
                             c->rank);
  int rc = ckptio_comm_status_exchange(c, alloc, r->err, r->src->path, r->err);
  if (rc == 0 && (rc = run_rounds(g, &read)) == 0) {
    /* (A communicator that failed can agree on nothing more.) */
    rc = ckptio_comm_status_exchange(c, g->status, g->why, r->src->path, r->err);
    if (rc < 0 && rc == g->status) snprintf(r->err, CKPTIO_ERRLEN, "%s", g->why);
  }
  if (rc == 0) report(g, n, read);
  return rc;
}

int ckptio_reader_load_boxes_group(ckptio_reader *r, const ckptio_comm *comm, ckptio_box_request *reqs, size_t n,
                                   uint64_t staging_bytes, unsigned flags) {
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
  rc = ckptio_gplan_make(r, &c, mine, n, staging_bytes, status, r->err, &g.p);
  if (rc == 0 && g.p.shared && !(flags & CKPTIO_GROUP_EXCHANGE)) {
    int mine_rc = load_shared(&g, n);
    snprintf(g.why, sizeof(g.why), "%s", r->err);
    rc = ckptio_comm_status_exchange(&c, mine_rc, g.why, r->src->path, r->err);
    if (rc < 0 && rc == mine_rc) snprintf(r->err, CKPTIO_ERRLEN, "%s", g.why);
  } else if (rc == 0) {
    rc = load_exchanged(&g, n);
  }
  if (rc < 0)
    for (size_t i = 0; i < n; i++) reqs[i].verified = 0;
  ckptio_gplan_free(&g.p);
  for (int i = 0; i < 2; i++) ckptio_bigbuf_free(g.rbuf[i], g.rbuf_bytes);
  ckptio_bigbuf_free(g.send, g.send_bytes);
  ckptio_bigbuf_free(g.recv, g.recv_bytes);
  free(g.where);
  free(g.direct);
  free(g.send_counts);
  free(g.recv_counts);
  free(g.gpu);
  free(mine);
  return rc;
}
