/*
 * The zip reader under the PyTorch format: finds the end records, walks the
 * central directory and checks every entry's local header, so that what it
 * hands out is a list of byte ranges that lie inside the file, do not overlap
 * and hold stored (uncompressed) data. Files that are not zips are named.
 */
#include "formats/zip_read.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckptio.h"
#include "core/error.h"

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_EOCD 0x06054b50u
#define SIG_EOCD64 0x06064b50u
#define SIG_LOCATOR64 0x07064b50u
#define EOCD_LEN 22u
#define EOCD64_LEN 56u
#define LOCATOR64_LEN 20u
#define CENTRAL_LEN 46u
#define LOCAL_LEN 30u
#define MAX_COMMENT 65535u

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t le32(const uint8_t *p) { return (uint32_t)le16(p) | (uint32_t)le16(p + 2) << 16; }
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

/* A name from the file, fit for a message: printable ASCII kept, the rest
 * as \xNN, cut to about 200 bytes. */
static const char *shown(char *buf, size_t cap, const char *s, size_t n) {
  size_t o = 0, i = 0;
  for (; i < n && o + 8 < cap && o < 200; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') buf[o++] = (char)c;
    else o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
  }
  if (i < n && o + 4 <= cap) memcpy(buf + o, "...", 3), o += 3;
  buf[o] = '\0';
  return buf;
}

/* The legacy stream opens with the pickled magic number 0x1950a86a20f9469cfc6c:
 * PROTO n, LONG1 of 10 bytes; protocols 4 and up put a 9-byte FRAME first. */
static int is_legacy_torch(const uint8_t *map, uint64_t size) {
  static const uint8_t magic[] = {0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9,
                                  0x20, 0x6a, 0xa8, 0x50, 0x19};
  if (size < 2 + sizeof(magic) || map[0] != 0x80) return 0;
  if (!memcmp(map + 2, magic, sizeof(magic))) return 1;
  return size >= 11 + sizeof(magic) && map[2] == 0x95 && !memcmp(map + 11, magic, sizeof(magic));
}

/* What a file that is not a zip is. torch.load tells these apart the same
 * way: by the first bytes. */
static int sniff(const uint8_t *map, uint64_t size, char *err, size_t errlen) {
  if (size >= 8 && !memcmp(map, "PYTORCH1", 8))
    return ckptio_err_fmt(err, errlen, CKPTIO_E_FORMAT,
                          "unsupported archive format from PyTorch's preview release "
                          "(the file starts with 'PYTORCH1')");
  if (is_legacy_torch(map, size))
    return ckptio_err_fmt(err, errlen, CKPTIO_E_FORMAT,
                          "legacy (pre-1.6) torch.save format is not supported (a pickle stream "
                          "starting with torch's magic number); re-save it with torch.save in "
                          "PyTorch >= 1.6");
  if (size >= 262 && !memcmp(map + 257, "ustar", 5))
    return ckptio_err_fmt(err, errlen, CKPTIO_E_FORMAT,
                          "tar archive ('ustar' at byte 257): the pre-1.0 torch.save format "
                          "is not supported; re-save it with a current torch.save");
  if (size >= 4 && (!memcmp(map, "PK\x03\x04", 4) || !memcmp(map, "PK\x05\x06", 4))) return 0;
  if (size < 4)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_FORMAT,
                          "not a zip archive: the file has only %" PRIu64 " bytes", size);
  return ckptio_err_fmt(err, errlen, CKPTIO_E_FORMAT,
                        "not a zip archive: the file starts with %02x %02x %02x %02x, not "
                        "50 4b 03 04 ('PK\\x03\\x04')%s",
                        map[0], map[1], map[2], map[3],
                        map[0] == 0x80 ? " (a pickle stream, not a torch.save archive)" : "");
}

typedef struct zip_end {
  uint64_t count, cd_offset, cd_size;
  uint64_t cd_limit;   /* the central directory must end at or before this */
  int zip64;
} zip_end;

/* The zip64 end record, through its locator right before the EOCD. */
static int read_end64(const uint8_t *map, uint64_t eocd, const uint8_t *e, zip_end *z,
                      char *err, size_t errlen) {
  uint64_t loc = eocd - LOCATOR64_LEN;
  uint64_t off = le64(map + loc + 8);
  if (le32(map + loc + 4) != 0 || le32(map + loc + 16) > 1)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_FORMAT,
                          "multi-disk zip archives are not supported (zip64 locator names disk %u of %u)",
                          le32(map + loc + 4), le32(map + loc + 16));
  if (off > loc || loc - off < EOCD64_LEN || le32(map + off) != SIG_EOCD64)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_ZIP,
                          "corrupt zip: the zip64 locator points at byte %" PRIu64
                          ", where there is no zip64 end record", off);
  const uint8_t *r = map + off;
  uint64_t rec = le64(r + 4);
  if (rec < EOCD64_LEN - 12 || rec > loc - off - 12)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_ZIP,
                          "corrupt zip: the zip64 end record claims %" PRIu64 " bytes", rec);
  if (le32(r + 16) != 0 || le32(r + 20) != 0 || le64(r + 24) != le64(r + 32))
    return ckptio_err_fmt(err, errlen, CKPTIO_E_FORMAT,
                          "multi-disk zip archives are not supported (zip64 end record)");
  z->count = le64(r + 32);
  z->cd_size = le64(r + 40);
  z->cd_offset = le64(r + 48);
  z->cd_limit = off;
  z->zip64 = 1;
  /* The classic record either says "see zip64" or agrees. */
  if ((le16(e + 10) != 0xffff && le16(e + 10) != z->count) ||
      (le32(e + 12) != 0xffffffffu && le32(e + 12) != z->cd_size) ||
      (le32(e + 16) != 0xffffffffu && le32(e + 16) != z->cd_offset))
    return ckptio_err_fmt(err, errlen, CKPTIO_E_ZIP,
                          "corrupt zip: the end record and the zip64 end record disagree on "
                          "the central directory");
  return 0;
}

static int read_end(const uint8_t *map, uint64_t size, zip_end *z, char *err, size_t errlen) {
  if (size < EOCD_LEN)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_ZIP,
                          "corrupt zip: %" PRIu64 " bytes cannot hold an end of central directory record",
                          size);
  /* The EOCD is followed only by its comment (at most 65535 bytes); take the
   * last signature whose comment reaches exactly to the end of the file. */
  uint64_t lowest = size - EOCD_LEN > MAX_COMMENT ? size - EOCD_LEN - MAX_COMMENT : 0;
  uint64_t eocd = UINT64_MAX;
  for (uint64_t p = size - EOCD_LEN + 1; p-- > lowest;) {
    if (le32(map + p) == SIG_EOCD && p + EOCD_LEN + le16(map + p + 20) == size) {
      eocd = p;
      break;
    }
  }
  if (eocd == UINT64_MAX)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_ZIP,
                          "corrupt zip: no end of central directory record in the last %" PRIu64
                          " bytes (truncated file?)", size - lowest);
  const uint8_t *e = map + eocd;
  memset(z, 0, sizeof(*z));
  if (eocd >= LOCATOR64_LEN && le32(map + eocd - LOCATOR64_LEN) == SIG_LOCATOR64)
    return read_end64(map, eocd, e, z, err, errlen);
  if (le16(e + 4) != 0 || le16(e + 6) != 0 || le16(e + 8) != le16(e + 10))
    return ckptio_err_fmt(err, errlen, CKPTIO_E_FORMAT,
                          "multi-disk zip archives are not supported (end record names disk %u)",
                          le16(e + 4));
  if (le16(e + 10) == 0xffff || le32(e + 12) == 0xffffffffu || le32(e + 16) == 0xffffffffu)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_ZIP,
                          "corrupt zip: the end record defers to zip64 records that are missing");
  z->count = le16(e + 10);
  z->cd_size = le32(e + 12);
  z->cd_offset = le32(e + 16);
  z->cd_limit = eocd;
  return 0;
}

/* Sizes and offset the central entry leaves at 0xFFFFFFFF live in its zip64
 * extra field (id 1), in this order. */
static int read_zip64_extra(const uint8_t *x, size_t len, uint64_t *usize, uint64_t *csize,
                            uint64_t *offset, int need_disk) {
  while (len >= 4) {
    size_t id = le16(x), n = le16(x + 2);
    if (n > len - 4) return -1;
    if (id == 1) {
      uint64_t *want[3] = {*usize == 0xffffffffu ? usize : NULL, *csize == 0xffffffffu ? csize : NULL,
                           *offset == 0xffffffffu ? offset : NULL};
      size_t at = 4;
      for (int k = 0; k < 3; k++) {
        if (!want[k]) continue;
        if (at + 8 > 4 + n) return -1;
        *want[k] = le64(x + at);
        at += 8;
      }
      if (need_disk && (at + 4 > 4 + n || le32(x + at) != 0)) return -1;
      return 0;
    }
    x += 4 + n;
    len -= 4 + n;
  }
  return *usize == 0xffffffffu || *csize == 0xffffffffu || *offset == 0xffffffffu || need_disk ? -1 : 0;
}

static int cmp_by_offset(const void *a, const void *b, void *ctx) {
  const ckptio_zip_entry *e = ctx;
  uint64_t x = e[*(const size_t *)a].header_offset, y = e[*(const size_t *)b].header_offset;
  return (x > y) - (x < y);
}

static int cmp_by_name(const void *a, const void *b, void *ctx) {
  const ckptio_zip_entry *e = ctx;
  return strcmp(e[*(const size_t *)a].name, e[*(const size_t *)b].name);
}

static int compressed(char *err, size_t errlen, const char *name, unsigned method) {
  return ckptio_err_fmt(err, errlen, CKPTIO_E_FORMAT,
                        "compressed entry '%s' (method %u) is not supported: ckptio reads only "
                        "stored entries, as torch.save writes them", name, method);
}

/* One central directory entry at map[*p], checked against its local header. */
static int read_entry(const uint8_t *map, uint64_t *p, uint64_t cd_end, uint64_t cd_offset, unsigned flags_in,
                      size_t i, char **pool, ckptio_zip_entry *out, char *err, size_t errlen) {
  char nm[256];
  const uint8_t *c = map + *p;
  if (cd_end - *p < CENTRAL_LEN || le32(c) != SIG_CENTRAL)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_ZIP,
                          "corrupt zip: central directory entry %zu at byte %" PRIu64 " is %s", i, *p,
                          cd_end - *p < CENTRAL_LEN ? "cut short" : "missing its signature");
  uint16_t flags = le16(c + 8), method = le16(c + 10);
  size_t n = le16(c + 28), m = le16(c + 30), k = le16(c + 32);
  uint64_t csize = le32(c + 20), usize = le32(c + 24), off = le32(c + 42);
  if (cd_end - *p - CENTRAL_LEN < (uint64_t)n + m + k)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_ZIP,
                          "corrupt zip: central directory entry %zu runs past the directory", i);
  const char *name = (const char *)c + CENTRAL_LEN;
  if (n == 0 || n > CKPTIO_ZIP_MAX_NAME || memchr(name, 0, n))
    return ckptio_err_fmt(err, errlen, CKPTIO_E_ZIP,
                          "corrupt zip: entry %zu has a name of %zu bytes%s (limit %d, no NUL bytes)", i,
                          n, n && memchr(name, 0, n) ? " with a NUL byte" : "", CKPTIO_ZIP_MAX_NAME);
  shown(nm, sizeof(nm), name, n);
  if (read_zip64_extra(c + CENTRAL_LEN + n, m, &usize, &csize, &off, le16(c + 34) == 0xffff) < 0)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_ZIP,
                          "corrupt zip: entry '%s' has a malformed extra field, or lacks the zip64 "
                          "fields its sizes call for", nm);
  if (le16(c + 34) != 0 && le16(c + 34) != 0xffff)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_FORMAT,
                          "multi-disk zip archives are not supported (entry '%s' is on disk %u)", nm,
                          le16(c + 34));
  if (flags & 0x41)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_FORMAT, "encrypted entry '%s' is not supported", nm);
  if (method != 0 && !(flags_in & CKPTIO_ZIP_ALLOW_COMPRESSED)) return compressed(err, errlen, nm, method);
  if (method == 0 && csize != usize)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_ZIP,
                          "corrupt zip: stored entry '%s' has compressed size %" PRIu64 " but size %" PRIu64,
                          nm, csize, usize);
  /* The local header: same name, and the data between it and the directory. */
  if (off > cd_offset || cd_offset - off < LOCAL_LEN)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_ZIP,
                          "corrupt zip: entry '%s' has its local header at byte %" PRIu64
                          ", not before the central directory at %" PRIu64, nm, off, cd_offset);
  uint64_t data = 0;
  if (!(flags_in & CKPTIO_ZIP_CENTRAL_ONLY)) {
    const uint8_t *l = map + off;
    uint64_t ln = le16(l + 26), lm = le16(l + 28);
    if (le32(l) != SIG_LOCAL)
      return ckptio_err_fmt(err, errlen, CKPTIO_E_ZIP,
                            "corrupt zip: entry '%s': no local header signature at byte %" PRIu64, nm, off);
    if (ln != n || cd_offset - off - LOCAL_LEN < ln || memcmp(l + LOCAL_LEN, name, n))
      return ckptio_err_fmt(err, errlen, CKPTIO_E_ZIP,
                            "corrupt zip: entry '%s': the local header at byte %" PRIu64
                            " names a different file", nm, off);
    if (le16(l + 8) != method)
      return ckptio_err_fmt(err, errlen, CKPTIO_E_ZIP,
                            "corrupt zip: entry '%s': the local header says method %u, the directory %u",
                            nm, le16(l + 8), method);
    data = off + LOCAL_LEN + ln + lm;
    if (data > cd_offset || cd_offset - data < csize)
      return ckptio_err_fmt(err, errlen, CKPTIO_E_ZIP,
                            "corrupt zip: entry '%s': %" PRIu64 " bytes of data at byte %" PRIu64
                            " run past the start of the central directory (%" PRIu64 ")",
                            nm, csize, data, cd_offset);
  }
  memcpy(*pool, name, n);
  (*pool)[n] = '\0';
  *out = (ckptio_zip_entry){*pool, n, method, flags, le32(c + 16), usize, csize, off, data};
  *pool += n + 1;
  *p += CENTRAL_LEN + n + m + k;
  return 0;
}

/* Entries must not share bytes, and names must be unique: a reader that
 * looks a record up by name must not have two answers. */
static int check_entries(ckptio_zip *z, char *err, size_t errlen) {
  char a[256], b[256];
  size_t *order = NULL;
  int rc = 0;
  if (!(order = malloc(z->count * sizeof(*order))))
    return ckptio_err_fmt(err, errlen, -ENOMEM, "out of memory reading the zip directory");
  for (size_t i = 0; i < z->count; i++) order[i] = z->by_name[i] = i;
  qsort_r(order, z->count, sizeof(*order), cmp_by_offset, z->entries);
  for (size_t k = 1; k < z->count; k++) {
    const ckptio_zip_entry *x = &z->entries[order[k - 1]], *y = &z->entries[order[k]];
    if (x->data_offset + x->csize > y->header_offset) {
      rc = ckptio_err_fmt(
          err, errlen, CKPTIO_E_ZIP,
          "corrupt zip: entries '%s' and '%s' overlap (bytes %" PRIu64 "-%" PRIu64 " and from %" PRIu64 ")",
          shown(a, sizeof(a), x->name, x->name_len), shown(b, sizeof(b), y->name, y->name_len),
          x->header_offset, x->data_offset + x->csize, y->header_offset);
      goto fail;
    }
  }
  qsort_r(z->by_name, z->count, sizeof(*z->by_name), cmp_by_name, z->entries);
  for (size_t k = 1; k < z->count; k++) {
    const ckptio_zip_entry *y = &z->entries[z->by_name[k]];
    if (!strcmp(z->entries[z->by_name[k - 1]].name, y->name)) {
      rc = ckptio_err_fmt(err, errlen, CKPTIO_E_ZIP, "corrupt zip: entry '%s' appears twice",
                          shown(a, sizeof(a), y->name, y->name_len));
      goto fail;
    }
  }
fail:
  free(order);
  return rc;
}

int ckptio_zip_open(const uint8_t *map, uint64_t size, unsigned flags, ckptio_zip *out, char *err,
                    size_t errlen) {
  zip_end end;
  char *pool;
  int rc;
  if (!out || (!map && size))
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "zip_open: NULL argument");
  memset(out, 0, sizeof(*out));
  if ((rc = sniff(map, size, err, errlen)) < 0) return rc;
  if ((rc = read_end(map, size, &end, err, errlen)) < 0) return rc;
  if (end.count == 0)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_ZIP, "the zip archive does not contain any files");
  if (end.count > CKPTIO_ZIP_MAX_ENTRIES)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_ZIP,
                          "zip archive with %" PRIu64 " entries: the limit is %u", end.count,
                          CKPTIO_ZIP_MAX_ENTRIES);
  if (end.cd_offset > end.cd_limit || end.cd_limit - end.cd_offset < end.cd_size ||
      end.cd_size / CENTRAL_LEN < end.count)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_ZIP,
                          "corrupt zip: a central directory of %" PRIu64 " entries in %" PRIu64
                          " bytes at byte %" PRIu64 " does not fit before the end records (byte %" PRIu64 ")",
                          end.count, end.cd_size, end.cd_offset, end.cd_limit);
  out->count = (size_t)end.count;
  out->cd_offset = end.cd_offset;
  out->cd_size = end.cd_size;
  out->zip64 = end.zip64;
  /* Every name is inside the directory, so the pool needs at most its size
   * plus one terminator per entry. */
  out->entries = calloc(out->count, sizeof(*out->entries));
  out->by_name = malloc(out->count * sizeof(*out->by_name));
  out->names = malloc((size_t)end.cd_size + out->count);
  if (!out->entries || !out->by_name || !out->names) {
    rc = ckptio_err_fmt(err, errlen, -ENOMEM, "out of memory reading the zip directory");
    goto fail;
  }
  pool = out->names;
  uint64_t p = end.cd_offset, cd_end = end.cd_offset + end.cd_size;
  for (size_t i = 0; i < out->count; i++)
    if ((rc = read_entry(map, &p, cd_end, end.cd_offset, flags, i, &pool, &out->entries[i], err, errlen)) < 0)
      goto fail;
  if (p != cd_end) {
    rc = ckptio_err_fmt(err, errlen, CKPTIO_E_ZIP,
                        "corrupt zip: %" PRIu64 " bytes of the central directory follow its %zu entries",
                        cd_end - p, out->count);
    goto fail;
  }
  if (!(flags & CKPTIO_ZIP_CENTRAL_ONLY) && (rc = check_entries(out, err, errlen)) < 0) goto fail;
  return 0;
fail:
  ckptio_zip_free(out);
  return rc;
}

int ckptio_zip_directory_start(const uint8_t *map, uint64_t size, uint64_t *start, char *err, size_t errlen) {
  zip_end end;
  int rc = read_end(map, size, &end, err, errlen);
  if (rc == 0) *start = end.cd_offset < end.cd_limit ? end.cd_offset : end.cd_limit;
  return rc;
}

int ckptio_zip_require_stored(const ckptio_zip *z, char *err, size_t errlen) {
  char nm[256];
  for (size_t i = 0; z && i < z->count; i++)
    if (z->entries[i].method != 0)
      return compressed(err, errlen, shown(nm, sizeof(nm), z->entries[i].name, z->entries[i].name_len),
                        z->entries[i].method);
  return 0;
}

const ckptio_zip_entry *ckptio_zip_find(const ckptio_zip *z, const char *name) {
  if (!z || !name) return NULL;
  size_t lo = 0, hi = z->count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const ckptio_zip_entry *e = &z->entries[z->by_name[mid]];
    int c = strcmp(e->name, name);
    if (c == 0) return e;
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return NULL;
}

void ckptio_zip_free(ckptio_zip *z) {
  if (!z) return;
  free(z->entries);
  free(z->by_name);
  free(z->names);
  memset(z, 0, sizeof(*z));
}
