/* The Hugging Face index of a sharded set ({prefix}.safetensors.index.json)
 * as bytes, laid out the way transformers and huggingface_hub write it.
 * Byte layout only: the save pipeline (save/set.c) decides the files and
 * writes the result; the read side parses indexes on its own. */
#ifndef CKPTIO_FORMATS_HF_INDEX_WRITE_H
#define CKPTIO_FORMATS_HF_INDEX_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "formats/json.h"
#include "formats/layout.h"

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
