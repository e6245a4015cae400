/* The Hugging Face index (model.safetensors.index.json) alone; a parsed
 * index is searched for each of its own tensors. */
#include <stdlib.h>
#include <string.h>

#include "formats/hf_index.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ckptio_hf_index x;
  memset(&x, 0, sizeof x);
  if (ckptio_hf_index_parse(data, size, &x) == 0) {
    for (size_t i = 0; i < x.nmap; i++) {
      const ckptio_hf_entry *e = ckptio_hf_index_find(&x, x.map[i].tensor);
      if (!e || e->file >= x.nfiles) abort();
    }
  }
  ckptio_hf_index_free(&x);
  return 0;
}
