/*
 * torch.save archives into the generic index: find the records, run data.pkl
 * on the safe unpickler, name every tensor by its path in the saved object,
 * and check each one against the storage record it views. Scalars along the
 * way become metadata.
 */
#include "formats/torch_read.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "formats/json.h"
#include "formats/pickle_read.h"
#include "formats/torch_write.h"
#include "formats/zip_read.h"

typedef struct storage_info {
  const ckptio_zip_entry *rec;  /* "<prefix>/data/<key>" */
  uint64_t nbytes;
  int first;                    /* the first reference to its record (one per key) */
} storage_info;

typedef struct build {
  ckptio_zip zip;
  ckptio_pickle pk;
  char prefix[CKPTIO_ZIP_MAX_NAME + 1];
  int big;                       /* byteorder "big" */
  storage_info *st;              /* one per pickle storage reference */
  ckptio_index *out;
  size_t entries_cap, meta_cap;
  char *path;                    /* the walk's current dotted name */
  size_t plen;
  uint64_t budget;               /* walk steps left */
  char *err;
  size_t errlen;
} build;

static int oom(build *b) {
  return ckptio_err_fmt(b->err, b->errlen, -ENOMEM, "out of memory indexing the checkpoint");
}

static int grow(void **arr, size_t *cap, size_t count, size_t elem) {
  if (count < *cap) return 0;
  size_t ncap = *cap ? *cap * 2 : 16;
  void *p = ncap <= SIZE_MAX / elem ? realloc(*arr, ncap * elem) : NULL;
  if (!p) return -ENOMEM;
  *arr = p;
  *cap = ncap;
  return 0;
}

static char *dup_n(const char *s, size_t n) {
  char *p = malloc(n + 1);
  if (p) memcpy(p, s, n), p[n] = '\0';
  return p;
}

static int is_text(const char *s, size_t n) {
  return !memchr(s, 0, n) && ckptio_utf8_check((const uint8_t *)s, n, NULL) == 0;
}

/* "<prefix>/<rest>", or NULL. rest need not be NUL-terminated. */
static const ckptio_zip_entry *record(const build *b, const char *rest, size_t n) {
  char name[CKPTIO_ZIP_MAX_NAME + 2];
  size_t p = strlen(b->prefix);
  if (p + 1 + n >= sizeof(name)) return NULL;
  memcpy(name, b->prefix, p);
  name[p] = '/';
  memcpy(name + p + 1, rest, n);
  name[p + 1 + n] = '\0';
  return ckptio_zip_find(&b->zip, name);
}

static const char *dtype_label(int dtype) {
  return dtype == CKPTIO_TORCH_UNTYPED ? "UntypedStorage (bytes)" : ckptio_torch_dtype_at(dtype)->name;
}

/* ------------------------------------------------------------ storages */

static int cmp_key(const void *a, const void *b, void *ctx) {
  const ckptio_pickle *pk = ctx;
  size_t la, lb;
  const char *x = ckptio_pickle_str(pk, pk->storages[*(const size_t *)a].key, &la);
  const char *y = ckptio_pickle_str(pk, pk->storages[*(const size_t *)b].key, &lb);
  int c = memcmp(x, y, la < lb ? la : lb);
  return c ? c : (la > lb) - (la < lb);
}

/* Every reference to a storage key must agree on its bytes and (when it has
 * any) its dtype, as torch.save guarantees; the record must hold exactly
 * those bytes. */
static int resolve_storages(build *b) {
  const ckptio_pickle *pk = &b->pk;
  size_t n = pk->nstorages, *order = NULL;
  int rc = 0;
  if (!n) return 0;
  b->st = calloc(n, sizeof(*b->st));
  order = malloc(n * sizeof(*order));
  if (!b->st || !order) {
    rc = oom(b);
    goto fail;
  }
  for (size_t i = 0; i < n; i++) {
    const ckptio_pickle_storage *s = &pk->storages[i];
    size_t kl;
    const char *key = ckptio_pickle_str(pk, s->key, &kl);
    int el = s->dtype == CKPTIO_TORCH_UNTYPED ? 1 : ckptio_torch_dtype_at(s->dtype)->elsize;
    order[i] = i;
    if (!is_text(key, kl)) {
      rc = ckptio_err_fmt(b->err, b->errlen, CKPTIO_E_PICKLE,
                          "storage key at pickle byte %" PRIu64 " is not UTF-8 text", s->pos);
      goto fail;
    }
    if (__builtin_mul_overflow(s->numel, (uint64_t)el, &b->st[i].nbytes)) {
      rc = ckptio_err_fmt(b->err, b->errlen, CKPTIO_E_OVERFLOW,
                          "storage '%.*s': %" PRIu64 " elements of %s overflow 64 bits",
                          (int)(kl > 200 ? 200 : kl), key, s->numel, dtype_label(s->dtype));
      goto fail;
    }
  }
  qsort_r(order, n, sizeof(*order), cmp_key, (void *)pk);
  for (size_t g = 0, h; g < n; g = h) {
    const ckptio_pickle_storage *s0 = &pk->storages[order[g]];
    size_t kl;
    const char *key = ckptio_pickle_str(pk, s0->key, &kl);
    int shown = (int)(kl > 200 ? 200 : kl);
    uint64_t nb = b->st[order[g]].nbytes;
    for (h = g + 1; h < n && cmp_key(&order[g], &order[h], (void *)pk) == 0; h++) {
      const ckptio_pickle_storage *s = &pk->storages[order[h]];
      if (b->st[order[h]].nbytes != nb) {
        rc = ckptio_err_fmt(b->err, b->errlen, CKPTIO_E_TENSOR_INFO,
                            "storage '%.*s' is %" PRIu64 " bytes at pickle byte %" PRIu64 " but %" PRIu64
                            " bytes at pickle byte %" PRIu64,
                            shown, key, nb, s0->pos, b->st[order[h]].nbytes, s->pos);
        goto fail;
      }
      /* torch.save refuses two dtypes over one storage with data; torch.load
       * takes them only where there are no bytes to disagree on. */
      if (s->dtype != s0->dtype && nb) {
        rc = ckptio_err_fmt(b->err, b->errlen, CKPTIO_E_DTYPE,
                            "storage '%.*s' is used as %s and as %s; a storage keeps one dtype", shown, key,
                            dtype_label(s0->dtype), dtype_label(s->dtype));
        goto fail;
      }
    }
    char rest[CKPTIO_ZIP_MAX_NAME];
    int rl = snprintf(rest, sizeof(rest), "data/%.*s", (int)(kl < sizeof(rest) ? kl : sizeof(rest)), key);
    const ckptio_zip_entry *rec = kl < sizeof(rest) - 5 ? record(b, rest, (size_t)rl) : NULL;
    if (!rec) {
      rc = ckptio_err_fmt(b->err, b->errlen, CKPTIO_E_NOT_FOUND,
                          "storage '%.*s' has no record '%s/data/%.*s' in the archive", shown, key, b->prefix,
                          shown, key);
      goto fail;
    }
    if (rec->size != nb) {
      rc = ckptio_err_fmt(b->err, b->errlen, CKPTIO_E_TENSOR_INFO,
                          "record '%s' holds %" PRIu64 " bytes but storage '%.*s' of %" PRIu64
                          " x %s needs %" PRIu64, rec->name, rec->size, shown, key, s0->numel,
                          dtype_label(s0->dtype), nb);
      goto fail;
    }
    for (size_t k = g; k < h; k++) b->st[order[k]].rec = rec;
    b->st[order[g]].first = 1;
  }
fail:
  free(order);
  return rc;
}

/* ------------------------------------------------------------ entries */

/* The view of tensor ti stays inside its storage record; *numel its
 * element count. `name` says which tensor in a message. */
static int check_view(build *b, size_t ti, const char *name, uint64_t *numel_out) {
  const ckptio_pickle_tensor *t = &b->pk.tensors[ti];
  const storage_info *si = &b->st[t->storage];
  const ckptio_torch_dtype *dt = ckptio_torch_dtype_at(t->dtype);
  uint64_t el = (uint64_t)dt->elsize, numel = 1, last = t->offset;
  for (int d = 0; d < t->ndim; d++)
    if (__builtin_mul_overflow(numel, (uint64_t)t->size[d], &numel))
      return ckptio_err_fmt(b->err, b->errlen, CKPTIO_E_OVERFLOW,
                            "tensor '%.200s': its shape overflows 64 bits", name);
  /* The last element the view touches must lie inside the storage. */
  for (int d = 0; numel && d < t->ndim; d++) {
    uint64_t span;
    if (__builtin_mul_overflow((uint64_t)t->size[d] - 1, (uint64_t)t->stride[d], &span) ||
        __builtin_add_overflow(last, span, &last))
      return ckptio_err_fmt(b->err, b->errlen, CKPTIO_E_OVERFLOW,
                            "tensor '%.200s': storage offset + (size - 1) x stride overflows 64 bits", name);
  }
  if (numel && last >= si->nbytes / el)
    return ckptio_err_fmt(b->err, b->errlen, CKPTIO_E_TENSOR_INFO,
                          "tensor '%.200s' reaches element %" PRIu64 " of record '%s', which holds %" PRIu64
                          " elements of torch.%s (%" PRIu64 " bytes)", name, last, si->rec->name,
                          si->nbytes / el, dt->name, si->nbytes);
  *numel_out = numel;
  return 0;
}

static int add_tensor(build *b, size_t ti) {
  const ckptio_pickle_tensor *t = &b->pk.tensors[ti];
  const storage_info *si = &b->st[t->storage];
  const ckptio_torch_dtype *dt = ckptio_torch_dtype_at(t->dtype);
  const char *name = b->path;
  ckptio_index *ix = b->out;
  uint64_t el = (uint64_t)dt->elsize, numel = 1, expect = 1, ob;
  int contiguous = 1, rc;
  if (dt->ckptio < 0)
    return ckptio_err_fmt(b->err, b->errlen, CKPTIO_E_DTYPE,
                          "tensor '%.200s': dtype torch.%s has no ckptio equivalent", name, dt->name);
  if ((rc = check_view(b, ti, name, &numel)) < 0) return rc;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->size[d] != 1 && (uint64_t)t->stride[d] != expect) contiguous = 0;
    expect *= (uint64_t)t->size[d];
  }
  if (grow((void **)&ix->entries, &b->entries_cap, ix->count, sizeof(*ix->entries)) < 0) return oom(b);
  ckptio_entry *e = memset(&ix->entries[ix->count], 0, sizeof(*e));
  if (!(e->name = dup_n(name, b->plen))) return oom(b);
  ix->count++;
  e->dtype = (ckptio_dtype)dt->ckptio;
  e->ndim = t->ndim;
  memcpy(e->shape, t->size, sizeof(e->shape));
  e->byteswap = b->big && el > 1;
  if (contiguous || !numel) {
    /* An empty view may sit anywhere; it reads nothing. */
    if (__builtin_mul_overflow(t->offset, el, &ob) || ob > si->nbytes) ob = si->nbytes;
    e->offset = si->rec->data_offset + ob;
    e->nbytes = numel * el;
  } else {
    e->strided = 1;
    e->offset = si->rec->data_offset;
    e->nbytes = si->rec->size;
    e->elem_offset = t->offset;
    memcpy(e->stride, t->stride, sizeof(e->stride));
  }
  /* The zip CRC covers the record: it is the entry's only when the entry is
   * the whole record. torch's "no crc" mode writes 0. */
  e->has_crc = e->offset == si->rec->data_offset && e->nbytes == si->rec->size &&
               (si->rec->crc != 0 || si->rec->size == 0);
  e->crc = e->has_crc ? si->rec->crc : 0;
  return 0;
}

static int add_meta(build *b, const char *value, size_t len) {
  ckptio_index *ix = b->out;
  if (grow((void **)&ix->meta, &b->meta_cap, ix->meta_count, sizeof(*ix->meta)) < 0) return oom(b);
  ckptio_meta *m = &ix->meta[ix->meta_count];
  m->key = dup_n(b->path, b->plen);
  m->value = dup_n(value, len);
  if (!m->key || !m->value) {
    free(m->key);
    free(m->value);
    return oom(b);
  }
  ix->meta_count++;
  return 0;
}

/* ------------------------------------------------------------ the walk */

/* Python's repr of a float: the shortest digits that read back exactly,
 * positional for exponents in [-4, 16), else d.ddde+XX. */
static void float_repr(double v, char *out, size_t cap) {
  char tmp[48], dig[24];
  int prec, nd = 0, exp = 0, neg = signbit(v) != 0;
  if (isnan(v) || isinf(v)) {
    snprintf(out, cap, "%s", isnan(v) ? "nan" : neg ? "-inf" : "inf");
    return;
  }
  for (prec = 1; prec < 17; prec++) {
    snprintf(tmp, sizeof(tmp), "%.*e", prec - 1, v);
    if (strtod(tmp, NULL) == v) break;
  }
  snprintf(tmp, sizeof(tmp), "%.*e", prec - 1, v);
  for (const char *c = tmp; *c; c++) {
    if (*c == 'e') {
      exp = (int)strtol(c + 1, NULL, 10);
      break;
    }
    if (*c >= '0' && *c <= '9' && nd < (int)sizeof(dig) - 1) dig[nd++] = *c;
  }
  while (nd > 1 && dig[nd - 1] == '0') nd--;
  dig[nd] = '\0';
  size_t o = 0;
  char *w = tmp;
  if (neg) w[o++] = '-';
  if (exp >= 16 || exp < -4) {
    w[o++] = dig[0];
    if (nd > 1) o += (size_t)snprintf(w + o, sizeof(tmp) - o, ".%s", dig + 1);
    snprintf(w + o, sizeof(tmp) - o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  } else if (exp < 0) {
    snprintf(w + o, sizeof(tmp) - o, "0.%.*s%s", -exp - 1, "0000", dig);
  } else {
    for (int k = 0; k <= exp; k++) w[o++] = k < nd ? dig[k] : '0';
    snprintf(w + o, sizeof(tmp) - o, ".%s", nd > exp + 1 ? dig + exp + 1 : "0");
  }
  snprintf(out, cap, "%s", tmp);
}

/* Decimal of a LONG1 too wide for 64 bits (at most 255 bytes: 615 digits). */
static void bigint_repr(const uint8_t *b, size_t n, char *out) {
  uint8_t mag[255];
  char rev[640];
  size_t nd = 0, o = 0;
  int neg = n && (b[n - 1] & 0x80);
  memcpy(mag, b, n);
  if (neg) { /* two's complement magnitude: invert, add one */
    int carry = 1;
    for (size_t k = 0; k < n; k++) {
      int x = (uint8_t)~mag[k] + carry;
      mag[k] = (uint8_t)x;
      carry = x >> 8;
    }
  }
  for (;;) {
    int rem = 0, nonzero = 0;
    for (size_t k = n; k-- > 0;) {
      int x = rem << 8 | mag[k];
      mag[k] = (uint8_t)(x / 10);
      rem = x % 10;
      nonzero |= mag[k];
    }
    rev[nd++] = (char)('0' + rem);
    if (!nonzero) break;
  }
  if (neg) out[o++] = '-';
  while (nd) out[o++] = rev[--nd];
  out[o] = '\0';
}

/* The text of a scalar, or NULL for a value that is not one. */
static const char *scalar_text(const ckptio_pickle *p, const ckptio_pv *v, char *buf, size_t cap,
                               size_t *len) {
  switch (v->type) {
    case CKPTIO_PV_NONE: snprintf(buf, cap, "None"); break;
    case CKPTIO_PV_BOOL: snprintf(buf, cap, "%s", v->u.i ? "True" : "False"); break;
    case CKPTIO_PV_INT: snprintf(buf, cap, "%" PRId64, v->u.i); break;
    case CKPTIO_PV_BIGINT: bigint_repr(p->buf + v->u.off, v->n, buf); break;
    case CKPTIO_PV_FLOAT: float_repr(v->u.f, buf, cap); break;
    case CKPTIO_PV_STR: *len = v->n; return (const char *)p->buf + v->u.off;
    default: return NULL;
  }
  *len = strlen(buf);
  return buf;
}

static int walk_value(build *b, uint32_t id, int depth);

/* Appends ".component" (no dot at the root) to the path and walks v. */
static int walk_child(build *b, const char *comp, size_t n, uint32_t v, int depth) {
  size_t saved = b->plen, dot = depth > 0;
  if (b->plen + dot + n >= CKPTIO_PICKLE_MAX_PATH)
    return ckptio_err_fmt(b->err, b->errlen, CKPTIO_E_FORMAT, "a name longer than %d bytes under '%.200s'",
                          CKPTIO_PICKLE_MAX_PATH, b->path);
  if (dot) b->path[b->plen++] = '.';
  memcpy(b->path + b->plen, comp, n);
  b->plen += n;
  b->path[b->plen] = '\0';
  int rc = walk_value(b, v, depth + 1);
  b->plen = saved;
  b->path[saved] = '\0';
  return rc;
}

/* Depth-first in insertion order. Values other than containers, tensors and
 * scalars (bytes, devices, dtypes, ...) name nothing and are passed over. */
static int walk_value(build *b, uint32_t id, int depth) {
  ckptio_pickle *p = &b->pk;
  ckptio_pv *v = &p->values[id];
  char buf[640];
  size_t len;
  int rc = 0;
  if (b->budget-- == 0)
    return ckptio_err_fmt(
        b->err, b->errlen, CKPTIO_E_PICKLE,
        "pickle: shared containers expand into more values than the pickle holds (a bomb?)");
  if (v->type == CKPTIO_PV_TENSOR) return add_tensor(b, v->u.index);
  if (v->type == CKPTIO_PV_STORAGE)
    return ckptio_err_fmt(b->err, b->errlen, CKPTIO_E_FORMAT, "a bare storage at '%.200s' is not supported",
                          b->path);
  const char *text = scalar_text(p, v, buf, sizeof(buf), &len);
  if (text)  /* strings that are not text cannot be metadata: left out */
    return v->type == CKPTIO_PV_STR && !is_text(text, len) ? 0 : add_meta(b, text, len);
  if (v->type != CKPTIO_PV_TUPLE && v->type != CKPTIO_PV_LIST && v->type != CKPTIO_PV_DICT) return 0;
  if (depth >= CKPTIO_PICKLE_MAX_DEPTH || v->walking)
    return ckptio_err_fmt(b->err, b->errlen, CKPTIO_E_PICKLE, "pickle: %s at '%.200s'",
                          v->walking ? "a container contains itself" : "containers nested too deep", b->path);
  v->walking = 1;
  if (v->type == CKPTIO_PV_TUPLE) {
    for (uint32_t i = 0; rc == 0 && i < v->n; i++) {
      len = (size_t)snprintf(buf, sizeof(buf), "%u", i);
      rc = walk_child(b, buf, len, p->items[v->u.first + i], depth);
    }
  } else {
    uint32_t i = 0;
    for (uint32_t nd = v->u.first; rc == 0 && nd != UINT32_MAX; nd = p->nodes[nd].next, i++) {
      const ckptio_pv *key = &p->values[p->nodes[nd].key];
      const char *comp = buf;
      if (v->type == CKPTIO_PV_LIST) {
        len = (size_t)snprintf(buf, sizeof(buf), "%u", i);
      } else if (!(comp = scalar_text(p, key, buf, sizeof(buf), &len)) || !is_text(comp, len)) {
        rc = ckptio_err_fmt(b->err, b->errlen, CKPTIO_E_FORMAT,
                            "a dict key under '%.200s' is a %s%s; only str, int, float, bool and None keys "
                            "can name tensors", b->path, ckptio_pickle_type_name(key),
                            comp ? " that is not UTF-8 text" : "");
        break;
      }
      rc = walk_child(b, comp, len, p->nodes[nd].value, depth);
    }
  }
  v->walking = 0;
  return rc;
}

/* ------------------------------------------------------------ the archive */

/* ckptio's own writer keeps string metadata in a JSON record next to the
 * pickle (torch.load ignores it): {"key": "value", ...}. */
static int read_meta_record(build *b, const uint8_t *map) {
  const ckptio_zip_entry *rec = record(b, CKPTIO_TORCH_META_RECORD, strlen(CKPTIO_TORCH_META_RECORD));
  ckptio_json j;
  const char *key, *val;
  size_t count = 0, klen, vlen;
  int rc;
  if (!rec) return 0;
  if (ckptio_utf8_check(map + rec->data_offset, (size_t)rec->size, NULL) < 0)
    return ckptio_err_fmt(b->err, b->errlen, CKPTIO_E_HEADER_UTF8, "record '%s' is not UTF-8", rec->name);
  ckptio_json_init(&j, map + rec->data_offset, (size_t)rec->size, b->err, b->errlen);
  j.context = "the metadata record";
  if ((rc = ckptio_json_object_begin(&j)) < 0) goto fail;
  while ((rc = ckptio_json_object_next(&j, &count, &key)) == 1) {
    klen = strlen(key);
    if (klen >= CKPTIO_PICKLE_MAX_PATH) {
      rc = ckptio_json_fail(&j, "metadata key too long");
      goto fail;
    }
    memcpy(b->path, key, klen + 1);  /* copied: the value overwrites key's scratch */
    b->plen = klen;
    if (ckptio_json_peek(&j) != '"') {
      rc = ckptio_json_fail(&j, "metadata value is not a string");
      goto fail;
    }
    if ((rc = ckptio_json_string(&j, &val, &vlen)) < 0 || (rc = add_meta(b, val, vlen)) < 0) goto fail;
  }
  if (rc < 0) goto fail;
  ckptio_json_skip_ws(&j);
  if (j.pos != j.len) rc = ckptio_json_fail(&j, "bytes after the metadata object");
fail:
  b->plen = 0;
  b->path[0] = '\0';
  ckptio_json_free(&j);
  return rc;
}

static int cmp_entry(const void *a, const void *b) {
  const ckptio_entry *x = a, *y = b;
  if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
  return strcmp(x->name, y->name);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Two tensors (or two metadata keys) with one name: dict keys that repeat,
 * or a key with a dot that meets a nested path. */
static int check_unique(build *b) {
  ckptio_index *ix = b->out;
  size_t n = ix->count > ix->meta_count ? ix->count : ix->meta_count;
  char **names = n ? malloc(n * sizeof(*names)) : NULL;
  int rc = 0;
  if (n && !names) return oom(b);
  for (int pass = 0; pass < 2 && rc == 0; pass++) {
    size_t m = pass ? ix->meta_count : ix->count;
    for (size_t i = 0; i < m; i++) names[i] = pass ? ix->meta[i].key : ix->entries[i].name;
    if (m) qsort(names, m, sizeof(*names), cmp_str);
    for (size_t i = 1; i < m && rc == 0; i++)
      if (!strcmp(names[i - 1], names[i]))
        rc = ckptio_err_fmt(b->err, b->errlen, CKPTIO_E_DUPLICATE, "two %s named '%.200s'",
                            pass ? "metadata values" : "tensors", names[i]);
  }
  free(names);
  return rc;
}

/* The archive's records, before the pickle: which kind of file this is. */
static int open_archive(build *b, const uint8_t *map, uint64_t size, const ckptio_zip_entry **pkl) {
  /* Compressed entries are refused after the TorchScript check: jit.save
   * compresses its code records, and that is the better message. */
  int rc = ckptio_zip_open(map, size, CKPTIO_ZIP_ALLOW_COMPRESSED, &b->zip, b->err, b->errlen);
  if (rc < 0) return rc;
  /* torch reads the folder name off the first entry; it is the saved file's
   * name, so no fixed "archive/" may be assumed. */
  const ckptio_zip_entry *first = &b->zip.entries[0];
  const char *slash = memchr(first->name, '/', first->name_len);
  if (!slash)
    return ckptio_err_fmt(b->err, b->errlen, CKPTIO_E_FORMAT,
                          "not a torch.save archive: its first entry '%.200s' is not in a folder",
                          first->name);
  memcpy(b->prefix, first->name, (size_t)(slash - first->name));
  b->prefix[slash - first->name] = '\0';
  if (record(b, "constants.pkl", 13))
    return ckptio_err_fmt(b->err, b->errlen, CKPTIO_E_FORMAT,
                          "TorchScript archive ('%.200s/constants.pkl'): load it with torch.jit.load; "
                          "ckptio reads torch.save checkpoints", b->prefix);
  if ((rc = ckptio_zip_require_stored(&b->zip, b->err, b->errlen)) < 0) return rc;
  if (!(*pkl = record(b, "data.pkl", 8)))
    return ckptio_err_fmt(b->err, b->errlen, CKPTIO_E_FORMAT,
                          "not a torch.save archive: no record '%.200s/data.pkl'", b->prefix);
  const ckptio_zip_entry *bo = record(b, "byteorder", 9);
  if (bo) {
    const char *s = (const char *)map + bo->data_offset;
    b->big = bo->size == 3 && !memcmp(s, "big", 3);
    if (!b->big && !(bo->size == 6 && !memcmp(s, "little", 6)))
      return ckptio_err_fmt(b->err, b->errlen, CKPTIO_E_FORMAT,
                            "record '%s' holds neither 'little' nor 'big' (%" PRIu64 " bytes)", bo->name,
                            bo->size);
  }
  return 0;
}

/* ------------------------------------------------------------ records */

/* One record as a 1-D U8 entry named by its path in the archive. */
static int add_record(build *b, const ckptio_zip_entry *rec) {
  ckptio_index *ix = b->out;
  size_t skip = strlen(b->prefix) + 1;
  if (grow((void **)&ix->entries, &b->entries_cap, ix->count, sizeof(*ix->entries)) < 0) return oom(b);
  ckptio_entry *e = memset(&ix->entries[ix->count], 0, sizeof(*e));
  if (!(e->name = dup_n(rec->name + skip, rec->name_len - skip))) return oom(b);
  ix->count++;
  e->dtype = CKPTIO_U8;
  e->ndim = 1;
  e->shape[0] = (int64_t)rec->size;
  e->offset = rec->data_offset;
  e->nbytes = rec->size;
  e->has_crc = rec->crc != 0 || rec->size == 0;
  e->crc = rec->crc;
  return 0;
}

/* CKPTIO_TORCH_RECORDS: data.pkl and every storage record the pickle uses,
 * once each, after every tensor's view was checked against its record. */
static int add_records(build *b, const ckptio_zip_entry *pkl) {
  char name[64];
  int rc;
  if (b->big)
    return ckptio_err_fmt(b->err, b->errlen, CKPTIO_E_FORMAT,
                          "a big-endian archive cannot be read as records; load its tensors instead");
  for (size_t i = 0; i < b->pk.ntensors; i++) {
    uint64_t numel;
    snprintf(name, sizeof(name), "the tensor at pickle byte %" PRIu64, b->pk.tensors[i].pos);
    if ((rc = check_view(b, i, name, &numel)) < 0) return rc;
  }
  if ((rc = add_record(b, pkl)) < 0) return rc;
  for (size_t i = 0; i < b->pk.nstorages; i++)
    if (b->st[i].first && (rc = add_record(b, b->st[i].rec)) < 0) return rc;
  return 0;
}

int ckptio_torch_parse(const uint8_t *map, uint64_t size, ckptio_index *out, char *err, size_t errlen) {
  return ckptio_torch_parse_flags(map, size, 0, out, err, errlen);
}

int ckptio_torch_parse_flags(const uint8_t *map, uint64_t size, unsigned flags, ckptio_index *out, char *err,
                             size_t errlen) {
  build b;
  const ckptio_zip_entry *pkl = NULL;
  int rc;
  if (!out || (!map && size))
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "torch_parse: NULL argument");
  memset(out, 0, sizeof(*out));
  memset(&b, 0, sizeof(b));
  b.out = out;
  b.err = err;
  b.errlen = errlen;
  if ((rc = open_archive(&b, map, size, &pkl)) < 0) goto fail;
  if (pkl->size > CKPTIO_PICKLE_MAX_BYTES) {
    rc = ckptio_err_fmt(err, errlen, CKPTIO_E_PICKLE,
                        "record '%s' of %" PRIu64 " bytes is over the %llu-byte limit", pkl->name, pkl->size,
                        CKPTIO_PICKLE_MAX_BYTES);
    goto fail;
  }
  if ((rc = ckptio_pickle_parse(map + pkl->data_offset, (size_t)pkl->size, &b.pk, err, errlen)) < 0)
    goto fail;
  if ((rc = resolve_storages(&b)) < 0) goto fail;
  /* Each value is reached once per reference in a tree; memo references to
   * shared containers can revisit, so the walk is bounded by a multiple. */
  b.budget = 4 * (uint64_t)(b.pk.nvalues + b.pk.nnodes + b.pk.nitems) + 1024;
  if (!(b.path = malloc(CKPTIO_PICKLE_MAX_PATH))) {
    rc = oom(&b);
    goto fail;
  }
  b.path[0] = '\0';
  if (flags & CKPTIO_TORCH_RECORDS) {
    if ((rc = add_records(&b, pkl)) < 0 || (rc = read_meta_record(&b, map)) < 0) goto fail;
  } else {
    if ((rc = walk_value(&b, b.pk.root, 0)) < 0 || (rc = read_meta_record(&b, map)) < 0) goto fail;
    if ((rc = check_unique(&b)) < 0) goto fail;
  }
  if (out->count) qsort(out->entries, out->count, sizeof(*out->entries), cmp_entry);
  out->format = CKPTIO_INDEX_PYTORCH;
  out->header_bytes = out->count ? out->entries[0].offset : size;
  free(b.path);
  free(b.st);
  ckptio_pickle_free(&b.pk);
  ckptio_zip_free(&b.zip);
  return 0;
fail:
  free(b.path);
  free(b.st);
  ckptio_pickle_free(&b.pk);
  ckptio_zip_free(&b.zip);
  ckptio_index_free(out);
  return rc;
}
