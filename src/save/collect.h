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
#include "storage/storage.h"

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

/* The head of a writer of several files (a sharded set, a rank's side of
 * a multi-rank checkpoint), first in both kinds' structs: what both open
 * the same way and collect into before their commit. */
typedef struct ckptio_many_writer {
  ckptio_writer base;     /* first: the public handle */
  ckptio_ctx *ctx;
  ckptio_options opts;    /* the context's, with the call's */
  char *dir, *prefix;
  const ckptio_storage *store; /* dir is a storage's prefix: the files are objects (save/objects.h) */
  ckptio_collect c;       /* the tensors, metadata and streams, for every file */
} ckptio_many_writer;

/* A zeroed struct of `size` bytes (the kind's) whose head is open on dir
 * (an existing directory, or a storage's prefix) and prefix (plain, not
 * empty), with the call's options. Its files are plain safetensors, read
 * directly by other tools: a compression level is refused, saying so in
 * words of `kind` ("shards", "multi-rank files"). @return 0 and *out, or
 * a code with the reason in msg (CKPTIO_ERRLEN). */
int ckptio_many_open(size_t size, ckptio_ctx *ctx, const ckptio_writer_ops *ops, const ckptio_options *opts,
                     const char *dir, const char *prefix, const char *kind, ckptio_many_writer **out, char *msg);
/* Frees what the head holds and the struct (NULL: nothing). */
void ckptio_many_free(ckptio_many_writer *m);
/* The verbs both kinds take as they are: into the collected state. */
int ckptio_many_set_stream(ckptio_writer *base, int device, void *stream);
int ckptio_many_set_metadata(ckptio_writer *base, const char *key, const char *value);

/* A random save id (32 hex digits and a NUL) that ties a set's files to its
 * index. */
void ckptio_save_id_make(char out[33]);

#endif
