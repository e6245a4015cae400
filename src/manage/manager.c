/* The checkpoint manager: a directory of step directories for a training
 * loop. A save is readied by the manager's place (a local directory:
 * local.c; a storage's prefix: objects.c), written by an ordinary writer,
 * published once durable, recorded in `latest`, and only then are old
 * checkpoints removed (see the manager section of include/ckptio.h for
 * the rules this file keeps). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "manage/manage.h"

/* Ends ckptio_manager_open with a failure: its detail formatted into msg
 * (CKPTIO_ERRLEN bytes) and kept for ckptio_last_open_error. */
#define fail_open(msg, code, ...) \
  ckptio_open_error_end(ckptio_fail((msg), (code), __VA_ARGS__), "ckptio_manager_open", (msg))

int ckptio_manager_open(ckptio_ctx *ctx, const char *dir, const ckptio_manager_options *mopts,
                        const ckptio_options *opts, ckptio_manager **out) {
  ckptio_open_error_clear(); /* an open-type call: see ckptio_last_open_error */
  char msg[CKPTIO_ERRLEN];
  if (out) *out = NULL;
  if (!ctx || !dir || !*dir || !out)
    return fail_open(msg, CKPTIO_E_INVALID_ARG, "ckptio_manager_open: a NULL argument");
  /* Both structs by the rule of versioned structs (core/sized.h): fields
   * past an older caller's size keep the _INIT defaults. */
  char why[CKPTIO_ERRLEN];
  ckptio_manager_options mo = CKPTIO_MANAGER_OPTIONS_INIT;
  if (ckptio_sized_in(mopts, &mo, sizeof(mo), "ckptio_manager_options", why, sizeof(why)) < 0)
    return fail_open(msg, CKPTIO_E_INVALID_ARG, "%s: %s", dir, why);
  ckptio_options o = CKPTIO_OPTIONS_INIT, in_force = CKPTIO_OPTIONS_INIT;
  ckptio_ctx_options(ctx, &in_force);
  if (opts) {
    /* The writers' and readers' own check, at open rather than at the
     * first save: the context-only fields must be the context's. */
    if (ckptio_sized_in(opts, &o, sizeof(o), "ckptio_options", why, sizeof(why)) < 0 ||
        ckptio_options_check(&o, why, sizeof(why)) < 0 ||
        ckptio_options_check_call(&in_force, &o, why, sizeof(why)) < 0)
      return fail_open(msg, CKPTIO_E_INVALID_ARG, "%s: %s", dir, why);
  } else {
    o = in_force;
  }
  if (mo.keep_last < 0) return fail_open(msg, CKPTIO_E_INVALID_ARG, "%s: keep_last < 0", dir);
  if (mo.format != CKPTIO_FORMAT_SAFETENSORS && mo.format != CKPTIO_FORMAT_PYTORCH)
    return fail_open(msg, CKPTIO_E_INVALID_ARG, "%s: unknown format", dir);
  if (mo.max_shard_bytes && mo.format != CKPTIO_FORMAT_SAFETENSORS)
    return fail_open(msg, CKPTIO_E_INVALID_ARG, "%s: a sharded set is safetensors only", dir);
  if (mo.max_shard_bytes && o.compress_level)
    return fail_open(msg, CKPTIO_E_INVALID_ARG, "%s: a sharded set cannot be compressed", dir);
  /* A storage's prefix ("s3://bucket/ckpts") is served by the storage's
   * verbs (objects.c); anything else is a local directory. */
  const ckptio_storage_ops *st = NULL;
  void *st_self = NULL;
  int object = ckptio_ctx_storage(ctx, dir, &st, &st_self, why, sizeof(why));
  if (object < 0) return fail_open(msg, object, "%s", why);
  if (object && !st->list)
    return fail_open(msg, CKPTIO_E_INVALID_ARG,
                     "%s: its storage has no list verb, which the manager finds checkpoints by", dir);
  int fd = -1;
  if (!object) {
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
      int rc = -errno;
      return fail_open(msg, rc, "%s: cannot create it: %s", dir, ckptio_errno_text(-rc));
    }
    fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
      int rc = -errno;
      return fail_open(msg, rc, "%s: %s", dir, ckptio_errno_text(-rc));
    }
  }
  ckptio_manager *m = calloc(1, sizeof(*m));
  char *d = strdup(dir);
  if (!m || !d) {
    free(m);
    free(d);
    if (fd >= 0) close(fd);
    return fail_open(msg, -ENOMEM, "%s: out of memory", dir);
  }
  ckptio_closer_init(&m->closer);
  /* "s3://b/ckpts/" and "s3://b/ckpts" are one prefix: step names are
   * joined with one '/'. */
  size_t root = object ? ckptio_path_scheme(d) + 3 : 0; /* "s3://" itself stays */
  for (size_t n = strlen(d); object && n > root && d[n - 1] == '/'; n--) d[n - 1] = '\0';
  m->ctx = ctx;
  m->dir = d;
  m->dirfd = fd;
  m->place = object ? &mgr_object_place : &mgr_local_place;
  m->st = st;
  m->st_self = st_self;
  m->mo = mo;
  m->opts = o;
  m->sync = o.fsync != 0;
  /* A storage answers now (bucket, credentials), not at the first save. */
  int rc = object ? mgr_obj_probe(m) : 0;
  if (rc < 0) {
    ckptio_fail(msg, rc, "%s: %s", dir, m->why);
    ckptio_manager_close(m);
    return ckptio_open_error_end(rc, "ckptio_manager_open", msg);
  }
  *out = m;
  return 0;
}

void ckptio_manager_set_warning(ckptio_manager *m, ckptio_manager_warn_fn fn, void *arg) {
  if (!m) return;
  m->warn = fn;
  m->warn_arg = arg;
}

const char *ckptio_manager_last_error(const ckptio_manager *m) { return m ? m->err : ""; }

/* The open save is over, published or not. */
static void end_save(ckptio_manager *m, ckptio_held *held) {
  m->place->end_save(m, held);
  m->w = NULL;
}

void ckptio_manager_close(ckptio_manager *m) {
  if (!m) return;
  if (m->w) {
    ckptio_writer_close(m->w);
    end_save(m, NULL);
  }
  ckptio_closer_fini(&m->closer);
  for (size_t i = 0; i < m->nlist; i++) mgr_entry_free(&m->list[i]);
  free(m->list);
  if (m->dirfd >= 0) close(m->dirfd);
  free(m->dir);
  free(m);
}

/* The file a single-file checkpoint is saved as. */
static const char *single_file(const ckptio_manager *m) {
  return m->mo.format == CKPTIO_FORMAT_PYTORCH ? "model.pt"
         : m->opts.compress_level             ? "model.safetensors.zst"
                                              : "model.safetensors";
}

/* Opens the save's writer in DIR/`sub` (the hidden temporary directory, or
 * on a storage the step's own prefix): m->w, or a code in m->err. */
static int open_writer(ckptio_manager *m, uint64_t step, const char *sub) {
  int rc;
  size_t pl = strlen(m->dir) + strlen(sub) + 64;
  char *path = malloc(pl);
  if (!path) return ckptio_err_fmt(m->err, sizeof(m->err), -ENOMEM, "%s: out of memory", m->dir);
  ckptio_writer *w = NULL;
  /* The caller's ckptio_last_open_error is not this call's to change. */
  char keep[CKPTIO_ERRLEN];
  snprintf(keep, sizeof(keep), "%s", ckptio_last_open_error());
  if (m->mo.max_shard_bytes) {
    snprintf(path, pl, "%s/%s", m->dir, sub);
    rc = ckptio_writer_open_sharded(m->ctx, path, MGR_SET_PREFIX, CKPTIO_FORMAT_SAFETENSORS, m->mo.max_shard_bytes,
                                    CKPTIO_SHARD_ORDER_ADDED, &m->opts, &w);
  } else {
    snprintf(path, pl, "%s/%s/%s", m->dir, sub, single_file(m));
    rc = ckptio_writer_open(m->ctx, path, m->mo.format, &m->opts, &w);
  }
  free(path);
  if (rc < 0) ckptio_err_fmt(m->err, sizeof(m->err), rc, "step %" PRIu64 ": %s", step, ckptio_last_open_error());
  ckptio_set_open_error(keep);
  if (rc < 0) return rc;
  m->w = w;
  m->w_step = step;
  return 0;
}

int ckptio_manager_save_begin(ckptio_manager *m, uint64_t step, ckptio_writer **out) {
  if (out) *out = NULL;
  if (!m || !out) return CKPTIO_E_INVALID_ARG;
  m->err[0] = '\0';
  if (m->w)
    return ckptio_err_fmt(m->err, sizeof(m->err), CKPTIO_E_STATE,
                          "%s: the save of step %" PRIu64 " is still open (ckptio_manager_save_end)", m->dir,
                          m->w_step);
  char sub[128];
  int rc = m->place->begin_save(m, step, sub, sizeof(sub));
  if (rc == 0) rc = open_writer(m, step, sub);
  if (rc < 0) {
    end_save(m, NULL);
    return rc;
  }
  *out = m->w;
  return 0;
}

/* Removes what the keep rules let go, now that `step` is durable; the
 * removed files are held in `held`. */
static int retain(ckptio_manager *m, uint64_t step, ckptio_held *held) {
  if (m->mo.keep_last == 0) return 0;
  m->why[0] = '\0';
  uint64_t *steps;
  int64_t n = m->place->scan_steps(m, &steps);
  if (n < 0) return (int)n;
  int rc = 0, kept = 0;
  for (int64_t i = n - 1; i >= 0; i--) {
    uint64_t s = steps[i];
    if (s == step) {
      kept++;
      continue;
    }
    int complete = 0, unknown = 0;
    if (kept < m->mo.keep_last) {
      mgr_entry e;
      int r = mgr_check(m, s, 0, &e);
      if (r < 0) {
        rc = r;
        break;
      }
      complete = e.complete;
      unknown = !e.complete && !mgr_content_error(m, e.error);
      mgr_entry_free(&e);
    }
    if (complete && kept < m->mo.keep_last) {
      kept++;
      continue;
    }
    if (unknown || s > step || (m->mo.keep_every && s % m->mo.keep_every == 0)) continue;
    char name[MGR_STEP_NAME_MAX];
    mgr_step_name(s, name, sizeof(name));
    int r = m->place->remove_step(m, s, held);
    if (r < 0) {
      mgr_warn(m, s, r, "%s/%s: retention could not remove it: %s", m->dir, name, m->why);
      if (rc == 0) rc = r;
    }
  }
  free(steps);
  return rc;
}

int ckptio_manager_save_end(ckptio_manager *m, ckptio_writer *w) {
  if (!m || !w || w != m->w) {
    if (m) ckptio_err_fmt(m->err, sizeof(m->err), CKPTIO_E_INVALID_ARG, "%s: not the writer of the open save", m->dir);
    return CKPTIO_E_INVALID_ARG;
  }
  m->err[0] = '\0';
  uint64_t step = m->w_step;
  ckptio_held held = {0}; /* removed files, closed off this call */
  int rc = ckptio_writer_wait_durable(w);
  if (rc == CKPTIO_E_STATE)
    ckptio_err_fmt(m->err, sizeof(m->err), rc, "%s: the save of step %" PRIu64 " was never committed", m->dir, step);
  else if (rc < 0)
    ckptio_err_fmt(m->err, sizeof(m->err), rc, "%s: step %" PRIu64 ": %s", m->dir, step, ckptio_writer_last_error(w));
  int rc2 = ckptio_writer_close(w);
  m->w = NULL;
  if (rc == 0 && rc2 < 0)
    rc = ckptio_err_fmt(m->err, sizeof(m->err), rc2, "%s: step %" PRIu64 ": %s", m->dir, step, ckptio_strerror(rc2));
  if (rc < 0) goto out;

  char name[MGR_STEP_NAME_MAX], line[MGR_STEP_NAME_MAX + 2];
  mgr_step_name(step, name, sizeof(name));
  rc = m->place->publish(m, step, m->mo.max_shard_bytes ? mgr_files[0] : single_file(m));
  if (rc < 0) goto out;
  /* Published: what follows cannot unpublish it, only be reported. */
  snprintf(line, sizeof(line), "%s\n", name);
  rc = m->place->write_latest(m, line);
  if (rc < 0) {
    ckptio_err_fmt(m->err, sizeof(m->err), rc, "%s: %s is published, but %s could not be replaced: %s", m->dir,
                   name, MGR_LATEST, m->why);
    goto out;
  }
  rc = retain(m, step, &held);
  if (rc < 0)
    ckptio_err_fmt(m->err, sizeof(m->err), rc, "%s: %s is published, but retention failed: %s", m->dir, name,
                   m->why[0] ? m->why : ckptio_strerror(rc));
out:
  end_save(m, &held);
  /* Unlinking without holding frees the blocks in the call (0.1-0.2 s per
   * GiB here): retention held the removed files open, and the manager's
   * closer frees them after save_end, one retention's files at a time. */
  ckptio_closer_wait(&m->closer);
  ckptio_closer_add(&m->closer, &held);
  return rc;
}
