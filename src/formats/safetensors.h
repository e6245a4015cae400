/*
 * safetensors: the byte layout, nothing else. Plans a file for the writer
 * (header bytes and every tensor's offset, fixed up front) and parses and
 * validates a header for the reader. Never touches files or threads.
 */
#ifndef CKPTIO_FORMATS_SAFETENSORS_H
#define CKPTIO_FORMATS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "ckptio.h"
#include "formats/index.h"

#define CKPTIO_ST_MAX_HEADER 100000000ull
#define CKPTIO_ST_CRC_PREFIX "ckptio.crc32."   /* + tensor name -> 8 hex digits */
#define CKPTIO_ST_VERSION_KEY "ckptio.version"

/* ------------------------------------------------------------ reading */

typedef struct ckptio_st_entry {
  char *name;            /* owned by the index, unescaped UTF-8 */
  ckptio_dtype dtype;
  int ndim;
  int64_t shape[CKPTIO_MAX_DIMS];
  uint64_t begin, end;   /* relative to the data buffer */
  int has_crc;
  uint32_t crc;
} ckptio_st_entry;

typedef struct ckptio_st_kv {
  char *key, *value;     /* owned by the index */
} ckptio_st_kv;

typedef struct ckptio_st_index {
  ckptio_st_entry *entries;  /* sorted by begin */
  size_t count;
  ckptio_st_kv *meta;        /* __metadata__ minus the ckptio.crc32.* keys, file order */
  size_t meta_count;
  uint64_t data_start;       /* 8 + N: absolute offset of the data buffer */
} ckptio_st_index;

/* Rules 1-3 of FORMATS.md: from the first min(8, file_size) bytes, the header
 * length N. @return 0, CKPTIO_E_HEADER_TOO_SMALL, _TOO_LARGE or _LENGTH. */
int ckptio_st_header_length(const uint8_t *prefix, uint64_t file_size,
                            uint64_t *header_len, char *err, size_t errlen);

/* Rules 4-7: parses the N header bytes (without the 8-byte prefix) of a file
 * of file_size bytes. Fills *out (free with ckptio_st_index_free). CRC keys
 * "ckptio.crc32.<name>" become entries' has_crc/crc. On failure returns the
 * rule's code, writes a message naming the rule (and tensor) into err, and
 * leaves *out empty. */
int ckptio_st_parse(const uint8_t *header, uint64_t header_len, uint64_t file_size,
                    ckptio_st_index *out, char *err, size_t errlen);
void ckptio_st_index_free(ckptio_st_index *idx);
/* Moves a parsed header into the format-neutral index (names and metadata
 * change owner: st is left without them; free it as usual). Offsets become
 * absolute. @return 0 or -ENOMEM. */
int ckptio_st_to_index(ckptio_st_index *st, ckptio_index *idx);

/* ------------------------------------------------------------ writing */

typedef struct ckptio_st_input {
  const char *name;
  ckptio_dtype dtype;
  int ndim;
  const int64_t *shape;
  uint64_t nbytes;       /* already validated by the caller */
} ckptio_st_input;

typedef struct ckptio_st_plan {
  uint8_t *header;       /* 8-byte length + JSON + space padding; malloc'd */
  uint64_t header_bytes; /* == data start, a multiple of data_align */
  size_t count;
  size_t *order;         /* order[k]: input index of the k-th tensor in the file */
  uint64_t *offset;      /* offset[i]: absolute file offset of input i */
  size_t *crc_pos;       /* crc_pos[i]: header position of input i's 8 hex
                            digits, or 0 when written without CRC */
  uint64_t file_size;
} ckptio_st_plan;

/* Lays out a file: tensors sorted by dtype alignment (bytes per element,
 * descending) then name, contiguous from data start; header JSON compact with
 * __metadata__ first (user metadata, "ckptio.version", and with_crc:
 * "ckptio.crc32.<name>":"00000000" placeholders), padded with spaces so the
 * data starts at a multiple of data_align (a power of two >= 8).
 * Names and keys must be unique (the caller checks). */
int ckptio_st_plan_make(const ckptio_st_input *inputs, size_t n,
                        const ckptio_st_kv *meta, size_t nmeta, int with_crc,
                        uint64_t data_align, ckptio_st_plan *out,
                        char *err, size_t errlen);
/* Writes input i's CRC into the placeholder (no-op without CRC). */
void ckptio_st_plan_set_crc(ckptio_st_plan *p, size_t i, uint32_t crc);
void ckptio_st_plan_free(ckptio_st_plan *p);

/* ------------------------------------------------------------ layout */

#include "formats/layout.h"

/* The plan as a writer layout: one extent, the header (rewritten once the
 * CRCs are patched in), data page-aligned at data_align. */
int ckptio_st_layout(const ckptio_layout_input *in, size_t n, const ckptio_kv *meta, size_t nmeta,
                     int with_crc, uint64_t data_align, ckptio_layout *out, char *err, size_t errlen);

#endif
