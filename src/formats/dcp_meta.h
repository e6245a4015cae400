/*
 * torch.distributed.checkpoint's .metadata (a pickle of DCP's Metadata
 * dataclasses) read as plain data: the safe pickle machine with DCP's
 * classes allowlisted (ckptio_pickle_rules of formats/pickle_read.h), then a
 * walk of the fixed schema into global tensors, their chunks, byte items,
 * and where each one's bytes lie. Nothing is imported or called. Pure
 * format code: the files are the caller's.
 */
#ifndef CKPTIO_FORMATS_DCP_META_H
#define CKPTIO_FORMATS_DCP_META_H

#include <stddef.h>
#include <stdint.h>

#include "ckptio.h"

#define CKPTIO_DCP_METADATA_FILE ".metadata"
#define CKPTIO_DCP_MAX_CHUNKS 65536      /* chunks of one tensor */
#define CKPTIO_DCP_MAX_FILE_NAME 255     /* bytes of a relative_path */
/* A byte item's name in a reader's index: the name ckptio.dcp.Writer gives
 * byte items in ckptio's own checkpoints, so that ckptio.dcp.Reader reads
 * both kinds alike. A tensor may not start with it. */
#define CKPTIO_DCP_BYTES_PREFIX "__dcp_bytes__."

/* A chunk's bytes, or a byte item's: [offset, offset + length) of file
 * `file`, stored as written (a torch.save archive for a tensor chunk, raw
 * bytes for a byte item) or through DCP's zstd stream extension. */
typedef struct ckptio_dcp_storage {
  uint32_t file;             /* index in ckptio_dcp_meta.files */
  uint64_t offset, length;
  int zstd;                  /* transform_descriptors ["stream.zstd/1"] */
} ckptio_dcp_storage;

typedef struct ckptio_dcp_chunk {
  int64_t offsets[CKPTIO_MAX_DIMS], sizes[CKPTIO_MAX_DIMS];
  ckptio_dcp_storage at;
} ckptio_dcp_chunk;

typedef struct ckptio_dcp_item {
  char *name;                /* the state dict key (fqn), owned */
  int is_bytes;              /* BytesStorageMetadata: `bytes` holds its storage */
  ckptio_dtype dtype;        /* tensors: */
  int ndim;
  int64_t shape[CKPTIO_MAX_DIMS];
  ckptio_dcp_chunk *chunks;  /* sorted by offsets (lexicographic) */
  size_t nchunks;
  ckptio_dcp_storage bytes;
} ckptio_dcp_item;

typedef struct ckptio_dcp_meta {
  ckptio_dcp_item *items;    /* sorted by name */
  size_t nitems;
  char **files;              /* distinct relative paths, sorted; owned */
  size_t nfiles;
  char *version;             /* Metadata.version, or NULL */
  char *save_id;             /* storage_meta.save_id, or NULL */
} ckptio_dcp_meta;

/*! ckptio_dcp_meta_parse() :
 *  Reads the .metadata pickle in buf[0, len) (borrowed for the call) into
 *  *out (free with ckptio_dcp_meta_free; every string copied). Checks: the
 *  pickle through the DCP allowlist; the schema (a Metadata whose
 *  state_dict_metadata maps str keys to TensorStorageMetadata or
 *  BytesStorageMetadata, whose storage_data maps MetadataIndex to
 *  _StorageInfo); each tensor's dtype known to ckptio, its layout strided,
 *  at most CKPTIO_MAX_DIMS dims, none negative, its bytes within 64 bits;
 *  its chunks inside it, not overlapping, covering it exactly; every chunk
 *  and byte item with exactly one storage entry and every storage entry
 *  naming one; file names plain (no '/', not '.' or '..', no NUL);
 *  offset + length within 64 bits; no transform but stream.zstd/1.
 *  @return 0; CKPTIO_E_PICKLE (the pickle refused, or a value of the wrong
 *          type), CKPTIO_E_SHARD (chunks or storage entries inconsistent),
 *          CKPTIO_E_DUPLICATE (two items with one name), CKPTIO_E_DTYPE, CKPTIO_E_SHAPE, CKPTIO_E_OVERFLOW, CKPTIO_E_FORMAT
 *          (a layout or transform ckptio does not read), -ENOMEM. err names
 *          the item, chunk and rule. *out is empty on failure. */
int ckptio_dcp_meta_parse(const uint8_t *buf, size_t len, ckptio_dcp_meta *out, char *err, size_t errlen);
void ckptio_dcp_meta_free(ckptio_dcp_meta *m);

/*! "[0, 512]" for messages. */
void ckptio_dcp_dims_text(const int64_t *v, int n, char *buf, size_t len);

#endif
