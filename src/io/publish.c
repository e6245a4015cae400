/* Publishing a set of temp files: sync, exchange into place, undo. The
 * exchange (renameat2 RENAME_EXCHANGE) is what makes a half-published set
 * repairable: the old file is never unlinked until the caller says the set
 * is final, so a failure at the k-th rename can put files 1..k-1 back. */
#include "io/publish.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "ckptio.h"
#include "core/error.h"
#include "core/hold.h"
#include "core/shardname.h"
#include "io/fault.h"

int ckptio_tmpfile_sync(ckptio_tmpfile *t, uint64_t size, int sync, char *err, size_t errlen) {
  if (t->store) return 0; /* an object's bytes are the storage's until publish makes them durable */
  if (ftruncate(t->fd, (off_t)size) < 0)
    return ckptio_err_fmt(err, errlen, -errno, "%s: truncate to %llu bytes: %s", t->path,
                          (unsigned long long)size, ckptio_errno_text(errno));
  if (!sync) return 0;
  int inject = ckptio_fault_check(CKPTIO_FAULT_FSYNC);
  if (inject || fdatasync(t->fd) < 0) {
    int e = inject ? inject : errno;
    return ckptio_err_fmt(err, errlen, -e, "%s: fdatasync: %s", t->path, ckptio_errno_text(e));
  }
  return 0;
}

int ckptio_tmpfile_swap_in(ckptio_tmpfile *t, ckptio_swap *how, char *err, size_t errlen) {
  *how = CKPTIO_SWAP_NONE;
  int inject = ckptio_fault_check(CKPTIO_FAULT_RENAME);
  if (inject)
    return ckptio_err_fmt(err, errlen, -inject, "%s: rename from temp file: %s", t->path, ckptio_errno_text(inject));
  /* A concurrent save of the same name may publish between our two tries:
   * then the exchange is tried again (the last to publish wins). */
  for (int tries = 0; tries < 8; tries++) {
    if (renameat2(AT_FDCWD, t->tmp, AT_FDCWD, t->path, RENAME_EXCHANGE) == 0) {
      *how = CKPTIO_SWAP_EXCHANGED;
      return 0;
    }
    if (errno != ENOENT || access(t->tmp, F_OK) != 0) break;
    /* Nothing at the final path yet. NOREPLACE: if one appears meanwhile we
     * fail rather than destroy it without a way back. */
    int ok = renameat2(AT_FDCWD, t->tmp, AT_FDCWD, t->path, RENAME_NOREPLACE) == 0;
    /* NFS and older FUSE know no rename flags: nothing was there a moment
     * ago, so a plain rename is the same thing but for that moment. */
    if (!ok && (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) ok = rename(t->tmp, t->path) == 0;
    if (ok) {
      *how = CKPTIO_SWAP_NEW;
      return 0;
    }
    if (errno != EEXIST) break;
  }
  if (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP) {
    /* No exchange on this filesystem: a plain rename, which a later
     * failure cannot undo (the reader's save-id check still catches it). */
    if (rename(t->tmp, t->path) == 0) {
      *how = CKPTIO_SWAP_REPLACED;
      return 0;
    }
  }
  return ckptio_err_fmt(err, errlen, -errno, "%s: rename from temp file: %s", t->path, ckptio_errno_text(errno));
}

void ckptio_tmpfile_swap_back(ckptio_tmpfile *t, ckptio_swap how) {
  if (how == CKPTIO_SWAP_EXCHANGED) {
    /* Puts the old file back (the new one goes to tmp). If that fails, tmp
     * still holds the old file: keep it under its hidden name rather than
     * delete the last copy of it. */
    if (renameat2(AT_FDCWD, t->tmp, AT_FDCWD, t->path, RENAME_EXCHANGE) != 0) {
      free(t->tmp);
      t->tmp = NULL;
    }
  } else if (how == CKPTIO_SWAP_NEW) {
    unlink(t->path);
  }
  ckptio_tmpfile_abort(t); /* unlinks tmp when it still has a name */
}

void ckptio_tmpfile_release(ckptio_tmpfile *t, ckptio_swap how, ckptio_held *held) {
  if (held && how == CKPTIO_SWAP_EXCHANGED && t->tmp) ckptio_held_add(held, ckptio_hold_blocks(AT_FDCWD, t->tmp));
  if (how != CKPTIO_SWAP_EXCHANGED) {
    free(t->tmp); /* renamed away: nothing left under that name */
    t->tmp = NULL;
  }
  ckptio_tmpfile_abort(t); /* an exchange left the old file at tmp: removed */
}

int ckptio_dir_lock(const char *dir, int shared) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  /* A reader waits a bounded time (a publish is renames and a few syncs):
   * a lock held for longer (this process's own manager on the directory,
   * a stuck publisher) must not hang the open, which then reads unlocked. */
  for (int waited_ms = 0; flock(fd, shared ? LOCK_SH | LOCK_NB : LOCK_EX) < 0; waited_ms++) {
    if (errno != EINTR && (errno != EWOULDBLOCK || waited_ms >= 10000)) break;
    if (errno == EWOULDBLOCK) nanosleep(&(struct timespec){0, 1000000}, NULL);
  }
  return fd; /* without the lock where the filesystem has none */
}

void ckptio_dir_unlock(int fd) {
  if (fd >= 0) close(fd); /* drops the lock */
}

int ckptio_dir_sync(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -errno;
  int rc = fsync(fd) < 0 ? -errno : 0;
  close(fd);
  return rc;
}

/* Removes every file of dir whose name `doomed` says so, best effort; with
 * `held`, each is held there first (its blocks freed when it is closed).
 * Temp files (temps) only when no live save holds them (io/file.h). */
static void sweep(const char *dir, int (*doomed)(const char *name, const void *arg), const void *arg,
                  ckptio_held *held, int temps) {
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (!doomed(e->d_name, arg)) continue;
    if (temps) {
      ckptio_tmpfile_unclaimed(dirfd(d), e->d_name);
      continue;
    }
    if (held) ckptio_held_add(held, ckptio_hold_blocks(dirfd(d), e->d_name));
    unlinkat(dirfd(d), e->d_name, 0);
  }
  if (d) closedir(d);
}

typedef struct set_names {
  const char *prefix;
  size_t nshards;
} set_names;

/* "{prefix}-KKKKK-of-MMMMM.safetensors" exactly (core/shardname.h's local
 * name), with MMMMM not ours. */
static int stale_shard(const char *n, const void *arg) {
  const set_names *s = arg;
  ckptio_shardname f;
  const char *rest = ckptio_shardname_parse(n, s->prefix, &f);
  return rest && !*rest && !f.id && f.n != s->nshards;
}

/* Shards of an earlier save with another count are stale once a set is
 * published: nothing refers to them any more. Removed as transformers'
 * save_pretrained does; only names exactly of the pattern. */
void ckptio_remove_stale_shards(const char *dir, const char *prefix, size_t nshards, ckptio_held *held) {
  set_names s = {prefix, nshards};
  sweep(dir, stale_shard, &s, held, 0);
}

/* ".{prefix}-KKKKK-of-MMMMM.safetensors.ckptio-tmp-*" or
 * ".{prefix}.safetensors.index.json.ckptio-tmp-*" (io/file.c's temp names). */
static int set_temp(const char *n, const void *arg) {
  const set_names *s = arg;
  size_t plen = strlen(s->prefix);
  if (n[0] != '.' || strncmp(n + 1, s->prefix, plen)) return 0;
  ckptio_shardname f;
  const char *shard = ckptio_shardname_parse(n + 1, s->prefix, &f);
  if (shard && !f.id && !strncmp(shard, ".ckptio-tmp-", 12)) return 1;
  return !strncmp(n + 1 + plen, ".safetensors.index.json.ckptio-tmp-", 35);
}

void ckptio_remove_stray_temps(const char *dir, const char *prefix) {
  set_names s = {prefix, 0};
  sweep(dir, set_temp, &s, NULL, 1);
}

static int file_temp(const char *n, const void *arg) {
  const char *want = arg;
  return !strncmp(n, want, strlen(want));
}

void ckptio_remove_stray_temps_of(const char *path) {
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  char dir[4096], want[4096];
  snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash == path ? 1 : slash - path) : 1, slash ? path : ".");
  int n = snprintf(want, sizeof(want), ".%s.ckptio-tmp-", base);
  if (n > 0 && (size_t)n < sizeof(want)) sweep(dir, file_temp, want, NULL, 1);
}
