/*
 * The fills of `convert`: each call of the writer asks for a byte range of
 * a tensor's row-major bytes; it is cut into boxes of the tensor (whole rows
 * of the outermost dimension the range covers, then the partial rows at its
 * two ends, one dimension deeper) and loaded with one ckptio_reader_load_boxes,
 * straight into the writer's staging memory. Only a cut inside an element
 * (a compressed save's frame may end there) or inside a byte of a sub-byte
 * dtype loads the enclosing row into a small buffer first.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/pull.h"

#define MAX_READERS 8
/* Boxes of one range: at most a head and a tail per dimension, plus the
 * whole rows between them. */
#define MAX_BOXES (2 * CKPTIO_MAX_DIMS + 1)

typedef struct pulled {
  cli_pull *pull;
  size_t index;
  ckptio_tensor_info info;
  uint64_t stride_bits[CKPTIO_MAX_DIMS]; /* of one index of each dimension */
} pulled;

struct cli_pull {
  ckptio_ctx *ctx;
  char *path;
  ckptio_reader *r[MAX_READERS];
  int busy[MAX_READERS];
  int n, max;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pulled *tensors; /* by index, filled as added */
};

int cli_pull_open(const char *path, int readers, cli_pull **out) {
  cli_pull *p = calloc(1, sizeof(*p));
  if (!p) return -ENOMEM;
  p->max = readers < 1 ? 1 : readers > MAX_READERS ? MAX_READERS : readers;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  o.crc = 0;                        /* verified before the save */
  o.load_method = CKPTIO_LOAD_AUTO; /* O_DIRECT from a cold input: no page cache to hold */
  o.staging_bytes = 64u << 20;
  int rc = (p->path = strdup(path)) ? ckptio_ctx_create(&o, &p->ctx) : -ENOMEM;
  if (rc == 0) rc = ckptio_reader_open(p->ctx, path, NULL, &p->r[0]);
  if (rc == 0 && !(p->tensors = calloc(ckptio_reader_count(p->r[0]) + 1, sizeof(*p->tensors)))) rc = -ENOMEM;
  if (rc < 0) {
    p->n = p->r[0] ? 1 : 0;
    cli_pull_close(p);
    return rc;
  }
  p->n = 1;
  *out = p;
  return 0;
}

void cli_pull_close(cli_pull *p) {
  if (!p) return;
  for (int i = 0; i < p->n; i++) ckptio_reader_close(p->r[i]);
  ckptio_ctx_free(p->ctx);
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->mu);
  free(p->tensors);
  free(p->path);
  free(p);
}

/* A reader no other fill uses, opened when all are busy and fewer than max
 * are open. @return its slot, or a negative code. */
static int take_reader(cli_pull *p) {
  int k = -1, rc = 0;
  pthread_mutex_lock(&p->mu);
  while (k < 0 && rc == 0) {
    for (int i = 0; i < p->n && k < 0; i++)
      if (!p->busy[i]) k = i;
    if (k < 0 && p->n < p->max) {
      if ((rc = ckptio_reader_open(p->ctx, p->path, NULL, &p->r[p->n])) == 0) k = p->n++;
    } else if (k < 0) {
      pthread_cond_wait(&p->cv, &p->mu);
    }
  }
  if (k >= 0) p->busy[k] = 1;
  pthread_mutex_unlock(&p->mu);
  return k >= 0 ? k : rc;
}

static void give_reader(cli_pull *p, int k) {
  pthread_mutex_lock(&p->mu);
  p->busy[k] = 0;
  pthread_cond_signal(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

/* The boxes of one fill, and the copies out of whole rows loaded aside. */
typedef struct cut {
  const pulled *t;
  ckptio_box_request q[MAX_BOXES];
  size_t n;
  struct {
    unsigned char *buf, *dst;
    uint64_t skip, len;
  } aside[MAX_BOXES];
  size_t naside;
} cut;

/* A box of the rows [i0, i1) of dimension d under the indices start[0..d)
 * (every index of the dimensions after d), landing at dst. */
static void push_box(cut *c, int d, const int64_t *start, int64_t i0, int64_t i1, void *dst, uint64_t bytes) {
  ckptio_box_request *q = &c->q[c->n++];
  memset(q, 0, sizeof(*q));
  q->index = c->t->index;
  for (int k = 0; k < c->t->info.ndim; k++) {
    q->start[k] = k < d ? start[k] : k == d ? i0 : 0;
    q->stop[k] = k < d ? start[k] + 1 : k == d ? i1 : c->t->info.shape[k];
  }
  q->dst = dst;
  q->dst_bytes = bytes;
  q->device = CKPTIO_DEVICE_HOST;
}

/* Bytes [a, b) of the tensor, inside the box fixed by start[0..d) whose
 * bytes begin at `base`, to out. */
static int cover(cut *c, int d, int64_t *start, uint64_t base, uint64_t a, uint64_t b, unsigned char *out) {
  const pulled *t = c->t;
  if (d == t->info.ndim || t->stride_bits[d] % 8) {
    /* No box boundary falls inside this box at byte precision: load it
     * whole aside and copy the range out. */
    uint64_t whole = d == 0 ? t->info.nbytes : t->stride_bits[d - 1] / 8;
    unsigned char *buf = malloc(whole ? whole : 1);
    if (!buf) return -ENOMEM;
    c->aside[c->naside].buf = buf;
    c->aside[c->naside].dst = out;
    c->aside[c->naside].skip = a - base;
    c->aside[c->naside++].len = b - a;
    if (d == 0) push_box(c, 0, start, 0, t->info.ndim ? t->info.shape[0] : 0, buf, whole);
    else push_box(c, d - 1, start, start[d - 1], start[d - 1] + 1, buf, whole);
    return 0;
  }
  uint64_t s = t->stride_bits[d] / 8;
  uint64_t i0 = (a - base + s - 1) / s, i1 = (b - base) / s; /* the whole rows */
  if (i0 > i1) { /* inside one row */
    start[d] = (int64_t)((a - base) / s);
    return cover(c, d + 1, start, base + (uint64_t)start[d] * s, a, b, out);
  }
  int rc = 0;
  if (base + i0 * s > a) {
    start[d] = (int64_t)i0 - 1;
    rc = cover(c, d + 1, start, base + (i0 - 1) * s, a, base + i0 * s, out);
  }
  if (rc == 0 && i1 > i0)
    push_box(c, d, start, (int64_t)i0, (int64_t)i1, out + (base + i0 * s - a), (i1 - i0) * s);
  if (rc == 0 && base + i1 * s < b) {
    start[d] = (int64_t)i1;
    rc = cover(c, d + 1, start, base + i1 * s, base + i1 * s, b, out + (base + i1 * s - a));
  }
  return rc;
}

static int fill(void *arg, uint64_t offset, void *dst, uint64_t nbytes, char *why, size_t why_len) {
  const pulled *t = arg;
  cli_pull *p = t->pull;
  int k = take_reader(p);
  if (k < 0) {
    snprintf(why, why_len, "%s", cli_open_error(k));
    return k;
  }
  cut c = {.t = t};
  int64_t start[CKPTIO_MAX_DIMS] = {0};
  int rc = cover(&c, 0, start, 0, offset, offset + nbytes, dst);
  if (rc == 0 && (rc = ckptio_reader_load_boxes(p->r[k], c.q, c.n)) < 0)
    snprintf(why, why_len, "%s", ckptio_reader_last_error(p->r[k]));
  give_reader(p, k);
  for (size_t i = 0; i < c.naside; i++) {
    if (rc == 0) memcpy(c.aside[i].dst, c.aside[i].buf + c.aside[i].skip, c.aside[i].len);
    free(c.aside[i].buf);
  }
  return rc;
}

int cli_pull_add(cli_pull *p, ckptio_writer *w, size_t index) {
  pulled *t = &p->tensors[index];
  int rc = ckptio_reader_info(p->r[0], index, &t->info);
  if (rc < 0) return rc;
  t->pull = p;
  t->index = index;
  uint64_t bits = (uint64_t)ckptio_dtype_bits(t->info.dtype);
  for (int d = t->info.ndim - 1; d >= 0; d--) {
    t->stride_bits[d] = bits;
    bits *= (uint64_t)t->info.shape[d]; /* cannot overflow: the tensor's byte count did not */
  }
  ckptio_tensor desc = {t->info.name, t->info.dtype, t->info.ndim, {0}, NULL, CKPTIO_DEVICE_HOST};
  memcpy(desc.shape, t->info.shape, sizeof(desc.shape));
  return ckptio_writer_add_fill(w, &desc, fill, t);
}
