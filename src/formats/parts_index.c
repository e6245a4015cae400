/* The "ckptio" section of a multi-rank checkpoint's index: split tensors
 * and where each part lives (docs/FORMATS.md). Parsed strictly (every key
 * known, every rule that needs only the index checked, bounded work on
 * hostile input) and written in the layout the document shows. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/box.h"
#include "formats/hf_index.h"

#define SFAIL(x, ...) ckptio_err_fmt((x)->err, sizeof((x)->err), CKPTIO_E_SHARD, __VA_ARGS__)

static void dims_text(const int64_t *v, int n, char *buf, size_t len) {
  size_t at = (size_t)snprintf(buf, len, "[");
  for (int d = 0; d < n && at < len; d++) at += (size_t)snprintf(buf + at, len - at, d ? ", %lld" : "%lld", (long long)v[d]);
  if (at < len) snprintf(buf + at, len - at, "]");
}

/* ------------------------------------------------------------ parse */

/* An array of at most CKPTIO_MAX_DIMS integers of int64 range. */
static int parse_dims(ckptio_json *j, ckptio_hf_index *x, const char *what, const char *name, int64_t *out, int *n) {
  size_t count = 0;
  int rc = ckptio_json_array_begin(j);
  if (rc < 0) return SFAIL(x, "ckptio section: %s of '%s' is not an array", what, name);
  *n = 0;
  while ((rc = ckptio_json_array_next(j, &count)) == 1) {
    uint64_t v;
    if (*n == CKPTIO_MAX_DIMS) return SFAIL(x, "ckptio section: %s of '%s' has more than %d dims", what, name, CKPTIO_MAX_DIMS);
    if (ckptio_json_peek(j) < '0' || ckptio_json_peek(j) > '9' || (rc = ckptio_json_u64(j, &v)) < 0 || v > INT64_MAX)
      return SFAIL(x, "ckptio section: %s of '%s' holds a value that is not an integer from 0 to 2^63-1", what, name);
    out[(*n)++] = (int64_t)v;
  }
  return rc;
}

static int parse_part(ckptio_json *j, ckptio_hf_index *x, ckptio_split_tensor *t, ckptio_split_part *p) {
  size_t count = 0;
  const char *key;
  int seen_file = 0, seen_off = 0, seen_shape = 0, noff = -1, nshape = -1, rc;
  if (ckptio_json_peek(j) != '{' || (rc = ckptio_json_object_begin(j)) < 0)
    return SFAIL(x, "ckptio section: a part of '%s' is not an object", t->name);
  while ((rc = ckptio_json_object_next(j, &count, &key)) == 1) {
    if (!strcmp(key, "file") && !seen_file++) {
      const char *f;
      size_t n;
      if (ckptio_json_peek(j) != '"') return SFAIL(x, "ckptio section: a part of '%s' has a file that is not a string", t->name);
      if ((rc = ckptio_json_string(j, &f, &n)) < 0) return rc;
      const char *why = ckptio_hf_bad_file_name(f, n);
      if (why) return SFAIL(x, "ckptio section: file '%s' of a part of '%s' %s", f, t->name, why);
      if (!(p->file_name = strdup(f))) return -ENOMEM;
    } else if (!strcmp(key, "offsets") && !seen_off++) {
      if ((rc = parse_dims(j, x, "the offsets of a part", t->name, p->offsets, &noff)) < 0) return rc;
    } else if (!strcmp(key, "shape") && !seen_shape++) {
      if ((rc = parse_dims(j, x, "the shape of a part", t->name, p->shape, &nshape)) < 0) return rc;
    } else {
      return SFAIL(x, "ckptio section: a part of '%s' has an unknown or repeated key '%s'", t->name, key);
    }
  }
  if (rc < 0) return rc;
  if (!seen_file || !seen_off || !seen_shape)
    return SFAIL(x, "ckptio section: a part of '%s' lacks \"%s\"", t->name,
                 !seen_file ? "file" : !seen_off ? "offsets" : "shape");
  if (noff != t->ndim || nshape != t->ndim)
    return SFAIL(x, "ckptio section: a part of '%s' has %d offsets and %d sizes for a tensor of %d dims", t->name, noff,
                 nshape, t->ndim);
  return 0;
}

static int parse_parts(ckptio_json *j, ckptio_hf_index *x, ckptio_split_tensor *t) {
  size_t count = 0, cap = 0;
  int rc = ckptio_json_array_begin(j);
  if (rc < 0) return SFAIL(x, "ckptio section: the parts of '%s' are not an array", t->name);
  while ((rc = ckptio_json_array_next(j, &count)) == 1) {
    if (t->nparts == CKPTIO_SPLIT_MAX_PARTS)
      return SFAIL(x, "ckptio section: '%s' has more than %d parts", t->name, CKPTIO_SPLIT_MAX_PARTS);
    if (t->nparts == cap) {
      size_t ncap = cap ? 2 * cap : 8;
      ckptio_split_part *q = realloc(t->parts, ncap * sizeof(*q));
      if (!q) return -ENOMEM;
      t->parts = q, cap = ncap;
    }
    ckptio_split_part *p = &t->parts[t->nparts++];
    memset(p, 0, sizeof(*p));
    if ((rc = parse_part(j, x, t, p)) < 0) return rc;
  }
  return rc;
}

/* A tensor's object. The dtype and shape must come before the parts (the
 * layout ckptio writes, with keys sorted): a part is checked against them
 * as it is read. */
static int parse_tensor(ckptio_json *j, ckptio_hf_index *x, ckptio_split_tensor *t) {
  size_t count = 0;
  const char *key;
  int seen_dtype = 0, seen_shape = 0, seen_parts = 0, rc;
  if (ckptio_json_peek(j) != '{' || (rc = ckptio_json_object_begin(j)) < 0)
    return SFAIL(x, "ckptio section: tensor '%s' is not an object", t->name);
  while ((rc = ckptio_json_object_next(j, &count, &key)) == 1) {
    if (!strcmp(key, "dtype") && !seen_dtype++) {
      const char *v;
      size_t n;
      if (ckptio_json_peek(j) != '"' || (rc = ckptio_json_string(j, &v, &n)) < 0 || ckptio_dtype_parse(v, &t->dtype) < 0)
        return rc == -ENOMEM ? rc : SFAIL(x, "ckptio section: tensor '%s' has an unknown dtype", t->name);
    } else if (!strcmp(key, "shape") && !seen_shape++) {
      if ((rc = parse_dims(j, x, "the shape", t->name, t->shape, &t->ndim)) < 0) return rc;
    } else if (!strcmp(key, "parts") && !seen_parts++) {
      if (!seen_dtype || !seen_shape)
        return SFAIL(x, "ckptio section: tensor '%s' lists its parts before its dtype and shape", t->name);
      if ((rc = parse_parts(j, x, t)) < 0) return rc;
    } else {
      return SFAIL(x, "ckptio section: tensor '%s' has an unknown or repeated key '%s'", t->name, key);
    }
  }
  if (rc < 0) return rc;
  if (!seen_parts) return SFAIL(x, "ckptio section: tensor '%s' has no \"parts\"", t->name);
  return 0;
}

static int parse_tensors(ckptio_json *j, ckptio_hf_index *x) {
  size_t count = 0, cap = 0;
  const char *key;
  int rc = ckptio_json_peek(j) == '{' ? ckptio_json_object_begin(j) : -1;
  if (rc < 0) return SFAIL(x, "ckptio section: \"tensors\" is not an object");
  while ((rc = ckptio_json_object_next(j, &count, &key)) == 1) {
    if (x->nsplit == cap) {
      size_t ncap = cap ? 2 * cap : 16;
      ckptio_split_tensor *q = realloc(x->split, ncap * sizeof(*q));
      if (!q) return -ENOMEM;
      x->split = q, cap = ncap;
    }
    ckptio_split_tensor *t = &x->split[x->nsplit];
    memset(t, 0, sizeof(*t));
    if (!(t->name = strdup(key))) return -ENOMEM;
    x->nsplit++;
    if ((rc = parse_tensor(j, x, t)) < 0) return rc;
  }
  return rc;
}

int ckptio_parts_parse(ckptio_json *j, ckptio_hf_index *x) {
  size_t count = 0;
  const char *key;
  int seen_version = 0, seen_tensors = 0, rc;
  if (ckptio_json_peek(j) != '{' || (rc = ckptio_json_object_begin(j)) < 0)
    return SFAIL(x, "the \"ckptio\" section is not an object");
  while ((rc = ckptio_json_object_next(j, &count, &key)) == 1) {
    if (!strcmp(key, "version") && !seen_version++) {
      uint64_t v = 0;
      if (ckptio_json_peek(j) < '0' || ckptio_json_peek(j) > '9' || (rc = ckptio_json_u64(j, &v)) < 0 || v != 1)
        return rc == -ENOMEM ? rc
                             : SFAIL(x, "ckptio section: version %llu is not one this reader knows (1)", (unsigned long long)v);
    } else if (!strcmp(key, "tensors") && !seen_tensors++) {
      if ((rc = parse_tensors(j, x)) < 0) return rc;
    } else {
      /* Strict: a later layout changes the version, so a key unknown
       * here is a damaged or foreign index, not an extension. */
      return SFAIL(x, "ckptio section: unknown or repeated key '%s'", key);
    }
  }
  if (rc < 0) return rc;
  if (!seen_version) return SFAIL(x, "ckptio section: no \"version\"");
  if (!seen_tensors || x->nsplit == 0) return SFAIL(x, "ckptio section: no split tensors (the section is written only for them)");
  return 0;
}

/* ------------------------------------------------------------ check */

static int cmp_split(const void *a, const void *b) {
  return strcmp(((const ckptio_split_tensor *)a)->name, ((const ckptio_split_tensor *)b)->name);
}

static int cmp_part(const void *a, const void *b) {
  const ckptio_split_part *p = a, *q = b;
  for (int d = 0; d < CKPTIO_MAX_DIMS; d++)
    if (p->offsets[d] != q->offsets[d]) return p->offsets[d] < q->offsets[d] ? -1 : 1;
  return 0;
}

static int check_tensor(ckptio_hf_index *x, ckptio_split_tensor *t) {
  char a[256], b[256];
  int64_t nb = ckptio_tensor_nbytes(t->dtype, t->ndim, t->shape);
  if (nb < 0) return SFAIL(x, "ckptio section: tensor '%s': %s", t->name, ckptio_strerror((int)nb));
  if (t->nparts == 0) return SFAIL(x, "ckptio section: tensor '%s' has no parts", t->name);
  if (ckptio_hf_index_find(x, t->name)) return SFAIL(x, "tensor '%s' is both in weight_map and split in the ckptio section", t->name);
  int64_t(*off)[CKPTIO_MAX_DIMS] = calloc(t->nparts, sizeof(*off));
  int64_t(*size)[CKPTIO_MAX_DIMS] = calloc(t->nparts, sizeof(*size));
  if (!off || !size) {
    free(off);
    free(size);
    return -ENOMEM;
  }
  int rc = 0;
  for (size_t i = 0; i < t->nparts && rc == 0; i++) {
    memcpy(off[i], t->parts[i].offsets, sizeof(off[i]));
    memcpy(size[i], t->parts[i].shape, sizeof(size[i]));
    int64_t pb = ckptio_tensor_nbytes(t->dtype, t->ndim, t->parts[i].shape);
    if (pb < 0) {
      dims_text(t->parts[i].offsets, t->ndim, a, sizeof(a));
      rc = SFAIL(x, "part %s of '%s' (file '%s'): %s", a, t->name, x->files[t->parts[i].file], ckptio_strerror((int)pb));
    }
  }
  size_t i = 0, k = 0;
  ckptio_box_result why = rc == 0 ? ckptio_box_cover_check(t->ndim, t->shape, off, size, t->nparts, &i, &k) : CKPTIO_BOX_OK;
  free(off);
  free(size);
  if (rc < 0) return rc;
  dims_text(t->parts[i].offsets, t->ndim, a, sizeof(a));
  dims_text(t->parts[k].offsets, t->ndim, b, sizeof(b));
  switch (why) {
    case CKPTIO_BOX_OK:
      break;
    case CKPTIO_BOX_NOMEM:
      return -ENOMEM;
    case CKPTIO_BOX_OUTSIDE:
      dims_text(t->shape, t->ndim, b, sizeof(b));
      return SFAIL(x, "part %s of '%s' (file '%s') lies outside its shape %s", a, t->name, x->files[t->parts[i].file], b);
    case CKPTIO_BOX_OVERLAP:
      return SFAIL(x, "part %s of '%s' (file '%s') overlaps part %s (file '%s')", a, t->name,
                   x->files[t->parts[i].file], b, x->files[t->parts[k].file]);
    case CKPTIO_BOX_HOLE:
      dims_text(t->shape, t->ndim, b, sizeof(b));
      return SFAIL(x, "the parts of '%s' leave a hole in its shape %s", t->name, b);
    case CKPTIO_BOX_TOO_COMPLEX:
      return SFAIL(x, "the %zu parts of '%s' are too many to check in any other layout than a grid", t->nparts, t->name);
  }
  qsort(t->parts, t->nparts, sizeof(*t->parts), cmp_part);
  return 0;
}

int ckptio_parts_check(ckptio_hf_index *x) {
  if (x->nsplit > 1) qsort(x->split, x->nsplit, sizeof(*x->split), cmp_split);
  for (size_t i = 1; i < x->nsplit; i++)
    if (!strcmp(x->split[i - 1].name, x->split[i].name))
      return SFAIL(x, "ckptio section: tensor '%s' appears twice", x->split[i].name);
  for (size_t i = 0; i < x->nsplit; i++) {
    int rc = check_tensor(x, &x->split[i]);
    if (rc < 0) return rc;
  }
  return 0;
}

void ckptio_parts_free(ckptio_hf_index *x) {
  for (size_t i = 0; i < x->nsplit; i++) {
    for (size_t k = 0; k < x->split[i].nparts; k++) free(x->split[i].parts[k].file_name);
    free(x->split[i].parts);
    free(x->split[i].name);
  }
  free(x->split);
  x->split = NULL;
  x->nsplit = 0;
}

const ckptio_split_tensor *ckptio_hf_index_find_split(const ckptio_hf_index *x, const char *tensor) {
  ckptio_split_tensor key = {.name = (char *)tensor};
  return x->nsplit ? bsearch(&key, x->split, x->nsplit, sizeof(*x->split), cmp_split) : NULL;
}

/* ------------------------------------------------------------ write */

static int put_dims(ckptio_json_out *o, const int64_t *v, int n) {
  int rc = ckptio_json_out_puts(o, "[");
  for (int d = 0; d < n; d++) {
    if (d) rc |= ckptio_json_out_puts(o, ", ");
    rc |= ckptio_json_out_u64(o, (uint64_t)v[d]);
  }
  return rc | ckptio_json_out_puts(o, "]");
}

static int cmp_split_out(const void *a, const void *b) {
  return strcmp(((const ckptio_split_out *)a)->name, ((const ckptio_split_out *)b)->name);
}

static int cmp_part_out(const void *a, const void *b, void *arg) {
  const ckptio_split_part_out *p = a, *q = b;
  int n = *(const int *)arg;
  for (int d = 0; d < n; d++)
    if (p->offsets[d] != q->offsets[d]) return p->offsets[d] < q->offsets[d] ? -1 : 1;
  return 0;
}

int ckptio_parts_write(const ckptio_split_out *split, size_t nsplit, ckptio_json_out *o) {
  ckptio_split_out *s = calloc(nsplit + 1, sizeof(*s));
  if (!s) return -ENOMEM;
  memcpy(s, split, nsplit * sizeof(*s));
  qsort(s, nsplit, sizeof(*s), cmp_split_out);
  int rc = 0;
  for (size_t i = 1; i < nsplit && rc == 0; i++)
    if (!strcmp(s[i - 1].name, s[i].name)) rc = CKPTIO_E_DUPLICATE;
  if (rc == 0) rc = ckptio_json_out_puts(o, "  \"ckptio\": {\n    \"version\": 1,\n    \"tensors\": {");
  for (size_t i = 0; i < nsplit && rc == 0; i++) {
    ckptio_split_part_out *p = malloc((s[i].nparts + 1) * sizeof(*p));
    if (!p) {
      rc = -ENOMEM;
      break;
    }
    memcpy(p, s[i].parts, s[i].nparts * sizeof(*p));
    qsort_r(p, s[i].nparts, sizeof(*p), cmp_part_out, &s[i].ndim);
    rc |= ckptio_json_out_puts(o, i ? ",\n      " : "\n      ");
    rc |= ckptio_json_out_string(o, s[i].name);
    rc |= ckptio_json_out_puts(o, ": {\n        \"dtype\": ");
    rc |= ckptio_json_out_string(o, ckptio_dtype_name(s[i].dtype) ? ckptio_dtype_name(s[i].dtype) : "?");
    rc |= ckptio_json_out_puts(o, ",\n        \"shape\": ");
    rc |= put_dims(o, s[i].shape, s[i].ndim);
    rc |= ckptio_json_out_puts(o, ",\n        \"parts\": [");
    for (size_t k = 0; k < s[i].nparts; k++) {
      rc |= ckptio_json_out_puts(o, k ? ",\n          {\"file\": " : "\n          {\"file\": ");
      rc |= ckptio_json_out_string(o, p[k].file);
      rc |= ckptio_json_out_puts(o, ", \"offsets\": ");
      rc |= put_dims(o, p[k].offsets, s[i].ndim);
      rc |= ckptio_json_out_puts(o, ", \"shape\": ");
      rc |= put_dims(o, p[k].shape, s[i].ndim);
      rc |= ckptio_json_out_puts(o, "}");
    }
    rc |= ckptio_json_out_puts(o, "\n        ]\n      }");
    free(p);
  }
  if (rc == 0) rc = ckptio_json_out_puts(o, "\n    }\n  }\n");
  free(s);
  return rc;
}
