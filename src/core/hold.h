/* Holding a file's blocks past the removal of its name. Renaming over a
 * file or unlinking it frees its blocks inside that call when nothing else
 * holds it open: on this machine's ext4, 0.15-0.22 s for 1 GiB and 0.94 s
 * for 4 GiB, far longer than the fdatasync before it (bench/RESULTS.md).
 * Opened first, the name can go now and the blocks when the descriptor
 * closes, off the save's path. Shared by the commits (io) and the manager's
 * retention (manage), which may not call each other's rooms. */
#ifndef CKPTIO_CORE_HOLD_H
#define CKPTIO_CORE_HOLD_H

/* The regular file `name` under dirfd (AT_FDCWD for a path), opened
 * read-only; -1 when there is none or it cannot be opened (then the name's
 * removal frees the blocks, as without this). */
int ckptio_hold_blocks(int dirfd, const char *name);

#endif
