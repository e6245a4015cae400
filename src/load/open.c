/* Opening one file as a source: a zstd seekable file, else a plain file
 * (safetensors or a PyTorch archive, told apart by the plain kind); an
 * object of a storage is a plain safetensors file (open_object). */
#include "formats/zstd_seekable.h"
#include "load/source.h"

int ckptio_source_open_object(ckptio_ctx *ctx, const ckptio_options *opts, const char *path, char *err,
                              ckptio_source **out, int *found) {
  const ckptio_storage *st = NULL;
  int rc = ckptio_storages_find(ctx->storages, path, &st, err, CKPTIO_ERRLEN);
  *found = rc != 0;
  if (rc <= 0) return rc;
  ckptio_rfile f;
  if ((rc = ckptio_rfile_open_object(&f, path, &st->ops, st->self, err, CKPTIO_ERRLEN)) < 0) return rc;
  return ckptio_plain_from(ctx, opts, &f, err, out);
}

int ckptio_source_open_file(ckptio_ctx *ctx, const ckptio_options *opts, const char *path, char *err,
                            ckptio_source **out) {
  ckptio_rfile f;
  int rc = ckptio_rfile_open(&f, path, err, CKPTIO_ERRLEN);
  if (rc < 0) return rc;
  /* What a header parse touches (a zip's local header before every tensor,
   * a seek table at the end) is read page by page, not in windows of the
   * disk's read-ahead around each: most of a cold file, one window at a time. */
  ckptio_rfile_scattered(&f, 1);
  rc = ckptio_zs_detect(f.map, f.size) ? ckptio_zstd_from(ctx, opts, &f, err, out)
                                       : ckptio_plain_from(ctx, opts, &f, err, out);
  if (rc == 0) ckptio_rfile_scattered(&f, 0);
  return rc;
}
