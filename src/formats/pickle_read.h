/*
 * A safe reader of the pickles torch.save writes (data.pkl): the opcodes and
 * globals torch's weights_only unpickler allows and no others, into a small
 * arena of tagged values. Nothing is imported or called; tensors stay
 * references to storage records, never expanded. Every count is bounded by
 * the pickle's size and by the limits below.
 */
#ifndef CKPTIO_FORMATS_PICKLE_READ_H
#define CKPTIO_FORMATS_PICKLE_READ_H

#include <stddef.h>
#include <stdint.h>

#include "ckptio.h"

#define CKPTIO_PICKLE_MAX_BYTES (1ull << 30)  /* data.pkl; a state dict's is kilobytes */
#define CKPTIO_PICKLE_MAX_STACK (1u << 22)    /* values on the stack at once */
#define CKPTIO_PICKLE_MAX_DEPTH 128           /* MARK nesting, and container nesting on walk */
#define CKPTIO_PICKLE_MAX_STRING (1u << 26)   /* bytes of one string */
#define CKPTIO_PICKLE_MAX_PATH 65536          /* bytes of a dotted tensor / metadata name */
#define CKPTIO_PICKLE_MAX_GLOBAL 256          /* bytes of a GLOBAL's module or name line */

/* ------------------------------------------------------------ torch dtypes */

/* A torch dtype by its name in torch (the `torch.<name>` global). */
typedef struct ckptio_torch_dtype {
  const char *name;     /* "float32" */
  const char *storage;  /* its legacy storage class ("FloatStorage"), or NULL */
  int elsize;           /* bytes per element in a storage */
  int ckptio;           /* the ckptio_dtype, or -1 when ckptio has none */
} ckptio_torch_dtype;

/* Index of torch.UntypedStorage's "dtype": bytes (elsize 1), no torch dtype. */
#define CKPTIO_TORCH_UNTYPED (-1)

/*! @return the dtype at `index` of the table, or NULL past its end. */
const ckptio_torch_dtype *ckptio_torch_dtype_at(int index);

/* ------------------------------------------------------------ values */

typedef enum ckptio_pv_type {
  CKPTIO_PV_NONE, CKPTIO_PV_BOOL, CKPTIO_PV_INT, CKPTIO_PV_BIGINT, CKPTIO_PV_FLOAT,
  CKPTIO_PV_STR, CKPTIO_PV_BYTES, CKPTIO_PV_TUPLE, CKPTIO_PV_LIST, CKPTIO_PV_DICT,
  CKPTIO_PV_GLOBAL, CKPTIO_PV_STORAGE, CKPTIO_PV_TENSOR,
  CKPTIO_PV_OTHER,  /* an allowed value ckptio does not look into (set, device, complex) */
  CKPTIO_PV_OBJECT, /* an instance of a caller's class (ckptio_pickle_rules), kept as
                       plain data: aux its kind, u.index its BUILD state (or UINT32_MAX),
                       last its REDUCE arguments (or UINT32_MAX) */
} ckptio_pv_type;

/* A caller's own classes, allowed beyond torch's weights_only allowlist
 * (formats/dcp_meta.c: torch.distributed.checkpoint's metadata). None is
 * ever imported or called; each is made as data, one way: */
typedef enum ckptio_pickle_make {
  CKPTIO_PICKLE_BY_STATE, /* NEWOBJ(cls, ()) then BUILD(state), as pickle
                             spells a dataclass: an OBJECT, u.index its state */
  CKPTIO_PICKLE_BY_ARGS,  /* REDUCE(cls, args), an enum member or a path: an
                             OBJECT, last its argument tuple */
  CKPTIO_PICKLE_A_VALUE,  /* a global used as it is, never called (a layout
                             such as torch.strided; also what
                             torch.serialization._get_layout(name) gives) */
} ckptio_pickle_make;

/* The kinds a caller gives its classes start here, past the parser's own;
 * a GLOBAL or OBJECT value of one has its kind in aux. */
#define CKPTIO_PICKLE_CLASS_BASE 64

typedef struct ckptio_pickle_class {
  const char *name;       /* "module.qualname" */
  int kind;               /* >= CKPTIO_PICKLE_CLASS_BASE */
  ckptio_pickle_make make;
} ckptio_pickle_class;

/* What a parse allows beyond torch.save's pickles. */
typedef struct ckptio_pickle_rules {
  int protocol4;          /* 1: also the opcodes pickle.dump's protocols 4
                             and 5 write (FRAME, MEMOIZE, STACK_GLOBAL, the
                             short and 8-byte strings and bytes) */
  const ckptio_pickle_class *classes;
  size_t nclasses;
  const char *classes_are; /* their name in messages ("DCP's metadata classes") */
} ckptio_pickle_rules;

typedef struct ckptio_pv {
  uint8_t type;       /* ckptio_pv_type */
  uint8_t walking;    /* set while the torch walk is inside this container (cycles) */
  uint16_t aux;       /* GLOBAL: its kind; DICT: 1 when built by a class (BUILD allowed);
                         OTHER: 1 or 2 when a numpy reducer made it (its one BUILD to come, done) */
  uint32_t n;         /* TUPLE/LIST/DICT: items; STR/BYTES/BIGINT: bytes */
  union {
    int64_t i;        /* BOOL, INT */
    double f;         /* FLOAT */
    uint64_t off;     /* STR, BYTES, BIGINT, GLOBAL ("module\nname"): offset in the pickle */
    uint32_t first;   /* TUPLE: first of n ids in items; LIST/DICT: first node, or UINT32_MAX */
    uint32_t index;   /* STORAGE: in storages; TENSOR: in tensors */
  } u;
  uint32_t last;      /* LIST/DICT: last node; GLOBAL: length of "module\nname" */
  int32_t dtype;      /* GLOBAL of a dtype or storage class: index in the dtype table */
} ckptio_pv;

/* A list item (key unused) or a dict item, chained in insertion order. */
typedef struct ckptio_pickle_node {
  uint32_t key, value, next;
} ckptio_pickle_node;

/* One persistent id ('storage', <class>, key, location, numel). */
typedef struct ckptio_pickle_storage {
  uint32_t key;       /* value id of the key string */
  int dtype;          /* dtype table index, or CKPTIO_TORCH_UNTYPED */
  uint64_t numel;     /* elements of dtype (bytes when untyped) */
  uint64_t pos;       /* pickle byte of the BINPERSID, for messages */
} ckptio_pickle_storage;

/* A tensor rebuilt by _rebuild_tensor(_v2/_v3) or _rebuild_parameter. */
typedef struct ckptio_pickle_tensor {
  uint32_t storage;   /* index in storages */
  int dtype;          /* the tensor's dtype: table index, or CKPTIO_TORCH_UNTYPED (bytes) */
  uint64_t offset;    /* storage_offset, in elements of dtype */
  int ndim;
  int64_t size[CKPTIO_MAX_DIMS];
  int64_t stride[CKPTIO_MAX_DIMS];
  int requires_grad;
  uint64_t pos;       /* pickle byte of the REDUCE, for messages */
} ckptio_pickle_tensor;

typedef struct ckptio_pickle {
  const uint8_t *buf;            /* the pickle (borrowed) */
  size_t len;
  ckptio_pv *values;             /* ids are indices here */
  size_t nvalues, values_cap;
  uint32_t *items;               /* tuple items */
  size_t nitems, items_cap;
  ckptio_pickle_node *nodes;
  size_t nnodes, nodes_cap;
  ckptio_pickle_storage *storages;
  size_t nstorages, storages_cap;
  ckptio_pickle_tensor *tensors;
  size_t ntensors, tensors_cap;
  uint32_t root;                 /* the value STOP returned */
  int protocol;                  /* from PROTO, or 0 */
} ckptio_pickle;

/*! ckptio_pickle_parse() :
 *  Runs the pickle in buf[0, len) (borrowed: strings point into it, so it
 *  must outlive *out) on the value arena and fills *out (free with
 *  ckptio_pickle_free). Opcodes and globals outside torch's weights_only
 *  allowlist (and numpy's array, scalar and dtype reducers, which torch
 *  takes under safe_globals; kept as CKPTIO_PV_OTHER) are refused by name; allowlisted ones that ckptio cannot
 *  represent (quantized, sparse, subclass tensors, ...) are refused as
 *  unsupported.
 *  @return 0; CKPTIO_E_PICKLE (an opcode or global not allowed, a malformed
 *          or truncated stream, a limit passed); CKPTIO_E_FORMAT (allowed by
 *          torch, not supported here); CKPTIO_E_SHAPE / CKPTIO_E_OVERFLOW (a
 *          tensor's size, stride or offset); -ENOMEM. err names the opcode,
 *          global or value and the pickle byte. *out is empty on failure. */
int ckptio_pickle_parse(const uint8_t *buf, size_t len, ckptio_pickle *out, char *err,
                        size_t errlen);
/*! ckptio_pickle_parse_with() :
 *  As ckptio_pickle_parse, with what `rules` allows besides (the newer
 *  opcodes, a caller's classes). Nothing more is called: the caller reads
 *  the OBJECT values as data. */
int ckptio_pickle_parse_with(const uint8_t *buf, size_t len, const ckptio_pickle_rules *rules, ckptio_pickle *out,
                             char *err, size_t errlen);
void ckptio_pickle_free(ckptio_pickle *p);

/*! "int", "dict", ... for messages. Static. */
const char *ckptio_pickle_type_name(const ckptio_pv *v);

/*! The dtype table index of a `torch.<dtype>` global value, or -1. */
int ckptio_pickle_dtype_of(const ckptio_pickle *p, uint32_t id);

/*! The bytes of a STR/BYTES value (not NUL-terminated), and their length. */
const char *ckptio_pickle_str(const ckptio_pickle *p, uint32_t id, size_t *len);

#endif
