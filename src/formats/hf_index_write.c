/* Writing the Hugging Face index of a sharded set: sorted keys, two-space
 * indent, so a set saved here is byte for byte what transformers' own
 * save_pretrained writes for the same map. */
#include "formats/hf_index.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ckptio.h"

static int cmp_weight(const void *a, const void *b) {
  return strcmp(((const ckptio_hf_weight *)a)->tensor, ((const ckptio_hf_weight *)b)->tensor);
}

static int cmp_kv(const void *a, const void *b) {
  return strcmp(((const ckptio_kv *)a)->key, ((const ckptio_kv *)b)->key);
}

/* The metadata object; total_size is the one number among the strings,
 * put where its key sorts. */
static int put_metadata(ckptio_json_out *o, const ckptio_kv *meta, size_t nmeta, uint64_t total_size) {
  size_t total_at = 0;
  while (total_at < nmeta && strcmp(meta[total_at].key, "total_size") < 0) total_at++;
  int rc = ckptio_json_out_puts(o, "  \"metadata\": {");
  for (size_t i = 0, m = 0; i <= nmeta && rc == 0; i++) {
    rc |= ckptio_json_out_puts(o, i ? ",\n    " : "\n    ");
    if (i == total_at) {
      rc |= ckptio_json_out_puts(o, "\"total_size\": ");
      rc |= ckptio_json_out_u64(o, total_size);
      continue;
    }
    rc |= ckptio_json_out_string(o, meta[m].key);
    rc |= ckptio_json_out_puts(o, ": ");
    rc |= ckptio_json_out_string(o, meta[m++].value);
  }
  rc |= ckptio_json_out_puts(o, "\n  },\n");
  return rc;
}

int ckptio_hf_index_write(const ckptio_hf_weight *weights, size_t n, const ckptio_split_out *split, size_t nsplit,
                          const ckptio_kv *meta, size_t nmeta, uint64_t total_size, ckptio_json_out *out) {
  for (size_t i = 0; i < nmeta; i++)
    if (strcmp(meta[i].key, "total_size") == 0) return CKPTIO_E_INVALID_ARG;
  ckptio_hf_weight *w = calloc(n + 1, sizeof(*w));
  ckptio_kv *m = calloc(nmeta + 1, sizeof(*m));
  int rc = -ENOMEM;
  if (!w || !m) goto out;
  if (n) memcpy(w, weights, n * sizeof(*w));
  if (nmeta) memcpy(m, meta, nmeta * sizeof(*m));
  qsort(w, n, sizeof(*w), cmp_weight);
  qsort(m, nmeta, sizeof(*m), cmp_kv);
  rc = CKPTIO_E_DUPLICATE;
  for (size_t i = 1; i < n; i++)
    if (strcmp(w[i - 1].tensor, w[i].tensor) == 0) goto out;
  rc = ckptio_json_out_puts(out, "{\n");
  rc |= put_metadata(out, m, nmeta, total_size);
  rc |= ckptio_json_out_puts(out, "  \"weight_map\": {");
  for (size_t i = 0; i < n && rc == 0; i++) {
    rc |= ckptio_json_out_puts(out, i ? ",\n    " : "\n    ");
    rc |= ckptio_json_out_string(out, w[i].tensor);
    rc |= ckptio_json_out_puts(out, ": ");
    rc |= ckptio_json_out_string(out, w[i].file);
  }
  rc |= ckptio_json_out_puts(out, n ? "\n  }" : "}");
  if (nsplit && rc == 0) { /* split tensors: the ckptio section, after the Hugging Face keys */
    rc = ckptio_json_out_puts(out, ",\n");
    if (rc == 0) rc = ckptio_parts_write(split, nsplit, out);
    if (rc == CKPTIO_E_DUPLICATE) goto out;
    rc |= ckptio_json_out_puts(out, "}\n");
  } else {
    rc |= ckptio_json_out_puts(out, "\n}\n");
  }
  rc = rc ? -ENOMEM : 0;
out:
  free(w);
  free(m);
  return rc;
}
