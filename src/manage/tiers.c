/* Tiered multi-rank checkpoints (ckptio_tiers_* in ckptio.h): the handle
 * and the save. A save writes this rank's part into its memory directory,
 * sends the copies to their holders, writes the durable part when due,
 * then, per tier, the ranks agree that every part is there before anyone
 * marks the step, and agree again that every rank marked it before anyone
 * retires an older step: a crash between any two of these leaves the
 * previous step restorable. The restore is tiers_restore.c. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/collective.h"
#include "core/error.h"
#include "core/sized.h"
#include "manage/tiers.h"

static const char *const tier_names[CKPTIO_TIERS] = {"memory", "peers", "durable"};

/* Test builds only (as io/fault.c's variables): CKPTIO_FAULT_TIERS_KILL=
 * POINT:RANK kills rank RANK with SIGKILL at POINT of every save, where
 * POINT is "written" (parts written, nothing agreed), "agreed" (agreed,
 * not marked) or "marked" (marked, not agreed to retire). */
#ifdef CKPTIO_FAULT_INJECTION
static void crash_point(const ckptio_tiers *t, const char *point) {
  const char *v = getenv("CKPTIO_FAULT_TIERS_KILL");
  size_t n = strlen(point);
  if (v && !strncmp(v, point, n) && v[n] == ':' && atoi(v + n + 1) == t->comm.rank) raise(SIGKILL);
}
#else
#define crash_point(t, point) ((void)0)
#endif

int tiers_holder(const ckptio_tiers *t, int r, int k) {
  return (r + k * t->o.ranks_per_node) % t->comm.nranks;
}

int tiers_held(const ckptio_tiers *t, int r, int k) {
  int n = t->comm.nranks;
  return ((r - k * t->o.ranks_per_node) % n + n) % n;
}

void tiers_warn(ckptio_tiers *t, uint64_t step, int tier, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->err, sizeof(t->err), fmt, ap);
  va_end(ap);
  if (t->warn) t->warn(t->warn_arg, step, tier, code, t->err);
}

#define fail_open(msg, code, ...) \
  ckptio_open_error_end(ckptio_fail((msg), (code), __VA_ARGS__), "ckptio_tiers_open", (msg))

static char *dup_or_null(const char *s, int *bad) {
  if (!s) return NULL;
  char *d = strdup(s);
  if (!d) *bad = 1;
  return d;
}

int ckptio_tiers_open(ckptio_ctx *ctx, const ckptio_comm *comm, const ckptio_tiers_options *opts,
                      ckptio_tiers **out) {
  ckptio_open_error_clear();
  char msg[CKPTIO_ERRLEN], why[CKPTIO_ERRLEN];
  if (out) *out = NULL;
  if (!ctx || !comm || !out) return fail_open(msg, CKPTIO_E_INVALID_ARG, "ckptio_tiers_open: a NULL argument");
  ckptio_comm c = {0};
  ckptio_tiers_options o = CKPTIO_TIERS_OPTIONS_INIT;
  if (ckptio_sized_in(comm, &c, sizeof(c), "ckptio_comm", why, sizeof(why)) < 0 ||
      ckptio_sized_in(opts, &o, sizeof(o), "ckptio_tiers_options", why, sizeof(why)) < 0)
    return fail_open(msg, CKPTIO_E_INVALID_ARG, "ckptio_tiers_open: %s", why);
  if (c.nranks < 1 || c.rank < 0 || c.rank >= c.nranks || !c.allgather)
    return fail_open(msg, CKPTIO_E_INVALID_ARG, "ckptio_tiers_open: a communicator needs 0 <= rank < nranks "
                     "and an allgather");
  if (!o.memory_dir && !o.durable_dir)
    return fail_open(msg, CKPTIO_E_INVALID_ARG, "ckptio_tiers_open: no tier: set memory_dir, durable_dir or both");
  if (o.memory_keep < 1 || o.durable_keep < 1 || o.durable_every < 1)
    return fail_open(msg, CKPTIO_E_INVALID_ARG, "ckptio_tiers_open: memory_keep, durable_keep and "
                     "durable_every must be at least 1");
  if (o.ranks_per_node < 1 || c.nranks % o.ranks_per_node)
    return fail_open(msg, CKPTIO_E_INVALID_ARG, "ckptio_tiers_open: ranks_per_node %d does not divide the "
                     "%d ranks into nodes", o.ranks_per_node, c.nranks);
  int nodes = c.nranks / o.ranks_per_node;
  if (o.peers < 0 || (o.peers && (!o.memory_dir || o.peers >= nodes || !c.alltoallv)))
    return fail_open(msg, CKPTIO_E_INVALID_ARG, "ckptio_tiers_open: %d peer copies need a memory tier, a "
                     "communicator with alltoallv (1.1) and more nodes than copies (%d nodes of %d ranks)",
                     o.peers, nodes, o.ranks_per_node);
  ckptio_tiers *t = calloc(1, sizeof(*t));
  int bad = !t;
  if (t) {
    t->o = o;
    t->o.memory_dir = dup_or_null(o.memory_dir, &bad);
    t->o.durable_dir = dup_or_null(o.durable_dir, &bad);
  }
  if (bad) {
    ckptio_tiers_close(t);
    return fail_open(msg, -ENOMEM, "ckptio_tiers_open: no memory");
  }
  t->ctx = ctx;
  t->comm = c;
  t->nodes = nodes;
  t->leader = c.rank % o.ranks_per_node == 0;
  t->stats = (ckptio_tiers_stats)CKPTIO_TIERS_STATS_INIT;
  *out = t;
  return 0;
}

void ckptio_tiers_set_warning(ckptio_tiers *t, ckptio_tiers_warn_fn fn, void *arg) {
  if (!t) return;
  t->warn = fn;
  t->warn_arg = arg;
}

int ckptio_tiers_stats_get(const ckptio_tiers *t, ckptio_tiers_stats *out) {
  if (!t) return CKPTIO_E_INVALID_ARG;
  return ckptio_sized_out(out, &t->stats, sizeof(t->stats), "ckptio_tiers_stats", NULL, 0);
}

const char *ckptio_tiers_last_error(const ckptio_tiers *t) { return t ? t->err : ""; }

void ckptio_tiers_close(ckptio_tiers *t) {
  if (!t) return;
  free((char *)t->o.memory_dir);
  free((char *)t->o.durable_dir);
  free(t);
}

int tiers_verify(ckptio_tiers *t, const char *path, char *why) {
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  ckptio_ctx_options(t->ctx, &o);
  o.crc = 1;
  ckptio_reader *r = NULL;
  int rc = ckptio_reader_open(t->ctx, path, &o, &r);
  if (rc < 0) return ckptio_fail(why, rc, "%s", ckptio_last_open_error());
  size_t unchecked = 0;
  rc = ckptio_reader_verify(r, &unchecked);
  if (rc < 0)
    ckptio_fail(why, rc, "%s", ckptio_reader_last_error(r));
  else if (unchecked)
    rc = ckptio_fail(why, CKPTIO_E_CHECKSUM, "%s: %zu tensors without a CRC32", path, unchecked);
  ckptio_reader_close(r);
  return rc;
}

/* This rank's part as one safetensors file with CRC32s at DIR/step-N/
 * rank-R.safetensors (the writer's own atomic commit). */
static int write_part(ckptio_tiers *t, const char *dir, uint64_t step, const ckptio_tensor *ts, size_t n,
                      uint64_t *bytes, char *why) {
  char path[4096];
  int rc = tiers_make_step_dir(dir, step);
  if (rc == 0) rc = tiers_path(path, sizeof(path), dir, step, "rank", t->comm.rank);
  if (rc < 0) return ckptio_fail(why, rc, "%s: cannot make its step directory: %s", dir, ckptio_strerror(rc));
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  ckptio_ctx_options(t->ctx, &o);
  o.crc = 1;
  ckptio_writer *w = NULL;
  rc = ckptio_writer_open(t->ctx, path, CKPTIO_FORMAT_SAFETENSORS, &o, &w);
  if (rc < 0) return ckptio_fail(why, rc, "%s", ckptio_last_open_error());
  for (size_t i = 0; rc == 0 && i < n; i++) rc = ckptio_writer_add(w, &ts[i]);
  if (rc == 0) rc = ckptio_writer_commit(w);
  if (rc < 0) ckptio_fail(why, rc, "%s", ckptio_writer_last_error(w));
  ckptio_writer_close(w);
  int64_t size = rc == 0 ? tiers_file_size(path) : 0;
  if (rc == 0 && size < 0) rc = ckptio_fail(why, (int)size, "%s: %s", path, ckptio_strerror((int)size));
  *bytes = rc == 0 ? (uint64_t)size : 0;
  return rc;
}

/* Sends this rank's part in memory to its holders and receives the parts
 * it holds. Collective; own_rc < 0 (the part was not written) sends none. */
static int send_copies(ckptio_tiers *t, uint64_t step, int own_rc, uint64_t own_bytes, char *why) {
  int n = t->comm.nranks, me = t->comm.rank, K = t->o.peers;
  uint64_t mine = own_rc == 0 ? own_bytes : 0, *sizes = calloc((size_t)n, sizeof(uint64_t));
  tiers_move *moves = calloc((size_t)n * (size_t)K, sizeof(*moves));
  char(*paths)[4096] = calloc((size_t)n * (size_t)K, sizeof(*paths));
  const char **from = calloc((size_t)n * (size_t)K, sizeof(char *)), **to = calloc((size_t)n * (size_t)K, sizeof(char *));
  int *ok = calloc((size_t)n * (size_t)K, sizeof(int));
  int rc = 0, local = 0;
  if (!sizes || !moves || !paths || !from || !to || !ok) {
    rc = ckptio_fail(t->err, -ENOMEM, "rank %d: no memory to send copies", me);
    goto out;
  }
  rc = t->comm.allgather(t->comm.user, &mine, sizes, sizeof(mine));
  if (rc < 0) {
    ckptio_fail(t->err, rc, "rank %d: the communicator's allgather failed: %s", me, ckptio_strerror(rc));
    goto out;
  }
  if (tiers_make_step_dir(t->o.memory_dir, step) < 0) local = -errno;
  size_t m = 0;
  for (int r = 0; r < n; r++)
    for (int k = 1; k <= K; k++, m++) {
      moves[m] = (tiers_move){r, tiers_holder(t, r, k), sizes[r]};
      if (r == me && tiers_path(paths[m], sizeof(paths[m]), t->o.memory_dir, step, "rank", me) == 0) from[m] = paths[m];
      if (moves[m].dst == me && tiers_path(paths[m], sizeof(paths[m]), t->o.memory_dir, step, "copy", r) == 0)
        to[m] = paths[m];
    }
  rc = tiers_exchange(t, moves, m, from, to, ok);
  for (size_t i = 0; rc == 0 && i < m; i++) {
    if (moves[i].dst != me) continue;
    if (!sizes[moves[i].src] || !ok[i]) {
      local = ckptio_fail(why, CKPTIO_E_RANK, "rank %d did not receive rank %d's copy%s", me, moves[i].src,
                          sizes[moves[i].src] ? "" : " (that rank's part was not written)");
      break;
    }
    t->stats.saved_bytes[CKPTIO_TIER_PEER] += moves[i].bytes;
  }
out:
  free(sizes);
  free(moves);
  free(paths);
  free(from);
  free(to);
  free(ok);
  return rc < 0 ? rc : local;
}

/* The agreement, then the marks, then the agreement to retire, for one
 * tier. @return 0 when the step is published there; else the failure (with
 * why), after which the step is not marked there. */
static int publish(ckptio_tiers *t, uint64_t step, int tier, int rc, char *why) {
  const char *dir = tier == CKPTIO_TIER_DURABLE ? t->o.durable_dir : t->o.memory_dir;
  const char *mark = tier == CKPTIO_TIER_PEER ? TIERS_COPIES : TIERS_PUBLISHED;
  char err[CKPTIO_ERRLEN] = "";
  /* A failure of this rank keeps its own reason in why; another's comes in err. */
  rc = ckptio_comm_status_exchange(&t->comm, rc, why, tier_names[tier], err);
  if (rc < 0) return err[0] ? ckptio_fail(why, rc, "%s", err) : rc;
  crash_point(t, "agreed");
  rc = tiers_mark(dir, step, mark, tier == CKPTIO_TIER_DURABLE);
  if (rc < 0) ckptio_fail(why, rc, "%s: cannot mark step %llu: %s", dir, (unsigned long long)step, ckptio_strerror(rc));
  crash_point(t, "marked");
  err[0] = '\0';
  rc = ckptio_comm_status_exchange(&t->comm, rc, why, tier_names[tier], err);
  if (rc < 0) return err[0] ? ckptio_fail(why, rc, "%s", err) : rc;
  return 0;
}

int ckptio_tiers_save(ckptio_tiers *t, uint64_t step, const ckptio_tensor *tensors, size_t n) {
  if (!t || (n && !tensors)) return CKPTIO_E_INVALID_ARG;
  if (t->saved && step <= t->last_step)
    return ckptio_fail(t->err, CKPTIO_E_INVALID_ARG, "step %llu after step %llu: steps must grow",
                       (unsigned long long)step, (unsigned long long)t->last_step);
  int due[CKPTIO_TIERS] = {t->o.memory_dir != NULL, t->o.peers > 0,
                           t->o.durable_dir && step % (uint64_t)t->o.durable_every == 0};
  int rc[CKPTIO_TIERS] = {0};
  char why[CKPTIO_TIERS][CKPTIO_ERRLEN] = {{0}};
  uint64_t bytes = 0, dbytes = 0;
  char path[4096];
  /* A step saved again (after a restore to an older one) is not published
   * until this save agrees on it. */
  for (int tier = 0; tier < CKPTIO_TIERS; tier++) {
    const char *dir = tier == CKPTIO_TIER_DURABLE ? t->o.durable_dir : t->o.memory_dir;
    const char *mark = tier == CKPTIO_TIER_PEER ? TIERS_COPIES : TIERS_PUBLISHED;
    if (due[tier] && t->leader && tiers_mark_path(path, sizeof(path), dir, step, mark) == 0) unlink(path);
  }
  if (due[CKPTIO_TIER_MEMORY]) rc[0] = write_part(t, t->o.memory_dir, step, tensors, n, &bytes, why[0]);
  if (due[CKPTIO_TIER_PEER]) {
    rc[1] = send_copies(t, step, rc[0], bytes, why[1]);
    if (rc[1] < 0 && rc[1] != CKPTIO_E_RANK && strstr(t->err, "communicator")) return rc[1];
  }
  if (due[CKPTIO_TIER_DURABLE]) rc[2] = write_part(t, t->o.durable_dir, step, tensors, n, &dbytes, why[2]);
  crash_point(t, "written");
  int first = 0, published = 0;
  char first_msg[CKPTIO_ERRLEN] = "";
  for (int tier = 0; tier < CKPTIO_TIERS; tier++) {
    if (!due[tier]) continue;
    int p = publish(t, step, tier, rc[tier], why[tier]);
    if (p == 0) {
      published++;
      t->stats.saved_bytes[tier] += tier == CKPTIO_TIER_MEMORY ? bytes : tier == CKPTIO_TIER_DURABLE ? dbytes : 0;
      continue;
    }
    t->stats.failed_tier_saves++;
    tiers_warn(t, step, tier, p, "step %llu not saved to the %s tier: %s", (unsigned long long)step,
               tier_names[tier], why[tier]);
    if (!first) first = p, memcpy(first_msg, t->err, sizeof(first_msg));
  }
  if (first) memcpy(t->err, first_msg, sizeof(first_msg)); /* what a failed save returns names the first */
  t->saved = 1;
  t->last_step = step;
  if (t->o.memory_dir)
    tiers_retire(t, t->o.memory_dir, t->o.memory_keep, TIERS_PUBLISHED, t->o.peers ? TIERS_COPIES : NULL,
                 t->o.peers > 0, step);
  if (due[CKPTIO_TIER_DURABLE]) tiers_retire(t, t->o.durable_dir, t->o.durable_keep, TIERS_PUBLISHED, NULL, 0, step);
  return first && (t->o.fatal || !published) ? first : 0;
}
