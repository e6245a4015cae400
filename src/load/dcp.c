/* The DCP source: a torch.distributed.checkpoint directory (.metadata and
 * its __R_K.distcp files) opened as one checkpoint. The metadata is read
 * as data (formats/dcp_meta.c); each file becomes a plain source whose
 * index this file builds from the chunks stored in it, each chunk's
 * torch.save archive parsed within its own byte range. Tensors split into
 * chunks answer `parts` (boxes and whole loads assemble them, as for a
 * multi-rank checkpoint); a tensor in one chunk and a byte item answer
 * `member`, byte items under CKPTIO_DCP_BYTES_PREFIX + their fqn. A file
 * written through DCP's zstd stream extension is decompressed at open into
 * a memory file the plain source reads instead. Like the set, it plans
 * nothing itself. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zstd.h>

#include "core/error.h"
#include "formats/dcp_meta.h"
#include "formats/torch_read.h"
#include "io/file.h"
#include "load/source.h"

/* The .metadata of the checkpoints DCP writes is kilobytes to megabytes. */
#define DCP_META_MAX (1ull << 30)

typedef struct dcp {
  ckptio_source s;
  char *dir;
  ckptio_dcp_meta m;
  ckptio_source **sub;    /* one plain source per file of m.files */
  ckptio_spart **parts;   /* [item]: its chunks as parts, or NULL when stored whole */
  size_t *local;          /* [item]: stored whole: its entry in sub[file[item]] */
  uint32_t *file;
} dcp;

#define D(src) ((dcp *)(src))

/* A chunk or byte item while the files' indexes are built. */
typedef struct stored {
  size_t item, chunk;     /* chunk SIZE_MAX: the item's bytes */
  ckptio_entry e;         /* its entry, absolute offsets */
} stored;

static int cmp_stored(const void *a, const void *b) {
  const stored *x = a, *y = b;
  return x->e.offset != y->e.offset ? (x->e.offset < y->e.offset ? -1 : 1) : strcmp(x->e.name, y->e.name);
}

static int whole(const ckptio_dcp_item *it) {
  return it->is_bytes ||
         (it->nchunks == 1 && !memcmp(it->chunks[0].sizes, it->shape, (size_t)it->ndim * sizeof(int64_t)));
}

/* ------------------------------------------------------------ open */

static int read_metadata(dcp *x, const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC), rc = 0;
  struct stat st;
  uint8_t *buf = NULL;
  if (fd < 0 || fstat(fd, &st) < 0) {
    int e = errno;
    if (fd >= 0) close(fd);
    return ckptio_fail(x->s.err, -e, "%s: %s", path, ckptio_errno_text(e));
  }
  char msg[CKPTIO_ERRLEN];
  if (!S_ISREG(st.st_mode)) {
    rc = ckptio_fail(x->s.err, CKPTIO_E_SHARD, "%s: not a regular file", path);
  } else if ((uint64_t)st.st_size > DCP_META_MAX) {
    rc = ckptio_fail(x->s.err, CKPTIO_E_SHARD, "%s: %llu bytes, over the %llu-byte limit of a .metadata", path,
                     (unsigned long long)st.st_size, DCP_META_MAX);
  } else if (!(buf = malloc((size_t)st.st_size + 1))) {
    rc = -ENOMEM;
  } else if ((rc = ckptio_pread_full(fd, buf, (size_t)st.st_size, 0)) < 0) {
    ckptio_fail(x->s.err, rc, "%s: reading it: %s", path, ckptio_strerror(rc));
  } else if ((rc = ckptio_dcp_meta_parse(buf, (size_t)st.st_size, &x->m, msg, sizeof(msg))) < 0) {
    ckptio_fail(x->s.err, rc, "%s: %s", x->dir, msg);
  }
  free(buf);
  close(fd);
  return rc;
}

/* The chunk's archive, parsed within [offset, offset + length) of the
 * file: one bare tensor of the item's dtype and the chunk's sizes. */
static int chunk_entry(dcp *x, const ckptio_rfile *f, int inflated, const ckptio_dcp_item *it, size_t c, stored *out) {
  const ckptio_dcp_chunk *ch = &it->chunks[c];
  const char *fname = x->m.files[ch->at.file];
  char a[256], msg[CKPTIO_ERRLEN];
  ckptio_dcp_dims_text(ch->offsets, it->ndim, a, sizeof(a));
  ckptio_index idx;
  int rc = ckptio_torch_parse(f->map + ch->at.offset, ch->at.length, &idx, msg, sizeof(msg));
  if (rc < 0)
    return ckptio_fail(x->s.err, rc, "%s: chunk %s of '%s' (bytes %llu-%llu of '%s'%s): %s", x->dir, a, it->name,
                       (unsigned long long)ch->at.offset, (unsigned long long)(ch->at.offset + ch->at.length), fname,
                       inflated ? " decompressed" : "", msg);
  const ckptio_entry *e = idx.count == 1 ? &idx.entries[0] : NULL;
  if (!e || e->name[0]) {
    rc = ckptio_fail(x->s.err, CKPTIO_E_SHARD,
                     "%s: chunk %s of '%s' in '%s' is not the torch.save of one tensor "
                     "(%zu tensors, the first named '%s')",
                     x->dir, a, it->name, fname, idx.count, idx.count ? idx.entries[0].name : "");
  } else if (e->dtype != it->dtype || e->ndim != it->ndim ||
             memcmp(e->shape, ch->sizes, (size_t)it->ndim * sizeof(int64_t))) {
    char b[256], s[256];
    ckptio_dcp_dims_text(e->shape, e->ndim, b, sizeof(b));
    ckptio_dcp_dims_text(ch->sizes, it->ndim, s, sizeof(s));
    rc = ckptio_fail(x->s.err, CKPTIO_E_SHARD,
                     "%s: chunk %s of '%s' in '%s' holds a %s tensor of shape %s; the "
                     ".metadata says %s %s",
                     x->dir, a, it->name, fname, ckptio_dtype_name(e->dtype), b, ckptio_dtype_name(it->dtype), s);
  } else {
    out->e = *e;
    out->e.offset += ch->at.offset;
    char name[CKPTIO_ERRLEN];
    snprintf(name, sizeof(name), "%s@%s", it->name, a);
    if (!(out->e.name = strdup(name))) rc = -ENOMEM;
  }
  ckptio_index_free(&idx);
  return rc;
}

/* ------------------------------------------------------------ zstd */

/* A zstd-compressed storage decompresses to at most this beyond a chunk's
 * tensor bytes (its torch.save archive's records and directory), and a
 * byte item to at most CKPTIO_DCP_ZSTD_MAX_BYTES: a zstd bomb stops there. */
#define ZSTD_ARCHIVE_SLACK (1u << 20)
#define CKPTIO_DCP_ZSTD_MAX_BYTES (1ull << 30)

static int out_of_range(dcp *x, uint32_t k, const ckptio_dcp_item *it, const ckptio_dcp_storage *at, uint64_t size) {
  return ckptio_fail(x->s.err, CKPTIO_E_SHARD, "%s: '%s' is stored at bytes %llu-%llu of '%s', which has %llu", x->dir,
                     it->name, (unsigned long long)at->offset, (unsigned long long)(at->offset + at->length),
                     x->m.files[k], (unsigned long long)size);
}

/* Writes the zstd stream in[0, len) to fd at pos, decompressed: at most
 * max bytes. @return the bytes written, or a code (message set). */
static int64_t inflate_to(dcp *x, ZSTD_DCtx *d, int fd, uint64_t pos, const uint8_t *in, uint64_t len, uint64_t max,
                          const char *name, unsigned char *buf, size_t cap) {
  ZSTD_inBuffer ib = {in, (size_t)len, 0};
  uint64_t total = 0;
  size_t ret = 1;
  ZSTD_DCtx_reset(d, ZSTD_reset_session_only);
  while (ib.pos < ib.size || ret != 0) {
    ZSTD_outBuffer ob = {buf, cap, 0};
    size_t before = ib.pos;
    ret = ZSTD_decompressStream(d, &ob, &ib);
    if (ZSTD_isError(ret))
      return ckptio_fail(x->s.err, CKPTIO_E_ZSTD, "%s: '%s': its zstd stream is corrupt: %s", x->dir, name,
                         ZSTD_getErrorName(ret));
    if (ob.pos == 0 && ib.pos == before)
      return ckptio_fail(x->s.err, CKPTIO_E_ZSTD, "%s: '%s': its zstd stream ends inside a frame", x->dir, name);
    if (total + ob.pos > max)
      return ckptio_fail(x->s.err, CKPTIO_E_ZSTD,
                         "%s: '%s' decompresses to more than %llu bytes, more than it can hold", x->dir, name,
                         (unsigned long long)max);
    int rc = ckptio_pwrite_full(fd, buf, ob.pos, pos + total);
    if (rc < 0) return ckptio_fail(x->s.err, rc, "%s: decompressing '%s': %s", x->dir, name, ckptio_strerror(rc));
    total += ob.pos;
  }
  return (int64_t)total;
}

/* A file whose chunks went through DCP's zstd stream extension: every
 * storage of file k is written, decompressed (or copied when it was not
 * compressed), to an anonymous memory file that *f then stands for, and
 * the storages are moved to their place there. The decompressed bytes stay
 * in memory while the reader is open. */
static int inflate_file(dcp *x, uint32_t k, ckptio_rfile *f) {
  int fd = memfd_create("ckptio-dcp", MFD_CLOEXEC), rc = 0;
  size_t cap = 1u << 20;
  unsigned char *buf = malloc(cap);
  ZSTD_DCtx *d = ZSTD_createDCtx();
  uint64_t pos = 0;
  if (fd < 0)
    rc = ckptio_fail(x->s.err, -errno, "%s: a memory file for '%s': %s", x->dir, x->m.files[k],
                     ckptio_errno_text(errno));
  else if (!buf || !d) rc = -ENOMEM;
  for (size_t i = 0; i < x->m.nitems && rc == 0; i++) {
    ckptio_dcp_item *it = &x->m.items[i];
    for (size_t c = 0; c < (it->is_bytes ? 1 : it->nchunks) && rc == 0; c++) {
      ckptio_dcp_storage *at = it->is_bytes ? &it->bytes : &it->chunks[c].at;
      if (at->file != k) continue;
      if (at->offset > f->size || at->length > f->size - at->offset) {
        rc = out_of_range(x, k, it, at, f->size);
        break;
      }
      uint64_t max = CKPTIO_DCP_ZSTD_MAX_BYTES;
      if (!it->is_bytes) max = (uint64_t)ckptio_tensor_nbytes(it->dtype, it->ndim, it->chunks[c].sizes) + ZSTD_ARCHIVE_SLACK;
      int64_t got = at->length;
      if (at->zstd) {
        got = inflate_to(x, d, fd, pos, f->map + at->offset, at->length, max, it->name, buf, cap);
      } else if ((rc = ckptio_pwrite_full(fd, f->map + at->offset, (size_t)at->length, pos)) < 0) {
        got = ckptio_fail(x->s.err, rc, "%s: copying '%s' to memory: %s", x->dir, it->name, ckptio_strerror(rc));
      }
      if (got < 0) {
        rc = (int)got;
        break;
      }
      at->offset = pos, at->length = (uint64_t)got, at->zstd = 0;
      pos += (uint64_t)got;
    }
  }
  ZSTD_freeDCtx(d);
  free(buf);
  if (rc == 0) {
    char proc[64], *real = f->path;
    snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
    ckptio_rfile m;
    f->path = NULL;
    if ((rc = ckptio_rfile_open(&m, proc, x->s.err, CKPTIO_ERRLEN)) == 0) {
      free(m.path);
      m.path = real; /* messages name the .distcp file */
      real = NULL;
      ckptio_rfile_close(f);
      *f = m;
    } else {
      f->path = real; /* still f's: the caller's close frees it */
      real = NULL;
    }
    free(real);
  }
  if (fd >= 0) close(fd);
  return rc;
}

static int any_zstd(const dcp *x, uint32_t k) {
  for (size_t i = 0; i < x->m.nitems; i++) {
    const ckptio_dcp_item *it = &x->m.items[i];
    for (size_t c = 0; c < (it->is_bytes ? 1 : it->nchunks); c++) {
      const ckptio_dcp_storage *at = it->is_bytes ? &it->bytes : &it->chunks[c].at;
      if (at->file == k && at->zstd) return 1;
    }
  }
  return 0;
}

/* ------------------------------------------------------------ files */

/* File k: its chunks and byte items into the index of a plain source. */
static int open_file(dcp *x, uint32_t k) {
  char *path = ckptio_path_join(x->dir, x->m.files[k]);
  ckptio_rfile f;
  stored *st = NULL;
  size_t n = 0, cap = 0;
  int rc;
  if (!path) return -ENOMEM;
  rc = ckptio_rfile_open(&f, path, x->s.err, CKPTIO_ERRLEN);
  free(path);
  if (rc < 0) return rc;
  int inflated = any_zstd(x, k);
  if (inflated && (rc = inflate_file(x, k, &f)) < 0) {
    ckptio_rfile_close(&f);
    return rc;
  }
  ckptio_rfile_scattered(&f, 1);
  for (size_t i = 0; i < x->m.nitems && rc == 0; i++) {
    const ckptio_dcp_item *it = &x->m.items[i];
    for (size_t c = 0; c < (it->is_bytes ? 1 : it->nchunks) && rc == 0; c++) {
      const ckptio_dcp_storage *at = it->is_bytes ? &it->bytes : &it->chunks[c].at;
      if (at->file != k) continue;
      if (at->offset > f.size || at->length > f.size - at->offset) {
        rc = out_of_range(x, k, it, at, f.size);
        break;
      }
      if (n == cap) {
        stored *g = realloc(st, (cap = cap ? 2 * cap : 16) * sizeof(*st));
        if (!g) {
          rc = -ENOMEM;
          break;
        }
        st = g;
      }
      memset(&st[n], 0, sizeof(st[n]));
      st[n].item = i;
      st[n].chunk = it->is_bytes ? SIZE_MAX : c;
      if (it->is_bytes) {
        if (asprintf(&st[n].e.name, "%s%s", CKPTIO_DCP_BYTES_PREFIX, it->name) < 0)
          st[n].e.name = NULL, rc = -ENOMEM;
        st[n].e.dtype = CKPTIO_U8;
        st[n].e.ndim = 1;
        st[n].e.shape[0] = (int64_t)at->length;
        st[n].e.offset = at->offset;
        st[n].e.nbytes = at->length;
      } else {
        rc = chunk_entry(x, &f, inflated, it, c, &st[n]);
      }
      n += rc == 0;
    }
  }
  ckptio_rfile_scattered(&f, 0);
  ckptio_index idx;
  memset(&idx, 0, sizeof(idx));
  if (rc == 0 && !(idx.entries = calloc(n + 1, sizeof(ckptio_entry)))) rc = -ENOMEM;
  if (rc < 0) {
    for (size_t j = 0; j < n; j++) free(st[j].e.name);
    free(st);
    ckptio_rfile_close(&f);
    return rc;
  }
  if (n) qsort(st, n, sizeof(*st), cmp_stored);
  for (size_t j = 0; j < n; j++) {
    idx.entries[j] = st[j].e;
    size_t i = st[j].item;
    if (whole(&x->m.items[i])) x->local[i] = j;
    else x->parts[i][st[j].chunk].local = j;
  }
  idx.count = n;
  idx.format = CKPTIO_INDEX_PYTORCH;
  idx.header_bytes = n ? idx.entries[0].offset : f.size;
  free(st);
  if ((rc = ckptio_plain_with_index(x->s.ctx, x->s.opts, &f, &idx, x->s.err, &x->sub[k])) < 0) return rc;
  for (size_t i = 0; i < x->m.nitems; i++)
    if (x->parts[i])
      for (size_t c = 0; c < x->m.items[i].nchunks; c++)
        if (x->m.items[i].chunks[c].at.file == k) x->parts[i][c].src = x->sub[k];
  return 0;
}

/* The checkpoint's index: one entry per item, in name order. A tensor
 * stored whole is its chunk's entry under the item's name. */
static int build(dcp *x) {
  size_t n = x->m.nitems;
  ckptio_index *idx = &x->s.idx;
  if (!(x->sub = calloc(x->m.nfiles + 1, sizeof(*x->sub))) || !(x->parts = calloc(n + 1, sizeof(*x->parts))) ||
      !(x->local = calloc(n + 1, sizeof(size_t))) || !(x->file = calloc(n + 1, sizeof(uint32_t))) ||
      !(idx->entries = calloc(n + 1, sizeof(ckptio_entry))))
    return -ENOMEM;
  size_t plen = strlen(CKPTIO_DCP_BYTES_PREFIX);
  for (size_t i = 0; i < n; i++) {
    const ckptio_dcp_item *it = &x->m.items[i];
    if (!it->is_bytes && !strncmp(it->name, CKPTIO_DCP_BYTES_PREFIX, plen))
      return ckptio_fail(x->s.err, CKPTIO_E_SHARD,
                         "%s: tensor '%s' has a name that starts with '%s', which names "
                         "byte items here",
                         x->dir, it->name, CKPTIO_DCP_BYTES_PREFIX);
    x->file[i] = it->is_bytes ? it->bytes.file : it->chunks[0].at.file;
    if (whole(it)) continue;
    if (!(x->parts[i] = calloc(it->nchunks, sizeof(ckptio_spart)))) return -ENOMEM;
    for (size_t c = 0; c < it->nchunks; c++) memcpy(x->parts[i][c].off, it->chunks[c].offsets, sizeof(x->parts[i][c].off));
  }
  x->s.nfiles = x->m.nfiles;
  for (uint32_t k = 0; k < x->m.nfiles; k++) {
    int rc = open_file(x, k);
    if (rc < 0) return rc;
  }
  for (size_t i = 0; i < n; i++) {
    const ckptio_dcp_item *it = &x->m.items[i];
    ckptio_entry *e = &idx->entries[i];
    if (whole(it)) {
      *e = x->sub[x->file[i]]->idx.entries[x->local[i]];
      if (it->is_bytes) continue; /* named by its member entry, with the prefix */
    } else {
      e->dtype = it->dtype;
      e->ndim = it->ndim;
      memcpy(e->shape, it->shape, sizeof(e->shape));
      e->nbytes = (uint64_t)ckptio_tensor_nbytes(it->dtype, it->ndim, it->shape); /* checked by the parser */
    }
    e->name = it->name;
  }
  idx->count = n;
  idx->format = CKPTIO_INDEX_DCP;
  for (uint32_t k = 0; k < x->m.nfiles; k++) idx->header_bytes += x->sub[k]->idx.header_bytes;
  return 0;
}

/* ------------------------------------------------------------ verbs */

static ckptio_source *dcp_member(ckptio_source *s, size_t index, size_t *local, size_t *k) {
  dcp *x = D(s);
  if (x->parts[index]) {
    *local = x->parts[index][0].local;
    if (k) *k = x->m.items[index].chunks[0].at.file;
    return x->parts[index][0].src;
  }
  *local = x->local[index];
  if (k) *k = x->file[index];
  return x->sub[x->file[index]];
}

static size_t dcp_parts(ckptio_source *s, size_t index, const ckptio_spart **out) {
  dcp *x = D(s);
  if (!x->parts[index]) return 0;
  *out = x->parts[index];
  return x->m.items[index].nchunks;
}

static int dcp_view(ckptio_source *s, size_t index, const void **data, uint64_t *nbytes) {
  dcp *x = D(s);
  return ckptio_source_view_of_member(s, index, x->parts[index] ? x->m.items[index].nchunks : 0, "chunks", data,
                                      nbytes);
}

static ckptio_source *dcp_file(ckptio_source *s, size_t k) { return k < D(s)->m.nfiles ? D(s)->sub[k] : NULL; }

static void dcp_close(ckptio_source *s) {
  dcp *x = D(s);
  for (size_t k = 0; x->sub && k < x->m.nfiles; k++) ckptio_source_close(x->sub[k]);
  for (size_t i = 0; x->parts && i < x->m.nitems; i++) free(x->parts[i]);
  free(x->parts);
  free(x->sub);
  free(x->local);
  free(x->file);
  free(s->idx.entries); /* names are the metadata's, a byte item's its file's entry's */
  ckptio_dcp_meta_free(&x->m);
  free(x->dir);
}

static const ckptio_source_ops dcp_ops = {
    .noun = "DCP checkpoint",
    .view = dcp_view,
    .ranges = ckptio_source_ranges_of_member,
    .member = dcp_member,
    .parts = dcp_parts,
    .file = dcp_file,
    .close = dcp_close,
};

int ckptio_dcp_open(ckptio_ctx *ctx, const ckptio_options *opts, const char *path, char *err, ckptio_source **out) {
  struct stat st;
  char *dir, *meta;
  size_t n = strlen(path), m = strlen(CKPTIO_DCP_METADATA_FILE);
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
    if (!(meta = ckptio_path_join(path, CKPTIO_DCP_METADATA_FILE))) return -ENOMEM;
    if (access(meta, F_OK) != 0) {
      free(meta);
      return 0;
    }
    dir = strdup(path);
    for (size_t l = dir ? strlen(dir) : 0; l > 1 && dir[l - 1] == '/'; l--) dir[l - 1] = '\0'; /* "ckpt/" names ckpt */
  } else if (n >= m && !strcmp(path + n - m, CKPTIO_DCP_METADATA_FILE) && (n == m || path[n - m - 1] == '/')) {
    meta = strdup(path);
    dir = n == m ? strdup(".") : strndup(path, n - m - 1 ? n - m - 1 : 1);
  } else {
    return 0;
  }
  dcp *x = calloc(1, sizeof(*x));
  int rc = x && dir && meta ? 0 : -ENOMEM;
  if (rc == 0) rc = ckptio_source_init(&x->s, &dcp_ops, ctx, opts, dir, err);
  if (rc == 0) {
    x->dir = dir;
    dir = NULL;
    if ((rc = read_metadata(x, meta)) == 0) rc = build(x);
  }
  free(meta);
  free(dir);
  if (rc < 0) {
    if (rc == -ENOMEM && !err[0]) ckptio_err_fmt(err, CKPTIO_ERRLEN, rc, "%s: out of memory opening the checkpoint", path);
    if (x && x->s.ops) ckptio_source_close(&x->s);
    else free(x);
    return rc;
  }
  *out = &x->s;
  return 1;
}
