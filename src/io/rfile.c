/* The read side's file object (rfile.h). */
#include "io/rfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckptio.h"
#include "core/align.h"
#include "core/error.h"
#include "io/file.h"

#define PAGE_DOWN(x) ((x) & ~(uintptr_t)(CKPTIO_IO_ALIGN - 1))
#define PAGE_UP(x) PAGE_DOWN((x) + CKPTIO_IO_ALIGN - 1)

int ckptio_rfile_open(ckptio_rfile *f, const char *path, char *err, size_t errlen) {
  memset(f, 0, sizeof(*f));
  f->fd = f->fd_direct = -1;
  struct stat st;
  int rc;
  if (!(f->path = strdup(path))) return -ENOMEM;
  if ((f->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0 || fstat(f->fd, &st) < 0) {
    rc = ckptio_err_fmt(err, errlen, -errno, "%s: %s", path, ckptio_errno_text(errno));
    goto fail;
  }
  if (!S_ISREG(st.st_mode)) {
    rc = ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "%s: not a regular file", path);
    goto fail;
  }
  f->size = (uint64_t)st.st_size;
  if (f->size) {
    void *m = mmap(NULL, (size_t)f->size, PROT_READ, MAP_SHARED, f->fd, 0);
    if (m == MAP_FAILED) {
      rc = ckptio_err_fmt(err, errlen, -errno, "%s: mmap: %s", path, ckptio_errno_text(errno));
      goto fail;
    }
    f->map = m;
  }
  return 0;
fail:
  ckptio_rfile_close(f);
  return rc;
}

int ckptio_rfile_open_object(ckptio_rfile *f, const char *path, const ckptio_storage_ops *ops, void *self,
                             char *err, size_t errlen) {
  memset(f, 0, sizeof(*f));
  f->fd = f->fd_direct = -1;
  if (!(f->path = strdup(path))) return -ENOMEM;
  int rc = ops->open_read(self, path, &f->obj, &f->size, err, errlen);
  if (rc < 0) {
    f->obj = NULL;
    ckptio_rfile_close(f);
    return rc;
  }
  f->store = ops;
  f->store_self = self;
  return 0;
}

int ckptio_rfile_pread(const ckptio_rfile *f, void *buf, size_t len, uint64_t off, char *err, size_t errlen) {
  if (!f->store) return ckptio_pread_full(f->fd, buf, len, off);
  if (off > f->size || len > f->size - off)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_SHORT_IO, "%s: %zu bytes at %llu are past its end (%llu bytes)",
                          f->path, len, (unsigned long long)off, (unsigned long long)f->size);
  if (len && off + len <= f->nhead) { /* read at open: no request again */
    memcpy(buf, f->head + off, len);
    return 0;
  }
  return len ? f->store->read(f->store_self, f->obj, buf, len, off, err, errlen) : 0;
}

void ckptio_rfile_close(ckptio_rfile *f) {
  if (f->store && f->obj) f->store->close_read(f->store_self, f->obj);
  if (f->map) munmap((void *)f->map, (size_t)f->size);
  if (f->fd_direct >= 0) close(f->fd_direct);
  if (f->fd >= 0) close(f->fd);
  free(f->path);
  free(f->head);
  memset(f, 0, sizeof(*f));
  f->fd = f->fd_direct = -1;
}

/* Linux 6.1 reports what O_DIRECT needs (512 bytes on most block devices);
 * elsewhere the page, which every filesystem that takes O_DIRECT accepts. */
static uint32_t dio_align(int fd) {
#ifdef STATX_DIOALIGN
  struct statx sx;
  if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN) &&
      sx.stx_dio_mem_align && sx.stx_dio_offset_align) {
    uint32_t a = sx.stx_dio_mem_align > sx.stx_dio_offset_align ? sx.stx_dio_mem_align : sx.stx_dio_offset_align;
    if ((a & (a - 1)) == 0) return a;
  }
#endif
  return CKPTIO_IO_ALIGN;
}

/* The file f->fd holds, opened again with O_DIRECT: through /proc, or by
 * its path when it is still the same file there. A save may have renamed
 * another file over the path since the open: its bytes are not this
 * reader's (the caller reads without O_DIRECT instead). */
static int reopen_direct(const ckptio_rfile *f) {
  char self[64];
  snprintf(self, sizeof(self), "/proc/self/fd/%d", f->fd);
  int fd = open(self, O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd >= 0 || errno == EINVAL) return fd; /* EINVAL: the filesystem refuses O_DIRECT */
  struct stat a, b;
  if ((fd = open(f->path, O_RDONLY | O_DIRECT | O_CLOEXEC)) < 0) return -1;
  if (fstat(fd, &a) == 0 && fstat(f->fd, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) return fd;
  close(fd);
  return -1;
}

int ckptio_rfile_direct(ckptio_rfile *f) {
  if (f->store) return -1; /* objects: no O_DIRECT */
  if (f->fd_direct < 0 && (f->fd_direct = reopen_direct(f)) >= 0) f->dio_align = dio_align(f->fd_direct);
  return f->fd_direct;
}

/* File bytes [from, to) to their place in dst (which starts at file byte
 * abs), one O_DIRECT block at a time through `edge`: the ragged ends of an
 * in-place read. */
static int via_edge(const ckptio_rfile *f, unsigned char *dst, uint64_t abs, uint64_t from, uint64_t to,
                    unsigned char *edge) {
  uint64_t al = f->dio_align;
  int rc = 0;
  for (uint64_t x = from, n; x < to && rc == 0; x += n) {
    uint64_t blk = x & ~(al - 1);
    n = blk + al - x < to - x ? blk + al - x : to - x;
    if ((rc = ckptio_pread_min(f->fd_direct, edge, (size_t)al, blk, (size_t)(x + n - blk))) == 0)
      memcpy(dst + (x - abs), edge + (x - blk), (size_t)n);
  }
  return rc;
}

/* ckptio_rfile_read_in_place with ragged ends: the whole blocks between
 * them straight into dst. */
static int read_in_place(const ckptio_rfile *f, unsigned char *dst, uint64_t abs, uint64_t len, unsigned char *edge) {
  uint64_t al = f->dio_align, end = abs + len;
  uint64_t a = (abs + al - 1) & ~(al - 1), b = end & ~(al - 1);
  if (b <= a) return via_edge(f, dst, abs, abs, end, edge); /* no whole block inside */
  int rc = via_edge(f, dst, abs, abs, a, edge);
  if (rc == 0) rc = ckptio_pread_full(f->fd_direct, dst + (a - abs), (size_t)(b - a), a);
  if (rc == 0) rc = via_edge(f, dst, abs, b, end, edge);
  return rc;
}

int ckptio_rfile_read_in_place(const ckptio_rfile *f, unsigned char *dst, uint64_t abs, uint64_t len) {
  if (((abs | len) & (f->dio_align - 1)) == 0) return ckptio_pread_full(f->fd_direct, dst, (size_t)len, abs);
  /* A block for the ragged ends, from the heap: a stack frame is not
   * always as aligned as declared (sanitizers move frames). */
  unsigned char *edge;
  if (posix_memalign((void **)&edge, f->dio_align, f->dio_align) != 0) return -ENOMEM;
  int rc = read_in_place(f, dst, abs, len, edge);
  free(edge);
  return rc;
}

int64_t ckptio_rfile_read_direct(const ckptio_rfile *f, unsigned char *buf, uint64_t abs, uint64_t len) {
  uint64_t a = PAGE_DOWN(abs), e = PAGE_UP(abs + len);
  int rc = ckptio_pread_min(f->fd_direct, buf, (size_t)(e - a), a, (size_t)(abs + len - a));
  return rc < 0 ? rc : (int64_t)(abs - a);
}

int ckptio_rfile_populate(const unsigned char *p, uint64_t len) {
#ifdef MADV_POPULATE_READ
  /* EFAULT: some page is past the end of the file (it shrank since it was
   * opened); reading it would raise SIGBUS. */
  uintptr_t a = PAGE_DOWN((uintptr_t)p);
  if (madvise((void *)a, (size_t)((uintptr_t)p + len - a), MADV_POPULATE_READ) != 0 && errno == EFAULT)
    return CKPTIO_E_SHORT_IO;
#else
  (void)p, (void)len;
#endif
  return 0;
}

void ckptio_rfile_drop(const unsigned char *p, uint64_t len) {
  /* Only whole pages inside the range: the edges may be shared with the
   * neighbours other workers are copying. */
  uintptr_t a = PAGE_UP((uintptr_t)p), b = PAGE_DOWN((uintptr_t)p + len);
  if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

void ckptio_rfile_scattered(const ckptio_rfile *f, int on) {
  if (f->map) madvise((void *)f->map, (size_t)f->size, on ? MADV_RANDOM : MADV_NORMAL);
}

double ckptio_rfile_resident(const ckptio_rfile *f, const uint64_t *off, const uint64_t *len, size_t n) {
  if (f->store) return 0; /* an object is no page cache's */
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) total += len[i];
  if (!f->map || total == 0) return 1;
  int samples = 0, resident = 0;
  uint64_t stride = total / 64 + 1, at = 0, seen = 0;
  for (size_t i = 0; i < n && samples < 64; i++) {
    for (; at < seen + len[i] && samples < 64; at += stride, samples++) {
      uintptr_t page = PAGE_DOWN((uintptr_t)(f->map + off[i] + (at - seen)));
      unsigned char v = 0;
      resident += mincore((void *)page, CKPTIO_IO_ALIGN, &v) == 0 && (v & 1);
    }
    seen += len[i];
  }
  return samples ? (double)resident / samples : 1;
}

int ckptio_rfile_mostly_cached(const ckptio_rfile *f, const uint64_t *off, const uint64_t *len, size_t n) {
  return ckptio_rfile_resident(f, off, len, n) >= 0.5;
}

int ckptio_rfile_map_private(const ckptio_rfile *f, void **base, char *err, size_t errlen) {
  if (f->store)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_FORMAT, "%s: an object in a storage cannot be mapped; load it", f->path);
  /* Copy-on-write: the pages stay the page cache's until written, and a
   * write copies one page into this process without reaching the file. */
  void *m = mmap(NULL, (size_t)f->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, f->fd, 0);
  if (m == MAP_FAILED) return ckptio_err_fmt(err, errlen, -errno, "%s: private mmap: %s", f->path, ckptio_errno_text(errno));
  *base = m;
  return 0;
}

int ckptio_rfile_unmap(void *base, uint64_t size) {
  if (!base) return 0;
  return munmap(base, (size_t)size) < 0 ? -errno : 0;
}
