/* Files: whole-buffer pread/pwrite, and the atomic commit of a new file
 * (temp file in the target's directory, fdatasync, rename, directory fsync).
 * The only room of the pipelines that calls the OS for file I/O. */
#ifndef CKPTIO_IO_FILE_H
#define CKPTIO_IO_FILE_H

#include <stddef.h>
#include <stdint.h>

/* Objects of a storage (ckptio_storage_ops) come from ckptio.h's
 * experimental section, whoever includes this header. */
#ifndef CKPTIO_EXPERIMENTAL
#define CKPTIO_EXPERIMENTAL
#endif
#include "ckptio.h"
#include "core/hold.h"

/* A file being written: `fd` is buffered, `fd_direct` is the same file opened
 * with O_DIRECT (or -1 when the filesystem refuses it or it is off). */
typedef struct ckptio_tmpfile {
  char *path;   /* final path */
  char *tmp;    /* temp path in the same directory */
  int fd;
  int fd_direct;
  /* An object of a storage instead (ckptio_tmpfile_open_object): fds -1,
   * no temp path; published by commit, abandoned by abort. */
  const ckptio_storage_ops *store;
  void *store_self, *obj;
} ckptio_tmpfile;

/* Creates the temp file next to `path` (mode 0666 less umask) and sizes it
 * to `size`, allocating its blocks where the filesystem can (-ENOSPC when
 * they are not there). direct: 1 requires O_DIRECT, 0 never, -1 when
 * available.
 * @return 0 or a negative code with the detail in err. */
int ckptio_tmpfile_open(ckptio_tmpfile *t, const char *path, int direct, uint64_t size,
                        char *err, size_t errlen);
/* A live save's temp file is marked by an advisory lock (flock) its
 * descriptor holds until the file is renamed or removed; a process that
 * dies drops it. So a sweep of the temps a killed save left never removes
 * one that a concurrent save is writing.
 * ckptio_tmpfile_claim: marks a temp just created; 0 when a sweep removed
 * it first (the caller takes another name).
 * ckptio_tmpfile_unclaimed: removes dirfd/name if no live save holds it.
 * @return 1 when it was removed, 0 when it is live or could not be opened. */
int ckptio_tmpfile_claim(int fd);
int ckptio_tmpfile_unclaimed(int dirfd, const char *name);
/* Truncates to size, syncs (if sync), renames over path, syncs the
 * directory, closes. On failure the temp file is removed and path keeps
 * what it had. The file the rename replaced, if any, goes into `held`
 * still open (core/hold.h), for the caller to close off the save's path. */
int ckptio_tmpfile_commit(ckptio_tmpfile *t, uint64_t size, int sync, ckptio_held *held, char *err, size_t errlen);
/* Closes and removes the temp file. Safe after a failed commit. */
void ckptio_tmpfile_abort(ckptio_tmpfile *t);

/* A new object `path` of a storage (its verbs and self outlive t), of
 * `size` bytes written in chunks of `chunk` (ckptio_storage_ops.create).
 * @return 0, or a code with the storage's sentence in err; CKPTIO_E_FORMAT
 * for a read-only storage. */
int ckptio_tmpfile_open_object(ckptio_tmpfile *t, const char *path, uint64_t size, uint64_t chunk,
                               const ckptio_storage_ops *ops, void *self, char *err, size_t errlen);
/* len bytes at off: to the object, else to the O_DIRECT descriptor where
 * there is one (the caller's buffer and range page-aligned), else the
 * buffered one. @return 0 or a code; an object's failure writes the
 * storage's sentence into err, a file's leaves err for the caller. */
int ckptio_tmpfile_write(ckptio_tmpfile *t, const void *buf, size_t len, uint64_t off, char *err, size_t errlen);

/* Writes / reads all len bytes at off, retrying short transfers.
 * @return 0, -errno, or CKPTIO_E_SHORT_IO when the OS moved nothing. */
/* dir + "/" + name, malloc'd (NULL when out of memory). */
char *ckptio_path_join(const char *dir, const char *name);

int ckptio_pwrite_full(int fd, const void *buf, size_t len, uint64_t off);
int ckptio_pread_full(int fd, void *buf, size_t len, uint64_t off);
/* Reads up to len bytes, succeeding once at least min arrived (an O_DIRECT
 * read of whole pages may end at the end of the file). */
int ckptio_pread_min(int fd, void *buf, size_t len, uint64_t off, size_t min);

#endif
