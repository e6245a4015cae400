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

/* A part of a split tensor (the "ckptio" section of a multi-rank
 * checkpoint's index; docs/FORMATS.md). */
typedef struct ckptio_split_part {
  size_t file;                       /* index into files */
  int64_t offsets[CKPTIO_MAX_DIMS];
  int64_t shape[CKPTIO_MAX_DIMS];    /* the part's sizes */
  char *file_name;                   /* owned, until files are deduplicated */
} ckptio_split_part;

typedef struct ckptio_split_tensor {
  char *name;                        /* owned */
  ckptio_dtype dtype;
  int ndim;
  int64_t shape[CKPTIO_MAX_DIMS];    /* global */
  ckptio_split_part *parts;          /* owned; sorted by offsets */
  size_t nparts;
} ckptio_split_tensor;

/* At most this many parts per split tensor. */
#define CKPTIO_SPLIT_MAX_PARTS 65536

typedef struct ckptio_hf_index {
  ckptio_hf_entry *map;   /* weight_map, sorted by tensor */
  size_t nmap;
  ckptio_split_tensor *split; /* the "ckptio" section, sorted by name; 0 when absent */
  size_t nsplit;
  char **files;           /* unique file names (weight_map's and the parts'), sorted; owned */
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
/* The split tensor of that name, or NULL. */
const ckptio_split_tensor *ckptio_hf_index_find_split(const ckptio_hf_index *x, const char *tensor);

/* ------------------------------------------------------------ writing */

/* One line of the weight map: a tensor and the shard file holding it.
 * Both strings are borrowed for the call. */
typedef struct ckptio_hf_weight {
  const char *tensor;
  const char *file;
} ckptio_hf_weight;

/* A split tensor to write: its parts in any order (written sorted by
 * offsets). Everything borrowed for the call. */
typedef struct ckptio_split_part_out {
  const char *file;
  const int64_t *offsets;
  const int64_t *shape;
} ckptio_split_part_out;

typedef struct ckptio_split_out {
  const char *name;
  ckptio_dtype dtype;
  int ndim;
  const int64_t *shape;
  const ckptio_split_part_out *parts;
  size_t nparts;
} ckptio_split_out;

/* Appends the index document to out:
 *   {"metadata": {<meta, string values>, "total_size": <total_size>},
 *    "weight_map": {<tensor>: <file>, ...}
 *    [, "ckptio": {"version": 1, "tensors": {<split tensors>}}]}
 * with the keys of both objects sorted (byte order, which is code-point
 * order for UTF-8, as Python's sort_keys), a two-space indent and a final
 * newline. `weights` and `meta` are read, not kept; neither is reordered.
 * @return 0, -ENOMEM, CKPTIO_E_DUPLICATE (a tensor named twice) or
 *         CKPTIO_E_INVALID_ARG (a "total_size" key in meta). */
int ckptio_hf_index_write(const ckptio_hf_weight *weights, size_t n, const ckptio_split_out *split, size_t nsplit,
                          const ckptio_kv *meta, size_t nmeta, uint64_t total_size, ckptio_json_out *out);

/* The parts section, for hf_index.c (parts_index.c): parses the value of
 * "ckptio" into x->split (file names still in the parts), and after the
 * files are known checks every rule of docs/FORMATS.md that needs only the
 * index. @return 0, CKPTIO_E_SHARD (reason in x->err), CKPTIO_E_HEADER_JSON
 * or -ENOMEM. */
int ckptio_parts_parse(ckptio_json *j, ckptio_hf_index *x);
int ckptio_parts_check(ckptio_hf_index *x);
int ckptio_parts_write(const ckptio_split_out *split, size_t nsplit, ckptio_json_out *out);
void ckptio_parts_free(ckptio_hf_index *x);
/* Why a file name may not be used (it must stay in the index's
 * directory), or NULL when it may. */
const char *ckptio_hf_bad_file_name(const char *f, size_t len);

#endif
