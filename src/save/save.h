/* The three kinds of writer behind the one public ckptio_writer: a single
 * file (writer.c), a sharded set of files (set.c) and one rank's side of a
 * multi-rank checkpoint (ranks.c). Each kind fills a table of verbs;
 * front.c checks the handle and dispatches, and a set and a rank hold their
 * files' writers by this same table, never through the public front. */
#ifndef CKPTIO_SAVE_SAVE_H
#define CKPTIO_SAVE_SAVE_H

#include "ckptio.h"
#include "core/error.h"
#include "io/file.h"

/* Every verb gets a non-NULL writer of its own kind; the public contract of
 * each is the one in ckptio.h for ckptio_writer_<verb>. */
/* Where an added tensor's bytes come from: fn NULL, the memory at t->data
 * (ckptio_writer_add); else fn(arg, ...) as the save runs
 * (ckptio_writer_add_fill). */
typedef struct ckptio_fill {
  ckptio_fill_fn fn;
  void *arg;
} ckptio_fill;

typedef struct ckptio_writer_ops {
  int (*set_metadata)(ckptio_writer *w, const char *key, const char *value);
  int (*set_stream)(ckptio_writer *w, int device, void *stream);
  int (*add)(ckptio_writer *w, const ckptio_tensor *t, ckptio_fill fill); /* add and add_fill */
  int (*commit_async)(ckptio_writer *w);
  int (*wait_snapshot)(ckptio_writer *w);
  int (*wait_durable)(ckptio_writer *w);
  int (*poll_snapshot)(ckptio_writer *w);
  int (*poll_durable)(ckptio_writer *w);
  void (*progress)(ckptio_writer *w, uint64_t *done, uint64_t *total);
  int (*stats)(const ckptio_writer *w, ckptio_stats *out);
  size_t (*shard_count)(const ckptio_writer *w);
  int (*close)(ckptio_writer *w); /* waits for a running commit, frees */
  /* A box of a global tensor; NULL for kinds that store tensors whole (the
   * front then takes only whole boxes, as add). */
  int (*add_part)(ckptio_writer *w, const ckptio_tensor *t, const int64_t *global, const int64_t *offsets);
  /* ckptio_writer_abort: every kind then refuses every verb but close with
   * CKPTIO_E_STATE (on a multi-rank writer it is also collective). */
  int (*abort)(ckptio_writer *w, int code, const char *why);
} ckptio_writer_ops;

/* Where a save is, for every kind. The front refuses the verbs that build
 * a save (add, metadata, stream, commit, abort) unless it is OPEN, with one
 * message for all kinds; the kinds move it. DONE: a multi-rank save's
 * result is known (the other kinds keep RUNNING until close). */
typedef enum {
  CKPTIO_WRITER_OPEN,
  CKPTIO_WRITER_RUNNING,
  CKPTIO_WRITER_DONE,
  CKPTIO_WRITER_ABORTED
} ckptio_writer_state;

/* The head of every kind's struct. */
struct ckptio_writer {
  const ckptio_writer_ops *ops;
  const ckptio_ctx *ctx;          /* whose process alone may drive the save */
  char err[CKPTIO_ERRLEN];        /* ckptio_writer_last_error */
  ckptio_writer_state state;
  const char *where;              /* the kind's path or directory, for messages */
  int sync;                       /* committed by ckptio_writer_commit: the caller
                                     waits for the durable point, so an early
                                     snapshot buys it nothing (writer.c in_place);
                                     a kind holding file writers passes it on */
};

/* The opens below follow the public opens' contracts, except that a
 * failure's detail goes to err (CKPTIO_ERRLEN bytes, left as it is when
 * there is none), never to ckptio_last_open_error: the front sets that,
 * and a set opening its files in a commit must not touch it. */

/* One file (writer.c): ckptio_writer_open's contract. */
int ckptio_file_writer_open(ckptio_ctx *ctx, const char *path, ckptio_format format, const ckptio_options *opts,
                            char *err, ckptio_writer **out);

/* What a set needs from its files beyond the verbs; w must be a file
 * writer. */
/* ckptio_writer_set_torch_pickle's contract; refused (CKPTIO_E_INVALID_ARG)
 * for any other writer than one PyTorch file. */
int ckptio_file_writer_set_pickle(ckptio_writer *w, const void *pickle, size_t len);
/* set_metadata without the "ckptio." reservation. */
int ckptio_file_writer_set_reserved_metadata(ckptio_writer *w, const char *key, const char *value);
/* Before commit: the save ends with its temp file synced but not renamed
 * ("durable" then means that). The file is removed at close unless taken. */
int ckptio_file_writer_hold_publish(ckptio_writer *w);
/* After a held save succeeded (wait_durable returned 0): moves the synced
 * temp file, still open, to *out; the caller then owns it (publish or
 * ckptio_tmpfile_abort). @return 0 or CKPTIO_E_STATE. */
int ckptio_file_writer_take_file(ckptio_writer *w, ckptio_tmpfile *out);

/* A sharded set (set.c): ckptio_writer_open_sharded's contract. */
int ckptio_set_writer_open(ckptio_ctx *ctx, const char *dir, const char *prefix, ckptio_format format,
                           uint64_t max_shard_bytes, ckptio_shard_order order, const ckptio_options *opts,
                           char *err, ckptio_writer **out);

/* This rank's side of a multi-rank save (ranks.c): ckptio_writer_open_ranks's contract. */
int ckptio_ranks_writer_open(ckptio_ctx *ctx, const ckptio_comm *comm, const char *dir, const char *prefix,
                             const ckptio_options *opts, char *err, ckptio_writer **out);

#endif
