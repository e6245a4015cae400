/* Reading a checkpoint directory: which step directories are published,
 * whether each is complete (opens) and verified (every CRC), the newest
 * complete one to resume from, and the listing. Nothing here writes. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "manage/manage.h"

int mgr_content_error(const ckptio_manager *m, int code) {
  /* On a storage a short read or a refused request may be the network's or
   * the server's (a connection dropped past the retries, a 4xx answered to
   * a passing state), not the checkpoint's: only what its bytes say is. */
  if (m->place->transport_errors && (code == CKPTIO_E_SHORT_IO || code == CKPTIO_E_INVALID_ARG)) return 0;
  return code <= CKPTIO_E_INVALID_ARG || code == -ENOENT || code == -ENOTDIR || code == -EISDIR ||
         code == -ELOOP;
}

void mgr_entry_free(mgr_entry *e) {
  free(e->dir);
  free(e->path);
  free(e->detail);
  memset(e, 0, sizeof(*e));
}

/* The file a checkpoint is opened by, whatever the manager's options are
 * now (a directory may hold checkpoints saved with other options). */
const char *const mgr_files[MGR_NFILES] = {MGR_SET_PREFIX ".safetensors.index.json", "model.safetensors", "model.pt",
                                           "model.safetensors.zst"};

int mgr_check(ckptio_manager *m, uint64_t step, int verify, mgr_entry *e) {
  memset(e, 0, sizeof(*e));
  e->step = step;
  char name[MGR_STEP_NAME_MAX];
  mgr_step_name(step, name, sizeof(name));
  char detail[CKPTIO_ERRLEN] = "";
  size_t dl = strlen(m->dir) + strlen(name) + 2;
  e->dir = malloc(dl);
  if (!e->dir) goto fail;
  snprintf(e->dir, dl, "%s/%s", m->dir, name);

  const char *file = NULL;
  char found[64] = "";
  if (m->place->locate(m, step, e, found, sizeof(found), detail, sizeof(detail)) < 0) goto fail;
  if (found[0]) file = found;
  size_t pl = file ? strlen(e->dir) + strlen(file) + 2 : 1;
  e->path = malloc(pl);
  if (!e->path) goto fail;
  if (file)
    snprintf(e->path, pl, "%s/%s", e->dir, file);
  else
    e->path[0] = '\0';

  if (file) {
    ckptio_reader *r = NULL;
    /* The caller's ckptio_last_open_error is not this call's to change. */
    char keep[CKPTIO_ERRLEN];
    snprintf(keep, sizeof(keep), "%s", ckptio_last_open_error());
    int rc = ckptio_reader_open(m->ctx, e->path, &m->opts, &r);
    if (rc < 0) snprintf(detail, sizeof(detail), "%s", ckptio_last_open_error());
    ckptio_set_open_error(keep);
    if (rc < 0) {
      e->error = rc;
    } else {
      e->complete = 1;
      if (verify) {
        rc = ckptio_reader_verify(r, NULL);
        if (rc < 0) {
          e->error = rc;
          snprintf(detail, sizeof(detail), "%s", ckptio_reader_last_error(r));
        } else {
          e->verified = 1;
        }
      }
      ckptio_reader_close(r);
    }
  }
  e->detail = strdup(detail);
  if (!e->detail) goto fail;
  return 0;
fail:
  mgr_entry_free(e);
  return -ENOMEM;
}

static void set_err(ckptio_manager *m, int code, const char *what) {
  ckptio_err_fmt(m->err, sizeof(m->err), code, "%s: %s: %s", m->dir, what,
                 m->why[0] ? m->why : ckptio_strerror(code));
}

int ckptio_manager_latest(ckptio_manager *m, uint64_t *step, char *path, size_t len) {
  if (!m || (!path && len)) return CKPTIO_E_INVALID_ARG;
  m->err[0] = m->why[0] = '\0';
  uint64_t *steps;
  int64_t n = m->place->scan_steps(m, &steps);
  if (n < 0) {
    set_err(m, (int)n, "cannot list the directory");
    return (int)n;
  }
  char record[256];
  int have_record = m->place->read_latest(m, record, sizeof(record));
  int rc = 0;
  mgr_entry e;
  memset(&e, 0, sizeof(e));
  for (int64_t i = n - 1; i >= 0; i--) {
    rc = mgr_check(m, steps[i], m->mo.verify, &e);
    if (rc < 0) break;
    if (e.complete && (!m->mo.verify || e.verified)) {
      rc = 1;
      break;
    }
    mgr_warn(m, e.step, e.error, "skipping checkpoint %s: %s (%s)", e.dir,
             e.complete ? "verification failed" : "incomplete", e.detail);
    mgr_entry_free(&e);
  }
  free(steps);
  if (rc < 0) {
    set_err(m, rc, "cannot check the checkpoints");
    return rc;
  }
  char want[MGR_STEP_NAME_MAX] = "";
  if (rc == 1) mgr_step_name(e.step, want, sizeof(want));
  if (have_record < 0)
    mgr_warn(m, e.step, have_record, "%s/" MGR_LATEST " cannot be read (%s); the directory was scanned",
             m->dir, ckptio_strerror(have_record));
  else if (have_record == 0 && n > 0)
    mgr_warn(m, e.step, -ENOENT, "%s/" MGR_LATEST " is missing; the directory was scanned", m->dir);
  else if (have_record == 1 && strcmp(record, want) != 0)
    mgr_warn(m, e.step, 0, "%s/" MGR_LATEST " names \"%s\", but the newest complete checkpoint is %s",
             m->dir, record, rc == 1 ? want : "none");
  if (rc == 1) {
    if (path && strlen(e.path) + 1 > len) {
      rc = ckptio_err_fmt(m->err, sizeof(m->err), CKPTIO_E_BUFFER_TOO_SMALL,
                          "%s: the path needs %zu bytes, the buffer has %zu", e.path, strlen(e.path) + 1,
                          len);
    } else {
      if (step) *step = e.step;
      if (path) memcpy(path, e.path, strlen(e.path) + 1);
    }
    mgr_entry_free(&e);
  }
  return rc;
}

static void free_list(ckptio_manager *m) {
  for (size_t i = 0; i < m->nlist; i++) mgr_entry_free(&m->list[i]);
  free(m->list);
  m->list = NULL;
  m->nlist = 0;
}

int64_t ckptio_manager_list(ckptio_manager *m, int verify) {
  if (!m) return CKPTIO_E_INVALID_ARG;
  m->err[0] = m->why[0] = '\0';
  free_list(m);
  uint64_t *steps;
  int64_t n = m->place->scan_steps(m, &steps);
  if (n < 0) {
    set_err(m, (int)n, "cannot list the directory");
    return n;
  }
  m->list = calloc(n ? (size_t)n : 1, sizeof(*m->list));
  int rc = m->list ? 0 : -ENOMEM;
  for (int64_t i = 0; i < n && rc == 0; i++) {
    rc = mgr_check(m, steps[i], verify, &m->list[i]);
    if (rc == 0) m->nlist++;
  }
  free(steps);
  if (rc < 0) {
    free_list(m);
    set_err(m, rc, "cannot check the checkpoints");
    return rc;
  }
  return (int64_t)m->nlist;
}

int ckptio_manager_checkpoint(const ckptio_manager *m, size_t i, ckptio_checkpoint_info *out) {
  if (!m || !out || i >= m->nlist) return CKPTIO_E_INVALID_ARG;
  const mgr_entry *e = &m->list[i];
  ckptio_checkpoint_info c = CKPTIO_CHECKPOINT_INFO_INIT;
  c.step = e->step;
  c.dir = e->dir;
  c.path = e->path;
  c.bytes = e->bytes;
  c.files = e->files;
  c.complete = e->complete;
  c.verified = e->verified;
  c.error = e->error;
  c.detail = e->detail;
  return ckptio_sized_out(out, &c, sizeof(c), "ckptio_checkpoint_info", NULL, 0);
}
