/* Opening one file as a source: a zstd seekable file, else a plain file
 * (safetensors or a PyTorch archive, told apart by the plain kind), by the
 * first bytes: a file's from its map, an object's by one read of its first
 * CKPTIO_RFILE_HEAD bytes, which the parse then reuses (rfile head). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "formats/zstd_seekable.h"
#include "load/source.h"

int ckptio_rfile_open_path(ckptio_ctx *ctx, ckptio_rfile *f, const char *path, char *err) {
  const ckptio_storage *st = NULL;
  int rc = ckptio_storages_find(ctx->storages, path, &st, err, CKPTIO_ERRLEN);
  if (rc < 0) return rc;
  return rc ? ckptio_rfile_open_object(f, path, &st->ops, st->self, err, CKPTIO_ERRLEN)
            : ckptio_rfile_open(f, path, err, CKPTIO_ERRLEN);
}

int ckptio_source_open_file(ckptio_ctx *ctx, const ckptio_options *opts, const char *path, char *err,
                            ckptio_source **out) {
  ckptio_rfile f;
  int rc = ckptio_rfile_open_path(ctx, &f, path, err);
  if (rc < 0) return rc;
  if (f.store) {
    size_t n = f.size < CKPTIO_RFILE_HEAD ? (size_t)f.size : CKPTIO_RFILE_HEAD;
    if (!(f.head = malloc(n ? n : 1))) rc = -ENOMEM;
    else rc = ckptio_rfile_pread(&f, f.head, n, 0, err, CKPTIO_ERRLEN);
    if (rc == 0) f.nhead = n; /* from now on, reads inside them are served from them */
    if (rc < 0) {
      if (rc == -ENOMEM) snprintf(err, CKPTIO_ERRLEN, "%s: out of memory opening it", path);
      ckptio_rfile_close(&f);
      return rc;
    }
    return ckptio_zs_detect(f.head, f.size) ? ckptio_zstd_from(ctx, opts, &f, err, out)
                                            : ckptio_plain_from(ctx, opts, &f, err, out);
  }
  /* What a header parse touches (a zip's local header before every tensor,
   * a seek table at the end) is read page by page, not in windows of the
   * disk's read-ahead around each: most of a cold file, one window at a time. */
  ckptio_rfile_scattered(&f, 1);
  rc = ckptio_zs_detect(f.map, f.size) ? ckptio_zstd_from(ctx, opts, &f, err, out)
                                       : ckptio_plain_from(ctx, opts, &f, err, out);
  if (rc == 0) ckptio_rfile_scattered(&f, 0);
  return rc;
}
