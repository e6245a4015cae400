/* Holding a file's blocks past the removal of its name. Renaming over a
 * file or unlinking it frees its blocks inside that call when nothing else
 * holds it open: on this machine's ext4, 0.15-0.22 s for 1 GiB and 0.94 s
 * for 4 GiB, far longer than the fdatasync before it (bench/RESULTS.md).
 * Opened first, the name can go now and the blocks when the descriptor
 * closes, off the save's path. Shared by the commits (io, save) and the
 * manager's retention (manage), which may not call each other's rooms. */
#ifndef CKPTIO_CORE_HOLD_H
#define CKPTIO_CORE_HOLD_H

#include <stddef.h>
#include <stdint.h>

/* The regular file `name` under dirfd (AT_FDCWD for a path), opened
 * read-only; -1 when there is none or it cannot be opened (then the name's
 * removal frees the blocks, as without this). */
int ckptio_hold_blocks(int dirfd, const char *name);

/* Descriptors held for their blocks, to be closed together later. */
typedef struct ckptio_held {
  int *fds;
  size_t n, cap;
} ckptio_held;

/* Keeps fd (-1: nothing) in h; closes it at once when h cannot grow or
 * holds CKPTIO_HELD_MAX already (a process has only so many descriptors). */
#define CKPTIO_HELD_MAX 1024
void ckptio_held_add(ckptio_held *h, int fd);
/* Closes every descriptor of h (each through ckptio_held_close) and empties it. */
void ckptio_held_close_all(ckptio_held *h);

/* Closes a held descriptor: where its file's blocks are freed. */
void ckptio_held_close(int fd);
/* Tests: each ckptio_held_close takes `ns` longer (0: off), as freeing a
 * large file's blocks does — what no save may wait for. */
void ckptio_held_slow_closes(uint64_t ns);

#endif
