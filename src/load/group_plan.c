/* The plan of a group load (group.h): gathered boxes, the units they need,
 * their owners, chunks and rounds, the same on every rank. The gathered
 * bytes use the machine's byte order: the ranks of one job run one build
 * on one kind of machine. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/box.h"
#include "core/collective.h"
#include "core/error.h"
#include "io/cache.h"
#include "load/box.h"
#include "load/group.h"

#define DEFAULT_STAGING (256ull << 20)
#define MIN_CHUNK (64ull << 10)

/* What each rank sends first: its checkpoint's fingerprint, its staging
 * budget, where it is (its kernel's boot id and the file's device and
 * inode: equal on every rank when they share one page cache and one
 * file), whether the checkpoint fits in that cache (io/cache.h's rule),
 * and how many boxes follow. */
typedef struct ghead {
  uint64_t fingerprint, staging, boot, dev, ino, fits, n;
} ghead;

/* ------------------------------------------------------------ fingerprint */

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* What two ranks must agree on to exchange bytes: every tensor's name,
 * dtype and shape, and every stored part's place, size and CRC. */
static uint64_t fingerprint(ckptio_reader *r) {
  uint64_t h = fnv(14695981039346656037ull, &r->src->idx.count, sizeof(r->src->idx.count));
  for (size_t i = 0; i < r->src->idx.count; i++) {
    const ckptio_entry *e = ckptio_reader_entry(r, i);
    h = fnv(h, e->name, strlen(e->name) + 1);
    h = fnv(h, &e->dtype, sizeof(e->dtype));
    h = fnv(h, e->shape, (size_t)e->ndim * sizeof(int64_t));
    const ckptio_spart *parts;
    ckptio_spart one;
    size_t n = ckptio_reader_parts_of(r, i, &parts, &one);
    for (size_t k = 0; k < n; k++) {
      const ckptio_entry *pe = &parts[k].src->idx.entries[parts[k].local];
      uint64_t f[3] = {pe->nbytes, (uint64_t)pe->has_crc, pe->has_crc ? pe->crc : 0};
      h = fnv(h, parts[k].off, (size_t)e->ndim * sizeof(int64_t));
      h = fnv(h, pe->shape, (size_t)e->ndim * sizeof(int64_t));
      h = fnv(h, f, sizeof(f));
    }
  }
  return h;
}

/* This kernel's boot id, hashed: ranks that agree on it run on one
 * machine, under one page cache. 0 when unknown. */
static uint64_t boot_id(void) {
  char id[64] = "";
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    if (!fgets(id, sizeof(id), f)) id[0] = 0;
    fclose(f);
  }
  return id[0] ? fnv(14695981039346656037ull, id, strlen(id)) : 0;
}

/* ------------------------------------------------------------ wants */

static int want_cmp(const void *a, const void *b) {
  const ckptio_gwant *x = a, *y = b;
  if (x->box->index != y->box->index) return x->box->index < y->box->index ? -1 : 1;
  if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
  return x->k < y->k ? -1 : x->k > y->k;
}

void ckptio_gplan_wants_of(const ckptio_gplan *p, size_t index, size_t *first, size_t *end) {
  size_t lo = 0, hi = p->nwants;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (p->wants[mid].box->index < index) lo = mid + 1;
    else hi = mid;
  }
  *first = lo;
  while (lo < p->nwants && p->wants[lo].box->index == index) lo++;
  *end = lo;
}

/* ------------------------------------------------------------ units */

typedef struct filekey {
  const ckptio_source *src;
  size_t k;
} filekey;

static int filekey_cmp(const void *a, const void *b) {
  const filekey *x = a, *y = b;
  return x->src < y->src ? -1 : x->src > y->src;
}

static int unit_cmp(const void *a, const void *b) {
  const ckptio_gunit *x = a, *y = b;
  if (x->file != y->file) return x->file < y->file ? -1 : 1;
  if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
  return x->index < y->index ? -1 : x->index > y->index;
}

static int push_unit(ckptio_gplan *p, size_t *cap, const ckptio_gunit *u) {
  if (p->nunits == *cap) {
    size_t c = *cap ? 2 * *cap : 64;
    ckptio_gunit *q = realloc(p->units, c * sizeof(*q));
    if (!q) return -ENOMEM;
    p->units = q, *cap = c;
  }
  p->units[p->nunits++] = *u;
  return 0;
}

/* The parts some want meets, in file order, each given its owner. */
static int make_units(ckptio_reader *r, ckptio_gplan *p) {
  size_t nf = r->src->nfiles, cap = 0;
  filekey *files = calloc(nf ? nf : 1, sizeof(*files));
  if (!files) return -ENOMEM;
  for (size_t k = 0; k < nf; k++) files[k] = (filekey){r->src->ops->file(r->src, k), k};
  qsort(files, nf, sizeof(*files), filekey_cmp);
  int rc = 0;
  for (size_t w = 0, end; w < p->nwants && rc == 0; w = end) {
    size_t index = (size_t)p->wants[w].box->index;
    for (end = w; end < p->nwants && p->wants[end].box->index == index;) end++;
    const ckptio_entry *te = ckptio_reader_entry(r, index);
    const ckptio_spart *parts;
    ckptio_spart one;
    size_t n = ckptio_reader_parts_of(r, index, &parts, &one);
    for (size_t k = 0; k < n && rc == 0; k++) {
      ckptio_gunit u = {.index = index, .part = parts[k], .e = &parts[k].src->idx.entries[parts[k].local]};
      if (!(u.bytes = u.e->nbytes)) continue;
      int needed = 0;
      for (int d = 0; d < te->ndim; d++) u.lo[d] = parts[k].off[d], u.hi[d] = parts[k].off[d] + u.e->shape[d];
      for (size_t i = w; i < end && !needed; i++) {
        int64_t lo[CKPTIO_MAX_DIMS], hi[CKPTIO_MAX_DIMS];
        needed = ckptio_box_meet(te->ndim, p->wants[i].box->start, p->wants[i].box->stop, u.lo, u.hi, lo, hi);
      }
      if (!needed) continue;
      filekey key = {parts[k].src, 0}, *f = bsearch(&key, files, nf, sizeof(*files), filekey_cmp);
      u.file = f ? f->k : 0;
      u.offset = u.e->offset;
      rc = push_unit(p, &cap, &u);
    }
  }
  free(files);
  if (rc < 0) return rc;
  qsort(p->units, p->nunits, sizeof(*p->units), unit_cmp);
  /* Contiguous spans balanced by bytes: a unit goes to the rank whose
   * share of the total holds its middle byte. */
  uint64_t total = 0, at = 0;
  for (size_t i = 0; i < p->nunits; i++) total += p->units[i].bytes;
  uint64_t share = total / (uint64_t)p->nranks + 1;
  for (size_t i = 0; i < p->nunits; i++) {
    uint64_t o = (at + p->units[i].bytes / 2) / share;
    p->units[i].owner = o < (uint64_t)p->nranks ? (int)o : p->nranks - 1;
    at += p->units[i].bytes;
  }
  return 0;
}

/* ------------------------------------------------------------ chunks */

/* Rows of dimension 0 per chunk: a unit whose CRC can be computed only
 * over its stored bytes as they are (a view's storage, bytes swapped on
 * load) or whose rows are not whole bytes is read whole. */
static int64_t rows_per_chunk(const ckptio_gunit *u, uint64_t chunk) {
  const ckptio_entry *e = u->e;
  if (e->ndim == 0 || e->strided || e->byteswap || ckptio_dtype_bits(e->dtype) % 8 || u->bytes <= chunk ||
      e->shape[0] <= 1)
    return e->ndim ? e->shape[0] : 1;
  uint64_t row = u->bytes / (uint64_t)e->shape[0];
  uint64_t n = row ? chunk / row : 1;
  return n ? (int64_t)n : 1;
}

static int make_chunks(ckptio_gplan *p) {
  size_t cap = 0, nr = (size_t)p->nranks;
  if (!(p->batch = calloc(nr, sizeof(*p->batch))) || !(p->nbatches = calloc(nr, sizeof(size_t)))) return -ENOMEM;
  for (size_t o = 0; o < nr; o++) {
    size_t first = p->nchunks;
    for (size_t i = 0; i < p->nunits; i++) {
      const ckptio_gunit *u = &p->units[i];
      if (u->owner != (int)o) continue;
      int64_t rows = u->e->ndim ? u->e->shape[0] : 1, step = rows_per_chunk(u, p->chunk);
      uint64_t row = rows ? u->bytes / (uint64_t)rows : u->bytes;
      for (int64_t r0 = 0; r0 < rows; r0 += step) {
        if (p->nchunks == cap) {
          size_t c = cap ? 2 * cap : 64;
          ckptio_gchunk *q = realloc(p->chunks, c * sizeof(*q));
          if (!q) return -ENOMEM;
          p->chunks = q, cap = c;
        }
        int64_t r1 = r0 + step < rows ? r0 + step : rows;
        p->chunks[p->nchunks++] = (ckptio_gchunk){.unit = i, .row0 = r0, .row1 = r1,
                                                  .bytes = step == rows ? u->bytes : row * (uint64_t)(r1 - r0),
                                                  .first = r0 == 0, .last = r1 == rows};
      }
    }
    /* Batches: consecutive chunks up to the limit (one alone may pass it). */
    size_t n = 0;
    if (!(p->batch[o] = calloc(p->nchunks - first + 1, sizeof(size_t)))) return -ENOMEM;
    uint64_t fill = 0;
    for (size_t c = first; c < p->nchunks; c++) {
      if (c == first || fill + p->chunks[c].bytes > p->chunk) p->batch[o][n++] = c, fill = 0;
      fill += p->chunks[c].bytes;
    }
    p->batch[o][n] = p->nchunks;
    p->nbatches[o] = n;
    if (n > p->rounds) p->rounds = n;
  }
  return 0;
}

void ckptio_gchunk_box(const ckptio_gplan *p, const ckptio_gchunk *c, int64_t *lo, int64_t *hi) {
  const ckptio_gunit *u = &p->units[c->unit];
  memcpy(lo, u->lo, sizeof(u->lo));
  memcpy(hi, u->hi, sizeof(u->hi));
  if (u->e->ndim) lo[0] = u->lo[0] + c->row0, hi[0] = u->lo[0] + c->row1;
}

/* ------------------------------------------------------------ make */

int ckptio_gplan_make(ckptio_reader *r, const ckptio_comm *comm, const ckptio_gbox *mine, size_t n,
                      uint64_t staging, int status, const char *why, ckptio_gplan *p) {
  memset(p, 0, sizeof(*p));
  p->nranks = comm->nranks, p->rank = comm->rank;
  int rc = ckptio_comm_status_exchange(comm, status, why, r->src->path, r->err);
  if (rc < 0) return rc;
  size_t len = sizeof(ghead) + n * sizeof(ckptio_gbox);
  unsigned char *send = malloc(len);
  if (!send) return -ENOMEM;
  uint64_t stored = 0;
  for (size_t i = 0; i < r->src->idx.count; i++) stored += ckptio_reader_entry(r, i)->nbytes;
  ghead h = {fingerprint(r), staging ? staging : DEFAULT_STAGING, boot_id(), 0, 0, (uint64_t)ckptio_cache_fits(stored),
             n};
  struct stat st;
  if (h.boot && stat(r->src->path, &st) == 0) h.dev = (uint64_t)st.st_dev, h.ino = (uint64_t)st.st_ino;
  memcpy(send, &h, sizeof(h));
  if (n) memcpy(send + sizeof(h), mine, n * sizeof(ckptio_gbox));
  uint64_t stride = 0;
  rc = ckptio_comm_gather(comm, send, len, &p->gathered, &p->lens, &stride, r->err);
  free(send);
  if (rc < 0) return rc;
  /* Every rank checks the same gathered bytes: the same verdict everywhere. */
  uint64_t budget = UINT64_MAX, fp0 = 0;
  ghead h0 = {0};
  for (int k = 0; k < comm->nranks; k++) {
    ghead hk;
    if (p->lens[k] < sizeof(hk)) return ckptio_fail(r->err, CKPTIO_E_RANK, "%s: rank %d sent no plan", r->src->path, k);
    memcpy(&hk, p->gathered + (size_t)k * stride, sizeof(hk));
    if (k == 0) fp0 = hk.fingerprint, h0 = hk;
    if (hk.fingerprint != fp0)
      return ckptio_fail(r->err, CKPTIO_E_RANK,
                         "%s: rank %d opened another checkpoint than rank 0 (its tensors, shapes, stored parts or "
                         "CRCs differ): every rank of a group load opens the same one",
                         r->src->path, k);
    budget = hk.staging < budget ? hk.staging : budget;
    if (k == 0) p->shared = hk.ino != 0, p->node = hk.boot != 0 && comm->nranks > 1;
    p->node &= hk.boot == h0.boot;
    p->shared &= hk.boot == h0.boot && hk.dev == h0.dev && hk.ino == h0.ino && hk.fits;
    p->nwants += (size_t)hk.n;
  }
  uint64_t ways = 2 + 2 * (uint64_t)(comm->nranks - 1);
  p->chunk = budget / ways / 4096 * 4096;
  if (p->chunk < MIN_CHUNK) p->chunk = MIN_CHUNK;
  if (!(p->wants = calloc(p->nwants + 1, sizeof(*p->wants)))) return -ENOMEM;
  size_t w = 0;
  for (int k = 0; k < comm->nranks; k++) {
    ghead hk;
    memcpy(&hk, p->gathered + (size_t)k * stride, sizeof(hk));
    const ckptio_gbox *b = (const ckptio_gbox *)(p->gathered + (size_t)k * stride + sizeof(hk));
    for (size_t i = 0; i < hk.n; i++)
      if (b[i].index < r->src->idx.count) p->wants[w++] = (ckptio_gwant){&b[i], k, i};
  }
  p->nwants = w;
  qsort(p->wants, p->nwants, sizeof(*p->wants), want_cmp);
  if ((rc = make_units(r, p)) < 0 || (rc = make_chunks(p)) < 0) {
    if (rc == -ENOMEM) ckptio_fail(r->err, rc, "%s: rank %d: out of memory planning a group load", r->src->path,
                                   comm->rank);
    return rc;
  }
  return 0;
}

void ckptio_gplan_free(ckptio_gplan *p) {
  for (int o = 0; p->batch && o < p->nranks; o++) free(p->batch[o]);
  free(p->batch);
  free(p->nbatches);
  free(p->chunks);
  free(p->units);
  free(p->wants);
  free(p->gathered);
  free(p->lens);
  memset(p, 0, sizeof(*p));
}
