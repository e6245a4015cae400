/* Steps saved with places (ckptio_tiers_save_placed in ckptio.h): the
 * durable and storage tiers hold them as a multi-rank checkpoint, each
 * rank's part a box of the job's global tensors, so that a job restarted
 * on another number of ranks restores from the newer of the two
 * (ckptio_tiers_restore_global) by loading its own boxes. The checkpoint
 * is written by the library's own multi-rank writer
 * (ckptio_writer_open_ranks) from the part's file that the save wrote
 * into a faster tier, its tensors handed over as views of that file: no
 * second copy of them in memory. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/collective.h"
#include "core/error.h"
#include "manage/tiers.h"

void tiers_placed_free(tiers_job *j) {
  for (size_t i = 0; i < j->nplaced; i++) free(j->placed[i].name);
  free(j->placed);
  j->placed = NULL;
  j->nplaced = 0;
}

/* The placed tensors of j, viewed in reader r, added to the ranks writer w. */
static int add_parts(ckptio_reader *r, ckptio_writer *w, const tiers_job *j, char *why) {
  for (size_t i = 0; i < j->nplaced; i++) {
    const tiers_placed *p = &j->placed[i];
    int64_t idx = ckptio_reader_find(r, p->name);
    ckptio_tensor_info info;
    ckptio_tensor d;
    const void *data;
    uint64_t nbytes;
    int rc = idx < 0 ? (int)idx : ckptio_reader_info(r, (size_t)idx, &info);
    if (rc == 0) rc = ckptio_reader_view(r, (size_t)idx, &data, &nbytes);
    if (rc < 0) return ckptio_fail(why, rc, "tensor '%s' of this rank's part: %s", p->name, ckptio_strerror(rc));
    memset(&d, 0, sizeof(d));
    d.name = p->name, d.dtype = info.dtype, d.ndim = info.ndim, d.data = data, d.device = CKPTIO_DEVICE_HOST;
    memcpy(d.shape, info.shape, sizeof(d.shape));
    if ((rc = ckptio_writer_add_part(w, &d, p->place.global_shape, p->place.offsets)) < 0)
      return ckptio_fail(why, rc, "tensor '%s': %s", p->name, ckptio_writer_last_error(w));
  }
  return 0;
}

int tiers_ranks_checkpoint(ckptio_tiers *t, tiers_job *j, int tier, const char *src, char *why) {
  char dir[4096], err[CKPTIO_ERRLEN] = "";
  const char *root = tiers_dir(t, tier), *what = tier == CKPTIO_TIER_STORAGE ? "storage" : "durable";
  ckptio_reader *r = NULL;
  ckptio_writer *w = NULL;
  int rc = j->rc[j->w_tier];
  if (rc < 0)
    ckptio_fail(why, rc, "%s", j->why[j->w_tier]);
  else if ((tier != CKPTIO_TIER_STORAGE && (rc = tiers_make_step_dir(root, j->step)) < 0) ||
           (rc = tiers_path(dir, sizeof(dir), root, j->step, NULL, 0)) < 0)
    ckptio_fail(why, rc, "%s: cannot make its step directory: %s", root, ckptio_strerror(rc));
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  ckptio_ctx_options(t->ctx, &o);
  o.crc = 1;
  if (rc == 0) {
    ckptio_options ro = o;
    ro.crc = 0; /* the save has just written it; the checkpoint's own CRCs are computed anew */
    ro.load_method = CKPTIO_LOAD_MMAP;
    if ((rc = ckptio_reader_open(t->ctx, src, &ro, &r)) < 0) ckptio_fail(why, rc, "%s", ckptio_last_open_error());
  }
  if (rc == 0 && (rc = ckptio_writer_open_ranks(t->ctx, &t->comm, dir, TIERS_RANKS_PREFIX, &o, &w)) < 0)
    ckptio_fail(why, rc, "%s", ckptio_last_open_error());
  if (rc == 0) rc = add_parts(r, w, j, why);
  /* The writer's commit is collective: every rank enters it, or none. */
  char stage[64];
  snprintf(stage, sizeof(stage), "the %s multi-rank checkpoint", what);
  int all = ckptio_comm_status_exchange(&t->comm, rc, why, stage, err);
  if (all == 0 && (rc = ckptio_writer_commit(w)) < 0) ckptio_fail(why, rc, "%s", ckptio_writer_last_error(w));
  else if (all < 0 && rc == 0) rc = ckptio_fail(why, all, "%s", err);
  ckptio_writer_close(w);
  ckptio_reader_close(r);
  return rc == 0 && tier != CKPTIO_TIER_STORAGE ? tiers_sync_step_dir(root, j->step) : rc;
}

/* ---------------------------------------------------------------- restore */

/* This rank's share of step's files (file k for k % nranks == rank) checked:
 * every CRC32. @return 0 or the failure with why; *bytes the bytes read. */
static int check_share(ckptio_tiers *t, const char *dir, uint64_t *bytes, char *why) {
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  ckptio_ctx_options(t->ctx, &o);
  o.crc = 1;
  ckptio_reader *all = NULL;
  int rc = ckptio_reader_open(t->ctx, dir, &o, &all); /* the index: every part placed, covering its tensor */
  if (rc < 0) return ckptio_fail(why, rc, "%s", ckptio_last_open_error());
  size_t n = ckptio_reader_shard_count(all);
  for (size_t k = (size_t)t->comm.rank; rc == 0 && k < n; k += (size_t)t->comm.nranks) {
    const char *path;
    uint64_t b = 0;
    ckptio_reader_shard(all, k, &path, NULL, &b);
    rc = tiers_verify(t, path, why);
    *bytes += b;
  }
  ckptio_reader_close(all);
  return rc;
}

/* The newest step below `below` (every step when !have_below) in the
 * directory root that is published and holds the multi-rank checkpoint's
 * index, or -1. */
static int64_t newest_local(const char *root, uint64_t below, int have_below) {
  uint64_t *steps;
  long n = tiers_steps(root, &steps);
  int64_t pick = -1;
  for (long i = n - 1; i >= 0 && pick < 0; i--) {
    char index[4200], dir[4096];
    if ((have_below && steps[i] >= below) || !tiers_marked(root, steps[i], TIERS_PUBLISHED)) continue;
    tiers_path(dir, sizeof(dir), root, steps[i], NULL, 0);
    snprintf(index, sizeof(index), "%s/" TIERS_RANKS_INDEX, dir);
    if (tiers_file_size(index) >= 0) pick = (int64_t)steps[i];
  }
  if (n > 0) free(steps);
  return pick;
}

/* The same in the storage's listing o. */
static int64_t newest_object(const mgr_objs *o, uint64_t below, int have_below) {
  int64_t pick = -1;
  for (size_t i = 0; i < o->n; i++) {
    uint64_t s = o->v[i].step;
    if ((have_below && s >= below) || (int64_t)s <= pick || strcmp(o->v[i].name, TIERS_RANKS_INDEX) != 0) continue;
    if (tiers_objs_size(o, s, TIERS_PUBLISHED) >= 0) pick = (int64_t)s;
  }
  return pick;
}

/* The communicator's allgather, its failure said in t->err. */
static int allgather(ckptio_tiers *t, const void *mine, void *all, size_t bytes) {
  int rc = t->comm.allgather(t->comm.user, mine, all, bytes);
  if (rc < 0)
    ckptio_fail(t->err, rc, "rank %d: the communicator's allgather failed: %s", t->comm.rank, ckptio_strerror(rc));
  return rc;
}

/* The storage's listing into *o: 1 when listed, 0 without a storage tier
 * or when it cannot be listed (warned: the durable tier may still serve). */
static int list_storage(ckptio_tiers *t, mgr_objs *o) {
  char why[CKPTIO_ERRLEN];
  int rc = t->o.storage_dir ? tiers_obj_scan(t, o, why) : -ENOENT;
  if (rc < 0 && t->o.storage_dir)
    tiers_warn(t, 0, CKPTIO_TIER_STORAGE, rc, "rank %d: cannot list the storage tier: %s", t->comm.rank, why);
  return rc == 0;
}

int ckptio_tiers_restore_global(ckptio_tiers *t, uint64_t *step, char *path, size_t len) {
  if (!t || !step || !path || !len) return CKPTIO_E_INVALID_ARG;
  tiers_join(t);
  int n = t->comm.nranks, me = t->comm.rank, rc = 0;
  if (!t->o.durable_dir && !t->o.storage_dir)
    return ckptio_fail(t->err, CKPTIO_E_INVALID_ARG, "a restore at another world size reads the durable or the "
                       "storage tier: this handle has neither");
  mgr_objs o;
  int listed = list_storage(t, &o);
  int64_t *picks = calloc((size_t)n * 2, sizeof(int64_t));
  int32_t *oks = calloc((size_t)n, sizeof(int32_t));
  if (!picks || !oks) rc = ckptio_fail(t->err, -ENOMEM, "rank %d: no memory to restore", me);
  for (int k = 0; k < CKPTIO_TIERS; k++) t->stats.restored_bytes[k] = 0;
  /* Per tier (durable, storage): the steps below this one were tried. */
  uint64_t below[2] = {0, 0};
  int have_below[2] = {0, 0};
  while (rc == 0) {
    /* The ranks agree on each tier's newest step every one of them sees,
     * and take the newer (the durable tier's when both have it). */
    int64_t mine[2] = {t->o.durable_dir ? newest_local(t->o.durable_dir, below[0], have_below[0]) : -1,
                       listed ? newest_object(&o, below[1], have_below[1]) : -1};
    int64_t s[2] = {INT64_MAX, INT64_MAX};
    if ((rc = allgather(t, mine, picks, sizeof(mine))) < 0) break;
    for (int r = 0; r < n; r++)
      for (int k = 0; k < 2; k++) s[k] = picks[2 * r + k] < s[k] ? picks[2 * r + k] : s[k];
    int k = s[0] >= s[1] ? 0 : 1, tier = k ? CKPTIO_TIER_STORAGE : CKPTIO_TIER_DURABLE;
    if (s[k] < 0) {
      rc = ckptio_fail(t->err, -ENOENT, "no step saved with places is whole and verified in the durable tier (%s) "
                       "or the storage (%s)", t->o.durable_dir ? t->o.durable_dir : "none",
                       t->o.storage_dir ? t->o.storage_dir : "none");
      break;
    }
    char why[CKPTIO_ERRLEN] = "";
    uint64_t bytes = 0;
    int v = tiers_path(path, len, tiers_dir(t, tier), (uint64_t)s[k], NULL, 0);
    if (v < 0) ckptio_fail(why, v, "path too long");
    else v = check_share(t, path, &bytes, why);
    int32_t ok = v == 0;
    if ((rc = allgather(t, &ok, oks, sizeof(ok))) < 0) break;
    int all_ok = 1;
    for (int r = 0; r < n; r++) all_ok &= oks[r] != 0;
    if (all_ok) {
      *step = (uint64_t)s[k];
      t->stats.restored_bytes[tier] = bytes;
      break;
    }
    if (!ok) {
      t->stats.skipped_copies++;
      tiers_warn(t, (uint64_t)s[k], tier, v, "rank %d, step %" PRIu64 ", %s: skipped: %s", me, (uint64_t)s[k],
                 k ? "the storage" : "the durable tier", why);
    }
    below[k] = (uint64_t)s[k], have_below[k] = 1;
  }
  if (listed) mgr_objs_free(&o);
  free(picks);
  free(oks);
  return rc;
}
