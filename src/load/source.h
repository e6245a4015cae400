/* The load pipeline's one abstraction: a source of tensors. A source
 * describes its tensors (an index), cuts requests into jobs, runs one job
 * (bringing bytes to host memory and handing them to the executor), and
 * answers the few questions only it can (views, file ranges, files). Four
 * kinds fill the table: a plain file (safetensors or a PyTorch archive), a
 * zstd seekable file, a set of files that holds the other kinds by this
 * same table, and a DCP checkpoint (dcp.c) holding plain files the same way. The executor (exec.c) runs every job of every source on the
 * pool; nothing here starts threads or talks to a GPU. */
#ifndef CKPTIO_LOAD_SOURCE_H
#define CKPTIO_LOAD_SOURCE_H

#include <stdatomic.h>
#include <stdint.h>

#include "core/stats.h"
#include "formats/index.h"
#include "io/rfile.h"
#include "ctx/ctx.h"

typedef struct ckptio_source ckptio_source;
typedef struct ckptio_exec_out ckptio_exec_out;

/* Output byte x of a request is byte src0 + (x / run) * pitch + x % run of
 * the tensor's row-major bytes (for a PyTorch view: its logical bytes,
 * gathered from the storage). count runs of run bytes. */
typedef struct ckptio_geom {
  uint64_t src0, run, pitch, count;
  uint64_t nbytes;   /* run * count */
  int full;          /* the whole tensor */
} ckptio_geom;

/* The part of output bytes [x, end) that lies in one run: *n bytes from
 * byte *src of the tensor's row-major bytes. */
static inline void ckptio_geom_subrun(const ckptio_geom *g, uint64_t x, uint64_t end, uint64_t *src, uint64_t *n) {
  uint64_t k = x / g->run, within = x % g->run;
  *n = g->run - within < end - x ? g->run - within : end - x;
  *src = g->src0 + k * g->pitch + within;
}

/* One request as the executor runs it: a geometry of one tensor of one
 * source into a destination (or, dst NULL, only read and checked). */
typedef struct ckptio_xreq {
  ckptio_source *src;       /* the source holding the tensor (a set's member) */
  const ckptio_entry *e;
  unsigned char *dst;       /* host or GPU memory, or NULL */
  int gpu;                  /* ordinal of a GPU destination, or -1 */
  ckptio_geom g;
  int raw;                  /* address the stored bytes (a view's storage
                               record) rather than the logical ones */
  int check;                /* compare the CRC of the bytes with e->crc */
  uint64_t dpitch;          /* 0: output bytes land contiguous at dst; else
                               output run k of drun bytes lands at dst + k *
                               dpitch (a box of a part inside a larger
                               destination) */
  uint64_t drun;
  _Atomic uint64_t read;    /* bytes taken from the file */
  uint32_t crc;             /* the executor's: the parts' CRCs combined */
} ckptio_xreq;

/* Where a source may put a request's bytes itself: its host destination
 * when the output lands there contiguous, else NULL (a GPU, a scattered
 * box, or a check: the source hands the bytes to ckptio_run_deliver). */
static inline unsigned char *ckptio_xreq_host(const ckptio_xreq *q) {
  return q->gpu < 0 && q->dst && !q->dpitch ? q->dst : NULL;
}

/* A stored part of a tensor: an entry of a member source, and where its
 * box starts in the tensor (its sizes are the entry's shape). */
typedef struct ckptio_spart {
  ckptio_source *src;
  size_t local;
  int64_t off[CKPTIO_MAX_DIMS];
} ckptio_spart;

/* A job's contribution to one request: output bytes [off, off + len) and,
 * when the request is checked, their CRC. A request's parts appear in the
 * plan in ascending off order. */
typedef struct ckptio_part {
  ckptio_xreq *q;
  uint64_t off, len;
  uint32_t crc;
} ckptio_part;

/* One pool job: parts [first, first + nparts) of the plan, run by src. */
typedef struct ckptio_job {
  ckptio_source *src;
  size_t first, nparts;
  int need_slot;            /* takes a staging slot before it is queued */
  unsigned char *slot;
  ckptio_load_method method;
  uint64_t aux;             /* the source's own: a zstd frame number */
  void *owner;              /* the executor's */
} ckptio_job;

/* Jobs and parts, appended by sources' plan calls. */
typedef struct ckptio_plan {
  ckptio_ctx *ctx;
  const ckptio_options *opts;
  uint64_t load_bytes; /* what the whole load moves, all its sources together:
                          CKPTIO_LOAD_AUTO's page cache policy (io/cache.h) */
  ckptio_job *jobs;
  size_t njobs, jobs_cap;
  ckptio_part *parts;
  size_t nparts, parts_cap;
} ckptio_plan;

/* Appends a job of one part (or with nparts parts the caller fills).
 * @return the job, or NULL when out of memory. */
ckptio_job *ckptio_plan_job(ckptio_plan *p, ckptio_source *src, size_t nparts);

/* Handed to a running job: where its bytes go. */
typedef struct ckptio_run ckptio_run;
/* The bytes of part k of the job (0-based) are in host memory at `bytes`:
 * the host destination itself, the job's slot, or a mapping (`writable`
 * says whether they may be changed in place, e.g. byte-swapped). The
 * executor swaps big-endian elements, copies them to a GPU or to the host
 * destination, and counts them done. @return 0 or a failure (message set). */
int ckptio_run_deliver(ckptio_run *x, size_t k, const unsigned char *bytes, int writable);
/* Counts n bytes the job read straight into the caller's memory (stats). */
void ckptio_run_direct(ckptio_run *x, uint64_t n);
/* The job, its parts, and the message buffer of a failure. */
ckptio_job *ckptio_run_job(ckptio_run *x);
ckptio_part *ckptio_run_part(ckptio_run *x, size_t k);
char *ckptio_run_msg(ckptio_run *x, size_t *len);
/* Slot bytes of the context's ring. */
uint64_t ckptio_run_slot_bytes(ckptio_run *x);

typedef struct ckptio_source_ops {
  /* What the kind is called in messages: "file", "compressed file", ... */
  const char *noun;
  /* 1: its files are shards, each a checkpoint that opens alone (a set;
   * a DCP checkpoint's files are not). */
  int shards;
  /* Appends the jobs and parts of requests qs[0..n) (validated, all of
   * this source). May choose a read method, open O_DIRECT, pin memory. */
  int (*plan)(ckptio_source *s, ckptio_plan *p, ckptio_xreq **qs, size_t n);
  /* Runs one job on a pool worker: brings each part's bytes to host
   * memory, fills the part's CRC if its request is checked, and calls
   * ckptio_run_deliver. @return 0 or a code (message in ckptio_run_msg, or
   * empty for the executor's generic one). */
  int (*run)(ckptio_source *s, ckptio_run *x);
  /* After every job of a load has finished (unpin what plan pinned). May be NULL. */
  void (*finish)(ckptio_source *s);
  /* A tensor's stored bytes in place, or a failure naming why not. */
  int (*view)(ckptio_source *s, size_t index, const void **data, uint64_t *nbytes);
  /* Calls emit(arg, file number, offset, length) for the file bytes that
   * hold output [0, g->nbytes) of tensor index, in order. */
  void (*ranges)(ckptio_source *s, size_t index, const ckptio_geom *g,
                 void (*emit)(void *arg, uint32_t file, uint64_t off, uint64_t len), void *arg);
  /* The stored parts of tensor index, when it is split over files (a
   * multi-rank checkpoint): *out borrowed until close. NULL, or 0 parts:
   * the tensor is stored whole, in member(). */
  size_t (*parts)(ckptio_source *s, size_t index, const ckptio_spart **out);
  /* The member source holding tensor index, and its index there. */
  ckptio_source *(*member)(ckptio_source *s, size_t index, size_t *local, size_t *k);
  /* A private, writable mapping of the one file, every CRC checked over it
   * (reporting into out). NULL where the bytes are not the file's. */
  int (*map_private)(ckptio_source *s, const ckptio_exec_out *out, void **base, uint64_t *size);
  /* The share (0 to 1) of this file's stored bytes the page cache holds
   * (a sample: no I/O). NULL on kinds of several files: ask file(k). */
  double (*resident)(ckptio_source *s);
  /* A compressed file's frames and its stored and decompressed bytes.
   * NULL on kinds that store bytes as they are. */
  void (*compression)(ckptio_source *s, uint64_t *frames, uint64_t *stored, uint64_t *plain);
  /* File k of the source (0 <= k < nfiles): itself, or a set's member. */
  ckptio_source *(*file)(ckptio_source *s, size_t k);
  void (*close)(ckptio_source *s);
} ckptio_source_ops;

struct ckptio_source {
  const ckptio_source_ops *ops;
  ckptio_ctx *ctx;
  const ckptio_options *opts;  /* the reader's */
  char *path;                  /* owned: what was opened */
  ckptio_index idx;
  char *err;                   /* the reader's message buffer (CKPTIO_ERRLEN) */
  size_t nfiles;               /* files holding the tensors: 1, or a set's */
};

/* One file, zstd seekable or plain (a set's members, or what the reader
 * opens when the path names no set). @return 0 or a code, message in err. */
int ckptio_source_open_file(ckptio_ctx *ctx, const ckptio_options *opts, const char *path, char *err,
                            ckptio_source **out);
void ckptio_source_close(ckptio_source *s);
/* The read side's file object for path: an object of the context's
 * storage for "SCHEME://..." paths, else a local file. @return 0 or a code,
 * message in err (CKPTIO_ERRLEN). */
int ckptio_rfile_open_path(ckptio_ctx *ctx, ckptio_rfile *f, const char *path, char *err);

/* The kinds. A file kind takes the opened file f (owned from then on,
 * closed on failure); the set kind opens `path` when it names a set:
 * @return 1 and *out, or 0 and *file (malloc'd: the path itself, or a
 * directory's one safetensors file) to open as a single file. */
int ckptio_plain_from(ckptio_ctx *ctx, const ckptio_options *opts, ckptio_rfile *f, char *err, ckptio_source **out);
int ckptio_zstd_from(ckptio_ctx *ctx, const ckptio_options *opts, ckptio_rfile *f, char *err, ckptio_source **out);
int ckptio_set_open(ckptio_ctx *ctx, const ckptio_options *opts, const char *path, char *err, ckptio_source **out,
                    char **file);
/* A plain file source over f (owned from then on) whose index the caller
 * built, entries with absolute offsets in f (idx taken over, emptied): the
 * files of a DCP checkpoint, indexed chunk by chunk. */
int ckptio_plain_with_index(ckptio_ctx *ctx, const ckptio_options *opts, ckptio_rfile *f, ckptio_index *idx, char *err,
                            ckptio_source **out);
/* The index of the PyTorch archive f, an object of a storage (no map):
 * ranged reads through its read verb, several at once on pool, then the
 * mapped file's parse (load/torch_object.c) with `flags`
 * (CKPTIO_TORCH_RECORDS or 0). @return 0 or a code, err set. */
int ckptio_torch_index_object(const ckptio_rfile *f, ckptio_pool *pool, unsigned flags, ckptio_index *idx,
                              char *err);
/* torch.distributed.checkpoint's format: `path` a directory holding
 * .metadata (or the .metadata file itself). @return 1 and *out, 0 when the
 * path is no DCP checkpoint, or a code with the message in err. */
int ckptio_dcp_open(ckptio_ctx *ctx, const ckptio_options *opts, const char *path, char *err, ckptio_source **out);
/* Fills the common part of a source a kind allocated (path is copied). */
int ckptio_source_init(ckptio_source *s, const ckptio_source_ops *ops, ckptio_ctx *ctx, const ckptio_options *opts,
                       const char *path, char *err);

/* member and file of a source that is one file: itself. */
ckptio_source *ckptio_source_member_self(ckptio_source *s, size_t index, size_t *local, size_t *k);
ckptio_source *ckptio_source_file_self(ckptio_source *s, size_t k);
/* The ranges verb of a source made of file sources (a set, a DCP
 * directory): the member's ranges, numbered by the member's file. */
void ckptio_source_ranges_of_member(ckptio_source *s, size_t index, const ckptio_geom *g,
                                    void (*emit)(void *arg, uint32_t file, uint64_t off, uint64_t len), void *arg);

/* The view verb of such a source: the member's view, or a refusal of a
 * tensor stored in `pieces` > 0 pieces (`what`: "parts", "chunks"). */
int ckptio_source_view_of_member(ckptio_source *s, size_t index, size_t pieces, const char *what,
                                 const void **data, uint64_t *nbytes);

/* The context's ring's slot size. */
uint64_t ckptio_source_slot_bytes(const ckptio_source *s);

/* Bytes of the tensor's logical (row-major) layout. */
uint64_t ckptio_entry_view_bytes(const ckptio_entry *e);
/* Element size in bytes (0 for sub-byte dtypes). */
size_t ckptio_entry_elem(const ckptio_entry *e);

#endif
