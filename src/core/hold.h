/* Holding a file's blocks past the removal of its name. Renaming over a
 * file or unlinking it frees its blocks inside that call when nothing else
 * holds it open: on this machine's ext4, 0.15-0.22 s for 1 GiB and 0.94 s
 * for 4 GiB, far longer than the fdatasync before it (bench/RESULTS.md).
 * Opened first, the name can go now and the blocks when the descriptor
 * closes, off the save's path. Shared by the commits (io, save) and the
 * manager's retention (manage), which may not call each other's rooms, and
 * so is the closer that closes them later (below). */
#ifndef CKPTIO_CORE_HOLD_H
#define CKPTIO_CORE_HOLD_H

#include <pthread.h>
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

/* The one way held descriptors are closed later: batch after batch, on a
 * thread of the closer's own that runs while there is something to close.
 * A context has one (its saves' replaced and stale files, handed over after
 * the durable point) and a manager has one (the steps retention removed).
 * Its closes are its owner's: a save told there is no space waits for its
 * context's, never for another context's. */
typedef struct ckptio_closer {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  ckptio_held queue; /* not yet taken by the thread */
  int running;       /* the thread has closes to run */
  int started;       /* th not joined yet */
  pthread_t th;
} ckptio_closer;

void ckptio_closer_init(ckptio_closer *c);
/* Takes h's descriptors (h is left empty) to be closed after the ones
 * handed over before; closes them here when no thread can be started. */
void ckptio_closer_add(ckptio_closer *c, ckptio_held *h);
/* Blocks until every descriptor handed over so far is closed.
 * @return 1 if it waited for any, else 0. */
int ckptio_closer_wait(ckptio_closer *c);
/* Waits, then releases c. */
void ckptio_closer_fini(ckptio_closer *c);

/* Closes a held descriptor: where its file's blocks are freed. */
void ckptio_held_close(int fd);
/* Tests: each ckptio_held_close takes `ns` longer (0: off), as freeing a
 * large file's blocks does — what no save may wait for. */
void ckptio_held_slow_closes(uint64_t ns);

#endif
