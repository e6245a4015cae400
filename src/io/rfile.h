/* A checkpoint file opened for reading: the descriptor, the O_DIRECT
 * descriptor opened on first need, a shared read-only mapping of the whole
 * file, and what loads do with its pages (populate, drop, sample residency,
 * map privately). The load pipeline reaches the OS's files only through
 * this object. */
#ifndef CKPTIO_IO_RFILE_H
#define CKPTIO_IO_RFILE_H

#include <stddef.h>
#include <stdint.h>

/* Objects of a storage (ckptio_storage_ops) come from ckptio.h's
 * experimental section, whoever includes this header. */
#ifndef CKPTIO_EXPERIMENTAL
#define CKPTIO_EXPERIMENTAL
#endif
#include "ckptio.h"

#define CKPTIO_RFILE_HEAD (256u << 10)

typedef struct ckptio_rfile {
  char *path;                /* owned */
  /* An object of a storage (ckptio_storage_ops) instead of a local file:
   * fd -1, no map, never O_DIRECT; every byte through ckptio_rfile_pread. */
  const ckptio_storage_ops *store;
  void *store_self, *obj;
  /* An object's first bytes (nhead of them, up to CKPTIO_RFILE_HEAD; owned),
   * read by the opener with one request to tell its format; every later
   * ckptio_rfile_pread inside them is served from here, so a safetensors
   * header, an archive's first local headers or a compressed file's header
   * frame of up to that size cost no request of their own (each is a round
   * trip on a real network). */
  unsigned char *head;
  size_t nhead;
  int fd, fd_direct;         /* fd_direct: -1 until ckptio_rfile_direct */
  uint32_t dio_align;        /* O_DIRECT's memory and offset alignment (statx;
                                the page where it is not reported) */
  const unsigned char *map;  /* the whole file, read-only; NULL when empty */
  uint64_t size;
} ckptio_rfile;

/* Opens and maps a regular file. @return 0 or a negative code with
 * "<path>: <reason>" in err; f is then closed. */
int ckptio_rfile_open(ckptio_rfile *f, const char *path, char *err, size_t errlen);
/* Opens the object `path` of a storage (the verbs and their self, which
 * outlive f). @return 0 or a negative code with the storage's sentence in
 * err; f is then closed. */
int ckptio_rfile_open_object(ckptio_rfile *f, const char *path, const ckptio_storage_ops *ops, void *self,
                             char *err, size_t errlen);
/* Exactly len bytes at off into buf, from the file or the object; safe on
 * many threads at once. @return 0, or a negative code; an object's failure
 * writes the storage's sentence into err (a file's leaves err alone: the
 * caller names the read). */
int ckptio_rfile_pread(const ckptio_rfile *f, void *buf, size_t len, uint64_t off, char *err, size_t errlen);
/* Unmaps and closes; accepts a file never opened (zeroed, fds -1). */
void ckptio_rfile_close(ckptio_rfile *f);

/* The O_DIRECT descriptor, opened on the first call (from the thread that
 * plans a load, before any job runs). @return it, or -1 where the
 * filesystem refuses O_DIRECT (tmpfs: the page cache is the disk). */
int ckptio_rfile_direct(ckptio_rfile *f);
/* O_DIRECT read of the pages around [abs, abs + len) into buf (aligned,
 * room for the two page edges); the last page may run past the end of the
 * file. @return the bytes' position in buf, or a negative code. */
int64_t ckptio_rfile_read_direct(const ckptio_rfile *f, unsigned char *buf, uint64_t abs, uint64_t len);

/* The largest O_DIRECT alignment in-place reads are used with. */
#define CKPTIO_RFILE_EDGE 4096u
/* Whether an O_DIRECT read of file bytes from `abs` may land at `dst`
 * itself: both agree modulo the file's direct I/O alignment. */
static inline int ckptio_rfile_in_place_ok(const ckptio_rfile *f, const void *dst, uint64_t abs) {
  return f->fd_direct >= 0 && f->dio_align <= CKPTIO_RFILE_EDGE && (((uintptr_t)dst ^ abs) & (f->dio_align - 1)) == 0;
}
/* O_DIRECT read of [abs, abs + len) into dst (ckptio_rfile_in_place_ok):
 * the aligned middle straight into dst, the two ragged ends through a
 * block of their own, so no byte outside [dst, dst + len) is written and
 * nothing passes through the page cache or a staging copy. */
int ckptio_rfile_read_in_place(const ckptio_rfile *f, unsigned char *dst, uint64_t abs, uint64_t len);

/* Maps the pages of [p, p + len) of a mapping in one call instead of one
 * fault per page. @return 0, or CKPTIO_E_SHORT_IO when the file no longer
 * holds them (a read would raise SIGBUS). Best effort before Linux 5.14. */
int ckptio_rfile_populate(const unsigned char *p, uint64_t len);
/* Drops the whole pages inside [p, p + len) from this process's mapping
 * (they stay in the page cache): a load must not hold the file twice. */
void ckptio_rfile_drop(const unsigned char *p, uint64_t len);
/* Faults on the shared mapping read only the page they touch (on) or the
 * kernel's read-around window again (off): a parser that reads a few bytes
 * here and there of a cold file (a zip's local headers, one per tensor)
 * would otherwise read a window of the disk's read-ahead size (8 MiB on
 * some virtual disks) around each, most of the file, one window at a time,
 * before the load reads it again. */
void ckptio_rfile_scattered(const ckptio_rfile *f, int on);
/* The share (0 to 1) of the spans [off[i], off[i]+len[i]) the page cache
 * holds, from a sample of up to 64 pages spread across them (mincore: no
 * I/O); 1 for no bytes or no map. */
double ckptio_rfile_resident(const ckptio_rfile *f, const uint64_t *off, const uint64_t *len, size_t n);
/* Whether the page cache holds most of them. */
int ckptio_rfile_mostly_cached(const ckptio_rfile *f, const uint64_t *off, const uint64_t *len, size_t n);

/* A private, writable, copy-on-write mapping of the whole file from the
 * open descriptor (the inode whose header was validated, even if the path
 * was replaced since). The caller owns it: ckptio_map_free. */
int ckptio_rfile_map_private(const ckptio_rfile *f, void **base, char *err, size_t errlen);
/* Unmaps a private mapping (NULL: nothing). @return 0 or -errno. */
int ckptio_rfile_unmap(void *base, uint64_t size);

#endif
