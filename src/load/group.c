/* Group loads: the call (group_run.h says where the rest is): checks this
 * rank's boxes, makes the plan with the others, picks the way every rank
 * picks alike (the shared page cache, windows of shared memory, or the
 * exchange), and agrees on the verdict, naming the rank that failed. */
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/collective.h"
#include "core/error.h"
#include "core/bigbuf.h"
#include "core/box.h"
#include "core/sized.h"
#include "load/box.h"
#include "load/group_run.h"

/* ------------------------------------------------------------ public */

/* This rank's boxes, checked; *status and why say what is wrong. */
static int check_boxes(ckptio_group *g, ckptio_box_request *reqs, size_t n, ckptio_gbox *out) {
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
static void report(ckptio_group *g, size_t n, uint64_t read) {
  const ckptio_gplan *p = &g->p;
  for (size_t i = 0; i < n; i++) g->reqs[i].verified = 1;
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
  if (n) g->reqs[0].bytes_read = read;
}

/* Ranks that share one machine's page cache and one file: each loads its
 * own boxes through that cache (PREAD), which reads each stored byte from
 * storage once for all of them and copies nothing between them; each
 * checks the CRC of every part its boxes touch.
 * @return 0 or this rank's failure (message in r->err). */
static int load_shared(ckptio_group *g, size_t n) {
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

/* The rounds, through windows of shared memory where every rank is on
 * one machine (and may share memory), else exchanged; then the verdict.
 * @return 0 or the group's failure. */
static int load_rounds(ckptio_group *g, size_t n, unsigned flags) {
  ckptio_reader *r = g->r;
  uint64_t read = 0;
  int rc = 1;
  if (g->p.node && !(flags & CKPTIO_GROUP_EXCHANGE)) rc = ckptio_grp_load_windows(g, &read);
  if (rc == 1) rc = ckptio_grp_load_exchanged(g, &read);
  if (rc == 0) {
    /* (A communicator that failed can agree on nothing more.) */
    rc = ckptio_comm_status_exchange(g->comm, g->status, g->why, r->src->path, r->err);
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
  ckptio_group g = {.r = r, .comm = &c, .reqs = reqs};
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
    rc = load_rounds(&g, n, flags);
  }
  if (rc < 0)
    for (size_t i = 0; i < n; i++) reqs[i].verified = 0;
  ckptio_gplan_free(&g.p);
  for (int i = 0; i < 2; i++) ckptio_bigbuf_free(g.rbuf[i], g.rbuf_bytes);
  ckptio_bigbuf_free(g.send, g.send_bytes);
  ckptio_bigbuf_free(g.recv, g.recv_bytes);
  if (g.window) munmap(g.window, g.window_bytes);
  free(g.where);
  free(g.direct);
  free(g.send_counts);
  free(g.recv_counts);
  free(g.gpu);
  free(mine);
  return rc;
}
