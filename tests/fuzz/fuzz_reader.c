/* The public path: the input becomes a file (a memfd, opened by its
 * /proc/self/fd path) that ckptio_reader_open detects and indexes, then every
 * tensor's info, metadata, the CRC check of the whole file and loads and
 * views of the small tensors. The last byte picks the load method and whether
 * loads check CRCs, so every executor path sees hostile files. One small context serves every input; everything else is
 * freed per input, so a leak shows in LeakSanitizer. */

/* Uses ckptio_reader_header_bytes, of ckptio.h's experimental section. */
#define CKPTIO_EXPERIMENTAL

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ckptio.h"
#include "fuzz.h"

#define LOAD_MAX_TENSOR (1u << 20) /* load tensors of at most 1 MiB */
#define LOAD_MAX_TOTAL (4u << 20)  /* and at most 4 MiB per input */

static ckptio_ctx *ctx;

static void ctx_free(void) { ckptio_ctx_free(ctx); }

static int ctx_get(void) {
  if (ctx) return 0;
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  o.threads = 2;
  o.chunk_bytes = 64 << 10;
  o.staging_bytes = 256 << 10;
  o.cuda = 0;
  o.numa = 0;
  o.fsync = 0;
  if (ckptio_ctx_create(&o, &ctx) != 0) return -1;
  atexit(ctx_free);
  return 0;
}

static int write_all(int fd, const uint8_t *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static void exercise(ckptio_reader *r) {
  size_t n = ckptio_reader_count(r);
  uint64_t loaded = 0;
  (void)ckptio_reader_format(r);
  (void)ckptio_reader_header_bytes(r);
  for (size_t i = 0; i < ckptio_reader_metadata_count(r); i++) {
    const char *k = NULL, *v = NULL;
    if (ckptio_reader_metadata_at(r, i, &k, &v) == 0 && k) (void)ckptio_reader_metadata_get(r, k);
  }
  for (size_t i = 0; i < n; i++) {
    ckptio_tensor_info info;
    if (ckptio_reader_info(r, i, &info) != 0) continue;
    if (ckptio_reader_find(r, info.name) < 0) abort(); /* its own name must be found */
    if (info.nbytes > LOAD_MAX_TENSOR || loaded + info.nbytes > LOAD_MAX_TOTAL) continue;
    uint8_t *dst = malloc(info.nbytes ? info.nbytes : 1);
    if (!dst) continue;
    ckptio_reader_load(r, i, dst, info.nbytes);
    free(dst);
    const void *view = NULL;
    uint64_t vbytes = 0;
    if (ckptio_reader_view(r, i, &view, &vbytes) == 0 && vbytes != info.nbytes) abort();
    loaded += info.nbytes;
  }
  size_t unchecked = 0;
  ckptio_reader_verify(r, &unchecked);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (ctx_get() != 0) abort();
  int fd = memfd_create("ckptio-fuzz", MFD_CLOEXEC);
  if (fd < 0) abort();
  if (write_all(fd, data, size) != 0) abort();
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  static const ckptio_load_method methods[4] = {CKPTIO_LOAD_AUTO, CKPTIO_LOAD_PREAD, CKPTIO_LOAD_MMAP,
                                               CKPTIO_LOAD_DIRECT};
  unsigned sel = size ? data[size - 1] : 0;
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  o.load_method = methods[sel & 3];
  o.crc = !(sel & 4);
  ckptio_reader *r = NULL;
  if (ckptio_reader_open(ctx, path, &o, &r) == 0) exercise(r);
  ckptio_reader_close(r);
  close(fd);
  return 0;
}
