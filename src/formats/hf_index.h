/* The Hugging Face index of a sharded checkpoint (model.safetensors.index.json):
 * {"metadata": {...}, "weight_map": {"tensor": "file", ...}}. Parsing is
 * bounded and strict about names and types; file names must be plain names
 * in the index's directory. Writing lays it out the way transformers and
 * huggingface_hub do. Bytes only: the pipelines read and write the files. */
#ifndef CKPTIO_FORMATS_HF_INDEX_H
#define CKPTIO_FORMATS_HF_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "formats/index.h"
#include "formats/json.h"
#include "formats/layout.h"

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

/* ------------------------------------------------------------ writing */

/* One line of the weight map: a tensor and the shard file holding it.
 * Both strings are borrowed for the call. */
typedef struct ckptio_hf_weight {
  const char *tensor;
  const char *file;
} ckptio_hf_weight;

/* Appends the index document to out:
 *   {"metadata": {<meta, string values>, "total_size": <total_size>},
 *    "weight_map": {<tensor>: <file>, ...}}
 * with the keys of both objects sorted (byte order, which is code-point
 * order for UTF-8, as Python's sort_keys), a two-space indent and a final
 * newline. `weights` and `meta` are read, not kept; neither is reordered.
 * @return 0, -ENOMEM, CKPTIO_E_DUPLICATE (a tensor named twice) or
 *         CKPTIO_E_INVALID_ARG (a "total_size" key in meta). */
int ckptio_hf_index_write(const ckptio_hf_weight *weights, size_t n, const ckptio_kv *meta, size_t nmeta,
                          uint64_t total_size, ckptio_json_out *out);

#endif
