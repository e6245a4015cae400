/* Parsing the Hugging Face index (hf_index.h). */
#include "formats/hf_index.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/json.h"

/* A shard name must stay in the index's directory. */
const char *ckptio_hf_bad_file_name(const char *f, size_t len) {
  if (len == 0) return "is empty";
  if (strlen(f) != len) return "contains a NUL byte";
  if (f[0] == '/') return "is an absolute path";
  if (strchr(f, '/')) return "contains '/' (names must be plain files in the index's directory)";
  if (strchr(f, '\\')) return "contains '\\'";
  if (!strcmp(f, ".") || !strcmp(f, "..")) return "names a directory";
  if (strstr(f, "..")) return "contains '..'";
  return NULL;
}

static int add_meta(ckptio_hf_index *s, const char *key, const char *value, size_t *cap) {
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

static int parse_metadata(ckptio_json *j, ckptio_hf_index *s) {
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
      return ckptio_err_fmt(s->err, sizeof(s->err), CKPTIO_E_SHARD, "metadata key '%s' appears twice", s->index_meta[i].key);
  return 0;
}

static int parse_weight_map(ckptio_json *j, ckptio_hf_index *s) {
  size_t count = 0, cap = 0;
  const char *key;
  int rc = ckptio_json_object_begin(j);
  if (rc < 0) return ckptio_err_fmt(s->err, sizeof(s->err), CKPTIO_E_SHARD, "\"weight_map\" is not an object");
  while ((rc = ckptio_json_object_next(j, &count, &key)) == 1) {
    if (s->nmap == cap) {
      size_t ncap = cap ? cap * 2 : 64;
      ckptio_hf_entry *m = realloc(s->map, ncap * sizeof(*m));
      if (!m) return -ENOMEM;
      s->map = m;
      cap = ncap;
    }
    ckptio_hf_entry *e = &s->map[s->nmap];
    memset(e, 0, sizeof(*e));
    if (!(e->tensor = strdup(key))) return -ENOMEM;
    s->nmap++;
    if (ckptio_json_peek(j) != '"')
      return ckptio_err_fmt(s->err, sizeof(s->err), CKPTIO_E_SHARD, "weight_map: the file of tensor '%s' is not a string", e->tensor);
    const char *f;
    size_t n;
    if ((rc = ckptio_json_string(j, &f, &n)) < 0) return rc;
    const char *why = ckptio_hf_bad_file_name(f, n);
    if (why) return ckptio_err_fmt(s->err, sizeof(s->err), CKPTIO_E_SHARD, "weight_map: file '%s' of tensor '%s' %s", f, e->tensor, why);
    if (!(e->file_name = strdup(f))) return -ENOMEM;
  }
  return rc;
}

static int cmp_map(const void *a, const void *b) {
  return strcmp(((const ckptio_hf_entry *)a)->tensor, ((const ckptio_hf_entry *)b)->tensor);
}
static int cmp_strp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The index of *name in the deduplicated files; the files array keeps
 * the one copy it holds and any other copy is freed. */
static size_t take_file(ckptio_hf_index *s, char **name) {
  char **hit = bsearch(name, s->files, s->nfiles, sizeof(char *), cmp_strp);
  size_t k = (size_t)(hit - s->files);
  if (s->files[k] != *name) free(*name);
  *name = NULL;
  return k;
}

/* Parses the index into s: weight_map sorted by tensor, the unique files. */
static int parse_index(const uint8_t *buf, size_t len, ckptio_hf_index *s) {
  size_t bad = 0;
  char msg[CKPTIO_ERRLEN] = "";
  ckptio_json j;
  int rc = 0;
  if (ckptio_utf8_check(buf, len, &bad) < 0) {
    rc = ckptio_err_fmt(s->err, sizeof(s->err), CKPTIO_E_SHARD, "index is not UTF-8 (byte %zu)", bad);
    goto out;
  }
  ckptio_json_init(&j, buf, len, msg, sizeof(msg));
  int seen_meta = 0, seen_map = 0, seen_parts = 0;
  size_t count = 0;
  const char *key;
  if ((rc = ckptio_json_object_begin(&j)) == 0) {
    while ((rc = ckptio_json_object_next(&j, &count, &key)) == 1) {
      int is_meta = !strcmp(key, "metadata"), is_map = !strcmp(key, "weight_map"), is_parts = !strcmp(key, "ckptio");
      if ((is_meta && seen_meta++) || (is_map && seen_map++) || (is_parts && seen_parts++)) {
        rc = ckptio_err_fmt(s->err, sizeof(s->err), CKPTIO_E_SHARD, "key \"%s\" appears twice", key);
        break;
      }
      if (is_meta && ckptio_json_peek(&j) != '{') {
        rc = ckptio_err_fmt(s->err, sizeof(s->err), CKPTIO_E_SHARD, "\"metadata\" is not an object");
        break;
      }
      rc = is_meta ? parse_metadata(&j, s) : is_map ? parse_weight_map(&j, s) : is_parts ? ckptio_parts_parse(&j, s)
                                                                                   : ckptio_json_skip_value(&j);
      if (rc < 0) break;
    }
  }
  if (rc == 0) {
    ckptio_json_skip_ws(&j);
    if (j.pos != j.len) rc = ckptio_json_fail(&j, "trailing bytes after the index object");
  }
  ckptio_json_free(&j);
  if (rc == CKPTIO_E_HEADER_JSON) rc = ckptio_err_fmt(s->err, sizeof(s->err), CKPTIO_E_SHARD, "%s", msg);
  else if (rc == -ENOMEM && !s->err[0]) ckptio_err_fmt(s->err, sizeof(s->err), rc, "out of memory reading the index");
  if (rc < 0) goto out;
  if (!seen_map) {
    rc = ckptio_err_fmt(s->err, sizeof(s->err), CKPTIO_E_SHARD, "no \"weight_map\" object");
    goto out;
  }
  if (s->nmap == 0 && s->nsplit == 0) { /* a checkpoint of only split tensors has an empty map */
    rc = ckptio_err_fmt(s->err, sizeof(s->err), CKPTIO_E_SHARD, "weight_map is empty");
    goto out;
  }
  if (s->nmap > 1) qsort(s->map, s->nmap, sizeof(*s->map), cmp_map); /* map is NULL when empty */
  for (size_t i = 1; i < s->nmap; i++)
    if (!strcmp(s->map[i - 1].tensor, s->map[i].tensor)) {
      rc = ckptio_err_fmt(s->err, sizeof(s->err), CKPTIO_E_SHARD, "weight_map: tensor '%s' appears twice", s->map[i].tensor);
      goto out;
    }
  /* The unique files (weight_map's and the parts'), sorted; each entry and
   * part then points at its file, and the files array owns each name once. */
  size_t nparts = 0;
  for (size_t i = 0; i < s->nsplit; i++) nparts += s->split[i].nparts;
  if (!(s->files = calloc(s->nmap + nparts + 1, sizeof(char *)))) {
    rc = -ENOMEM;
    goto out;
  }
  size_t n = 0;
  for (size_t i = 0; i < s->nmap; i++) s->files[n++] = s->map[i].file_name;
  for (size_t i = 0; i < s->nsplit; i++)
    for (size_t k = 0; k < s->split[i].nparts; k++) s->files[n++] = s->split[i].parts[k].file_name;
  qsort(s->files, n, sizeof(char *), cmp_strp);
  size_t u = 0;
  for (size_t i = 0; i < n; i++)
    if (u == 0 || strcmp(s->files[u - 1], s->files[i])) s->files[u++] = s->files[i];
  s->nfiles = u;
  for (size_t i = 0; i < s->nmap; i++) s->map[i].file = take_file(s, &s->map[i].file_name);
  for (size_t i = 0; i < s->nsplit; i++)
    for (size_t k = 0; k < s->split[i].nparts; k++)
      s->split[i].parts[k].file = take_file(s, &s->split[i].parts[k].file_name);
  rc = ckptio_parts_check(s);
out:
  return rc;
}

int ckptio_hf_index_parse(const uint8_t *buf, size_t len, ckptio_hf_index *out) {
  memset(out, 0, sizeof(*out));
  return parse_index(buf, len, out);
}

void ckptio_hf_index_free(ckptio_hf_index *s) {
  for (size_t k = 0; k < s->nfiles; k++) free(s->files[k]);
  for (size_t i = 0; i < s->nmap; i++) free(s->map[i].file_name); /* NULL once deduplicated */
  ckptio_parts_free(s);
  for (size_t i = 0; i < s->nmap; i++) free(s->map[i].tensor);
  for (size_t i = 0; i < s->nindex_meta; i++) {
    free(s->index_meta[i].key);
    free(s->index_meta[i].value);
  }
  free(s->index_meta);
  free(s->map);
  free(s->files);
  s->map = NULL, s->files = NULL, s->index_meta = NULL;
  s->nmap = s->nfiles = s->nindex_meta = 0;
}

const ckptio_hf_entry *ckptio_hf_index_find(const ckptio_hf_index *x, const char *tensor) {
  ckptio_hf_entry key = {(char *)tensor, 0, NULL};
  if (!x->nmap) return NULL; /* an index of only split tensors: no map to search */
  return bsearch(&key, x->map, x->nmap, sizeof(*x->map), cmp_map);
}
