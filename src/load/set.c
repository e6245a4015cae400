/* The set source: a Hugging Face sharded checkpoint opened as one. The
 * index (formats/hf_index.c) is read, every shard is opened as a file
 * source of its own, the index and the shards are cross-checked, and one
 * merged index over all shards answers for the set. A set holds its members
 * by the source table and plans nothing itself: the reader resolves each
 * request to its member, and the executor runs every member's jobs in one
 * load on the pool. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "formats/hf_index.h"
#include "io/file.h"
#include "io/publish.h"
#include "load/source.h"

typedef struct set {
  ckptio_source s;
  char *dir;
  ckptio_hf_index hf;
  char **paths;           /* dir/file, owned */
  ckptio_source **sub;    /* one file source per shard */
  size_t *base;           /* [k]: merged index of shard k's first whole tensor */
  size_t *local;          /* [merged index]: the tensor's index in its shard (whole tensors) */
  size_t nwhole;          /* merged indices [0, nwhole) are whole, then the split ones */
  ckptio_spart **parts;   /* [j]: split tensor j's parts (hf.split[j]'s order) */
} set;

#define S(src) ((set *)(src))

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* What a directory (or a storage's prefix) holds: its indexes and its
 * safetensors files, the first of each kept, every one named for the
 * error. */
typedef struct picks {
  char found[CKPTIO_ERRLEN];
  size_t nidx, nst, used;
  char *idx, *st;
  const char *under; /* a storage's listing: "dir/", whose direct children count */
} picks;

static void pick(picks *p, const char *name) {
  if (name[0] == '.') return; /* ., .., and our own temp files */
  int i = ends_with(name, ".safetensors.index.json"), s = ends_with(name, ".safetensors");
  if (!i && !s) return;
  char **slot = i ? &p->idx : &p->st;
  if (i ? p->nidx++ == 0 : p->nst++ == 0) *slot = strdup(name);
  if (p->used < sizeof(p->found) - 1)
    p->used += (size_t)snprintf(p->found + p->used, sizeof(p->found) - p->used, "%s'%s'", p->used ? ", " : "", name);
}

static int pick_listed(void *arg, const char *path, uint64_t size) {
  picks *p = arg;
  size_t n = strlen(p->under);
  (void)size;
  if (!strncmp(path, p->under, n) && !strchr(path + n, '/')) pick(p, path + n);
  return 0;
}

/* The directory's one index, else its one safetensors file, as *picked. */
static int picked_of(picks *p, const char *dir, char *err, char **picked, int *is_index) {
  int rc = 0;
  if ((p->nidx && !p->idx) || (!p->nidx && p->nst && !p->st)) {
    rc = -ENOMEM;
  } else if (p->nidx > 1 || (p->nidx == 0 && p->nst != 1)) {
    rc = ckptio_err_fmt(err, CKPTIO_ERRLEN, CKPTIO_E_SHARD,
                        "%s: a directory must hold exactly one *.safetensors.index.json, or else exactly one "
                        "*.safetensors; found %s",
                        dir, p->used ? p->found : "neither");
  } else if (!(*picked = ckptio_path_join(dir, p->nidx ? p->idx : p->st))) {
    rc = -ENOMEM;
  } else {
    *is_index = p->nidx == 1;
  }
  free(p->idx);
  free(p->st);
  return rc;
}

static int pick_in_dir(const char *dir, char *err, char **picked, int *is_index) {
  DIR *d = opendir(dir);
  if (!d) return ckptio_err_fmt(err, CKPTIO_ERRLEN, -errno, "%s: %s", dir, ckptio_errno_text(errno));
  picks p = {0};
  struct dirent *e;
  while ((e = readdir(d))) pick(&p, e->d_name);
  closedir(d);
  return picked_of(&p, dir, err, picked, is_index);
}

/* A storage's path that names no file of a checkpoint (no .safetensors or
 * .json ending) and has objects under it as a directory would: its one
 * index, else its one safetensors file, as in a directory. @return 1 and
 * *picked, 0 when nothing is under it (the path is then opened as an
 * object), or a code. */
static int pick_in_prefix(const ckptio_storage *st, const char *dir, char *err, char **picked, int *is_index) {
  if (ends_with(dir, ".safetensors") || ends_with(dir, ".json") || !st->ops.list) return 0;
  picks p = {0};
  size_t n = strlen(dir);
  char *under = malloc(n + 2);
  if (!under) return -ENOMEM;
  snprintf(under, n + 2, "%s%s", dir, n && dir[n - 1] == '/' ? "" : "/");
  p.under = under;
  int rc = st->ops.list(st->self, under, pick_listed, &p, err, CKPTIO_ERRLEN);
  free(under);
  if (rc < 0 || (!p.nidx && !p.nst)) {
    free(p.idx);
    free(p.st);
    return rc < 0 ? rc : 0;
  }
  return (rc = picked_of(&p, dir, err, picked, is_index)) < 0 ? rc : 1;
}

/* The index file's bytes, bounded: a local file or an object. */
static int read_index(ckptio_source *s, uint8_t **buf, size_t *len) {
  ckptio_rfile f;
  char why[CKPTIO_ERRLEN] = "";
  int rc = ckptio_rfile_open_path(s->ctx, &f, s->path, why);
  if (rc < 0) return ckptio_fail(s->err, rc, "%s", why);
  if (f.size > CKPTIO_HF_INDEX_MAX) {
    rc = ckptio_fail(s->err, CKPTIO_E_SHARD, "%s: index of %llu bytes is larger than the %u-byte limit", s->path,
                     (unsigned long long)f.size, CKPTIO_HF_INDEX_MAX);
  } else if (!(*buf = malloc((size_t)f.size + 1))) {
    rc = -ENOMEM;
  } else if ((rc = ckptio_rfile_pread(&f, *buf, (size_t)f.size, 0, why, sizeof(why))) < 0) {
    ckptio_fail(s->err, rc, "%s: reading the index: %s", s->path, why[0] ? why : ckptio_strerror(rc));
  }
  *len = (size_t)f.size;
  ckptio_rfile_close(&f);
  return rc;
}

static int parse_index(set *x) {
  uint8_t *buf = NULL;
  size_t len = 0;
  int rc = read_index(&x->s, &buf, &len);
  if (rc == 0 && (rc = ckptio_hf_index_parse(buf, len, &x->hf)) < 0) {
    if (x->hf.err[0])
      ckptio_fail(x->s.err, rc, "%s: %s", x->s.path, x->hf.err);
    else if (rc == -ENOMEM)
      ckptio_fail(x->s.err, rc, "%s: out of memory reading the index", x->s.path);
  }
  free(buf);
  return rc;
}

static int open_shards(set *x) {
  size_t n = x->hf.nfiles;
  if (!(x->sub = calloc(n, sizeof(*x->sub))) || !(x->paths = calloc(n, sizeof(char *)))) return -ENOMEM;
  x->s.nfiles = n;
  for (size_t k = 0; k < n; k++) {
    char msg[CKPTIO_ERRLEN] = "";
    if (!(x->paths[k] = ckptio_path_join(x->dir, x->hf.files[k]))) return -ENOMEM;
    int rc = ckptio_source_open_file(x->s.ctx, x->s.opts, x->paths[k], msg, &x->sub[k]);
    if (rc < 0) {
      /* The member's message begins with its path, which "shard '<name>'"
       * already says (the name is the path under the index's directory). */
      size_t at = strlen(x->paths[k]);
      const char *why = msg[0] ? msg : ckptio_strerror(rc);
      if (!strncmp(msg, x->paths[k], at) && !strncmp(msg + at, ": ", 2)) why = msg + at + 2;
      return ckptio_fail(x->s.err, rc, "%s: shard '%s': %s", x->s.path, x->hf.files[k], why);
    }
    x->sub[k]->err = x->s.err; /* a member's failures are the set's */
    if (x->sub[k]->idx.format != CKPTIO_INDEX_SAFETENSORS)
      return ckptio_fail(x->s.err, CKPTIO_E_SHARD, "%s: shard '%s' is a %s file, not safetensors", x->s.path,
                         x->hf.files[k], ckptio_index_format_name(x->sub[k]->idx.format));
  }
  return 0;
}

static const char *meta_get(const ckptio_index *idx, const char *key) {
  for (size_t i = 0; i < idx->meta_count; i++)
    if (strcmp(idx->meta[i].key, key) == 0) return idx->meta[i].value;
  return NULL;
}

typedef struct named {
  const char *name;
  size_t file;
} named;

static int cmp_named(const void *a, const void *b) {
  return strcmp(((const named *)a)->name, ((const named *)b)->name);
}

/* Whether shard k holds a tensor of this name (all, sorted by name). */
static int holds(const named *all, size_t n, const char *name, size_t k) {
  named key = {name, 0};
  const named *hit = bsearch(&key, all, n, sizeof(*all), cmp_named);
  if (!hit) return 0;
  while (hit > all && !strcmp(hit[-1].name, name)) hit--;
  for (; hit < all + n && !strcmp(hit->name, name); hit++)
    if (hit->file == k) return 1;
  return 0;
}

static void dims_text(const int64_t *v, int n, char *buf, size_t len) {
  size_t at = (size_t)snprintf(buf, len, "[");
  for (int d = 0; d < n && at < len; d++) at += (size_t)snprintf(buf + at, len - at, d ? ", %lld" : "%lld", (long long)v[d]);
  if (at < len) snprintf(buf + at, len - at, "]");
}

/* A file's entry named as a split tensor must be the part the index places
 * in that file: the tensor's dtype, the part's shape. */
static int check_part_entry(set *x, const ckptio_split_tensor *sp, size_t k, const ckptio_entry *e) {
  const ckptio_split_part *p = NULL;
  for (size_t i = 0; i < sp->nparts && !p; i++)
    if (sp->parts[i].file == k) p = &sp->parts[i];
  char a[256], b[256];
  if (!p)
    return ckptio_fail(x->s.err, CKPTIO_E_SHARD, "%s: file '%s' holds tensor '%s', but no part of it is placed there",
                       x->s.path, x->hf.files[k], e->name);
  dims_text(p->offsets, sp->ndim, a, sizeof(a));
  if (e->dtype != sp->dtype || e->ndim != sp->ndim || memcmp(e->shape, p->shape, (size_t)sp->ndim * sizeof(int64_t))) {
    dims_text(e->shape, e->ndim, b, sizeof(b));
    char c[256];
    dims_text(p->shape, sp->ndim, c, sizeof(c));
    return ckptio_fail(x->s.err, CKPTIO_E_SHARD,
                       "%s: part %s of '%s' in file '%s' is %s %s there, the index says %s %s", x->s.path, a, sp->name,
                       x->hf.files[k], ckptio_dtype_name(e->dtype) ? ckptio_dtype_name(e->dtype) : "?", b,
                       ckptio_dtype_name(sp->dtype) ? ckptio_dtype_name(sp->dtype) : "?", c);
  }
  return 0;
}

/* Every part of every split tensor is in its file. */
static int parts_present(set *x, const named *all, size_t n) {
  for (size_t j = 0; j < x->hf.nsplit; j++) {
    const ckptio_split_tensor *sp = &x->hf.split[j];
    for (size_t i = 0; i < sp->nparts; i++)
      if (!holds(all, n, sp->name, sp->parts[i].file)) {
        char a[256];
        dims_text(sp->parts[i].offsets, sp->ndim, a, sizeof(a));
        return ckptio_fail(x->s.err, CKPTIO_E_SHARD,
                           "%s: part %s of '%s' is placed in file '%s', which does not hold it", x->s.path, a, sp->name,
                           x->hf.files[sp->parts[i].file]);
      }
  }
  return 0;
}

/* A save killed between its swaps leaves shards of the new save under the
 * names the old index lists, and the old shards, which that index names, in
 * the hidden temp files they were exchanged into (io/publish.c). Reading
 * those keeps the old checkpoint whole until a later save publishes: the
 * temp file of this shard that carries the index's save id stands in for
 * it. Nothing is renamed here; a reader never changes the directory.
 * @return 1 when one was found (sub[k] replaced), 0 when none, or -ENOMEM. */
static int old_shard_in_temp(set *x, size_t k, const char *id, const char *want_tag) {
  char prefix[4096];
  int n = snprintf(prefix, sizeof(prefix), ".%s.ckptio-tmp-", x->hf.files[k]);
  DIR *d = opendir(x->dir);
  struct dirent *e;
  int found = 0;
  while (d && !found && (e = readdir(d))) {
    if (n <= 0 || (size_t)n >= sizeof(prefix) || strncmp(e->d_name, prefix, (size_t)n)) continue;
    char msg[CKPTIO_ERRLEN] = "", *p = ckptio_path_join(x->dir, e->d_name);
    ckptio_source *c = NULL;
    if (!p) {
      found = -ENOMEM;
      break;
    }
    if (ckptio_source_open_file(x->s.ctx, x->s.opts, p, msg, &c) == 0) {
      const char *sid = meta_get(&c->idx, "ckptio.save_id"), *tag = meta_get(&c->idx, "ckptio.shard");
      if (sid && !strcmp(sid, id) && tag && !strcmp(tag, want_tag) && c->idx.format == CKPTIO_INDEX_SAFETENSORS) {
        ckptio_source_close(x->sub[k]);
        free(x->paths[k]);
        x->sub[k] = c, x->paths[k] = p, c->err = x->s.err;
        found = 1;
        continue;
      }
      ckptio_source_close(c);
    }
    free(p);
  }
  if (d) closedir(d);
  return found;
}

/* Every shard carries the index's save id and its place "k/N", or its old
 * bytes are found where an interrupted save left them (above). */
static int check_save_ids(set *x) {
  const ckptio_hf_index *hf = &x->hf;
  const char *id = NULL;
  for (size_t i = 0; i < hf->nindex_meta; i++)
    if (!strcmp(hf->index_meta[i].key, "ckptio.save_id")) id = hf->index_meta[i].value;
  for (size_t k = 0; id && k < hf->nfiles; k++) {
    const char *sid = meta_get(&x->sub[k]->idx, "ckptio.save_id");
    const char *tag = meta_get(&x->sub[k]->idx, "ckptio.shard");
    char want_tag[64];
    snprintf(want_tag, sizeof(want_tag), "%zu/%zu", k + 1, hf->nfiles);
    if (sid && !strcmp(sid, id) && tag && !strcmp(tag, want_tag)) continue;
    int rc = old_shard_in_temp(x, k, id, want_tag);
    if (rc < 0) return rc;
    if (rc == 1) continue;
    if (!sid || strcmp(sid, id))
      return ckptio_fail(x->s.err, CKPTIO_E_SHARD,
                         "%s: shard '%s' belongs to another save (save id %s, the index says %s): a save was "
                         "interrupted while publishing, or files of two saves are mixed",
                         x->s.path, hf->files[k], sid ? sid : "missing", id);
    return ckptio_fail(x->s.err, CKPTIO_E_SHARD, "%s: shard '%s' says it is shard %s, the index makes it %s", x->s.path,
                       hf->files[k], tag ? tag : "(missing)", want_tag);
  }
  return 0;
}

/* Every mapped tensor is in its file, every part in its file, and every
 * tensor of every file is mapped to that file or is a part placed there (so
 * none sits in two shards). */
static int cross_check(set *x) {
  const ckptio_hf_index *hf = &x->hf;
  const char *path = x->s.path;
  int rc = check_save_ids(x); /* first: which file stands for each shard */
  if (rc < 0) return rc;
  size_t n = 0;
  for (size_t k = 0; k < hf->nfiles; k++) n += x->sub[k]->idx.count;
  named *all = calloc(n + 1, sizeof(*all));
  if (!all) return -ENOMEM;
  n = 0;
  for (size_t k = 0; k < hf->nfiles; k++)
    for (size_t t = 0; t < x->sub[k]->idx.count; t++) all[n++] = (named){x->sub[k]->idx.entries[t].name, k};
  if (n) qsort(all, n, sizeof(*all), cmp_named);
  for (size_t i = 0; i < hf->nmap && rc == 0; i++) {
    const ckptio_hf_entry *e = &hf->map[i];
    if (!holds(all, n, e->tensor, e->file))
      rc = ckptio_fail(x->s.err, CKPTIO_E_SHARD, "%s: tensor '%s' is mapped to shard '%s', which does not hold it",
                       path, e->tensor, hf->files[e->file]);
  }
  if (rc == 0) rc = parts_present(x, all, n);
  free(all);
  for (size_t k = 0; k < hf->nfiles && rc == 0; k++) {
    const ckptio_index *ix = &x->sub[k]->idx;
    for (size_t t = 0; t < ix->count && rc == 0; t++) {
      const ckptio_hf_entry *e = ckptio_hf_index_find(hf, ix->entries[t].name);
      const ckptio_split_tensor *sp = e ? NULL : ckptio_hf_index_find_split(hf, ix->entries[t].name);
      if (sp) {
        rc = check_part_entry(x, sp, k, &ix->entries[t]);
      } else if (!e)
        rc = ckptio_fail(x->s.err, CKPTIO_E_SHARD, "%s: tensor '%s' of shard '%s' is not in the index's weight_map",
                         path, ix->entries[t].name, hf->files[k]);
      else if (e->file != k)
        rc = ckptio_fail(x->s.err, CKPTIO_E_SHARD, "%s: tensor '%s' is in shard '%s' but the index maps it to '%s'",
                         path, ix->entries[t].name, hf->files[k], hf->files[e->file]);
    }
  }
  if (rc < 0) return rc;
  return 0;
}

typedef struct meta_ref {
  const ckptio_meta *m;
  size_t seq;
} meta_ref;

static int cmp_meta_key(const void *a, const void *b) {
  const meta_ref *x = a, *y = b;
  int c = strcmp(x->m->key, y->m->key);
  return c ? c : (x->seq > y->seq) - (x->seq < y->seq);
}
static int cmp_meta_seq(const void *a, const void *b) {
  const meta_ref *x = a, *y = b;
  return (x->seq > y->seq) - (x->seq < y->seq);
}

/* The merged index: shard order, then each shard's file order; names and
 * metadata strings stay owned by the shards and the index. The index's
 * metadata comes first; a key's first value wins. */
static int merge(set *x) {
  ckptio_index *idx = &x->s.idx;
  size_t total = 0, nf = x->hf.nfiles, nmeta = x->hf.nindex_meta;
  if (!(x->base = calloc(nf + 1, sizeof(size_t)))) return -ENOMEM;
  for (size_t k = 0; k < nf; k++) {
    x->base[k] = total;
    for (size_t t = 0; t < x->sub[k]->idx.count; t++) total += !ckptio_hf_index_find_split(&x->hf, x->sub[k]->idx.entries[t].name);
    nmeta += x->sub[k]->idx.meta_count;
    idx->header_bytes += x->sub[k]->idx.header_bytes;
  }
  x->base[nf] = x->nwhole = total;
  if (!(idx->entries = calloc(total + x->hf.nsplit + 1, sizeof(ckptio_entry))) ||
      !(x->local = calloc(total + 1, sizeof(size_t))) || !(x->parts = calloc(x->hf.nsplit + 1, sizeof(*x->parts))))
    return -ENOMEM;
  for (size_t k = 0, i = 0; k < nf; k++)
    for (size_t t = 0; t < x->sub[k]->idx.count; t++)
      if (!ckptio_hf_index_find_split(&x->hf, x->sub[k]->idx.entries[t].name)) {
        idx->entries[i] = x->sub[k]->idx.entries[t];
        x->local[i++] = t;
      }
  for (size_t j = 0; j < x->hf.nsplit; j++) {
    const ckptio_split_tensor *sp = &x->hf.split[j];
    ckptio_entry *e = &idx->entries[total + j];
    e->name = sp->name;
    e->dtype = sp->dtype;
    e->ndim = sp->ndim;
    memcpy(e->shape, sp->shape, sizeof(e->shape));
    e->nbytes = (uint64_t)ckptio_tensor_nbytes(sp->dtype, sp->ndim, sp->shape); /* checked by the parser */
    if (!(x->parts[j] = calloc(sp->nparts, sizeof(ckptio_spart)))) return -ENOMEM;
    for (size_t i = 0; i < sp->nparts; i++) {
      ckptio_source *m = x->sub[sp->parts[i].file];
      ckptio_spart *p = &x->parts[j][i];
      p->src = m;
      for (size_t t = 0; t < m->idx.count; t++)
        if (!strcmp(m->idx.entries[t].name, sp->name)) p->local = t;
      memcpy(p->off, sp->parts[i].offsets, sizeof(p->off));
    }
  }
  idx->count = total + x->hf.nsplit;
  idx->format = CKPTIO_INDEX_SHARDED;
  meta_ref *refs = calloc(nmeta + 1, sizeof(*refs));
  if (!refs || !(idx->meta = calloc(nmeta + 1, sizeof(ckptio_meta)))) {
    free(refs);
    return -ENOMEM;
  }
  size_t n = 0;
  for (size_t i = 0; i < x->hf.nindex_meta; i++, n++) refs[n] = (meta_ref){&x->hf.index_meta[i], n};
  for (size_t k = 0; k < nf; k++)
    for (size_t i = 0; i < x->sub[k]->idx.meta_count; i++) {
      const ckptio_meta *m = &x->sub[k]->idx.meta[i];
      /* Each file's own place in the set is not the set's metadata. */
      if (strcmp(m->key, "ckptio.shard") && strcmp(m->key, "ckptio.rank")) refs[n] = (meta_ref){m, n}, n++;
    }
  qsort(refs, n, sizeof(*refs), cmp_meta_key);
  size_t kept = 0;
  for (size_t i = 0; i < n; i++)
    if (kept == 0 || strcmp(refs[kept - 1].m->key, refs[i].m->key)) refs[kept++] = refs[i];
  qsort(refs, kept, sizeof(*refs), cmp_meta_seq);
  for (size_t i = 0; i < kept; i++) idx->meta[i] = *refs[i].m;
  idx->meta_count = kept;
  free(refs);
  return 0;
}

/* The shard of merged index i. */
static size_t shard_of(const set *x, size_t i) {
  size_t lo = 0, hi = x->hf.nfiles;
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (x->base[mid] <= i) lo = mid;
    else hi = mid;
  }
  return lo;
}

/* A whole tensor's shard; a split tensor answers with its first part's
 * file (the reader asks set_parts before it asks this). */
static ckptio_source *set_member(ckptio_source *s, size_t index, size_t *local, size_t *k) {
  set *x = S(s);
  if (index >= x->nwhole) {
    const ckptio_spart *p = &x->parts[index - x->nwhole][0];
    *local = p->local;
    if (k) *k = x->hf.split[index - x->nwhole].parts[0].file;
    return p->src;
  }
  size_t sk = shard_of(x, index);
  *local = x->local[index];
  if (k) *k = sk;
  return x->sub[sk];
}

static size_t set_parts(ckptio_source *s, size_t index, const ckptio_spart **out) {
  set *x = S(s);
  if (index < x->nwhole) return 0;
  *out = x->parts[index - x->nwhole];
  return x->hf.split[index - x->nwhole].nparts;
}

static int set_view(ckptio_source *s, size_t index, const void **data, uint64_t *nbytes) {
  set *x = S(s);
  return ckptio_source_view_of_member(s, index, index >= x->nwhole ? x->hf.split[index - x->nwhole].nparts : 0,
                                      "parts", data, nbytes);
}

static ckptio_source *set_file(ckptio_source *s, size_t k) { return k < S(s)->hf.nfiles ? S(s)->sub[k] : NULL; }

static void set_close(ckptio_source *s) {
  set *x = S(s);
  for (size_t k = 0; k < x->hf.nfiles; k++) {
    if (x->sub) ckptio_source_close(x->sub[k]);
    if (x->paths) free(x->paths[k]);
  }
  for (size_t j = 0; x->parts && j < x->hf.nsplit; j++) free(x->parts[j]);
  free(x->parts);
  ckptio_hf_index_free(&x->hf);
  free(s->idx.entries); /* strings are the shards' */
  free(s->idx.meta);
  free(x->paths);
  free(x->sub);
  free(x->local);
  free(x->base);
  free(x->dir);
}

static const ckptio_source_ops set_ops = {
    .noun = "sharded set",
    .shards = 1,
    .view = set_view,
    .ranges = ckptio_source_ranges_of_member,
    .member = set_member,
    .parts = set_parts,
    .file = set_file,
    .close = set_close,
};

int ckptio_set_open(ckptio_ctx *ctx, const ckptio_options *opts, const char *path, char *err, ckptio_source **out,
                    char **file) {
  struct stat st;
  char *picked = NULL;
  int is_index = ends_with(path, ".index.json"), rc;
  const ckptio_storage *store = NULL;
  if ((rc = ckptio_storages_find(ctx->storages, path, &store, err, CKPTIO_ERRLEN)) < 0) return rc;
  if (rc > 0 && (rc = pick_in_prefix(store, path, err, &picked, &is_index)) < 0) return rc;
  if (!picked && !store && stat(path, &st) == 0 && S_ISDIR(st.st_mode) &&
      (rc = pick_in_dir(path, err, &picked, &is_index)) < 0)
    return rc;
  if (!picked && !(picked = strdup(path))) return -ENOMEM;
  if (!is_index) {
    *file = picked;
    return 0;
  }
  set *x = calloc(1, sizeof(*x));
  if (!x) {
    free(picked);
    return -ENOMEM;
  }
  rc = ckptio_source_init(&x->s, &set_ops, ctx, opts, picked, err);
  free(picked);
  if (rc == 0) {
    const char *slash = strrchr(x->s.path, '/');
    x->dir = slash ? strndup(x->s.path, slash == x->s.path ? 1 : (size_t)(slash - x->s.path)) : strdup(".");
    if (!x->dir) rc = -ENOMEM;
  }
  /* The index and the files it names, read while no save of the
   * directory publishes (io/publish.h); once open, a later publish cannot
   * change them. */
  int lock = rc == 0 && !store ? ckptio_dir_lock(x->dir, 1) : -1;
  if (rc == 0 && (rc = parse_index(x)) == 0 && (rc = open_shards(x)) == 0 && (rc = cross_check(x)) == 0)
    rc = merge(x);
  ckptio_dir_unlock(lock);
  if (rc < 0) {
    if (rc == -ENOMEM && !err[0]) ckptio_err_fmt(err, CKPTIO_ERRLEN, rc, "%s: out of memory opening the shards", path);
    ckptio_source_close(&x->s);
    return rc;
  }
  *out = &x->s;
  return 1;
}
