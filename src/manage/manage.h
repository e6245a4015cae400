/* The checkpoint manager's private interface: the handle, the names it gives
 * step directories and temporaries, and the directory operations the save
 * and the scan share. Built on the public API only: a local directory
 * through the system's calls, a storage's prefix ("s3://bucket/ckpts")
 * through the verbs ckptio_ctx_storage hands out (objects.c). */
#ifndef CKPTIO_MANAGE_MANAGE_H
#define CKPTIO_MANAGE_MANAGE_H

#include <dirent.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "ckptio.h"
#include "core/error.h"
#include "core/hold.h"
#include "core/options.h"
#include "core/sized.h"

/* Every hidden entry the manager creates starts with this, and a save
 * removes only entries that do. */
#define MGR_TMP_PREFIX ".ckptio-mgr-"
#define MGR_LATEST "latest"
#define MGR_STEP_NAME_MAX 32
/* The prefix of a set the manager saves: its shards are named by
 * core/shardname.h after it, and its index is mgr_files[0]. */
#define MGR_SET_PREFIX "model"

/* The file a checkpoint is opened by, in this order of precedence (a step
 * may hold checkpoints saved with other options): a set's index first. */
extern const char *const mgr_files[];
#define MGR_NFILES 4

/* One step directory as checked by a scan. */
typedef struct mgr_entry {
  uint64_t step;
  char *dir;     /* DIR/step-N */
  char *path;    /* what ckptio_reader_open takes; "" when none was found */
  char *detail;  /* why not complete / verified, or "" */
  uint64_t bytes;
  uint32_t files;
  int complete, verified, error;
} mgr_entry;

/* Where a manager's checkpoints live: a local directory (local.c) or a
 * storage's prefix (objects.c). The manager's flow (manager.c, scan.c) is
 * the same for both and calls through its place for what differs. Each
 * verb returns 0 (or a count) or a negative code with the cause in
 * m->why, unless it says otherwise. */
typedef struct mgr_place {
  /* The published steps, ascending (malloc'd into *steps). */
  int64_t (*scan_steps)(ckptio_manager *m, uint64_t **steps);
  /* e->files and e->bytes of step, and the name of its checkpoint's file
   * in file ("" with e->error and detail when there is none). @return 0 or
   * -ENOMEM only. */
  int (*locate)(ckptio_manager *m, uint64_t step, mgr_entry *e, char *file, size_t flen, char *detail,
                size_t dlen);
  /* Replaces DIR/latest with content, atomically. */
  int (*write_latest)(ckptio_manager *m, const char *content);
  /* The step name DIR/latest records, into buf: 1, or 0 when there is none. */
  int (*read_latest)(ckptio_manager *m, char *buf, size_t len);
  /* Readies the save of step: the name under DIR its writer saves into,
   * into sub. The cause of a failure is in m->err. */
  int (*begin_save)(ckptio_manager *m, uint64_t step, char *sub, size_t len);
  /* The save of step is durable as `file`: make it the step's checkpoint.
   * The cause of a failure is in m->err. */
  int (*publish)(ckptio_manager *m, uint64_t step, const char *file);
  /* The save is over, published or not: what begin_save took, released;
   * the files removed, held in held when given. */
  void (*end_save)(ckptio_manager *m, ckptio_held *held);
  /* Removes step's checkpoint (retention); its files held in held. */
  int (*remove_step)(ckptio_manager *m, uint64_t step, ckptio_held *held);
  /* 1: a short read or a refused request may be the transport's (a
   * network, a server passing through a state), not the checkpoint's. */
  int transport_errors;
} mgr_place;

extern const mgr_place mgr_local_place, mgr_object_place;

struct ckptio_manager {
  ckptio_ctx *ctx;
  char *dir;
  const mgr_place *place;    /* local.c or objects.c */
  int dirfd;                 /* DIR, for the *at() calls and the save lock; -1 on a storage */
  const ckptio_storage_ops *st; /* the storage DIR is a prefix of, or NULL: a local directory */
  void *st_self;
  ckptio_manager_options mo;
  ckptio_options opts;
  int sync;                  /* fsync DIR after renames */
  ckptio_manager_warn_fn warn;
  void *warn_arg;
  ckptio_writer *w;          /* the open save, or NULL */
  uint64_t w_step;
  char *w_tmp;               /* its temporary directory's name in DIR */
  unsigned serial;           /* makes this process's temporary names unique */
  mgr_entry *list;           /* the last list */
  size_t nlist;
  char err[CKPTIO_ERRLEN];
  char why[CKPTIO_ERRLEN];   /* the cause of the last failed directory or storage call */
  ckptio_closer closer;      /* the files of removed steps; the next retention
                                and ckptio_manager_close wait for it */
};

/* "step-00001000". */
void mgr_step_name(uint64_t step, char *buf, size_t len);
/* 1 and *step when `name` is the canonical name of a step directory, else 0. */
int mgr_parse_step(const char *name, uint64_t *step);

/* Checks step directory `step`: files, bytes, reader open, and with verify
 * every CRC. Fills *e (free with mgr_entry_free). @return 0 or -ENOMEM. */
int mgr_check(ckptio_manager *m, uint64_t step, int verify, mgr_entry *e);
void mgr_entry_free(mgr_entry *e);
/* 1 when a failed check says something about the checkpoint itself (a
 * library code, a missing file), 0 when it may be the machine's (memory,
 * descriptors) or, on a storage, the network's: such a checkpoint is never
 * removed. */
int mgr_content_error(const ckptio_manager *m, int code);

/* The steps of the canonically named step directories in name under at
 * (a directory's fd, or AT_FDCWD), ascending (malloc'd into *steps; free
 * it). @return the count or -errno. */
int64_t mgr_step_dirs(int at, const char *name, uint64_t **steps);
/* fdopendir of name under dirfd (O_DIRECTORY | O_CLOEXEC | flags); @return 0 or -errno. */
int mgr_opendir(int dirfd, const char *name, int flags, DIR **out);
/* Removes DIR/name and everything below it (a few levels at most); with
 * `held`, each file stays open there so that its blocks are freed when the
 * manager's closer closes it. @return 0 or -errno. */
int mgr_remove_tree(int dirfd, const char *name, ckptio_held *held);

/* A fresh hidden name "<MGR_TMP_PREFIX><what>-<pid>-<serial>" for this process. */
void mgr_tmp_name(ckptio_manager *m, const char *what, char *buf, size_t len);
/* Reports a warning to the callback, if any. */
void mgr_warn(ckptio_manager *m, uint64_t step, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* fsync of DIR when the options ask for syncs. @return 0 or -errno. */
int mgr_sync_dir(ckptio_manager *m);

/* One object under DIR/step-N/ of a storage: its step and its name below
 * the step (objects.c; the manager's and the storage tier's). */
typedef struct mgr_obj {
  uint64_t step;
  char *name;
  uint64_t size;
} mgr_obj;

typedef struct mgr_objs {
  mgr_obj *v;
  size_t n, cap;
  const char *base; /* "DIR/", while listing */
  size_t blen;
} mgr_objs;

/* The objects DIR/step-N/NAME of a storage whose paths start with `prefix`
 * ("DIR/step-", "DIR/step-N/", "DIR/"), sorted by step and name, into *o
 * (free with mgr_objs_free). @return 0 or the list verb's code, with its
 * sentence in err (errlen bytes). */
int mgr_objs_list(const ckptio_storage_ops *st, void *self, const char *dir, const char *prefix, mgr_objs *o,
                  char *err, size_t errlen);
void mgr_objs_free(mgr_objs *o);

/* objects.c, the storage's place: one listing request for DIR/latest, so
 * that the storage answers (bucket, credentials) before the manager is
 * handed out. @return 0 or a code with the cause in m->why. */
int mgr_obj_probe(ckptio_manager *m);

#endif
