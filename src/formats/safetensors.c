/*
 * safetensors headers: the reader validates a header in the order of
 * FORMATS.md section 1 (one error code per rule, messages naming the rule and
 * the tensor) and indexes it; the writer plans a file's header and offsets.
 */
#include "formats/safetensors.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "formats/json.h"

#define META_KEY "__metadata__"

/* The reference reader (safetensors >= 0.7) also accepts JSON whitespace
 * before the '{'. ckptio refuses it for now (FORMATS.md: the header must
 * begin with '{'); set to 1 to read such files. */
static const int kAllowLeadingWhitespace = 0;

static uint64_t le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int k = 7; k >= 0; k--) v = v << 8 | p[k];
  return v;
}

int ckptio_st_header_length(const uint8_t *prefix, uint64_t file_size,
                            uint64_t *header_len, char *err, size_t errlen) {
  if (!header_len || (!prefix && file_size >= 8))
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "st_header_length: NULL argument");
  if (file_size < 8)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_HEADER_TOO_SMALL,
                          "header too small: the file has %" PRIu64
                          " bytes, fewer than the 8-byte header length", file_size);
  uint64_t n = le64(prefix);
  if (n > CKPTIO_ST_MAX_HEADER)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_HEADER_TOO_LARGE,
                          "header too large: %" PRIu64 " bytes, the limit is %llu", n,
                          CKPTIO_ST_MAX_HEADER);
  if (n > file_size - 8)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_HEADER_LENGTH,
                          "invalid header length: 8 + %" PRIu64 " runs past the end of the %" PRIu64
                          "-byte file", n, file_size);
  *header_len = n;
  return 0;
}

/* ------------------------------------------------------------ reading */

typedef struct st_parse {
  ckptio_json j;
  ckptio_st_index *out;
  size_t entries_cap, meta_cap;
  char *err;
  size_t errlen;
  char context[240];  /* "tensor '<name>'" for the JSON reader's messages */
} st_parse;

/* A failure inside the JSON, with the header byte where it was seen. */
static int perr(st_parse *s, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int perr(st_parse *s, int code, const char *fmt, ...) {
  char where[48];
  snprintf(where, sizeof(where), " (header byte %zu)", s->j.pos);
  va_list ap;
  va_start(ap, fmt);
  ckptio_err_vfmt(s->err, s->errlen, code, "", where, fmt, ap);
  va_end(ap);
  return code;
}

static int oom(st_parse *s) {
  return ckptio_err_fmt(s->err, s->errlen, -ENOMEM, "out of memory indexing the header");
}

/* Doubles *cap until count fits: the header bounds count, so growth stays
 * proportional to the header size. */
static int grow(void **arr, size_t *cap, size_t count, size_t elem) {
  if (count < *cap) return 0;
  size_t ncap = *cap ? *cap * 2 : 16;
  if (ncap > SIZE_MAX / elem) return -ENOMEM;
  void *p = realloc(*arr, ncap * elem);
  if (!p) return -ENOMEM;
  *arr = p;
  *cap = ncap;
  return 0;
}

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = malloc(n);
  if (p) memcpy(p, s, n);
  return p;
}

static int parse_metadata(st_parse *s) {
  ckptio_st_index *ix = s->out;
  size_t count = 0;
  const char *key, *val;
  char *k = NULL, *v = NULL;
  int rc, c = ckptio_json_peek(&s->j);
  /* serde reads the field as Option<map>: null means no metadata. */
  if (c == 'n') return ckptio_json_null(&s->j);
  if (c != '{') return perr(s, CKPTIO_E_HEADER_JSON, "invalid header: \"__metadata__\" is not an object");
  if ((rc = ckptio_json_object_begin(&s->j)) < 0) return rc;
  while ((rc = ckptio_json_object_next(&s->j, &count, &key)) == 1) {
    if (!(k = dup_str(key))) goto nomem;
    if (ckptio_json_peek(&s->j) != '"') {
      rc = perr(s, CKPTIO_E_HEADER_JSON, "invalid header: __metadata__ value of '%.200s' is not a string", k);
      goto fail;
    }
    if ((rc = ckptio_json_string(&s->j, &val, NULL)) < 0) goto fail;
    if (!(v = dup_str(val))) goto nomem;
    if (grow((void **)&ix->meta, &s->meta_cap, ix->meta_count, sizeof(*ix->meta)) < 0) goto nomem;
    ix->meta[ix->meta_count++] = (ckptio_st_kv){k, v};
    k = v = NULL;
  }
  return rc;
nomem:
  rc = oom(s);
fail:
  free(k);
  free(v);
  return rc;
}

static int parse_tensor(st_parse *s, ckptio_st_entry *e) {
  const char *name = e->name, *key;
  int seen_dtype = 0, seen_shape = 0, seen_offsets = 0, rc;
  size_t count = 0;
  if (ckptio_json_peek(&s->j) != '{')
    return perr(s, CKPTIO_E_HEADER_JSON, "invalid header: tensor '%.200s' is not an object", name);
  if ((rc = ckptio_json_object_begin(&s->j)) < 0) return rc;
  while ((rc = ckptio_json_object_next(&s->j, &count, &key)) == 1) {
    int *seen = !strcmp(key, "dtype") ? &seen_dtype
              : !strcmp(key, "shape") ? &seen_shape
              : !strcmp(key, "data_offsets") ? &seen_offsets : NULL;
    if (!seen) {  /* serde ignores unknown fields; so do we */
      if ((rc = ckptio_json_skip_value(&s->j)) < 0) return rc;
      continue;
    }
    if ((*seen)++)
      return perr(s, CKPTIO_E_DUPLICATE, "duplicate key: tensor '%.200s' has \"%s\" twice", name, key);
    size_t n = 0;
    if (seen == &seen_dtype) {
      const char *d;
      if (ckptio_json_peek(&s->j) != '"')
        return perr(s, CKPTIO_E_HEADER_JSON, "invalid header: tensor '%.200s': dtype is not a string", name);
      if ((rc = ckptio_json_string(&s->j, &d, NULL)) < 0) return rc;
      if (ckptio_dtype_parse(d, &e->dtype) < 0)
        return perr(s, CKPTIO_E_DTYPE, "unknown dtype: tensor '%.200s' has dtype '%.40s'", name, d);
    } else if (seen == &seen_shape) {
      if (ckptio_json_peek(&s->j) != '[')
        return perr(s, CKPTIO_E_HEADER_JSON, "invalid header: tensor '%.200s': shape is not an array", name);
      if ((rc = ckptio_json_array_begin(&s->j)) < 0) return rc;
      while ((rc = ckptio_json_array_next(&s->j, &n)) == 1) {
        uint64_t v;
        if (n > CKPTIO_MAX_DIMS)
          return perr(s, CKPTIO_E_SHAPE, "invalid shape: tensor '%.200s' has more than %d dims", name,
                      CKPTIO_MAX_DIMS);
        if ((rc = ckptio_json_u64(&s->j, &v)) < 0) return rc;
        /* A dim above INT64_MAX is kept as -1 so rule 6 reports it as an
         * overflow in offset order, as the reference does. */
        e->shape[n - 1] = v > (uint64_t)INT64_MAX ? -1 : (int64_t)v;
      }
      if (rc < 0) return rc;
      e->ndim = (int)n;
    } else {
      uint64_t v[2];
      if (ckptio_json_peek(&s->j) != '[')
        return perr(s, CKPTIO_E_HEADER_JSON, "invalid header: tensor '%.200s': data_offsets is not an array", name);
      if ((rc = ckptio_json_array_begin(&s->j)) < 0) return rc;
      while ((rc = ckptio_json_array_next(&s->j, &n)) == 1) {
        if (n > 2) break;
        if ((rc = ckptio_json_u64(&s->j, &v[n - 1])) < 0) return rc;
      }
      if (rc < 0) return rc;
      if (n != 2)
        return perr(s, CKPTIO_E_HEADER_JSON,
                    "invalid header: tensor '%.200s': data_offsets must hold exactly two integers", name);
      e->begin = v[0];
      e->end = v[1];
    }
  }
  if (rc < 0) return rc;
  const char *missing = !seen_dtype ? "dtype" : !seen_shape ? "shape" : !seen_offsets ? "data_offsets" : NULL;
  if (missing)
    return perr(s, CKPTIO_E_HEADER_JSON, "invalid header: tensor '%.200s' has no \"%s\"", name, missing);
  return 0;
}

/* The top-level object: __metadata__ and the tensors, in file order. */
static int parse_object(st_parse *s) {
  ckptio_st_index *ix = s->out;
  ckptio_st_entry e;
  const char *key;
  size_t count = 0;
  int seen_meta = 0, rc;
  if (!kAllowLeadingWhitespace && (s->j.len == 0 || s->j.buf[0] != '{'))
    return perr(s, CKPTIO_E_HEADER_JSON, "invalid header: it does not begin with '{'");
  if ((rc = ckptio_json_object_begin(&s->j)) < 0) return rc;
  while ((rc = ckptio_json_object_next(&s->j, &count, &key)) == 1) {
    if (!strcmp(key, META_KEY)) {
      if (seen_meta++) return perr(s, CKPTIO_E_DUPLICATE, "duplicate key: \"__metadata__\" appears twice");
      s->j.context = "__metadata__";
      rc = parse_metadata(s);
      s->j.context = NULL;
      if (rc < 0) return rc;
      continue;
    }
    memset(&e, 0, sizeof(e));
    if (!(e.name = dup_str(key))) return oom(s);
    snprintf(s->context, sizeof(s->context), "tensor '%.200s'", e.name);
    s->j.context = s->context;
    rc = parse_tensor(s, &e);
    s->j.context = NULL;
    if (rc < 0 ||
        (rc = grow((void **)&ix->entries, &s->entries_cap, ix->count, sizeof(e))) < 0) {
      free(e.name);
      return rc == -ENOMEM ? oom(s) : rc;
    }
    ix->entries[ix->count++] = e;
  }
  if (rc < 0) return rc;
  ckptio_json_skip_ws(&s->j);
  if (s->j.pos != s->j.len)
    return perr(s, CKPTIO_E_HEADER_JSON, "invalid header: bytes other than whitespace after the JSON object");
  return 0;
}

static int cmp_entry_name(const void *a, const void *b) {
  return strcmp((*(const ckptio_st_entry *const *)a)->name, (*(const ckptio_st_entry *const *)b)->name);
}

static int cmp_kv_key(const void *a, const void *b) {
  return strcmp((*(const ckptio_st_kv *const *)a)->key, (*(const ckptio_st_kv *const *)b)->key);
}

static int cmp_entry_offsets(const void *a, const void *b) {
  const ckptio_st_entry *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return strcmp(x->name, y->name);  /* deterministic order for equal ranges */
}

static int parse_crc(const char *v, uint32_t *out) {
  uint32_t crc = 0;
  for (int k = 0; k < 8; k++) {
    char c = v[k];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
          : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    crc = crc << 4 | (uint32_t)d;
  }
  if (v[8]) return -1;
  *out = crc;
  return 0;
}

/* Rule 5, after the grammar: unique names and keys, CRC keys resolved to
 * their tensors and taken out of the metadata. O(n log n) in the header. */
static int check_names(ckptio_st_index *ix, char *err, size_t errlen) {
  const size_t plen = strlen(CKPTIO_ST_CRC_PREFIX);
  ckptio_st_entry **byname = NULL;
  ckptio_st_kv **bykey = NULL;
  int rc = 0;
  if (ix->count && !(byname = malloc(ix->count * sizeof(*byname)))) goto nomem;
  if (ix->meta_count && !(bykey = malloc(ix->meta_count * sizeof(*bykey)))) goto nomem;
  for (size_t i = 0; i < ix->count; i++) byname[i] = &ix->entries[i];
  for (size_t i = 0; i < ix->meta_count; i++) bykey[i] = &ix->meta[i];
  if (ix->count) qsort(byname, ix->count, sizeof(*byname), cmp_entry_name);
  if (ix->meta_count) qsort(bykey, ix->meta_count, sizeof(*bykey), cmp_kv_key);
  for (size_t i = 1; i < ix->count; i++)
    if (!strcmp(byname[i - 1]->name, byname[i]->name)) {
      rc = ckptio_err_fmt(err, errlen, CKPTIO_E_DUPLICATE,
                          "duplicate key: tensor '%.200s' appears twice", byname[i]->name);
      goto fail;
    }
  for (size_t i = 1; i < ix->meta_count; i++)
    if (!strcmp(bykey[i - 1]->key, bykey[i]->key)) {
      rc = ckptio_err_fmt(err, errlen, CKPTIO_E_DUPLICATE,
                          "duplicate key: __metadata__ key '%.200s' appears twice", bykey[i]->key);
      goto fail;
    }
  /* Check every CRC key before changing the metadata, so a failure leaves
   * the index whole for ckptio_st_index_free. */
  for (int apply = 0; apply <= 1; apply++) {
    size_t kept = 0;
    for (size_t i = 0; i < ix->meta_count; i++) {
      ckptio_st_kv *kv = &ix->meta[i];
      if (strncmp(kv->key, CKPTIO_ST_CRC_PREFIX, plen) != 0) {
        if (apply) ix->meta[kept++] = *kv;
        continue;
      }
      uint32_t crc;
      ckptio_st_entry probe = {.name = kv->key + plen}, *pp = &probe, **hit;
      if (parse_crc(kv->value, &crc) < 0) {
        rc = ckptio_err_fmt(err, errlen, CKPTIO_E_HEADER_JSON,
                            "invalid header: __metadata__ '%.200s' is '%.40s', not 8 hex digits",
                            kv->key, kv->value);
        goto fail;
      }
      hit = ix->count ? bsearch(&pp, byname, ix->count, sizeof(*byname), cmp_entry_name) : NULL;
      if (!hit) {
        rc = ckptio_err_fmt(err, errlen, CKPTIO_E_HEADER_JSON,
                            "invalid header: __metadata__ '%.200s' names no tensor", kv->key);
        goto fail;
      }
      if (apply) {
        (*hit)->has_crc = 1;
        (*hit)->crc = crc;
        free(kv->key);
        free(kv->value);
      }
    }
    if (apply) ix->meta_count = kept;
  }
  free(bykey);
  free(byname);
  return 0;
nomem:
  rc = ckptio_err_fmt(err, errlen, -ENOMEM, "out of memory indexing the header");
fail:
  free(bykey);
  free(byname);
  return rc;
}

static void fmt_shape(const ckptio_st_entry *e, char *buf, size_t n) {
  size_t used = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < e->ndim && used < n; d++)
    used += (size_t)snprintf(buf + used, n - used, "%s%" PRId64, d ? ", " : "", e->shape[d]);
  if (used < n) snprintf(buf + used, n - used, "]");
}

/* Rules 6 and 7 over the entries sorted by offsets. */
static int check_layout(ckptio_st_index *ix, uint64_t data_len, char *err, size_t errlen) {
  uint64_t start = 0;
  char shape[160];
  if (ix->count) qsort(ix->entries, ix->count, sizeof(*ix->entries), cmp_entry_offsets);
  for (size_t i = 0; i < ix->count; i++) {
    const ckptio_st_entry *e = &ix->entries[i];
    const char *dt = ckptio_dtype_name(e->dtype);
    if (e->end < e->begin)
      return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_OFFSET,
                            "invalid offset: tensor '%.200s': data_offsets [%" PRIu64 ", %" PRIu64
                            ") end before begin", e->name, e->begin, e->end);
    if (e->begin != start)
      return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_OFFSET,
                            "invalid offset: tensor '%.200s': data_offsets [%" PRIu64 ", %" PRIu64
                            ") begin at %" PRIu64 " but the data before it ends at %" PRIu64
                            " (%s)", e->name, e->begin, e->end, e->begin, start,
                            e->begin < start ? "overlap" : "hole");
    start = e->end;
    int64_t nbytes = CKPTIO_E_OVERFLOW;
    int negative = 0;
    for (int d = 0; d < e->ndim; d++) negative |= e->shape[d] < 0;
    if (!negative) nbytes = ckptio_tensor_nbytes(e->dtype, e->ndim, e->shape);
    if (nbytes == CKPTIO_E_OVERFLOW)
      return ckptio_err_fmt(err, errlen, CKPTIO_E_OVERFLOW,
                            "validation overflow: tensor '%.200s': shape x %s size does not fit "
                            "in 63 bits", e->name, dt);
    fmt_shape(e, shape, sizeof(shape));
    if (nbytes == CKPTIO_E_MISALIGNED)
      return ckptio_err_fmt(err, errlen, CKPTIO_E_MISALIGNED,
                            "misaligned slice: tensor '%.200s': %s %s is not a whole number of bytes",
                            e->name, dt, shape);
    if (nbytes < 0)
      return ckptio_err_fmt(err, errlen, (int)nbytes, "tensor '%.200s': %s %s: %s", e->name, dt,
                            shape, ckptio_strerror((int)nbytes));
    if (e->end - e->begin != (uint64_t)nbytes)
      return ckptio_err_fmt(err, errlen, CKPTIO_E_TENSOR_INFO,
                            "tensor invalid info: tensor '%.200s': data_offsets [%" PRIu64 ", %" PRIu64
                            ") hold %" PRIu64 " bytes but %s %s needs %" PRId64, e->name, e->begin,
                            e->end, e->end - e->begin, dt, shape, nbytes);
  }
  if (start != data_len)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INCOMPLETE_BUFFER,
                          "metadata incomplete buffer: the tensors cover %" PRIu64
                          " bytes but the file holds %" PRIu64 " after the header (%s)",
                          start, data_len, start < data_len ? "trailing bytes" : "file truncated");
  return 0;
}

int ckptio_st_parse(const uint8_t *header, uint64_t header_len, uint64_t file_size,
                    ckptio_st_index *out, char *err, size_t errlen) {
  st_parse s;
  size_t bad;
  int rc;
  if (!out || (!header && header_len))
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "st_parse: NULL argument");
  memset(out, 0, sizeof(*out));
  memset(&s, 0, sizeof(s));
  /* Rules 1-3 again, so this function is safe on its own. */
  if (file_size < 8)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_HEADER_TOO_SMALL,
                          "header too small: the file has %" PRIu64 " bytes", file_size);
  if (header_len > CKPTIO_ST_MAX_HEADER)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_HEADER_TOO_LARGE,
                          "header too large: %" PRIu64 " bytes", header_len);
  if (header_len > file_size - 8)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_HEADER_LENGTH,
                          "invalid header length: 8 + %" PRIu64 " runs past the end of the %" PRIu64
                          "-byte file", header_len, file_size);
  if (ckptio_utf8_check(header, (size_t)header_len, &bad) < 0)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_HEADER_UTF8,
                          "invalid header: not UTF-8 at header byte %zu", bad);
  s.out = out;
  s.err = err;
  s.errlen = errlen;
  ckptio_json_init(&s.j, header, (size_t)header_len, err, errlen);
  if ((rc = parse_object(&s)) < 0) goto fail;
  if ((rc = check_names(out, err, errlen)) < 0) goto fail;
  if ((rc = check_layout(out, file_size - 8 - header_len, err, errlen)) < 0) goto fail;
  out->data_start = 8 + header_len;
  ckptio_json_free(&s.j);
  return 0;
fail:
  ckptio_json_free(&s.j);
  ckptio_st_index_free(out);
  return rc;
}

void ckptio_st_index_free(ckptio_st_index *idx) {
  if (!idx) return;
  for (size_t i = 0; i < idx->count; i++) free(idx->entries[i].name);
  for (size_t i = 0; i < idx->meta_count; i++) {
    free(idx->meta[i].key);
    free(idx->meta[i].value);
  }
  free(idx->entries);
  free(idx->meta);
  memset(idx, 0, sizeof(*idx));
}

/* ------------------------------------------------------------ writing */

typedef struct plan_item {
  int paged;    /* the size is a whole number of pages */
  int bits;
  const char *name;
  size_t index;
} plan_item;

/* Tensors of whole pages first, so that from the page-aligned start of the
 * data each of them starts on a page: O_DIRECT can then read them straight
 * into page-aligned memory (a run of small tensors in between, as the
 * reference order puts the norms among the layers, shifts every later one
 * off the page). Within each group the reference's order: widest elements
 * first (alignment), then by name. */
static int cmp_plan_item(const void *a, const void *b) {
  const plan_item *x = a, *y = b;
  if (x->paged != y->paged) return x->paged ? -1 : 1;
  if (x->bits != y->bits) return x->bits > y->bits ? -1 : 1;
  int c = strcmp(x->name, y->name);
  if (c) return c;
  return x->index < y->index ? -1 : x->index > y->index;
}

static int valid_text(const char *s) {
  return s && ckptio_utf8_check((const uint8_t *)s, strlen(s), NULL) == 0;
}

/* Checks what the caller promised, so a plan never yields a file our own
 * reader refuses. */
static int check_inputs(const ckptio_st_input *in, size_t n, const ckptio_st_kv *meta, size_t nmeta,
                        char *err, size_t errlen) {
  const size_t plen = strlen(CKPTIO_ST_CRC_PREFIX);
  for (size_t i = 0; i < n; i++) {
    if (!valid_text(in[i].name) || !strcmp(in[i].name, META_KEY))
      return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG,
                            "tensor %zu: name is NULL, not UTF-8 or \"__metadata__\"", i);
    if ((in[i].ndim && !in[i].shape) || in[i].ndim < 0 || in[i].ndim > CKPTIO_MAX_DIMS)
      return ckptio_err_fmt(err, errlen, CKPTIO_E_SHAPE, "tensor '%.200s': bad ndim %d",
                            in[i].name, in[i].ndim);
    int64_t nb = ckptio_tensor_nbytes(in[i].dtype, in[i].ndim, in[i].shape);
    if (nb < 0)
      return ckptio_err_fmt(err, errlen, (int)nb, "tensor '%.200s': %s", in[i].name,
                            ckptio_strerror((int)nb));
    if ((uint64_t)nb != in[i].nbytes)
      return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG,
                            "tensor '%.200s': nbytes %" PRIu64 " but dtype and shape give %" PRId64,
                            in[i].name, in[i].nbytes, nb);
  }
  for (size_t i = 0; i < nmeta; i++) {
    if (!valid_text(meta[i].key) || !valid_text(meta[i].value))
      return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG,
                            "metadata %zu: key or value is NULL or not UTF-8", i);
    if (!strcmp(meta[i].key, CKPTIO_ST_VERSION_KEY) || !strncmp(meta[i].key, CKPTIO_ST_CRC_PREFIX, plen))
      return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG,
                            "metadata key '%.200s' is reserved for ckptio", meta[i].key);
  }
  return 0;
}

/* `"key":"value"` with both escaped; *value_pos gets the offset of the
 * value's first byte when not NULL. */
static int put_kv(ckptio_json_out *o, const char *prefix, const char *key, const char *value,
                  size_t *value_pos) {
  int rc;
  if (*prefix) {
    size_t a = strlen(prefix), b = strlen(key);
    char *k = malloc(a + b + 1);
    if (!k) return -ENOMEM;
    memcpy(k, prefix, a);
    memcpy(k + a, key, b + 1);
    rc = ckptio_json_out_string(o, k);
    free(k);
  } else {
    rc = ckptio_json_out_string(o, key);
  }
  if (rc == 0) rc = ckptio_json_out_put(o, ":", 1);
  if (rc == 0 && value_pos) *value_pos = o->len + 1;
  if (rc == 0) rc = ckptio_json_out_string(o, value);
  return rc;
}

int ckptio_st_plan_make(const ckptio_st_input *inputs, size_t n,
                        const ckptio_st_kv *meta, size_t nmeta, int with_crc,
                        uint64_t data_align, ckptio_st_plan *out,
                        char *err, size_t errlen) {
  ckptio_json_out o = {0};
  plan_item *items = NULL;
  uint64_t *begin = NULL, data = 0;
  char version[32];
  int rc;
  if (!out || (n && !inputs) || (nmeta && !meta))
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "st_plan_make: NULL argument");
  memset(out, 0, sizeof(*out));
  if (data_align < 8 || (data_align & (data_align - 1)))
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG,
                          "data_align %" PRIu64 " is not a power of two >= 8", data_align);
  if ((rc = check_inputs(inputs, n, meta, nmeta, err, errlen)) < 0) return rc;

  size_t alloc_n = n ? n : 1;
  items = malloc(alloc_n * sizeof(*items));
  begin = malloc(alloc_n * sizeof(*begin));
  out->order = malloc(alloc_n * sizeof(*out->order));
  out->offset = malloc(alloc_n * sizeof(*out->offset));
  out->crc_pos = calloc(alloc_n, sizeof(*out->crc_pos));
  if (!items || !begin || !out->order || !out->offset || !out->crc_pos) goto nomem;
  out->count = n;
  for (size_t i = 0; i < n; i++)
    items[i] = (plan_item){inputs[i].nbytes && inputs[i].nbytes % 4096 == 0, ckptio_dtype_bits(inputs[i].dtype),
                           inputs[i].name, i};
  if (n) qsort(items, n, sizeof(*items), cmp_plan_item);
  for (size_t k = 0; k < n; k++) {
    size_t i = items[k].index;
    out->order[k] = i;
    begin[i] = data;
    if (__builtin_add_overflow(data, inputs[i].nbytes, &data)) {
      rc = ckptio_err_fmt(err, errlen, CKPTIO_E_OVERFLOW, "total tensor bytes overflow 64 bits");
      goto fail;
    }
  }

  /* Room for the length prefix; filled in once the padding is known. */
  if (ckptio_json_out_put(&o, "\0\0\0\0\0\0\0\0{\"__metadata__\":{", 8 + 17) < 0) goto nomem;
  for (size_t m = 0; m < nmeta; m++) {
    if (put_kv(&o, "", meta[m].key, meta[m].value, NULL) < 0 || ckptio_json_out_put(&o, ",", 1) < 0)
      goto nomem;
  }
  snprintf(version, sizeof(version), "%d.%d.%d", CKPTIO_VERSION_MAJOR, CKPTIO_VERSION_MINOR,
           CKPTIO_VERSION_PATCH);
  if (put_kv(&o, "", CKPTIO_ST_VERSION_KEY, version, NULL) < 0) goto nomem;
  for (size_t k = 0; with_crc && k < n; k++) {
    size_t i = out->order[k];
    if (ckptio_json_out_put(&o, ",", 1) < 0 ||
        put_kv(&o, CKPTIO_ST_CRC_PREFIX, inputs[i].name, "00000000", &out->crc_pos[i]) < 0)
      goto nomem;
  }
  if (ckptio_json_out_put(&o, "}", 1) < 0) goto nomem;
  for (size_t k = 0; k < n; k++) {
    size_t i = out->order[k];
    const ckptio_st_input *t = &inputs[i];
    int ok = ckptio_json_out_put(&o, ",", 1) == 0 && ckptio_json_out_string(&o, t->name) == 0 &&
             ckptio_json_out_puts(&o, ":{\"dtype\":\"") == 0 &&
             ckptio_json_out_puts(&o, ckptio_dtype_name(t->dtype)) == 0 &&
             ckptio_json_out_puts(&o, "\",\"shape\":[") == 0;
    for (int d = 0; ok && d < t->ndim; d++)
      ok = (d == 0 || ckptio_json_out_put(&o, ",", 1) == 0) &&
           ckptio_json_out_u64(&o, (uint64_t)t->shape[d]) == 0;
    ok = ok && ckptio_json_out_puts(&o, "],\"data_offsets\":[") == 0 &&
         ckptio_json_out_u64(&o, begin[i]) == 0 && ckptio_json_out_put(&o, ",", 1) == 0 &&
         ckptio_json_out_u64(&o, begin[i] + t->nbytes) == 0 && ckptio_json_out_puts(&o, "]}") == 0;
    if (!ok) goto nomem;
  }
  if (ckptio_json_out_put(&o, "}", 1) < 0) goto nomem;

  /* Pad with spaces (which every reader skips) so the data starts aligned. */
  uint64_t total = ((uint64_t)o.len + data_align - 1) & ~(data_align - 1);
  if (total < o.len || total - 8 > CKPTIO_ST_MAX_HEADER) {
    rc = ckptio_err_fmt(err, errlen, CKPTIO_E_HEADER_TOO_LARGE,
                        "header too large: %zu bytes of JSON, the limit is %llu", o.len - 8,
                        CKPTIO_ST_MAX_HEADER);
    goto fail;
  }
  size_t pad = (size_t)(total - o.len);
  while (pad) {
    static const char spaces[64] = "                                                                ";
    size_t c = pad < sizeof(spaces) ? pad : sizeof(spaces);
    if (ckptio_json_out_put(&o, spaces, c) < 0) goto nomem;
    pad -= c;
  }
  uint64_t hlen = total - 8;
  for (int b = 0; b < 8; b++) o.data[b] = (char)(hlen >> (8 * b));
  if (__builtin_add_overflow(total, data, &out->file_size)) {
    rc = ckptio_err_fmt(err, errlen, CKPTIO_E_OVERFLOW, "file size overflows 64 bits");
    goto fail;
  }
  for (size_t i = 0; i < n; i++) out->offset[i] = total + begin[i];
  out->header = (uint8_t *)o.data;
  out->header_bytes = total;
  free(items);
  free(begin);
  return 0;
nomem:
  rc = ckptio_err_fmt(err, errlen, -ENOMEM, "out of memory planning the header");
fail:
  free(o.data);
  free(items);
  free(begin);
  ckptio_st_plan_free(out);
  return rc;
}

void ckptio_st_plan_set_crc(ckptio_st_plan *p, size_t i, uint32_t crc) {
  static const char hex[] = "0123456789abcdef";
  if (!p || !p->header || !p->crc_pos || i >= p->count || !p->crc_pos[i]) return;
  uint8_t *d = p->header + p->crc_pos[i];
  for (int k = 0; k < 8; k++) d[k] = (uint8_t)hex[(crc >> (28 - 4 * k)) & 15];
}

void ckptio_st_plan_free(ckptio_st_plan *p) {
  if (!p) return;
  free(p->header);
  free(p->order);
  free(p->offset);
  free(p->crc_pos);
  memset(p, 0, sizeof(*p));
}

int ckptio_st_to_index(ckptio_st_index *st, ckptio_index *idx) {
  idx->format = CKPTIO_INDEX_SAFETENSORS;
  idx->header_bytes = st->data_start;
  if (!(idx->entries = calloc(st->count + 1, sizeof(ckptio_entry)))) return -ENOMEM;
  for (size_t i = 0; i < st->count; i++) {
    ckptio_st_entry *e = &st->entries[i];
    ckptio_entry *d = &idx->entries[i];
    d->name = e->name;
    d->dtype = e->dtype;
    d->ndim = e->ndim;
    memcpy(d->shape, e->shape, sizeof(d->shape));
    d->offset = st->data_start + e->begin;
    d->nbytes = e->end - e->begin;
    d->has_crc = e->has_crc;
    d->crc = e->crc;
    e->name = NULL;
  }
  idx->count = st->count;
  idx->meta = (ckptio_meta *)st->meta; /* same layout: two owned strings */
  idx->meta_count = st->meta_count;
  st->meta = NULL;
  st->meta_count = 0;
  return 0;
}
