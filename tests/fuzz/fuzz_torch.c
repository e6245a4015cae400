/* A torch.save archive alone: the zip directory and records, data.pkl through
 * the weights_only pickle subset, and the tensors' storage records. */
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
  return 0;
}
