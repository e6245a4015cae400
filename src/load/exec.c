/* The executor (exec.h): one job body for every kind of source. */
#include "load/exec.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/crc32.h"
#include "core/trace.h"
#include "device/transfer.h"

/* A load onto GPUs starts with this many reads in flight, and each read
 * that ends lets two more start, up to what the ring holds. A disk given
 * the ring's 32 reads at once ends them together (measured here: 32 x 8 MiB
 * all ended at 100-130 ms, 4 of them at 14 ms), and the copies to the GPU
 * cannot start before the first one: the pipeline's fill time. Host loads
 * have nothing after the read and start at full depth. */
#define SLOW_START 4

/* A slot's host-to-device copies that may still run after its job ended:
 * the GPUs they go to and the request they belong to (for the error). */
typedef struct copying {
  uint64_t gpus;
  const ckptio_xreq *q;
} copying;

typedef struct exec {
  ckptio_ctx *ctx;
  ckptio_plan plan;
  ckptio_batch batch;
  const ckptio_exec_out *out;
  copying *copies;        /* per ring slot; written by the job holding it */
} exec;

struct ckptio_run {
  exec *x;
  ckptio_job *job;
  uint64_t device_ns;     /* spent in GPU copies, kept apart from the read */
  uint64_t copying;       /* GPUs this job's copies from its slot go to */
  char msg[CKPTIO_ERRLEN];
};

ckptio_job *ckptio_plan_job(ckptio_plan *p, ckptio_source *src, size_t nparts) {
  if (p->njobs == p->jobs_cap) {
    size_t cap = p->jobs_cap ? 2 * p->jobs_cap : 64;
    ckptio_job *j = realloc(p->jobs, cap * sizeof(*j));
    if (!j) return NULL;
    p->jobs = j, p->jobs_cap = cap;
  }
  if (p->nparts + nparts > p->parts_cap) {
    size_t cap = p->parts_cap ? 2 * p->parts_cap : 64;
    while (cap < p->nparts + nparts) cap *= 2;
    ckptio_part *q = realloc(p->parts, cap * sizeof(*q));
    if (!q) return NULL;
    p->parts = q, p->parts_cap = cap;
  }
  ckptio_job *j = &p->jobs[p->njobs++];
  memset(j, 0, sizeof(*j));
  j->src = src;
  j->first = p->nparts;
  j->nparts = nparts;
  memset(&p->parts[p->nparts], 0, nparts * sizeof(ckptio_part));
  p->nparts += nparts;
  return j;
}

ckptio_job *ckptio_run_job(ckptio_run *r) { return r->job; }
void ckptio_run_direct(ckptio_run *r, uint64_t n) { atomic_fetch_add(&r->x->out->timers->direct_bytes, n); }
ckptio_part *ckptio_run_part(ckptio_run *r, size_t k) { return &r->x->plan.parts[r->job->first + k]; }
char *ckptio_run_msg(ckptio_run *r, size_t *len) {
  *len = sizeof(r->msg);
  return r->msg;
}
uint64_t ckptio_run_slot_bytes(ckptio_run *r) { return ckptio_ring_slot_bytes(r->x->ctx->ring); }

/* Big-endian elements to little-endian, in place; a complex number's two
 * floats each on its own. */
static void byteswap(const ckptio_entry *e, unsigned char *p, uint64_t len) {
  size_t es = e->dtype == CKPTIO_C64 ? 4 : ckptio_entry_elem(e);
  for (uint64_t i = 0; i + es <= len; i += es)
    for (size_t a = 0, b = es - 1; a < b; a++, b--) {
      unsigned char c = p[i + a];
      p[i + a] = p[i + b];
      p[i + b] = c;
    }
}

/* n bytes at `from` to GPU memory `to`. From the job's slot the copy is
 * queued and the job goes on (its slot is released still copying and the
 * next user waits for it), so reads and copies overlap even on one worker;
 * from anywhere else (a mapping, a workspace the next job reuses) it is
 * waited for here. */
static int to_gpu(ckptio_run *r, const ckptio_xreq *q, unsigned char *to, const unsigned char *from, uint64_t n,
                  char *detail, size_t len) {
  ckptio_job *j = r->job;
  ckptio_ring *ring = r->x->ctx->ring;
  size_t slot = ckptio_ring_slot_index(ring, j->slot);
  int in_slot = j->slot && from >= j->slot && from + n <= j->slot + ckptio_ring_slot_bytes(ring);
  ckptio_span span = ckptio_trace_begin("load.to_device");
  int rc = in_slot ? ckptio_gpu_h2d_start(r->x->ctx->gpu, q->gpu, slot, to, from, (size_t)n, detail, len)
                   : ckptio_gpu_h2d_slot(r->x->ctx->gpu, q->gpu, slot, to, from, (size_t)n, detail, len);
  if (rc == 0 && in_slot) r->copying |= 1ull << q->gpu, r->x->copies[slot].q = q;
  ckptio_trace_end(&span, n, NULL);
  return rc;
}

/* Output bytes [off, off + len) of a scattered request, each run's piece
 * to its place: dst + run * dpitch. */
static int scatter(ckptio_run *r, const ckptio_xreq *q, uint64_t off, const unsigned char *bytes, uint64_t len) {
  for (uint64_t x = off, n; x < off + len; x += n) {
    uint64_t k = x / q->drun, within = x % q->drun;
    n = q->drun - within < off + len - x ? q->drun - within : off + len - x;
    unsigned char *to = q->dst + k * q->dpitch + within;
    const unsigned char *from = bytes + (x - off);
    if (q->gpu < 0) {
      memcpy(to, from, (size_t)n);
      continue;
    }
    char detail[CKPTIO_ERRLEN];
    int rc = to_gpu(r, q, to, from, n, detail, sizeof(detail));
    if (rc < 0)
      return ckptio_err_fmt(r->msg, sizeof(r->msg), rc, "%s: part of tensor '%s' to GPU %d: %s", q->src->path,
                            q->e->name, q->gpu, detail);
  }
  return 0;
}

int ckptio_run_deliver(ckptio_run *r, size_t k, const unsigned char *bytes, int writable) {
  ckptio_part *p = ckptio_run_part(r, k);
  ckptio_xreq *q = p->q;
  ckptio_job *j = r->job;
  if (q->dst) {
    unsigned char *host = ckptio_xreq_host(q) ? q->dst + p->off : NULL;
    if (q->e->byteswap && !q->raw && ckptio_entry_elem(q->e) > 1) {
      /* After the CRC, which covers the file's bytes. */
      unsigned char *w = writable ? (unsigned char *)bytes : host ? host : j->slot;
      if (w != bytes) memcpy(w, bytes, (size_t)p->len);
      byteswap(q->e, w, p->len);
      bytes = w;
    }
    if (host && bytes != host) memcpy(host, bytes, (size_t)p->len);
    if (q->dpitch) {
      uint64_t t = ckptio_now_ns();
      int rc = scatter(r, q, p->off, bytes, p->len);
      if (q->gpu >= 0) r->device_ns += ckptio_now_ns() - t;
      if (rc < 0) return rc;
    } else if (!host) {
      char detail[CKPTIO_ERRLEN];
      uint64_t t = ckptio_now_ns();
      int rc = to_gpu(r, q, q->dst + p->off, bytes, p->len, detail, sizeof(detail));
      r->device_ns += ckptio_now_ns() - t;
      if (rc < 0)
        return ckptio_err_fmt(r->msg, sizeof(r->msg), rc, "%s: %stensor '%s' to GPU %d: %s", q->src->path,
                              q->g.full ? "" : "slice of ", q->e->name, q->gpu, detail);
    }
  }
  atomic_fetch_add(r->x->out->done_bytes, p->len);
  return 0;
}

/* What a job reads: the bytes of its parts (a trace's args). */
static uint64_t job_bytes(const exec *x, const ckptio_job *j) {
  uint64_t n = 0;
  for (size_t k = 0; k < j->nparts; k++) n += x->plan.parts[j->first + k].len;
  return n;
}

/* Ends a job's "load.read" span with its bytes and first tensor, looked
 * up only when the span is traced. */
static void end_read_span(const ckptio_span *s, const exec *x, const ckptio_job *j) {
  if (!s->sinks) return;
  ckptio_trace_end(s, job_bytes(x, j), j->nparts ? x->plan.parts[j->first].q->e->name : NULL);
}

static void job_main(void *arg) {
  ckptio_job *j = arg;
  exec *x = j->owner;
  ckptio_run r = {.x = x, .job = j};
  int rc = 0;
  if (!ckptio_batch_failed(&x->batch)) {
    uint64_t t0 = ckptio_now_ns();
    ckptio_span span = ckptio_trace_begin("load.read");
    rc = j->src->ops->run(j->src, &r);
    end_read_span(&span, x, j);
    uint64_t spent = ckptio_now_ns() - t0;
    atomic_fetch_add(&x->out->timers->copy_ns, spent - r.device_ns);
    atomic_fetch_add(&x->out->timers->device_ns, r.device_ns);
    if (rc < 0 && !r.msg[0]) {
      const ckptio_part *p = ckptio_run_part(&r, 0);
      const ckptio_xreq *q = p->q;
      if (q->g.full)
        snprintf(r.msg, sizeof(r.msg), "%s: tensor '%s': read of %llu bytes at offset %llu failed: %s", j->src->path,
                 q->e->name, (unsigned long long)p->len, (unsigned long long)(q->e->offset + q->g.src0 + p->off),
                 ckptio_strerror(rc));
      else
        snprintf(r.msg, sizeof(r.msg), "%s: tensor '%s': reading bytes %llu to %llu of a slice failed: %s",
                 j->src->path, q->e->name, (unsigned long long)p->off, (unsigned long long)(p->off + p->len),
                 ckptio_strerror(rc));
    }
  }
  if (j->slot) {
    x->copies[ckptio_ring_slot_index(x->ctx->ring, j->slot)].gpus = r.copying;
    ckptio_ring_release_copying(x->ctx->ring, j->slot, r.copying, x);
  }
  ckptio_batch_done(&x->batch, rc, r.msg);
}

/* Waits for the copies still reading staging slot `slot` to the GPUs in
 * `gpus` (this load's or an earlier one's) before it is written again; a
 * failure names the tensor when the copy was one of this load's. */
static int wait_copies(exec *x, size_t slot, uint64_t gpus, char *err) {
  const ckptio_xreq *q = x->copies[slot].q;
  x->copies[slot] = (copying){0, NULL};
  if (!gpus) return 0;
  char detail[CKPTIO_ERRLEN];
  uint64_t t = ckptio_now_ns();
  int rc = ckptio_gpu_wait_slot(x->ctx->gpu, gpus, slot, detail, sizeof(detail));
  atomic_fetch_add(&x->out->timers->device_ns, ckptio_now_ns() - t);
  if (rc < 0 && q)
    ckptio_err_fmt(err, CKPTIO_ERRLEN, rc, "%s: tensor '%s' to GPU %d: %s", q->src->path, q->e->name, q->gpu,
                   detail);
  else if (rc < 0)
    ckptio_err_fmt(err, CKPTIO_ERRLEN, rc, "a staging slot's copy to a GPU: %s", detail);
  return rc;
}

/* A slot for a job, once the copies from its last use have read it. */
static unsigned char *take_slot(exec *x) {
  unsigned char *slot = ckptio_ring_acquire(x->ctx->ring);
  char err[CKPTIO_ERRLEN];
  int rc = wait_copies(x, ckptio_ring_slot_index(x->ctx->ring, slot), ckptio_ring_take_copying(x->ctx->ring, slot),
                       err);
  if (rc < 0) {
    ckptio_ring_release(x->ctx->ring, slot);
    ckptio_batch_add(&x->batch, 1);
    ckptio_batch_done(&x->batch, rc, err);
    return NULL;
  }
  return slot;
}

/* After the jobs: every copy this load left running has ended. The first
 * failure's message goes to err. */
static int copies_done(exec *x, char *err) {
  int rc = 0;
  for (size_t s = 0, n = ckptio_ring_slots(x->ctx->ring); s < n; s++) {
    if (!x->copies[s].gpus) continue;
    char msg[CKPTIO_ERRLEN];
    int src = wait_copies(x, s, x->copies[s].gpus, msg);
    ckptio_ring_clear_copying(x->ctx->ring, s, x);
    if (src < 0 && rc == 0) rc = src, snprintf(err, CKPTIO_ERRLEN, "%s", msg);
  }
  return rc;
}

/* Each source plans its own requests, in the order they first appear. */
static int plan_all(exec *x, ckptio_xreq *qs, size_t n) {
  ckptio_xreq **mine = calloc(n + 1, sizeof(*mine));
  char *done = calloc(n + 1, 1);
  int rc = mine && done ? 0 : -ENOMEM;
  for (size_t i = 0; i < n && rc == 0; i++) {
    if (done[i]) continue;
    size_t m = 0;
    for (size_t k = i; k < n; k++)
      if (!done[k] && qs[k].src == qs[i].src) mine[m++] = &qs[k], done[k] = 1;
    rc = qs[i].src->ops->plan(qs[i].src, &x->plan, mine, m);
  }
  free(mine);
  free(done);
  return rc;
}

/* The sources that planned, each once, told the load is over. */
static void finish_all(ckptio_xreq *qs, size_t n) {
  for (size_t i = 0; i < n; i++) {
    int first = 1;
    for (size_t k = 0; k < i && first; k++) first = qs[k].src != qs[i].src;
    if (first && qs[i].src->ops->finish) qs[i].src->ops->finish(qs[i].src);
  }
}

static int check_crcs(exec *x, ckptio_xreq *qs, size_t n) {
  for (size_t i = 0; i < n; i++) qs[i].crc = 0;
  for (size_t k = 0; k < x->plan.nparts; k++) {
    ckptio_part *p = &x->plan.parts[k];
    if (p->q->check) p->q->crc = ckptio_crc32_combine(p->q->crc, p->crc, p->len);
  }
  for (size_t i = 0; i < n; i++) {
    const ckptio_entry *e = qs[i].e;
    if (qs[i].check && qs[i].crc != e->crc)
      return ckptio_err_fmt(x->out->err, CKPTIO_ERRLEN, CKPTIO_E_CHECKSUM,
                            "%s: tensor '%s': checksum mismatch (recorded %08x, data %08x)", qs[i].src->path,
                            e->name, e->crc, qs[i].crc);
  }
  return 0;
}

int ckptio_exec(ckptio_ctx *ctx, const ckptio_options *opts, ckptio_xreq *qs, size_t n, const ckptio_exec_out *out) {
  exec x = {.ctx = ctx, .plan = {.ctx = ctx, .opts = opts}, .out = out};
  int forked = ckptio_ctx_check_process(ctx, out->err, CKPTIO_ERRLEN);
  if (forked < 0) return forked;
  if (!(x.copies = calloc(ckptio_ring_slots(ctx->ring), sizeof(copying)))) {
    snprintf(out->err, CKPTIO_ERRLEN, "out of memory starting a load");
    return -ENOMEM;
  }
  ckptio_span span = ckptio_trace_begin("load");
  void *events[CKPTIO_GPU_MAX] = {0};
  uint64_t gpus = 0, bytes = 0;
  int rc = 0;
  for (size_t i = 0; i < n; i++) {
    bytes += qs[i].g.nbytes;
    if (qs[i].gpu >= 0 && qs[i].g.nbytes) gpus |= 1ull << qs[i].gpu;
  }
  x.plan.load_bytes = bytes;
  if (gpus) {
    char msg[CKPTIO_ERRLEN];
    rc = ckptio_gpu_after_callers(ctx->gpu, gpus, out->user_stream, CKPTIO_GPU_H2D, events, msg, sizeof(msg));
    if (rc < 0) {
      ckptio_err_fmt(out->err, CKPTIO_ERRLEN, rc, "%s: ordering the load after the caller's stream: %s",
                     qs[0].src->path, msg);
      goto out;
    }
  }
  if (!out->keep_stats) {
    atomic_store(out->done_bytes, 0);
    atomic_store(out->total_bytes, 0);
    memset(out->timers, 0, sizeof(*out->timers));
    out->timers->start_ns = ckptio_now_ns();
  }
  atomic_fetch_add(out->total_bytes, bytes);
  if ((rc = plan_all(&x, qs, n)) < 0) {
    if (rc == -ENOMEM && !out->err[0]) snprintf(out->err, CKPTIO_ERRLEN, "out of memory planning a load");
    finish_all(qs, n);
    goto out;
  }
  ckptio_batch_init(&x.batch);
  for (size_t i = 0; i < x.plan.njobs && !ckptio_batch_failed(&x.batch); i++) {
    ckptio_job *j = &x.plan.jobs[i];
    j->owner = &x;
    atomic_fetch_or(&out->timers->methods, 1u << j->method);
    if (gpus && i >= SLOW_START) ckptio_batch_wait_ended(&x.batch, (i - SLOW_START) / 2 + 1);
    /* On this thread: the ring bounds what is in flight, and a job never
     * waits for a slot while holding a worker. */
    if (j->need_slot && !(j->slot = take_slot(&x))) break;
    ckptio_batch_add(&x.batch, 1);
    int qrc = ckptio_pool_add(ctx->pool, job_main, j);
    if (qrc < 0) {
      if (j->slot) ckptio_ring_release(ctx->ring, j->slot);
      ckptio_batch_done(&x.batch, qrc, "cannot queue a read: out of memory");
    }
  }
  rc = ckptio_batch_wait(&x.batch);
  if (rc < 0) snprintf(out->err, CKPTIO_ERRLEN, "%s", x.batch.err);
  char copy_err[CKPTIO_ERRLEN];
  int copied = copies_done(&x, copy_err);
  if (rc == 0 && copied < 0) rc = copied, snprintf(out->err, CKPTIO_ERRLEN, "%s", copy_err);
  out->timers->end_ns = ckptio_now_ns();
  ckptio_batch_destroy(&x.batch);
  finish_all(qs, n);
  ckptio_span check = ckptio_trace_begin("load.check");
  if (rc == 0) rc = check_crcs(&x, qs, n);
  ckptio_trace_end(&check, 0, NULL);
out:
  ckptio_trace_end(&span, bytes, n ? qs[0].src->path : NULL);
  ckptio_gpu_events_free(ctx->gpu, events);
  free(x.plan.jobs);
  free(x.plan.parts);
  free(x.copies);
  return rc;
}
