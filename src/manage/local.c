/* A manager's checkpoints in a local directory (the place verbs of
 * manage.h): step directories, each saved into a hidden temporary one under
 * the directory's lock and renamed to its step name once durable, the
 * `latest` record replaced by rename, and removals hidden first by rename.
 * Everything is relative to DIR's descriptor, so a renamed or remounted
 * path cannot redirect a removal. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "manage/manage.h"

static int64_t scan_steps(ckptio_manager *m, uint64_t **steps) {
  int64_t rc = mgr_step_dirs(m->dirfd, ".", steps);
  if (rc < 0) snprintf(m->why, sizeof(m->why), "%s", ckptio_errno_text((int)-rc));
  return rc;
}

/* The step directory's regular files, and the first of mgr_files present. */
static int locate(ckptio_manager *m, uint64_t step, mgr_entry *e, char *file, size_t flen, char *detail,
                  size_t dlen) {
  char name[MGR_STEP_NAME_MAX];
  mgr_step_name(step, name, sizeof(name));
  int fd = openat(m->dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    e->error = -errno;
    snprintf(detail, dlen, "%s: %s", e->dir, ckptio_errno_text(errno));
    return 0;
  }
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return -ENOMEM;
  }
  struct dirent *de;
  struct stat st;
  while ((de = readdir(d)) != NULL) {
    if (fstatat(fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    e->files++;
    e->bytes += (uint64_t)st.st_size;
  }
  for (size_t i = 0; i < MGR_NFILES && !*file; i++)
    if (fstatat(fd, mgr_files[i], &st, 0) == 0 && S_ISREG(st.st_mode)) snprintf(file, flen, "%s", mgr_files[i]);
  closedir(d);
  if (!*file) {
    e->error = -ENOENT;
    snprintf(detail, dlen, "%s: no model.safetensors[.index.json], model.pt or model.safetensors.zst in it",
             e->dir);
  }
  return 0;
}

/* DIR/latest replaced: temp file, fsync, rename, fsync DIR. */
static int replace_latest(ckptio_manager *m, const char *content) {
  char tmp[128];
  mgr_tmp_name(m, "latest", tmp, sizeof(tmp));
  int fd = openat(m->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) return -errno;
  size_t n = strlen(content);
  int rc = 0;
  ssize_t wr = write(fd, content, n);
  if (wr < 0)
    rc = -errno;
  else if ((size_t)wr != n)
    rc = -EIO;
  if (rc == 0 && m->sync && fdatasync(fd) != 0) rc = -errno;
  if (close(fd) != 0 && rc == 0) rc = -errno;
  if (rc == 0 && renameat(m->dirfd, tmp, m->dirfd, MGR_LATEST) != 0) rc = -errno;
  if (rc < 0) {
    unlinkat(m->dirfd, tmp, 0);
    return rc;
  }
  return mgr_sync_dir(m);
}

static int write_latest(ckptio_manager *m, const char *content) {
  int rc = replace_latest(m, content);
  if (rc < 0) snprintf(m->why, sizeof(m->why), "%s", ckptio_errno_text(-rc));
  return rc;
}

static int read_latest(ckptio_manager *m, char *buf, size_t len) {
  int fd = openat(m->dirfd, MGR_LATEST, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? 0 : -errno;
  ssize_t n = read(fd, buf, len - 1);
  int rc = n < 0 ? -errno : 1;
  close(fd);
  if (rc < 0) {
    snprintf(m->why, sizeof(m->why), "%s", ckptio_errno_text(-rc));
    return rc;
  }
  buf[n] = '\0';
  buf[strcspn(buf, "\r\n")] = '\0';
  return 1;
}

/* Entries of a killed save (or removal) of this manager's kind. The lock
 * is held, so no live save of another process owns them. */
static int remove_strays(ckptio_manager *m) {
  DIR *d;
  int orc = mgr_opendir(m->dirfd, ".", 0, &d);
  if (orc < 0) return orc;
  int rc = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, MGR_TMP_PREFIX, strlen(MGR_TMP_PREFIX)) != 0) continue;
    int r = mgr_remove_tree(m->dirfd, e->d_name, NULL);
    if (r < 0 && rc == 0) {
      rc = r;
      ckptio_err_fmt(m->err, sizeof(m->err), r, "%s/%s: cannot remove this temporary: %s", m->dir, e->d_name,
                     ckptio_errno_text(-r));
    }
  }
  closedir(d);
  return rc;
}

/* Under DIR's lock (one saving process at a time), after the strays of
 * killed saves: a fresh hidden directory. The lock is dropped by end_save. */
static int begin_save(ckptio_manager *m, uint64_t step, char *sub, size_t len) {
  if (flock(m->dirfd, LOCK_EX | LOCK_NB) != 0) {
    int rc = errno == EWOULDBLOCK ? -EBUSY : -errno;
    return ckptio_err_fmt(m->err, sizeof(m->err), rc, "%s: another save holds the directory's lock (%s)",
                          m->dir, ckptio_errno_text(-rc));
  }
  int rc = remove_strays(m);
  if (rc < 0) return rc;
  char what[64], tmp[128];
  snprintf(what, sizeof(what), "tmp-step-%08" PRIu64, step);
  mgr_tmp_name(m, what, tmp, sizeof(tmp));
  if (mkdirat(m->dirfd, tmp, 0777) != 0)
    return ckptio_err_fmt(m->err, sizeof(m->err), -errno, "%s/%s: cannot create: %s", m->dir, tmp,
                          ckptio_errno_text(errno));
  if (!(m->w_tmp = strdup(tmp))) return ckptio_err_fmt(m->err, sizeof(m->err), -ENOMEM, "%s: out of memory", m->dir);
  snprintf(sub, len, "%s", tmp);
  return 0;
}

/* Moves the durable temporary directory to its step name; an existing
 * checkpoint of that step is exchanged with it and then removed. */
static int publish(ckptio_manager *m, uint64_t step, const char *file) {
  (void)file; /* the directory holds it */
  char name[MGR_STEP_NAME_MAX];
  mgr_step_name(step, name, sizeof(name));
  if (renameat2(m->dirfd, m->w_tmp, m->dirfd, name, RENAME_NOREPLACE) == 0) goto published;
  if (errno == EINVAL || errno == ENOSYS) {
    if (renameat(m->dirfd, m->w_tmp, m->dirfd, name) == 0) goto published;
  }
  if (errno != EEXIST && errno != ENOTEMPTY)
    return ckptio_err_fmt(m->err, sizeof(m->err), -errno, "%s: cannot rename %s to %s: %s", m->dir, m->w_tmp, name,
                          ckptio_errno_text(errno));
  /* A checkpoint of this step exists: the old one takes the temporary name,
   * so a crash from here on leaves it a stray for the next save. */
  if (renameat2(m->dirfd, m->w_tmp, m->dirfd, name, RENAME_EXCHANGE) != 0) {
    if (errno != EINVAL && errno != ENOSYS)
      return ckptio_err_fmt(m->err, sizeof(m->err), -errno, "%s: cannot exchange %s with %s: %s", m->dir,
                            m->w_tmp, name, ckptio_errno_text(errno));
    char old[128];
    mgr_tmp_name(m, "del-old", old, sizeof(old));
    if (renameat(m->dirfd, name, m->dirfd, old) != 0 || renameat(m->dirfd, m->w_tmp, m->dirfd, name) != 0)
      return ckptio_err_fmt(m->err, sizeof(m->err), -errno, "%s: cannot replace %s: %s", m->dir, name,
                            ckptio_errno_text(errno));
    free(m->w_tmp);
    m->w_tmp = strdup(old); /* removed by end_save; a stray if that fails */
    return mgr_sync_dir(m);
  }
  return mgr_sync_dir(m); /* the old checkpoint, now at w_tmp, goes in end_save */
published:
  free(m->w_tmp);
  m->w_tmp = NULL;
  return mgr_sync_dir(m);
}

/* The open save is over, published or not: removes its temporary directory
 * (an unpublished save's, or the older copy of the step that publish
 * exchanged out; gone otherwise), its files held in `held` when given, and
 * drops the lock. */
static void end_save(ckptio_manager *m, ckptio_held *held) {
  if (m->w_tmp) mgr_remove_tree(m->dirfd, m->w_tmp, held);
  free(m->w_tmp);
  m->w_tmp = NULL;
  flock(m->dirfd, LOCK_UN);
}

/* Hidden first: a removal cut short leaves a stray, never a step directory
 * with some files gone. The rename is made durable before the files go: a
 * filesystem may persist their unlinks first. */
static int remove_step(ckptio_manager *m, uint64_t step, ckptio_held *held) {
  char name[MGR_STEP_NAME_MAX], del[128], what[64];
  mgr_step_name(step, name, sizeof(name));
  snprintf(what, sizeof(what), "del-step-%08" PRIu64, step);
  mgr_tmp_name(m, what, del, sizeof(del));
  int r = renameat(m->dirfd, name, m->dirfd, del) == 0 ? mgr_sync_dir(m) : -errno;
  if (r == 0) r = mgr_remove_tree(m->dirfd, del, held);
  if (r < 0) snprintf(m->why, sizeof(m->why), "%s", ckptio_errno_text(-r));
  return r;
}

const mgr_place mgr_local_place = {
    .scan_steps = scan_steps,
    .locate = locate,
    .write_latest = write_latest,
    .read_latest = read_latest,
    .begin_save = begin_save,
    .publish = publish,
    .end_save = end_save,
    .remove_step = remove_step,
    .transport_errors = 0,
};
