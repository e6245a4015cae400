/* The save of tiered checkpoints (ckptio_tiers_save in ckptio.h). Its
 * start runs on the caller's thread: this rank's part goes into a writer
 * (the memory tier's file, or without one the durable tier's or the
 * storage's object, whichever is due first) and the call waits for the
 * writer's snapshot point. Its finish — the part made durable in its file,
 * the copies sent to their holders, the durable copy and the storage's
 * upload, the agreements and marks, the retirement — runs on
 * the same thread, or, with the background option, on a thread of the
 * handle while training goes on; the next save, a restore, ckptio_tiers_wait
 * and ckptio_tiers_close wait for it.
 *
 * Publication, per tier: the ranks agree that every part is there before
 * anyone marks the step, and agree again that every rank marked it before
 * anyone retires an older step, so a crash between any two of these
 * leaves the previous step restorable. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/collective.h"
#include "core/error.h"
#include "manage/tiers.h"

static const char *const tier_names[CKPTIO_TIERS] = {"memory", "peers", "durable", "storage"};

/* Test builds only (as io/fault.c's variables): CKPTIO_FAULT_TIERS_KILL=
 * POINT:RANK kills rank RANK with SIGKILL at POINT of every save, where
 * POINT is "written" (parts written, nothing agreed), or "agreed" (agreed,
 * not marked) or "marked" (marked, not agreed to retire) followed by the
 * tier whose publication it is in: "agreed-memory", "marked-durable", ... */
#ifdef CKPTIO_FAULT_INJECTION
static void crash_point(const ckptio_tiers *t, const char *point, const char *tier) {
  const char *v = getenv("CKPTIO_FAULT_TIERS_KILL");
  char want[64];
  snprintf(want, sizeof(want), "%s%s%s:", point, tier ? "-" : "", tier ? tier : "");
  size_t n = strlen(want);
  if (v && !strncmp(v, want, n) && atoi(v + n) == t->comm.rank) raise(SIGKILL);
}
#else
#define crash_point(t, point, tier) ((void)0)
#endif

static const char *tier_mark(int tier) { return tier == CKPTIO_TIER_PEER ? TIERS_COPIES : TIERS_PUBLISHED; }

/* ------------------------------------------------------------ the start */

/* This rank's part as one safetensors file with CRC32s at DIR/step-N/
 * rank-R.safetensors (DIR the directory or prefix of tier j->w_tier)
 * through the writer's own atomic commit, started and waited for up to its
 * snapshot point (the tensors may then change). */
static int start_part(ckptio_tiers *t, tiers_job *j, const ckptio_tensor *ts, size_t n, char *why) {
  char path[4096];
  const char *dir = tiers_dir(t, j->w_tier);
  int rc = j->w_tier == CKPTIO_TIER_STORAGE ? 0 : tiers_make_step_dir(dir, j->step);
  if (rc == 0) rc = tiers_path(path, sizeof(path), dir, j->step, "rank", t->comm.rank);
  if (rc < 0) return ckptio_fail(why, rc, "%s: cannot make its step directory: %s", dir, ckptio_strerror(rc));
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  ckptio_ctx_options(t->ctx, &o);
  o.crc = 1;
  rc = ckptio_writer_open(t->ctx, path, CKPTIO_FORMAT_SAFETENSORS, &o, &j->w);
  if (rc < 0) return ckptio_fail(why, rc, "%s", ckptio_last_open_error());
  for (size_t i = 0; rc == 0 && i < n; i++) rc = ckptio_writer_add(j->w, &ts[i]);
  if (rc == 0) rc = ckptio_writer_commit_async(j->w);
  if (rc == 0) rc = ckptio_writer_wait_snapshot(j->w);
  if (rc < 0) {
    ckptio_fail(why, rc, "%s", ckptio_writer_last_error(j->w));
    ckptio_writer_close(j->w);
    j->w = NULL;
  }
  return rc;
}

/* ----------------------------------------------------------- the finish */

/* The part's file complete: its size in j->bytes. */
static int end_part(ckptio_tiers *t, tiers_job *j, char *why) {
  char path[4096];
  int rc = ckptio_writer_wait_durable(j->w);
  if (rc < 0) ckptio_fail(why, rc, "%s", ckptio_writer_last_error(j->w));
  ckptio_writer_close(j->w);
  j->w = NULL;
  if (rc < 0) return rc;
  tiers_path(path, sizeof(path), tiers_dir(t, j->w_tier), j->step, "rank", t->comm.rank);
  int64_t size = j->w_tier == CKPTIO_TIER_STORAGE ? tiers_obj_size(t, path) : tiers_file_size(path);
  if (size < 0) return ckptio_fail(why, (int)size, "%s: %s", path, ckptio_strerror((int)size));
  j->bytes = (uint64_t)size;
  return 0;
}

/* Sends this rank's part in memory to its holders and receives the parts
 * it holds. Collective; own_rc < 0 (the part was not written) sends none.
 * @return 0, this rank's failure (with why), or with *broken set the
 * communicator's (or memory's) failure, after which nothing more can be
 * agreed (with t->err). */
static int send_copies(ckptio_tiers *t, uint64_t step, int own_rc, uint64_t own_bytes, char *why, int *broken) {
  int n = t->comm.nranks, me = t->comm.rank, K = t->o.peers;
  size_t m = (size_t)n * (size_t)K;
  uint64_t mine = own_rc == 0 ? own_bytes : 0, *sizes = calloc((size_t)n, sizeof(uint64_t));
  tiers_move *moves = calloc(m, sizeof(*moves));
  int rc = 0, local = 0;
  if (!sizes || !moves) {
    rc = ckptio_fail(t->err, -ENOMEM, "rank %d: no memory to send copies", me);
    goto out;
  }
  rc = t->comm.allgather(t->comm.user, &mine, sizes, sizeof(mine));
  if (rc < 0) {
    ckptio_fail(t->err, rc, "rank %d: the communicator's allgather failed: %s", me, ckptio_strerror(rc));
    goto out;
  }
  local = tiers_make_step_dir(t->o.memory_dir, step);
  if (local < 0) ckptio_fail(why, local, "%s: cannot make its step directory: %s", t->o.memory_dir,
                             ckptio_strerror(local));
  for (size_t i = 0; i < m; i++) {
    tiers_move *v = &moves[i];
    int r = (int)(i / (size_t)K), k = (int)(i % (size_t)K) + 1;
    v->src = r, v->dst = tiers_holder(t, r, k), v->bytes = sizes[r];
    if (r == me) tiers_path(v->path, sizeof(v->path), t->o.memory_dir, step, "rank", me);
    if (v->dst == me) tiers_path(v->path, sizeof(v->path), t->o.memory_dir, step, "copy", r);
  }
  rc = tiers_exchange(t, moves, m);
  for (size_t i = 0; rc == 0 && local == 0 && i < m; i++) {
    if (moves[i].dst != me) continue;
    if (!sizes[moves[i].src] || !moves[i].ok) {
      local = ckptio_fail(why, CKPTIO_E_RANK, "rank %d did not receive rank %d's copy%s", me, moves[i].src,
                          sizes[moves[i].src] ? "" : " (that rank's part was not written)");
      break;
    }
    t->stats.saved_bytes[CKPTIO_TIER_PEER] += moves[i].bytes;
  }
out:
  free(sizes);
  free(moves);
  *broken = rc < 0;
  return rc < 0 ? rc : local;
}

/* The durable part as a copy of the memory tier's file (the same bytes,
 * CRC32s included): a temp file, fsync'd, renamed into place. */
static int copy_to_durable(ckptio_tiers *t, uint64_t step, const char *src, char *why) {
  char dst[4096], tmp[4200];
  int rc = tiers_make_step_dir(t->o.durable_dir, step);
  if (rc == 0) rc = tiers_path(dst, sizeof(dst), t->o.durable_dir, step, "rank", t->comm.rank);
  if (rc < 0) return ckptio_fail(why, rc, "%s: cannot make its step directory: %s", t->o.durable_dir,
                                 ckptio_strerror(rc));
  snprintf(tmp, sizeof(tmp), "%s.%d.tmp", dst, (int)getpid());
  rc = tiers_copy_file(src, tmp);
  if (rc == 0 && rename(tmp, dst) != 0) rc = -errno;
  if (rc < 0) {
    unlink(tmp);
    return ckptio_fail(why, rc, "%s: copying %s there failed: %s", t->o.durable_dir, src, ckptio_strerror(rc));
  }
  return tiers_sync_step_dir(t->o.durable_dir, step);
}

/* The storage's part as an upload of the file written into a faster tier
 * (the same bytes, CRC32s included), published whole or not at all. */
static int copy_to_storage(ckptio_tiers *t, uint64_t step, const char *src, char *why) {
  char dst[4096];
  int rc = tiers_path(dst, sizeof(dst), t->o.storage_dir, step, "rank", t->comm.rank);
  if (rc < 0) return ckptio_fail(why, rc, "%s: the path is too long", t->o.storage_dir);
  return tiers_obj_upload(t, src, dst, why);
}

/* This rank's part in the tier that took its written file: copied there
 * (a failure of the written file is the copy's too). */
static int copy_part(ckptio_tiers *t, tiers_job *j, int tier) {
  char src[4096];
  int w = j->w_tier;
  if (j->rc[w] < 0) return ckptio_fail(j->why[tier], j->rc[w], "%s", j->why[w]);
  int rc = tiers_path(src, sizeof(src), tiers_dir(t, w), j->step, "rank", t->comm.rank);
  if (rc < 0) return ckptio_fail(j->why[tier], rc, "%s: the path is too long", tiers_dir(t, w));
  return tier == CKPTIO_TIER_DURABLE ? copy_to_durable(t, j->step, src, j->why[tier])
                                     : copy_to_storage(t, j->step, src, j->why[tier]);
}

/* A save with places: the multi-rank checkpoint of each slower tier due,
 * from the part's file in memory, or from its file on the durable tier
 * (then removed: the checkpoints hold its bytes). Collective. */
static void placed_tiers(ckptio_tiers *t, tiers_job *j) {
  char src[4096];
  int w = j->w_tier, rc = tiers_path(src, sizeof(src), tiers_dir(t, w), j->step, "rank", t->comm.rank);
  if (rc < 0 && j->rc[w] == 0) j->rc[w] = ckptio_fail(j->why[w], rc, "%s: the path is too long", tiers_dir(t, w));
  for (int tier = CKPTIO_TIER_DURABLE; tier <= CKPTIO_TIER_STORAGE; tier++)
    if (j->due[tier]) j->rc[tier] = tiers_ranks_checkpoint(t, j, tier, src, j->why[tier]);
  if (w == CKPTIO_TIER_DURABLE) unlink(src);
}

/* The mark that publishes step in tier: every rank's in a directory (the
 * durable one fsync'd), rank 0's one object in the storage. */
static int mark(ckptio_tiers *t, uint64_t step, int tier, char *why) {
  if (tier == CKPTIO_TIER_STORAGE) return t->comm.rank == 0 ? tiers_obj_mark(t, step, why) : 0;
  int rc = tiers_mark(tiers_dir(t, tier), step, tier_mark(tier), t->comm.rank, tier == CKPTIO_TIER_DURABLE);
  if (rc < 0)
    ckptio_fail(why, rc, "%s: cannot mark step %llu: %s", tiers_dir(t, tier), (unsigned long long)step,
                ckptio_strerror(rc));
  return rc;
}

/* The agreement, then the marks, then the agreement to retire, for one
 * tier. @return 0 when the step is published there; else the failure (with
 * why), after which the step is not marked there. */
static int publish(ckptio_tiers *t, uint64_t step, int tier, int rc, char *why) {
  char err[CKPTIO_ERRLEN] = "";
  /* A failure of this rank keeps its own reason in why; another's comes in err. */
  rc = ckptio_comm_status_exchange(&t->comm, rc, why, tier_names[tier], err);
  if (rc < 0) return err[0] ? ckptio_fail(why, rc, "%s", err) : rc;
  crash_point(t, "agreed", tier_names[tier]);
  rc = mark(t, step, tier, why);
  crash_point(t, "marked", tier_names[tier]);
  err[0] = '\0';
  rc = ckptio_comm_status_exchange(&t->comm, rc, why, tier_names[tier], err);
  if (rc < 0) return err[0] ? ckptio_fail(why, rc, "%s", err) : rc;
  return 0;
}

/* Everything after the snapshot point; the save's result in j->result. */
static void finish(ckptio_tiers *t, tiers_job *j) {
  int *rc = j->rc, mem = j->due[CKPTIO_TIER_MEMORY];
  if (j->w) rc[j->w_tier] = end_part(t, j, j->why[j->w_tier]);
  if (j->due[CKPTIO_TIER_PEER]) {
    int broken = 0;
    rc[CKPTIO_TIER_PEER] =
        send_copies(t, j->step, rc[CKPTIO_TIER_MEMORY], j->bytes, j->why[CKPTIO_TIER_PEER], &broken);
    if (broken) {
      j->result = rc[CKPTIO_TIER_PEER]; /* nothing more can be agreed: nothing of this step is marked */
      return;
    }
  }
  if (j->placed && j->w_tier >= 0) /* the parts into each slower tier's multi-rank checkpoint */
    placed_tiers(t, j);
  for (int tier = CKPTIO_TIER_DURABLE; tier <= CKPTIO_TIER_STORAGE && !j->placed; tier++)
    if (j->due[tier] && tier != j->w_tier) rc[tier] = copy_part(t, j, tier);
  crash_point(t, "written", NULL);
  int first = 0, published = 0;
  char first_msg[CKPTIO_ERRLEN] = "";
  for (int tier = 0; tier < CKPTIO_TIERS; tier++) {
    if (!j->due[tier]) continue;
    int p = publish(t, j->step, tier, rc[tier], j->why[tier]);
    if (p == 0) {
      published++;
      if (tier != CKPTIO_TIER_PEER) t->stats.saved_bytes[tier] += j->bytes;
      continue;
    }
    t->stats.failed_tier_saves++;
    tiers_warn(t, j->step, tier, p, "step %llu not saved to the %s tier: %s", (unsigned long long)j->step,
               tier_names[tier], j->why[tier]);
    if (!first) first = p, memcpy(first_msg, t->err, sizeof(first_msg));
  }
  if (first) memcpy(t->err, first_msg, sizeof(first_msg)); /* a failed save names its first tier */
  if (mem)
    tiers_retire(t, t->o.memory_dir, t->o.memory_keep, TIERS_PUBLISHED, t->o.peers ? TIERS_COPIES : NULL, j->step);
  if (j->due[CKPTIO_TIER_DURABLE])
    tiers_retire(t, t->o.durable_dir, t->o.durable_keep, TIERS_PUBLISHED, NULL, j->step);
  if (j->due[CKPTIO_TIER_STORAGE]) tiers_obj_retire(t, j->step);
  j->result = first && (t->o.fatal || !published) ? first : 0;
}

static void *finish_thread(void *arg) {
  ckptio_tiers *t = arg;
  finish(t, &t->job);
  return NULL;
}

/* ---------------------------------------------------------------- calls */

int tiers_join(ckptio_tiers *t) {
  if (!t->running) return 0;
  pthread_join(t->thread, NULL);
  t->running = 0;
  return t->job.result;
}

int ckptio_tiers_wait(ckptio_tiers *t) { return t ? tiers_join(t) : CKPTIO_E_INVALID_ARG; }

/* The places of a save with places into j (names copied): each box inside
 * its global shape. */
static int take_places(ckptio_tiers *t, tiers_job *j, const ckptio_tensor *ts, const ckptio_tiers_place *places,
                       size_t n) {
  for (size_t i = 0; i < n; i++)
    for (int d = 0; d < ts[i].ndim && d < CKPTIO_MAX_DIMS; d++) {
      const int64_t *g = places[i].global_shape, *o = places[i].offsets;
      if (o[d] < 0 || ts[i].shape[d] < 0 || o[d] > g[d] || ts[i].shape[d] > g[d] - o[d])
        return ckptio_fail(t->err, CKPTIO_E_INVALID_ARG, "tensor '%s': dimension %d covers [%lld, %lld), outside "
                           "its global size %lld", ts[i].name, d, (long long)o[d], (long long)(o[d] + ts[i].shape[d]),
                           (long long)g[d]);
    }
  j->placed = calloc(n ? n : 1, sizeof(*j->placed));
  if (!j->placed) return ckptio_fail(t->err, -ENOMEM, "no memory for the places");
  for (; j->nplaced < n; j->nplaced++) {
    tiers_placed *p = &j->placed[j->nplaced];
    p->place = places[j->nplaced];
    if (!(p->name = strdup(ts[j->nplaced].name))) return ckptio_fail(t->err, -ENOMEM, "no memory for the places");
  }
  return 0;
}

static int save(ckptio_tiers *t, uint64_t step, const ckptio_tensor *tensors, const ckptio_tiers_place *places,
                size_t n) {
  if (!t || (n && !tensors)) return CKPTIO_E_INVALID_ARG;
  int before = tiers_join(t);
  if (before < 0 && t->o.fatal) return before; /* the previous step's, in its message */
  if (t->saved && step <= t->last_step)
    return ckptio_fail(t->err, CKPTIO_E_INVALID_ARG, "step %llu after step %llu: steps must grow",
                       (unsigned long long)step, (unsigned long long)t->last_step);
  tiers_job *j = &t->job;
  tiers_placed_free(j);
  memset(j, 0, sizeof(*j));
  int rc = places ? take_places(t, j, tensors, places, n) : 0;
  if (rc < 0) {
    tiers_placed_free(j);
    return rc;
  }
  j->step = step;
  j->due[CKPTIO_TIER_MEMORY] = t->o.memory_dir != NULL;
  j->due[CKPTIO_TIER_PEER] = t->o.peers > 0;
  j->due[CKPTIO_TIER_DURABLE] = t->o.durable_dir && step % (uint64_t)t->o.durable_every == 0;
  j->due[CKPTIO_TIER_STORAGE] = t->o.storage_dir && step % (uint64_t)t->o.storage_every == 0;
  /* The writer writes into the fastest tier due; the slower ones copy its file. */
  j->w_tier = -1;
  for (int tier = CKPTIO_TIERS - 1; tier >= 0; tier--)
    if (j->due[tier] && tier != CKPTIO_TIER_PEER) j->w_tier = tier;
  /* A step saved again (after a restore to an older one) is not published
   * until this save agrees on it. */
  char path[4096];
  for (int tier = 0; tier < CKPTIO_TIERS; tier++) {
    if (!j->due[tier]) continue;
    if (tier == CKPTIO_TIER_STORAGE && t->comm.rank == 0) tiers_obj_unmark(t, step);
    else if (tier != CKPTIO_TIER_STORAGE && t->leader &&
             tiers_mark_path(path, sizeof(path), tiers_dir(t, tier), step, tier_mark(tier)) == 0)
      unlink(path);
  }
  t->saved = 1;
  t->last_step = step;
  if (places && j->w_tier == CKPTIO_TIER_STORAGE) { /* its checkpoint is made from a local file */
    j->rc[j->w_tier] = ckptio_fail(j->why[j->w_tier], CKPTIO_E_INVALID_ARG, "a save with places to the storage "
                                   "tier writes its part into a memory or durable tier first: this handle has neither");
    j->w_tier = -1;
  }
  if (j->w_tier >= 0) j->rc[j->w_tier] = start_part(t, j, tensors, n, j->why[j->w_tier]);
  if (t->o.background && pthread_create(&t->thread, NULL, finish_thread, t) == 0) {
    t->running = 1;
    return 0;
  }
  finish(t, j);
  return j->result;
}

int ckptio_tiers_save(ckptio_tiers *t, uint64_t step, const ckptio_tensor *tensors, size_t n) {
  return save(t, step, tensors, NULL, n);
}

int ckptio_tiers_save_placed(ckptio_tiers *t, uint64_t step, const ckptio_tensor *tensors,
                             const ckptio_tiers_place *places, size_t n) {
  if (n && !places) return CKPTIO_E_INVALID_ARG;
  return save(t, step, tensors, places, n);
}
