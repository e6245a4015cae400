/* The safetensors header alone: rules 1-3 on the 8-byte prefix, then rules
 * 4-7 on the header bytes, taking the input as the whole file. A parse that
 * succeeds must also survive the move into the format-neutral index. */
#include <string.h>

#include "core/error.h"
#include "formats/index.h"
#include "formats/safetensors.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[CKPTIO_ERRLEN];
  uint64_t n = 0;
  if (ckptio_st_header_length(data, size, &n, err, sizeof err) != 0) return 0;
  if (n > size - 8) return 0; /* rule 3 promises this; the parse relies on it */
  ckptio_st_index st;
  memset(&st, 0, sizeof st);
  if (ckptio_st_parse(data + 8, n, size, &st, err, sizeof err) == 0) {
    ckptio_index idx;
    memset(&idx, 0, sizeof idx);
    if (ckptio_st_to_index(&st, &idx) == 0) ckptio_index_free(&idx);
  }
  ckptio_st_index_free(&st);
  return 0;
}
