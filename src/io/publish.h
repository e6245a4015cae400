/* Publishing several files as one set (sharded saves): each temp file is
 * synced without being renamed, then all are swapped into place, and any
 * swap can be undone until the set is declared final. Builds on io/file.h's
 * temp files; the fsync and the swap go through the fault injection of
 * io/fault.h (undoing a swap and the directory fsync do not). */
#ifndef CKPTIO_IO_PUBLISH_H
#define CKPTIO_IO_PUBLISH_H

#include <stddef.h>
#include <stdint.h>

#include "core/hold.h"
#include "io/file.h"

/* How a temp file took its place, for undo. */
typedef enum ckptio_swap {
  CKPTIO_SWAP_NONE = 0,   /* not in place yet */
  CKPTIO_SWAP_NEW,        /* renamed to a name that did not exist */
  CKPTIO_SWAP_EXCHANGED,  /* exchanged with the old file, now at t->tmp */
  CKPTIO_SWAP_REPLACED,   /* renamed over the old file (no exchange on this
                             filesystem): cannot be undone */
} ckptio_swap;

/* Truncates the temp file to size and (if sync) fdatasyncs it; it stays
 * open and unrenamed. On failure nothing is removed (the caller aborts).
 * An object of a storage has nothing to sync: publish makes it durable. */
int ckptio_tmpfile_sync(ckptio_tmpfile *t, uint64_t size, int sync, char *err, size_t errlen);

/* Moves the synced temp file to its final path: exchanged with the file
 * already there (which is kept under the temp name), or renamed when there
 * is none. @return 0 and *how, or a negative code with *how NONE. */
int ckptio_tmpfile_swap_in(ckptio_tmpfile *t, ckptio_swap *how, char *err, size_t errlen);

/* Undoes swap_in: the old file goes back to the final path, the new one is
 * removed, the temp file closed. Best effort (used while failing). */
void ckptio_tmpfile_swap_back(ckptio_tmpfile *t, ckptio_swap how);

/* The set is final: removes the old file kept by an exchange and closes.
 * With `held`, that old file goes there still open (core/hold.h), for the
 * caller to close; NULL: freed at once. */
void ckptio_tmpfile_release(ckptio_tmpfile *t, ckptio_swap how, ckptio_held *held);

/* Sets published into one directory one at a time: a set's publish
 * (shards swapped in, then the index) holds an advisory lock (flock) on
 * its directory, so that concurrent saves of a set never interleave their
 * swaps and the last to publish wins whole; a reader opening a set holds
 * it shared, so that it never pairs an index with shards of another save.
 * ckptio_dir_lock waits for it (shared: 10 s at most, then goes on
 * unlocked) and returns the descriptor that holds it (-1 when the
 * directory cannot be opened: then no lock, as on a filesystem without
 * locks); ckptio_dir_unlock drops it. */
int ckptio_dir_lock(const char *dir, int shared);
void ckptio_dir_unlock(int fd);

/* After a set "{prefix}-KKKKK-of-NNNNN.safetensors" is published: removes
 * the files of that pattern with another count than nshards (an earlier
 * save's), each held in `held` first (NULL: freed at once). Best effort. */
void ckptio_remove_stale_shards(const char *dir, const char *prefix, size_t nshards, ckptio_held *held);
/* Removes the hidden temp files of a set's names that a killed save left;
 * a concurrent save's live temps stay (ckptio_tmpfile_unclaimed). Best
 * effort. */
void ckptio_remove_stray_temps(const char *dir, const char *prefix);
/* The same for one file: ".{basename}.ckptio-tmp-*" next to path. */
void ckptio_remove_stray_temps_of(const char *path);

/* fsync of a directory. @return 0 or -errno. */
int ckptio_dir_sync(const char *dir);

#endif
