/* What every kind of source shares. */
#include "load/source.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>


int ckptio_source_init(ckptio_source *s, const ckptio_source_ops *ops, ckptio_ctx *ctx, const ckptio_options *opts,
                       const char *path, char *err) {
  s->ops = ops;
  s->ctx = ctx;
  s->opts = opts;
  s->err = err;
  s->nfiles = 1;
  return (s->path = strdup(path)) ? 0 : -ENOMEM;
}

void ckptio_source_close(ckptio_source *s) {
  if (!s) return;
  s->ops->close(s);
  free(s->path);
  free(s);
}

uint64_t ckptio_source_slot_bytes(const ckptio_source *s) { return ckptio_ring_slot_bytes(s->ctx->ring); }

uint64_t ckptio_entry_view_bytes(const ckptio_entry *e) {
  return e->strided ? (uint64_t)ckptio_tensor_nbytes(e->dtype, e->ndim, e->shape) : e->nbytes;
}

size_t ckptio_entry_elem(const ckptio_entry *e) { return (size_t)ckptio_dtype_bits(e->dtype) / 8; }

ckptio_source *ckptio_source_member_self(ckptio_source *s, size_t index, size_t *local, size_t *k) {
  *local = index;
  if (k) *k = 0;
  return s;
}

ckptio_source *ckptio_source_file_self(ckptio_source *s, size_t k) { return k == 0 ? s : NULL; }

typedef struct file_emit {
  void (*emit)(void *arg, uint32_t file, uint64_t off, uint64_t len);
  void *arg;
  uint32_t file;
} file_emit;

static void emit_in_file(void *arg, uint32_t file, uint64_t off, uint64_t len) {
  file_emit *f = arg;
  (void)file; /* the member's own file 0 */
  f->emit(f->arg, f->file, off, len);
}

void ckptio_source_ranges_of_member(ckptio_source *s, size_t index, const ckptio_geom *g,
                                    void (*emit)(void *arg, uint32_t file, uint64_t off, uint64_t len), void *arg) {
  size_t local, k;
  ckptio_source *m = s->ops->member(s, index, &local, &k);
  file_emit f = {emit, arg, (uint32_t)k};
  m->ops->ranges(m, local, g, emit_in_file, &f);
}

int ckptio_source_view_of_member(ckptio_source *s, size_t index, size_t pieces, const char *what,
                                 const void **data, uint64_t *nbytes) {
  if (pieces)
    return ckptio_fail(s->err, CKPTIO_E_FORMAT, "%s: tensor '%s' is stored in %zu %s, not in one place: load it",
                       s->path, s->idx.entries[index].name, pieces, what);
  size_t local;
  ckptio_source *m = s->ops->member(s, index, &local, NULL);
  return m->ops->view(m, local, data, nbytes);
}
