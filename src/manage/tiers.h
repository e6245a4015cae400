/* The tiered multi-rank checkpoints' private interface (ckptio_tiers_* in
 * ckptio.h): the handle, the files a tier directory holds, and the
 * exchange that moves a part's bytes between ranks. Built, like the
 * manager, on the public API and core only. */
#ifndef CKPTIO_MANAGE_TIERS_H
#define CKPTIO_MANAGE_TIERS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "ckptio.h"
#include "manage/manage.h"

/* A step directory's marks: every rank's own part there (memory and
 * durable), every copy there (peers). */
#define TIERS_PUBLISHED "PUBLISHED"
#define TIERS_COPIES "COPIES"

/* A tensor of a save with places (ckptio_tiers_save_placed). */
typedef struct tiers_placed {
  char *name;
  ckptio_tiers_place place;
} tiers_placed;

/* The multi-rank checkpoint's file prefix, and its index, in a durable or
 * storage step of a save with places. */
#define TIERS_RANKS_PREFIX "model"
#define TIERS_RANKS_INDEX TIERS_RANKS_PREFIX ".safetensors.index.json"

/* One save's work behind its snapshot point (tiers_save.c). */
typedef struct tiers_job {
  uint64_t step;
  int due[CKPTIO_TIERS];
  int rc[CKPTIO_TIERS];
  char why[CKPTIO_TIERS][CKPTIO_ERRLEN];
  ckptio_writer *w;        /* the part's writer past its snapshot point, until its file is whole */
  int w_tier;              /* its tier: memory, else the first of durable and storage due */
  uint64_t bytes;          /* the part file's size */
  tiers_placed *placed;    /* a save with places: each tensor's (malloc'd, names too); else NULL */
  size_t nplaced;
  int result;              /* what the save returns */
} tiers_job;

struct ckptio_tiers {
  ckptio_ctx *ctx;
  ckptio_comm comm;
  ckptio_tiers_options o;  /* memory_dir and durable_dir point at our copies */
  int leader;              /* the first rank of its node: removes marks and directories */
  ckptio_tiers_warn_fn warn;
  void *warn_arg;
  ckptio_tiers_stats stats;
  uint64_t last_step;
  int saved;               /* last_step holds a step */
  const ckptio_storage_ops *st; /* storage_dir's storage (tiers_storage.c), or NULL */
  void *st_self;
  tiers_job job;           /* the last save's */
  pthread_t thread;        /* finishing it, in background mode */
  int running;             /* thread to be joined */
  char err[CKPTIO_ERRLEN];
};

/* The rank that holds the k-th copy (1 <= k <= peers) of rank r's part,
 * and the rank whose k-th copy rank r holds. */
int tiers_holder(const ckptio_tiers *t, int r, int k);
int tiers_held(const ckptio_tiers *t, int r, int k);

/* A tier's directory: the durable one, the storage's prefix, or the memory
 * one (own parts and peers' copies). */
const char *tiers_dir(const ckptio_tiers *t, int tier);

/* Waits for the last save's background finish. @return its result. */
int tiers_join(ckptio_tiers *t);

/* Reports a warning: into t->err and to the callback. */
void tiers_warn(ckptio_tiers *t, uint64_t step, int tier, int code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* ---------------------------------------------------------------- files */

/* DIR/step-N, DIR/step-N/<what>-RRRRR.safetensors (what "rank" or "copy"),
 * or DIR/step-N/<mark> (what NULL, mark the file's name). @return 0, or
 * -ENAMETOOLONG. */
int tiers_path(char *buf, size_t len, const char *dir, uint64_t step, const char *what, int r);
int tiers_mark_path(char *buf, size_t len, const char *dir, uint64_t step, const char *mark);
/* Rank r's own part of step in tier (not the peers' copies): its
 * rank-R.safetensors, or in a durable or storage step saved with places
 * its file of the multi-rank checkpoint (file r + 1 of nranks). @return 0
 * or -ENAMETOOLONG. */
int tiers_part_path(ckptio_tiers *t, int tier, uint64_t step, int r, char *buf, size_t len);
/* 1 with *rank (and *nranks when not NULL) when name is a file of a step
 * saved with places: "model-KKKKK-of-MMMMM.safetensors" (in a storage with
 * the save's id before ".safetensors"), rank K - 1's part; else 0. */
int tiers_parse_ranks_file(const char *name, int *rank, int *nranks);
/* Creates DIR (every missing level) and DIR/step-N. @return 0 or -errno. */
int tiers_make_step_dir(const char *dir, uint64_t step);
/* Writes DIR/step-N/<mark> for `rank` (a temp file of its own renamed into
 * place; with sync, fsync'd, and the directory too). @return 0 or -errno. */
int tiers_mark(const char *dir, uint64_t step, const char *mark, int rank, int sync);
/* 1 when DIR/step-N/<mark> exists. */
int tiers_marked(const char *dir, uint64_t step, const char *mark);
/* The steps of DIR's step directories, ascending (malloc'd). @return the
 * count (0 when DIR is missing) or -errno. */
long tiers_steps(const char *dir, uint64_t **steps);
/* Size of a regular file, or -errno. */
int64_t tiers_file_size(const char *path);
/* Copies file src to dst (created, fsync'd). @return 0 or -errno. */
int tiers_copy_file(const char *src, const char *dst);
/* fsync of DIR/step-N. @return 0 or -errno. */
int tiers_sync_step_dir(const char *dir, uint64_t step);
/* Keeps, of the steps up to `current`, the `keep` newest marked with
 * `mark` (or with `mark2`, when not NULL) and `current`; every other step
 * directory up to `current` is removed whole by the node's leader. */
void tiers_retire(ckptio_tiers *t, const char *dir, int keep, const char *mark, const char *mark2,
                  uint64_t current);

/* -------------------------------------------------------------- storage */

/* The storage of storage_dir into t->st and t->st_self. @return 0, or the
 * failure with why (a local path, a storage that cannot write or list). */
int tiers_obj_open(ckptio_tiers *t, char *why);
/* The size of the object at path, or a negative code. */
int64_t tiers_obj_size(ckptio_tiers *t, const char *path);
/* The local file src as the object dst, published whole. @return 0 or the
 * failure with why. */
int tiers_obj_upload(ckptio_tiers *t, const char *src, const char *dst, char *why);
/* The object src as the local file dst (a temp name renamed into place
 * once whole). @return 0 or the failure with why. */
int tiers_obj_download(ckptio_tiers *t, const char *src, const char *dst, char *why);
/* Writes, or removes, the object STORAGE_DIR/step-N/PUBLISHED. */
int tiers_obj_mark(ckptio_tiers *t, uint64_t step, char *why);
void tiers_obj_unmark(ckptio_tiers *t, uint64_t step);
/* Every object under STORAGE_DIR/step-N/, sorted by step and name, into
 * *o (free with mgr_objs_free). @return 0 or the listing's failure with why. */
int tiers_obj_scan(ckptio_tiers *t, mgr_objs *o, char *why);
/* The size of step's object `name` in o, or -ENOENT. */
int64_t tiers_objs_size(const mgr_objs *o, uint64_t step, const char *name);
/* On rank 0: keeps, of the steps up to `current`, the storage_keep newest
 * published and `current`; removes every object of the others. */
void tiers_obj_retire(ckptio_tiers *t, uint64_t current);

/* ------------------------------------------------------- with places */

/* Collective over every rank whose save has `tier` (durable or storage)
 * due: this rank's part (its local file src, written by the save into a
 * faster tier, or j->rc[j->w_tier] < 0 when it was not) placed into the
 * multi-rank checkpoint of that tier's step-N. @return 0 or the failure
 * with why. */
int tiers_ranks_checkpoint(ckptio_tiers *t, tiers_job *j, int tier, const char *src, char *why);
/* Frees a job's places. */
void tiers_placed_free(tiers_job *j);

/* ------------------------------------------------------------- exchange */

/* A part arriving over the exchange loaded straight into a restore's
 * tensors (tiers_stream.c). */
typedef struct tiers_stream tiers_stream;

/* One part's bytes moved from rank src to rank dst. */
typedef struct tiers_move {
  int src, dst;
  uint64_t bytes;
  char path[4096];     /* this rank's end of it: the file src reads or dst writes; "" on other ranks */
  tiers_stream *into;  /* on dst, instead of a file: the tensors the bytes land in; else NULL */
  int ok;              /* set by tiers_exchange: 1 when the move went through on this rank */
} tiers_move;

/* Collective: every rank passes the same list (each with its own paths).
 * For each move, rank src reads the `bytes` bytes of its path and rank dst
 * writes them to its path (created; a temp name renamed into place once
 * whole) or feeds them to its stream (`into`), in rounds in which a rank sends and receives at most one part,
 * through bounded chunks of the communicator's alltoallv. A rank whose
 * file cannot be read or written goes on taking part (so no rank hangs)
 * and fails its moves. @return 0, or a negative code (the communicator
 * failed, memory) with t->err. */
int tiers_exchange(ckptio_tiers *t, tiers_move *moves, size_t n);

/* A part's every CRC32 checked: opened by ckptio_reader_open and
 * ckptio_reader_verify, nothing unchecked. @return 0, or the failure with
 * why (CKPTIO_ERRLEN) saying it. */
int tiers_verify(ckptio_tiers *t, const char *path, char *why);
/* The part's tensors named by dests loaded into them, each CRC32 checked
 * as it lands. @return 0, or the failure with why. */
int tiers_load(ckptio_tiers *t, const char *path, const ckptio_tiers_dest *dests, size_t n, char *why);

/* 1 when every destination is host memory, which a stream can fill. */
int tiers_stream_can(const ckptio_tiers_dest *dests, size_t n);
/* A stream for a part of `bytes` bytes into dests (kept by the caller
 * until tiers_stream_free), or NULL without memory. */
tiers_stream *tiers_stream_new(ckptio_ctx *ctx, const ckptio_tiers_dest *dests, size_t n, uint64_t bytes);
/* The part's bytes [off, off + len), in order from 0: the header is
 * parsed once it is whole, then each piece of an asked tensor is copied
 * into its destination, its CRC32 continued. @return 0, or the stream's
 * first failure (later pieces are then dropped). */
int tiers_stream_feed(tiers_stream *s, const unsigned char *buf, uint64_t off, uint64_t len);
/* Where the part's bytes [off, off + len) go when they all fall in one
 * destination (the exchange then receives them there), else NULL (they
 * come through tiers_stream_feed). Next piece only, as feed's. */
unsigned char *tiers_stream_target(tiers_stream *s, uint64_t off, uint64_t len);
/* Those bytes are in the target: its CRC32 is continued over them. */
void tiers_stream_landed(tiers_stream *s, uint64_t off, uint64_t len);
/* After the last piece: 0 when every destination is whole and every CRC32
 * matches; else the failure, with why (CKPTIO_ERRLEN) naming the tensor. */
int tiers_stream_end(tiers_stream *s, char *why);
void tiers_stream_free(tiers_stream *s);

#endif
