/* Zero-copy loads: a private, writable mapping of the file the reader
 * opened, its CRCs checked over the mapping's own pages on the pool, then
 * handed to the caller, who may keep it after the reader is closed. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "reader_internal.h"

#define rfail ckptio_reader_fail

/* Checks every recorded CRC over `map` instead of the reader's own mapping.
 * MMAP is forced so each piece is read (and faulted in) where the caller
 * will read it: the touch that follows finds the pages mapped, and what is
 * checked is what the caller gets, not a second read of the file. */
static int verify_over(ckptio_reader *r, const unsigned char *map) {
  ckptio_load_request *reqs = calloc(r->idx.count + 1, sizeof(*reqs));
  if (!reqs) return -ENOMEM;
  size_t n = 0;
  for (size_t i = 0; i < r->idx.count; i++)
    if (r->idx.entries[i].has_crc) reqs[n++].index = i; /* dst NULL: check only */
  const unsigned char *own = r->map;
  ckptio_load_method method = r->opts.load_method;
  r->map = map;
  r->opts.load_method = CKPTIO_LOAD_MMAP;
  int rc = ckptio_reader_run(r, reqs, n, 1);
  r->map = own;
  r->opts.load_method = method;
  free(reqs);
  return rc;
}

int ckptio_reader_map_private(ckptio_reader *r, void **base, uint64_t *size) {
  if (!base || !size) return CKPTIO_E_INVALID_ARG;
  *base = NULL;
  *size = 0;
  if (!r) return CKPTIO_E_INVALID_ARG;
  /* One mapping holds one file whose bytes are the tensors' own. */
  if (r->set || r->z)
    return rfail(r, CKPTIO_E_FORMAT, "%s: a %s has no file holding the tensors' bytes as they are; load them", r->path,
                 r->set ? "sharded set" : "compressed file");
  if (!r->file_size) return 0;
  if ((uint64_t)(size_t)r->file_size != r->file_size)
    return rfail(r, CKPTIO_E_OVERFLOW, "%s: %llu bytes cannot be mapped in this address space", r->path,
                 (unsigned long long)r->file_size);
  /* Copy-on-write: the pages stay the page cache's until written, and a
   * write copies one page into this process without reaching the file.
   * Mapped from the reader's descriptor, so it is the inode whose header
   * was validated even if the path has been replaced since. */
  void *m = mmap(NULL, (size_t)r->file_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, r->fd, 0);
  if (m == MAP_FAILED) return rfail(r, -errno, "%s: private mmap: %s", r->path, strerror(errno));
  int rc = r->opts.crc ? verify_over(r, m) : 0;
  if (rc < 0) goto fail;
  *base = m;
  *size = r->file_size;
  return 0;
fail:
  munmap(m, (size_t)r->file_size);
  return rc;
}

int ckptio_map_free(void *base, uint64_t size) {
  if (!base) return 0;
  return munmap(base, (size_t)size) < 0 ? -errno : 0;
}
