/* The zstd seekable format: the seek table read with every limit of
 * FORMATS.md section 3 checked in u64, the table written, and frames of RAW
 * blocks (RFC 8878 3.1.1) for bytes that must keep a fixed size. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ckptio.h"
#include "core/error.h"
#include "formats/zstd_seekable.h"

#define RAW_BLOCK_MAX (128u << 10) /* Block_Maximum_Size */
#define SKIP_HEADER 8              /* magic, Frame_Size */

static uint32_t rd32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void wr32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}

int ckptio_zs_detect(const uint8_t *prefix, uint64_t file_size) {
  return file_size >= 4 && rd32(prefix) == CKPTIO_ZS_FRAME_MAGIC;
}

int ckptio_zs_table_parse(const uint8_t *file, uint64_t file_size, ckptio_zs_table *out, char *err,
                          size_t errlen) {
  memset(out, 0, sizeof(*out));
  if (file_size < CKPTIO_ZS_FOOTER + SKIP_HEADER)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_ZSTD, "zstd: file of %llu bytes is too short for a seek table",
                          (unsigned long long)file_size);
  const uint8_t *foot = file + file_size - CKPTIO_ZS_FOOTER;
  if (rd32(foot + 5) != CKPTIO_ZS_SEEK_MAGIC)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_ZSTD,
                          "zstd: no seek table (last 4 bytes are not the seekable magic 0x8F92EAB1): "
                          "a plain zstd stream (decompress it with zstd -d) or a truncated file");
  uint32_t n = rd32(foot);
  uint8_t desc = foot[4];
  if (desc & 0x7c)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_ZSTD, "zstd: seek table descriptor 0x%02x sets reserved bits 6-2",
                          desc);
  if (n > CKPTIO_ZS_MAX_FRAMES)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_ZSTD, "zstd: seek table claims %u frames, limit %u", n,
                          CKPTIO_ZS_MAX_FRAMES);
  uint64_t esize = desc & 0x80 ? 12 : 8;
  uint64_t body = (uint64_t)n * esize + CKPTIO_ZS_FOOTER, table = body + SKIP_HEADER;
  if (table > file_size)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_ZSTD,
                          "zstd: seek table of %u frames (%llu bytes) is larger than the file (%llu bytes)", n,
                          (unsigned long long)table, (unsigned long long)file_size);
  const uint8_t *t = file + file_size - table;
  if (rd32(t) != CKPTIO_ZS_SKIP_MAGIC || rd32(t + 4) != body)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_ZSTD,
                          "zstd: seek table's skippable frame header is wrong (magic 0x%08x, size %u, expected "
                          "0x%08x, %llu)",
                          rd32(t), rd32(t + 4), CKPTIO_ZS_SKIP_MAGIC, (unsigned long long)body);
  /* No frame is under 8 bytes (a skippable frame's header; a zstd frame
   * needs 9): a table claiming more frames than that fits is refused before
   * its entries are allocated, so the allocation stays within ~3x the file. */
  if ((uint64_t)n * 8 > file_size - table)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_ZSTD,
                          "zstd: seek table claims %u frames, but the %llu bytes before it hold at most %llu", n,
                          (unsigned long long)(file_size - table), (unsigned long long)((file_size - table) / 8));
  out->frames = calloc((size_t)n + 1, sizeof(ckptio_zs_frame));
  if (!out->frames) return -ENOMEM;
  uint64_t coff = 0, doff = 0, limit = file_size - table;
  for (uint32_t i = 0; i < n; i++) {
    const uint8_t *e = t + SKIP_HEADER + i * esize;
    ckptio_zs_frame *f = &out->frames[i];
    *f = (ckptio_zs_frame){coff, doff, rd32(e), rd32(e + 4)};
    const char *why = NULL;
    if (f->csize < 8) why = "compressed size under 8 bytes (smaller than any frame)";
    else if (f->dsize > CKPTIO_ZS_MAX_FRAME_BYTES) why = "decompressed size above 1 GiB";
    else if (f->csize > limit - coff) why = "frame runs past the seek table";
    if (why) {
      int rc = ckptio_err_fmt(err, errlen, CKPTIO_E_ZSTD, "zstd: seek table frame %u (compressed %u, "
                              "decompressed %u bytes at offset %llu): %s", i, f->csize, f->dsize,
                              (unsigned long long)coff, why);
      ckptio_zs_table_free(out);
      return rc;
    }
    coff += f->csize;
    doff += f->dsize;
    if (f->dsize > out->max_dsize) out->max_dsize = f->dsize;
  }
  if (coff != limit) {
    int rc = ckptio_err_fmt(err, errlen, CKPTIO_E_ZSTD,
                            "zstd: seek table's compressed sizes add up to %llu bytes, the file has %llu "
                            "before the table", (unsigned long long)coff, (unsigned long long)limit);
    ckptio_zs_table_free(out);
    return rc;
  }
  out->count = n;
  out->csize_total = coff;
  out->dsize_total = doff;
  out->table_bytes = table;
  out->checksums = !!(desc & 0x80);
  return 0;
}

void ckptio_zs_table_free(ckptio_zs_table *t) {
  free(t->frames);
  memset(t, 0, sizeof(*t));
}

size_t ckptio_zs_find(const ckptio_zs_table *t, uint64_t pos) {
  size_t lo = 0, hi = t->count;
  while (lo < hi) { /* first frame ending after pos */
    size_t mid = lo + (hi - lo) / 2;
    if (t->frames[mid].doff + t->frames[mid].dsize <= pos) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

uint64_t ckptio_zs_table_bytes(uint64_t n) { return SKIP_HEADER + n * 8 + CKPTIO_ZS_FOOTER; }

void ckptio_zs_table_write(const uint32_t *csize, const uint32_t *dsize, size_t n, uint8_t *out) {
  wr32(out, CKPTIO_ZS_SKIP_MAGIC);
  wr32(out + 4, (uint32_t)(n * 8 + CKPTIO_ZS_FOOTER));
  uint8_t *e = out + SKIP_HEADER;
  for (size_t i = 0; i < n; i++, e += 8) wr32(e, csize[i]), wr32(e + 4, dsize[i]);
  wr32(e, (uint32_t)n);
  e[4] = 0; /* no checksums: the safetensors header keeps a CRC32 of every tensor */
  wr32(e + 5, CKPTIO_ZS_SEEK_MAGIC);
}

/* Magic, a Frame_Header_Descriptor with Single_Segment set and an 8-byte
 * Frame_Content_Size (so no Window_Descriptor and the window is the
 * content), then 3-byte block headers. */
uint64_t ckptio_zs_raw_frame_bytes(uint64_t len) {
  uint64_t blocks = len ? (len + RAW_BLOCK_MAX - 1) / RAW_BLOCK_MAX : 1;
  return 4 + 1 + 8 + blocks * 3 + len;
}

void ckptio_zs_raw_frame_write(const uint8_t *src, uint64_t len, uint8_t *out) {
  wr32(out, CKPTIO_ZS_FRAME_MAGIC);
  out[4] = 3u << 6 | 1u << 5; /* FCS field 8 bytes, single segment */
  for (int i = 0; i < 8; i++) out[5 + i] = (uint8_t)(len >> (8 * i));
  uint8_t *p = out + 13;
  uint64_t off = 0;
  do {
    uint32_t n = (uint32_t)(len - off < RAW_BLOCK_MAX ? len - off : RAW_BLOCK_MAX);
    uint32_t last = off + n == len;
    uint32_t hdr = last | 0u << 1 | n << 3; /* Block_Type 0: Raw */
    p[0] = (uint8_t)hdr, p[1] = (uint8_t)(hdr >> 8), p[2] = (uint8_t)(hdr >> 16);
    memcpy(p + 3, src + off, n);
    p += 3 + n;
    off += n;
  } while (off < len);
}
