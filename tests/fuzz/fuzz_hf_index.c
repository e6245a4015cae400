/* The Hugging Face index (model.safetensors.index.json) alone, with the
 * multi-rank "ckptio" section: a parsed index is searched for each of its
 * own tensors, written back, and the written index must parse to the same
 * tensors, files and parts. */
#include <stdlib.h>
#include <string.h>

#include "formats/hf_index.h"
#include "fuzz.h"

/* Writes x and parses the result into y. */
static int round_trip(const ckptio_hf_index *x, ckptio_hf_index *y) {
  ckptio_hf_weight *w = calloc(x->nmap + 1, sizeof(*w));
  ckptio_split_out *s = calloc(x->nsplit + 1, sizeof(*s));
  size_t np = 0;
  for (size_t i = 0; i < x->nsplit; i++) np += x->split[i].nparts;
  ckptio_split_part_out *p = calloc(np + 1, sizeof(*p));
  ckptio_json_out o = {0};
  int rc = -1;
  if (!w || !s || !p) goto out;
  for (size_t i = 0; i < x->nmap; i++) w[i] = (ckptio_hf_weight){x->map[i].tensor, x->files[x->map[i].file]};
  np = 0;
  for (size_t i = 0; i < x->nsplit; i++) {
    const ckptio_split_tensor *t = &x->split[i];
    s[i] = (ckptio_split_out){t->name, t->dtype, t->ndim, t->shape, p + np, t->nparts};
    for (size_t k = 0; k < t->nparts; k++)
      p[np++] = (ckptio_split_part_out){x->files[t->parts[k].file], t->parts[k].offsets, t->parts[k].shape};
  }
  if (ckptio_hf_index_write(w, x->nmap, s, x->nsplit, NULL, 0, 0, &o) == 0)
    rc = ckptio_hf_index_parse((const uint8_t *)o.data, o.len, y);
out:
  free(o.data);
  free(w);
  free(s);
  free(p);
  return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ckptio_hf_index x, y;
  memset(&x, 0, sizeof x);
  memset(&y, 0, sizeof y);
  if (ckptio_hf_index_parse(data, size, &x) == 0) {
    for (size_t i = 0; i < x.nmap; i++) {
      const ckptio_hf_entry *e = ckptio_hf_index_find(&x, x.map[i].tensor);
      if (!e || e->file >= x.nfiles) abort();
    }
    for (size_t i = 0; i < x.nsplit; i++)
      if (ckptio_hf_index_find_split(&x, x.split[i].name) != &x.split[i]) abort();
    if (round_trip(&x, &y) != 0 || y.nmap != x.nmap || y.nsplit != x.nsplit || y.nfiles != x.nfiles) abort();
    for (size_t i = 0; i < x.nsplit; i++)
      if (y.split[i].nparts != x.split[i].nparts || strcmp(y.split[i].name, x.split[i].name)) abort();
  }
  ckptio_hf_index_free(&x);
  ckptio_hf_index_free(&y);
  return 0;
}
