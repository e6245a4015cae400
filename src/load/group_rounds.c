/* Group loads: what every way shares (group_run.h): a round's read, the
 * walk over its pieces, landing them, and the loop of rounds. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/box.h"
#include "core/crc32.h"
#include "core/error.h"
#include "load/box.h"
#include "load/group_run.h"

/* ------------------------------------------------------------ read */

static void *read_batch(void *arg) {
  ckptio_gread *g = arg;
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
  if (rc == 0) rc = ckptio_exec(r->ctx, &g->opts, v.q, v.n, &out);
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

void ckptio_grp_batch(const ckptio_gplan *p, int o, size_t round, size_t *first, size_t *end) {
  *first = *end = 0;
  if (round < p->nbatches[o]) *first = p->batch[o][round], *end = p->batch[o][round + 1];
}

void ckptio_grp_chunk(const ckptio_gplan *p, size_t c, int64_t *lo, int64_t *hi, size_t *first, size_t *end) {
  ckptio_gchunk_box(p, &p->chunks[c], lo, hi);
  ckptio_gplan_wants_of(p, p->units[p->chunks[c].unit].index, first, end);
}

int ckptio_grp_pieces(ckptio_group *g, size_t round, int o, int to, ckptio_grp_piece_fn fn, void *arg) {
  const ckptio_gplan *p = &g->p;
  if (round >= p->nbatches[o]) return 0;
  for (size_t c = p->batch[o][round]; c < p->batch[o][round + 1]; c++) {
    const ckptio_gchunk *ch = &p->chunks[c];
    const ckptio_gunit *u = &p->units[ch->unit];
    int64_t clo[CKPTIO_MAX_DIMS], chi[CKPTIO_MAX_DIMS];
    size_t first, end;
    ckptio_grp_chunk(p, c, clo, chi, &first, &end);
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

int ckptio_grp_count(ckptio_group *g, const ckptio_gchunk *c, const ckptio_gwant *w, const int64_t *lo,
                     const int64_t *hi, uint64_t bytes, void *arg) {
  (void)g, (void)c, (void)w, (void)lo, (void)hi;
  *(size_t *)arg += (size_t)bytes;
  return 0;
}

int ckptio_grp_copy_run(void *arg, uint64_t a, uint64_t b, uint64_t n) {
  ckptio_grp_runs *x = arg;
  if (x->gpu < 0) {
    memcpy(x->to + b, x->from + a, n);
    return 0;
  }
  return ckptio_gpu_copy_sync(x->g->r->ctx->gpu, x->gpu, CKPTIO_GPU_H2D, x->to + b, x->from + a, n, x->g->r->err,
                              CKPTIO_ERRLEN);
}

int ckptio_grp_land(ckptio_group *g, const ckptio_gchunk *c, const ckptio_gwant *w, const int64_t *lo,
                    const int64_t *hi, uint64_t bytes, void *arg) {
  ckptio_landing *in = arg;
  const ckptio_gunit *u = &g->p.units[c->unit];
  int nd = u->e->ndim;
  ckptio_box_request *q = &g->reqs[w->k];
  int64_t qsz[CKPTIO_MAX_DIMS], from_lo[CKPTIO_MAX_DIMS], from_hi[CKPTIO_MAX_DIMS], from_sz[CKPTIO_MAX_DIMS];
  ckptio_grp_runs x = {g, q->dst, NULL, g->gpu[w->k]};
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
  int rc = ckptio_box_runs(nd, ckptio_dtype_bits(u->e->dtype), lo, hi, from_lo, from_sz, q->start, qsz, ckptio_grp_copy_run, &x);
  if (rc == 0) atomic_fetch_add(&g->r->done_bytes, bytes);
  return rc;
}

/* ------------------------------------------------------------ rounds */

static void read_into(ckptio_group *g, ckptio_gread *rd, size_t round,
                      void (*place)(ckptio_group *g, size_t round)) {
  place(g, round);
  *rd = (ckptio_gread){.r = g->r, .p = &g->p, .units = g->p.units, .where = g->where, .keep_stats = round > 0,
                       .opts = g->read_opts};
  ckptio_grp_batch(&g->p, g->p.rank, round, &rd->first, &rd->end);
}

/* A finished read: its bytes counted, its failure this rank's status. */
static void absorb(ckptio_group *g, const ckptio_gread *rd, uint64_t *read) {
  *read += rd->read;
  if (rd->rc < 0 && g->status == 0) {
    g->status = rd->rc;
    snprintf(g->why, sizeof(g->why), "%s", rd->msg);
  }
}

int ckptio_grp_rounds(ckptio_group *g, uint64_t *read, void (*place)(ckptio_group *g, size_t round),
                      int (*step)(ckptio_group *g, size_t round, int *stop)) {
  ckptio_gplan *p = &g->p;
  /* A rank reads its spans for the others: a cold file by O_DIRECT, where
   * a buffered read's read-ahead would run on past the span into bytes
   * another rank reads (which, on another machine or from another copy of
   * the file, are read twice). The reader's own choice stands otherwise. */
  g->read_opts = g->r->opts;
  double resident = 1;
  if (g->read_opts.load_method == CKPTIO_LOAD_AUTO && ckptio_reader_resident(g->r, &resident) == 0 && resident < 0.5)
    g->read_opts.load_method = CKPTIO_LOAD_DIRECT;
  ckptio_gread rd[2];
  int rc = 0, stop = 0;
  if (p->rounds == 0) return 0;
  read_into(g, &rd[0], 0, place);
  read_batch(&rd[0]);
  absorb(g, &rd[0], read);
  for (size_t k = 0; k < p->rounds && rc == 0 && !stop; k++) {
    pthread_t th;
    int running = 0;
    if (k + 1 < p->rounds && g->status == 0) {
      read_into(g, &rd[(k + 1) & 1], k + 1, place);
      running = pthread_create(&th, NULL, read_batch, &rd[(k + 1) & 1]) == 0;
      if (!running) read_batch(&rd[(k + 1) & 1]);
    }
    rc = step(g, k, &stop);
    if (running) pthread_join(th, NULL);
    if (k + 1 < p->rounds && g->status == 0) absorb(g, &rd[(k + 1) & 1], read);
  }
  return rc;
}
