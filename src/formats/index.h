/* What a reader knows of a checkpoint, whatever its format: every tensor's
 * name, dtype, shape and where its bytes are, plus string metadata. Formats
 * build it from a validated header; the load pipeline reads only this. */
#ifndef CKPTIO_FORMATS_INDEX_H
#define CKPTIO_FORMATS_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "ckptio.h"

typedef struct ckptio_entry {
  char *name;              /* owned by the index */
  ckptio_dtype dtype;
  int ndim;
  int64_t shape[CKPTIO_MAX_DIMS];
  uint64_t offset;         /* absolute file offset of the bytes read */
  uint64_t nbytes;         /* bytes at offset: the tensor's, or its storage's when strided */
  int has_crc;
  uint32_t crc;            /* CRC-32 of exactly [offset, offset + nbytes) */
  /* A view into a larger storage (PyTorch): element (i0, i1, ...) is at
   * storage element elem_offset + sum(i_d * stride[d]). 0 when the tensor's
   * bytes are exactly [offset, offset + nbytes) in row-major order. */
  int strided;
  uint64_t elem_offset;
  int64_t stride[CKPTIO_MAX_DIMS];
  int byteswap;            /* 1: stored big-endian, swap each element on load */
} ckptio_entry;

typedef struct ckptio_meta {
  char *key, *value;       /* owned by the index */
} ckptio_meta;

/* What the bytes are: a file's format, or for sources made of files the
 * set's. 0 until a format fills the index. */
typedef enum ckptio_index_format {
  CKPTIO_INDEX_SAFETENSORS = 1,
  CKPTIO_INDEX_PYTORCH,
  CKPTIO_INDEX_SHARDED,  /* a Hugging Face set of safetensors files */
  CKPTIO_INDEX_DCP,
} ckptio_index_format;

typedef struct ckptio_index {
  ckptio_index_format format;
  ckptio_entry *entries;   /* sorted by offset */
  size_t count;
  ckptio_meta *meta;
  size_t meta_count;
  uint64_t header_bytes;   /* bytes before the first tensor's data (for inspect) */
} ckptio_index;

void ckptio_index_free(ckptio_index *idx);
/* The name ckptio_reader_format reports: "safetensors", "pytorch",
 * "safetensors-sharded", "dcp", or "" for 0. */
const char *ckptio_index_format_name(ckptio_index_format f);

#endif
