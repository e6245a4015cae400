/* Multi-rank saves: this rank's side of one checkpoint written by N
 * processes. commit_async agrees on the plan (ranks_plan.c) and starts this
 * rank's file, held at "temp file synced"; wait_durable runs the commit's
 * agreement on the calling thread — status, swap, status, index by rank 0 —
 * undoing this rank's swap if any rank fails before the index is in place.
 * See ckptio.h ("ranks") and docs/FORMATS.md for the guarantees. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/collective.h"
#include "core/error.h"
#include "core/shardname.h"
#include "core/sized.h"
#include "core/stats.h"
#include "formats/hf_index.h"
#include "ctx/ctx.h"
#include "io/file.h"
#include "io/publish.h"
#include "save/collect.h"
#include "save/objects.h"
#include "save/ranks.h"
#include "save/save.h"

typedef struct ranks_writer {
  ckptio_many_writer m;   /* first: the public handle, dir, options, what is collected */
  ckptio_comm comm;
  int local_rc;           /* this rank's failure after the plan (reported at the agreement) */
  ckptio_rplan plan;
  ckptio_writer *sub;     /* this rank's file, or NULL when it writes none */
  ckptio_tmpfile file;
  ckptio_swap how;
  int result;             /* once CKPTIO_WRITER_DONE */
  uint64_t start_ns, end_ns, publish_ns;
} ranks_writer;

static const ckptio_writer_ops ranks_ops;

static int single_allgather(void *user, const void *send, void *recv, size_t bytes) {
  (void)user;
  memmove(recv, send, bytes);
  return 0;
}

static int single_broadcast(void *user, void *buf, size_t bytes, int root) {
  (void)user, (void)buf, (void)bytes, (void)root;
  return 0;
}

static int single_alltoallv(void *user, const void *send, const size_t *send_counts, void *recv,
                            const size_t *recv_counts) {
  (void)user;
  if (send_counts[0] != recv_counts[0]) return CKPTIO_E_INVALID_ARG;
  memmove(recv, send, send_counts[0]);
  return 0;
}

/* Two symbols of one name (ckptio.h): ckptio_comm_single@@CKPTIO_1.1, the
 * default, and, for a program linked against 1.0, ckptio_comm_single@CKPTIO_1.0,
 * given 1.0's struct, which ends before alltoallv (src/ckptio.map lists the
 * name under both nodes). */
__attribute__((visibility("default"))) void ckptio_comm_single_v1_1(ckptio_comm *out);
__attribute__((visibility("default"))) void ckptio_comm_single_v1_0(ckptio_comm *out);
__asm__(".symver ckptio_comm_single_v1_1, ckptio_comm_single@@CKPTIO_1.1");
__asm__(".symver ckptio_comm_single_v1_0, ckptio_comm_single@CKPTIO_1.0");

void ckptio_comm_single_v1_1(ckptio_comm *out) {
  if (out)
    *out = (ckptio_comm){sizeof(ckptio_comm), 0, 1, NULL, single_allgather, single_broadcast, single_alltoallv};
}

void ckptio_comm_single_v1_0(ckptio_comm *out) {
  ckptio_comm c;
  ckptio_comm_single_v1_1(&c);
  c.size = offsetof(ckptio_comm, alltoallv);
  if (out) memcpy(out, &c, c.size);
}

int ckptio_ranks_writer_open(ckptio_ctx *ctx, const ckptio_comm *comm, const char *dir, const char *prefix,
                             const ckptio_options *opts, char *err, ckptio_writer **out) {
  char msg[CKPTIO_ERRLEN] = "";
  int rc = CKPTIO_E_INVALID_ARG;
  if (!out) return rc;
  *out = NULL;
  ranks_writer *w;
  if (!ctx || !comm || !dir || !*dir || !prefix) return rc;
  /* An older, shorter communicator lacks the fields past its size: they
   * are zero, so a missing collective is refused below like a NULL one. */
  ckptio_comm c;
  memset(&c, 0, sizeof(c));
  if ((rc = ckptio_sized_in(comm, &c, sizeof(c), "ckptio_comm", msg, sizeof(msg))) < 0) goto fail;
  rc = CKPTIO_E_INVALID_ARG;
  if (c.nranks < 1 || c.rank < 0 || c.rank >= c.nranks || !c.allgather || !c.broadcast) {
    snprintf(msg, sizeof(msg), "%s: the communicator needs 0 <= rank < nranks, allgather and broadcast (its size %zu)",
             dir, comm->size);
    goto fail;
  }
  ckptio_many_writer *m;
  if ((rc = ckptio_many_open(sizeof(*w), ctx, &ranks_ops, opts, dir, prefix, "multi-rank files", &m, msg)) < 0)
    goto fail;
  w = (ranks_writer *)m;
  w->comm = c;
  w->file.fd = w->file.fd_direct = -1;
  *out = &w->m.base;
  return 0;
fail:
  if (*msg) snprintf(err, CKPTIO_ERRLEN, "%s", msg);
  return rc;
}

static int ranks_add_box(ranks_writer *w, const ckptio_tensor *t, const int64_t *global, const int64_t *offsets,
                         ckptio_fill fill) {
  if (!t || !t->name) return CKPTIO_E_INVALID_ARG;
  return ckptio_collect_add(&w->m.c, t, global, offsets, fill, w->m.base.err);
}

static int ranks_add_part(ckptio_writer *base, const ckptio_tensor *t, const int64_t *global, const int64_t *offsets) {
  return ranks_add_box((ranks_writer *)base, t, global, offsets, (ckptio_fill){NULL, NULL});
}

static int ranks_add(ckptio_writer *base, const ckptio_tensor *t, ckptio_fill fill) {
  return ranks_add_box((ranks_writer *)base, t, NULL, NULL, fill);
}

/* The file name of file k (0-based) of the plan. */
static void file_name(const ranks_writer *w, size_t k, char *buf, size_t len) {
  ckptio_shardname_format(buf, len, w->m.prefix, k, w->plan.nfiles, w->m.store ? w->plan.save_id : NULL);
}

/* The path of file k, malloc'd. */
static char *file_path(const ranks_writer *w, size_t k) {
  char name[4096];
  file_name(w, k, name, sizeof(name));
  return ckptio_path_join(w->m.dir, name);
}

/* Opens this rank's file writer with the boxes the plan gives it, and
 * starts its save. */
static int start_file(ranks_writer *w) {
  int k = w->plan.file_of[w->comm.rank];
  if (k < 0) return 0;
  char tag[64], rank[32], *path = file_path(w, (size_t)k);
  if (!path) return -ENOMEM;
  char msg[CKPTIO_ERRLEN] = "";
  int rc = ckptio_file_writer_open(w->m.ctx, path, CKPTIO_FORMAT_SAFETENSORS, &w->m.opts, msg, &w->sub);
  free(path);
  if (rc < 0)
    return ckptio_fail(w->m.base.err, rc, "%s: rank %d: %s", w->m.dir, w->comm.rank, *msg ? msg : ckptio_strerror(rc));
  ckptio_writer *s = w->sub;
  snprintf(tag, sizeof(tag), "%d/%zu", k + 1, w->plan.nfiles);
  snprintf(rank, sizeof(rank), "%d", w->comm.rank);
  rc = ckptio_collect_apply(&w->m.c, s);
  if (rc == 0) rc = ckptio_file_writer_set_reserved_metadata(s, "ckptio.save_id", w->plan.save_id);
  if (rc == 0) rc = ckptio_file_writer_set_reserved_metadata(s, "ckptio.shard", tag);
  if (rc == 0) rc = ckptio_file_writer_set_reserved_metadata(s, "ckptio.rank", rank);
  for (size_t i = 0; i < w->plan.nboxes && rc == 0; i++)
    if (w->plan.boxes[i].writer == w->comm.rank) {
      const ckptio_ctensor *ct = &w->m.c.tensors[w->plan.boxes[i].local];
      rc = s->ops->add(s, &ct->t, ct->fill);
    }
  if (rc == 0) rc = ckptio_file_writer_hold_publish(s);
  s->sync = w->m.base.sync;
  if (rc == 0) rc = s->ops->commit_async(s);
  if (rc < 0) return ckptio_fail(w->m.base.err, rc, "%s: rank %d: %s", w->m.dir, w->comm.rank, s->err);
  return 0;
}

static int ranks_commit_async(ckptio_writer *base) {
  ranks_writer *w = (ranks_writer *)base;
  w->m.base.err[0] = '\0';
  char id[33];
  ckptio_save_id_make(id);
  w->start_ns = ckptio_now_ns();
  int rc = ckptio_rplan_make(&w->comm, &w->m.c, 0, NULL, id, &w->plan, w->m.base.err);
  if (rc == CKPTIO_E_RANK) { /* the same verdict on every rank: nothing to agree on later */
    w->m.base.state = CKPTIO_WRITER_DONE;
    w->result = rc;
    return rc;
  }
  if (rc < 0) { /* this rank's alone (memory, the communicator): told at the agreement */
    w->m.base.state = CKPTIO_WRITER_RUNNING;
    return w->local_rc = rc;
  }
  if (w->plan.nboxes == 0) {
    w->m.base.state = CKPTIO_WRITER_DONE;
    return w->result = ckptio_fail(w->m.base.err, CKPTIO_E_INVALID_ARG, "%s: a multi-rank save needs at least one tensor",
                                   w->m.dir);
  }
  w->m.base.state = CKPTIO_WRITER_RUNNING;
  /* A failure from here on is this rank's alone: the others learn it at the
   * agreement, which wait_durable or close (collective) runs. */
  return w->local_rc = start_file(w);
}

/* A rank that cannot take part still joins the gather, with its failure
 * instead of its tensors, so no rank waits for it and every one fails
 * naming it. */
static int ranks_abort(ckptio_writer *base, int code, const char *why) {
  ranks_writer *w = (ranks_writer *)base;
  char id[33];
  ckptio_save_id_make(id);
  if (code >= 0) code = CKPTIO_E_RANK;
  char msg[CKPTIO_ERRLEN];
  snprintf(msg, sizeof(msg), "%s", why && *why ? why : ckptio_strerror(code));
  int rc = ckptio_rplan_make(&w->comm, &w->m.c, code, msg, id, &w->plan, w->m.base.err);
  ckptio_rplan_free(&w->plan);
  w->m.base.state = CKPTIO_WRITER_ABORTED;
  if (rc == -ENOMEM || rc == CKPTIO_E_RANK) rc = code; /* this rank's own failure stands */
  w->result = ckptio_fail(w->m.base.err, rc, "%s: rank %d: %s", w->m.dir, w->comm.rank, msg);
  return w->result;
}

/* ------------------------------------------------------------ the commit */

/* The index, by rank 0: whole tensors in weight_map, split ones in the
 * ckptio section. */
static int index_json(ranks_writer *w, ckptio_json_out *o) {
  const ckptio_rplan *p = &w->plan;
  size_t len = strlen(w->m.prefix) + 64;
  ckptio_hf_weight *map = calloc(p->ntensors + 1, sizeof(*map));
  ckptio_split_out *split = calloc(p->ntensors + 1, sizeof(*split));
  ckptio_split_part_out *parts = calloc(p->nboxes + 1, sizeof(*parts));
  char *names = calloc(p->nfiles + 1, len);
  size_t nmap = 0, nsplit = 0;
  int rc = -ENOMEM;
  if (!map || !split || !parts || !names) goto out;
  for (size_t k = 0; k < p->nfiles; k++) file_name(w, k, names + k * len, len);
  for (size_t t = 0; t < p->ntensors; t++) {
    size_t a = p->first[t], b = p->first[t + 1];
    const ckptio_rbox *x = &p->boxes[a];
    if (b - a == 1) {
      map[nmap++] = (ckptio_hf_weight){x->name, names + (size_t)p->file_of[x->writer] * len};
      continue;
    }
    for (size_t i = a; i < b; i++)
      parts[i] = (ckptio_split_part_out){names + (size_t)p->file_of[p->boxes[i].writer] * len, p->boxes[i].off,
                                         p->boxes[i].size};
    split[nsplit++] = (ckptio_split_out){x->name, x->dtype, x->ndim, x->global, parts + a, b - a};
  }
  ckptio_kv id = {"ckptio.save_id", p->save_id};
  rc = ckptio_hf_index_write(map, nmap, split, nsplit, &id, 1, p->total_bytes, o);
out:
  free(map);
  free(split);
  free(parts);
  free(names);
  return rc;
}

/* Rank 0: the index written to its temp file, synced, renamed into place,
 * and the rename made durable before any rank removes an old file (a
 * filesystem may persist those unlinks first, and an old index would then
 * name files nobody holds). A failure of that last sync comes back in
 * *late: the checkpoint is published then, and nothing is undone. */
static int publish_index(ranks_writer *w, int *late) {
  ckptio_json_out o = {0};
  ckptio_tmpfile t = {.fd = -1, .fd_direct = -1};
  ckptio_swap how = CKPTIO_SWAP_NONE;
  char name[4096];
  snprintf(name, sizeof(name), "%s.safetensors.index.json", w->m.prefix);
  char *path = ckptio_path_join(w->m.dir, name);
  int rc = path ? 0 : -ENOMEM;
  if (rc == 0 && w->m.opts.fsync && (rc = ckptio_dir_sync(w->m.dir)) < 0)
    ckptio_fail(w->m.base.err, rc, "%s: fsync of the directory: %s", w->m.dir, ckptio_errno_text(-rc));
  if (rc == 0 && (rc = index_json(w, &o)) < 0)
    ckptio_fail(w->m.base.err, rc, "%s: the index: %s", path, ckptio_strerror(rc));
  if (rc == 0) rc = ckptio_tmpfile_open(&t, path, 0, o.len, w->m.base.err, sizeof(w->m.base.err));
  if (rc == 0 && (rc = ckptio_pwrite_full(t.fd, o.data, o.len, 0)) < 0)
    ckptio_fail(w->m.base.err, rc, "%s: write of the index: %s", path, ckptio_strerror(rc));
  if (rc == 0) rc = ckptio_tmpfile_sync(&t, o.len, w->m.opts.fsync, w->m.base.err, sizeof(w->m.base.err));
  if (rc == 0) rc = ckptio_tmpfile_swap_in(&t, &how, w->m.base.err, sizeof(w->m.base.err));
  if (rc == 0 && w->m.opts.fsync && (*late = ckptio_dir_sync(w->m.dir)) < 0)
    ckptio_fail(w->m.base.err, *late, "%s: fsync of the directory after publishing the index: %s", w->m.dir,
                ckptio_errno_text(-*late));
  /* Not known durable: the old index keeps its temp name (as if renamed). */
  if (rc == 0) ckptio_tmpfile_release(&t, *late < 0 ? CKPTIO_SWAP_NONE : how, NULL);
  else ckptio_tmpfile_abort(&t);
  free(o.data);
  free(path);
  return rc;
}

/* In a storage: every rank publishes its object, then rank 0 the index,
 * the moment the checkpoint changes (save/objects.h); before that, a
 * failure anywhere takes back what this save published. After it, rank 0
 * removes the older saves' objects and the uploads crashed saves left. */
static int publish_objects(ranks_writer *w) {
  char *err = w->m.base.err;
  int mine = w->file.obj != NULL, rc = 0;
  if (mine) rc = ckptio_tmpfile_commit(&w->file, 0, w->m.opts.fsync, NULL, err, CKPTIO_ERRLEN);
  int published = mine && rc == 0;
  rc = ckptio_comm_status_exchange(&w->comm, rc, err, w->m.dir, err);
  if (rc == 0 && w->comm.rank == 0) {
    ckptio_json_out o = {0};
    char name[4096], *path;
    snprintf(name, sizeof(name), "%s.safetensors.index.json", w->m.prefix);
    rc = (path = ckptio_path_join(w->m.dir, name)) ? index_json(w, &o) : -ENOMEM;
    if (rc == 0) rc = ckptio_objects_put(w->m.store, path, o.data, o.len, w->m.opts.fsync, err, CKPTIO_ERRLEN);
    else ckptio_fail(err, rc, "%s: the index: %s", w->m.dir, ckptio_strerror(rc));
    free(o.data);
    free(path);
  }
  rc = ckptio_comm_status_broadcast(&w->comm, 0, rc, err, w->m.dir, err);
  char **paths = calloc(w->plan.nfiles + 1, sizeof(char *));
  for (size_t k = 0; paths && k < w->plan.nfiles; k++) paths[k] = file_path(w, k);
  if (rc < 0 && published && paths && paths[w->plan.file_of[w->comm.rank]])
    ckptio_objects_remove(w->m.store, paths[w->plan.file_of[w->comm.rank]]);
  if (rc == 0 && w->comm.rank == 0 && paths) ckptio_objects_sweep(w->m.store, w->m.dir, w->m.prefix, paths, w->plan.nfiles);
  for (size_t k = 0; paths && k < w->plan.nfiles; k++) free(paths[k]);
  free(paths);
  return rc;
}

/* This rank's part of the commit, every step agreed with the others. */
static int agree_and_publish(ranks_writer *w) {
  char *err = w->m.base.err;
  int rc = w->local_rc;
  if (rc == 0 && w->sub && (rc = w->sub->ops->wait_durable(w->sub)) < 0)
    ckptio_fail(w->m.base.err, rc, "%s: rank %d: %s", w->m.dir, w->comm.rank, w->sub->err);
  if (rc == 0 && w->sub && (rc = ckptio_file_writer_take_file(w->sub, &w->file)) < 0)
    ckptio_fail(w->m.base.err, rc, "%s: rank %d: internal error: no synced temp file", w->m.dir, w->comm.rank);
  rc = ckptio_comm_status_exchange(&w->comm, rc, err, w->m.dir, err);
  if (rc < 0) goto undo;
  uint64_t t0 = ckptio_now_ns();
  if (w->m.store) {
    rc = publish_objects(w);
    w->publish_ns = ckptio_now_ns() - t0;
    return rc;
  }
  if (w->file.tmp) rc = ckptio_tmpfile_swap_in(&w->file, &w->how, err, CKPTIO_ERRLEN);
  rc = ckptio_comm_status_exchange(&w->comm, rc, err, w->m.dir, err);
  if (rc < 0) goto undo;
  int late = 0;
  if (w->comm.rank == 0) rc = publish_index(w, &late);
  rc = ckptio_comm_status_broadcast(&w->comm, 0, rc, err, w->m.dir, err);
  if (rc < 0) goto undo;
  /* Published; nothing below undoes it. Every rank learns whether the
   * index is known durable: if not, the old files stay (under their temp
   * names, strays a later save removes) and the save reports the error. */
  rc = ckptio_comm_status_broadcast(&w->comm, 0, late, err, w->m.dir, err);
  ckptio_held held = {0}; /* the replaced and the stale files, closed off the save */
  if (w->file.tmp || w->file.fd >= 0) ckptio_tmpfile_release(&w->file, rc < 0 ? CKPTIO_SWAP_NONE : w->how, &held);
  if (rc == 0 && w->comm.rank == 0) {
    ckptio_remove_stale_shards(w->m.dir, w->m.prefix, w->plan.nfiles, &held);
    ckptio_remove_stray_temps(w->m.dir, w->m.prefix);
  }
  ckptio_closer_add(&w->m.ctx->closer, &held);
  if (rc == 0 && w->comm.rank == 0 && w->m.opts.fsync && (rc = ckptio_dir_sync(w->m.dir)) < 0)
    ckptio_fail(w->m.base.err, rc, "%s: fsync of the directory after removing the old files: %s", w->m.dir,
                ckptio_errno_text(-rc));
  w->publish_ns = ckptio_now_ns() - t0;
  return rc;
undo:
  if (w->m.store) ckptio_tmpfile_abort(&w->file); /* the upload, abandoned */
  ckptio_tmpfile_swap_back(&w->file, w->how);
  w->how = CKPTIO_SWAP_NONE;
  return rc;
}

static int ranks_wait_durable(ckptio_writer *base) {
  ranks_writer *w = (ranks_writer *)base;
  if (w->m.base.state == CKPTIO_WRITER_DONE) return w->result;
  if (w->m.base.state != CKPTIO_WRITER_RUNNING) return CKPTIO_E_STATE;
  w->result = agree_and_publish(w);
  w->end_ns = ckptio_now_ns();
  w->m.base.state = CKPTIO_WRITER_DONE;
  return w->result;
}

static int ranks_wait_snapshot(ckptio_writer *base) {
  ranks_writer *w = (ranks_writer *)base;
  if (w->m.base.state == CKPTIO_WRITER_OPEN || w->m.base.state == CKPTIO_WRITER_ABORTED) return CKPTIO_E_STATE;
  if (w->local_rc < 0 || (w->m.base.state == CKPTIO_WRITER_DONE && w->result < 0)) return w->local_rc < 0 ? w->local_rc : w->result;
  int rc = w->sub ? w->sub->ops->wait_snapshot(w->sub) : 0;
  /* This rank's own failure, named; the others learn it at wait_durable. */
  return rc < 0 ? ckptio_fail(w->m.base.err, rc, "%s: rank %d: %s", w->m.dir, w->comm.rank, w->sub->err) : rc;
}

static int ranks_poll_durable(ckptio_writer *base) {
  ranks_writer *w = (ranks_writer *)base;
  if (w->m.base.state == CKPTIO_WRITER_OPEN || w->m.base.state == CKPTIO_WRITER_ABORTED) return CKPTIO_E_STATE;
  return w->m.base.state == CKPTIO_WRITER_DONE ? (w->result < 0 ? w->result : 1) : 0;
}

static int ranks_poll_snapshot(ckptio_writer *base) {
  ranks_writer *w = (ranks_writer *)base;
  if (w->m.base.state == CKPTIO_WRITER_OPEN || w->m.base.state == CKPTIO_WRITER_ABORTED) return CKPTIO_E_STATE;
  if (w->local_rc < 0 || (w->m.base.state == CKPTIO_WRITER_DONE && w->result < 0)) return w->local_rc < 0 ? w->local_rc : w->result;
  return w->sub ? w->sub->ops->poll_snapshot(w->sub) : 1;
}

static int ranks_stats(const ckptio_writer *base, ckptio_stats *out) {
  const ranks_writer *w = (const ranks_writer *)base;
  ckptio_stats s = CKPTIO_STATS_INIT;
  s.threads = w->m.ctx->opts.threads;
  if (w->sub) {
    int rc = w->sub->ops->stats(w->sub, &s);
    if (rc < 0) return rc;
  }
  if (w->m.base.state == CKPTIO_WRITER_RUNNING || w->m.base.state == CKPTIO_WRITER_DONE) {
    s.seconds = (double)((w->end_ns ? w->end_ns : ckptio_now_ns()) - w->start_ns) / 1e9;
    s.commit_seconds += (double)w->publish_ns / 1e9;
  }
  return ckptio_sized_out(out, &s, sizeof(s), "ckptio_stats", NULL, 0);
}

static void ranks_progress(ckptio_writer *base, uint64_t *done, uint64_t *total) {
  ranks_writer *w = (ranks_writer *)base;
  if (w->sub) {
    w->sub->ops->progress(w->sub, done, total);
    return;
  }
  if (done) *done = 0;
  if (total) *total = 0;
}

static size_t ranks_shard_count(const ckptio_writer *base) {
  const ranks_writer *w = (const ranks_writer *)base;
  return w->m.base.state == CKPTIO_WRITER_RUNNING || w->m.base.state == CKPTIO_WRITER_DONE ? w->plan.nfiles : 0;
}

static int ranks_close(ckptio_writer *base) {
  ranks_writer *w = (ranks_writer *)base;
  int rc = w->m.base.state == CKPTIO_WRITER_RUNNING ? ranks_wait_durable(base) : 0;
  if (w->sub) w->sub->ops->close(w->sub); /* removes a temp file not taken */
  ckptio_tmpfile_abort(&w->file);
  ckptio_rplan_free(&w->plan);
  ckptio_many_free(&w->m);
  return rc;
}

static const ckptio_writer_ops ranks_ops = {
    .set_metadata = ckptio_many_set_metadata,
    .set_stream = ckptio_many_set_stream,
    .add = ranks_add,
    .commit_async = ranks_commit_async,
    .wait_snapshot = ranks_wait_snapshot,
    .wait_durable = ranks_wait_durable,
    .poll_snapshot = ranks_poll_snapshot,
    .poll_durable = ranks_poll_durable,
    .progress = ranks_progress,
    .stats = ranks_stats,
    .shard_count = ranks_shard_count,
    .close = ranks_close,
    .add_part = ranks_add_part,
    .abort = ranks_abort,
};
