/* The zstd seekable format's seek table alone, the input being the whole
 * file; a table that parses is looked up at its ends to check the frame
 * search against the offsets it accepted. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "formats/zstd_seekable.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[CKPTIO_ERRLEN];
  ckptio_zs_table t;
  memset(&t, 0, sizeof t);
  ckptio_zs_detect(data, size);
  if (ckptio_zs_table_parse(data, size, &t, err, sizeof err) == 0 && t.dsize_total > 0) {
    uint64_t probe[3] = {0, t.dsize_total / 2, t.dsize_total - 1};
    for (int i = 0; i < 3; i++) {
      size_t k = ckptio_zs_find(&t, probe[i]);
      if (k >= t.count || probe[i] < t.frames[k].doff ||
          probe[i] - t.frames[k].doff >= t.frames[k].dsize)
        abort(); /* the table accepted offsets its own search cannot use */
    }
  }
  ckptio_zs_table_free(&t);
  return 0;
}
