/* What a writer of several files gathers before its commit: the tensors
 * (names copied, data borrowed), the metadata for every file, the caller's
 * streams. The sharded set and the multi-rank writer both collect this way
 * and hand it to their files' writers at commit. */
#ifndef CKPTIO_SAVE_COLLECT_H
#define CKPTIO_SAVE_COLLECT_H

#include <stdint.h>

#include "ckptio.h"
#include "core/nameset.h"
#include "save/save.h"

typedef struct ckptio_ctensor {
  ckptio_tensor t;        /* name owned; t.shape is the part's */
  uint64_t nbytes;
  int64_t global[CKPTIO_MAX_DIMS]; /* the tensor's shape (t.shape when whole) */
  int64_t offsets[CKPTIO_MAX_DIMS];
  ckptio_fill fill;       /* where the bytes come from, for the file writer */
} ckptio_ctensor;

typedef struct ckptio_collect {
  ckptio_ctensor *tensors;
  size_t count, cap;
  char **meta;            /* key, value pairs, owned */
  size_t nmeta2, meta_cap;
  ckptio_nameset names;   /* the tensors' names, for O(1) duplicate checks */
  uint64_t total_bytes;
  void *user_stream[64];  /* by GPU ordinal */
} ckptio_collect;

/* Each checks its arguments as the public call does and writes the reason
 * of a refusal into err (CKPTIO_ERRLEN); `where` names the save. */
int ckptio_collect_stream(ckptio_collect *c, ckptio_ctx *ctx, int device, void *stream, const char *where,
                          char *err);
int ckptio_collect_metadata(ckptio_collect *c, const char *key, const char *value, char *err);
/* A box of a tensor: global / offsets NULL for the whole tensor. */
int ckptio_collect_add(ckptio_collect *c, const ckptio_tensor *t, const int64_t *global, const int64_t *offsets,
                       ckptio_fill fill, char *err);
/* The metadata and streams, onto a file writer about to be filled. */
int ckptio_collect_apply(const ckptio_collect *c, ckptio_writer *sub);
void ckptio_collect_free(ckptio_collect *c);

/* The directory and file prefix of a writer of several files: a plain,
 * non-empty prefix and an existing directory. @return 0, or
 * CKPTIO_E_INVALID_ARG / -ENOENT / -ENOTDIR with the reason in msg. */
int ckptio_collect_check_dir(const char *dir, const char *prefix, int object, char *msg, size_t len);

/* A random save id (32 hex digits and a NUL) that ties a set's files to its
 * index. */
void ckptio_save_id_make(char out[33]);

#endif
