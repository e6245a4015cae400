/* Tiered multi-rank checkpoints (ckptio_tiers_* in ckptio.h): the handle,
 * its options, warnings and counters, and the CRC check of a part. The save
 * is tiers_save.c, the restore tiers_restore.c. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/sized.h"
#include "manage/tiers.h"

const char *tiers_dir(const ckptio_tiers *t, int tier) {
  return tier == CKPTIO_TIER_DURABLE ? t->o.durable_dir : tier == CKPTIO_TIER_STORAGE ? t->o.storage_dir
                                                                                      : t->o.memory_dir;
}

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
  if (!o.memory_dir && !o.durable_dir && !o.storage_dir)
    return fail_open(msg, CKPTIO_E_INVALID_ARG, "ckptio_tiers_open: no tier: set memory_dir, durable_dir, "
                     "storage_dir or several");
  if (o.memory_keep < 1 || o.durable_keep < 1 || o.durable_every < 1 || o.storage_keep < 1 || o.storage_every < 1)
    return fail_open(msg, CKPTIO_E_INVALID_ARG, "ckptio_tiers_open: memory_keep, durable_keep, durable_every, "
                     "storage_keep and storage_every must be at least 1");
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
    t->o.storage_dir = dup_or_null(o.storage_dir, &bad);
  }
  if (bad) {
    ckptio_tiers_close(t);
    return fail_open(msg, -ENOMEM, "ckptio_tiers_open: no memory");
  }
  t->ctx = ctx;
  t->comm = c;
  int rc = t->o.storage_dir ? tiers_obj_open(t, why) : 0;
  if (rc < 0) {
    ckptio_tiers_close(t);
    return fail_open(msg, rc, "ckptio_tiers_open: %s", why);
  }
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
  tiers_join(t);
  tiers_placed_free(&t->job);
  free((char *)t->o.memory_dir);
  free((char *)t->o.durable_dir);
  free((char *)t->o.storage_dir);
  free(t);
}

int tiers_verify(ckptio_tiers *t, const char *path, char *why) {
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  ckptio_ctx_options(t->ctx, &o);
  o.crc = 1;
  /* The CRCs straight from the page cache's mapping (a part in memory is
   * already there): no copy of the file into the ring. */
  o.load_method = CKPTIO_LOAD_MMAP;
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

int tiers_load(ckptio_tiers *t, const char *path, const ckptio_tiers_dest *dests, size_t n, char *why) {
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  ckptio_ctx_options(t->ctx, &o);
  o.crc = 1;
  ckptio_reader *r = NULL;
  ckptio_load_request *reqs = calloc(n ? n : 1, sizeof(*reqs));
  int rc = reqs ? ckptio_reader_open(t->ctx, path, &o, &r) : -ENOMEM;
  if (rc < 0) {
    free(reqs);
    return rc == -ENOMEM ? ckptio_fail(why, rc, "no memory") : ckptio_fail(why, rc, "%s", ckptio_last_open_error());
  }
  for (size_t i = 0; rc == 0 && i < n; i++) {
    int64_t idx = ckptio_reader_find(r, dests[i].name);
    if (idx < 0) rc = ckptio_fail(why, (int)idx, "%s: no tensor '%s'", path, dests[i].name);
    reqs[i] = (ckptio_load_request){(size_t)idx, dests[i].dst, dests[i].dst_bytes, dests[i].device};
  }
  if (rc == 0 && (rc = ckptio_reader_load_many(r, reqs, n)) < 0)
    ckptio_fail(why, rc, "%s", ckptio_reader_last_error(r));
  ckptio_reader_close(r);
  free(reqs);
  return rc;
}
