/* torch.distributed.checkpoint's .metadata alone: the pickle through the
 * DCP allowlist (protocol 4 framing, DCP's dataclasses as data), then the
 * schema walk: items, chunks, storage entries, file names. */
#include <string.h>

#include "core/error.h"
#include "formats/dcp_meta.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[CKPTIO_ERRLEN];
  ckptio_dcp_meta m;
  ckptio_dcp_meta_parse(data, size, &m, err, sizeof err);
  ckptio_dcp_meta_free(&m);
  return 0;
}
