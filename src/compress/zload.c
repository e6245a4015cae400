/* Compressed loads. The seek table (formats/zstd_seekable.c) gives every
 * frame's place in the file and in the plain stream; a load groups the
 * requested byte ranges by frame, and each frame is one pool job with a
 * reused ZSTD_DCtx. Every frame's real size is checked against its entry,
 * and CRCs are taken over the plain (unshuffled) bytes. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "compress/shuffle.h"
#include "compress/zload.h"
#include "core/crc32.h"
#include "formats/safetensors.h"
#include "formats/zstd_seekable.h"
#include "load_share.h"

#define rfail ckptio_reader_fail
#define CHECK_BLOCK (256u << 10) /* unshuffled bytes per step of a check-only CRC */
/* A frame larger than a staging slot (a reader with smaller slots than the
 * writer had) goes through a per-worker buffer of at most this much. */
#define BIG_FRAME_MAX (256u << 20)

typedef struct workspace {
  ZSTD_DCtx *dctx;
  uint8_t *scratch;       /* slot-sized: shuffled frames bound for a GPU */
  uint8_t *block;         /* CHECK_BLOCK bytes */
  uint8_t *big;           /* max_dsize bytes: frames larger than a slot, host only */
} workspace;

struct ckptio_zsrc {
  ckptio_zs_table t;
  int shuffle;
  workspace *ws;
  int nws, free_ws, *stack;
  pthread_mutex_t mu;
  pthread_cond_t cv;
};

/* A requested byte range inside one frame. */
typedef struct zpair {
  size_t req;
  size_t frame;
  uint64_t a, b;          /* plain-stream offsets */
  uint32_t crc;
} zpair;

typedef struct zjob {
  ckptio_reader *r;
  const ckptio_load_request *reqs;
  const uint64_t *from;   /* [req]: the plain offset its dst starts at */
  ckptio_batch *batch;
  zpair *p;               /* this frame's pairs */
  size_t np;
  uint8_t *slot;          /* NULL: decompressed straight into the destination */
  int big;                /* through the worker's big buffer (no GPU pair) */
  int check;
  int unshuffled;         /* the frame buffer was unshuffled in place (GPU pairs) */
} zjob;

/* ------------------------------------------------------------ open */

/* Streams frames from the first, into out, until want bytes arrived. A
 * frame decoded to its end must have its entry's size; bytes beyond want
 * are never produced, so a lying header frame costs no memory. */
static int decode_prefix(ckptio_reader *r, ZSTD_DCtx *d, uint8_t *out, uint64_t want) {
  const ckptio_zs_table *t = &r->z->t;
  uint64_t got = 0;
  for (size_t i = 0; i < t->count && got < want; i++) {
    const ckptio_zs_frame *f = &t->frames[i];
    ZSTD_DCtx_reset(d, ZSTD_reset_session_only);
    ZSTD_inBuffer in = {r->map + f->coff, f->csize, 0};
    uint64_t start = got;
    for (;;) {
      uint64_t room = want - got;
      ZSTD_outBuffer o = {out + got, (size_t)room, 0};
      size_t rc = ZSTD_decompressStream(d, &o, &in);
      got += o.pos;
      if (ZSTD_isError(rc))
        return rfail(r, CKPTIO_E_ZSTD, "%s: zstd frame %zu (header): %s", r->path, i, ZSTD_getErrorName(rc));
      if (got - start > f->dsize)
        return rfail(r, CKPTIO_E_ZSTD, "%s: zstd frame %zu decompresses to more than its %u-byte seek table entry",
                     r->path, i, f->dsize);
      if (rc == 0) {
        if (in.pos != in.size || got - start != f->dsize)
          return rfail(r, CKPTIO_E_ZSTD, "%s: zstd frame %zu holds %llu bytes (%zu of %u compressed bytes used), "
                       "its seek table entry says %u", r->path, i, (unsigned long long)(got - start), in.pos,
                       f->csize, f->dsize);
        break;
      }
      if (got == want) break;
      if (in.pos == in.size)
        return rfail(r, CKPTIO_E_ZSTD, "%s: zstd frame %zu is truncated (its %u compressed bytes end mid-frame)",
                     r->path, i, f->csize);
    }
  }
  if (got < want)
    return rfail(r, CKPTIO_E_ZSTD, "%s: zstd stream ends after %llu bytes, the header needs %llu", r->path,
                 (unsigned long long)got, (unsigned long long)want);
  return 0;
}

int ckptio_zread_open(ckptio_reader *r, uint8_t **header, uint64_t *header_len, uint64_t *plain_size) {
  char msg[CKPTIO_ERRLEN];
  *header = NULL;
  struct ckptio_zsrc *z = calloc(1, sizeof(*z));
  if (!z) return -ENOMEM;
  pthread_mutex_init(&z->mu, NULL);
  pthread_cond_init(&z->cv, NULL);
  r->z = z;
  int rc = ckptio_zs_table_parse(r->map, r->file_size, &z->t, msg, sizeof(msg));
  if (rc < 0) return rfail(r, rc, "%s: %s", r->path, msg);
  z->nws = r->ctx->opts.threads > 0 ? r->ctx->opts.threads : 1;
  z->ws = calloc((size_t)z->nws, sizeof(workspace));
  z->stack = calloc((size_t)z->nws, sizeof(int));
  ZSTD_DCtx *d = ZSTD_createDCtx();
  uint8_t prefix[8] = {0}, *hdr = NULL;
  uint64_t n = 0;
  if (!z->ws || !z->stack || !d) {
    rc = -ENOMEM;
    goto out;
  }
  for (int i = 0; i < z->nws; i++) z->stack[i] = i;
  z->free_ws = z->nws;
  uint64_t plain = z->t.dsize_total;
  if ((rc = decode_prefix(r, d, prefix, plain < 8 ? plain : 8)) < 0) goto out;
  if ((rc = ckptio_st_header_length(prefix, plain, &n, msg, sizeof(msg))) < 0) {
    rfail(r, rc, "%s: decompressed: %s", r->path, msg);
    goto out;
  }
  /* n <= 100,000,000 and 8 + n <= the decompressed size: bounded. */
  if (!(hdr = malloc((size_t)(8 + n)))) {
    rc = -ENOMEM;
    goto out;
  }
  if ((rc = decode_prefix(r, d, hdr, 8 + n)) < 0) goto out;
  memmove(hdr, hdr + 8, (size_t)n);
  *header = hdr;
  *header_len = n;
  *plain_size = plain;
  hdr = NULL;
out:
  free(hdr);
  ZSTD_freeDCtx(d);
  return rc;
}

int ckptio_zread_adopt(ckptio_reader *r) {
  const char *f = ckptio_reader_metadata_get(r, CKPTIO_FILTER_KEY);
  if (!f) return 0;
  if (strcmp(f, CKPTIO_FILTER_SHUFFLE) != 0)
    return rfail(r, CKPTIO_E_FORMAT, "%s: unknown filter '%s' in %s (this build knows '%s')", r->path, f,
                 CKPTIO_FILTER_KEY, CKPTIO_FILTER_SHUFFLE);
  r->z->shuffle = 1;
  return 0;
}

void ckptio_zread_free(struct ckptio_zsrc *z) {
  if (!z) return;
  for (int i = 0; z->ws && i < z->nws; i++) {
    ZSTD_freeDCtx(z->ws[i].dctx);
    free(z->ws[i].scratch);
    free(z->ws[i].block);
    free(z->ws[i].big);
  }
  free(z->ws);
  free(z->stack);
  ckptio_zs_table_free(&z->t);
  pthread_cond_destroy(&z->cv);
  pthread_mutex_destroy(&z->mu);
  free(z);
}

void ckptio_zread_describe(const struct ckptio_zsrc *z, uint64_t *frames, uint64_t *compressed, uint64_t *plain) {
  if (frames) *frames = z ? z->t.count : 0;
  if (compressed) *compressed = z ? z->t.csize_total + z->t.table_bytes : 0;
  if (plain) *plain = z ? z->t.dsize_total : 0;
}

/* ------------------------------------------------------------ load */

static workspace *ws_get(struct ckptio_zsrc *z) {
  pthread_mutex_lock(&z->mu);
  while (!z->free_ws) pthread_cond_wait(&z->cv, &z->mu);
  workspace *w = &z->ws[z->stack[--z->free_ws]];
  pthread_mutex_unlock(&z->mu);
  return w;
}

static void ws_put(struct ckptio_zsrc *z, workspace *w) {
  pthread_mutex_lock(&z->mu);
  z->stack[z->free_ws++] = (int)(w - z->ws);
  pthread_cond_signal(&z->cv);
  pthread_mutex_unlock(&z->mu);
}

static size_t elem_of(const ckptio_entry *e) { return ckptio_shuffle_elem(ckptio_dtype_bits(e->dtype)); }

/* Decompresses frame f into out (exactly its entry's size). */
static int inflate_frame(zjob *j, workspace *w, size_t fi, uint8_t *out, char *msg, size_t len) {
  ckptio_reader *r = j->r;
  const ckptio_zs_frame *f = &r->z->t.frames[fi];
  const uint8_t *src = r->map + f->coff;
#ifdef MADV_POPULATE_READ
  /* Reads the frame's pages in one call; EFAULT means a read would raise
   * SIGBUS (the file shrank under us): a clean error instead. */
  uintptr_t a = (uintptr_t)src & ~(uintptr_t)(CKPTIO_IO_ALIGN - 1);
  if (madvise((void *)a, (size_t)((uintptr_t)src + f->csize - a), MADV_POPULATE_READ) != 0 && errno == EFAULT)
    return ckptio_err_fmt(msg, len, CKPTIO_E_SHORT_IO, "%s: zstd frame %zu (%u bytes at offset %llu): the file "
                          "is shorter than when it was opened", r->path, fi, f->csize, (unsigned long long)f->coff);
#endif
  size_t got = ZSTD_decompressDCtx(w->dctx, out, f->dsize, src, f->csize);
  /* The compressed pages are not needed again: keep RSS to what is loaded. */
  uintptr_t pa = ((uintptr_t)src + CKPTIO_IO_ALIGN - 1) & ~(uintptr_t)(CKPTIO_IO_ALIGN - 1);
  uintptr_t pb = ((uintptr_t)src + f->csize) & ~(uintptr_t)(CKPTIO_IO_ALIGN - 1);
  if (pb > pa) madvise((void *)pa, pb - pa, MADV_DONTNEED);
  if (ZSTD_isError(got))
    return ckptio_err_fmt(msg, len, CKPTIO_E_ZSTD, "%s: zstd frame %zu (%u bytes at offset %llu): %s%s", r->path, fi,
                          f->csize, (unsigned long long)f->coff, ZSTD_getErrorName(got),
                          ZSTD_getErrorCode(got) == ZSTD_error_dstSize_tooSmall
                              ? " (the frame is larger than its seek table entry)" : "");
  if (got != f->dsize)
    return ckptio_err_fmt(msg, len, CKPTIO_E_ZSTD, "%s: zstd frame %zu decompresses to %zu bytes, its seek table "
                          "entry says %u", r->path, fi, got, f->dsize);
  return 0;
}

/* Tensor e's part [*pa, *pb) of frame f: the unit the writer shuffled. */
static void portion(const ckptio_entry *e, const ckptio_zs_frame *f, uint64_t *pa, uint64_t *pb) {
  uint64_t fb = f->doff + f->dsize, eb = e->offset + e->nbytes;
  *pa = f->doff > e->offset ? f->doff : e->offset;
  *pb = fb < eb ? fb : eb;
}

/* One pair's bytes, from frame f decompressed at fbuf (shuffled or not), to
 * wherever its request wants them, with its CRC. A pair may be part of its
 * tensor's portion of the frame (a slice): a shuffled portion is unshuffled
 * element range by element range. */
static int deliver(zjob *j, workspace *w, zpair *p, const ckptio_zs_frame *f, uint8_t *fbuf, char *msg,
                   size_t len) {
  ckptio_reader *r = j->r;
  const ckptio_load_request *q = &j->reqs[p->req];
  const ckptio_entry *e = &r->idx.entries[q->index];
  uint64_t n = p->b - p->a, pa, pb;
  size_t es = elem_of(e);
  portion(e, f, &pa, &pb);
  const uint8_t *part = fbuf + (pa - f->doff);
  uint8_t *src = fbuf + (p->a - f->doff);
  size_t first = (size_t)((p->a - pa) / es), count = (size_t)(n / es);
  int shuffled = r->z->shuffle && !j->unshuffled && ckptio_shuffle_applies(e->offset, pa, pb, es);
  int gpu = q->device == CKPTIO_DEVICE_HOST ? -1 : q->device - CKPTIO_DEVICE_CUDA(0);
  uint8_t *dst = q->dst ? (uint8_t *)q->dst + (p->a - j->from[p->req]) : NULL;
  p->crc = 0;
  if (dst && gpu < 0) {
    if (shuffled) ckptio_unshuffle(dst, part, (size_t)(pb - pa), es, first, count);
    else memcpy(dst, src, (size_t)n);
    if (j->check) p->crc = ckptio_crc32(0, dst, (size_t)n);
    return 0;
  }
  if (shuffled) { /* check only (GPU frames were unshuffled in place): a block at a time */
    if (!w->block && !(w->block = malloc(CHECK_BLOCK))) return -ENOMEM;
    size_t per = CHECK_BLOCK / es;
    for (size_t i = 0; i < count; i += per) {
      size_t c = count - i < per ? count - i : per;
      ckptio_unshuffle(w->block, part, (size_t)(pb - pa), es, first + i, c);
      p->crc = ckptio_crc32(p->crc, w->block, c * es);
    }
    return 0;
  }
  if (j->check) p->crc = ckptio_crc32(0, src, (size_t)n);
  if (gpu < 0) return 0;
  uint64_t t = ckptio_now_ns();
  int rc = ckptio_load_h2d(r, gpu, j->slot, dst, src, n, "", e->name, msg, len);
  ckptio_lap(&r->timers.device_ns, &t);
  return rc;
}

/* A frame in a staging slot bound for a GPU: each tensor portion is
 * unshuffled in place (the slot is what the H2D copy reads; pairs of one
 * portion share its shuffled bytes, so it is done once per portion). */
static int unshuffle_in_place(zjob *j, workspace *w, const ckptio_zs_frame *f, uint8_t *fbuf) {
  ckptio_reader *r = j->r;
  if (!w->scratch && !(w->scratch = malloc(ckptio_ring_slot_bytes(r->ctx->ring)))) return -ENOMEM;
  size_t last = (size_t)-1;
  for (size_t i = 0; i < j->np; i++) {
    size_t ix = j->reqs[j->p[i].req].index;
    if (ix == last) continue;
    last = ix;
    const ckptio_entry *e = &r->idx.entries[ix];
    uint64_t pa, pb;
    size_t es = elem_of(e);
    portion(e, f, &pa, &pb);
    if (!ckptio_shuffle_applies(e->offset, pa, pb, es)) continue;
    ckptio_unshuffle(w->scratch, fbuf + (pa - f->doff), (size_t)(pb - pa), es, 0, (size_t)((pb - pa) / es));
    memcpy(fbuf + (pa - f->doff), w->scratch, (size_t)(pb - pa));
  }
  j->unshuffled = 1;
  return 0;
}

static void zjob_run(void *arg) {
  zjob *j = arg;
  ckptio_reader *r = j->r;
  int rc = 0;
  char msg[CKPTIO_ERRLEN] = "";
  if (!ckptio_batch_failed(j->batch)) {
    workspace *w = ws_get(r->z);
    uint64_t t = ckptio_now_ns(), moved = 0;
    size_t fi = j->p[0].frame;
    const ckptio_zs_frame *f = &r->z->t.frames[fi];
    if (!w->dctx && !(w->dctx = ZSTD_createDCtx())) rc = -ENOMEM;
    if (!rc && !j->slot && !j->big) { /* one pair covering the frame, host, unfiltered */
      const ckptio_load_request *q = &j->reqs[j->p[0].req];
      uint8_t *out = (uint8_t *)q->dst + (j->p[0].a - j->from[j->p[0].req]);
      rc = inflate_frame(j, w, fi, out, msg, sizeof(msg));
      if (!rc && j->check) j->p[0].crc = ckptio_crc32(0, out, f->dsize);
      moved = f->dsize;
    } else if (!rc) {
      uint8_t *buf = j->slot;
      /* Frames on this path are at most BIG_FRAME_MAX: never the table's
       * claim, which may be up to 1 GiB. */
      size_t big = r->z->t.max_dsize < BIG_FRAME_MAX ? r->z->t.max_dsize : BIG_FRAME_MAX;
      if (j->big && !w->big && !(w->big = malloc(big))) rc = -ENOMEM;
      if (j->big) buf = w->big;
      if (!rc) rc = inflate_frame(j, w, fi, buf, msg, sizeof(msg));
      int gpu = 0;
      for (size_t i = 0; i < j->np; i++) gpu |= j->reqs[j->p[i].req].device != CKPTIO_DEVICE_HOST;
      if (!rc && gpu && r->z->shuffle) rc = unshuffle_in_place(j, w, f, buf);
      for (size_t i = 0; i < j->np && !rc; i++) {
        rc = deliver(j, w, &j->p[i], f, buf, msg, sizeof(msg));
        moved += j->p[i].b - j->p[i].a;
      }
    }
    ckptio_lap(&r->timers.copy_ns, &t);
    ws_put(r->z, w);
    if (rc == -ENOMEM && !msg[0]) snprintf(msg, sizeof(msg), "%s: out of memory decompressing frame %zu", r->path, fi);
    if (!rc) atomic_fetch_add(&r->done_bytes, moved);
  }
  if (j->slot) ckptio_ring_release(r->ctx->ring, j->slot);
  ckptio_batch_done(j->batch, rc, msg);
}

static int cmp_pair(const void *x, const void *y) {
  const zpair *a = x, *b = y;
  if (a->frame != b->frame) return a->frame < b->frame ? -1 : 1;
  if (a->a != b->a) return a->a < b->a ? -1 : 1;
  return a->req < b->req ? -1 : a->req > b->req;
}

/* Loads plain bytes [from[i], to[i]) of tensor reqs[i].index into
 * reqs[i].dst; every range lies inside its tensor. With check (whole
 * tensors only) the recorded CRCs are compared. */
static int zread(ckptio_reader *r, const ckptio_load_request *reqs, const uint64_t *from, const uint64_t *to,
                 size_t n, int check) {
  const ckptio_zs_table *t = &r->z->t;
  size_t slot_bytes = ckptio_ring_slot_bytes(r->ctx->ring), np = 0, nj = 0;
  uint64_t bytes = 0;
  for (size_t i = 0; i < n; i++) {
    bytes += to[i] - from[i];
    if (to[i] > from[i]) np += ckptio_zs_find(t, to[i] - 1) - ckptio_zs_find(t, from[i]) + 1;
  }
  zpair *pairs = calloc(np + 1, sizeof(zpair));
  zjob *jobs = calloc(np + 1, sizeof(zjob));
  uint32_t *crc = calloc(n + 1, sizeof(uint32_t));
  int rc = 0;
  if (!pairs || !jobs || !crc) {
    rc = -ENOMEM;
    goto out;
  }
  np = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t end = to[i];
    for (size_t f = ckptio_zs_find(t, from[i]); end > from[i] && f < t->count && t->frames[f].doff < end; f++) {
      uint64_t fa = t->frames[f].doff, fb = fa + t->frames[f].dsize;
      pairs[np++] = (zpair){i, f, fa > from[i] ? fa : from[i], fb < end ? fb : end, 0};
    }
  }
  qsort(pairs, np, sizeof(zpair), cmp_pair);
  atomic_store(&r->done_bytes, 0);
  atomic_store(&r->total_bytes, bytes);
  memset(&r->timers, 0, sizeof(r->timers));
  r->timers.start_ns = ckptio_now_ns();
  ckptio_batch batch;
  ckptio_batch_init(&batch);
  for (size_t i = 0; i < np && !ckptio_batch_failed(&batch); nj++) {
    size_t k = i;
    while (k < np && pairs[k].frame == pairs[i].frame) k++;
    zjob *j = &jobs[nj];
    *j = (zjob){r, reqs, from, &batch, &pairs[i], k - i, NULL, 0, check, 0};
    const ckptio_zs_frame *f = &t->frames[pairs[i].frame];
    const ckptio_load_request *q = &reqs[pairs[i].req];
    const ckptio_entry *e = &r->idx.entries[q->index];
    uint64_t pa, pb;
    portion(e, f, &pa, &pb);
    int direct = k - i == 1 && pairs[i].a == f->doff && pairs[i].b == f->doff + f->dsize && q->dst &&
                 q->device == CKPTIO_DEVICE_HOST &&
                 !(r->z->shuffle && ckptio_shuffle_applies(e->offset, pa, pb, elem_of(e)));
    int gpu = 0;
    for (size_t x = i; x < k; x++) gpu |= reqs[pairs[x].req].device != CKPTIO_DEVICE_HOST;
    i = k;
    if (!direct && f->dsize > slot_bytes && (gpu || f->dsize > BIG_FRAME_MAX)) {
      char msg[CKPTIO_ERRLEN];
      snprintf(msg, sizeof(msg), "%s: zstd frame %zu holds %u bytes, more than a staging slot (%zu)%s: "
               "load it with a larger chunk_bytes", r->path, j->p[0].frame, f->dsize, slot_bytes,
               gpu ? " for a GPU load" : " and the 256 MiB limit");
      ckptio_batch_fail(&batch, CKPTIO_E_ZSTD, msg);
      break;
    }
    j->big = !direct && f->dsize > slot_bytes;
    if (!direct && !j->big) j->slot = ckptio_ring_acquire(r->ctx->ring);
    ckptio_batch_add(&batch, 1);
    if ((rc = ckptio_pool_add(r->ctx->pool, zjob_run, j)) < 0) {
      if (j->slot) ckptio_ring_release(r->ctx->ring, j->slot);
      ckptio_batch_done(&batch, rc, "cannot queue a frame: out of memory");
    }
  }
  rc = ckptio_batch_wait(&batch);
  if (rc < 0) snprintf(r->err, sizeof(r->err), "%s", batch.err);
  ckptio_batch_destroy(&batch);
  r->timers.end_ns = ckptio_now_ns();
  if (rc < 0 || !check) goto out;
  for (size_t i = 0; i < np; i++) crc[pairs[i].req] = ckptio_crc32_combine(crc[pairs[i].req], pairs[i].crc,
                                                                           pairs[i].b - pairs[i].a);
  for (size_t i = 0; i < n; i++) {
    const ckptio_entry *e = &r->idx.entries[reqs[i].index];
    if (e->has_crc && crc[i] != e->crc) {
      rc = rfail(r, CKPTIO_E_CHECKSUM, "%s: tensor '%s': checksum mismatch (recorded %08x, data %08x)", r->path,
                 e->name, e->crc, crc[i]);
      goto out;
    }
  }
out:
  free(pairs);
  free(jobs);
  free(crc);
  return rc;
}

int ckptio_zread_run(ckptio_reader *r, const ckptio_load_request *reqs, size_t n, int check) {
  uint64_t *from = calloc(2 * n + 1, sizeof(uint64_t));
  if (!from) return -ENOMEM;
  uint64_t *to = from + n;
  for (size_t i = 0; i < n; i++) {
    const ckptio_entry *e = &r->idx.entries[reqs[i].index];
    from[i] = e->offset;
    to[i] = e->offset + e->nbytes;
  }
  int rc = zread(r, reqs, from, to, n, check);
  free(from);
  return rc;
}

int ckptio_zread_ranges(ckptio_reader *r, const ckptio_load_request *reqs, const uint64_t *from, const uint64_t *to,
                        size_t n) {
  return zread(r, reqs, from, to, n, 0);
}

uint64_t ckptio_zread_frame_bytes(const ckptio_reader *r, const uint64_t *from, const uint64_t *to, size_t n) {
  const ckptio_zs_table *t = &r->z->t;
  uint64_t sum = 0;
  size_t last = (size_t)-1;
  for (size_t i = 0; i < n; i++)
    for (size_t f = ckptio_zs_find(t, from[i]); to[i] > from[i] && f < t->count && t->frames[f].doff < to[i]; f++)
      if (f != last) sum += t->frames[f].dsize, last = f;
  return sum;
}

void ckptio_zread_frames_of(const ckptio_reader *r, uint64_t a, uint64_t b, size_t *last,
                            void (*emit)(void *arg, uint64_t off, uint64_t len), void *arg) {
  const ckptio_zs_table *t = &r->z->t;
  for (size_t f = ckptio_zs_find(t, a); b > a && f < t->count && t->frames[f].doff < b; f++)
    if (f != *last) {
      emit(arg, t->frames[f].coff, t->frames[f].csize);
      *last = f;
    }
}
