/* A PyTorch archive in a storage: its index read through ranged reads, not
 * a mapping. The end records and the central directory come with the
 * object's tail (one read, two for a directory larger than the tail), the
 * local headers (one before each record) in merged reads run in parallel,
 * then the small records the pickle parse reads (data.pkl, byteorder, the
 * metadata record; mostly inside the head or the tail already). The parse
 * itself is the mapped file's (formats/torch_read.c) over the object's
 * image (load/image.h), so every check a local file gets, this gets. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "formats/torch_read.h"
#include "formats/zip_read.h"
#include "load/image.h"
#include "load/source.h"

/* The first bytes: the magic, the first local header and, in most files,
 * data.pkl right behind it. */
#define HEAD (64u << 10)
/* The last bytes: the end records, and the directory of up to a few
 * thousand records (about 100 bytes each). */
#define TAIL (256u << 10)
/* Local headers closer than this are one read (the tensor bytes between
 * cost less than another request), up to MERGE_CAP a read: a file of many
 * small tensors is not read whole to find its headers. */
#define GAP (64u << 10)
#define MERGE_CAP (4u << 20)
/* A local header: 30 bytes and the name (its extra field is not read). */
#define LOCAL_LEN 30u

/* Whether a record is a tensor's storage ("<archive>/data/<key>"), whose
 * bytes the parse never reads. */
static int is_storage(const ckptio_zip_entry *e) {
  const char *slash = memchr(e->name, '/', e->name_len);
  return slash && !strncmp(slash + 1, "data/", 5);
}

static int fetch_entries(ckptio_image *im, const ckptio_zip *z, int data, char *err) {
  ckptio_span *sp = calloc(z->count + 1, sizeof(*sp));
  size_t n = 0;
  if (!sp) return -ENOMEM;
  for (size_t i = 0; i < z->count; i++) {
    const ckptio_zip_entry *e = &z->entries[i];
    if (!data) sp[n++] = (ckptio_span){e->header_offset, LOCAL_LEN + e->name_len};
    else if (!is_storage(e)) sp[n++] = (ckptio_span){e->data_offset, e->csize};
  }
  int rc = ckptio_image_fetch(im, sp, n, GAP, MERGE_CAP, err);
  free(sp);
  return rc;
}

int ckptio_torch_index_object(const ckptio_rfile *f, ckptio_pool *pool, unsigned flags, ckptio_index *idx,
                              char *err) {
  ckptio_image im;
  ckptio_zip z;
  char msg[CKPTIO_ERRLEN];
  uint64_t cd = 0;
  memset(&z, 0, sizeof(z));
  int rc = ckptio_image_open(&im, f, pool, HEAD, TAIL, err);
  if (rc < 0) goto out;
  /* The directory, then the local headers it points at, then the full
   * open (every local header checked against the directory), then the
   * records the pickle parse reads. A failure before the parse proper is
   * named by the parse itself, over what was fetched. */
  if (ckptio_zip_directory_start(im.base, im.size, &cd, msg, sizeof(msg)) == 0) {
    ckptio_span tail = {cd, im.size - cd};
    if ((rc = ckptio_image_fetch(&im, &tail, 1, 0, UINT64_MAX, err)) < 0) goto out;
    if (ckptio_zip_open(im.base, im.size, CKPTIO_ZIP_ALLOW_COMPRESSED | CKPTIO_ZIP_CENTRAL_ONLY, &z, msg,
                        sizeof(msg)) == 0) {
      rc = fetch_entries(&im, &z, 0, err);
      ckptio_zip_free(&z);
      if (rc < 0) goto out;
      if (ckptio_zip_open(im.base, im.size, CKPTIO_ZIP_ALLOW_COMPRESSED, &z, msg, sizeof(msg)) == 0) {
        rc = fetch_entries(&im, &z, 1, err);
        ckptio_zip_free(&z);
        if (rc < 0) goto out;
      }
    }
  }
  if ((rc = ckptio_torch_parse_flags(im.base, im.size, flags, idx, msg, sizeof(msg))) < 0)
    ckptio_fail(err, rc, "%s: %s", f->path, msg);
out:
  ckptio_image_close(&im);
  return rc;
}
