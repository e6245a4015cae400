/* A sharded checkpoint opened as one reader (shard_read.c): the hooks that
 * reader.c and load.c call when a reader holds a set of shards. */
#ifndef CKPTIO_SHARD_H
#define CKPTIO_SHARD_H

#include "reader_internal.h"

/* Limit on the index file, the same as on a safetensors header. */
#define CKPTIO_SHARD_INDEX_MAX 100000000u

/* Called by ckptio_reader_open with r->path set. A `*.index.json` file, or a
 * directory with exactly one `*.safetensors.index.json`, is opened as a set
 * (r->idx filled over every shard, r->set owned). A directory with exactly
 * one `*.safetensors` and no index replaces r->path with that file.
 * @return 1 for a set, 0 to open r->path as a single file, or a negative
 * code with the detail in r->err. */
int ckptio_shard_open(ckptio_reader *r);
/* Frees the set and the merged index (whose strings the shards own). */
void ckptio_shard_close(ckptio_reader *r);
/* load.c's ckptio_reader_run for a set: the validated requests, split per
 * shard and run by each shard's reader. */
int ckptio_shard_run(ckptio_reader *r, const ckptio_load_request *reqs, size_t n, int check);
int ckptio_shard_view(ckptio_reader *r, size_t index, const void **data, uint64_t *nbytes);
int ckptio_shard_set_stream(ckptio_reader *r, int device, void *stream);
/* The shard reader holding merged index `index`; *local is its index there
 * and *k (if not NULL) the shard's number. */
ckptio_reader *ckptio_shard_sub(ckptio_reader *r, size_t index, size_t *local, size_t *k);
/* slice.c's and plan.c's calls for a set: each request is answered by its
 * shard's reader, with that reader's message copied on failure. */
int ckptio_shard_load_slices(ckptio_reader *r, ckptio_slice_request *reqs, size_t n);
int64_t ckptio_shard_slice_ranges(ckptio_reader *r, size_t index, int dim, int64_t start, int64_t stop,
                                  ckptio_byte_range *ranges, size_t cap);

#endif
