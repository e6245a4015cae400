/* The old file a commit replaced, closed after the save, not inside it.
 *
 * Renaming a new checkpoint over an old one, or removing the old shard a set
 * replaced, frees the old file's blocks inside that call when nothing else
 * holds the file: on this machine's ext4 0.15-0.22 s for 1 GiB (a third of
 * the save) and 0.94 s for 4 GiB (bench/RESULTS.md). The commit keeps the
 * old file open across the rename (core/hold.h); the close
 * that frees its blocks runs here, on a worker, once the save has said it
 * is durable. A context's end waits for its closes (the pool drains its
 * queue). */
#ifndef CKPTIO_SAVE_RELEASE_H
#define CKPTIO_SAVE_RELEASE_H

#include "core/hold.h"
#include "pool/pool.h"

/* Takes h's descriptors (h is left empty) and closes them one after the
 * other in one job on pool, so that a set of many shards holds one worker,
 * not all of them; here when no job can be queued. */
void ckptio_close_later(ckptio_pool *pool, ckptio_held *h);
/* Blocks until every close queued so far, by any context, has run: a save
 * told there is no space waits for the blocks already on their way back.
 * @return 1 if it waited for any, else 0. */
int ckptio_closes_wait(void);

#endif
