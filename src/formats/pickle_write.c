/*
 * Protocol-2 pickle emitter (see pickle_write.h). The encodings follow
 * CPython's Lib/pickle.py (save_long, save_tuple, _batch_setitems, memoize)
 * so that torch.save's data.pkl can be reproduced byte for byte.
 */
#include "formats/pickle_write.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ckptio.h"

#define OP_PROTO 0x80
#define OP_GLOBAL 'c'
#define OP_BINPUT 'q'
#define OP_LONG_BINPUT 'r'
#define OP_BINGET 'h'
#define OP_LONG_BINGET 'j'
#define OP_BININT 'J'
#define OP_BININT1 'K'
#define OP_BININT2 'M'
#define OP_LONG1 0x8a
#define OP_BINUNICODE 'X'
#define OP_TUPLE1 0x85
#define OP_TUPLE2 0x86
#define OP_TUPLE3 0x87

void ckptio_pickle_w_init(ckptio_pickle_w *p) { memset(p, 0, sizeof(*p)); }

void ckptio_pickle_w_free(ckptio_pickle_w *p) {
  if (!p) return;
  free(p->data);
  memset(p, 0, sizeof(*p));
}

static int put(ckptio_pickle_w *p, const void *bytes, size_t n) {
  if (p->err) return p->err;
  if (n > p->cap - p->len) {
    size_t ncap = p->cap ? p->cap : 256;
    while (ncap - p->len < n) {
      if (ncap > SIZE_MAX / 2) return p->err = -ENOMEM;
      ncap *= 2;
    }
    uint8_t *d = realloc(p->data, ncap);
    if (!d) return p->err = -ENOMEM;
    p->data = d;
    p->cap = ncap;
  }
  memcpy(p->data + p->len, bytes, n);
  p->len += n;
  return 0;
}

static int put_u32(ckptio_pickle_w *p, uint8_t op, uint32_t v) {
  uint8_t b[5] = {op, (uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
  return put(p, b, 5);
}

int ckptio_pickle_w_proto(ckptio_pickle_w *p) {
  static const uint8_t b[2] = {OP_PROTO, 2};
  return put(p, b, 2);
}

int ckptio_pickle_w_op(ckptio_pickle_w *p, uint8_t op) { return put(p, &op, 1); }

int ckptio_pickle_w_put(ckptio_pickle_w *p, uint32_t *idx) {
  uint32_t i = p->memo;
  int rc;
  if (p->err) return p->err;
  if (i == UINT32_MAX) return p->err = CKPTIO_E_OVERFLOW;
  if (i < 256) {
    uint8_t b[2] = {OP_BINPUT, (uint8_t)i};
    rc = put(p, b, 2);
  } else {
    rc = put_u32(p, OP_LONG_BINPUT, i);
  }
  if (rc < 0) return rc;
  p->memo++;
  if (idx) *idx = i;
  return 0;
}

int ckptio_pickle_w_get(ckptio_pickle_w *p, uint32_t idx) {
  if (idx < 256) {
    uint8_t b[2] = {OP_BINGET, (uint8_t)idx};
    return put(p, b, 2);
  }
  return put_u32(p, OP_LONG_BINGET, idx);
}

int ckptio_pickle_w_global(ckptio_pickle_w *p, const char *module, const char *name, uint32_t *idx) {
  static const uint8_t op = OP_GLOBAL, nl = '\n';
  put(p, &op, 1);
  put(p, module, strlen(module));
  put(p, &nl, 1);
  put(p, name, strlen(name));
  put(p, &nl, 1);
  return ckptio_pickle_w_put(p, idx);
}

int ckptio_pickle_w_int(ckptio_pickle_w *p, int64_t v) {
  if (v >= 0 && v <= 0xff) {
    uint8_t b[2] = {OP_BININT1, (uint8_t)v};
    return put(p, b, 2);
  }
  if (v >= 0 && v <= 0xffff) {
    uint8_t b[3] = {OP_BININT2, (uint8_t)v, (uint8_t)(v >> 8)};
    return put(p, b, 3);
  }
  if (v >= INT32_MIN && v <= INT32_MAX) return put_u32(p, OP_BININT, (uint32_t)v);
  /* LONG1: the shortest little-endian two's complement, as encode_long. */
  uint8_t b[10];
  uint64_t u = (uint64_t)v;
  size_t n = 8;
  for (size_t k = 0; k < 8; k++) b[2 + k] = (uint8_t)(u >> (8 * k));
  while (n > 1 && ((b[1 + n] == 0x00 && !(b[n] & 0x80)) || (b[1 + n] == 0xff && (b[n] & 0x80)))) n--;
  b[0] = OP_LONG1;
  b[1] = (uint8_t)n;
  return put(p, b, 2 + n);
}

int ckptio_pickle_w_unicode(ckptio_pickle_w *p, const char *s, size_t len, uint32_t *idx) {
  if (p->err) return p->err;
  /* BINUNICODE8 is protocol 4; a longer name has no protocol-2 form. */
  if (len > UINT32_MAX) return p->err = CKPTIO_E_OVERFLOW;
  put_u32(p, OP_BINUNICODE, (uint32_t)len);
  put(p, s, len);
  return ckptio_pickle_w_put(p, idx);
}

int ckptio_pickle_w_tuple_begin(ckptio_pickle_w *p, size_t n) {
  if (n == 0) return ckptio_pickle_w_op(p, CKPTIO_PICKLE_EMPTY_TUPLE);
  if (n > 3) return ckptio_pickle_w_op(p, CKPTIO_PICKLE_MARK);
  return p->err;
}

int ckptio_pickle_w_tuple_end(ckptio_pickle_w *p, size_t n) {
  static const uint8_t small[4] = {0, OP_TUPLE1, OP_TUPLE2, OP_TUPLE3};
  if (n == 0) return p->err;
  ckptio_pickle_w_op(p, n <= 3 ? small[n] : (uint8_t)CKPTIO_PICKLE_TUPLE);
  return ckptio_pickle_w_put(p, NULL);
}

size_t ckptio_pickle_w_items_begin(ckptio_pickle_w *p, size_t left) {
  size_t batch = left < CKPTIO_PICKLE_BATCH ? left : CKPTIO_PICKLE_BATCH;
  if (batch > 1) ckptio_pickle_w_op(p, CKPTIO_PICKLE_MARK);
  return batch;
}

int ckptio_pickle_w_items_end(ckptio_pickle_w *p, size_t batch) {
  if (batch == 0) return p->err;
  return ckptio_pickle_w_op(p, batch == 1 ? CKPTIO_PICKLE_SETITEM : CKPTIO_PICKLE_SETITEMS);
}
