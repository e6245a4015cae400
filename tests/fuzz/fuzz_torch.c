/* A torch.save archive alone: the zip directory and records, data.pkl through
 * the weights_only pickle subset, and the tensors' storage records; both as
 * tensors by path and as records (CKPTIO_TORCH_RECORDS, what
 * ckptio.torch.load_checkpoint opens), whose indexes must stay inside the
 * input. */
#include <string.h>

#include "core/error.h"
#include "formats/index.h"
#include "formats/torch_read.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[CKPTIO_ERRLEN];
  ckptio_index idx;
  memset(&idx, 0, sizeof idx);
  ckptio_torch_parse(data, size, &idx, err, sizeof err);
  ckptio_index_free(&idx);
  if (ckptio_torch_parse_flags(data, size, CKPTIO_TORCH_RECORDS, &idx, err, sizeof err) == 0)
    for (size_t i = 0; i < idx.count; i++)
      if (idx.entries[i].offset > size || idx.entries[i].nbytes > size - idx.entries[i].offset) __builtin_trap();
  ckptio_index_free(&idx);
  return 0;
}
