/* Sharded saves (Hugging Face layout): tensors are spread over shard files
 * in the order added, one ckptio_writer per shard on the same context, all
 * held at "temp file synced"; a coordinator thread then swaps every shard
 * into place and writes the index last, undoing the swaps if anything fails
 * before the index is renamed. See ckptio.h for the guarantees. */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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
#include "save/save.h"

typedef struct set_writer {
  ckptio_many_writer m;   /* first: the public handle, dir, options, what is collected */
  uint64_t max_shard_bytes;
  ckptio_shard_order order;

  size_t nshards;
  size_t *order_of;       /* [i]: the tensor at position i of the shards' order */
  size_t *first;          /* [k]: first position of shard k; [nshards] = count */
  ckptio_writer **sub;    /* one file writer per shard, driven by its verbs */
  ckptio_tmpfile *files;  /* taken from the subs at publish */
  ckptio_swap *how;
  char save_id[33];
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int durable_done, result;
  uint64_t start_ns;              /* commit_async; for stats */
  _Atomic uint64_t end_ns;        /* durable (or failed), set by shard_main */
  _Atomic uint64_t publish_ns;    /* renames, index write, directory syncs */
} set_writer;

static const ckptio_writer_ops set_ops;

int ckptio_set_writer_open(ckptio_ctx *ctx, const char *dir, const char *prefix, ckptio_format format,
                           uint64_t max_shard_bytes, ckptio_shard_order order, const ckptio_options *opts,
                           char *err, ckptio_writer **out) {
  char msg[CKPTIO_ERRLEN] = "";
  int rc = CKPTIO_E_INVALID_ARG;
  if (!out) return rc;
  *out = NULL;
  if (!ctx || !dir || !*dir || !prefix) return rc;
  set_writer *w;
  if (format != CKPTIO_FORMAT_SAFETENSORS) {
    rc = CKPTIO_E_FORMAT;
    snprintf(msg, sizeof(msg), "%s: sharded saves are safetensors only", dir);
    goto fail;
  }
  if (max_shard_bytes == 0) {
    snprintf(msg, sizeof(msg), "%s: max_shard_bytes must be > 0", dir);
    goto fail;
  }
  if (order != CKPTIO_SHARD_ORDER_ADDED && order != CKPTIO_SHARD_ORDER_HF) {
    snprintf(msg, sizeof(msg), "%s: unknown shard order %d", dir, (int)order);
    goto fail;
  }
  /* Shards are read directly by Hugging Face tools, which know no zstd. */
  ckptio_many_writer *m;
  if ((rc = ckptio_many_open(sizeof(*w), ctx, &set_ops, opts, dir, prefix, "shards", &m, msg)) < 0) goto fail;
  w = (set_writer *)m;
  w->max_shard_bytes = max_shard_bytes;
  w->order = order;
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  *out = &w->m.base;
  return 0;
fail:
  if (*msg) snprintf(err, CKPTIO_ERRLEN, "%s", msg);
  return rc;
}

static int set_add(ckptio_writer *base, const ckptio_tensor *t, ckptio_fill fill) {
  set_writer *w = (set_writer *)base;
  if (!t || !t->name) return CKPTIO_E_INVALID_ARG;
  return ckptio_collect_add(&w->m.c, t, NULL, NULL, fill, w->m.base.err);
}

/* Shards are runs of tensors: a new shard starts when the next tensor
 * would push a non-empty shard over the limit (Hugging Face's fill rule).
 * In the order added, a tensor over the limit starts a shard of its own
 * where it comes; with CKPTIO_SHARD_ORDER_HF it gets its shard at once,
 * before the shard still being filled, as huggingface_hub's
 * split_torch_state_dict_into_shards places it. */
static int assign_shards(set_writer *w) {
  size_t *open = calloc(w->m.c.count + 1, sizeof(size_t)); /* the shard being filled */
  w->first = calloc(w->m.c.count + 2, sizeof(size_t));
  w->order_of = calloc(w->m.c.count + 1, sizeof(size_t));
  if (!open || !w->first || !w->order_of) {
    free(open);
    return -ENOMEM;
  }
  size_t n = 0, pos = 0, nopen = 0;
  uint64_t fill = 0;
  for (size_t i = 0; i <= w->m.c.count; i++) {
    uint64_t b = i < w->m.c.count ? w->m.c.tensors[i].nbytes : 0;
    int alone = i < w->m.c.count && w->order == CKPTIO_SHARD_ORDER_HF && b > w->max_shard_bytes;
    if (nopen && (i == w->m.c.count || (fill > 0 && fill + b > w->max_shard_bytes && !alone))) {
      w->first[n++] = pos;
      memcpy(w->order_of + pos, open, nopen * sizeof(size_t));
      pos += nopen;
      nopen = 0;
      fill = 0;
    }
    if (i == w->m.c.count) break;
    if (alone) {
      w->first[n++] = pos;
      w->order_of[pos++] = i;
      continue;
    }
    open[nopen++] = i;
    fill += b;
  }
  free(open);
  w->first[n] = w->m.c.count;
  w->nshards = n;
  return 0;
}

/* The tensor at position i of the shards' order. */
static const ckptio_ctensor *placed(const set_writer *w, size_t i) { return &w->m.c.tensors[w->order_of[i]]; }

/* The file name of shard k (0-based), into buf. An object cannot be
 * renamed into place, so in a storage each save names its own shards
 * (after its save id) and never writes over those the old index names. */
static void shard_name(const set_writer *w, size_t k, char *buf, size_t len) {
  ckptio_shardname_format(buf, len, w->m.prefix, k, w->nshards, w->m.store ? w->save_id : NULL);
}

/* The path of shard k, malloc'd. */
static char *shard_path(const set_writer *w, size_t k) {
  char name[4096];
  shard_name(w, k, name, sizeof(name));
  return ckptio_path_join(w->m.dir, name);
}

/* Opens and fills shard k's writer. */
static int open_shard(set_writer *w, size_t k) {
  char tag[64], *path = shard_path(w, k);
  if (!path) return -ENOMEM;
  char msg[CKPTIO_ERRLEN] = "";
  int rc = ckptio_file_writer_open(w->m.ctx, path, CKPTIO_FORMAT_SAFETENSORS, &w->m.opts, msg, &w->sub[k]);
  free(path);
  if (rc < 0)
    return ckptio_fail(w->m.base.err, rc, "%s: shard %zu/%zu: %s", w->m.dir, k + 1, w->nshards,
                       *msg ? msg : ckptio_strerror(rc));
  ckptio_writer *s = w->sub[k];
  snprintf(tag, sizeof(tag), "%zu/%zu", k + 1, w->nshards);
  rc = ckptio_collect_apply(&w->m.c, s);
  if (rc == 0) rc = ckptio_file_writer_set_reserved_metadata(s, "ckptio.save_id", w->save_id);
  if (rc == 0) rc = ckptio_file_writer_set_reserved_metadata(s, "ckptio.shard", tag);
  for (size_t i = w->first[k]; i < w->first[k + 1] && rc == 0; i++) rc = s->ops->add(s, &placed(w, i)->t, placed(w, i)->fill);
  if (rc == 0) rc = ckptio_file_writer_hold_publish(s);
  if (rc < 0) return ckptio_fail(w->m.base.err, rc, "%s: shard %zu/%zu: %s", w->m.dir, k + 1, w->nshards, s->err);
  return 0;
}

/* The index: every tensor mapped to its shard's file name. */
static int index_json(set_writer *w, ckptio_json_out *o) {
  size_t len = strlen(w->m.prefix) + CKPTIO_SHARDNAME_EXTRA;
  ckptio_hf_weight *map = calloc(w->m.c.count + 1, sizeof(*map));
  char *names = calloc(w->nshards + 1, len);
  int rc = -ENOMEM;
  if (!map || !names) goto out;
  for (size_t k = 0; k < w->nshards; k++) {
    shard_name(w, k, names + k * len, len);
    for (size_t i = w->first[k]; i < w->first[k + 1]; i++)
      map[i] = (ckptio_hf_weight){placed(w, i)->t.name, names + k * len};
  }
  ckptio_kv id = {"ckptio.save_id", w->save_id};
  rc = ckptio_hf_index_write(map, w->m.c.count, NULL, 0, &id, 1, w->m.c.total_bytes, o);
out:
  free(map);
  free(names);
  return rc;
}

/* The index's path, malloc'd. */
static char *index_path(const set_writer *w) {
  char name[4096];
  snprintf(name, sizeof(name), "%s.safetensors.index.json", w->m.prefix);
  return ckptio_path_join(w->m.dir, name);
}

/* Writes the index to its temp file and syncs it; the rename is the caller's
 * (it is the moment the set is published). */
static int write_index(set_writer *w, ckptio_tmpfile *t) {
  ckptio_json_out o = {0};
  char *path = index_path(w);
  int rc = path ? index_json(w, &o) : -ENOMEM;
  if (rc == 0) rc = ckptio_tmpfile_open(t, path, 0, o.len, w->m.base.err, sizeof(w->m.base.err));
  if (rc == 0 && (rc = ckptio_pwrite_full(t->fd, o.data, o.len, 0)) < 0)
    ckptio_fail(w->m.base.err, rc, "%s: write of the index: %s", path, ckptio_strerror(rc));
  if (rc == 0) rc = ckptio_tmpfile_sync(t, o.len, w->m.opts.fsync, w->m.base.err, sizeof(w->m.base.err));
  free(o.data);
  free(path);
  return rc;
}

/* Every shard is synced in its temp file: swap them in, then the index.
 * Until the index is renamed every step can be undone. */
static int publish(set_writer *w) {
  ckptio_tmpfile index;
  ckptio_swap index_how = CKPTIO_SWAP_NONE;
  memset(&index, 0, sizeof(index));
  index.fd = index.fd_direct = -1;
  int rc = 0;
  for (size_t k = 0; k < w->nshards; k++)
    if ((rc = ckptio_tmpfile_swap_in(&w->files[k], &w->how[k], w->m.base.err, sizeof(w->m.base.err))) < 0) goto undo;
  if (w->m.opts.fsync && (rc = ckptio_dir_sync(w->m.dir)) < 0) {
    ckptio_fail(w->m.base.err, rc, "%s: fsync of the directory: %s", w->m.dir, ckptio_errno_text(-rc));
    goto undo;
  }
  if ((rc = write_index(w, &index)) < 0) goto undo;
  if ((rc = ckptio_tmpfile_swap_in(&index, &index_how, w->m.base.err, sizeof(w->m.base.err))) < 0) goto undo;
  /* Published. The index's rename must be durable before the old shards
   * lose their names: a filesystem may persist those unlinks first, and an
   * old index would then name shards nobody holds any more. */
  if (w->m.opts.fsync && (rc = ckptio_dir_sync(w->m.dir)) < 0) {
    /* Published, not known durable: the old files keep their temp names (a
     * later save of the set removes them); released as if renamed, so only
     * the descriptors close. */
    ckptio_tmpfile_release(&index, CKPTIO_SWAP_NONE, NULL);
    for (size_t i = 0; i < w->nshards; i++) ckptio_tmpfile_release(&w->files[i], CKPTIO_SWAP_NONE, NULL);
    return ckptio_fail(w->m.base.err, rc, "%s: fsync of the directory after publishing the index: %s", w->m.dir,
                       ckptio_errno_text(-rc));
  }
  /* What remains only frees the old files' space. */
  ckptio_tmpfile_release(&index, index_how, NULL);
  ckptio_held held = {0}; /* the replaced and the stale shards, closed off the save */
  for (size_t i = 0; i < w->nshards; i++) ckptio_tmpfile_release(&w->files[i], w->how[i], &held);
  ckptio_remove_stale_shards(w->m.dir, w->m.prefix, w->nshards, &held);
  ckptio_closer_add(&w->m.ctx->closer, &held);
  ckptio_remove_stray_temps(w->m.dir, w->m.prefix); /* what a killed save of this set left */
  if (w->m.opts.fsync && (rc = ckptio_dir_sync(w->m.dir)) < 0)
    ckptio_fail(w->m.base.err, rc, "%s: fsync of the directory after removing the old shards: %s", w->m.dir,
                ckptio_errno_text(-rc));
  return rc;
undo:
  ckptio_tmpfile_abort(&index);
  for (size_t i = w->nshards; i-- > 0;) ckptio_tmpfile_swap_back(&w->files[i], w->how[i]);
  return rc;
}

/* A set in a storage: publish every shard (each under a name of this save,
 * so the old index still names whole old shards), then the index: the
 * moment the set changes. Then the older saves' shards are removed and the
 * uploads crashed saves of the set left are abandoned. Before the index,
 * any failure removes what this save published and the old set is as it
 * was. */
static int publish_objects(set_writer *w) {
  char **paths = calloc(w->nshards + 1, sizeof(char *));
  char *index = NULL;
  ckptio_json_out o = {0};
  size_t done = 0;
  int rc = paths ? 0 : -ENOMEM;
  for (size_t k = 0; k < w->nshards && rc == 0; k++)
    if (!(paths[k] = shard_path(w, k))) rc = -ENOMEM;
  for (; done < w->nshards && rc == 0; done++)
    rc = ckptio_tmpfile_commit(&w->files[done], 0, w->m.opts.fsync, NULL, w->m.base.err, sizeof(w->m.base.err));
  if (rc == 0) rc = (index = index_path(w)) ? index_json(w, &o) : -ENOMEM;
  if (rc == 0) rc = ckptio_objects_put(w->m.store, index, o.data, o.len, w->m.opts.fsync, w->m.base.err, sizeof(w->m.base.err));
  if (rc < 0) {
    for (size_t k = done; k < w->nshards; k++) ckptio_tmpfile_abort(&w->files[k]);
    for (size_t k = 0; k < done && paths; k++)
      if (paths[k]) ckptio_objects_remove(w->m.store, paths[k]);
  } else {
    ckptio_objects_sweep(w->m.store, w->m.dir, w->m.prefix, paths, w->nshards);
  }
  for (size_t k = 0; paths && k < w->nshards; k++) free(paths[k]);
  free(paths);
  free(index);
  free(o.data);
  return rc;
}

static void *shard_main(void *arg) {
  set_writer *w = arg;
  int rc = 0;
  for (size_t k = 0; k < w->nshards; k++) {
    int r = w->sub[k]->ops->wait_durable(w->sub[k]);
    if (r < 0 && rc == 0) {
      rc = r;
      ckptio_fail(w->m.base.err, r, "%s", w->sub[k]->err);
    }
  }
  /* The shards that did finish hold synced temp files: take them all, so a
   * failed set leaves no temp file behind when the commit returns. */
  for (size_t k = 0; k < w->nshards; k++) {
    int r = ckptio_file_writer_take_file(w->sub[k], &w->files[k]);
    if (r < 0 && rc == 0)
      rc = ckptio_fail(w->m.base.err, r, "%s: shard %zu/%zu: internal error: no synced temp file", w->m.dir, k + 1,
                       w->nshards);
  }
  if (rc == 0) {
    uint64_t t = ckptio_now_ns();
    int lock = w->m.store ? -1 : ckptio_dir_lock(w->m.dir, 0);
    rc = w->m.store ? publish_objects(w) : publish(w);
    ckptio_dir_unlock(lock);
    atomic_store(&w->publish_ns, ckptio_now_ns() - t);
  } else
    for (size_t k = 0; k < w->nshards; k++) ckptio_tmpfile_abort(&w->files[k]);
  if (rc < 0 && !w->m.base.err[0])
    ckptio_fail(w->m.base.err, rc, "%s: sharded save failed: %s", w->m.dir, ckptio_strerror(rc));
  atomic_store(&w->end_ns, ckptio_now_ns());
  pthread_mutex_lock(&w->mu);
  w->result = rc;
  w->durable_done = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

static void close_subs(set_writer *w) {
  for (size_t k = 0; w->sub && k < w->nshards; k++)
    if (w->sub[k]) w->sub[k]->ops->close(w->sub[k]);
  free(w->sub);
  free(w->files);
  free(w->how);
  free(w->first);
  free(w->order_of);
  w->order_of = NULL;
  w->sub = NULL;
  w->files = NULL;
  w->how = NULL;
  w->first = NULL;
  w->nshards = 0;
}

static int set_commit_async(ckptio_writer *base) {
  set_writer *w = (set_writer *)base;
  if (!w) return CKPTIO_E_INVALID_ARG;
  w->m.base.err[0] = '\0';
  /* An index maps tensors to files: with none there is no set to index. */
  if (w->m.c.count == 0)
    return ckptio_fail(w->m.base.err, CKPTIO_E_INVALID_ARG, "%s: a sharded save needs at least one tensor", w->m.dir);
  int rc = assign_shards(w);
  if (rc < 0) goto fail;
  rc = -ENOMEM;
  w->sub = calloc(w->nshards, sizeof(*w->sub));
  w->files = calloc(w->nshards, sizeof(*w->files));
  w->how = calloc(w->nshards, sizeof(*w->how));
  if (!w->sub || !w->files || !w->how) goto fail;
  for (size_t k = 0; k < w->nshards; k++) w->files[k].fd = w->files[k].fd_direct = -1;
  ckptio_save_id_make(w->save_id);
  for (size_t k = 0; k < w->nshards; k++)
    if ((rc = open_shard(w, k)) < 0) goto fail;
  w->start_ns = ckptio_now_ns();
  /* On this thread: each writer records its GPU snapshot events here. */
  for (size_t k = 0; k < w->nshards; k++) {
    w->sub[k]->sync = w->m.base.sync;
    if ((rc = w->sub[k]->ops->commit_async(w->sub[k])) < 0) {
      ckptio_fail(w->m.base.err, rc, "%s: shard %zu/%zu: %s", w->m.dir, k + 1, w->nshards, w->sub[k]->err);
      goto fail; /* close_subs waits for the shards already started */
    }
  }
  w->m.base.state = CKPTIO_WRITER_RUNNING;
  if ((rc = pthread_create(&w->thread, NULL, shard_main, w)) != 0) {
    w->m.base.state = CKPTIO_WRITER_OPEN;
    rc = ckptio_fail(w->m.base.err, -rc, "%s: cannot start the save thread: %s", w->m.dir, ckptio_errno_text(rc));
    goto fail;
  }
  return 0;
fail:
  close_subs(w); /* removes every temp file */
  return rc;
}

/* Nothing is started before commit_async (no shard writer, no file), so
 * nothing is written; the state keeps every later verb but close from
 * starting the save. */
static int set_abort(ckptio_writer *base, int code, const char *why) {
  set_writer *w = (set_writer *)base;
  w->m.base.state = CKPTIO_WRITER_ABORTED;
  return ckptio_fail(w->m.base.err, code, "save abandoned by its caller: %s", why && *why ? why : ckptio_strerror(code));
}

static int set_wait_durable(ckptio_writer *base) {
  set_writer *w = (set_writer *)base;
  if (w->m.base.state != CKPTIO_WRITER_RUNNING) return CKPTIO_E_STATE;
  pthread_mutex_lock(&w->mu);
  while (!w->durable_done) pthread_cond_wait(&w->cv, &w->mu);
  int rc = w->result;
  pthread_mutex_unlock(&w->mu);
  return rc;
}

static int set_wait_snapshot(ckptio_writer *base) {
  set_writer *w = (set_writer *)base;
  if (w->m.base.state != CKPTIO_WRITER_RUNNING) return CKPTIO_E_STATE;
  for (size_t k = 0; k < w->nshards; k++) {
    int rc = w->sub[k]->ops->wait_snapshot(w->sub[k]);
    if (rc < 0) return set_wait_durable(base); /* the set's error, once settled */
  }
  return 0;
}

static int set_poll_durable(ckptio_writer *base) {
  set_writer *w = (set_writer *)base;
  if (w->m.base.state != CKPTIO_WRITER_RUNNING) return CKPTIO_E_STATE;
  pthread_mutex_lock(&w->mu);
  int rc = w->durable_done ? (w->result < 0 ? w->result : 1) : 0;
  pthread_mutex_unlock(&w->mu);
  return rc;
}

/* The set's snapshot: every shard's. A shard that failed reports "not yet"
 * until the set's error is settled (as wait_snapshot returns it). */
static int set_poll_snapshot(ckptio_writer *base) {
  set_writer *w = (set_writer *)base;
  int rc = set_poll_durable(base);
  if (rc != 0) return rc;
  for (size_t k = 0; k < w->nshards; k++)
    if (w->sub[k]->ops->poll_snapshot(w->sub[k]) != 1) return 0;
  return 1;
}

static int set_stats(const ckptio_writer *base, ckptio_stats *out) {
  const set_writer *w = (const set_writer *)base;
  ckptio_stats sum = CKPTIO_STATS_INIT, one;
  sum.threads = w->m.ctx->opts.threads;
  for (size_t k = 0; w->m.base.state == CKPTIO_WRITER_RUNNING && k < w->nshards; k++) {
    one = (ckptio_stats)CKPTIO_STATS_INIT;
    int rc = w->sub[k]->ops->stats(w->sub[k], &one);
    if (rc < 0) return rc;
    sum.bytes += one.bytes;
    if (one.snapshot_seconds > sum.snapshot_seconds) sum.snapshot_seconds = one.snapshot_seconds;
    sum.device_seconds += one.device_seconds;
    sum.copy_seconds += one.copy_seconds;
    sum.write_seconds += one.write_seconds;
    sum.commit_seconds += one.commit_seconds;
    sum.threads = one.threads;
    sum.staging_bytes = one.staging_bytes;
  }
  if (w->m.base.state == CKPTIO_WRITER_RUNNING) {
    uint64_t end = atomic_load(&w->end_ns);
    sum.seconds = (double)((end ? end : ckptio_now_ns()) - w->start_ns) / 1e9;
    sum.commit_seconds += (double)atomic_load(&w->publish_ns) / 1e9;
  }
  return ckptio_sized_out(out, &sum, sizeof(sum), "ckptio_stats", NULL, 0);
}

static void set_progress(ckptio_writer *base, uint64_t *done, uint64_t *total) {
  set_writer *w = (set_writer *)base;
  uint64_t d = 0;
  for (size_t k = 0; w->m.base.state == CKPTIO_WRITER_RUNNING && k < w->nshards; k++) {
    uint64_t x = 0;
    w->sub[k]->ops->progress(w->sub[k], &x, NULL);
    d += x;
  }
  if (done) *done = d;
  if (total) *total = w->m.c.total_bytes;
}

static size_t set_shard_count(const ckptio_writer *base) { return ((const set_writer *)base)->nshards; }

static int set_close(ckptio_writer *base) {
  set_writer *w = (set_writer *)base;
  int rc = 0;
  if (w->m.base.state == CKPTIO_WRITER_RUNNING) {
    rc = set_wait_durable(base);
    pthread_join(w->thread, NULL);
  }
  close_subs(w);
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
  ckptio_many_free(&w->m);
  return rc;
}

static const ckptio_writer_ops set_ops = {
    .set_metadata = ckptio_many_set_metadata,
    .set_stream = ckptio_many_set_stream,
    .add = set_add,
    .commit_async = set_commit_async,
    .wait_snapshot = set_wait_snapshot,
    .wait_durable = set_wait_durable,
    .poll_snapshot = set_poll_snapshot,
    .poll_durable = set_poll_durable,
    .progress = set_progress,
    .stats = set_stats,
    .shard_count = set_shard_count,
    .close = set_close,
    .add_part = NULL, /* tensors whole only: the front takes whole boxes as add */
    .abort = set_abort,
};
