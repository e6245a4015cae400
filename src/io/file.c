/* File primitives and the atomic commit. A save writes into a temp file in
 * the target's directory (so rename is atomic on the same filesystem) and
 * only renames it into place after its data is synced; the directory is
 * synced after the rename so the new name survives a crash too. */
#include "io/file.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "ckptio.h"
#include "core/error.h"
#include "core/hold.h"
#include "io/fault.h"

int ckptio_pwrite_full(int fd, const void *buf, size_t len, uint64_t off) {
  const char *p = buf;
  int inject = ckptio_fault_check(CKPTIO_FAULT_PWRITE);
  if (inject && inject != CKPTIO_FAULT_SHORT) return -inject;
  while (len) {
    size_t want = inject == CKPTIO_FAULT_SHORT ? len / 2 : len;
    /* A modelled slow device takes the bytes at the end of their time, as a
     * real one's DMA reads them while the write is in flight: memory changed
     * during a write shows in the file, so an early snapshot point shows. */
    ckptio_fault_write_time(want);
    ssize_t n = want ? pwrite(fd, p, want, (off_t)off) : 0;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    if (n == 0) return CKPTIO_E_SHORT_IO; /* the disk took nothing: do not spin */
    if (inject == CKPTIO_FAULT_SHORT) return CKPTIO_E_SHORT_IO;
    p += n;
    off += (uint64_t)n;
    len -= (size_t)n;
  }
  return 0;
}

int ckptio_pread_min(int fd, void *buf, size_t len, uint64_t off, size_t min) {
  char *p = buf;
  size_t got = 0;
  int inject = ckptio_fault_check(CKPTIO_FAULT_PREAD);
  if (inject) return inject == CKPTIO_FAULT_SHORT ? CKPTIO_E_SHORT_IO : -inject;
  while (got < min) {
    ssize_t n = pread(fd, p + got, len - got, (off_t)(off + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    if (n == 0) return CKPTIO_E_SHORT_IO; /* end of file before min bytes */
    ckptio_fault_read_time((uint64_t)n);
    got += (size_t)n;
  }
  return 0;
}

int ckptio_pread_full(int fd, void *buf, size_t len, uint64_t off) {
  return ckptio_pread_min(fd, buf, len, off, len);
}

/* dir and base of path, as malloc'd strings ("." for a bare name). */
static int split_path(const char *path, char **dir, char **base) {
  const char *slash = strrchr(path, '/');
  *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
  *base = strdup(slash ? slash + 1 : path);
  if (!*dir || !*base) {
    free(*dir);
    free(*base);
    return -ENOMEM;
  }
  return 0;
}

int ckptio_tmpfile_claim(int fd) {
  /* A filesystem without locks (EINVAL, ENOLCK) leaves the temp unmarked:
   * a sweep there cannot tell it from a dead save's, as before locks. */
  if (flock(fd, LOCK_EX | LOCK_NB) < 0 && errno != EINVAL && errno != ENOLCK && errno != EOPNOTSUPP) return 0;
  struct stat st;
  return fstat(fd, &st) == 0 && st.st_nlink > 0;
}

int ckptio_tmpfile_unclaimed(int dirfd, const char *name) {
  int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return 0; /* gone already, or not ours to judge */
  int free_ = flock(fd, LOCK_EX | LOCK_NB) == 0 || (errno != EWOULDBLOCK && errno != EINTR);
  if (free_) unlinkat(dirfd, name, 0); /* under our lock: no saver can claim it meanwhile */
  close(fd);
  return free_;
}

int ckptio_tmpfile_open(ckptio_tmpfile *t, const char *path, int direct, uint64_t size,
                        char *err, size_t errlen) {
  static _Atomic unsigned counter;
  char *dir = NULL, *base = NULL;
  int rc;
  memset(t, 0, sizeof(*t));
  t->fd = t->fd_direct = -1;
  if ((rc = split_path(path, &dir, &base)) < 0) return rc;
  if (!*base) {
    rc = ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "%s: path names a directory", path);
    goto fail;
  }
  t->path = strdup(path);
  size_t n = strlen(dir) + strlen(base) + 64;
  t->tmp = malloc(n);
  if (!t->path || !t->tmp) {
    rc = -ENOMEM;
    goto fail;
  }
  for (int attempt = 0; attempt < 100; attempt++) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(t->tmp, n, "%s/.%s.ckptio-tmp-%d-%u-%lx", dir, base, (int)getpid(),
             atomic_fetch_add(&counter, 1), (unsigned long)ts.tv_nsec);
    t->fd = open(t->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (t->fd < 0 && errno != EEXIST) break;
    if (t->fd >= 0 && ckptio_tmpfile_claim(t->fd)) break;
    if (t->fd >= 0) close(t->fd); /* swept between its creation and our lock: take another name */
    t->fd = -1;
  }
  if (t->fd < 0) {
    rc = ckptio_err_fmt(err, errlen, -errno, "%s: cannot create temp file in %s: %s", path, dir,
                        ckptio_errno_text(errno));
    goto fail;
  }
  /* Allocating every block up front spares the O_DIRECT writes the block
   * allocation and size updates of an extending write: measured here, that
   * halves write throughput (fio preallocates the same way). Filesystems
   * without fallocate get a sparse file. Not on a tmpfs (a memory tier in
   * /dev/shm): there it zeroes every page before the writes fill it, 0.2 s
   * per GiB on the save's critical path, for nothing. */
  int inject = size ? ckptio_fault_check(CKPTIO_FAULT_FALLOCATE) : 0;
  struct statfs fs;
  int prealloc = size && !inject && !(fstatfs(t->fd, &fs) == 0 && fs.f_type == TMPFS_MAGIC);
  int falloc_err = prealloc && fallocate(t->fd, 0, 0, (off_t)size) != 0 ? errno : 0;
  if (prealloc && !falloc_err) {
    /* allocated and sized */
  } else if (inject == ENOSPC || falloc_err == ENOSPC) {
    /* Said now, before any byte is written, not by the k-th write. */
    rc = ckptio_err_fmt(err, errlen, -ENOSPC, "%s: %s: the file's %llu bytes do not fit in %s", path,
                        ckptio_errno_text(ENOSPC), (unsigned long long)size, dir);
    goto fail;
  } else if (ftruncate(t->fd, (off_t)size) < 0) {
    rc = ckptio_err_fmt(err, errlen, -errno, "%s: cannot size temp file to %llu bytes: %s", path,
                        (unsigned long long)size, ckptio_errno_text(errno));
    goto fail;
  }
  if (direct) {
    t->fd_direct = open(t->tmp, O_WRONLY | O_DIRECT | O_CLOEXEC);
    if (t->fd_direct < 0 && direct == 1) {
      rc = ckptio_err_fmt(err, errlen, -errno, "%s: O_DIRECT requested but refused: %s", path,
                          ckptio_errno_text(errno));
      goto fail;
    }
  }
  free(dir);
  free(base);
  return 0;
fail:
  free(dir);
  free(base);
  ckptio_tmpfile_abort(t);
  return rc;
}

static int sync_dir(const char *path) {
  char *dir, *base;
  int rc = split_path(path, &dir, &base);
  if (rc < 0) return rc;
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  rc = fd < 0 ? -errno : 0;
  if (fd >= 0 && fsync(fd) < 0) rc = -errno;
  if (fd >= 0) close(fd);
  free(dir);
  free(base);
  return rc;
}

int ckptio_tmpfile_open_object(ckptio_tmpfile *t, const char *path, uint64_t size, uint64_t chunk,
                               const ckptio_storage_ops *ops, void *self, char *err, size_t errlen) {
  memset(t, 0, sizeof(*t));
  t->fd = t->fd_direct = -1;
  if (!ops->create)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_FORMAT, "%s: its storage is read-only (no create verb)", path);
  if (!(t->path = strdup(path))) return -ENOMEM;
  int rc = ops->create(self, path, size, chunk, &t->obj, err, errlen);
  if (rc < 0) {
    free(t->path);
    t->path = NULL;
    return rc;
  }
  t->store = ops;
  t->store_self = self;
  return 0;
}

int ckptio_tmpfile_write(ckptio_tmpfile *t, const void *buf, size_t len, uint64_t off, char *err, size_t errlen) {
  if (t->store) return t->store->write(t->store_self, t->obj, buf, len, off, err, errlen);
  return ckptio_pwrite_full(t->fd_direct >= 0 ? t->fd_direct : t->fd, buf, len, off);
}

int ckptio_tmpfile_commit(ckptio_tmpfile *t, uint64_t size, int sync, ckptio_held *held, char *err, size_t errlen) {
  int rc = 0, inject;
  if (t->store) { /* published whole by the storage, or not at all */
    rc = t->store->publish(t->store_self, t->obj, err, errlen);
    t->obj = NULL; /* publish frees it either way */
    ckptio_tmpfile_abort(t);
    return rc;
  }
  if (ftruncate(t->fd, (off_t)size) < 0) {
    rc = ckptio_err_fmt(err, errlen, -errno, "%s: truncate to %llu bytes: %s", t->path,
                        (unsigned long long)size, ckptio_errno_text(errno));
    goto fail;
  }
  if (sync) {
    inject = ckptio_fault_check(CKPTIO_FAULT_FSYNC);
    if (inject || fdatasync(t->fd) < 0) {
      int e = inject ? inject : errno;
      rc = ckptio_err_fmt(err, errlen, -e, "%s: fdatasync: %s", t->path, ckptio_errno_text(e));
      goto fail;
    }
  }
  int old = ckptio_hold_blocks(AT_FDCWD, t->path);
  inject = ckptio_fault_check(CKPTIO_FAULT_RENAME);
  if (inject || rename(t->tmp, t->path) < 0) {
    int e = inject ? inject : errno;
    rc = ckptio_err_fmt(err, errlen, -e, "%s: rename from temp file: %s", t->path, ckptio_errno_text(e));
    if (old >= 0) close(old);
    goto fail;
  }
  ckptio_held_add(held, old);
  free(t->tmp);
  t->tmp = NULL; /* renamed: nothing to remove any more */
  if (sync && (rc = sync_dir(t->path)) < 0) {
    /* The file is in place and its data synced; only the name's durability
     * is in doubt. Report it: the caller asked for durability. */
    ckptio_err_fmt(err, errlen, rc, "%s: fsync of the directory: %s", t->path, ckptio_errno_text(-rc));
  }
  ckptio_tmpfile_abort(t);
  return rc;
fail:
  ckptio_tmpfile_abort(t);
  return rc;
}

void ckptio_tmpfile_abort(ckptio_tmpfile *t) {
  if (t->store && t->obj) t->store->abandon(t->store_self, t->obj);
  if (t->fd_direct >= 0) close(t->fd_direct);
  if (t->fd >= 0) close(t->fd);
  if (t->tmp) unlink(t->tmp);
  free(t->tmp);
  free(t->path);
  memset(t, 0, sizeof(*t));
  t->fd = t->fd_direct = -1;
}

char *ckptio_path_join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = malloc(n);
  if (p) snprintf(p, n, "%s/%s", dir, name);
  return p;
}
