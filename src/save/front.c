/* The public writer: one handle for a single file, a sharded set or a
 * rank's side of a multi-rank checkpoint (the three kinds of save.h). The
 * front checks the handle and hands every call to its kind's verbs
 * (save.h); what the kinds share (commit = commit_async + wait, the error
 * text) is here once. */
#include <stdint.h>

#include "ckptio.h"
#include "core/error.h"
#include "ctx/ctx.h"
#include "save/save.h"

/* The public opens: ckptio_last_open_error is cleared on entry and holds
 * the kind's detail (or the code's text) when the open fails. */
int ckptio_writer_open(ckptio_ctx *ctx, const char *path, ckptio_format format, const ckptio_options *opts,
                       ckptio_writer **out) {
  char msg[CKPTIO_ERRLEN] = "";
  ckptio_open_error_clear();
  return ckptio_open_error_end(ckptio_file_writer_open(ctx, path, format, opts, msg, out), "ckptio_writer_open", msg);
}

int ckptio_writer_open_sharded(ckptio_ctx *ctx, const char *dir, const char *prefix, ckptio_format format,
                               uint64_t max_shard_bytes, ckptio_shard_order order, const ckptio_options *opts,
                               ckptio_writer **out) {
  char msg[CKPTIO_ERRLEN] = "";
  ckptio_open_error_clear();
  return ckptio_open_error_end(
      ckptio_set_writer_open(ctx, dir, prefix, format, max_shard_bytes, order, opts, msg, out),
      "ckptio_writer_open_sharded", msg);
}

int ckptio_writer_open_ranks(ckptio_ctx *ctx, const ckptio_comm *comm, const char *dir, const char *prefix,
                             const ckptio_options *opts, ckptio_writer **out) {
  char msg[CKPTIO_ERRLEN] = "";
  ckptio_open_error_clear();
  return ckptio_open_error_end(ckptio_ranks_writer_open(ctx, comm, dir, prefix, opts, msg, out),
                               "ckptio_writer_open_ranks", msg);
}

/* The verbs that build a save run on an open writer only: after an abort
 * every verb but close is refused, and after commit these are. */
static int refused(ckptio_writer *w, const char *what, const char *tensor) {
  if (w->state == CKPTIO_WRITER_OPEN) return 0;
  if (w->state == CKPTIO_WRITER_ABORTED)
    return ckptio_fail(w->err, CKPTIO_E_STATE,
                       "%s: the save was aborted (ckptio_writer_abort): the writer may only be closed", w->where);
  if (tensor) return ckptio_fail(w->err, CKPTIO_E_STATE, "%s: tensor '%s' added after commit", w->where, tensor);
  return ckptio_fail(w->err, CKPTIO_E_STATE, "%s: %s", w->where, what);
}

int ckptio_writer_set_metadata(ckptio_writer *w, const char *key, const char *value) {
  if (!w) return CKPTIO_E_INVALID_ARG;
  int rc = refused(w, "metadata after commit", NULL);
  return rc < 0 ? rc : w->ops->set_metadata(w, key, value);
}

int ckptio_writer_set_torch_pickle(ckptio_writer *w, const void *pickle, size_t len) {
  if (!w) return CKPTIO_E_INVALID_ARG;
  if (!pickle) return ckptio_fail(w->err, CKPTIO_E_INVALID_ARG, "data.pkl: NULL");
  return ckptio_file_writer_set_pickle(w, pickle, len);
}

int ckptio_writer_set_stream(ckptio_writer *w, int device, void *stream) {
  if (!w) return CKPTIO_E_INVALID_ARG;
  int rc = refused(w, "stream set after commit", NULL);
  return rc < 0 ? rc : w->ops->set_stream(w, device, stream);
}

int ckptio_writer_add(ckptio_writer *w, const ckptio_tensor *t) {
  if (!w || !t || !t->name) return CKPTIO_E_INVALID_ARG;
  int rc = refused(w, NULL, t->name);
  return rc < 0 ? rc : w->ops->add(w, t, (ckptio_fill){NULL, NULL});
}

int ckptio_writer_add_fill(ckptio_writer *w, const ckptio_tensor *t, ckptio_fill_fn fill, void *arg) {
  if (!w || !t || !t->name || !fill) return CKPTIO_E_INVALID_ARG;
  if (t->data || t->device != CKPTIO_DEVICE_HOST)
    return ckptio_err_fmt(w->err, sizeof(w->err), CKPTIO_E_INVALID_ARG,
                          "tensor '%s': a filled tensor has no data pointer and lives on the host "
                          "(data NULL, device CKPTIO_DEVICE_HOST)",
                          t->name);
  int rc = refused(w, NULL, t->name);
  return rc < 0 ? rc : w->ops->add(w, t, (ckptio_fill){fill, arg});
}

int ckptio_writer_add_part(ckptio_writer *w, const ckptio_tensor *t, const int64_t *global_shape,
                           const int64_t *offsets) {
  if (!w || !t || !t->name || !global_shape || !offsets || t->ndim < 0 || t->ndim > CKPTIO_MAX_DIMS)
    return CKPTIO_E_INVALID_ARG;
  int rc = refused(w, NULL, t->name);
  if (rc < 0) return rc;
  if (w->ops->add_part) return w->ops->add_part(w, t, global_shape, offsets);
  for (int d = 0; d < t->ndim; d++)
    if (offsets[d] != 0 || global_shape[d] != t->shape[d])
      return ckptio_err_fmt(w->err, sizeof(w->err), CKPTIO_E_INVALID_ARG,
                            "tensor '%s': a part of a tensor needs a multi-rank writer (ckptio_writer_open_ranks); "
                            "this writer stores tensors whole",
                            t->name);
  return w->ops->add(w, t, (ckptio_fill){NULL, NULL});
}

int ckptio_writer_abort(ckptio_writer *w, int code, const char *why) {
  if (!w) return CKPTIO_E_INVALID_ARG;
  if (code >= 0) code = CKPTIO_E_INVALID_ARG;
  int rc = refused(w, "abort after commit", NULL);
  return rc < 0 ? rc : w->ops->abort(w, code, why);
}

/* In a forked child a parent's writer has no coordinator or workers: the
 * calls that would start or wait for them refuse at once instead. */
static int forked(ckptio_writer *w) { return ckptio_ctx_check_process(w->ctx, w->err, sizeof(w->err)); }

#define DRIVE(w, verb) (!(w) ? CKPTIO_E_INVALID_ARG : forked(w) < 0 ? CKPTIO_E_STATE : (w)->ops->verb(w))
int ckptio_writer_commit_async(ckptio_writer *w) {
  if (!w) return CKPTIO_E_INVALID_ARG;
  if (forked(w) < 0) return CKPTIO_E_STATE;
  int rc = refused(w, "commit called twice", NULL);
  return rc < 0 ? rc : w->ops->commit_async(w);
}
int ckptio_writer_wait_snapshot(ckptio_writer *w) { return DRIVE(w, wait_snapshot); }
int ckptio_writer_wait_durable(ckptio_writer *w) { return DRIVE(w, wait_durable); }
int ckptio_writer_poll_snapshot(ckptio_writer *w) { return DRIVE(w, poll_snapshot); }
int ckptio_writer_poll_durable(ckptio_writer *w) { return DRIVE(w, poll_durable); }

int ckptio_writer_commit(ckptio_writer *w) {
  if (w) w->sync = 1;
  int rc = ckptio_writer_commit_async(w);
  return rc < 0 ? rc : ckptio_writer_wait_durable(w);
}

void ckptio_writer_progress(ckptio_writer *w, uint64_t *done, uint64_t *total) {
  if (w) {
    w->ops->progress(w, done, total);
    return;
  }
  if (done) *done = 0;
  if (total) *total = 0;
}

int ckptio_writer_stats(const ckptio_writer *w, ckptio_stats *out) {
  return w ? w->ops->stats(w, out) : CKPTIO_E_INVALID_ARG;
}

size_t ckptio_writer_shard_count(const ckptio_writer *w) { return w ? w->ops->shard_count(w) : 0; }

/* A parent's writer is left to the parent in a forked child (closing
 * it would join threads the child does not have). */
int ckptio_writer_close(ckptio_writer *w) { return !w ? 0 : forked(w) < 0 ? CKPTIO_E_STATE : w->ops->close(w); }

const char *ckptio_writer_last_error(const ckptio_writer *w) { return w ? w->err : ""; }
