/*
 * The data.pkl interpreter: a pickle machine that knows only the opcodes and
 * globals torch.load(weights_only=True) accepts, builds tagged values in an
 * arena instead of objects, and turns the rebuild calls into tensor records.
 * Naming the tensors (walking the result) is torch_read.c's.
 */
#include "formats/pickle_read.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* ------------------------------------------------------------ tables */

/* Every dtype torch's allowlist names (torch 2.15: the storage-type map,
 * storage._new_dtypes(), uint1-7 and int1-7). */
static const ckptio_torch_dtype kDtypes[] = {
    {"float32", "FloatStorage", 4, CKPTIO_F32},      {"float64", "DoubleStorage", 8, CKPTIO_F64},
    {"float16", "HalfStorage", 2, CKPTIO_F16},       {"bfloat16", "BFloat16Storage", 2, CKPTIO_BF16},
    {"int64", "LongStorage", 8, CKPTIO_I64},         {"int32", "IntStorage", 4, CKPTIO_I32},
    {"int16", "ShortStorage", 2, CKPTIO_I16},        {"int8", "CharStorage", 1, CKPTIO_I8},
    {"uint8", "ByteStorage", 1, CKPTIO_U8},          {"bool", "BoolStorage", 1, CKPTIO_BOOL},
    {"complex64", "ComplexFloatStorage", 8, CKPTIO_C64},
    {"complex128", "ComplexDoubleStorage", 16, -1},
    {"qint8", "QInt8Storage", 1, -1},                {"qint32", "QInt32Storage", 4, -1},
    {"quint8", "QUInt8Storage", 1, -1},              {"quint4x2", "QUInt4x2Storage", 1, -1},
    {"quint2x4", "QUInt2x4Storage", 1, -1},
    {"float8_e5m2", NULL, 1, CKPTIO_F8_E5M2},        {"float8_e4m3fn", NULL, 1, CKPTIO_F8_E4M3},
    {"float8_e5m2fnuz", NULL, 1, CKPTIO_F8_E5M2FNUZ},
    {"float8_e4m3fnuz", NULL, 1, CKPTIO_F8_E4M3FNUZ},
    {"float8_e8m0fnu", NULL, 1, CKPTIO_F8_E8M0},
    {"uint16", NULL, 2, CKPTIO_U16},                 {"uint32", NULL, 4, CKPTIO_U32},
    {"uint64", NULL, 8, CKPTIO_U64},
    /* Two 4-bit values per byte: its shape counts bytes, ckptio's F4 counts values. */
    {"float4_e2m1fn_x2", NULL, 1, -1},
    {"complex32", NULL, 4, -1},  {"bcomplex32", NULL, 4, -1}, {"bits8", NULL, 1, -1},
    {"bits16", NULL, 2, -1},     {"bits1x8", NULL, 1, -1},    {"bits2x4", NULL, 1, -1},
    {"bits4x2", NULL, 1, -1},
    {"uint1", NULL, 1, -1}, {"uint2", NULL, 1, -1}, {"uint3", NULL, 1, -1}, {"uint4", NULL, 1, -1},
    {"uint5", NULL, 1, -1}, {"uint6", NULL, 1, -1}, {"uint7", NULL, 1, -1},
    {"int1", NULL, 1, -1},  {"int2", NULL, 1, -1},  {"int3", NULL, 1, -1},  {"int4", NULL, 1, -1},
    {"int5", NULL, 1, -1},  {"int6", NULL, 1, -1},  {"int7", NULL, 1, -1},
};
#define NDTYPES ((int)(sizeof(kDtypes) / sizeof(kDtypes[0])))
#define DTYPE_UINT8 8  /* what a v2 tensor over an UntypedStorage is */

const ckptio_torch_dtype *ckptio_torch_dtype_at(int index) {
  return index >= 0 && index < NDTYPES ? &kDtypes[index] : NULL;
}

enum {
  G_ODICT = 1, G_COUNTER, G_REBUILD, G_REBUILD_V2, G_REBUILD_V3, G_PARAM, G_PARAM_STATE,
  G_SIZE, G_DEVICE, G_ENCODE, G_SET, G_BYTEARRAY, G_COMPLEX, G_DTYPE, G_STORAGE, G_UNTYPED,
  G_LAYOUT, /* torch.serialization._get_layout: called only for a caller with classes of its own */
  G_NUMPY,  /* numpy's array, scalar and dtype reducers: an OTHER value with one BUILD */
  G_OTHER,  /* in torch's allowlist, but nothing ckptio can represent */
};

/* aux of an OTHER value a numpy reducer made: BUILD once, then never. */
enum { NUMPY_UNBUILT = 1, NUMPY_BUILT };

static const struct {
  const char *name;
  int kind;
} kGlobals[] = {
    {"collections.OrderedDict", G_ODICT},
    {"collections.Counter", G_COUNTER},
    {"torch._utils._rebuild_tensor", G_REBUILD},
    {"torch._utils._rebuild_tensor_v2", G_REBUILD_V2},
    {"torch._utils._rebuild_tensor_v3", G_REBUILD_V3},
    {"torch._utils._rebuild_parameter", G_PARAM},
    {"torch._utils._rebuild_parameter_with_state", G_PARAM_STATE},
    {"torch.Size", G_SIZE},
    {"torch.device", G_DEVICE},
    {"_codecs.encode", G_ENCODE},
    {"builtins.set", G_SET},
    {"builtins.bytearray", G_BYTEARRAY},
    {"builtins.complex", G_COMPLEX},
    {"torch.storage.UntypedStorage", G_UNTYPED},
    {"torch.storage.TypedStorage", G_OTHER},
    {"torch.Tensor", G_OTHER},
    {"torch.nn.parameter.Parameter", G_OTHER},
    {"torch.serialization._get_layout", G_LAYOUT},
    {"torch._tensor._rebuild_from_type_v2", G_OTHER},
    {"torch._utils._rebuild_qtensor", G_OTHER},
    {"torch._utils._rebuild_sparse_tensor", G_OTHER},
    {"torch._utils._rebuild_meta_tensor_no_storage", G_OTHER},
    {"torch._utils._rebuild_wrapper_subclass", G_OTHER},
    {"torch._utils._rebuild_device_tensor_from_numpy", G_OTHER},
    {"torch._utils._rebuild_device_tensor_from_cpu_tensor", G_OTHER},
    {"torch.per_tensor_affine", G_OTHER},
    {"torch.per_tensor_symmetric", G_OTHER},
    {"torch.per_channel_affine", G_OTHER},
    {"torch.per_channel_symmetric", G_OTHER},
    {"torch.per_channel_affine_float_qparams", G_OTHER},
    /* Beyond torch's default allowlist (torch.load takes them under
     * torch.serialization.safe_globals, as accelerate and transformers
     * load RNG states): numpy arrays and scalars, never called here. */
    {"numpy._core.multiarray._reconstruct", G_NUMPY},
    {"numpy.core.multiarray._reconstruct", G_NUMPY},
    {"numpy._core.multiarray.scalar", G_NUMPY},
    {"numpy.core.multiarray.scalar", G_NUMPY},
    {"numpy.dtype", G_NUMPY},
    {"numpy.ndarray", G_NUMPY},
};

/* The caller's class named module.name, or NULL. */
static const ckptio_pickle_class *class_named(const ckptio_pickle_rules *r, const char *module, const char *name) {
  char full[2 * CKPTIO_PICKLE_MAX_GLOBAL + 2];
  snprintf(full, sizeof(full), "%s.%s", module, name);
  for (size_t k = 0; k < r->nclasses; k++)
    if (!strcmp(full, r->classes[k].name)) return &r->classes[k];
  return NULL;
}

/* The caller's class of kind `kind`, or NULL. */
static const ckptio_pickle_class *class_of_kind(const ckptio_pickle_rules *r, int kind) {
  for (size_t k = 0; k < r->nclasses; k++)
    if (r->classes[k].kind == kind) return &r->classes[k];
  return NULL;
}

/* torch.<X>Tensor, torch.cuda.<X>Tensor and the sparse ones: legacy tensor
 * classes torch allows and ckptio does not build. */
static int is_tensor_class(const char *module, const char *name) {
  static const char *const kinds[] = {"BFloat16", "Bool", "Byte", "Char", "Double",
                                      "Float", "Half", "Int", "Long", "Short"};
  if (strcmp(module, "torch") && strcmp(module, "torch.cuda") && strcmp(module, "torch.sparse") &&
      strcmp(module, "torch.cuda.sparse"))
    return 0;
  size_t n = strlen(name);
  if (n < 7 || strcmp(name + n - 6, "Tensor")) return 0;
  for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++)
    if (strlen(kinds[k]) == n - 6 && !strncmp(name, kinds[k], n - 6)) return 1;
  return 0;
}

/* @return the kind of an allowed global (and *dtype for dtypes and storage
 * classes), or 0 when torch would refuse it. */
static int global_kind(const char *module, const char *name, int *dtype) {
  char full[2 * CKPTIO_PICKLE_MAX_GLOBAL + 2];
  snprintf(full, sizeof(full), "%s.%s", module, name);
  for (size_t k = 0; k < sizeof(kGlobals) / sizeof(kGlobals[0]); k++)
    if (!strcmp(full, kGlobals[k].name)) return kGlobals[k].kind;
  for (int d = 0; d < NDTYPES; d++) {
    if (!strcmp(module, "torch") && !strcmp(name, kDtypes[d].name)) return *dtype = d, G_DTYPE;
    /* torch.save names the storage class without the device: torch.FloatStorage;
     * the CUDA ones are in the allowlist all the same. */
    if (kDtypes[d].storage && !strcmp(name, kDtypes[d].storage) &&
        (!strcmp(module, "torch") || (!strcmp(module, "torch.cuda") && kDtypes[d].name[0] != 'q')))
      return *dtype = d, G_STORAGE;
  }
  return is_tensor_class(module, name) ? G_OTHER : 0;
}

static const char *op_name(uint8_t op) {
  static const struct { uint8_t op; const char *name; } kOps[] = {
      {'(', "MARK"}, {'.', "STOP"}, {'0', "POP"}, {'1', "POP_MARK"}, {'2', "DUP"},
      {'F', "FLOAT"}, {'I', "INT"}, {'J', "BININT"}, {'K', "BININT1"}, {'L', "LONG"},
      {'M', "BININT2"}, {'N', "NONE"}, {'P', "PERSID"}, {'Q', "BINPERSID"}, {'R', "REDUCE"},
      {'S', "STRING"}, {'T', "BINSTRING"}, {'U', "SHORT_BINSTRING"}, {'V', "UNICODE"},
      {'X', "BINUNICODE"}, {'a', "APPEND"}, {'b', "BUILD"}, {'c', "GLOBAL"}, {'d', "DICT"},
      {'}', "EMPTY_DICT"}, {'e', "APPENDS"}, {'g', "GET"}, {'h', "BINGET"}, {'i', "INST"},
      {'j', "LONG_BINGET"}, {'l', "LIST"}, {']', "EMPTY_LIST"}, {'o', "OBJ"}, {'p', "PUT"},
      {'q', "BINPUT"}, {'r', "LONG_BINPUT"}, {'s', "SETITEM"}, {'t', "TUPLE"},
      {')', "EMPTY_TUPLE"}, {'u', "SETITEMS"}, {'G', "BINFLOAT"}, {0x80, "PROTO"},
      {0x81, "NEWOBJ"}, {0x82, "EXT1"}, {0x83, "EXT2"}, {0x84, "EXT4"}, {0x85, "TUPLE1"},
      {0x86, "TUPLE2"}, {0x87, "TUPLE3"}, {0x88, "NEWTRUE"}, {0x89, "NEWFALSE"},
      {0x8a, "LONG1"}, {0x8b, "LONG4"}, {'B', "BINBYTES"}, {'C', "SHORT_BINBYTES"},
      {0x8c, "SHORT_BINUNICODE"}, {0x8d, "BINUNICODE8"}, {0x8e, "BINBYTES8"},
      {0x8f, "EMPTY_SET"}, {0x90, "ADDITEMS"}, {0x91, "FROZENSET"}, {0x92, "NEWOBJ_EX"},
      {0x93, "STACK_GLOBAL"}, {0x94, "MEMOIZE"}, {0x95, "FRAME"}, {0x96, "BYTEARRAY8"},
      {0x97, "NEXT_BUFFER"}, {0x98, "READONLY_BUFFER"}};
  for (size_t k = 0; k < sizeof(kOps) / sizeof(kOps[0]); k++)
    if (kOps[k].op == op) return kOps[k].name;
  return "unknown";
}

const char *ckptio_pickle_type_name(const ckptio_pv *v) {
  static const char *const names[] = {"None", "bool", "int", "int", "float", "str", "bytes",
                                      "tuple", "list", "dict", "global", "storage", "tensor",
                                      "object", "instance"};
  return v->type < sizeof(names) / sizeof(names[0]) ? names[v->type] : "value";
}

/* Bytes from the file, fit for a message (as in zip_read.c). */
static const char *shown(char *buf, size_t cap, const char *s, size_t n) {
  size_t o = 0, i = 0;
  for (; i < n && o + 8 < cap && o < 200; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '\n') buf[o++] = '.';  /* GLOBAL's "module\nname" reads module.name */
    else if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') buf[o++] = (char)c;
    else o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
  }
  if (i < n && o + 4 <= cap) memcpy(buf + o, "...", 3), o += 3;
  buf[o] = '\0';
  return buf;
}

/* ------------------------------------------------------------ the machine */

typedef struct parser {
  ckptio_pickle *p;
  size_t pos, at;              /* next byte; the current opcode's byte */
  uint32_t *stack;
  size_t sp, stack_cap;
  size_t marks[CKPTIO_PICKLE_MAX_DEPTH];
  int nmarks;
  uint32_t *memo;              /* value id + 1; 0 is unset */
  size_t memo_cap, memo_count; /* memo_count: entries set (MEMOIZE's next index) */
  const ckptio_pickle_rules *rules; /* what is allowed besides torch.save's pickles */
  uint32_t consts[3];          /* None, False, True: id + 1, one value each */
  char *err;
  size_t errlen;
} parser;

static int perr(parser *s, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int perr(parser *s, int code, const char *fmt, ...) {
  char where[48];
  snprintf(where, sizeof(where), " (pickle byte %zu)", s->at);
  va_list ap;
  va_start(ap, fmt);
  ckptio_err_vfmt(s->err, s->errlen, code, "", where, fmt, ap);
  va_end(ap);
  return code;
}

static int bad(parser *s, const char *what) {
  return perr(s, CKPTIO_E_PICKLE, "malformed pickle: %s %s", op_name(s->p->buf[s->at]), what);
}

static int oom(parser *s) { return perr(s, -ENOMEM, "out of memory reading the pickle"); }

/* Grows an arena so one more element fits. Counts stay below the pickle's
 * length (one value per opcode), so ids fit 32 bits. */
static int grow(void **arr, size_t *cap, size_t count, size_t elem) {
  if (count < *cap) return 0;
  size_t ncap = *cap ? *cap * 2 : 64;
  void *q = ncap <= SIZE_MAX / elem ? realloc(*arr, ncap * elem) : NULL;
  if (!q) return -ENOMEM;
  *arr = q;
  *cap = ncap;
  return 0;
}

static int new_value(parser *s, int type, uint32_t *id) {
  ckptio_pickle *p = s->p;
  if (grow((void **)&p->values, &p->values_cap, p->nvalues, sizeof(*p->values)) < 0) return oom(s);
  memset(&p->values[p->nvalues], 0, sizeof(*p->values));
  p->values[p->nvalues].type = (uint8_t)type;
  if (type == CKPTIO_PV_LIST || type == CKPTIO_PV_DICT) p->values[p->nvalues].u.first = UINT32_MAX;
  p->values[p->nvalues].last = UINT32_MAX;
  *id = (uint32_t)p->nvalues++;
  return 0;
}

static ckptio_pv *V(parser *s, uint32_t id) { return &s->p->values[id]; }

static int push(parser *s, uint32_t id) {
  if (s->sp >= CKPTIO_PICKLE_MAX_STACK)
    return perr(s, CKPTIO_E_PICKLE, "pickle stack deeper than %u values", CKPTIO_PICKLE_MAX_STACK);
  if (grow((void **)&s->stack, &s->stack_cap, s->sp, sizeof(*s->stack)) < 0) return oom(s);
  s->stack[s->sp++] = id;
  return 0;
}

static size_t base(const parser *s) { return s->nmarks ? s->marks[s->nmarks - 1] : 0; }

/* Values above the last MARK only, as Python's unpickler sees its stack. */
static int pop(parser *s, uint32_t *id) {
  if (s->sp <= base(s)) return bad(s, "finds the stack empty");
  *id = s->stack[--s->sp];
  return 0;
}

static int top(parser *s, uint32_t *id) {
  if (s->sp <= base(s)) return bad(s, "finds the stack empty");
  *id = s->stack[s->sp - 1];
  return 0;
}

static int push_new(parser *s, int type, uint32_t *id) {
  int rc = new_value(s, type, id);
  return rc < 0 ? rc : push(s, *id);
}

static int need(parser *s, size_t n) {
  return s->p->len - s->pos < n ? bad(s, "runs past the end of the pickle") : 0;
}

static uint64_t rd_le(const uint8_t *b, int n) {
  uint64_t v = 0;
  for (int k = n - 1; k >= 0; k--) v = v << 8 | b[k];
  return v;
}

/* Tuple of the stack above position `from`, which is popped. */
static int make_tuple(parser *s, size_t from, uint32_t *id) {
  ckptio_pickle *p = s->p;
  size_t n = s->sp - from;
  int rc = new_value(s, CKPTIO_PV_TUPLE, id);
  if (rc < 0) return rc;
  p->values[*id].u.first = (uint32_t)p->nitems;
  p->values[*id].n = (uint32_t)n;
  for (size_t k = 0; k < n; k++) {
    if (grow((void **)&p->items, &p->items_cap, p->nitems, sizeof(*p->items)) < 0) return oom(s);
    p->items[p->nitems++] = s->stack[from + k];
  }
  s->sp = from;
  return 0;
}

static int add_node(parser *s, uint32_t container, uint32_t key, uint32_t value) {
  ckptio_pickle *p = s->p;
  if (grow((void **)&p->nodes, &p->nodes_cap, p->nnodes, sizeof(*p->nodes)) < 0) return oom(s);
  uint32_t n = (uint32_t)p->nnodes++;
  ckptio_pv *c = &p->values[container];
  p->nodes[n] = (ckptio_pickle_node){key, value, UINT32_MAX};
  if (c->last == UINT32_MAX) c->u.first = n;
  else p->nodes[c->last].next = n;
  c->last = n;
  c->n++;
  return 0;
}

static int pop_mark(parser *s, size_t *from) {
  if (!s->nmarks) return bad(s, "has no MARK to pop");
  *from = s->marks[--s->nmarks];
  return 0;
}

/* APPEND(S) / SETITEM(S): stack[from, sp) go into the container below them. */
static int fill(parser *s, size_t from, int dict) {
  uint32_t c;
  int rc;
  size_t n = s->sp - from;
  if (s->sp - n <= base(s) || from == 0) return bad(s, "finds no container below its items");
  c = s->stack[from - 1];
  if (V(s, c)->type != (dict ? CKPTIO_PV_DICT : CKPTIO_PV_LIST))
    return perr(s, CKPTIO_E_PICKLE, "pickle %s on a %s is not allowed", op_name(s->p->buf[s->at]),
                ckptio_pickle_type_name(V(s, c)));
  if (dict && n % 2) return bad(s, "has an odd number of items");
  for (size_t k = 0; k < n; k += dict ? 2 : 1)
    if ((rc = add_node(s, c, dict ? s->stack[from + k] : 0, s->stack[from + k + (dict ? 1 : 0)])) < 0)
      return rc;
  s->sp = from;
  return 0;
}

/* A global by module and name (copied, NUL-terminated, at most
 * CKPTIO_PICKLE_MAX_GLOBAL bytes each); off and shown_len say where the
 * pickle spells it, for later messages. */
static int push_global(parser *s, char *module, size_t mlen, const char *name, size_t nlen, uint64_t off,
                       uint32_t shown_len) {
  char shown_buf[256];
  int has_nul = memchr(module, 0, mlen) || memchr(name, 0, nlen);
  /* Protocol 2 writes Python 3's builtins as __builtin__ (fix_imports);
   * torch maps it back, and so do the messages. */
  if (!strcmp(module, "__builtin__") && !has_nul) module = "builtins", mlen = 8;
  size_t o = strlen(shown(shown_buf, sizeof(shown_buf) / 2, module, mlen));
  shown_buf[o++] = '.';
  shown(shown_buf + o, sizeof(shown_buf) - o, name, nlen);
  if (has_nul) return perr(s, CKPTIO_E_PICKLE, "pickle global '%s' is not allowed", shown_buf);
  if (!strcmp(module, "os") || !strcmp(module, "sys") || !strcmp(module, "posix") || !strcmp(module, "nt"))
    return perr(s, CKPTIO_E_PICKLE, "pickle global '%s' is not allowed (module '%s' never is)",
                shown_buf, module);
  const ckptio_pickle_class *cls = class_named(s->rules, module, name);
  int dtype = -1, kind = cls ? cls->kind : global_kind(module, name, &dtype);
  if (!kind)
    return perr(s, CKPTIO_E_PICKLE, "pickle global '%s' is not allowed%s%s%s", shown_buf,
                s->rules->nclasses ? " (not one of " : "", s->rules->nclasses ? s->rules->classes_are : "",
                s->rules->nclasses ? " nor torch's weights_only globals)" : "");
  uint32_t id;
  int rc = push_new(s, CKPTIO_PV_GLOBAL, &id);
  if (rc < 0) return rc;
  V(s, id)->aux = (uint16_t)kind;
  V(s, id)->dtype = dtype;
  V(s, id)->u.off = off;
  V(s, id)->last = shown_len;
  return 0;
}

static int op_global(parser *s) {
  char line[2][CKPTIO_PICKLE_MAX_GLOBAL + 1];
  size_t start = s->pos, len[2];
  for (int k = 0; k < 2; k++) {
    const uint8_t *b = s->p->buf + s->pos, *nl;
    size_t avail = s->p->len - s->pos;
    nl = memchr(b, '\n', avail < CKPTIO_PICKLE_MAX_GLOBAL + 1 ? avail : CKPTIO_PICKLE_MAX_GLOBAL + 1);
    if (!nl) return bad(s, "has no newline-terminated module and name");
    len[k] = (size_t)(nl - b);
    memcpy(line[k], b, len[k]);
    line[k][len[k]] = '\0';
    s->pos += len[k] + 1;
  }
  return push_global(s, line[0], len[0], line[1], len[1], start, (uint32_t)(s->pos - 1 - start));
}

/* STACK_GLOBAL: module and name are the two strings on the stack. Later
 * messages show the name alone. */
static int op_stack_global(parser *s) {
  char line[2][CKPTIO_PICKLE_MAX_GLOBAL + 1];
  size_t len[2];
  uint32_t id[2];
  int rc;
  if ((rc = pop(s, &id[1])) < 0 || (rc = pop(s, &id[0])) < 0) return rc;
  for (int k = 0; k < 2; k++) {
    const ckptio_pv *v = V(s, id[k]);
    if (v->type != CKPTIO_PV_STR) return bad(s, "takes a module or name that is not a string");
    if (v->n > CKPTIO_PICKLE_MAX_GLOBAL)
      return perr(s, CKPTIO_E_PICKLE, "pickle STACK_GLOBAL names a %s of %u bytes (limit %d)",
                  k ? "name" : "module", v->n, CKPTIO_PICKLE_MAX_GLOBAL);
    len[k] = v->n;
    memcpy(line[k], s->p->buf + v->u.off, len[k]);
    line[k][len[k]] = '\0';
  }
  return push_global(s, line[0], len[0], line[1], len[1], V(s, id[1])->u.off, (uint32_t)len[1]);
}

static int unsupported(parser *s, uint32_t g) {
  char nm[256];
  shown(nm, sizeof(nm), (const char *)s->p->buf + V(s, g)->u.off, V(s, g)->last);
  return perr(s, CKPTIO_E_FORMAT,
              "pickle global '%s' is allowed by torch but not supported by ckptio (quantized, "
              "sparse, meta and subclass tensors, legacy tensor and storage constructors are not)", nm);
}

static int get_int(parser *s, uint32_t id, const char *what, int64_t *out) {
  const ckptio_pv *v = V(s, id);
  if (v->type == CKPTIO_PV_BIGINT)
    return perr(s, CKPTIO_E_OVERFLOW, "tensor %s does not fit 64 bits", what);
  if (v->type != CKPTIO_PV_INT)
    return perr(s, CKPTIO_E_PICKLE, "tensor %s is a %s, not an int", what, ckptio_pickle_type_name(v));
  *out = v->u.i;
  return 0;
}

static int get_dims(parser *s, uint32_t id, const char *what, int64_t *dims, int *ndim) {
  const ckptio_pv *v = V(s, id);
  if (v->type != CKPTIO_PV_TUPLE)
    return perr(s, CKPTIO_E_PICKLE, "tensor %s is a %s, not a tuple", what, ckptio_pickle_type_name(v));
  if (v->n > CKPTIO_MAX_DIMS)
    return perr(s, CKPTIO_E_SHAPE, "tensor %s has %u dims; ckptio handles up to %d", what, v->n,
                CKPTIO_MAX_DIMS);
  for (uint32_t k = 0; k < v->n; k++) {
    int rc = get_int(s, s->p->items[v->u.first + k], what, &dims[k]);
    if (rc < 0) return rc;
    if (dims[k] < 0) return perr(s, CKPTIO_E_SHAPE, "tensor %s has a negative entry %" PRId64, what, dims[k]);
  }
  *ndim = (int)v->n;
  return 0;
}

/* _rebuild_tensor(storage, offset, size, stride), _v2 adds requires_grad,
 * hooks[, metadata]; _v3 adds the dtype before the metadata. */
static int make_tensor(parser *s, int kind, const uint32_t *a, uint32_t n, uint32_t *id) {
  ckptio_pickle *p = s->p;
  ckptio_pickle_tensor t;
  int64_t off;
  int sdim, rc;
  uint32_t want = kind == G_REBUILD ? 4 : kind == G_REBUILD_V2 ? 6 : 7;
  memset(&t, 0, sizeof(t));
  if (n != want && !(kind != G_REBUILD && n == want + 1))
    return perr(s, CKPTIO_E_PICKLE, "tensor rebuild call with %u arguments", n);
  if (V(s, a[0])->type != CKPTIO_PV_STORAGE)
    return perr(s, CKPTIO_E_PICKLE, "tensor rebuilt from a %s, not a storage",
                ckptio_pickle_type_name(V(s, a[0])));
  t.storage = V(s, a[0])->u.index;
  if ((rc = get_int(s, a[1], "storage offset", &off)) < 0) return rc;
  if (off < 0) return perr(s, CKPTIO_E_SHAPE, "tensor storage offset %" PRId64 " is negative", off);
  t.offset = (uint64_t)off;
  if ((rc = get_dims(s, a[2], "size", t.size, &t.ndim)) < 0) return rc;
  if ((rc = get_dims(s, a[3], "stride", t.stride, &sdim)) < 0) return rc;
  if (sdim != t.ndim)
    return perr(s, CKPTIO_E_SHAPE, "tensor has %d sizes but %d strides", t.ndim, sdim);
  if (kind != G_REBUILD) {
    if (V(s, a[4])->type != CKPTIO_PV_BOOL)
      return perr(s, CKPTIO_E_PICKLE, "tensor requires_grad is a %s, not a bool",
                  ckptio_pickle_type_name(V(s, a[4])));
    t.requires_grad = (int)V(s, a[4])->u.i;
  }
  int sdt = p->storages[t.storage].dtype;
  t.dtype = sdt == CKPTIO_TORCH_UNTYPED ? DTYPE_UINT8 : sdt;
  if (kind == G_REBUILD_V3) {
    if (V(s, a[6])->type != CKPTIO_PV_GLOBAL || V(s, a[6])->aux != G_DTYPE)
      return perr(s, CKPTIO_E_PICKLE, "tensor dtype is a %s, not a torch dtype",
                  ckptio_pickle_type_name(V(s, a[6])));
    t.dtype = V(s, a[6])->dtype;
  }
  /* The metadata dict carries the conj and neg bits: the stored bytes are
   * then not the tensor's values. */
  if (n == want + 1) {
    const ckptio_pv *m = V(s, a[want]);
    if (m->type != CKPTIO_PV_DICT && m->type != CKPTIO_PV_NONE)
      return perr(s, CKPTIO_E_PICKLE, "tensor metadata is a %s, not a dict", ckptio_pickle_type_name(m));
    for (uint32_t k = m->type == CKPTIO_PV_DICT ? m->u.first : UINT32_MAX; k != UINT32_MAX;
         k = p->nodes[k].next) {
      const ckptio_pv *v = V(s, p->nodes[k].value);
      if (v->type != CKPTIO_PV_BOOL || v->u.i)
        return perr(s, CKPTIO_E_FORMAT, "tensor has its conj or neg bit set (metadata); not supported");
    }
  }
  t.pos = s->at;
  if (grow((void **)&p->tensors, &p->tensors_cap, p->ntensors, sizeof(t)) < 0) return oom(s);
  if ((rc = new_value(s, CKPTIO_PV_TENSOR, id)) < 0) return rc;
  p->values[*id].u.index = (uint32_t)p->ntensors;
  p->tensors[p->ntensors++] = t;
  return 0;
}

/* A caller's class "called": NEWOBJ(cls, ()) is how pickle spells a
 * dataclass (its fields come by BUILD), REDUCE(cls, args) an enum member or
 * a path. Neither runs anything: the OBJECT keeps the kind and the
 * arguments. */
static int caller_object(parser *s, uint32_t fn, uint32_t args, const ckptio_pickle_class *cls, int newobj) {
  char nm[256];
  uint32_t r;
  int rc;
  const ckptio_pv *t = V(s, args);
  const char *op = newobj ? "NEWOBJ" : "REDUCE";
  shown(nm, sizeof(nm), (const char *)s->p->buf + V(s, fn)->u.off, V(s, fn)->last);
  if (cls->make == CKPTIO_PICKLE_A_VALUE)
    return perr(s, CKPTIO_E_PICKLE, "pickle %s calls %s, which is a value, not a class", op, nm);
  int by_args = cls->make == CKPTIO_PICKLE_BY_ARGS;
  if (newobj == by_args)
    return perr(s, CKPTIO_E_PICKLE, "pickle %s of '%s' is not allowed (it is made by %s)", op, nm,
                by_args ? "REDUCE of its arguments" : "NEWOBJ and BUILD, as a dataclass");
  if (newobj && t->n)
    return perr(s, CKPTIO_E_PICKLE, "pickle NEWOBJ of '%s' with %u arguments (a dataclass takes none)", nm, t->n);
  if ((rc = new_value(s, CKPTIO_PV_OBJECT, &r)) < 0) return rc;
  V(s, r)->aux = (uint16_t)cls->kind;
  V(s, r)->u.index = UINT32_MAX;
  V(s, r)->last = by_args ? args : UINT32_MAX;
  s->stack[s->sp - 1] = r;
  return 0;
}

/* torch.serialization._get_layout(name): the layout by its name, nothing
 * looked up. A caller's value of that name (torch.strided) is a GLOBAL of
 * its kind, any other layout an OTHER. */
static int layout_by_name(parser *s, uint32_t n, const uint32_t *a) {
  size_t len = 0;
  uint32_t r;
  int rc;
  const char *name = n == 1 ? ckptio_pickle_str(s->p, a[0], &len) : NULL;
  if (!name || V(s, a[0])->type != CKPTIO_PV_STR) return bad(s, "names a layout by something not a string");
  const ckptio_pickle_class *value = NULL;
  for (size_t k = 0; k < s->rules->nclasses && !value; k++) {
    const ckptio_pickle_class *c = &s->rules->classes[k];
    if (c->make == CKPTIO_PICKLE_A_VALUE && strlen(c->name) == len && !memcmp(c->name, name, len)) value = c;
  }
  if ((rc = new_value(s, value ? CKPTIO_PV_GLOBAL : CKPTIO_PV_OTHER, &r)) < 0) return rc;
  if (value) V(s, r)->aux = (uint16_t)value->kind, V(s, r)->u.off = V(s, a[0])->u.off, V(s, r)->last = (uint32_t)len;
  s->stack[s->sp - 1] = r;
  return 0;
}

/* REDUCE (newobj 0) and NEWOBJ: the callable below the argument tuple is
 * replaced by the result. Only allowed globals are callable here. */
static int op_reduce(parser *s, int newobj) {
  uint32_t args = 0, fn = 0, r = UINT32_MAX;
  int rc;
  if ((rc = pop(s, &args)) < 0 || (rc = top(s, &fn)) < 0) return rc;
  const ckptio_pv *f = V(s, fn), *t = V(s, args);
  if (f->type != CKPTIO_PV_GLOBAL)
    return perr(s, CKPTIO_E_PICKLE, "pickle %s calls a %s, not an allowed global",
                newobj ? "NEWOBJ" : "REDUCE", ckptio_pickle_type_name(f));
  if (t->type != CKPTIO_PV_TUPLE) return bad(s, "has arguments that are not a tuple");
  int kind = f->aux;
  uint32_t n = t->n;
  /* An empty tuple may come before any item exists (items still NULL), and
   * NULL + 0 is undefined: point at nothing instead. */
  const uint32_t *a = n ? s->p->items + t->u.first : NULL;
  if (kind >= CKPTIO_PICKLE_CLASS_BASE) return caller_object(s, fn, args, class_of_kind(s->rules, kind), newobj);
  if (kind == G_LAYOUT && !newobj && s->rules->nclasses) return layout_by_name(s, n, a);
  if (newobj) {
    if (kind == G_ODICT || kind == G_COUNTER) kind = G_ODICT, n = 0;  /* cls.__new__(cls) */
    else if (kind != G_SET) return unsupported(s, fn);
  }
  switch (kind) {
    case G_ODICT:
    case G_COUNTER:
      /* Counter pickles as Counter(dict): the dict is the result. */
      if (n == 1 && V(s, a[0])->type == CKPTIO_PV_DICT) r = a[0];
      else if (n == 0 && (rc = new_value(s, CKPTIO_PV_DICT, &r)) < 0) return rc;
      if (r == UINT32_MAX) return bad(s, "builds a dict from unexpected arguments");
      V(s, r)->aux = 1;
      break;
    case G_REBUILD:
    case G_REBUILD_V2:
    case G_REBUILD_V3:
      if ((rc = make_tensor(s, kind, a, n, &r)) < 0) return rc;
      break;
    case G_PARAM:
    case G_PARAM_STATE:
      if (n != (kind == G_PARAM ? 3u : 4u) || V(s, a[0])->type != CKPTIO_PV_TENSOR)
        return bad(s, "rebuilds a parameter from unexpected arguments");
      r = a[0];
      break;
    case G_SIZE:
      if (n != 1 || V(s, a[0])->type != CKPTIO_PV_TUPLE)
        return bad(s, "builds a torch.Size from a non-tuple");
      r = a[0];
      break;
    case G_ENCODE:  /* _codecs.encode(str, 'latin1'): how protocol 2 spells bytes */
      if (n < 1 || n > 2 || V(s, a[0])->type != CKPTIO_PV_STR) return bad(s, "encodes a non-string");
      if ((rc = new_value(s, CKPTIO_PV_BYTES, &r)) < 0) return rc;
      V(s, r)->u.off = V(s, a[0])->u.off;
      V(s, r)->n = V(s, a[0])->n;
      break;
    case G_NUMPY:  /* its state comes by one BUILD (aux counts it) */
      if (newobj) return unsupported(s, fn);
      if ((rc = new_value(s, CKPTIO_PV_OTHER, &r)) < 0) return rc;
      V(s, r)->aux = NUMPY_UNBUILT;
      break;
    case G_SET:  /* unordered: its items name nothing */
    case G_DEVICE:
    case G_BYTEARRAY:
    case G_COMPLEX:
      if ((rc = new_value(s, CKPTIO_PV_OTHER, &r)) < 0) return rc;
      break;
    default:
      return unsupported(s, fn);
  }
  s->stack[s->sp - 1] = r;
  return 0;
}

/* BINPERSID of ('storage', <storage class>, key, location, numel). */
static int op_persid(parser *s) {
  ckptio_pickle *p = s->p;
  uint32_t pid = 0, id;
  int rc;
  if ((rc = pop(s, &pid)) < 0) return rc;
  const ckptio_pv *t = V(s, pid);
  const uint32_t *a = t->type == CKPTIO_PV_TUPLE && t->n ? p->items + t->u.first : NULL;
  size_t len;
  const char *tag = a && t->n ? ckptio_pickle_str(p, a[0], &len) : NULL;
  if (!tag || len != 7 || memcmp(tag, "storage", 7))
    return perr(s, CKPTIO_E_PICKLE,
                "pickle persistent id is not a ('storage', ...) tuple; only storages are allowed");
  if (t->n != 5 || V(s, a[1])->type != CKPTIO_PV_GLOBAL || V(s, a[2])->type != CKPTIO_PV_STR ||
      V(s, a[3])->type != CKPTIO_PV_STR || V(s, a[4])->type != CKPTIO_PV_INT || V(s, a[4])->u.i < 0)
    return bad(s, "has a storage id that is not ('storage', class, key, location, numel)");
  int kind = V(s, a[1])->aux;
  if (kind != G_STORAGE && kind != G_UNTYPED) {
    if (kind == G_OTHER) return unsupported(s, a[1]);
    return bad(s, "names a storage class that is not one");
  }
  if (grow((void **)&p->storages, &p->storages_cap, p->nstorages, sizeof(*p->storages)) < 0) return oom(s);
  if ((rc = push_new(s, CKPTIO_PV_STORAGE, &id)) < 0) return rc;
  V(s, id)->u.index = (uint32_t)p->nstorages;
  p->storages[p->nstorages++] = (ckptio_pickle_storage){
      a[2], kind == G_UNTYPED ? CKPTIO_TORCH_UNTYPED : V(s, a[1])->dtype, (uint64_t)V(s, a[4])->u.i, s->at};
  return 0;
}

static int op_memo(parser *s, int put, size_t idx) {
  uint32_t id = 0;
  int rc;
  if (put) {
    /* Pickler memo ids count up from 0, one per PUT: an id past the
     * pickle's length is a memo bomb, not a checkpoint. */
    if (idx >= s->p->len) return perr(s, CKPTIO_E_PICKLE, "pickle memo index %zu is past the limit", idx);
    if ((rc = top(s, &id)) < 0) return rc;
    while (idx >= s->memo_cap) {
      size_t ncap = s->memo_cap ? s->memo_cap * 2 : 256;
      uint32_t *m = realloc(s->memo, ncap * sizeof(*m));
      if (!m) return oom(s);
      memset(m + s->memo_cap, 0, (ncap - s->memo_cap) * sizeof(*m));
      s->memo = m;
      s->memo_cap = ncap;
    }
    if (!s->memo[idx]) s->memo_count++;
    s->memo[idx] = id + 1;
    return 0;
  }
  if (idx >= s->memo_cap || !s->memo[idx])
    return perr(s, CKPTIO_E_PICKLE, "malformed pickle: memo %zu is unset", idx);
  return push(s, s->memo[idx] - 1);
}

static int refuse_op(parser *s, uint8_t op) {
  return ckptio_err_fmt(s->err, s->errlen, CKPTIO_E_PICKLE, "pickle opcode 0x%02x (%s) at byte %zu is not allowed",
                        op, op_name(op), s->at);
}

/* The opcodes of pickle.dump's protocol 4 that torch.save's protocol 2
 * never writes: framing, memoizing, module and name from the stack, and
 * the other widths of strings and bytes. */
static int step_protocol4(parser *s, uint8_t op) {
  const uint8_t *b = s->p->buf;
  uint32_t id = 0;
  size_t n;
  int rc;
  switch (op) {
    case 0x95:  /* FRAME: a length hint over the next bytes; they must be there */
      if ((rc = need(s, 8)) < 0) return rc;
      n = (size_t)rd_le(b + s->pos, 8);
      s->pos += 8;
      if (n > s->p->len - s->pos)
        return perr(s, CKPTIO_E_PICKLE, "malformed pickle: FRAME of %zu bytes runs past the end (%zu left)", n,
                    s->p->len - s->pos);
      return 0;
    case 0x94:  /* MEMOIZE: the next memo index */
      return op_memo(s, 1, s->memo_count);
    case 0x93: return op_stack_global(s);
    case 0x8c:
    case 0x8d:
    case 'C':
    case 'B':
    case 0x8e: {
      n = op == 0x8c || op == 'C' ? 1 : op == 'B' ? 4 : 8;
      if ((rc = need(s, n)) < 0) return rc;
      uint64_t len = rd_le(b + s->pos, (int)n);
      if (len > CKPTIO_PICKLE_MAX_STRING)
        return perr(s, CKPTIO_E_PICKLE, "pickle string of %llu bytes is over the limit", (unsigned long long)len);
      if ((rc = need(s, n + (size_t)len)) < 0 ||
          (rc = push_new(s, op == 0x8c || op == 0x8d ? CKPTIO_PV_STR : CKPTIO_PV_BYTES, &id)) < 0)
        return rc;
      V(s, id)->u.off = s->pos + n;
      V(s, id)->n = (uint32_t)len;
      s->pos += n + (size_t)len;
      return 0;
    }
    default:
      return refuse_op(s, op);
  }
}

static int step(parser *s, uint8_t op) {
  const uint8_t *b = s->p->buf;
  uint32_t id = 0, v = 0;
  size_t from = 0, n;
  int rc;
  switch (op) {
    case 0x80:  /* PROTO */
      if ((rc = need(s, 1)) < 0) return rc;
      if (b[s->pos] > 5) return perr(s, CKPTIO_E_PICKLE, "pickle protocol %u is not supported", b[s->pos]);
      s->p->protocol = b[s->pos++];
      return 0;
    case 'c': return op_global(s);
    case 'R': return op_reduce(s, 0);
    case 0x81: return op_reduce(s, 1);
    case 'Q': return op_persid(s);
    case 'b':  /* BUILD: only an OrderedDict's attributes (a state_dict's _metadata) */
      if ((rc = pop(s, &v)) < 0 || (rc = top(s, &id)) < 0) return rc;
      if (V(s, id)->type == CKPTIO_PV_OBJECT) {  /* a caller's dataclass's fields, kept as data */
        if (V(s, id)->u.index != UINT32_MAX || V(s, id)->last != UINT32_MAX)
          return perr(s, CKPTIO_E_PICKLE, "pickle BUILD on an instance that already has its state");
        V(s, id)->u.index = v;
        return 0;
      }
      if (V(s, id)->type == CKPTIO_PV_OTHER && V(s, id)->aux == NUMPY_UNBUILT) {  /* an array's or dtype's state */
        V(s, id)->aux = NUMPY_BUILT;
        return 0;
      }
      if (V(s, id)->type != CKPTIO_PV_DICT || !V(s, id)->aux)
        return V(s, id)->type == CKPTIO_PV_TENSOR
                   ? perr(s, CKPTIO_E_FORMAT,
                          "pickle BUILD on a tensor (legacy or subclass state) is not supported")
                   : perr(s, CKPTIO_E_PICKLE, "pickle BUILD on a %s is not allowed",
                          ckptio_pickle_type_name(V(s, id)));
      return 0;
    case '(':
      if (s->nmarks >= CKPTIO_PICKLE_MAX_DEPTH)
        return perr(s, CKPTIO_E_PICKLE, "pickle MARKs nested deeper than %d", CKPTIO_PICKLE_MAX_DEPTH);
      s->marks[s->nmarks++] = s->sp;
      return 0;
    case 't':
      if ((rc = pop_mark(s, &from)) < 0) return rc;
      return (rc = make_tuple(s, from, &id)) < 0 ? rc : push(s, id);
    case ')':
    case 0x85:
    case 0x86:
    case 0x87:
      n = op == ')' ? 0 : (size_t)(op - 0x84);
      if (s->sp - base(s) < n) return bad(s, "finds too few values on the stack");
      return (rc = make_tuple(s, s->sp - n, &id)) < 0 ? rc : push(s, id);
    case ']': return push_new(s, CKPTIO_PV_LIST, &id);
    case '}': return push_new(s, CKPTIO_PV_DICT, &id);
    case 0x8f: return push_new(s, CKPTIO_PV_OTHER, &id);  /* a set: unordered, names nothing */
    case 'a': return s->sp - base(s) < 1 ? bad(s, "finds the stack empty") : fill(s, s->sp - 1, 0);
    case 's':
      return s->sp - base(s) < 2 ? bad(s, "finds too few values on the stack") : fill(s, s->sp - 2, 1);
    case 'e':
    case 'u':
      if ((rc = pop_mark(s, &from)) < 0) return rc;
      return fill(s, from, op == 'u');
    case 'N':
    case 0x88:
    case 0x89:  /* immutable: one value serves every push */
      n = op == 'N' ? 0 : op == 0x89 ? 1 : 2;
      if (!s->consts[n]) {
        if ((rc = new_value(s, n ? CKPTIO_PV_BOOL : CKPTIO_PV_NONE, &id)) < 0) return rc;
        V(s, id)->u.i = n == 2;
        s->consts[n] = id + 1;
      }
      return push(s, s->consts[n] - 1);
    case 'J':
    case 'K':
    case 'M':
      n = op == 'J' ? 4 : op == 'K' ? 1 : 2;
      if ((rc = need(s, n)) < 0 || (rc = push_new(s, CKPTIO_PV_INT, &id)) < 0) return rc;
      V(s, id)->u.i =
          op == 'J' ? (int64_t)(int32_t)(uint32_t)rd_le(b + s->pos, 4) : (int64_t)rd_le(b + s->pos, (int)n);
      s->pos += n;
      return 0;
    case 0x8a: {  /* LONG1: little-endian two's complement of n bytes */
      if ((rc = need(s, 1)) < 0) return rc;
      n = b[s->pos];
      if ((rc = need(s, 1 + n)) < 0) return rc;
      const uint8_t *d = b + s->pos + 1;
      int fits = 1;
      for (size_t k = 8; k < n; k++) fits &= d[k] == ((d[7] & 0x80) ? 0xff : 0);
      if ((rc = push_new(s, fits ? CKPTIO_PV_INT : CKPTIO_PV_BIGINT, &id)) < 0) return rc;
      if (fits && n) {
        size_t m = n < 8 ? n : 8;
        uint64_t u = rd_le(d, (int)m);
        if (m < 8 && (d[m - 1] & 0x80)) u |= ~0ull << (8 * m);
        V(s, id)->u.i = (int64_t)u;
      } else if (!fits) {
        V(s, id)->u.off = s->pos + 1;
        V(s, id)->n = (uint32_t)n;
      }
      s->pos += 1 + n;
      return 0;
    }
    case 'G': {  /* BINFLOAT: big-endian IEEE double */
      uint64_t u = 0;
      if ((rc = need(s, 8)) < 0 || (rc = push_new(s, CKPTIO_PV_FLOAT, &id)) < 0) return rc;
      for (int k = 0; k < 8; k++) u = u << 8 | b[s->pos + k];
      memcpy(&V(s, id)->u.f, &u, 8);
      s->pos += 8;
      return 0;
    }
    case 'X':
    case 'U': {
      n = op == 'X' ? 4 : 1;
      if ((rc = need(s, n)) < 0) return rc;
      size_t len = (size_t)rd_le(b + s->pos, (int)n);
      if (len > CKPTIO_PICKLE_MAX_STRING)
        return perr(s, CKPTIO_E_PICKLE, "pickle string of %zu bytes is over the limit", len);
      if ((rc = need(s, n + len)) < 0 || (rc = push_new(s, CKPTIO_PV_STR, &id)) < 0) return rc;
      V(s, id)->u.off = s->pos + n;
      V(s, id)->n = (uint32_t)len;
      s->pos += n + len;
      return 0;
    }
    case 'h':
    case 'j':
    case 'q':
    case 'r':
      n = op == 'h' || op == 'q' ? 1 : 4;
      if ((rc = need(s, n)) < 0) return rc;
      s->pos += n;
      return op_memo(s, op == 'q' || op == 'r', (size_t)rd_le(b + s->pos - n, (int)n));
    default:
      if (s->rules->protocol4) return step_protocol4(s, op);
      return refuse_op(s, op);
  }
}

int ckptio_pickle_parse(const uint8_t *buf, size_t len, ckptio_pickle *out, char *err, size_t errlen) {
  static const ckptio_pickle_rules torch_save_only = {0};
  return ckptio_pickle_parse_with(buf, len, &torch_save_only, out, err, errlen);
}

int ckptio_pickle_parse_with(const uint8_t *buf, size_t len, const ckptio_pickle_rules *rules, ckptio_pickle *out,
                             char *err, size_t errlen) {
  parser s;
  int rc = 0;
  if (!out || (!buf && len))
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "pickle_parse: NULL argument");
  memset(out, 0, sizeof(*out));
  memset(&s, 0, sizeof(s));
  if (!rules) return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "pickle_parse: NULL rules");
  if (len > CKPTIO_PICKLE_MAX_BYTES)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_PICKLE, "pickle of %zu bytes is over the %llu-byte limit",
                          len, CKPTIO_PICKLE_MAX_BYTES);
  out->buf = buf;
  out->len = len;
  s.p = out;
  s.err = err;
  s.errlen = errlen;
  s.rules = rules;
  for (;;) {
    if (s.pos >= len) {
      rc = ckptio_err_fmt(err, errlen, CKPTIO_E_PICKLE, "malformed pickle: it ends at byte %zu without STOP",
                          len);
      goto fail;
    }
    s.at = s.pos;
    uint8_t op = buf[s.pos++];
    if (op == '.') break;
    if ((rc = step(&s, op)) < 0) goto fail;
  }
  if ((rc = pop(&s, &out->root)) < 0) goto fail;
  free(s.stack);
  free(s.memo);
  return 0;
fail:
  free(s.stack);
  free(s.memo);
  ckptio_pickle_free(out);
  return rc;
}

void ckptio_pickle_free(ckptio_pickle *p) {
  if (!p) return;
  free(p->values);
  free(p->items);
  free(p->nodes);
  free(p->storages);
  free(p->tensors);
  memset(p, 0, sizeof(*p));
}

const char *ckptio_pickle_str(const ckptio_pickle *p, uint32_t id, size_t *len) {
  if (!p || id >= p->nvalues) return NULL;
  const ckptio_pv *v = &p->values[id];
  if (v->type != CKPTIO_PV_STR && v->type != CKPTIO_PV_BYTES) return NULL;
  if (len) *len = v->n;
  return (const char *)p->buf + v->u.off;
}

int ckptio_pickle_dtype_of(const ckptio_pickle *p, uint32_t id) {
  if (!p || id >= p->nvalues) return -1;
  const ckptio_pv *v = &p->values[id];
  return v->type == CKPTIO_PV_GLOBAL && v->aux == G_DTYPE ? v->dtype : -1;
}
