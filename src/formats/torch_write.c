/*
 * torch.save files as a writer layout (see torch_write.h): the pickle of an
 * OrderedDict of tensors, then the zip records and directories exactly as
 * PyTorch's writer (inline_container.cc, miniz mz_zip_writer_add_mem_ex_v2
 * and mz_zip_writer_finalize_archive) lays them out.
 */
#include "formats/torch_write.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/crc32.h"
#include "core/error.h"
#include "formats/json.h"
#include "formats/pickle_read.h"
#include "formats/pickle_write.h"

/* --------------------------------------------------------------- dtypes */

/* storage: the legacy typed storage class torch pickles the dtype with
 * (_rebuild_tensor_v2). NULL: torch.storage._new_dtypes(), pickled as an
 * UntypedStorage counted in bytes plus the dtype (_rebuild_tensor_v3).
 * name NULL: no torch dtype. F4 is not float4_e2m1fn_x2: that dtype packs
 * two values per element, so its shape would not be the tensor's. */
static const struct {
  const char *name, *storage;
} kTorchDtypes[CKPTIO_DTYPE_COUNT] = {
    [CKPTIO_BOOL] = {"bool", "BoolStorage"},
    [CKPTIO_U8] = {"uint8", "ByteStorage"},
    [CKPTIO_I8] = {"int8", "CharStorage"},
    [CKPTIO_F8_E5M2] = {"float8_e5m2", NULL},
    [CKPTIO_F8_E4M3] = {"float8_e4m3fn", NULL},
    [CKPTIO_F8_E8M0] = {"float8_e8m0fnu", NULL},
    [CKPTIO_F8_E4M3FNUZ] = {"float8_e4m3fnuz", NULL},
    [CKPTIO_F8_E5M2FNUZ] = {"float8_e5m2fnuz", NULL},
    [CKPTIO_I16] = {"int16", "ShortStorage"},
    [CKPTIO_U16] = {"uint16", NULL},
    [CKPTIO_F16] = {"float16", "HalfStorage"},
    [CKPTIO_BF16] = {"bfloat16", "BFloat16Storage"},
    [CKPTIO_I32] = {"int32", "IntStorage"},
    [CKPTIO_U32] = {"uint32", NULL},
    [CKPTIO_F32] = {"float32", "FloatStorage"},
    [CKPTIO_C64] = {"complex64", "ComplexFloatStorage"},
    [CKPTIO_F64] = {"float64", "DoubleStorage"},
    [CKPTIO_I64] = {"int64", "LongStorage"},
    [CKPTIO_U64] = {"uint64", NULL},
};

const char *ckptio_torch_dtype_name(ckptio_dtype dtype) {
  if ((unsigned)dtype >= CKPTIO_DTYPE_COUNT) return NULL;
  return kTorchDtypes[dtype].name;
}

/* Python decodes BINUNICODE strictly: a name that is not UTF-8 would make
 * the whole file unloadable, so it is refused up front. */
static int valid_utf8(const unsigned char *s) {
  while (*s) {
    unsigned c = *s++;
    int more = c < 0x80 ? 0 : (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2 : (c & 0xf8) == 0xf0 ? 3 : -1;
    if (more < 0 || (more == 1 && c < 0xc2) || (more == 3 && c > 0xf4)) return 0;
    unsigned cp = c & (0x3f >> more);
    for (int k = 0; k < more; k++, s++) {
      if ((*s & 0xc0) != 0x80) return 0;
      cp = cp << 6 | (*s & 0x3f);
    }
    if ((more == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (more == 3 && (cp < 0x10000 || cp > 0x10ffff)))
      return 0;
  }
  return 1;
}

/* --------------------------------------------------------------- pickle */

#define NO_MEMO UINT32_MAX

/* Memo indices of the objects Python's pickler meets more than once (the
 * same object each time, so the second time is a BINGET). */
typedef struct pk_memo {
  uint32_t odict, v2, v3, untyped, storage_str, cpu_str;
  uint32_t cls[CKPTIO_DTYPE_COUNT], dtype[CKPTIO_DTYPE_COUNT];
} pk_memo;

static void pk_global(ckptio_pickle_w *p, uint32_t *memo, const char *module, const char *name) {
  if (*memo != NO_MEMO)
    ckptio_pickle_w_get(p, *memo);
  else
    ckptio_pickle_w_global(p, module, name, memo);
}

static void pk_const_str(ckptio_pickle_w *p, uint32_t *memo, const char *s) {
  if (*memo != NO_MEMO)
    ckptio_pickle_w_get(p, *memo);
  else
    ckptio_pickle_w_unicode(p, s, strlen(s), memo);
}

/* One tensor, as Tensor.__reduce_ex__ and torch.save's persistent_id make
 * it: rebuild(persistent storage, 0, size, stride, False, OrderedDict()
 * [, dtype]) for storage key `key`. */
static void pk_tensor(ckptio_pickle_w *p, pk_memo *m, const ckptio_layout_input *t, size_t key,
                      const int64_t *stride) {
  const int v3 = kTorchDtypes[t->dtype].storage == NULL;
  const uint64_t elem = (uint64_t)ckptio_dtype_bits(t->dtype) / 8;
  char keystr[24];
  int keylen = snprintf(keystr, sizeof(keystr), "%zu", key);

  if (v3)
    pk_global(p, &m->v3, "torch._utils", "_rebuild_tensor_v3");
  else
    pk_global(p, &m->v2, "torch._utils", "_rebuild_tensor_v2");
  ckptio_pickle_w_tuple_begin(p, v3 ? 7 : 6);
  /* The persistent id: ('storage', class, key, 'cpu', numel). */
  ckptio_pickle_w_tuple_begin(p, 5);
  pk_const_str(p, &m->storage_str, "storage");
  if (v3)
    pk_global(p, &m->untyped, "torch.storage", "UntypedStorage");
  else
    pk_global(p, &m->cls[t->dtype], "torch", kTorchDtypes[t->dtype].storage);
  ckptio_pickle_w_unicode(p, keystr, (size_t)keylen, NULL);
  pk_const_str(p, &m->cpu_str, "cpu");
  ckptio_pickle_w_int(p, (int64_t)(v3 ? t->nbytes : t->nbytes / elem));
  ckptio_pickle_w_tuple_end(p, 5);
  ckptio_pickle_w_op(p, CKPTIO_PICKLE_BINPERSID);
  ckptio_pickle_w_int(p, 0);  /* storage_offset */
  ckptio_pickle_w_tuple_begin(p, (size_t)t->ndim);
  for (int d = 0; d < t->ndim; d++) ckptio_pickle_w_int(p, t->shape[d]);
  ckptio_pickle_w_tuple_end(p, (size_t)t->ndim);
  ckptio_pickle_w_tuple_begin(p, (size_t)t->ndim);
  for (int d = 0; d < t->ndim; d++) ckptio_pickle_w_int(p, stride[d]);
  ckptio_pickle_w_tuple_end(p, (size_t)t->ndim);
  ckptio_pickle_w_op(p, CKPTIO_PICKLE_NEWFALSE);  /* requires_grad */
  ckptio_pickle_w_get(p, m->odict);              /* backward hooks: OrderedDict() */
  ckptio_pickle_w_op(p, CKPTIO_PICKLE_EMPTY_TUPLE);
  ckptio_pickle_w_op(p, CKPTIO_PICKLE_REDUCE);
  ckptio_pickle_w_put(p, NULL);
  if (v3) pk_global(p, &m->dtype[t->dtype], "torch", kTorchDtypes[t->dtype].name);
  ckptio_pickle_w_tuple_end(p, v3 ? 7 : 6);
  ckptio_pickle_w_op(p, CKPTIO_PICKLE_REDUCE);
  ckptio_pickle_w_put(p, NULL);
}

/* Contiguous strides as torch computes them: a zero dim counts as one, so
 * torch.empty(2, 0, 3).stride() == (3, 3, 1). */
static int contiguous_strides(const ckptio_layout_input *t, int64_t *stride) {
  int64_t s = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    stride[d] = s;
    if (__builtin_mul_overflow(s, t->shape[d] > 1 ? t->shape[d] : 1, &s)) return -1;
  }
  return 0;
}

/* data.pkl: the OrderedDict {name: tensor} in input order; input i is
 * storage key i. */
static int build_pickle(const ckptio_layout_input *in, size_t n, ckptio_pickle_w *p, char *err,
                        size_t errlen) {
  pk_memo m;
  int64_t stride[CKPTIO_MAX_DIMS];
  memset(&m, 0xff, sizeof(m));  /* every index NO_MEMO */
  ckptio_pickle_w_proto(p);
  ckptio_pickle_w_global(p, "collections", "OrderedDict", &m.odict);
  ckptio_pickle_w_op(p, CKPTIO_PICKLE_EMPTY_TUPLE);
  ckptio_pickle_w_op(p, CKPTIO_PICKLE_REDUCE);
  ckptio_pickle_w_put(p, NULL);
  for (size_t i = 0; i < n;) {
    size_t batch = ckptio_pickle_w_items_begin(p, n - i);
    for (size_t k = 0; k < batch; k++, i++) {
      if (contiguous_strides(&in[i], stride) < 0)
        return ckptio_err_fmt(err, errlen, CKPTIO_E_OVERFLOW,
                              "tensor '%.200s': its strides overflow 64 bits", in[i].name);
      ckptio_pickle_w_unicode(p, in[i].name, strlen(in[i].name), NULL);
      pk_tensor(p, &m, &in[i], i, stride);
    }
    ckptio_pickle_w_items_end(p, batch);
  }
  ckptio_pickle_w_op(p, CKPTIO_PICKLE_STOP);
  if (p->err < 0)
    return ckptio_err_fmt(err, errlen, p->err, "building data.pkl: %s", ckptio_strerror(p->err));
  return 0;
}

/* --------------------------------------------------------------- zip */

#define ZIP_MAX32 0xFFFFFFFFull
#define ZIP_LOCAL 30u
#define ZIP_CENTRAL 46u
#define ZIP_END (56u + 20u + 22u) /* zip64 end record, its locator, end record */

typedef struct zrec {
  const char *name;
  size_t name_len;
  uint64_t size, hdr, data;  /* local header and data offsets */
  const uint8_t *content;    /* a small record's bytes; NULL for a tensor */
  size_t input;              /* a tensor's input index */
  uint32_t crc;
} zrec;

static void le16(uint8_t *p, uint64_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static void le32(uint8_t *p, uint64_t v) {
  for (int k = 0; k < 4; k++) p[k] = (uint8_t)(v >> (8 * k));
}
static void le64(uint8_t *p, uint64_t v) {
  for (int k = 0; k < 8; k++) p[k] = (uint8_t)(v >> (8 * k));
}
static uint64_t min32(uint64_t v) { return v < ZIP_MAX32 ? v : ZIP_MAX32; }

/* miniz writes a zip64 extra (and 24-byte descriptor) for a record whose
 * size or local header offset reaches 0xFFFFFFFF, holding only the fields
 * that do: sizes (16 bytes), offset (8). */
static int ckptio_zip_w_is64(const zrec *r) { return r->size >= ZIP_MAX32 || r->hdr >= ZIP_MAX32; }
static uint32_t ckptio_zip_w_extra64(const zrec *r) {
  if (!ckptio_zip_w_is64(r)) return 0;
  return 4 + (r->size >= ZIP_MAX32 ? 16 : 0) + (r->hdr >= ZIP_MAX32 ? 8 : 0);
}
static uint32_t ckptio_zip_w_dd_len(const zrec *r) {
  return r->size ? (ckptio_zip_w_is64(r) ? 24 : 16) : 0;
}
/* Bytes from the local header to the data: header, name, zip64 extra, and
 * the 'FB' extra padding the data to CKPTIO_TORCH_ALIGN (getPadding). */
static uint64_t ckptio_zip_w_local_len(const zrec *r) {
  uint64_t start = r->hdr + ZIP_LOCAL + r->name_len + ckptio_zip_w_extra64(r) + 4;
  return start - r->hdr + (CKPTIO_TORCH_ALIGN - start % CKPTIO_TORCH_ALIGN) % CKPTIO_TORCH_ALIGN;
}
static uint64_t ckptio_zip_w_central_len(const zrec *r) {
  return ZIP_CENTRAL + r->name_len + ckptio_zip_w_extra64(r);
}

/* The zip64 extra field of an entry (e64 bytes, 0: none): the sizes when
 * they pass 32 bits (the compressed one given: the local header's is not
 * known yet), then the local header's offset when it does. @return the end. */
static uint8_t *zip64_extra(uint8_t *p, const zrec *r, uint32_t e64, uint64_t csize) {
  if (!e64) return p;
  le16(p, 1);
  le16(p + 2, e64 - 4);
  p += 4;
  if (r->size >= ZIP_MAX32) {
    le64(p, r->size);
    le64(p + 8, csize);
    p += 16;
  }
  if (r->hdr >= ZIP_MAX32) {
    le64(p, r->hdr);
    p += 8;
  }
  return p;
}

static void ckptio_zip_w_local(uint8_t *p, const zrec *r) {
  const uint32_t e64 = ckptio_zip_w_extra64(r);
  const uint64_t pad = ckptio_zip_w_local_len(r) - ZIP_LOCAL - r->name_len - e64 - 4;
  memset(p, 0, ZIP_LOCAL);  /* version, method, time, date, crc, sizes: 0 */
  le32(p, 0x04034b50);
  le16(p + 6, r->size ? 0x0808 : 0x0800);  /* data descriptor (if data) + UTF-8 */
  le16(p + 26, r->name_len);
  le16(p + 28, e64 + 4 + pad);
  p += ZIP_LOCAL;
  memcpy(p, r->name, r->name_len);
  p += r->name_len;
  /* miniz writes the compressed size before it knows it: 0. */
  p = zip64_extra(p, r, e64, 0);
  p[0] = 'F';
  p[1] = 'B';
  le16(p + 2, pad);
  memset(p + 4, 'Z', pad);
}

static void ckptio_zip_w_dd(uint8_t *p, const zrec *r) {
  le32(p, 0x08074b50);
  le32(p + 4, r->crc);
  if (ckptio_zip_w_is64(r)) {
    le64(p + 8, r->size);
    le64(p + 16, r->size);
  } else {
    le32(p + 8, r->size);
    le32(p + 12, r->size);
  }
}

/* @return where the entry's CRC is, for set_crc. */
static uint8_t *ckptio_zip_w_central(uint8_t *p, const zrec *r) {
  const uint32_t e64 = ckptio_zip_w_extra64(r);
  uint8_t *crc = p + 16;
  memset(p, 0, ZIP_CENTRAL);  /* versions, method, time, comment, disk, attributes: 0 */
  le32(p, 0x02014b50);
  le16(p + 8, r->size ? 0x0808 : 0x0800);
  le32(p + 16, r->crc);
  le32(p + 20, min32(r->size));
  le32(p + 24, min32(r->size));
  le16(p + 28, r->name_len);
  le16(p + 30, e64);
  le32(p + 42, min32(r->hdr));
  p += ZIP_CENTRAL;
  memcpy(p, r->name, r->name_len);
  p += r->name_len;
  zip64_extra(p, r, e64, r->size);
  return crc;
}

/* zip64 end of central directory (always: PyTorch opens its writer with
 * MZ_ZIP_FLAG_WRITE_ZIP64), its locator, and the classic end record. */
static void ckptio_zip_w_end(uint8_t *p, uint64_t nrec, uint64_t cd_off, uint64_t cd_len) {
  const uint64_t end64 = cd_off + cd_len;
  memset(p, 0, ZIP_END);
  le32(p, 0x06064b50);
  le64(p + 4, 44);
  le16(p + 12, 0x031e);  /* made by: Unix, 3.0, as miniz */
  le16(p + 14, 0x002d);  /* needed: 4.5 (zip64) */
  le64(p + 24, nrec);
  le64(p + 32, nrec);
  le64(p + 40, cd_len);
  le64(p + 48, cd_off);
  p += 56;
  le32(p, 0x07064b50);
  le64(p + 8, end64);
  le32(p + 16, 1);
  p += 20;
  le32(p, 0x06054b50);
  le16(p + 8, nrec < 0xFFFF ? nrec : 0xFFFF);
  le16(p + 10, nrec < 0xFFFF ? nrec : 0xFFFF);
  le32(p + 12, min32(cd_len));
  le32(p + 16, min32(cd_off));
}

/* --------------------------------------------------------------- layout */

typedef struct torch_state {
  uint8_t *arena;        /* every extent's bytes */
  uint8_t **dd_crc;      /* dd_crc[i]: input i's descriptor CRC, NULL if empty */
  uint8_t **cd_crc;      /* cd_crc[i]: its central directory CRC */
} torch_state;

static void torch_set_crc(ckptio_layout *l, size_t i, uint32_t crc) {
  torch_state *s = l->state;
  if (!s || i >= l->count) return;
  if (s->dd_crc[i]) le32(s->dd_crc[i], crc);
  le32(s->cd_crc[i], crc);
}

static void torch_free(ckptio_layout *l) {
  torch_state *s = l->state;
  if (s) {
    free(s->arena);
    free(s->dd_crc);
    free(s->cd_crc);
    free(s);
  }
  free(l->extents);
  free(l->order);
  free(l->offset);
}

/* Appends [off, off + len), merged into the previous extent when adjacent
 * and of the same kind, so the extents stay few and sorted. */
static void emit(ckptio_layout *l, uint64_t off, uint64_t len, int holds_crc) {
  ckptio_extent *e = l->nextents ? &l->extents[l->nextents - 1] : NULL;
  if (!len) return;
  if (e && e->offset + e->len == off && e->holds_crc == holds_crc) {
    e->len += len;
    return;
  }
  l->extents[l->nextents++] = (ckptio_extent){off, len, NULL, holds_crc};
}

/* The bytes of file offset off. Every structure written lies inside one
 * extent, by the way emit() is called. */
static uint8_t *at(const ckptio_layout *l, uint64_t off) {
  size_t lo = 0, hi = l->nextents;
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (l->extents[mid].offset <= off) lo = mid; else hi = mid;
  }
  return l->extents[lo].bytes + (off - l->extents[lo].offset);
}

static int check_inputs(const ckptio_layout_input *in, size_t n, const ckptio_kv *meta,
                        size_t nmeta, const char *archive, char *err, size_t errlen) {
  if (strchr(archive, '/') || strlen(archive) > 0xFFFF - 32)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG,
                          "torch archive name '%.200s' has a '/' or is too long", archive);
  for (size_t i = 0; i < n; i++) {
    const ckptio_layout_input *t = &in[i];
    if (!t->name || t->ndim < 0 || t->ndim > CKPTIO_MAX_DIMS || (t->ndim && !t->shape))
      return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "torch layout: bad input %zu", i);
    if (!ckptio_torch_dtype_name(t->dtype))
      return ckptio_err_fmt(err, errlen, CKPTIO_E_DTYPE,
                            "tensor '%.200s': dtype %s has no PyTorch equivalent (PyTorch has no "
                            "6-bit floats, and its float4_e2m1fn_x2 packs two values per element)",
                            t->name, ckptio_dtype_name(t->dtype) ? ckptio_dtype_name(t->dtype) : "?");
    if (!valid_utf8((const unsigned char *)t->name))
      return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG,
                            "tensor %zu: its name is not UTF-8, which a pickle cannot hold", i);
  }
  for (size_t m = 0; m < nmeta; m++)
    if (!meta[m].key || !meta[m].value)
      return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "torch layout: NULL metadata %zu", m);
  return 0;
}

static int build_meta(const ckptio_kv *meta, size_t nmeta, ckptio_json_out *o) {
  int rc = ckptio_json_out_put(o, "{", 1);
  for (size_t m = 0; rc == 0 && m < nmeta; m++)
    rc = (m ? ckptio_json_out_put(o, ",", 1) : 0) | ckptio_json_out_string(o, meta[m].key) |
         ckptio_json_out_put(o, ":", 1) | ckptio_json_out_string(o, meta[m].value);
  return rc ? -ENOMEM : ckptio_json_out_put(o, "}", 1);
}

/* 40 ASCII digits, like PyTorch's (a 20-digit hash, a 20-digit CRC), from
 * the pickle and the metadata: equal inputs give equal files. */
static void serialization_id(const ckptio_pickle_w *p, const ckptio_json_out *o, char out[41]) {
  uint64_t h = 0xcbf29ce484222325ull;  /* FNV-1a */
  for (size_t k = 0; k < p->len; k++) h = (h ^ p->data[k]) * 0x100000001b3ull;
  for (size_t k = 0; k < o->len; k++) h = (h ^ (uint8_t)o->data[k]) * 0x100000001b3ull;
  uint32_t crc = ckptio_crc32(0, p->data, p->len);
  if (o->len) crc = ckptio_crc32(crc, o->data, o->len);
  snprintf(out, 41, "%020" PRIu64 "%020" PRIu32, h, crc);
}

/* Everything a plan holds while the layout is made. */
typedef struct torch_plan {
  const ckptio_layout_input *in;
  size_t n, nrec;
  zrec *rec;
  char *names;
  ckptio_pickle_w pk;
  ckptio_json_out meta;  /* the metadata record's JSON; empty without metadata */
  char sid[41];
} torch_plan;

/* The records, in PyTorch's order: torch/serialization.py _save writes
 * data.pkl, .format_version, .storage_alignment, byteorder and data/<key>;
 * the writer's writeEndOfFile adds version and .data/serialization_id. */
static void name_records(torch_plan *tp, const char *archive, size_t name_room) {
  static const struct { const char *name, *content; } kSmall[] = {
      {"data.pkl", NULL}, {".format_version", "1"}, {".storage_alignment", "64"},
      {"byteorder", "little"}, {"version", "3\n"}, {".data/serialization_id", NULL},
      {CKPTIO_TORCH_META_RECORD, NULL}};
  for (size_t r = 0; r < tp->nrec; r++) {
    zrec *z = &tp->rec[r];
    char *nm = tp->names + r * name_room;
    size_t small = r < 4 ? r : r - tp->n;  /* kSmall index, unless a tensor */
    z->input = SIZE_MAX;
    if (r >= 4 && r < 4 + tp->n) {
      z->input = r - 4;
      z->size = tp->in[z->input].nbytes;
      z->name_len = (size_t)snprintf(nm, name_room, "%s/data/%zu", archive, z->input);
    } else {
      z->name_len = (size_t)snprintf(nm, name_room, "%s/%s", archive, kSmall[small].name);
      z->content = (const uint8_t *)(small == 0 ? (const char *)tp->pk.data
                                     : small == 5 ? tp->sid
                                     : small == 6 ? tp->meta.data : kSmall[small].content);
      z->size = small == 0 ? tp->pk.len : small == 6 ? tp->meta.len : strlen((const char *)z->content);
      z->crc = ckptio_crc32(0, z->content, z->size);
    }
    z->name = nm;
  }
}

/* Offsets: each record right after the previous one's data descriptor,
 * then the central directory and the end records. */
static int place_records(torch_plan *tp, ckptio_layout *out, uint64_t *cd_off, uint64_t *cd_len,
                         char *err, size_t errlen) {
  uint64_t cursor = 0, len = 0;
  for (size_t r = 0; r < tp->nrec; r++) {
    zrec *z = &tp->rec[r];
    z->hdr = cursor;
    z->data = z->hdr + ckptio_zip_w_local_len(z);
    if (z->data < z->hdr || __builtin_add_overflow(z->data, z->size, &cursor) ||
        __builtin_add_overflow(cursor, ckptio_zip_w_dd_len(z), &cursor))
      return ckptio_err_fmt(err, errlen, CKPTIO_E_OVERFLOW,
                            "torch layout: the file size overflows 64 bits");
    len += ckptio_zip_w_central_len(z);
    if (z->input != SIZE_MAX) out->offset[z->input] = z->data;
  }
  /* miniz refuses central directories of 4 GiB and more. */
  if (len >= ZIP_MAX32 || __builtin_add_overflow(cursor, len + ZIP_END, &out->file_size))
    return ckptio_err_fmt(err, errlen, CKPTIO_E_OVERFLOW,
                          "torch layout: %zu records make the file or its directory too large",
                          tp->nrec);
  *cd_off = cursor;
  *cd_len = len;
  return 0;
}

/* Extents cover everything but tensor data; the descriptors after tensor
 * data and the central directory hold the CRCs set_crc patches. Then the
 * bytes are written into them. */
static int write_extents(torch_plan *tp, ckptio_layout *out, uint64_t cd_off, uint64_t cd_len) {
  torch_state *st = out->state;
  uint64_t total = 0, pos = cd_off;
  for (size_t r = 0; r < tp->nrec; r++) {
    const zrec *z = &tp->rec[r];
    emit(out, z->hdr, z->data - z->hdr, 0);
    if (z->content)
      emit(out, z->data, z->size + ckptio_zip_w_dd_len(z), 0);
    else
      emit(out, z->data + z->size, ckptio_zip_w_dd_len(z), 1);
  }
  emit(out, cd_off, cd_len, 1);
  emit(out, cd_off + cd_len, ZIP_END, 0);
  for (size_t e = 0; e < out->nextents; e++) total += out->extents[e].len;
  if (total > SIZE_MAX || !(st->arena = malloc((size_t)total))) return -ENOMEM;
  total = 0;
  for (size_t e = 0; e < out->nextents; e++) {
    out->extents[e].bytes = st->arena + total;
    total += out->extents[e].len;
  }
  for (size_t r = 0; r < tp->nrec; r++) {
    const zrec *z = &tp->rec[r];
    ckptio_zip_w_local(at(out, z->hdr), z);
    if (z->content && z->size) memcpy(at(out, z->data), z->content, z->size);
    if (z->size) ckptio_zip_w_dd(at(out, z->data + z->size), z);
    uint8_t *crc = ckptio_zip_w_central(at(out, pos), z);
    pos += ckptio_zip_w_central_len(z);
    if (!z->content) {
      st->cd_crc[z->input] = crc;
      if (z->size) st->dd_crc[z->input] = at(out, z->data + z->size) + 4;
    }
  }
  ckptio_zip_w_end(at(out, cd_off + cd_len), tp->nrec, cd_off, cd_len);
  return 0;
}

/* A caller's data.pkl: the safe reader's allowlist, and every storage it
 * names is an input ("<i>", i < n) of exactly the input's bytes, so that
 * what is written is a file ckptio and torch.load(weights_only=True) read. */
static int take_pickle(const uint8_t *pickle, size_t len, const ckptio_layout_input *in, size_t n,
                       ckptio_pickle_w *out, char *err, size_t errlen) {
  ckptio_pickle pk;
  char msg[CKPTIO_ERRLEN];
  int rc = ckptio_pickle_parse(pickle, len, &pk, msg, sizeof(msg));
  if (rc < 0) return ckptio_err_fmt(err, errlen, rc, "the given data.pkl: %s", msg);
  for (size_t i = 0; rc == 0 && i < pk.nstorages; i++) {
    const ckptio_pickle_storage *s = &pk.storages[i];
    size_t kl, key = 0, k;
    const char *ks = ckptio_pickle_str(&pk, s->key, &kl);
    for (k = 0; k < kl && k < 19 && ks[k] >= '0' && ks[k] <= '9'; k++) key = key * 10 + (size_t)(ks[k] - '0');
    const ckptio_torch_dtype *dt = ckptio_torch_dtype_at(s->dtype);
    uint64_t el = dt ? (uint64_t)dt->elsize : 1, nb;
    if (!kl || k != kl || key >= n)
      rc = ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG,
                          "the given data.pkl names storage '%.*s'; storages are the inputs 0 to %zu",
                          (int)(kl > 40 ? 40 : kl), ks, n ? n - 1 : 0);
    else if (__builtin_mul_overflow(s->numel, el, &nb) || nb != in[key].nbytes)
      rc = ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG,
                          "the given data.pkl's storage %zu is %" PRIu64 " elements of %" PRIu64
                          " bytes but input %zu ('%.200s') holds %" PRIu64 " bytes",
                          key, s->numel, el, key, in[key].name, in[key].nbytes);
  }
  ckptio_pickle_free(&pk);
  if (rc < 0) return rc;
  if (!(out->data = malloc(len ? len : 1))) return ckptio_err_fmt(err, errlen, -ENOMEM, "out of memory");
  memcpy(out->data, pickle, len);
  out->len = out->cap = len;
  return 0;
}

int ckptio_torch_layout(const ckptio_layout_input *in, size_t n, const ckptio_kv *meta,
                        size_t nmeta, int with_crc, const char *archive_name,
                        ckptio_layout *out, char *err, size_t errlen) {
  return ckptio_torch_layout_pickle(in, n, NULL, 0, meta, nmeta, with_crc, archive_name, out, err, errlen);
}

int ckptio_torch_layout_pickle(const ckptio_layout_input *in, size_t n, const uint8_t *pickle,
                               size_t pickle_len, const ckptio_kv *meta, size_t nmeta, int with_crc,
                               const char *archive_name, ckptio_layout *out, char *err, size_t errlen) {
  torch_plan tp;
  torch_state *st;
  uint64_t cd_off = 0, cd_len = 0;
  int rc;
  if (!out || (n && !in) || (nmeta && !meta))
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "torch_layout: NULL argument");
  memset(out, 0, sizeof(*out));
  memset(&tp, 0, sizeof(tp));
  out->free = torch_free;  /* from here on ckptio_layout_free releases all */
  const char *archive = archive_name && *archive_name ? archive_name : CKPTIO_TORCH_DEFAULT_ARCHIVE;
  const size_t name_room = strlen(archive) + 32;  /* "/.data/serialization_id", "/data/<key>" */
  tp.in = in;
  tp.n = n;
  tp.nrec = 6 + n + (nmeta ? 1 : 0);
  if ((rc = check_inputs(in, n, meta, nmeta, archive, err, errlen)) < 0) goto fail;
  rc = pickle ? take_pickle(pickle, pickle_len, in, n, &tp.pk, err, errlen)
              : build_pickle(in, n, &tp.pk, err, errlen);
  if (rc < 0) goto fail;
  rc = -ENOMEM;
  if (nmeta && build_meta(meta, nmeta, &tp.meta) < 0) goto fail;
  serialization_id(&tp.pk, &tp.meta, tp.sid);
  tp.rec = calloc(tp.nrec, sizeof(*tp.rec));
  tp.names = malloc(tp.nrec * name_room);
  out->state = st = calloc(1, sizeof(*st));
  out->order = malloc((n + 1) * sizeof(*out->order));
  out->offset = malloc((n + 1) * sizeof(*out->offset));
  out->extents = calloc(2 * tp.nrec + 2, sizeof(*out->extents));
  if (!tp.rec || !tp.names || !st || !out->order || !out->offset || !out->extents ||
      !(st->dd_crc = calloc(n + 1, sizeof(*st->dd_crc))) ||
      !(st->cd_crc = calloc(n + 1, sizeof(*st->cd_crc))))
    goto fail;
  out->count = n;
  for (size_t i = 0; i < n; i++) out->order[i] = i;  /* input i is storage key i */
  name_records(&tp, archive, name_room);
  if ((rc = place_records(&tp, out, &cd_off, &cd_len, err, errlen)) < 0) goto fail;
  if ((rc = write_extents(&tp, out, cd_off, cd_len)) < 0) goto fail;
  out->set_crc = with_crc ? torch_set_crc : NULL;
  out->crcs_trail = 1; /* data descriptors after each record, the directory last */
  rc = 0;
fail:
  if (rc == -ENOMEM) ckptio_err_fmt(err, errlen, rc, "out of memory laying out the torch file");
  if (rc < 0) ckptio_layout_free(out);
  free(tp.rec);
  free(tp.names);
  free(tp.meta.data);
  ckptio_pickle_w_free(&tp.pk);
  return rc;
}
