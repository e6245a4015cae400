/* What the manager's rooms share about directories: names of step
 * directories and temporaries, the step directories of a directory,
 * removal of a whole tree, syncs and warnings. Everything is relative to a
 * directory's descriptor, so a renamed or remounted path cannot redirect a
 * removal. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/hold.h"
#include "core/nameset.h"
#include "manage/manage.h"

void mgr_step_name(uint64_t step, char *buf, size_t len) { snprintf(buf, len, "step-%08" PRIu64, step); }

int mgr_parse_step(const char *name, uint64_t *step) {
  if (strncmp(name, "step-", 5) != 0) return 0;
  const char *d = name + 5;
  size_t n = strlen(d);
  if (n < 8 || n > 20) return 0;
  for (size_t i = 0; i < n; i++)
    if (d[i] < '0' || d[i] > '9') return 0;
  errno = 0;
  unsigned long long v = strtoull(d, NULL, 10);
  if (errno) return 0;
  /* Only the canonical spelling: "step-1" and "step-00000001" would
   * otherwise be two checkpoints of one step. */
  char canon[MGR_STEP_NAME_MAX];
  mgr_step_name((uint64_t)v, canon, sizeof(canon));
  if (strcmp(canon, name) != 0) return 0;
  *step = (uint64_t)v;
  return 1;
}

void mgr_tmp_name(ckptio_manager *m, const char *what, char *buf, size_t len) {
  snprintf(buf, len, MGR_TMP_PREFIX "%s-%d-%u", what, (int)getpid(), m->serial++);
}

int mgr_sync_dir(ckptio_manager *m) {
  if (!m->sync || m->dirfd < 0) return 0; /* a storage's publish is durable */
  return fsync(m->dirfd) == 0 ? 0 : -errno;
}

void mgr_warn(ckptio_manager *m, uint64_t step, int code, const char *fmt, ...) {
  if (!m->warn) return;
  char msg[CKPTIO_ERRLEN + 256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  m->warn(m->warn_arg, step, code, msg);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int64_t mgr_step_dirs(int at, const char *name, uint64_t **steps) {
  *steps = NULL;
  DIR *d;
  int orc = mgr_opendir(at, name, 0, &d);
  if (orc < 0) return orc;
  size_t n = 0, cap = 0;
  int64_t rc = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    uint64_t step;
    if (!mgr_parse_step(e->d_name, &step)) continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode)) continue;
    if ((rc = ckptio_array_grow((void **)steps, &cap, n, sizeof(**steps))) < 0) break;
    (*steps)[n++] = step;
  }
  closedir(d);
  if (rc < 0) {
    free(*steps);
    *steps = NULL;
    return rc;
  }
  if (n) qsort(*steps, n, sizeof(**steps), cmp_u64);
  return (int64_t)n;
}

int mgr_opendir(int dirfd, const char *name, int flags, DIR **out) {
  int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | flags);
  if (fd < 0) return -errno;
  if (!(*out = fdopendir(fd))) {
    int rc = -errno;
    close(fd);
    return rc;
  }
  return 0;
}

static int remove_at(int at, const char *name, int depth, ckptio_held *held) {
  int fd = held ? ckptio_hold_blocks(at, name) : -1;
  if (unlinkat(at, name, 0) == 0) {
    if (held) ckptio_held_add(held, fd);
    return 0;
  }
  int err = errno;
  if (fd >= 0) close(fd);
  errno = err;
  if (errno != EISDIR && errno != EPERM) return errno == ENOENT ? 0 : -errno;
  if (depth > 4) return -ELOOP; /* the manager makes one level; more is not ours */
  DIR *d;
  int rc = mgr_opendir(at, name, O_NOFOLLOW, &d);
  if (rc < 0) return rc;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    int r = remove_at(dirfd(d), e->d_name, depth + 1, held);
    if (r < 0 && rc == 0) rc = r;
  }
  closedir(d);
  if (rc == 0 && unlinkat(at, name, AT_REMOVEDIR) != 0 && errno != ENOENT) rc = -errno;
  return rc;
}

int mgr_remove_tree(int dirfd, const char *name, ckptio_held *held) { return remove_at(dirfd, name, 0, held); }
