/* Writer layouts: the one shared helper. */
#include "formats/layout.h"

#include <string.h>

void ckptio_layout_free(ckptio_layout *l) {
  if (!l) return;
  if (l->free) l->free(l);
  memset(l, 0, sizeof(*l));
}
