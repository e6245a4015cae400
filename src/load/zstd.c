/* The zstd seekable source: a safetensors file compressed in independent
 * frames (formats/zstd_seekable.c has the seek table). Opening decompresses
 * only the header frame(s); a load groups the requested plain byte ranges
 * by frame, and each frame is one job with a reused ZSTD_DCtx, decompressed
 * straight into a host destination when it lies inside one tensor, else
 * through a staging slot (pinned: GPU copies go from it). Every frame's real
 * size is checked against its entry; CRCs cover the plain, unshuffled bytes.
 * An object of a storage has no map: its seek table and header frames are
 * read into an image for the parse (load/image.h), each frame by one ranged
 * read into its worker's buffer. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "compress/shuffle.h"
#include "core/crc32.h"
#include "core/lender.h"
#include "formats/safetensors.h"
#include "formats/zstd_seekable.h"
#include "load/exec.h"
#include "load/image.h"

#define CHECK_BLOCK (256u << 10) /* unshuffled bytes per step of a check-only CRC */
/* A frame larger than a staging slot (a reader with smaller slots than the
 * writer had) goes through a per-worker buffer of at most this much. */
#define BIG_FRAME_MAX (256u << 20)

typedef struct workspace {
  ZSTD_DCtx *dctx;
  uint8_t *scratch;       /* slot-sized: shuffled frames bound for a GPU */
  uint8_t *block;         /* CHECK_BLOCK bytes */
  uint8_t *big;           /* frames larger than a slot, host only */
  uint8_t *comp;          /* an object's compressed frame, read here */
  size_t comp_cap;
} workspace;

typedef struct zsrc {
  ckptio_source s;
  ckptio_rfile f;
  ckptio_zs_table t;
  int shuffle;
  workspace *ws;
  int nws;
  ckptio_lender lend; /* of ws */
} zsrc;

#define Z(src) ((zsrc *)(src))

/* ------------------------------------------------------------ open */

/* Streams frames from the first, into out, until want bytes arrived. A
 * frame decoded to its end must have its entry's size; bytes beyond want
 * are never produced, so a lying header frame costs no memory. */
static int decode_prefix(zsrc *z, const uint8_t *file, ZSTD_DCtx *d, uint8_t *out, uint64_t want) {
  const ckptio_zs_table *t = &z->t;
  const char *path = z->s.path;
  uint64_t got = 0;
  for (size_t i = 0; i < t->count && got < want; i++) {
    const ckptio_zs_frame *f = &t->frames[i];
    ZSTD_DCtx_reset(d, ZSTD_reset_session_only);
    ZSTD_inBuffer in = {file + f->coff, f->csize, 0};
    uint64_t start = got;
    for (;;) {
      ZSTD_outBuffer o = {out + got, (size_t)(want - got), 0};
      size_t rc = ZSTD_decompressStream(d, &o, &in);
      got += o.pos;
      if (ZSTD_isError(rc))
        return ckptio_fail(z->s.err, CKPTIO_E_ZSTD, "%s: zstd frame %zu (header): %s", path, i, ZSTD_getErrorName(rc));
      if (got - start > f->dsize)
        return ckptio_fail(z->s.err, CKPTIO_E_ZSTD,
                           "%s: zstd frame %zu decompresses to more than its %u-byte seek table entry", path, i,
                           f->dsize);
      if (rc == 0) {
        if (in.pos != in.size || got - start != f->dsize)
          return ckptio_fail(z->s.err, CKPTIO_E_ZSTD,
                             "%s: zstd frame %zu holds %llu bytes (%zu of %u compressed bytes used), its "
                             "seek table entry says %u",
                             path, i, (unsigned long long)(got - start), in.pos, f->csize, f->dsize);
        break;
      }
      if (got == want) break;
      if (in.pos == in.size)
        return ckptio_fail(z->s.err, CKPTIO_E_ZSTD,
                           "%s: zstd frame %zu is truncated (its %u compressed bytes end mid-frame)", path, i,
                           f->csize);
    }
  }
  if (got < want)
    return ckptio_fail(z->s.err, CKPTIO_E_ZSTD, "%s: zstd stream ends after %llu bytes, the header needs %llu", path,
                       (unsigned long long)got, (unsigned long long)want);
  return 0;
}

/* An object's image (load/image.h) holds what the parse reads: the tail
 * with the seek table (a second read when the table is larger), then the
 * frames that hold the header, in one read. */
#define HEAD (64u << 10)
#define TAIL (256u << 10)

static int fetch_table(zsrc *z, ckptio_image *im) {
  if (im->size < CKPTIO_ZS_FOOTER) return 0; /* the parse says why */
  const uint8_t *foot = im->base + im->size - CKPTIO_ZS_FOOTER;
  uint64_t n = (uint64_t)foot[0] | (uint64_t)foot[1] << 8 | (uint64_t)foot[2] << 16 | (uint64_t)foot[3] << 24;
  uint64_t table = n * (foot[4] & 0x80 ? 12 : 8) + CKPTIO_ZS_FOOTER + 8;
  ckptio_span sp = {table < im->size ? im->size - table : 0, table < im->size ? table : im->size};
  return n <= CKPTIO_ZS_MAX_FRAMES ? ckptio_image_fetch(im, &sp, 1, 0, UINT64_MAX, z->s.err) : 0;
}

/* The frames holding plain bytes [0, want), fetched into the image. */
static int fetch_prefix(zsrc *z, ckptio_image *im, uint64_t want) {
  if (!im->base || !z->t.count) return 0;
  size_t last = ckptio_zs_find(&z->t, want ? want - 1 : 0);
  const ckptio_zs_frame *f = &z->t.frames[last < z->t.count ? last : z->t.count - 1];
  ckptio_span sp = {0, f->coff + f->csize};
  return ckptio_image_fetch(im, &sp, 1, 0, UINT64_MAX, z->s.err);
}

/* The seek table, then the safetensors header decompressed and parsed as
 * the plain file's, with offsets in the decompressed stream. */
static int parse(zsrc *z, ckptio_image *im) {
  char msg[CKPTIO_ERRLEN];
  const char *path = z->s.path;
  const uint8_t *file = z->f.store ? im->base : z->f.map;
  int rc = z->f.store ? fetch_table(z, im) : 0;
  if (rc < 0) return rc;
  rc = ckptio_zs_table_parse(file, z->f.size, &z->t, msg, sizeof(msg));
  if (rc < 0) return ckptio_fail(z->s.err, rc, "%s: %s", path, msg);
  z->nws = ckptio_codec_jobs(z->s.ctx);
  z->ws = calloc((size_t)z->nws, sizeof(workspace));
  ZSTD_DCtx *d = ZSTD_createDCtx();
  uint8_t prefix[8] = {0}, *hdr = NULL;
  uint64_t n = 0, plain = z->t.dsize_total;
  ckptio_st_index st;
  memset(&st, 0, sizeof(st));
  if (!z->ws || !d || ckptio_lender_init(&z->lend, z->nws) < 0) {
    rc = -ENOMEM;
    goto out;
  }
  if (z->f.store && (rc = fetch_prefix(z, im, plain < 8 ? plain : 8)) < 0) goto out;
  if ((rc = decode_prefix(z, file, d, prefix, plain < 8 ? plain : 8)) < 0) goto out;
  if ((rc = ckptio_st_header_length(prefix, plain, &n, msg, sizeof(msg))) < 0) {
    ckptio_fail(z->s.err, rc, "%s: decompressed: %s", path, msg);
    goto out;
  }
  /* n <= 100,000,000 and 8 + n <= the decompressed size: bounded. */
  if (!(hdr = malloc((size_t)(8 + n)))) {
    rc = -ENOMEM;
    goto out;
  }
  if (z->f.store && (rc = fetch_prefix(z, im, 8 + n)) < 0) goto out;
  if ((rc = decode_prefix(z, file, d, hdr, 8 + n)) < 0) goto out;
  if ((rc = ckptio_st_parse(hdr + 8, n, plain, &st, msg, sizeof(msg))) < 0) {
    ckptio_fail(z->s.err, rc, "%s: decompressed: %s", path, msg);
    goto out;
  }
  if ((rc = ckptio_st_to_index(&st, &z->s.idx)) < 0) goto out;
  for (size_t i = 0; i < z->s.idx.meta_count; i++) {
    const ckptio_meta *m = &z->s.idx.meta[i];
    if (strcmp(m->key, CKPTIO_FILTER_KEY)) continue;
    if (strcmp(m->value, CKPTIO_FILTER_SHUFFLE) != 0) {
      rc = ckptio_fail(z->s.err, CKPTIO_E_FORMAT, "%s: unknown filter '%s' in %s (this build knows '%s')", path,
                       m->value, CKPTIO_FILTER_KEY, CKPTIO_FILTER_SHUFFLE);
      goto out;
    }
    z->shuffle = 1;
  }
out:
  ckptio_st_index_free(&st);
  free(hdr);
  ZSTD_freeDCtx(d);
  return rc;
}

/* ------------------------------------------------------------ plan */

/* The plain-stream offset of output byte off of request q. */
static uint64_t plain_at(const ckptio_xreq *q, uint64_t off) {
  uint64_t src, n;
  ckptio_geom_subrun(&q->g, off, off + 1, &src, &n);
  return q->e->offset + src;
}

static size_t elem_of(const ckptio_entry *e) { return ckptio_shuffle_elem(ckptio_dtype_bits(e->dtype)); }

/* Tensor e's part [*pa, *pb) of frame f: the unit the writer shuffled. */
static void portion(const ckptio_entry *e, const ckptio_zs_frame *f, uint64_t *pa, uint64_t *pb) {
  uint64_t fb = f->doff + f->dsize, eb = e->offset + e->nbytes;
  *pa = f->doff > e->offset ? f->doff : e->offset;
  *pb = fb < eb ? fb : eb;
}

typedef struct zpair {
  ckptio_xreq *q;
  size_t frame;
  uint64_t off, len;      /* output bytes of q */
} zpair;

static int cmp_pair(const void *x, const void *y) {
  const zpair *a = x, *b = y;
  if (a->frame != b->frame) return a->frame < b->frame ? -1 : 1;
  uint64_t pa = plain_at(a->q, a->off), pb = plain_at(b->q, b->off);
  if (pa != pb) return pa < pb ? -1 : 1;
  return a->q < b->q ? -1 : a->q > b->q;
}

/* Every run of every request becomes the pairs (run part, frame) of the
 * frames holding it; the pairs of one frame make one job. */
static int zstd_plan(ckptio_source *s, ckptio_plan *pl, ckptio_xreq **qs, size_t n) {
  zsrc *z = Z(s);
  const ckptio_zs_table *t = &z->t;
  size_t slot_bytes = ckptio_source_slot_bytes(s), np = 0;
  for (size_t i = 0; i < n; i++)
    for (uint64_t k = 0; k < qs[i]->g.count; k++) {
      uint64_t a = plain_at(qs[i], k * qs[i]->g.run);
      np += ckptio_zs_find(t, a + qs[i]->g.run - 1) - ckptio_zs_find(t, a) + 1;
    }
  zpair *pairs = calloc(np + 1, sizeof(zpair));
  if (!pairs) return -ENOMEM;
  np = 0;
  for (size_t i = 0; i < n; i++) {
    ckptio_xreq *q = qs[i];
    uint64_t frame_bytes = 0;
    size_t last = (size_t)-1;
    for (uint64_t k = 0; k < q->g.count && q->g.run; k++) {
      uint64_t a = plain_at(q, k * q->g.run), end = a + q->g.run;
      for (size_t f = ckptio_zs_find(t, a); f < t->count && t->frames[f].doff < end; f++) {
        uint64_t fa = t->frames[f].doff, fb = fa + t->frames[f].dsize, pa = fa > a ? fa : a, pb = fb < end ? fb : end;
        pairs[np++] = (zpair){q, f, k * q->g.run + (pa - a), pb - pa};
        if (f != last) frame_bytes += t->frames[f].dsize, last = f;
      }
    }
    /* What a partial load decompresses; a whole tensor counts its bytes. */
    atomic_store(&q->read, q->g.full ? q->e->nbytes : frame_bytes);
  }
  qsort(pairs, np, sizeof(zpair), cmp_pair);
  int rc = 0;
  for (size_t i = 0; i < np && rc == 0;) {
    size_t k = i;
    while (k < np && pairs[k].frame == pairs[i].frame) k++;
    const ckptio_zs_frame *f = &t->frames[pairs[i].frame];
    const ckptio_xreq *q = pairs[i].q;
    uint64_t pa, pb;
    portion(q->e, f, &pa, &pb);
    int gpu = 0;
    for (size_t x = i; x < k; x++) gpu |= pairs[x].q->gpu >= 0 || pairs[x].q->dpitch; /* both go through a slot */
    int direct = k - i == 1 && pairs[i].len == f->dsize && plain_at(q, pairs[i].off) == f->doff &&
                 ckptio_xreq_host(q) && !(z->shuffle && ckptio_shuffle_applies(q->e->offset, pa, pb, elem_of(q->e)));
    if (!direct && f->dsize > slot_bytes && (gpu || f->dsize > BIG_FRAME_MAX)) {
      rc = ckptio_fail(s->err, CKPTIO_E_ZSTD,
                       "%s: zstd frame %zu holds %u bytes, more than a staging slot (%zu)%s: load it with a "
                       "larger chunk_bytes",
                       s->path, pairs[i].frame, f->dsize, slot_bytes,
                       gpu ? " for a GPU load" : " and the 256 MiB limit");
      break;
    }
    ckptio_job *j = ckptio_plan_job(pl, s, k - i);
    if (!j) {
      rc = -ENOMEM;
      break;
    }
    j->aux = pairs[i].frame;
    j->method = direct ? CKPTIO_LOAD_PREAD : f->dsize > slot_bytes ? CKPTIO_LOAD_MMAP : CKPTIO_LOAD_DIRECT;
    j->need_slot = !direct && f->dsize <= slot_bytes;
    for (size_t x = i; x < k; x++)
      pl->parts[j->first + (x - i)] = (ckptio_part){pairs[x].q, pairs[x].off, pairs[x].len, 0};
    i = k;
  }
  free(pairs);
  return rc;
}

/* ------------------------------------------------------------ run */

static workspace *ws_get(zsrc *z) { return &z->ws[ckptio_lender_borrow(&z->lend)]; }

static void ws_put(zsrc *z, workspace *w) { ckptio_lender_return(&z->lend, (int)(w - z->ws)); }

/* Decompresses frame fi into out (exactly its entry's size). */
static int inflate_frame(zsrc *z, workspace *w, size_t fi, uint8_t *out, char *msg, size_t len) {
  const ckptio_zs_frame *f = &z->t.frames[fi];
  const uint8_t *src = z->f.map + f->coff;
  if (z->f.store) { /* an object: one read of the frame into the worker's buffer */
    if (w->comp_cap < f->csize) {
      free(w->comp);
      w->comp_cap = 0;
      if (!(w->comp = malloc(f->csize))) return -ENOMEM;
      w->comp_cap = f->csize;
    }
    int rc = ckptio_rfile_pread(&z->f, w->comp, f->csize, f->coff, msg, len);
    if (rc < 0) return rc;
    src = w->comp;
  } else if (ckptio_rfile_populate(src, f->csize) < 0)
    return ckptio_err_fmt(msg, len, CKPTIO_E_SHORT_IO,
                          "%s: zstd frame %zu (%u bytes at offset %llu): the file is shorter than when it was opened",
                          z->s.path, fi, f->csize, (unsigned long long)f->coff);
  size_t got = ZSTD_decompressDCtx(w->dctx, out, f->dsize, src, f->csize);
  if (!z->f.store) ckptio_rfile_drop(src, f->csize); /* not needed again: keep RSS to what is loaded */
  if (ZSTD_isError(got))
    return ckptio_err_fmt(msg, len, CKPTIO_E_ZSTD, "%s: zstd frame %zu (%u bytes at offset %llu): %s%s", z->s.path,
                          fi, f->csize, (unsigned long long)f->coff, ZSTD_getErrorName(got),
                          ZSTD_getErrorCode(got) == ZSTD_error_dstSize_tooSmall
                              ? " (the frame is larger than its seek table entry)"
                              : "");
  if (got != f->dsize)
    return ckptio_err_fmt(msg, len, CKPTIO_E_ZSTD, "%s: zstd frame %zu decompresses to %zu bytes, its seek table "
                          "entry says %u", z->s.path, fi, got, f->dsize);
  return 0;
}

/* One part's bytes, from the frame decompressed at fbuf (shuffled, or
 * unshuffled in place for a GPU), to its destination, with its CRC. A part
 * may be a piece of its tensor's portion of the frame (a slice): a shuffled
 * portion is unshuffled element range by element range. */
static int deliver(zsrc *z, ckptio_run *x, workspace *w, size_t k, const ckptio_zs_frame *f, uint8_t *fbuf,
                   int unshuffled) {
  ckptio_part *p = ckptio_run_part(x, k);
  const ckptio_xreq *q = p->q;
  const ckptio_entry *e = q->e;
  uint64_t a = plain_at(q, p->off), pa, pb;
  size_t es = elem_of(e);
  portion(e, f, &pa, &pb);
  const uint8_t *part = fbuf + (pa - f->doff);
  uint8_t *src = fbuf + (a - f->doff);
  size_t first = (size_t)((a - pa) / es), count = (size_t)(p->len / es);
  int shuffled = z->shuffle && !unshuffled && ckptio_shuffle_applies(e->offset, pa, pb, es);
  if (ckptio_xreq_host(q)) {
    uint8_t *dst = ckptio_xreq_host(q) + p->off;
    if (shuffled) ckptio_unshuffle(dst, part, (size_t)(pb - pa), es, first, count);
    else memcpy(dst, src, (size_t)p->len);
    if (q->check) p->crc = ckptio_crc32(0, dst, (size_t)p->len);
    return ckptio_run_deliver(x, k, dst, 1);
  }
  if (shuffled) { /* check only: a block at a time */
    if (!w->block && !(w->block = malloc(CHECK_BLOCK))) return -ENOMEM;
    size_t per = CHECK_BLOCK / es;
    for (size_t i = 0; i < count; i += per) {
      size_t c = count - i < per ? count - i : per;
      ckptio_unshuffle(w->block, part, (size_t)(pb - pa), es, first + i, c);
      p->crc = ckptio_crc32(p->crc, w->block, c * es);
    }
    return ckptio_run_deliver(x, k, NULL, 0);
  }
  if (q->check) p->crc = ckptio_crc32(0, src, (size_t)p->len);
  return ckptio_run_deliver(x, k, src, 1);
}

/* A frame in a slot bound for a GPU: each tensor portion is unshuffled in
 * place (the slot is what the copy reads), once per portion. */
static int unshuffle_in_place(ckptio_run *x, workspace *w, const ckptio_zs_frame *f, uint8_t *fbuf) {
  if (!w->scratch && !(w->scratch = malloc(ckptio_run_slot_bytes(x)))) return -ENOMEM;
  const ckptio_entry *last = NULL;
  for (size_t i = 0; i < ckptio_run_job(x)->nparts; i++) {
    const ckptio_entry *e = ckptio_run_part(x, i)->q->e;
    if (e == last) continue;
    last = e;
    uint64_t pa, pb;
    size_t es = elem_of(e);
    portion(e, f, &pa, &pb);
    if (!ckptio_shuffle_applies(e->offset, pa, pb, es)) continue;
    ckptio_unshuffle(w->scratch, fbuf + (pa - f->doff), (size_t)(pb - pa), es, 0, (size_t)((pb - pa) / es));
    memcpy(fbuf + (pa - f->doff), w->scratch, (size_t)(pb - pa));
  }
  return 0;
}

static int zstd_run(ckptio_source *s, ckptio_run *x) {
  zsrc *z = Z(s);
  ckptio_job *j = ckptio_run_job(x);
  size_t fi = (size_t)j->aux, mlen;
  char *msg = ckptio_run_msg(x, &mlen);
  const ckptio_zs_frame *f = &z->t.frames[fi];
  workspace *w = ws_get(z);
  int rc = 0;
  if (!w->dctx && !(w->dctx = ZSTD_createDCtx())) rc = -ENOMEM;
  if (!rc && j->method == CKPTIO_LOAD_PREAD) { /* one part covering the frame, host, unfiltered */
    ckptio_part *p = ckptio_run_part(x, 0);
    uint8_t *out = p->q->dst + p->off;
    rc = inflate_frame(z, w, fi, out, msg, mlen);
    if (!rc && p->q->check) p->crc = ckptio_crc32(0, out, f->dsize);
    if (!rc) rc = ckptio_run_deliver(x, 0, out, 1);
  } else if (!rc) {
    /* Big frames are at most BIG_FRAME_MAX, never the table's claim. */
    size_t big = z->t.max_dsize < BIG_FRAME_MAX ? z->t.max_dsize : BIG_FRAME_MAX;
    if (j->method == CKPTIO_LOAD_MMAP && !w->big && !(w->big = malloc(big))) rc = -ENOMEM;
    uint8_t *buf = j->method == CKPTIO_LOAD_MMAP ? w->big : j->slot;
    if (!rc) rc = inflate_frame(z, w, fi, buf, msg, mlen);
    int gpu = 0;
    for (size_t i = 0; i < j->nparts; i++) gpu |= ckptio_run_part(x, i)->q->gpu >= 0 || ckptio_run_part(x, i)->q->dpitch;
    int unshuffled = !rc && gpu && z->shuffle;
    if (unshuffled) rc = unshuffle_in_place(x, w, f, buf);
    for (size_t i = 0; i < j->nparts && !rc; i++) rc = deliver(z, x, w, i, f, buf, unshuffled);
  }
  ws_put(z, w);
  if (rc == -ENOMEM && !msg[0]) snprintf(msg, mlen, "%s: out of memory decompressing frame %zu", s->path, fi);
  return rc;
}

/* ------------------------------------------------------------ the rest */

static int zstd_view(ckptio_source *s, size_t index, const void **data, uint64_t *nbytes) {
  (void)data, (void)nbytes;
  return ckptio_fail(s->err, CKPTIO_E_FORMAT, "%s: tensor '%s': a compressed file has no plain bytes to view: load it",
                     s->path, s->idx.entries[index].name);
}

/* The frames holding the runs (a frame is read whole), each once. */
static void zstd_ranges(ckptio_source *s, size_t index, const ckptio_geom *g,
                        void (*emit)(void *arg, uint32_t file, uint64_t off, uint64_t len), void *arg) {
  const ckptio_zs_table *t = &Z(s)->t;
  const ckptio_entry *e = &s->idx.entries[index];
  size_t last = (size_t)-1;
  for (uint64_t k = 0; k < g->count; k++) {
    uint64_t a = e->offset + g->src0 + k * g->pitch, b = a + g->run;
    for (size_t f = ckptio_zs_find(t, a); b > a && f < t->count && t->frames[f].doff < b; f++)
      if (f != last) emit(arg, 0, t->frames[f].coff, t->frames[f].csize), last = f;
  }
}

static void zstd_close(ckptio_source *s) {
  zsrc *z = Z(s);
  for (int i = 0; z->ws && i < z->nws; i++) {
    ZSTD_freeDCtx(z->ws[i].dctx);
    free(z->ws[i].scratch);
    free(z->ws[i].block);
    free(z->ws[i].big);
    free(z->ws[i].comp);
  }
  free(z->ws);
  ckptio_lender_fini(&z->lend);
  ckptio_zs_table_free(&z->t);
  ckptio_rfile_close(&z->f);
  ckptio_index_free(&s->idx);
}

static double zstd_resident(ckptio_source *s) {
  const ckptio_rfile *f = &((zsrc *)s)->f;
  uint64_t off = 0, len = f->size;
  return ckptio_rfile_resident(f, &off, &len, 1);
}

static void zstd_compression(ckptio_source *s, uint64_t *frames, uint64_t *stored, uint64_t *plain) {
  const ckptio_zs_table *t = &((zsrc *)s)->t;
  *frames = t->count;
  *stored = t->csize_total + t->table_bytes;
  *plain = t->dsize_total;
}

static const ckptio_source_ops zstd_ops = {
    .noun = "compressed file",
    .plan = zstd_plan,
    .run = zstd_run,
    .view = zstd_view,
    .ranges = zstd_ranges,
    .member = ckptio_source_member_self,
    .file = ckptio_source_file_self,
    .resident = zstd_resident,
    .compression = zstd_compression,
    .close = zstd_close,
};

int ckptio_zstd_from(ckptio_ctx *ctx, const ckptio_options *opts, ckptio_rfile *f, char *err, ckptio_source **out) {
  zsrc *z = calloc(1, sizeof(*z));
  if (!z) {
    ckptio_rfile_close(f);
    return -ENOMEM;
  }
  z->f = *f;
  int rc = ckptio_source_init(&z->s, &zstd_ops, ctx, opts, f->path, err);
  ckptio_image im;
  memset(&im, 0, sizeof(im));
  if (rc == 0 && z->f.store) rc = ckptio_image_open(&im, &z->f, ctx->pool, HEAD, TAIL, err);
  if (rc == 0) rc = parse(z, &im);
  ckptio_image_close(&im);
  if (rc < 0) {
    ckptio_source_close(&z->s);
    return rc;
  }
  *out = &z->s;
  return 0;
}
