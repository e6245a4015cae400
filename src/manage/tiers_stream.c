/* A part arriving over the exchange loaded straight into the caller's
 * tensors (tiers_stream in tiers.h): the one-pass restore of a part a peer
 * holds. Without it the part is written into a memory file first and then
 * loaded from there, which costs a file's worth of new memory and a second
 * pass over the bytes.
 *
 * The header is parsed by the public reader from a sparse in-memory file
 * of the part's size that holds the header alone (the holes cost no
 * memory), so the layout rules stay the reader's. Each tensor's bytes are
 * then received into its destination itself where a chunk of the exchange
 * falls in one tensor (tiers_stream_target), else copied from the
 * exchange's buffer, its CRC32 continued over them either way; the part is
 * good only when every asked tensor arrived whole and every CRC32 matched. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/crc32.h"
#include "core/error.h"
#include "manage/tiers.h"

/* One destination: where its tensor lies in the part and what came so far. */
typedef struct landing {
  const char *name;
  unsigned char *dst;
  uint64_t offset, nbytes, got;
  uint32_t want, crc;
} landing;

struct tiers_stream {
  ckptio_ctx *ctx;
  const ckptio_tiers_dest *dests;
  size_t n;
  uint64_t bytes;      /* the part's size */
  int fd;              /* the header's sparse file, until parsed */
  uint64_t head_end;   /* 8 + the header's length, once known; else 0 */
  landing *land;       /* once parsed */
  int rc;              /* the first failure, with why */
  char why[CKPTIO_ERRLEN];
};

int tiers_stream_can(const ckptio_tiers_dest *dests, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (dests[i].device != CKPTIO_DEVICE_HOST) return 0;
  return 1;
}

tiers_stream *tiers_stream_new(ckptio_ctx *ctx, const ckptio_tiers_dest *dests, size_t n, uint64_t bytes) {
  tiers_stream *s = calloc(1, sizeof(*s));
  if (!s) return NULL;
  *s = (tiers_stream){.ctx = ctx, .dests = dests, .n = n, .bytes = bytes};
  s->fd = memfd_create("ckptio-part-header", MFD_CLOEXEC);
  if (s->fd < 0 || ftruncate(s->fd, (off_t)bytes) != 0) {
    int e = -errno;
    s->rc = ckptio_fail(s->why, e, "an in-memory file for the part's header: %s", ckptio_strerror(e));
  }
  return s;
}

/* The header parsed by the reader, each destination's tensor found in it. */
static int parse(tiers_stream *s) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/self/fd/%d", s->fd);
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  ckptio_ctx_options(s->ctx, &o);
  o.load_method = CKPTIO_LOAD_PREAD;
  ckptio_reader *r = NULL;
  int rc = ckptio_reader_open(s->ctx, path, &o, &r);
  if (rc < 0) return ckptio_fail(s->why, rc, "%s", ckptio_last_open_error());
  s->land = calloc(s->n ? s->n : 1, sizeof(*s->land));
  if (!s->land) rc = ckptio_fail(s->why, -ENOMEM, "no memory");
  for (size_t i = 0; rc == 0 && i < s->n; i++) {
    const ckptio_tiers_dest *d = &s->dests[i];
    ckptio_tensor_info info;
    int64_t idx = ckptio_reader_find(r, d->name);
    if (idx < 0) {
      rc = ckptio_fail(s->why, (int)idx, "no tensor '%s'", d->name);
    } else if ((rc = ckptio_reader_info(r, (size_t)idx, &info)) < 0) {
      ckptio_fail(s->why, rc, "%s", ckptio_reader_last_error(r));
    } else if (!info.has_crc) {
      rc = ckptio_fail(s->why, CKPTIO_E_CHECKSUM, "tensor '%s' has no CRC32", d->name);
    } else if (d->dst_bytes < info.nbytes || (!d->dst && info.nbytes)) {
      rc = ckptio_fail(s->why, CKPTIO_E_BUFFER_TOO_SMALL, "tensor '%s' needs %llu bytes, destination has %llu",
                       d->name, (unsigned long long)info.nbytes, (unsigned long long)(d->dst ? d->dst_bytes : 0));
    } else {
      s->land[i] = (landing){d->name, d->dst, info.offset, info.nbytes, 0, info.crc32, 0};
    }
  }
  ckptio_reader_close(r);
  close(s->fd);
  s->fd = -1;
  return rc;
}

/* Bytes [off, off + len) of the header into its file; parsed once whole. */
static int take_header(tiers_stream *s, const unsigned char *buf, uint64_t off, uint64_t len) {
  if (pwrite(s->fd, buf, (size_t)len, (off_t)off) != (ssize_t)len)
    return ckptio_fail(s->why, -EIO, "the part's header: writing it into memory failed");
  if (!s->head_end && off + len >= 8) {
    unsigned char prefix[8];
    if (pread(s->fd, prefix, 8, 0) != 8) return ckptio_fail(s->why, -EIO, "the part's header: unreadable");
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | prefix[i];
    if (n > s->bytes - 8)
      return ckptio_fail(s->why, CKPTIO_E_HEADER_TOO_LARGE, "the part's header claims %llu bytes of %llu",
                         (unsigned long long)n, (unsigned long long)s->bytes);
    s->head_end = 8 + n;
  }
  return s->head_end && off + len >= s->head_end ? parse(s) : 0;
}

int tiers_stream_feed(tiers_stream *s, const unsigned char *buf, uint64_t off, uint64_t len) {
  while (s->rc == 0 && !s->land && len) { /* the header's bytes (they come first, in order) */
    uint64_t head = s->head_end ? s->head_end : 8, take = head - off < len ? head - off : len;
    s->rc = take_header(s, buf, off, take);
    buf += take, off += take, len -= take;
  }
  if (s->rc < 0) return s->rc;
  for (size_t i = 0; len && i < s->n; i++) {
    landing *l = &s->land[i];
    uint64_t a = off > l->offset ? off : l->offset, e = off + len, end = l->offset + l->nbytes;
    if (e > end) e = end;
    if (a >= e) continue;
    ckptio_copy_crc(l->dst + (a - l->offset), buf + (a - off), (size_t)(e - a), &l->crc);
    l->got += e - a;
  }
  return 0;
}

/* The one landing that [off, off + len) overlaps, when it holds all of it; else NULL. */
static landing *only_landing(tiers_stream *s, uint64_t off, uint64_t len) {
  landing *hit = NULL;
  for (size_t i = 0; s->land && i < s->n; i++) {
    landing *l = &s->land[i];
    if (off >= l->offset + l->nbytes || off + len <= l->offset) continue;
    if (hit || off < l->offset || off + len > l->offset + l->nbytes) return NULL;
    hit = l;
  }
  return hit;
}

unsigned char *tiers_stream_target(tiers_stream *s, uint64_t off, uint64_t len) {
  landing *l = s->rc == 0 ? only_landing(s, off, len) : NULL;
  return l ? l->dst + (off - l->offset) : NULL;
}

void tiers_stream_landed(tiers_stream *s, uint64_t off, uint64_t len) {
  landing *l = only_landing(s, off, len);
  l->crc = ckptio_crc32(l->crc, l->dst + (off - l->offset), (size_t)len);
  l->got += len;
}

int tiers_stream_end(tiers_stream *s, char *why) {
  if (s->rc == 0 && !s->land) s->rc = ckptio_fail(s->why, -EIO, "the part ended inside its header");
  for (size_t i = 0; s->rc == 0 && i < s->n; i++) {
    const landing *l = &s->land[i];
    if (l->got != l->nbytes)
      s->rc = ckptio_fail(s->why, -EIO, "tensor '%s': %llu of its %llu bytes arrived", l->name,
                          (unsigned long long)l->got, (unsigned long long)l->nbytes);
    else if (l->crc != l->want)
      s->rc = ckptio_fail(s->why, CKPTIO_E_CHECKSUM, "tensor '%s': checksum mismatch (recorded %08x, data %08x)",
                          l->name, l->want, l->crc);
  }
  if (s->rc < 0) memcpy(why, s->why, CKPTIO_ERRLEN);
  return s->rc;
}

void tiers_stream_free(tiers_stream *s) {
  if (!s) return;
  if (s->fd >= 0) close(s->fd);
  free(s->land);
  free(s);
}
