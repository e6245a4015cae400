/* Steps saved with places (ckptio_tiers_save_placed in ckptio.h): the
 * durable tier holds them as a multi-rank checkpoint, each rank's part a
 * box of the job's global tensors, so that a job restarted on another
 * number of ranks restores from it (ckptio_tiers_restore_global) by
 * loading its own boxes. The checkpoint is written by the library's own
 * multi-rank writer (ckptio_writer_open_ranks) from the part's file that
 * the save wrote into a faster tier, its tensors handed over as views of
 * that file: no second copy of them in memory. */
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

int tiers_durable_ranks(ckptio_tiers *t, tiers_job *j, const char *src, char *why) {
  char dir[4096], err[CKPTIO_ERRLEN] = "";
  ckptio_reader *r = NULL;
  ckptio_writer *w = NULL;
  int rc = j->rc[j->w_tier];
  if (rc < 0)
    ckptio_fail(why, rc, "%s", j->why[j->w_tier]);
  else if ((rc = tiers_make_step_dir(t->o.durable_dir, j->step)) < 0 ||
           (rc = tiers_path(dir, sizeof(dir), t->o.durable_dir, j->step, NULL, 0)) < 0)
    ckptio_fail(why, rc, "%s: cannot make its step directory: %s", t->o.durable_dir, ckptio_strerror(rc));
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
  int all = ckptio_comm_status_exchange(&t->comm, rc, why, "the durable multi-rank checkpoint", err);
  if (all == 0 && (rc = ckptio_writer_commit(w)) < 0) ckptio_fail(why, rc, "%s", ckptio_writer_last_error(w));
  else if (all < 0 && rc == 0) rc = ckptio_fail(why, all, "%s", err);
  ckptio_writer_close(w);
  ckptio_reader_close(r);
  return rc == 0 ? tiers_sync_step_dir(t->o.durable_dir, j->step) : rc;
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

/* This rank's newest durable step below `below` (all steps when !have_below)
 * that is published and holds the multi-rank checkpoint's index; -1 if none. */
static int64_t newest(ckptio_tiers *t, uint64_t below, int have_below) {
  uint64_t *steps;
  long n = tiers_steps(t->o.durable_dir, &steps);
  int64_t pick = -1;
  for (long i = n - 1; i >= 0 && pick < 0; i--) {
    char index[4200], dir[4096];
    if ((have_below && steps[i] >= below) || !tiers_marked(t->o.durable_dir, steps[i], TIERS_PUBLISHED)) continue;
    tiers_path(dir, sizeof(dir), t->o.durable_dir, steps[i], NULL, 0);
    snprintf(index, sizeof(index), "%s/" TIERS_RANKS_PREFIX ".safetensors.index.json", dir);
    if (tiers_file_size(index) >= 0) pick = (int64_t)steps[i];
  }
  if (n > 0) free(steps);
  return pick;
}

/* The communicator's allgather, its failure said in t->err. */
static int allgather(ckptio_tiers *t, const void *mine, void *all, size_t bytes) {
  int rc = t->comm.allgather(t->comm.user, mine, all, bytes);
  if (rc < 0)
    ckptio_fail(t->err, rc, "rank %d: the communicator's allgather failed: %s", t->comm.rank, ckptio_strerror(rc));
  return rc;
}

int ckptio_tiers_restore_global(ckptio_tiers *t, uint64_t *step, char *path, size_t len) {
  if (!t || !step || !path || !len) return CKPTIO_E_INVALID_ARG;
  tiers_join(t);
  int n = t->comm.nranks, me = t->comm.rank, rc = 0, have_below = 0;
  if (!t->o.durable_dir)
    return ckptio_fail(t->err, CKPTIO_E_INVALID_ARG, "a restore at another world size reads the durable tier: "
                       "this handle has none");
  int64_t *picks = calloc((size_t)n, sizeof(int64_t));
  int32_t *oks = calloc((size_t)n, sizeof(int32_t));
  if (!picks || !oks) rc = ckptio_fail(t->err, -ENOMEM, "rank %d: no memory to restore", me);
  for (int k = 0; k < CKPTIO_TIERS; k++) t->stats.restored_bytes[k] = 0;
  uint64_t below = 0;
  while (rc == 0) {
    /* The ranks agree on the newest step every one of them sees. */
    int64_t mine = newest(t, below, have_below), s = INT64_MAX;
    if ((rc = allgather(t, &mine, picks, sizeof(mine))) < 0) break;
    for (int r = 0; r < n; r++) s = picks[r] < s ? picks[r] : s;
    if (s < 0) {
      rc = ckptio_fail(t->err, -ENOENT, "no step of the durable tier %s saved with places is whole and verified",
                       t->o.durable_dir);
      break;
    }
    char why[CKPTIO_ERRLEN] = "";
    uint64_t bytes = 0;
    int v = tiers_path(path, len, t->o.durable_dir, (uint64_t)s, NULL, 0);
    if (v < 0) ckptio_fail(why, v, "path too long");
    else v = check_share(t, path, &bytes, why);
    int32_t ok = v == 0;
    if ((rc = allgather(t, &ok, oks, sizeof(ok))) < 0) break;
    int all_ok = 1;
    for (int r = 0; r < n; r++) all_ok &= oks[r] != 0;
    if (all_ok) {
      *step = (uint64_t)s;
      t->stats.restored_bytes[CKPTIO_TIER_DURABLE] = bytes;
      break;
    }
    if (!ok) {
      t->stats.skipped_copies++;
      tiers_warn(t, (uint64_t)s, CKPTIO_TIER_DURABLE, v, "rank %d, step %" PRIu64 ", the durable tier: skipped: %s",
                 me, (uint64_t)s, why);
    }
    below = (uint64_t)s, have_below = 1;
  }
  free(picks);
  free(oks);
  return rc;
}
