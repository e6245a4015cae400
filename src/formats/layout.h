/* A file layout, as the writer pipeline sees it: where each tensor's bytes
 * go, and every other byte of the file (headers, zip records, directories)
 * as extents, all fixed before any data is written. Formats produce it;
 * the writer copies tensors and extents into chunks, and once the tensors'
 * CRCs are known asks the format to patch them in and rewrites the extents
 * that changed. Nothing here touches files or threads. */
#ifndef CKPTIO_FORMATS_LAYOUT_H
#define CKPTIO_FORMATS_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "ckptio.h"

/* What a format needs to know of one tensor to lay it out. */
typedef struct ckptio_layout_input {
  const char *name;
  ckptio_dtype dtype;
  int ndim;
  const int64_t *shape;
  uint64_t nbytes;       /* already validated: dtype x shape */
} ckptio_layout_input;

/* Bytes of the file that are not tensor data. */
typedef struct ckptio_extent {
  uint64_t offset;
  uint64_t len;
  uint8_t *bytes;        /* owned by the layout */
  int holds_crc;         /* changed by set_crc: rewritten after the data */
} ckptio_extent;

typedef struct ckptio_layout {
  uint64_t file_size;
  size_t count;
  size_t *order;         /* order[k]: input index of the k-th tensor in the file */
  uint64_t *offset;      /* offset[i]: absolute file offset of input i's bytes */
  ckptio_extent *extents;/* sorted by offset; never overlap tensor bytes */
  size_t nextents;
  /* Writes input i's CRC-32 into the extents that record it. NULL when the
   * file records no CRCs. */
  void (*set_crc)(struct ckptio_layout *l, size_t i, uint32_t crc);
  /* 1: an extent holding CRCs records only tensors before it in the file
   * (a zip's data descriptors and directory), so its bytes are final once
   * every byte before it is: what lets a writer to an object, which writes
   * each byte once, send it early. 0: it may record later ones (a
   * safetensors header, at the start). */
  int crcs_trail;
  void (*free)(struct ckptio_layout *l);
  void *state;           /* the format's */
} ckptio_layout;

/* Metadata key / value pairs handed to a format (copied by it). */
typedef struct ckptio_kv {
  const char *key, *value;
} ckptio_kv;

/* Frees whatever the layout holds (through its free hook). Accepts an
 * all-zero layout. */
void ckptio_layout_free(ckptio_layout *l);

#endif
