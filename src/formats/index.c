/* The generic reader index: its release and its format's name; formats
 * fill it. */
#include "formats/index.h"

#include <stdlib.h>
#include <string.h>

void ckptio_index_free(ckptio_index *idx) {
  if (!idx) return;
  for (size_t i = 0; idx->entries && i < idx->count; i++) free(idx->entries[i].name);
  for (size_t i = 0; idx->meta && i < idx->meta_count; i++) {
    free(idx->meta[i].key);
    free(idx->meta[i].value);
  }
  free(idx->entries);
  free(idx->meta);
  memset(idx, 0, sizeof(*idx));
}

const char *ckptio_index_format_name(ckptio_index_format f) {
  static const char *const names[] = {"", "safetensors", "pytorch", "safetensors-sharded", "dcp"};
  return (unsigned)f < sizeof(names) / sizeof(*names) ? names[f] : "";
}
