/* Opening a Hugging Face sharded checkpoint as one reader: the index file
 * is parsed (bounded, strict about names and types), every shard is opened
 * as its own reader, the index and the shards are cross-checked, and one
 * merged index over all shards answers count / find / info / metadata.
 * Loads are split per shard and run by the shards' readers on the shared
 * pool; nothing here moves bytes itself. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "formats/json.h"
#include "io/file.h"
#include "shard.h"

#define rfail ckptio_reader_fail

typedef struct map_entry {
  char *tensor;           /* owned */
  size_t file;            /* index into files */
  char *file_name;        /* owned, until files are deduplicated */
} map_entry;

struct ckptio_shard_set {
  char *dir;
  map_entry *map;         /* sorted by tensor */
  size_t nmap;
  char **files;           /* unique shard file names, sorted; owned */
  char **paths;           /* dir/file; owned */
  size_t nfiles;
  ckptio_reader **sub;    /* one reader per file */
  size_t *base;           /* [k]: merged index of shard k's first tensor */
  ckptio_meta *index_meta;/* the index's "metadata", strings owned */
  size_t nindex_meta;
};

/* Nested opens (a shard that is itself a directory or an index) would
 * recurse: inside a set, every path is opened as a plain file. */
static _Thread_local int opening_set;

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* ------------------------------------------------------------ directory */

/* A directory: its one index, else its one safetensors file. */
static int pick_in_dir(ckptio_reader *r, int *is_index) {
  DIR *d = opendir(r->path);
  if (!d) return rfail(r, -errno, "%s: %s", r->path, strerror(errno));
  char found[CKPTIO_ERRLEN] = "";
  size_t nidx = 0, nst = 0, used = 0;
  char *idx = NULL, *st = NULL;
  struct dirent *e;
  int rc = 0;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue; /* ., .., and our own temp files */
    int i = ends_with(e->d_name, ".safetensors.index.json"), s = ends_with(e->d_name, ".safetensors");
    if (!i && !s) continue;
    char **slot = i ? &idx : &st;
    if (i ? nidx++ == 0 : nst++ == 0) *slot = strdup(e->d_name);
    if (used < sizeof(found) - 1)
      used += (size_t)snprintf(found + used, sizeof(found) - used, "%s'%s'", used ? ", " : "", e->d_name);
  }
  closedir(d);
  if ((nidx && !idx) || (!nidx && nst && !st)) {
    rc = -ENOMEM;
  } else if (nidx > 1 || (nidx == 0 && nst != 1)) {
    rc = rfail(r, CKPTIO_E_SHARD,
               "%s: a directory must hold exactly one *.safetensors.index.json, or else exactly one "
               "*.safetensors; found %s",
               r->path, used ? found : "neither");
  } else {
    char *p = ckptio_path_join(r->path, nidx ? idx : st);
    if (!p) {
      rc = -ENOMEM;
    } else {
      free(r->path);
      r->path = p;
      *is_index = nidx == 1;
    }
  }
  free(idx);
  free(st);
  return rc;
}

/* ------------------------------------------------------------ index */

/* A shard name must stay in the index's directory. */
static const char *bad_file_name(const char *f, size_t len) {
  if (len == 0) return "is empty";
  if (strlen(f) != len) return "contains a NUL byte";
  if (f[0] == '/') return "is an absolute path";
  if (strchr(f, '/')) return "contains '/' (names must be plain files in the index's directory)";
  if (strchr(f, '\\')) return "contains '\\'";
  if (!strcmp(f, ".") || !strcmp(f, "..")) return "names a directory";
  if (strstr(f, "..")) return "contains '..'";
  return NULL;
}

static int add_meta(struct ckptio_shard_set *s, const char *key, const char *value, size_t *cap) {
  if (s->nindex_meta == *cap) {
    size_t ncap = *cap ? *cap * 2 : 8;
    ckptio_meta *n = realloc(s->index_meta, ncap * sizeof(*n));
    if (!n) return -ENOMEM;
    s->index_meta = n;
    *cap = ncap;
  }
  ckptio_meta *m = &s->index_meta[s->nindex_meta];
  m->key = strdup(key);
  m->value = strdup(value);
  if (!m->key || !m->value) {
    free(m->key);
    free(m->value);
    return -ENOMEM;
  }
  s->nindex_meta++;
  return 0;
}

/* "metadata": strings and integers are kept (integers as decimal text);
 * other values are skipped: the index's metadata is informative only. */
static int cmp_index_meta(const void *a, const void *b) {
  return strcmp(((const ckptio_meta *)a)->key, ((const ckptio_meta *)b)->key);
}

static int parse_metadata(ckptio_reader *r, ckptio_json *j, struct ckptio_shard_set *s) {
  size_t count = 0, cap = 0;
  const char *key;
  int rc = ckptio_json_object_begin(j);
  while (rc == 0 && (rc = ckptio_json_object_next(j, &count, &key)) == 1) {
    char *k = strdup(key);
    if (!k) return -ENOMEM;
    int c = ckptio_json_peek(j);
    const char *v;
    size_t n;
    uint64_t u;
    char num[32];
    if (c == '"') {
      if ((rc = ckptio_json_string(j, &v, &n)) == 0) rc = add_meta(s, k, v, &cap);
    } else if (c >= '0' && c <= '9') {
      if ((rc = ckptio_json_u64(j, &u)) == 0) {
        snprintf(num, sizeof(num), "%llu", (unsigned long long)u);
        rc = add_meta(s, k, num, &cap);
      }
    } else {
      rc = ckptio_json_skip_value(j);
    }
    free(k);
  }
  if (rc < 0) return rc;
  /* Sorted, so that a repeated key is a neighbour: linear after the sort
   * however many keys a hostile index holds. */
  if (s->nindex_meta > 1) qsort(s->index_meta, s->nindex_meta, sizeof(*s->index_meta), cmp_index_meta);
  for (size_t i = 1; i < s->nindex_meta; i++)
    if (!strcmp(s->index_meta[i - 1].key, s->index_meta[i].key))
      return rfail(r, CKPTIO_E_SHARD, "%s: metadata key '%s' appears twice", r->path, s->index_meta[i].key);
  return 0;
}

static int parse_weight_map(ckptio_reader *r, ckptio_json *j, struct ckptio_shard_set *s) {
  size_t count = 0, cap = 0;
  const char *key;
  int rc = ckptio_json_object_begin(j);
  if (rc < 0) return rfail(r, CKPTIO_E_SHARD, "%s: \"weight_map\" is not an object", r->path);
  while ((rc = ckptio_json_object_next(j, &count, &key)) == 1) {
    if (s->nmap == cap) {
      size_t ncap = cap ? cap * 2 : 64;
      map_entry *m = realloc(s->map, ncap * sizeof(*m));
      if (!m) return -ENOMEM;
      s->map = m;
      cap = ncap;
    }
    map_entry *e = &s->map[s->nmap];
    memset(e, 0, sizeof(*e));
    if (!(e->tensor = strdup(key))) return -ENOMEM;
    s->nmap++;
    if (ckptio_json_peek(j) != '"')
      return rfail(r, CKPTIO_E_SHARD, "%s: weight_map: the file of tensor '%s' is not a string", r->path, e->tensor);
    const char *f;
    size_t n;
    if ((rc = ckptio_json_string(j, &f, &n)) < 0) return rc;
    const char *why = bad_file_name(f, n);
    if (why) return rfail(r, CKPTIO_E_SHARD, "%s: weight_map: file '%s' of tensor '%s' %s", r->path, f, e->tensor, why);
    if (!(e->file_name = strdup(f))) return -ENOMEM;
  }
  return rc;
}

static int cmp_map(const void *a, const void *b) {
  return strcmp(((const map_entry *)a)->tensor, ((const map_entry *)b)->tensor);
}
static int cmp_strp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int read_index(ckptio_reader *r, uint8_t **buf, size_t *len) {
  int fd = open(r->path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) < 0) {
    int e = errno;
    if (fd >= 0) close(fd);
    return rfail(r, -e, "%s: %s", r->path, strerror(e));
  }
  int rc = 0;
  if (!S_ISREG(st.st_mode)) {
    rc = rfail(r, CKPTIO_E_SHARD, "%s: the index is not a regular file", r->path);
  } else if ((uint64_t)st.st_size > CKPTIO_SHARD_INDEX_MAX) {
    rc = rfail(r, CKPTIO_E_SHARD, "%s: index of %llu bytes is larger than the %u-byte limit", r->path,
               (unsigned long long)st.st_size, CKPTIO_SHARD_INDEX_MAX);
  } else if (!(*buf = malloc((size_t)st.st_size + 1))) {
    rc = -ENOMEM;
  } else if ((rc = ckptio_pread_full(fd, *buf, (size_t)st.st_size, 0)) < 0) {
    rfail(r, rc, "%s: reading the index: %s", r->path, ckptio_strerror(rc));
  }
  *len = (size_t)st.st_size;
  close(fd);
  return rc;
}

/* Parses the index into s: weight_map sorted by tensor, the unique files. */
static int parse_index(ckptio_reader *r, struct ckptio_shard_set *s) {
  uint8_t *buf = NULL;
  size_t len = 0, bad = 0;
  char msg[CKPTIO_ERRLEN] = "";
  ckptio_json j;
  int rc = read_index(r, &buf, &len);
  if (rc < 0) goto out;
  if (ckptio_utf8_check(buf, len, &bad) < 0) {
    rc = rfail(r, CKPTIO_E_SHARD, "%s: index is not UTF-8 (byte %zu)", r->path, bad);
    goto out;
  }
  ckptio_json_init(&j, buf, len, msg, sizeof(msg));
  int seen_meta = 0, seen_map = 0;
  size_t count = 0;
  const char *key;
  if ((rc = ckptio_json_object_begin(&j)) == 0) {
    while ((rc = ckptio_json_object_next(&j, &count, &key)) == 1) {
      int is_meta = !strcmp(key, "metadata"), is_map = !strcmp(key, "weight_map");
      if ((is_meta && seen_meta++) || (is_map && seen_map++)) {
        rc = rfail(r, CKPTIO_E_SHARD, "%s: key \"%s\" appears twice", r->path, is_meta ? "metadata" : "weight_map");
        break;
      }
      if (is_meta && ckptio_json_peek(&j) != '{') {
        rc = rfail(r, CKPTIO_E_SHARD, "%s: \"metadata\" is not an object", r->path);
        break;
      }
      rc = is_meta ? parse_metadata(r, &j, s) : is_map ? parse_weight_map(r, &j, s) : ckptio_json_skip_value(&j);
      if (rc < 0) break;
    }
  }
  if (rc == 0) {
    ckptio_json_skip_ws(&j);
    if (j.pos != j.len) rc = ckptio_json_fail(&j, "trailing bytes after the index object");
  }
  ckptio_json_free(&j);
  if (rc == CKPTIO_E_HEADER_JSON) rc = rfail(r, CKPTIO_E_SHARD, "%s: %s", r->path, msg);
  else if (rc == -ENOMEM && !r->err[0]) rfail(r, rc, "%s: out of memory reading the index", r->path);
  if (rc < 0) goto out;
  if (!seen_map) {
    rc = rfail(r, CKPTIO_E_SHARD, "%s: no \"weight_map\" object", r->path);
    goto out;
  }
  if (s->nmap == 0) {
    rc = rfail(r, CKPTIO_E_SHARD, "%s: weight_map is empty", r->path);
    goto out;
  }
  qsort(s->map, s->nmap, sizeof(*s->map), cmp_map);
  for (size_t i = 1; i < s->nmap; i++)
    if (!strcmp(s->map[i - 1].tensor, s->map[i].tensor)) {
      rc = rfail(r, CKPTIO_E_SHARD, "%s: weight_map: tensor '%s' appears twice", r->path, s->map[i].tensor);
      goto out;
    }
  /* The unique files, sorted; each entry then points at its file. */
  if (!(s->files = calloc(s->nmap, sizeof(char *)))) {
    rc = -ENOMEM;
    goto out;
  }
  for (size_t i = 0; i < s->nmap; i++) s->files[i] = s->map[i].file_name;
  qsort(s->files, s->nmap, sizeof(char *), cmp_strp);
  size_t n = 0;
  for (size_t i = 0; i < s->nmap; i++)
    if (n == 0 || strcmp(s->files[n - 1], s->files[i])) s->files[n++] = s->files[i];
  s->nfiles = n;
  for (size_t i = 0; i < s->nmap; i++) {
    char **hit = bsearch(&s->map[i].file_name, s->files, n, sizeof(char *), cmp_strp);
    s->map[i].file = (size_t)(hit - s->files);
  }
  /* The files array now owns one copy of each name. */
  for (size_t i = 0; i < s->nmap; i++) {
    if (s->files[s->map[i].file] != s->map[i].file_name) free(s->map[i].file_name);
    s->map[i].file_name = NULL;
  }
out:
  free(buf);
  return rc;
}

/* ------------------------------------------------------------ the set */

static void set_free(struct ckptio_shard_set *s) {
  if (!s) return;
  for (size_t k = 0; k < s->nfiles; k++) {
    if (s->sub) ckptio_reader_close(s->sub[k]);
    if (s->paths) free(s->paths[k]);
    free(s->files[k]);
  }
  if (!s->nfiles) /* parse failed before deduplication: names still in map */
    for (size_t i = 0; i < s->nmap; i++) free(s->map[i].file_name);
  for (size_t i = 0; i < s->nmap; i++) free(s->map[i].tensor);
  for (size_t i = 0; i < s->nindex_meta; i++) {
    free(s->index_meta[i].key);
    free(s->index_meta[i].value);
  }
  free(s->index_meta);
  free(s->map);
  free(s->files);
  free(s->paths);
  free(s->sub);
  free(s->base);
  free(s->dir);
  free(s);
}

static int open_shards(ckptio_reader *r, struct ckptio_shard_set *s) {
  if (!(s->sub = calloc(s->nfiles, sizeof(*s->sub))) || !(s->paths = calloc(s->nfiles, sizeof(char *))))
    return -ENOMEM;
  for (size_t k = 0; k < s->nfiles; k++) {
    if (!(s->paths[k] = ckptio_path_join(s->dir, s->files[k]))) return -ENOMEM;
    opening_set = 1;
    int rc = ckptio_reader_open(r->ctx, s->paths[k], &r->opts, &s->sub[k]);
    opening_set = 0;
    if (rc < 0) return rfail(r, rc, "%s: shard '%s': %s", r->path, s->files[k], ckptio_last_open_error());
    if (strcmp(ckptio_reader_format(s->sub[k]), "safetensors"))
      return rfail(r, CKPTIO_E_SHARD, "%s: shard '%s' is a %s file, not safetensors", r->path, s->files[k],
                   ckptio_reader_format(s->sub[k]));
  }
  return 0;
}

/* Every mapped tensor is in its file, and every tensor of every file is
 * mapped to that file (so none sits in two shards). */
static int cross_check(ckptio_reader *r, struct ckptio_shard_set *s) {
  for (size_t i = 0; i < s->nmap; i++) {
    const map_entry *e = &s->map[i];
    if (ckptio_reader_find(s->sub[e->file], e->tensor) < 0)
      return rfail(r, CKPTIO_E_SHARD, "%s: tensor '%s' is mapped to shard '%s', which does not hold it", r->path,
                   e->tensor, s->files[e->file]);
  }
  for (size_t k = 0; k < s->nfiles; k++) {
    const ckptio_index *x = &s->sub[k]->idx;
    for (size_t t = 0; t < x->count; t++) {
      map_entry key = {x->entries[t].name, 0, NULL};
      const map_entry *e = bsearch(&key, s->map, s->nmap, sizeof(*s->map), cmp_map);
      if (!e)
        return rfail(r, CKPTIO_E_SHARD, "%s: tensor '%s' of shard '%s' is not in the index's weight_map", r->path,
                     key.tensor, s->files[k]);
      if (e->file != k)
        return rfail(r, CKPTIO_E_SHARD, "%s: tensor '%s' is in shard '%s' but the index maps it to '%s'", r->path,
                     key.tensor, s->files[k], s->files[e->file]);
    }
  }
  /* A save interrupted between its renames leaves shards of two saves. */
  const char *id = NULL;
  for (size_t i = 0; i < s->nindex_meta; i++)
    if (!strcmp(s->index_meta[i].key, "ckptio.save_id")) id = s->index_meta[i].value;
  for (size_t k = 0; id && k < s->nfiles; k++) {
    const char *sid = ckptio_reader_metadata_get(s->sub[k], "ckptio.save_id");
    const char *tag = ckptio_reader_metadata_get(s->sub[k], "ckptio.shard");
    char want[64];
    snprintf(want, sizeof(want), "%zu/%zu", k + 1, s->nfiles);
    if (!sid || strcmp(sid, id))
      return rfail(r, CKPTIO_E_SHARD,
                   "%s: shard '%s' belongs to another save (save id %s, the index says %s): a save was "
                   "interrupted while publishing, or files of two saves are mixed",
                   r->path, s->files[k], sid ? sid : "missing", id);
    if (!tag || strcmp(tag, want))
      return rfail(r, CKPTIO_E_SHARD, "%s: shard '%s' says it is shard %s, the index makes it %s", r->path,
                   s->files[k], tag ? tag : "(missing)", want);
  }
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
 * metadata strings stay owned by the shards and the set. */
static int merge(ckptio_reader *r, struct ckptio_shard_set *s) {
  ckptio_index *idx = &r->idx;
  size_t total = 0, nmeta = s->nindex_meta;
  if (!(s->base = calloc(s->nfiles + 1, sizeof(size_t)))) return -ENOMEM;
  for (size_t k = 0; k < s->nfiles; k++) {
    s->base[k] = total;
    total += s->sub[k]->idx.count;
    nmeta += s->sub[k]->idx.meta_count;
    idx->header_bytes += s->sub[k]->idx.header_bytes;
  }
  s->base[s->nfiles] = total;
  if (!(idx->entries = calloc(total + 1, sizeof(ckptio_entry)))) return -ENOMEM;
  for (size_t k = 0; k < s->nfiles; k++)
    memcpy(idx->entries + s->base[k], s->sub[k]->idx.entries, s->sub[k]->idx.count * sizeof(ckptio_entry));
  idx->count = total;
  idx->format = "safetensors-sharded";
  meta_ref *refs = calloc(nmeta + 1, sizeof(*refs));
  if (!refs || !(idx->meta = calloc(nmeta + 1, sizeof(ckptio_meta)))) {
    free(refs);
    return -ENOMEM;
  }
  size_t n = 0;
  for (size_t i = 0; i < s->nindex_meta; i++, n++) refs[n] = (meta_ref){&s->index_meta[i], n};
  for (size_t k = 0; k < s->nfiles; k++)
    for (size_t i = 0; i < s->sub[k]->idx.meta_count; i++) {
      const ckptio_meta *m = &s->sub[k]->idx.meta[i];
      if (strcmp(m->key, "ckptio.shard")) refs[n] = (meta_ref){m, n}, n++;
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

int ckptio_shard_open(ckptio_reader *r) {
  if (opening_set) return 0;
  struct stat st;
  int is_index = ends_with(r->path, ".index.json"), rc;
  if (stat(r->path, &st) == 0 && S_ISDIR(st.st_mode)) {
    if ((rc = pick_in_dir(r, &is_index)) < 0) return rc;
  }
  if (!is_index) return 0;
  struct ckptio_shard_set *s = calloc(1, sizeof(*s));
  if (!s) return -ENOMEM;
  const char *slash = strrchr(r->path, '/');
  s->dir = slash ? strndup(r->path, slash == r->path ? 1 : (size_t)(slash - r->path)) : strdup(".");
  if (!s->dir) {
    set_free(s);
    return -ENOMEM;
  }
  if ((rc = parse_index(r, s)) < 0 || (rc = open_shards(r, s)) < 0 || (rc = cross_check(r, s)) < 0 ||
      (rc = merge(r, s)) < 0) {
    if (rc == -ENOMEM && !r->err[0]) rfail(r, rc, "%s: out of memory opening the shards", r->path);
    free(r->idx.entries);
    free(r->idx.meta);
    memset(&r->idx, 0, sizeof(r->idx));
    set_free(s);
    return rc;
  }
  r->set = s;
  return 1;
}

void ckptio_shard_close(ckptio_reader *r) {
  if (!r->set) return;
  free(r->idx.entries);
  free(r->idx.meta);
  memset(&r->idx, 0, sizeof(r->idx));
  set_free(r->set);
  r->set = NULL;
}

/* The shard of merged index i. */
static size_t shard_of(const struct ckptio_shard_set *s, size_t i) {
  size_t lo = 0, hi = s->nfiles;
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (s->base[mid] <= i) lo = mid;
    else hi = mid;
  }
  return lo;
}

/* Shard loads run this many at a time: each one already fills the pool, and
 * a few together hide the start and the tail of each (its last pieces, its
 * final CRC check) behind the others'. */
#define SHARD_LOADS_IN_FLIGHT 4

typedef struct shard_job {
  ckptio_reader *r;
  const ckptio_load_request *sub;
  const size_t *end;        /* [k]: end of shard k's requests in sub */
  int check;
  _Atomic size_t next;      /* next shard to take */
  pthread_mutex_t mu;
  int rc;                   /* first failure */
} shard_job;

static void *shard_worker(void *arg) {
  shard_job *j = arg;
  struct ckptio_shard_set *s = j->r->set;
  for (;;) {
    size_t k = atomic_fetch_add(&j->next, 1);
    if (k >= s->nfiles) break;
    size_t first = k ? j->end[k - 1] : 0;
    pthread_mutex_lock(&j->mu);
    int stop = j->rc < 0;
    pthread_mutex_unlock(&j->mu);
    if (stop) break;
    if (j->end[k] == first) continue;
    ckptio_reader *x = s->sub[k];
    int rc = ckptio_reader_run(x, j->sub + first, j->end[k] - first, j->check);
    ckptio_reader *r = j->r;
    atomic_fetch_add(&r->done_bytes, atomic_load(&x->done_bytes));
    atomic_fetch_add(&r->timers.copy_ns, atomic_load(&x->timers.copy_ns));
    atomic_fetch_add(&r->timers.device_ns, atomic_load(&x->timers.device_ns));
    pthread_mutex_lock(&j->mu);
    if (rc < 0 && j->rc == 0) {
      j->rc = rc;
      snprintf(r->err, sizeof(r->err), "%s", x->err);
    }
    pthread_mutex_unlock(&j->mu);
  }
  return NULL;
}

int ckptio_shard_run(ckptio_reader *r, const ckptio_load_request *reqs, size_t n, int check) {
  struct ckptio_shard_set *s = r->set;
  size_t *count = calloc(s->nfiles + 1, sizeof(size_t));
  ckptio_load_request *sub = calloc(n + 1, sizeof(*sub));
  int rc = 0;
  if (!count || !sub) {
    rc = -ENOMEM;
    goto out;
  }
  uint64_t bytes = 0;
  size_t active = 0;
  for (size_t i = 0; i < n; i++) {
    size_t k = shard_of(s, reqs[i].index);
    active += count[k + 1]++ == 0;
    bytes += r->idx.entries[reqs[i].index].nbytes;
  }
  for (size_t k = 0; k < s->nfiles; k++) count[k + 1] += count[k]; /* count[k]: start of shard k */
  for (size_t i = 0; i < n; i++) {
    size_t k = shard_of(s, reqs[i].index);
    ckptio_load_request q = reqs[i];
    q.index -= s->base[k];
    sub[count[k]++] = q; /* count[k] ends as the end of shard k's requests */
  }
  atomic_store(&r->done_bytes, 0);
  atomic_store(&r->total_bytes, bytes);
  memset(&r->timers, 0, sizeof(r->timers));
  r->timers.start_ns = ckptio_now_ns();
  shard_job j = {.r = r, .sub = sub, .end = count, .check = check, .rc = 0};
  atomic_init(&j.next, 0);
  pthread_mutex_init(&j.mu, NULL);
  pthread_t helpers[SHARD_LOADS_IN_FLIGHT - 1];
  size_t started = 0;
  for (; started + 1 < active && started + 1 < SHARD_LOADS_IN_FLIGHT; started++)
    if (pthread_create(&helpers[started], NULL, shard_worker, &j) != 0) break; /* fewer at once */
  shard_worker(&j);
  for (size_t t = 0; t < started; t++) pthread_join(helpers[t], NULL);
  pthread_mutex_destroy(&j.mu);
  rc = j.rc;
  r->timers.end_ns = ckptio_now_ns();
out:
  free(count);
  free(sub);
  return rc;
}

int ckptio_shard_view(ckptio_reader *r, size_t index, const void **data, uint64_t *nbytes) {
  size_t k = shard_of(r->set, index);
  ckptio_reader *x = r->set->sub[k];
  int rc = ckptio_reader_view(x, index - r->set->base[k], data, nbytes);
  if (rc < 0) snprintf(r->err, sizeof(r->err), "%s", x->err);
  return rc;
}

int ckptio_shard_set_stream(ckptio_reader *r, int device, void *stream) {
  for (size_t k = 0; k < r->set->nfiles; k++) {
    int rc = ckptio_reader_set_stream(r->set->sub[k], device, stream);
    if (rc < 0) {
      snprintf(r->err, sizeof(r->err), "%s", r->set->sub[k]->err);
      return rc;
    }
  }
  return 0;
}

ckptio_reader *ckptio_shard_sub(ckptio_reader *r, size_t index, size_t *local, size_t *k) {
  size_t sk = shard_of(r->set, index);
  *local = index - r->set->base[sk];
  if (k) *k = sk;
  return r->set->sub[sk];
}

/* Slices one shard at a time, each over the whole pool; requests of one
 * shard go together so their jobs share the pool. */
int ckptio_shard_load_slices(ckptio_reader *r, ckptio_slice_request *reqs, size_t n) {
  struct ckptio_shard_set *s = r->set;
  ckptio_slice_request *sub = calloc(n + 1, sizeof(*sub));
  size_t *from = calloc(n + 1, sizeof(size_t));
  int rc = 0;
  if (!sub || !from) {
    rc = -ENOMEM;
    goto out;
  }
  for (size_t i = 0; i < n; i++)
    if (reqs[i].index >= r->idx.count) {
      rc = ckptio_reader_fail(r, CKPTIO_E_INVALID_ARG, "%s: slice %zu: no tensor %zu (the set has %zu)", r->path, i,
                              reqs[i].index, r->idx.count);
      goto out;
    }
  for (size_t k = 0; k < s->nfiles && rc == 0; k++) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
      if (shard_of(s, reqs[i].index) != k) continue;
      sub[m] = reqs[i];
      sub[m].index -= s->base[k];
      from[m++] = i;
    }
    if (!m) continue;
    if ((rc = ckptio_reader_load_slices(s->sub[k], sub, m)) < 0) {
      snprintf(r->err, sizeof(r->err), "%s", s->sub[k]->err);
      break;
    }
    for (size_t j = 0; j < m; j++) {
      reqs[from[j]].verified = sub[j].verified;
      reqs[from[j]].bytes_read = sub[j].bytes_read;
    }
  }
out:
  free(sub);
  free(from);
  return rc;
}

int64_t ckptio_shard_slice_ranges(ckptio_reader *r, size_t index, int dim, int64_t start, int64_t stop,
                                  ckptio_byte_range *ranges, size_t cap) {
  if (index >= r->idx.count)
    return ckptio_reader_fail(r, CKPTIO_E_INVALID_ARG, "%s: no tensor %zu (the set has %zu)", r->path, index,
                              r->idx.count);
  size_t local, k;
  ckptio_reader *x = ckptio_shard_sub(r, index, &local, &k);
  int64_t got = ckptio_reader_slice_ranges(x, local, dim, start, stop, ranges, cap);
  if (got < 0) snprintf(r->err, sizeof(r->err), "%s", x->err);
  for (int64_t i = 0; i < got && (size_t)i < cap; i++) ranges[i].file = (uint32_t)k;
  return got;
}

/* ------------------------------------------------------------ public */

size_t ckptio_reader_shard_count(const ckptio_reader *r) { return r && r->set ? r->set->nfiles : 0; }

int ckptio_reader_shard(const ckptio_reader *r, size_t k, const char **path, size_t *tensors, uint64_t *bytes) {
  if (!r || k >= (r->set ? r->set->nfiles : 1)) return CKPTIO_E_INVALID_ARG;
  const ckptio_index *x = r->set ? &r->set->sub[k]->idx : &r->idx;
  uint64_t b = 0;
  for (size_t i = 0; i < x->count; i++) b += x->entries[i].nbytes;
  if (path) *path = r->set ? r->set->paths[k] : r->path;
  if (tensors) *tensors = x->count;
  if (bytes) *bytes = b;
  return 0;
}

int64_t ckptio_reader_shard_of(const ckptio_reader *r, size_t index) {
  if (!r || index >= r->idx.count) return CKPTIO_E_INVALID_ARG;
  return r->set ? (int64_t)shard_of(r->set, index) : 0;
}
