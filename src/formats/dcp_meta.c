/*
 * DCP's .metadata: the pickle run on the safe machine with DCP's classes
 * allowlisted, then its fixed schema walked into items, chunks and storage
 * ranges. The walk follows the schema only (a field's type is checked
 * before it is entered), so no shape of pickle makes it recurse or loop.
 */
#include "formats/dcp_meta.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "formats/json.h"
#include "formats/pickle_read.h"

typedef struct walk {
  ckptio_pickle pk;
  ckptio_dcp_meta *out;
  char **raw;        /* relative_path of storage entry k, before files are merged */
  size_t nraw;
  char *err;
  size_t errlen;
} walk;

#define NONE_ID UINT32_MAX

/* DCP's classes, allowed to its .metadata beside torch's weights_only
 * globals and read as data: its metadata dataclasses (made by NEWOBJ and
 * BUILD), the enum and path they hold (REDUCE of their arguments), and
 * the layout value. A GLOBAL or OBJECT value of one has its kind in aux. */
enum {
  CKPTIO_DCP_METADATA = CKPTIO_PICKLE_CLASS_BASE,
  CKPTIO_DCP_TENSOR_MD,
  CKPTIO_DCP_BYTES_MD,
  CKPTIO_DCP_CHUNK_MD,
  CKPTIO_DCP_PROPERTIES,
  CKPTIO_DCP_INDEX,
  CKPTIO_DCP_STORAGE_META,
  CKPTIO_DCP_MEM_FORMAT,
  CKPTIO_DCP_STORAGE_INFO,
  CKPTIO_DCP_PATH,
  CKPTIO_DCP_STRIDED,
};

#define DCP_MD "torch.distributed.checkpoint.metadata."
static const ckptio_pickle_class kDcpClasses[] = {
    {DCP_MD "Metadata", CKPTIO_DCP_METADATA, CKPTIO_PICKLE_BY_STATE},
    {DCP_MD "TensorStorageMetadata", CKPTIO_DCP_TENSOR_MD, CKPTIO_PICKLE_BY_STATE},
    {DCP_MD "BytesStorageMetadata", CKPTIO_DCP_BYTES_MD, CKPTIO_PICKLE_BY_STATE},
    {DCP_MD "ChunkStorageMetadata", CKPTIO_DCP_CHUNK_MD, CKPTIO_PICKLE_BY_STATE},
    {DCP_MD "TensorProperties", CKPTIO_DCP_PROPERTIES, CKPTIO_PICKLE_BY_STATE},
    {DCP_MD "MetadataIndex", CKPTIO_DCP_INDEX, CKPTIO_PICKLE_BY_STATE},
    {DCP_MD "StorageMeta", CKPTIO_DCP_STORAGE_META, CKPTIO_PICKLE_BY_STATE},
    {DCP_MD "_MEM_FORMAT_ENCODING", CKPTIO_DCP_MEM_FORMAT, CKPTIO_PICKLE_BY_ARGS},
    {"torch.distributed.checkpoint.filesystem._StorageInfo", CKPTIO_DCP_STORAGE_INFO, CKPTIO_PICKLE_BY_STATE},
    {"pathlib.PosixPath", CKPTIO_DCP_PATH, CKPTIO_PICKLE_BY_ARGS},
    {"pathlib._local.PosixPath", CKPTIO_DCP_PATH, CKPTIO_PICKLE_BY_ARGS},
    {"torch.strided", CKPTIO_DCP_STRIDED, CKPTIO_PICKLE_A_VALUE},
};
#undef DCP_MD

/* Pickle.dump's protocol 4, as DCP writes its .metadata, and its classes. */
static const ckptio_pickle_rules kDcpRules = {
    .protocol4 = 1,
    .classes = kDcpClasses,
    .nclasses = sizeof(kDcpClasses) / sizeof(kDcpClasses[0]),
    .classes_are = "DCP's metadata classes",
};

static const char *class_name(int cls) {
  static const char *const names[] = {"Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                                      "ChunkStorageMetadata", "TensorProperties", "MetadataIndex",
                                      "StorageMeta", "_MEM_FORMAT_ENCODING", "_StorageInfo", "PosixPath",
                                      "torch.strided"};
  int k = cls - CKPTIO_DCP_METADATA;
  return k >= 0 && k < (int)(sizeof(names) / sizeof(names[0])) ? names[k] : "?";
}

static const ckptio_pv *VAL(const walk *w, uint32_t id) { return &w->pk.values[id]; }

static const char *type_of(const walk *w, uint32_t id) {
  const ckptio_pv *v = VAL(w, id);
  return v->type == CKPTIO_PV_OBJECT ? class_name(v->aux) : ckptio_pickle_type_name(v);
}

static int fail(walk *w, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(walk *w, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ckptio_err_vfmt(w->err, w->errlen, code, ".metadata: ", "", fmt, ap);
  va_end(ap);
  return code;
}

static int oom(walk *w) { return fail(w, -ENOMEM, "out of memory"); }

void ckptio_dcp_dims_text(const int64_t *v, int n, char *buf, size_t len) {
  size_t at = (size_t)snprintf(buf, len, "[");
  for (int d = 0; d < n && at < len; d++) at += (size_t)snprintf(buf + at, len - at, d ? ", %lld" : "%lld", (long long)v[d]);
  if (at < len) snprintf(buf + at, len - at, "]");
}

/* ------------------------------------------------------------ values */

/* The fields of an instance of class cls: its BUILD state, a dict (or the
 * (None, dict) pair of a class with slots). NONE_ID: it has none. */
static int fields_of(walk *w, uint32_t id, int cls, const char *what, uint32_t *dict) {
  const ckptio_pv *v = VAL(w, id);
  if (v->type != CKPTIO_PV_OBJECT || v->aux != cls)
    return fail(w, CKPTIO_E_PICKLE, "%s is a %s, not a %s", what, type_of(w, id), class_name(cls));
  *dict = v->u.index;
  if (*dict == NONE_ID) return 0;
  const ckptio_pv *st = VAL(w, *dict);
  if (st->type == CKPTIO_PV_TUPLE && st->n == 2 && VAL(w, w->pk.items[st->u.first])->type == CKPTIO_PV_NONE)
    st = VAL(w, *dict = w->pk.items[st->u.first + 1]);
  if (st->type != CKPTIO_PV_DICT)
    return fail(w, CKPTIO_E_PICKLE, "%s (%s) has a %s for its fields, not a dict", what, class_name(cls),
                type_of(w, *dict));
  return 0;
}

/* The value of field `key` of a fields dict, or NONE_ID when absent. */
static uint32_t field(const walk *w, uint32_t dict, const char *key) {
  if (dict == NONE_ID) return NONE_ID;
  size_t klen = strlen(key), n;
  for (uint32_t nd = VAL(w, dict)->u.first; nd != UINT32_MAX; nd = w->pk.nodes[nd].next) {
    const char *k = ckptio_pickle_str(&w->pk, w->pk.nodes[nd].key, &n);
    if (k && VAL(w, w->pk.nodes[nd].key)->type == CKPTIO_PV_STR && n == klen && !memcmp(k, key, n))
      return w->pk.nodes[nd].value;
  }
  return NONE_ID;
}

static int is_none(const walk *w, uint32_t id) { return id == NONE_ID || VAL(w, id)->type == CKPTIO_PV_NONE; }

/* A str value that is UTF-8 text without NUL, at most max bytes. */
static int get_str(walk *w, uint32_t id, const char *what, size_t max, const char **s, size_t *n) {
  if (id == NONE_ID) return fail(w, CKPTIO_E_PICKLE, "%s is missing", what);
  if (VAL(w, id)->type != CKPTIO_PV_STR) return fail(w, CKPTIO_E_PICKLE, "%s is a %s, not a str", what, type_of(w, id));
  *s = ckptio_pickle_str(&w->pk, id, n);
  if (*n > max) return fail(w, CKPTIO_E_PICKLE, "%s is %zu bytes long (limit %zu)", what, *n, max);
  if (memchr(*s, 0, *n) || ckptio_utf8_check((const uint8_t *)*s, *n, NULL) < 0)
    return fail(w, CKPTIO_E_PICKLE, "%s is not UTF-8 text without NUL", what);
  return 0;
}

static int get_u64(walk *w, uint32_t id, const char *what, const char *name, uint64_t *out) {
  if (id == NONE_ID) return fail(w, CKPTIO_E_PICKLE, "%s of '%.200s' is missing", what, name);
  const ckptio_pv *v = VAL(w, id);
  if (v->type == CKPTIO_PV_BIGINT) return fail(w, CKPTIO_E_OVERFLOW, "%s of '%.200s' does not fit 64 bits", what, name);
  if (v->type != CKPTIO_PV_INT) return fail(w, CKPTIO_E_PICKLE, "%s of '%.200s' is a %s, not an int", what, name, type_of(w, id));
  if (v->u.i < 0) return fail(w, CKPTIO_E_SHARD, "%s of '%.200s' is negative (%" PRId64 ")", what, name, v->u.i);
  *out = (uint64_t)v->u.i;
  return 0;
}

/* A torch.Size (pickled as the tuple it wraps) of non-negative ints. */
static int get_dims(walk *w, uint32_t id, const char *what, const char *name, int64_t *dims, int *ndim) {
  if (id == NONE_ID) return fail(w, CKPTIO_E_PICKLE, "%s of '%.200s' is missing", what, name);
  const ckptio_pv *v = VAL(w, id);
  if (v->type != CKPTIO_PV_TUPLE)
    return fail(w, CKPTIO_E_PICKLE, "%s of '%.200s' is a %s, not a torch.Size", what, name, type_of(w, id));
  if (v->n > CKPTIO_MAX_DIMS)
    return fail(w, CKPTIO_E_SHAPE, "%s of '%.200s' has %u dims; ckptio handles up to %d", what, name, v->n,
                CKPTIO_MAX_DIMS);
  for (uint32_t d = 0; d < v->n; d++) {
    uint64_t x;
    int rc = get_u64(w, w->pk.items[v->u.first + d], what, name, &x);
    if (rc < 0) return rc == CKPTIO_E_SHARD ? fail(w, CKPTIO_E_SHAPE, "%s of '%.200s' has a negative entry", what, name) : rc;
    if (x > INT64_MAX) return fail(w, CKPTIO_E_OVERFLOW, "%s of '%.200s' does not fit 64 bits", what, name);
    dims[d] = (int64_t)x;
  }
  *ndim = (int)v->n;
  return 0;
}

/* ------------------------------------------------------------ items */

static int read_properties(walk *w, uint32_t id, ckptio_dcp_item *it) {
  const ckptio_pv *v = VAL(w, id);
  if (v->type != CKPTIO_PV_OBJECT || v->aux != CKPTIO_DCP_PROPERTIES)
    return fail(w, CKPTIO_E_PICKLE, "properties of '%.200s' are a %s, not TensorProperties", it->name, type_of(w, id));
  /* TensorProperties pickles its __getstate__ tuple: (dtype, layout,
   * requires_grad, memory format, pin_memory[, strides]). */
  uint32_t st = v->u.index;
  if (st == NONE_ID || VAL(w, st)->type != CKPTIO_PV_TUPLE || VAL(w, st)->n < 5 || VAL(w, st)->n > 6)
    return fail(w, CKPTIO_E_PICKLE, "properties of '%.200s' are not the 5- or 6-tuple TensorProperties pickles",
                it->name);
  const uint32_t *a = w->pk.items + VAL(w, st)->u.first;
  int td = ckptio_pickle_dtype_of(&w->pk, a[0]);
  if (td < 0) return fail(w, CKPTIO_E_PICKLE, "dtype of '%.200s' is a %s, not a torch dtype", it->name, type_of(w, a[0]));
  const ckptio_torch_dtype *t = ckptio_torch_dtype_at(td);
  if (t->ckptio < 0)
    return fail(w, CKPTIO_E_DTYPE, "tensor '%.200s' is torch.%s, which ckptio has no dtype for", it->name, t->name);
  it->dtype = (ckptio_dtype)t->ckptio;
  const ckptio_pv *layout = VAL(w, a[1]);
  if (layout->type != CKPTIO_PV_GLOBAL || layout->aux != CKPTIO_DCP_STRIDED)
    return fail(w, CKPTIO_E_FORMAT, "tensor '%.200s' has a layout other than torch.strided (sparse?); not supported",
                it->name);
  return 0;
}

static int read_chunk(walk *w, uint32_t id, ckptio_dcp_item *it, ckptio_dcp_chunk *c) {
  uint32_t f;
  int nd = 0, rc;
  if ((rc = fields_of(w, id, CKPTIO_DCP_CHUNK_MD, "a chunk", &f)) < 0) return rc;
  if ((rc = get_dims(w, field(w, f, "offsets"), "chunk offsets", it->name, c->offsets, &nd)) < 0) return rc;
  if (nd != it->ndim)
    return fail(w, CKPTIO_E_SHARD, "a chunk of '%.200s' has %d offsets for %d dims", it->name, nd, it->ndim);
  if ((rc = get_dims(w, field(w, f, "sizes"), "chunk sizes", it->name, c->sizes, &nd)) < 0) return rc;
  if (nd != it->ndim)
    return fail(w, CKPTIO_E_SHARD, "a chunk of '%.200s' has %d sizes for %d dims", it->name, nd, it->ndim);
  for (int d = 0; d < nd; d++)
    if (c->offsets[d] > it->shape[d] || c->sizes[d] > it->shape[d] - c->offsets[d]) {
      char a[256];
      ckptio_dcp_dims_text(c->offsets, nd, a, sizeof(a));
      return fail(w, CKPTIO_E_SHARD, "chunk %s of '%.200s' runs past the tensor's size along dim %d", a, it->name, d);
    }
  c->at.file = UINT32_MAX;
  return 0;
}

static int read_item(walk *w, uint32_t key, uint32_t val, ckptio_dcp_item *it) {
  const char *s;
  size_t n;
  uint32_t f;
  int rc;
  if ((rc = get_str(w, key, "a state_dict_metadata key", CKPTIO_PICKLE_MAX_PATH, &s, &n)) < 0) return rc;
  if (!(it->name = strndup(s, n))) return oom(w);
  it->bytes.file = UINT32_MAX;
  const ckptio_pv *v = VAL(w, val);
  if (v->type == CKPTIO_PV_OBJECT && v->aux == CKPTIO_DCP_BYTES_MD) {
    it->is_bytes = 1;
    return 0;
  }
  if (v->type != CKPTIO_PV_OBJECT || v->aux != CKPTIO_DCP_TENSOR_MD)
    return fail(w, CKPTIO_E_PICKLE, "item '%.200s' is a %s, not TensorStorageMetadata or BytesStorageMetadata",
                it->name, type_of(w, val));
  if ((rc = fields_of(w, val, CKPTIO_DCP_TENSOR_MD, "a tensor item", &f)) < 0) return rc;
  uint32_t props = field(w, f, "properties"), chunks = field(w, f, "chunks");
  if (props == NONE_ID) return fail(w, CKPTIO_E_PICKLE, "tensor '%.200s' has no properties", it->name);
  if ((rc = read_properties(w, props, it)) < 0) return rc;
  if ((rc = get_dims(w, field(w, f, "size"), "size", it->name, it->shape, &it->ndim)) < 0) return rc;
  int64_t nb = ckptio_tensor_nbytes(it->dtype, it->ndim, it->shape);
  if (nb < 0) return fail(w, (int)nb, "tensor '%.200s': its size times its element size: %s", it->name, ckptio_strerror((int)nb));
  if (chunks == NONE_ID || VAL(w, chunks)->type != CKPTIO_PV_LIST)
    return fail(w, CKPTIO_E_PICKLE, "chunks of '%.200s' are %s, not a list", it->name,
                chunks == NONE_ID ? "missing" : type_of(w, chunks));
  const ckptio_pv *l = VAL(w, chunks);
  if (l->n == 0 || l->n > CKPTIO_DCP_MAX_CHUNKS)
    return fail(w, CKPTIO_E_SHARD, "tensor '%.200s' has %u chunks (1 to %d allowed)", it->name, l->n,
                CKPTIO_DCP_MAX_CHUNKS);
  if (!(it->chunks = calloc(l->n, sizeof(*it->chunks)))) return oom(w);
  size_t k = 0;
  for (uint32_t nd = l->u.first; nd != UINT32_MAX; nd = w->pk.nodes[nd].next, k++)
    if ((rc = read_chunk(w, w->pk.nodes[nd].value, it, &it->chunks[k])) < 0) return rc;
  it->nchunks = k;
  return 0;
}

static int cmp_item(const void *a, const void *b) {
  return strcmp(((const ckptio_dcp_item *)a)->name, ((const ckptio_dcp_item *)b)->name);
}

static int cmp_chunk(const void *a, const void *b, void *ndim) {
  const ckptio_dcp_chunk *x = a, *y = b;
  for (int d = 0; d < *(const int *)ndim; d++)
    if (x->offsets[d] != y->offsets[d]) return x->offsets[d] < y->offsets[d] ? -1 : 1;
  return 0;
}

/* bsearch with a context argument (glibc has qsort_r but no bsearch_r). */
static void *bsearch_r(const void *key, void *base, size_t n, size_t size, int (*cmp)(const void *, const void *, void *),
                       void *ctx) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    void *p = (char *)base + mid * size;
    int c = cmp(key, p, ctx);
    if (c == 0) return p;
    if (c < 0) hi = mid;
    else lo = mid + 1;
  }
  return NULL;
}

static int overlap(const ckptio_dcp_chunk *a, const ckptio_dcp_chunk *b, int nd) {
  for (int d = 0; d < nd; d++) {
    int64_t lo = a->offsets[d] > b->offsets[d] ? a->offsets[d] : b->offsets[d];
    int64_t ha = a->offsets[d] + a->sizes[d], hb = b->offsets[d] + b->sizes[d];
    if ((ha < hb ? ha : hb) <= lo) return 0;
  }
  return 1;
}

/* Pairs of chunks one tensor's overlap check may compare: the sweep along
 * the first dimension is near linear for real layouts (a few column chunks
 * per row band), quadratic for chunks that all share their first-dimension
 * span; a file asking for more than this many comparisons is refused, not
 * spent seconds on. 1024 chunks sharing one band take 0.5 million. */
#define MAX_OVERLAP_PAIRS (1u << 26)

/* Sorted by offsets (sort_chunks), no two overlapping, their volumes the
 * tensor's: they cover it exactly. */
static int check_chunks(walk *w, ckptio_dcp_item *it) {
  int nd = it->ndim;
  char a[256], b[256];
  uint64_t total = 1, sum = 0, pairs = 0;
  for (int d = 0; d < nd; d++) total *= (uint64_t)it->shape[d]; /* fits: nbytes was checked */
  for (size_t i = 0; i < it->nchunks; i++) {
    const ckptio_dcp_chunk *c = &it->chunks[i];
    uint64_t vol = 1;
    for (int d = 0; d < nd; d++) vol *= (uint64_t)c->sizes[d]; /* inside the tensor: fits */
    sum += vol;
    if (sum > total) break;
    if (!vol) continue;
    for (size_t j = i + 1; j < it->nchunks && (nd == 0 || it->chunks[j].offsets[0] < c->offsets[0] + c->sizes[0]); j++) {
      if (++pairs > MAX_OVERLAP_PAIRS)
        return fail(w, CKPTIO_E_SHARD, "the %zu chunks of '%.200s' share their first-dimension spans too much to check "
                    "for overlaps (over %u comparisons)", it->nchunks, it->name, MAX_OVERLAP_PAIRS);
      if (overlap(c, &it->chunks[j], nd)) {
        ckptio_dcp_dims_text(c->offsets, nd, a, sizeof(a));
        ckptio_dcp_dims_text(it->chunks[j].offsets, nd, b, sizeof(b));
        return fail(w, CKPTIO_E_SHARD, "chunks %s and %s of '%.200s' overlap", a, b, it->name);
      }
    }
  }
  if (sum != total)
    return fail(w, CKPTIO_E_SHARD, "the chunks of '%.200s' hold %s elements of its %" PRIu64 ": they do not cover it",
                it->name, sum > total ? "more than the" : "fewer than the", total);
  return 0;
}

/* ------------------------------------------------------------ storage */

static int plain_name(const char *s, size_t n) {
  return n && n <= CKPTIO_DCP_MAX_FILE_NAME && !memchr(s, '/', n) && !memchr(s, '\\', n) &&
         !(n == 1 && s[0] == '.') && !(n == 2 && s[0] == '.' && s[1] == '.');
}

static ckptio_dcp_item *find_item(walk *w, const char *name, size_t n) {
  size_t lo = 0, hi = w->out->nitems;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const char *m = w->out->items[mid].name;
    int c = strncmp(m, name, n);
    if (c == 0) c = m[n] ? 1 : 0;
    if (c == 0) return &w->out->items[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return NULL;
}

static int read_storage_info(walk *w, uint32_t id, const char *name, ckptio_dcp_storage *at) {
  uint32_t f;
  const char *s;
  size_t n;
  int rc;
  if ((rc = fields_of(w, id, CKPTIO_DCP_STORAGE_INFO, "a storage_data value", &f)) < 0) return rc;
  if ((rc = get_str(w, field(w, f, "relative_path"), "a relative_path", CKPTIO_DCP_MAX_FILE_NAME, &s, &n)) < 0)
    return rc;
  if (!plain_name(s, n))
    return fail(w, CKPTIO_E_SHARD, "'%.200s' is stored in '%.*s', not a plain file name in the checkpoint's directory",
                name, (int)n, s);
  if ((rc = get_u64(w, field(w, f, "offset"), "storage offset", name, &at->offset)) < 0 ||
      (rc = get_u64(w, field(w, f, "length"), "storage length", name, &at->length)) < 0)
    return rc;
  if (at->offset + at->length < at->offset)
    return fail(w, CKPTIO_E_OVERFLOW, "storage of '%.200s': offset + length overflows 64 bits", name);
  uint32_t tr = field(w, f, "transform_descriptors");
  if (!is_none(w, tr)) {
    const ckptio_pv *l = VAL(w, tr);
    if (l->type != CKPTIO_PV_LIST && l->type != CKPTIO_PV_TUPLE)
      return fail(w, CKPTIO_E_PICKLE, "transform_descriptors of '%.200s' are a %s, not a list", name, type_of(w, tr));
    for (uint32_t k = 0; k < l->n; k++) {
      uint32_t d = l->type == CKPTIO_PV_TUPLE ? w->pk.items[l->u.first + k] : NONE_ID;
      if (l->type == CKPTIO_PV_LIST) {
        uint32_t nd = l->u.first;
        for (uint32_t j = 0; j < k; j++) nd = w->pk.nodes[nd].next;
        d = w->pk.nodes[nd].value;
      }
      const char *t;
      size_t tn;
      if ((rc = get_str(w, d, "a transform descriptor", 256, &t, &tn)) < 0) return rc;
      if (l->n == 1 && tn == 13 && !memcmp(t, "stream.zstd/1", 13)) at->zstd = 1;
      else
        return fail(w, CKPTIO_E_FORMAT, "'%.200s' is stored through the transform '%.*s'%s; ckptio reads none or "
                    "stream.zstd/1 alone", name, (int)tn, t, l->n > 1 ? " among others" : "");
    }
  }
  if (w->nraw % 64 == 0) {
    char **r = realloc(w->raw, (w->nraw + 64) * sizeof(*r));
    if (!r) return oom(w);
    w->raw = r;
  }
  if (!(w->raw[w->nraw] = strndup(s, n))) return oom(w);
  at->file = (uint32_t)w->nraw++;
  return 0;
}

static int read_storage_entry(walk *w, uint32_t key, uint32_t val) {
  uint32_t f;
  const char *s;
  size_t n;
  int64_t off[CKPTIO_MAX_DIMS];
  int nd = 0, rc;
  char a[256];
  if ((rc = fields_of(w, key, CKPTIO_DCP_INDEX, "a storage_data key", &f)) < 0) return rc;
  if ((rc = get_str(w, field(w, f, "fqn"), "a MetadataIndex fqn", CKPTIO_PICKLE_MAX_PATH, &s, &n)) < 0) return rc;
  ckptio_dcp_item *it = find_item(w, s, n);
  if (!it) return fail(w, CKPTIO_E_SHARD, "storage_data names '%.*s', which state_dict_metadata does not hold", (int)(n > 200 ? 200 : n), s);
  uint32_t o = field(w, f, "offset");
  ckptio_dcp_storage *at = NULL;
  if (it->is_bytes) {
    if (!is_none(w, o)) return fail(w, CKPTIO_E_SHARD, "byte item '%.200s' has storage at a tensor offset", it->name);
    at = &it->bytes;
  } else {
    if (is_none(w, o)) return fail(w, CKPTIO_E_SHARD, "tensor '%.200s' has storage with no chunk offset", it->name);
    if ((rc = get_dims(w, o, "storage offset", it->name, off, &nd)) < 0) return rc;
    ckptio_dcp_dims_text(off, nd, a, sizeof(a));
    if (nd != it->ndim) return fail(w, CKPTIO_E_SHARD, "storage of '%.200s' at %s: not a chunk of it", it->name, a);
    /* The chunks are sorted by offsets (DCP's `index` hint, a place in the
     * unsorted list, is not needed): a lookup costs log(chunks). */
    ckptio_dcp_chunk key;
    memcpy(key.offsets, off, sizeof(key.offsets));
    ckptio_dcp_chunk *hit = bsearch_r(&key, it->chunks, it->nchunks, sizeof(*it->chunks), cmp_chunk, &nd);
    if (hit) at = &hit->at;
    if (!at) return fail(w, CKPTIO_E_SHARD, "storage of '%.200s' at %s: no chunk of it starts there", it->name, a);
  }
  if (at->file != UINT32_MAX)
    return fail(w, CKPTIO_E_SHARD, "'%.200s'%s%s is stored twice", it->name, it->is_bytes ? "" : " chunk ",
                it->is_bytes ? "" : a);
  return read_storage_info(w, val, it->name, at);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Distinct file names, and every storage's file as an index among them. */
static int merge_files(walk *w) {
  ckptio_dcp_meta *m = w->out;
  char **sorted = malloc((w->nraw + 1) * sizeof(char *));
  if (!sorted || !(m->files = calloc(w->nraw + 1, sizeof(char *)))) {
    free(sorted);
    return oom(w);
  }
  memcpy(sorted, w->raw, w->nraw * sizeof(char *));
  if (w->nraw) qsort(sorted, w->nraw, sizeof(char *), cmp_str);
  for (size_t k = 0; k < w->nraw; k++)
    if (!m->nfiles || strcmp(m->files[m->nfiles - 1], sorted[k])) {
      if (!(m->files[m->nfiles] = strdup(sorted[k]))) {
        free(sorted);
        return oom(w);
      }
      m->nfiles++;
    }
  free(sorted);
  size_t u = m->nfiles;
  for (size_t i = 0; i < m->nitems; i++) {
    ckptio_dcp_item *it = &m->items[i];
    for (size_t c = 0; c <= it->nchunks; c++) {
      ckptio_dcp_storage *at = c < it->nchunks ? &it->chunks[c].at : &it->bytes;
      if (c == it->nchunks && !it->is_bytes) break;
      if (at->file == UINT32_MAX) {
        char a[256] = "";
        if (!it->is_bytes) ckptio_dcp_dims_text(it->chunks[c].offsets, it->ndim, a, sizeof(a));
        return fail(w, CKPTIO_E_SHARD, "'%.200s'%s%s has no entry in storage_data: its bytes are nowhere",
                    it->name, it->is_bytes ? "" : " chunk ", it->is_bytes ? "" : a);
      }
      char **hit = bsearch(&w->raw[at->file], m->files, u, sizeof(char *), cmp_str);
      at->file = (uint32_t)(hit - m->files);
    }
  }
  return 0;
}

/* ------------------------------------------------------------ the whole */

static int read_optional_str(walk *w, uint32_t id, const char *what, char **out) {
  const char *s;
  size_t n;
  if (is_none(w, id)) return 0;
  int rc = get_str(w, id, what, 4096, &s, &n);
  if (rc < 0) return rc;
  return (*out = strndup(s, n)) ? 0 : oom(w);
}

static int read_all(walk *w) {
  ckptio_dcp_meta *m = w->out;
  uint32_t f, sm;
  int rc;
  if ((rc = fields_of(w, w->pk.root, CKPTIO_DCP_METADATA, "the pickled object", &f)) < 0) return rc;
  uint32_t sdm = field(w, f, "state_dict_metadata"), sd = field(w, f, "storage_data");
  if (sdm == NONE_ID || VAL(w, sdm)->type != CKPTIO_PV_DICT)
    return fail(w, CKPTIO_E_PICKLE, "state_dict_metadata is %s, not a dict", sdm == NONE_ID ? "missing" : type_of(w, sdm));
  if (sd == NONE_ID || VAL(w, sd)->type != CKPTIO_PV_DICT)
    return fail(w, CKPTIO_E_PICKLE, "storage_data is %s, not a dict (written by a storage other than DCP's "
                "FileSystemWriter?)", sd == NONE_ID ? "missing" : type_of(w, sd));
  if ((rc = read_optional_str(w, field(w, f, "version"), "version", &m->version)) < 0) return rc;
  uint32_t smv = field(w, f, "storage_meta");
  if (!is_none(w, smv)) {
    if ((rc = fields_of(w, smv, CKPTIO_DCP_STORAGE_META, "storage_meta", &sm)) < 0) return rc;
    if ((rc = read_optional_str(w, field(w, sm, "save_id"), "save_id", &m->save_id)) < 0) return rc;
  }
  const ckptio_pv *d = VAL(w, sdm);
  if (!(m->items = calloc(d->n + 1, sizeof(*m->items)))) return oom(w);
  for (uint32_t nd = d->u.first; nd != UINT32_MAX; nd = w->pk.nodes[nd].next)
    if ((rc = read_item(w, w->pk.nodes[nd].key, w->pk.nodes[nd].value, &m->items[m->nitems++])) < 0) return rc;
  if (m->nitems) qsort(m->items, m->nitems, sizeof(*m->items), cmp_item);
  for (size_t i = 0; i < m->nitems; i++)
    if (!m->items[i].is_bytes) qsort_r(m->items[i].chunks, m->items[i].nchunks, sizeof(ckptio_dcp_chunk), cmp_chunk,
                                       &m->items[i].ndim);
  for (size_t i = 1; i < m->nitems; i++)
    if (!strcmp(m->items[i - 1].name, m->items[i].name))
      return fail(w, CKPTIO_E_DUPLICATE, "two items named '%.200s'", m->items[i].name);
  d = VAL(w, sd);
  for (uint32_t nd = d->u.first; nd != UINT32_MAX; nd = w->pk.nodes[nd].next)
    if ((rc = read_storage_entry(w, w->pk.nodes[nd].key, w->pk.nodes[nd].value)) < 0) return rc;
  if ((rc = merge_files(w)) < 0) return rc;
  for (size_t i = 0; i < m->nitems; i++)
    if (!m->items[i].is_bytes && (rc = check_chunks(w, &m->items[i])) < 0) return rc;
  return 0;
}

int ckptio_dcp_meta_parse(const uint8_t *buf, size_t len, ckptio_dcp_meta *out, char *err, size_t errlen) {
  walk w;
  if (!out || (!buf && len)) return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "dcp_meta_parse: NULL argument");
  memset(out, 0, sizeof(*out));
  memset(&w, 0, sizeof(w));
  w.out = out;
  w.err = err;
  w.errlen = errlen;
  char msg[CKPTIO_ERRLEN];
  int rc = ckptio_pickle_parse_with(buf, len, &kDcpRules, &w.pk, msg, sizeof(msg));
  if (rc < 0) rc = ckptio_err_fmt(err, errlen, rc, ".metadata: %s", msg);
  else rc = read_all(&w);
  for (size_t k = 0; k < w.nraw; k++) free(w.raw[k]);
  free(w.raw);
  ckptio_pickle_free(&w.pk);
  if (rc < 0) ckptio_dcp_meta_free(out);
  return rc;
}

void ckptio_dcp_meta_free(ckptio_dcp_meta *m) {
  if (!m) return;
  for (size_t i = 0; m->items && i < m->nitems; i++) {
    free(m->items[i].name);
    free(m->items[i].chunks);
  }
  for (size_t k = 0; m->files && k < m->nfiles; k++) free(m->files[k]);
  free(m->items);
  free(m->files);
  free(m->version);
  free(m->save_id);
  memset(m, 0, sizeof(*m));
}
