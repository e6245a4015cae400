/* The Hugging Face index of a sharded checkpoint (model.safetensors.index.json):
 * {"metadata": {...}, "weight_map": {"tensor": "file", ...}}. Parsing is
 * bounded and strict about names and types; file names must be plain names
 * in the index's directory. Bytes only: the caller reads the file. */
#ifndef CKPTIO_FORMATS_HF_INDEX_H
#define CKPTIO_FORMATS_HF_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "formats/index.h"

/* Limit on the index file, the same as on a safetensors header. */
#define CKPTIO_HF_INDEX_MAX 100000000u

typedef struct ckptio_hf_entry {
  char *tensor;           /* owned */
  size_t file;            /* index into files */
  char *file_name;        /* owned, until files are deduplicated */
} ckptio_hf_entry;

typedef struct ckptio_hf_index {
  ckptio_hf_entry *map;   /* weight_map, sorted by tensor */
  size_t nmap;
  char **files;           /* unique file names, sorted; owned */
  size_t nfiles;
  ckptio_meta *index_meta;/* "metadata": strings, integers as decimal text; sorted by key */
  size_t nindex_meta;
  char err[CKPTIO_ERRLEN];/* why parsing failed */
} ckptio_hf_index;

/* Parses len bytes. @return 0, or CKPTIO_E_SHARD / -ENOMEM with the reason
 * in out->err; free out with ckptio_hf_index_free either way. */
int ckptio_hf_index_parse(const uint8_t *buf, size_t len, ckptio_hf_index *out);
void ckptio_hf_index_free(ckptio_hf_index *x);
/* The entry of a tensor, or NULL. */
const ckptio_hf_entry *ckptio_hf_index_find(const ckptio_hf_index *x, const char *tensor);

#endif
