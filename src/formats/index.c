/* The generic reader index: only its release lives here; formats fill it. */
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
