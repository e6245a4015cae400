/* A save of several objects into a storage (a set's shards, a multi-rank
 * checkpoint's files): the index written last, and the sweep of what older
 * and crashed saves left. An object cannot be renamed into place, so each
 * save names its own objects (core/shardname.h, after the save id) and the
 * index is the one object that changes: until it does, the old index names
 * whole old objects. */
#ifndef CKPTIO_SAVE_OBJECTS_H
#define CKPTIO_SAVE_OBJECTS_H

#include <stddef.h>

#include "storage/storage.h"

/* A small object (an index) written whole and published. @return 0, or a
 * code with the storage's sentence in err. */
int ckptio_objects_put(const ckptio_storage *store, const char *path, const void *data, size_t len, int sync,
                       char *err, size_t errlen);
/* Removes the object at path, if the storage can; best effort (a save that
 * failed takes back what it published). */
void ckptio_objects_remove(const ckptio_storage *store, const char *path);
/* After a save's index under dir was published: removes the files of older
 * saves of prefix (objects named as core/shardname.h names a storage's or
 * a local set's files, that are not among keep's n paths) and abandons the
 * uploads crashed saves under dir/prefix left open. Best effort: the
 * checkpoint is published whatever happens here. */
void ckptio_objects_sweep(const ckptio_storage *store, const char *dir, const char *prefix, char *const *keep,
                          size_t n);

#endif
