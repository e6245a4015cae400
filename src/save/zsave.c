/* Compressed saves: frame planning, parallel compression with one reused
 * ZSTD_CCtx per worker, and in-order placement of frames whose compressed
 * sizes are only known once compressed. A frame is written by the worker
 * that completes the run of known sizes in front of it, so no worker ever
 * waits for another; the coordinator waits only for a free compressed
 * buffer, which bounds memory to `buffers` frames. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "ckptio.h"
#include "compress/shuffle.h"
#include "core/error.h"
#include "core/lender.h"
#include "formats/zstd_seekable.h"
#include "io/file.h"
#include "save/zsave.h"

typedef struct workspace {
  ZSTD_CCtx *cctx;
  uint8_t *scratch;       /* shuffled frame; allocated on first use */
} workspace;

struct ckptio_zsave {
  ckptio_zsave_params p;
  ckptio_zsave_tensor *tensors;
  uint64_t nframes, *start;   /* start[nframes] == plain file size */
  uint32_t *csize, *dsize;
  uint64_t *coff;
  uint8_t *ready, *written;
  uint8_t *header_frame;      /* frame 0, RAW blocks */
  uint8_t **cbuf;             /* data frame c uses cbuf[(c - 1) % buffers] */
  size_t cbuf_bytes;
  workspace *ws;
  int nws;
  ckptio_lender lend;         /* of ws */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t next;              /* first frame whose file offset is unknown */
  uint64_t end;               /* file offset after frame next - 1 */
  int rc;
};

static int add_bound(ckptio_zsave *z, uint64_t *cap, uint64_t pos) {
  if (z->nframes + 1 >= *cap) {
    uint64_t ncap = *cap * 2;
    uint64_t *n = realloc(z->start, ncap * sizeof(uint64_t));
    if (!n) return -ENOMEM;
    z->start = n;
    *cap = ncap;
  }
  z->start[++z->nframes] = pos;
  return 0;
}

/* The last tensor end in (lo, hi], or 0. */
static uint64_t last_end_in(const ckptio_zsave *z, uint64_t lo, uint64_t hi) {
  size_t a = 0, b = z->p.count;
  while (a < b) { /* first tensor ending after hi */
    size_t mid = a + (b - a) / 2;
    if (z->tensors[mid].offset + z->tensors[mid].nbytes <= hi) a = mid + 1;
    else b = mid;
  }
  for (; a > 0; a--) {
    uint64_t e = z->tensors[a - 1].offset + z->tensors[a - 1].nbytes;
    if (e <= lo) break;
    if (e <= hi) return e;
  }
  return 0;
}

/* Frame 0 is the header; data frames are at most max_frame and end at the
 * last tensor end they contain, if any. So a tensor that does not end in a
 * frame starts a frame of its own, and all its frames but its tail lie
 * inside it (they decompress straight into the destination); small tensors
 * share frames. A frame can only come out shorter than a quarter of
 * max_frame right before a tensor of at least three quarters: at most one
 * short frame per large tensor, a negligible cost in ratio. */
static int plan(ckptio_zsave *z) {
  uint64_t cap = 64, F = z->p.max_frame;
  if (!(z->start = malloc(cap * sizeof(uint64_t)))) return -ENOMEM;
  z->start[0] = 0;
  z->nframes = 0;
  int rc = add_bound(z, &cap, z->p.header_bytes);
  for (uint64_t pos = z->p.header_bytes; rc == 0 && pos < z->p.file_size;) {
    uint64_t end = pos + F;
    if (end >= z->p.file_size) end = z->p.file_size;
    else {
      uint64_t t = last_end_in(z, pos, end);
      if (t) end = t;
    }
    rc = add_bound(z, &cap, end);
    pos = end;
  }
  return rc;
}

int ckptio_zsave_check_level(int level, char *err, size_t errlen) {
  if (level < ZSTD_minCLevel() || level > ZSTD_maxCLevel() || level == 0)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "zstd level %d outside %d..%d (0 means no compression)",
                          level, ZSTD_minCLevel(), ZSTD_maxCLevel());
  return 0;
}

int ckptio_zsave_open(const ckptio_zsave_params *p, ckptio_zsave **out, char *err, size_t errlen) {
  *out = NULL;
  int rc = ckptio_zsave_check_level(p->level, err, errlen);
  if (rc < 0) return rc;
  if (p->header_bytes + 13 + 3 * (p->header_bytes / (128 << 10) + 1) > CKPTIO_ZS_MAX_FRAME_BYTES)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "header too large for one zstd frame");
  ckptio_zsave *z = calloc(1, sizeof(*z));
  if (!z) return -ENOMEM;
  z->p = *p;
  if (z->p.max_frame > CKPTIO_ZS_MAX_FRAME_BYTES) z->p.max_frame = CKPTIO_ZS_MAX_FRAME_BYTES;
  z->p.max_frame &= ~(uint64_t)7; /* keeps cuts inside a tensor on element boundaries */
  if (z->p.buffers < 1) z->p.buffers = 1;
  if (z->p.threads < 1) z->p.threads = 1;
  pthread_mutex_init(&z->mu, NULL);
  pthread_cond_init(&z->cv, NULL);
  rc = -ENOMEM;
  z->tensors = malloc((p->count + 1) * sizeof(*z->tensors));
  if (!z->tensors) goto fail;
  memcpy(z->tensors, p->tensors, p->count * sizeof(*z->tensors));
  if ((rc = plan(z)) < 0) goto fail;
  rc = -ENOMEM;
  uint64_t n = z->nframes;
  z->csize = calloc(n + 1, sizeof(uint32_t));
  z->dsize = calloc(n + 1, sizeof(uint32_t));
  z->coff = calloc(n + 1, sizeof(uint64_t));
  z->ready = calloc(n + 1, 1);
  z->written = calloc(n + 1, 1);
  z->header_frame = malloc(ckptio_zs_raw_frame_bytes(p->header_bytes));
  z->cbuf = calloc(z->p.buffers, sizeof(uint8_t *));
  z->nws = z->p.threads;
  z->ws = calloc((size_t)z->nws, sizeof(workspace));
  if (!z->csize || !z->dsize || !z->coff || !z->ready || !z->written || !z->header_frame || !z->cbuf || !z->ws ||
      ckptio_lender_init(&z->lend, z->nws) < 0)
    goto fail;
  for (uint64_t c = 0; c < n; c++) z->dsize[c] = (uint32_t)(z->start[c + 1] - z->start[c]);
  z->cbuf_bytes = ZSTD_compressBound((size_t)z->p.max_frame);
  for (size_t i = 0; i < z->p.buffers && n > 1; i++)
    if (!(z->cbuf[i] = malloc(z->cbuf_bytes))) goto fail;
  /* Frame 0, the header, has a size known now and is written last, by
   * finish, once its CRCs are known: the data frames start after it. */
  z->csize[0] = (uint32_t)ckptio_zs_raw_frame_bytes(p->header_bytes);
  z->ready[0] = z->written[0] = 1;
  z->next = 1;
  z->end = z->csize[0];
  *out = z;
  return 0;
fail:
  ckptio_zsave_free(z);
  return rc == -ENOMEM ? ckptio_err_fmt(err, errlen, rc, "out of memory planning zstd frames") : rc;
}

void ckptio_zsave_free(ckptio_zsave *z) {
  if (!z) return;
  for (int i = 0; z->ws && i < z->nws; i++) {
    ZSTD_freeCCtx(z->ws[i].cctx);
    free(z->ws[i].scratch);
  }
  for (size_t i = 0; z->cbuf && i < z->p.buffers; i++) free(z->cbuf[i]);
  free(z->cbuf);
  free(z->ws);
  ckptio_lender_fini(&z->lend);
  free(z->header_frame);
  free(z->written);
  free(z->ready);
  free(z->coff);
  free(z->dsize);
  free(z->csize);
  free(z->start);
  free(z->tensors);
  pthread_cond_destroy(&z->cv);
  pthread_mutex_destroy(&z->mu);
  free(z);
}

uint64_t ckptio_zsave_frames(const ckptio_zsave *z) { return z->nframes; }

uint64_t ckptio_zsave_start(const ckptio_zsave *z, uint64_t c) { return z->start[c < z->nframes ? c : z->nframes]; }

uint64_t ckptio_zsave_frame_of(const ckptio_zsave *z, uint64_t pos) {
  uint64_t lo = 0, hi = z->nframes;
  while (lo < hi) {
    uint64_t mid = lo + (hi - lo) / 2;
    if (z->start[mid + 1] <= pos) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static uint8_t *frame_buf(ckptio_zsave *z, uint64_t c) {
  return c == 0 ? z->header_frame : z->cbuf[(c - 1) % z->p.buffers];
}

int ckptio_zsave_reserve(ckptio_zsave *z, uint64_t c) {
  pthread_mutex_lock(&z->mu);
  while (!z->rc && c > z->p.buffers && !z->written[c - z->p.buffers]) pthread_cond_wait(&z->cv, &z->mu);
  int rc = z->rc;
  pthread_mutex_unlock(&z->mu);
  return rc;
}

void ckptio_zsave_abort(ckptio_zsave *z, int rc) {
  pthread_mutex_lock(&z->mu);
  if (!z->rc) z->rc = rc < 0 ? rc : CKPTIO_E_STATE;
  pthread_cond_broadcast(&z->cv);
  pthread_mutex_unlock(&z->mu);
}

static workspace *ws_get(ckptio_zsave *z) { return &z->ws[ckptio_lender_borrow(&z->lend)]; }

static void ws_put(ckptio_zsave *z, workspace *w) { ckptio_lender_return(&z->lend, (int)(w - z->ws)); }

/* The frame's bytes with every whole-element piece of a tensor shuffled. */
static void shuffle_frame(const ckptio_zsave *z, uint8_t *dst, const uint8_t *src, uint64_t s, uint64_t e) {
  memcpy(dst, src, (size_t)(e - s));
  size_t k = 0, hi = z->p.count;
  while (k < hi) { /* first tensor ending after s */
    size_t mid = k + (hi - k) / 2;
    if (z->tensors[mid].offset + z->tensors[mid].nbytes <= s) k = mid + 1;
    else hi = mid;
  }
  for (; k < z->p.count && z->tensors[k].offset < e; k++) {
    const ckptio_zsave_tensor *t = &z->tensors[k];
    uint64_t a = t->offset > s ? t->offset : s, b = t->offset + t->nbytes < e ? t->offset + t->nbytes : e;
    if (ckptio_shuffle_applies(t->offset, a, b, t->elem))
      ckptio_shuffle(dst + (a - s), src + (a - s), (size_t)(b - a), t->elem);
  }
}

static int compress(ckptio_zsave *z, uint64_t c, uint8_t *buf, size_t len, char *msg, size_t msglen) {
  workspace *w = ws_get(z);
  int rc = 0;
  const uint8_t *src = buf;
  if (!w->cctx && !(w->cctx = ZSTD_createCCtx())) rc = -ENOMEM;
  if (!rc && z->p.shuffle) {
    if (!w->scratch && !(w->scratch = malloc((size_t)z->p.max_frame))) rc = -ENOMEM;
    else shuffle_frame(z, w->scratch, buf, z->start[c], z->start[c] + len), src = w->scratch;
  }
  if (rc) {
    ws_put(z, w);
    return ckptio_err_fmt(msg, msglen, rc, "zstd frame %llu: out of memory", (unsigned long long)c);
  }
  ZSTD_CCtx_reset(w->cctx, ZSTD_reset_session_only);
  size_t r = ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_compressionLevel, z->p.level);
  if (!ZSTD_isError(r)) r = ZSTD_compress2(w->cctx, frame_buf(z, c), z->cbuf_bytes, src, len);
  ws_put(z, w);
  if (ZSTD_isError(r))
    return ckptio_err_fmt(msg, msglen, CKPTIO_E_ZSTD, "zstd frame %llu (%zu bytes): compression failed: %s",
                          (unsigned long long)c, len, ZSTD_getErrorName(r));
  z->csize[c] = (uint32_t)r;
  return 0;
}

int ckptio_zsave_frame(ckptio_zsave *z, uint64_t c, uint8_t *buf, size_t len, char *msg, size_t msglen) {
  int rc = compress(z, c, buf, len, msg, msglen);
  if (rc < 0) {
    ckptio_zsave_abort(z, rc);
    return rc;
  }
  /* Every frame whose offset this one's size completes is ours to write. */
  pthread_mutex_lock(&z->mu);
  z->ready[c] = 1;
  uint64_t first = z->next;
  while (z->next < z->nframes && z->ready[z->next]) {
    z->coff[z->next] = z->end;
    z->end += z->csize[z->next];
    z->next++;
  }
  uint64_t last = z->next;
  pthread_mutex_unlock(&z->mu);
  for (uint64_t f = first; f < last && rc == 0; f++) {
    msg[0] = '\0';
    rc = ckptio_tmpfile_write(z->p.out, frame_buf(z, f), z->csize[f], z->coff[f], msg, msglen);
    if (rc < 0) {
      if (!msg[0]) /* a file's: an object's storage wrote its own sentence */
        ckptio_err_fmt(msg, msglen, rc, "write of zstd frame %llu (%u bytes at offset %llu) failed: %s",
                       (unsigned long long)f, z->csize[f], (unsigned long long)z->coff[f], ckptio_strerror(rc));
      ckptio_zsave_abort(z, rc);
      break;
    }
    pthread_mutex_lock(&z->mu);
    z->written[f] = 1;
    pthread_cond_broadcast(&z->cv);
    pthread_mutex_unlock(&z->mu);
  }
  return rc;
}

int ckptio_zsave_finish(ckptio_zsave *z, const uint8_t *header, uint64_t *file_size, char *err, size_t errlen) {
  if (z->rc || z->next != z->nframes)
    return ckptio_err_fmt(err, errlen, z->rc ? z->rc : CKPTIO_E_STATE, "zstd: %llu of %llu frames written",
                          (unsigned long long)z->next, (unsigned long long)z->nframes);
  /* The header's CRCs are final now; RAW blocks keep the frame's size. */
  ckptio_zs_raw_frame_write(header, z->p.header_bytes, z->header_frame);
  err[0] = '\0';
  int rc = ckptio_tmpfile_write(z->p.out, z->header_frame, z->csize[0], 0, err, errlen);
  if (rc < 0 && err[0]) return rc;
  if (rc < 0) return ckptio_err_fmt(err, errlen, rc, "rewrite of the header frame failed: %s", ckptio_strerror(rc));
  uint64_t tb = ckptio_zs_table_bytes(z->nframes);
  uint8_t *tab = malloc((size_t)tb);
  if (!tab) return ckptio_err_fmt(err, errlen, -ENOMEM, "out of memory for the seek table");
  ckptio_zs_table_write(z->csize, z->dsize, (size_t)z->nframes, tab);
  rc = ckptio_tmpfile_write(z->p.out, tab, (size_t)tb, z->end, err, errlen);
  free(tab);
  if (rc < 0 && err[0]) return rc;
  if (rc < 0) return ckptio_err_fmt(err, errlen, rc, "write of the seek table failed: %s", ckptio_strerror(rc));
  *file_size = z->end + tb;
  return 0;
}
