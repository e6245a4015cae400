/* What a tier directory holds (tiers.h): step directories named as the
 * manager names them, each rank's part and the copies it holds as
 * safetensors files, and the marks that publish a step. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/nameset.h"
#include "core/shardname.h"
#include "manage/manage.h"
#include "manage/tiers.h"

int tiers_path(char *buf, size_t len, const char *dir, uint64_t step, const char *what, int r) {
  char name[MGR_STEP_NAME_MAX];
  mgr_step_name(step, name, sizeof(name));
  int n = what ? snprintf(buf, len, "%s/%s/%s-%05d.safetensors", dir, name, what, r)
               : snprintf(buf, len, "%s/%s", dir, name);
  return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

int tiers_mark_path(char *buf, size_t len, const char *dir, uint64_t step, const char *mark) {
  char name[MGR_STEP_NAME_MAX];
  mgr_step_name(step, name, sizeof(name));
  int n = snprintf(buf, len, "%s/%s/%s", dir, name, mark);
  return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* Rank r's file of the multi-rank checkpoint in the storage's step-N, as
 * its index names it (a storage's names carry the save's id). */
static int storage_ranks_file(ckptio_tiers *t, uint64_t step, int r, char *buf, size_t len) {
  char dir[4096];
  ckptio_reader *rd = NULL;
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  ckptio_ctx_options(t->ctx, &o);
  o.crc = 0;
  int rc = tiers_path(dir, sizeof(dir), t->o.storage_dir, step, NULL, 0);
  if (rc < 0 || (rc = ckptio_reader_open(t->ctx, dir, &o, &rd)) < 0) return rc;
  const char *path = NULL;
  if (ckptio_reader_shard_count(rd) != (size_t)t->comm.nranks || ckptio_reader_shard(rd, (size_t)r, &path, NULL, NULL))
    rc = -ENOENT;
  else if (snprintf(buf, len, "%s", path) >= (int)len)
    rc = -ENAMETOOLONG;
  ckptio_reader_close(rd);
  return rc;
}

int tiers_part_path(ckptio_tiers *t, int tier, uint64_t step, int r, char *buf, size_t len) {
  const char *dir = tiers_dir(t, tier);
  int rc = tiers_path(buf, len, dir, step, "rank", r);
  if (rc < 0 || tier < CKPTIO_TIER_DURABLE) return rc;
  if (tier == CKPTIO_TIER_STORAGE ? tiers_obj_size(t, buf) >= 0 : access(buf, F_OK) == 0) return rc;
  if (tier == CKPTIO_TIER_STORAGE) return storage_ranks_file(t, step, r, buf, len);
  char name[MGR_STEP_NAME_MAX], file[64];
  mgr_step_name(step, name, sizeof(name));
  ckptio_shardname_format(file, sizeof(file), TIERS_RANKS_PREFIX, (size_t)r, (size_t)t->comm.nranks, NULL);
  int n = snprintf(buf, len, "%s/%s/%s", dir, name, file);
  return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* mkdir -p: every missing level of path. */
static int make_dirs(const char *path) {
  char p[4096];
  if (snprintf(p, sizeof(p), "%s", path) >= (int)sizeof(p)) return -ENAMETOOLONG;
  for (char *s = p + 1;; s++) {
    char c = *s;
    if (c != '/' && c != '\0') continue;
    *s = '\0';
    if (mkdir(p, 0777) != 0 && errno != EEXIST) return -errno;
    *s = c;
    if (!c) return 0;
  }
}

int tiers_make_step_dir(const char *dir, uint64_t step) {
  char path[4096];
  int rc = make_dirs(dir);
  if (rc < 0) return rc;
  rc = tiers_path(path, sizeof(path), dir, step, NULL, 0);
  if (rc < 0) return rc;
  return mkdir(path, 0777) == 0 || errno == EEXIST ? 0 : -errno;
}

static int sync_path(const char *path, int flags) {
  int fd = open(path, flags | O_CLOEXEC);
  if (fd < 0) return -errno;
  int rc = fsync(fd) == 0 ? 0 : -errno;
  close(fd);
  return rc;
}

int tiers_mark(const char *dir, uint64_t step, const char *mark, int rank, int sync) {
  char path[4096], tmp[4200];
  int rc = tiers_mark_path(path, sizeof(path), dir, step, mark);
  if (rc < 0) return rc;
  /* Ranks sharing the directory mark it at once: a temp name each (ranks
   * may be threads of one process: the pid alone is not enough). */
  snprintf(tmp, sizeof(tmp), "%s.%d.%d.tmp", path, (int)getpid(), rank);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) return -errno;
  char text[64];
  int n = snprintf(text, sizeof(text), "%" PRIu64 "\n", step);
  rc = write(fd, text, (size_t)n) == n ? 0 : -EIO;
  if (rc == 0 && sync && fsync(fd) != 0) rc = -errno;
  close(fd);
  if (rc == 0 && rename(tmp, path) != 0) rc = -errno;
  if (rc < 0) {
    unlink(tmp);
    return rc;
  }
  return sync ? tiers_sync_step_dir(dir, step) : 0;
}

int tiers_sync_step_dir(const char *dir, uint64_t step) {
  char path[4096];
  int rc = tiers_path(path, sizeof(path), dir, step, NULL, 0);
  return rc < 0 ? rc : sync_path(path, O_RDONLY | O_DIRECTORY);
}

int tiers_copy_file(const char *src, const char *dst) {
  enum { PIECE = 8 << 20 };
  int in = open(src, O_RDONLY | O_CLOEXEC), out = -1, rc = 0;
  char *buf = malloc(PIECE);
  if (in < 0 || !buf) rc = in < 0 ? -errno : -ENOMEM;
  if (rc == 0 && (out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666)) < 0) rc = -errno;
  for (off_t off = 0; rc == 0;) {
    ssize_t n = pread(in, buf, PIECE, off);
    if (n < 0) rc = -errno;
    if (n <= 0) break;
    for (ssize_t put = 0; rc == 0 && put < n;) {
      ssize_t w = pwrite(out, buf + put, (size_t)(n - put), off + put);
      if (w < 0) rc = -errno;
      else put += w;
    }
    off += n;
  }
  if (rc == 0 && fsync(out) != 0) rc = -errno;
  if (out >= 0 && close(out) != 0 && rc == 0) rc = -errno;
  if (in >= 0) close(in);
  free(buf);
  return rc;
}

int tiers_marked(const char *dir, uint64_t step, const char *mark) {
  char path[4096];
  return tiers_mark_path(path, sizeof(path), dir, step, mark) == 0 && access(path, F_OK) == 0;
}

long tiers_steps(const char *dir, uint64_t **steps) {
  int64_t n = mgr_step_dirs(AT_FDCWD, dir, steps);
  return n == -ENOENT ? 0 : (long)n;
}

int64_t tiers_file_size(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) return -errno;
  return S_ISREG(st.st_mode) ? (int64_t)st.st_size : -EISDIR;
}

/* On the node's leader, removes step's directory and all in it: the
 * parts, the copies, the marks and what a killed save left (temp files of
 * the writer, the exchange or a mark). Every rank of the node retires the
 * same steps, all of them past any write (retirement follows the second
 * agreement of the current step), so one rank clears them for all. */
static void remove_step(ckptio_tiers *t, const char *dir, uint64_t step) {
  char sdir[4096];
  if (t->leader && tiers_path(sdir, sizeof(sdir), dir, step, NULL, 0) == 0) mgr_remove_tree(AT_FDCWD, sdir, NULL);
}

void tiers_retire(ckptio_tiers *t, const char *dir, int keep, const char *mark, const char *mark2,
                  uint64_t current) {
  uint64_t *steps;
  long n = tiers_steps(dir, &steps);
  if (n <= 0) return;
  int kept = 0;
  for (long i = n - 1; i >= 0; i--) {
    /* A newer step is another rank's save already under way (or a
     * leftover that step's own save will replace): never ours to remove. */
    if (steps[i] > current) continue;
    int marked = tiers_marked(dir, steps[i], mark) || (mark2 && tiers_marked(dir, steps[i], mark2));
    if (steps[i] == current || (marked && kept < keep)) {
      kept += marked;
      continue;
    }
    remove_step(t, dir, steps[i]);
  }
  free(steps);
}

/* 1 and *rank when name is "<what>-RRRRR.safetensors", canonically. */
static int parse_file(const char *name, const char *what, int *rank) {
  size_t n = strlen(what);
  if (strncmp(name, what, n) != 0 || name[n] != '-') return 0;
  char *end;
  long r = strtol(name + n + 1, &end, 10);
  char canon[64];
  snprintf(canon, sizeof(canon), "%s-%05ld.safetensors", what, r);
  if (r < 0 || r > 0x7fffffff || strcmp(canon, name) != 0) return 0;
  *rank = (int)r;
  return 1;
}

int tiers_parse_ranks_file(const char *name, int *rank, int *nranks) {
  ckptio_shardname sn;
  const char *rest = ckptio_shardname_parse(name, TIERS_RANKS_PREFIX, &sn);
  if (!rest || *rest) return 0;
  *rank = (int)sn.k;
  if (nranks) *nranks = (int)sn.n;
  return 1;
}

static int cmp_file(const void *a, const void *b) {
  const ckptio_tiers_file *x = a, *y = b;
  if (x->step != y->step) return x->step < y->step ? -1 : 1;
  if (x->copy != y->copy) return x->copy - y->copy;
  return (x->rank > y->rank) - (x->rank < y->rank);
}

/* The parts and copies of a tier directory's step directories, appended to
 * *out (n of them, cap allocated). @return 0 or a negative code. */
static int list_dir(const char *dir, ckptio_tiers_file **out, size_t *n, size_t *cap) {
  struct stat st;
  if (stat(dir, &st) != 0) return -errno;
  uint64_t *steps;
  long ns = tiers_steps(dir, &steps);
  if (ns < 0) return (int)ns;
  int rc = 0;
  for (long i = 0; i < ns && rc == 0; i++) {
    char sdir[4096];
    tiers_path(sdir, sizeof(sdir), dir, steps[i], NULL, 0);
    DIR *d = opendir(sdir);
    if (!d) continue; /* removed meanwhile */
    int marks[2] = {tiers_marked(dir, steps[i], TIERS_PUBLISHED), tiers_marked(dir, steps[i], TIERS_COPIES)};
    struct dirent *e;
    while (rc == 0 && (e = readdir(d))) {
      int rank, copy;
      if (parse_file(e->d_name, "rank", &rank) || tiers_parse_ranks_file(e->d_name, &rank, NULL)) copy = 0;
      else if (parse_file(e->d_name, "copy", &rank)) copy = 1;
      else continue;
      if ((rc = ckptio_array_grow((void **)out, cap, *n, sizeof(**out))) < 0) break;
      ckptio_tiers_file *f = &(*out)[*n];
      memset(f, 0, sizeof(*f));
      f->step = steps[i], f->rank = rank, f->copy = copy, f->published = marks[copy];
      snprintf(f->path, sizeof(f->path), "%s/%s", sdir, e->d_name);
      int64_t size = tiers_file_size(f->path);
      if (size < 0) continue; /* removed meanwhile */
      f->bytes = (uint64_t)size;
      (*n)++;
    }
    closedir(d);
  }
  free(steps);
  return rc;
}

/* The parts of a storage tier's prefix: its objects STEP/rank-R (and the
 * files of a step saved with places), published by STEP/PUBLISHED; listed
 * through the storage's verbs, as a restore lists them. */
static int list_objects(ckptio_ctx *ctx, const char *dir, ckptio_tiers_file **out, size_t *n, size_t *cap) {
  const ckptio_storage_ops *st;
  void *self;
  char err[CKPTIO_ERRLEN], base[4096];
  if (!ctx) return CKPTIO_E_INVALID_ARG;
  int rc = ckptio_ctx_storage(ctx, dir, &st, &self, err, sizeof(err));
  if (rc < 0) return rc;
  if (!st->list) return -ENOTSUP;
  snprintf(base, sizeof(base), "%s/", dir);
  mgr_objs o;
  if ((rc = mgr_objs_list(st, self, dir, base, &o, err, sizeof(err))) < 0) return rc;
  for (size_t i = 0; i < o.n && rc == 0; i++) {
    int rank;
    if (!parse_file(o.v[i].name, "rank", &rank) && !tiers_parse_ranks_file(o.v[i].name, &rank, NULL)) continue;
    if ((rc = ckptio_array_grow((void **)out, cap, *n, sizeof(**out))) < 0) break;
    ckptio_tiers_file *f = &(*out)[(*n)++];
    memset(f, 0, sizeof(*f));
    f->step = o.v[i].step, f->rank = rank, f->bytes = o.v[i].size;
    f->published = tiers_objs_size(&o, o.v[i].step, TIERS_PUBLISHED) >= 0;
    tiers_path(f->path, sizeof(f->path), dir, o.v[i].step, NULL, 0);
    size_t at = strlen(f->path);
    snprintf(f->path + at, sizeof(f->path) - at, "/%s", o.v[i].name);
  }
  mgr_objs_free(&o);
  return rc;
}

int64_t ckptio_tiers_list(ckptio_ctx *ctx, const char *dir, ckptio_tiers_file **out) {
  if (!dir || !out) return CKPTIO_E_INVALID_ARG;
  *out = NULL;
  size_t n = 0, cap = 0;
  int rc = ckptio_path_scheme(dir) ? list_objects(ctx, dir, out, &n, &cap) : list_dir(dir, out, &n, &cap);
  if (rc < 0 || !n) {
    free(*out);
    *out = NULL;
    return rc < 0 ? rc : 0;
  }
  qsort(*out, n, sizeof(**out), cmp_file);
  return (int64_t)n;
}
