/* The dtype table: safetensors names and element widths in bits. */
#include <string.h>

#include "ckptio.h"

static const struct {
  const char *name;
  int bits;
} kDtypes[CKPTIO_DTYPE_COUNT] = {
    [CKPTIO_BOOL] = {"BOOL", 8},          [CKPTIO_F4] = {"F4", 4},
    [CKPTIO_F6_E2M3] = {"F6_E2M3", 6},    [CKPTIO_F6_E3M2] = {"F6_E3M2", 6},
    [CKPTIO_U8] = {"U8", 8},              [CKPTIO_I8] = {"I8", 8},
    [CKPTIO_F8_E5M2] = {"F8_E5M2", 8},    [CKPTIO_F8_E4M3] = {"F8_E4M3", 8},
    [CKPTIO_F8_E8M0] = {"F8_E8M0", 8},    [CKPTIO_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8},
    [CKPTIO_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8},
    [CKPTIO_I16] = {"I16", 16},           [CKPTIO_U16] = {"U16", 16},
    [CKPTIO_F16] = {"F16", 16},           [CKPTIO_BF16] = {"BF16", 16},
    [CKPTIO_I32] = {"I32", 32},           [CKPTIO_U32] = {"U32", 32},
    [CKPTIO_F32] = {"F32", 32},           [CKPTIO_C64] = {"C64", 64},
    [CKPTIO_F64] = {"F64", 64},           [CKPTIO_I64] = {"I64", 64},
    [CKPTIO_U64] = {"U64", 64},
};

int ckptio_dtype_bits(ckptio_dtype dtype) {
  if ((unsigned)dtype >= CKPTIO_DTYPE_COUNT) return 0;
  return kDtypes[dtype].bits;
}

const char *ckptio_dtype_name(ckptio_dtype dtype) {
  if ((unsigned)dtype >= CKPTIO_DTYPE_COUNT) return NULL;
  return kDtypes[dtype].name;
}

int ckptio_dtype_parse(const char *name, ckptio_dtype *out) {
  for (int i = 0; name && i < CKPTIO_DTYPE_COUNT; i++) {
    if (strcmp(name, kDtypes[i].name) == 0) {
      *out = (ckptio_dtype)i;
      return 0;
    }
  }
  return CKPTIO_E_DTYPE;
}

int64_t ckptio_tensor_nbytes(ckptio_dtype dtype, int ndim, const int64_t *shape) {
  int bits = ckptio_dtype_bits(dtype);
  if (!bits) return CKPTIO_E_DTYPE;
  if (ndim < 0 || ndim > CKPTIO_MAX_DIMS || (ndim && !shape)) return CKPTIO_E_SHAPE;
  uint64_t elems = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0) return CKPTIO_E_SHAPE;
    if (__builtin_mul_overflow(elems, (uint64_t)shape[d], &elems)) return CKPTIO_E_OVERFLOW;
  }
  uint64_t total_bits;
  if (__builtin_mul_overflow(elems, (uint64_t)bits, &total_bits)) return CKPTIO_E_OVERFLOW;
  if (total_bits % 8) return CKPTIO_E_MISALIGNED;
  if (total_bits / 8 > (uint64_t)INT64_MAX) return CKPTIO_E_OVERFLOW;
  return (int64_t)(total_bits / 8);
}
