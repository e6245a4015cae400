/* The checkpoint manager on a storage: DIR is a prefix ("s3://bucket/ckpts")
 * and a step directory the objects under "DIR/step-N/". Objects cannot be
 * renamed, so nothing is hidden first and published by a rename as on a
 * local disk. Instead a step exists once its checkpoint's object is
 * published (one of mgr_files: an object appears whole at publish, and a
 * set publishes its index after every shard), and whatever else lies under
 * a step's prefix is either what that checkpoint names or a leftover of a
 * save that died (a killed set's shards, uploads never completed) or of a
 * removal cut short, which the next save removes. The verbs are the
 * storage's own (ckptio_storage_ops, from ckptio_ctx_storage): the same a
 * user's storage implements. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/shardname.h"
#include "manage/manage.h"

void mgr_objs_free(mgr_objs *o) {
  for (size_t i = 0; i < o->n; i++) free(o->v[i].name);
  free(o->v);
  memset(o, 0, sizeof(*o));
}

/* The list verb's callback: keeps objects named DIR/step-N/NAME. */
static int collect(void *arg, const char *path, uint64_t size) {
  mgr_objs *o = arg;
  if (strncmp(path, o->base, o->blen) != 0) return 0;
  const char *rest = path + o->blen, *slash = strchr(rest, '/');
  if (!slash || (size_t)(slash - rest) >= MGR_STEP_NAME_MAX || !slash[1]) return 0;
  char name[MGR_STEP_NAME_MAX];
  memcpy(name, rest, (size_t)(slash - rest));
  name[slash - rest] = '\0';
  uint64_t step;
  if (!mgr_parse_step(name, &step)) return 0;
  if (o->n == o->cap) {
    size_t nc = o->cap ? o->cap * 2 : 64;
    mgr_obj *nv = realloc(o->v, nc * sizeof(*nv));
    if (!nv) return -ENOMEM;
    o->v = nv;
    o->cap = nc;
  }
  char *n = strdup(slash + 1);
  if (!n) return -ENOMEM;
  o->v[o->n++] = (mgr_obj){step, n, size};
  return 0;
}

static int cmp_obj(const void *a, const void *b) {
  const mgr_obj *x = a, *y = b;
  if (x->step != y->step) return x->step < y->step ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* m->why becomes "<what>: <the storage's sentence>". */
static int why(ckptio_manager *m, int rc, const char *what) {
  char cause[CKPTIO_ERRLEN];
  snprintf(cause, sizeof(cause), "%s", m->why[0] ? m->why : ckptio_strerror(rc));
  snprintf(m->why, sizeof(m->why), "%s: %s", what, cause);
  return rc;
}

/* The end of the group of objects of one step that starts at i. */
static size_t group_end(const mgr_objs *o, size_t i) {
  size_t j = i;
  while (j < o->n && o->v[j].step == o->v[i].step) j++;
  return j;
}

int mgr_objs_list(const ckptio_storage_ops *st, void *self, const char *dir, const char *prefix, mgr_objs *o,
                  char *err, size_t errlen) {
  char base[4096];
  memset(o, 0, sizeof(*o));
  snprintf(base, sizeof(base), "%s/", dir);
  o->base = base;
  o->blen = strlen(base);
  err[0] = '\0';
  int rc = st->list(self, prefix, collect, o, err, errlen);
  o->base = NULL;
  if (rc < 0) {
    mgr_objs_free(o);
    return rc;
  }
  if (o->n) qsort(o->v, o->n, sizeof(*o->v), cmp_obj);
  return 0;
}

/* The objects of every step (step ~0: all), sorted by step and name. */
static int list_steps(ckptio_manager *m, uint64_t step, mgr_objs *o) {
  char prefix[4096 + MGR_STEP_NAME_MAX];
  if (step == ~0ull) {
    snprintf(prefix, sizeof(prefix), "%s/step-", m->dir);
  } else {
    char name[MGR_STEP_NAME_MAX];
    mgr_step_name(step, name, sizeof(name));
    snprintf(prefix, sizeof(prefix), "%s/%s/", m->dir, name);
  }
  int rc = mgr_objs_list(m->st, m->st_self, m->dir, prefix, o, m->why, sizeof(m->why));
  if (rc < 0) {
    char what[sizeof(prefix) + 32];
    snprintf(what, sizeof(what), "cannot list %s*", prefix);
    return why(m, rc, what);
  }
  return 0;
}

/* The name of the checkpoint's object among v[0..n) (one step's), or NULL. */
static const char *main_of(const mgr_obj *v, size_t n) {
  for (size_t f = 0; f < MGR_NFILES; f++)
    for (size_t i = 0; i < n; i++)
      if (!strcmp(v[i].name, mgr_files[f])) return mgr_files[f];
  return NULL;
}

static void obj_path(const ckptio_manager *m, uint64_t step, const char *name, char *buf, size_t len) {
  char sname[MGR_STEP_NAME_MAX];
  mgr_step_name(step, sname, sizeof(sname));
  snprintf(buf, len, "%s/%s/%s", m->dir, sname, name);
}

/* Removes DIR/step-N/name; a missing one is not an error (the verb's rule). */
static int remove_obj(ckptio_manager *m, uint64_t step, const char *name) {
  char path[8192];
  obj_path(m, step, name, path, sizeof(path));
  m->why[0] = '\0';
  int rc = m->st->remove(m->st_self, path, m->why, sizeof(m->why));
  if (rc < 0 && !m->why[0]) snprintf(m->why, sizeof(m->why), "%s: cannot remove it: %s", path, ckptio_strerror(rc));
  return rc;
}

int mgr_obj_probe(ckptio_manager *m) {
  char prefix[4096];
  mgr_objs o = {0};
  snprintf(prefix, sizeof(prefix), "%s/" MGR_LATEST, m->dir);
  o.base = "";
  m->why[0] = '\0';
  int rc = m->st->list(m->st_self, prefix, collect, &o, m->why, sizeof(m->why));
  mgr_objs_free(&o);
  if (rc < 0 && !m->why[0]) snprintf(m->why, sizeof(m->why), "cannot list %s: %s", prefix, ckptio_strerror(rc));
  return rc < 0 ? rc : 0;
}

static int64_t mgr_obj_scan_steps(ckptio_manager *m, uint64_t **steps) {
  *steps = NULL;
  mgr_objs o;
  int rc = list_steps(m, ~0ull, &o);
  if (rc < 0) return rc;
  uint64_t *v = malloc((o.n ? o.n : 1) * sizeof(*v));
  size_t n = 0;
  if (!v) {
    mgr_objs_free(&o);
    snprintf(m->why, sizeof(m->why), "out of memory");
    return -ENOMEM;
  }
  for (size_t i = 0, j; i < o.n; i = j) {
    j = group_end(&o, i);
    if (main_of(o.v + i, j - i)) v[n++] = o.v[i].step;
  }
  mgr_objs_free(&o);
  *steps = v;
  return (int64_t)n;
}

static int mgr_obj_locate(ckptio_manager *m, uint64_t step, mgr_entry *e, char *file, size_t flen, char *detail,
                          size_t dlen) {
  file[0] = '\0';
  mgr_objs o;
  int rc = list_steps(m, step, &o);
  if (rc == -ENOMEM) return rc;
  if (rc < 0) {
    e->error = rc;
    snprintf(detail, dlen, "%s", m->why);
    return 0;
  }
  e->files = (uint32_t)o.n;
  for (size_t i = 0; i < o.n; i++) e->bytes += o.v[i].size;
  const char *f = main_of(o.v, o.n);
  if (f) {
    snprintf(file, flen, "%s", f);
  } else {
    e->error = -ENOENT;
    snprintf(detail, dlen, "%s: no model.safetensors[.index.json], model.pt or model.safetensors.zst in it", e->dir);
  }
  mgr_objs_free(&o);
  return 0;
}

static int mgr_obj_write_latest(ckptio_manager *m, const char *content) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/" MGR_LATEST, m->dir);
  size_t n = strlen(content);
  void *obj = NULL;
  m->why[0] = '\0';
  /* One object of one chunk: published whole, replacing the old record. */
  int rc = m->st->create(m->st_self, path, n, n, &obj, m->why, sizeof(m->why));
  if (rc == 0) {
    rc = m->st->write(m->st_self, obj, content, n, 0, m->why, sizeof(m->why));
    if (rc < 0)
      m->st->abandon(m->st_self, obj);
    else
      rc = m->st->publish(m->st_self, obj, m->why, sizeof(m->why));
  }
  if (rc < 0 && !m->why[0]) snprintf(m->why, sizeof(m->why), "%s: %s", path, ckptio_strerror(rc));
  return rc;
}

static int mgr_obj_read_latest(ckptio_manager *m, char *buf, size_t len) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/" MGR_LATEST, m->dir);
  void *obj = NULL;
  uint64_t size = 0;
  m->why[0] = '\0';
  int rc = m->st->open_read(m->st_self, path, &obj, &size, m->why, sizeof(m->why));
  if (rc == -ENOENT) return 0;
  if (rc == 0) {
    size_t n = size < len - 1 ? (size_t)size : len - 1;
    rc = n ? m->st->read(m->st_self, obj, buf, n, 0, m->why, sizeof(m->why)) : 0;
    m->st->close_read(m->st_self, obj);
    if (rc == 0) {
      buf[n] = '\0';
      buf[strcspn(buf, "\r\n")] = '\0';
      return 1;
    }
  }
  if (!m->why[0]) snprintf(m->why, sizeof(m->why), "%s: %s", path, ckptio_strerror(rc));
  return rc;
}

/* Whether name is a shard of the manager's sets (core/shardname.h): in a
 * storage "model-00001-of-00003-<save id>.safetensors", the save id making
 * each save's shards its own; a local set's name when one was copied in. */
static int is_shard(const char *name, ckptio_shardname *s) {
  const char *rest = ckptio_shardname_parse(name, MGR_SET_PREFIX, s);
  return rest && !*rest;
}

/* Whether two shards are of one save: the same save id and count (a local
 * set's shards, which carry no id, by their count alone). */
static int same_save(const ckptio_shardname *a, const ckptio_shardname *b) {
  return a->n == b->n && a->idlen == b->idlen && (!a->idlen || !strncmp(a->id, b->id, a->idlen));
}

static int is_checkpoint_file(const char *name, void *arg) {
  (void)arg;
  for (size_t f = 0; f < MGR_NFILES; f++)
    if (!strcmp(name, mgr_files[f])) return 1;
  return 0;
}

/* An object a save of the manager writes (a checkpoint file or a shard):
 * what a step's prefix holds besides them is the caller's, and only
 * retention, which removes the whole step as on a disk, touches it. */
static int is_ours(const char *name) {
  ckptio_shardname s;
  return is_checkpoint_file(name, NULL) || is_shard(name, &s);
}

/* Removes the objects of one step's listing v[0..n) for which keep() is 0
 * (with ours_only, only is_ours ones), `first` (when not NULL) before the
 * rest. @return the first failure. */
static int remove_all_but(ckptio_manager *m, const mgr_obj *v, size_t n, const char *first, int ours_only,
                          int (*keep)(const char *name, void *arg), void *arg) {
  int rc = 0;
  for (int pass = first ? 0 : 1; pass < 2; pass++)
    for (size_t i = 0; i < n; i++) {
      int is_first = first && !strcmp(v[i].name, first);
      if ((pass == 0) != is_first || (ours_only && !is_ours(v[i].name)) || (keep && keep(v[i].name, arg)))
        continue;
      int r = remove_obj(m, v[i].step, v[i].name);
      if (r < 0 && rc == 0) rc = r;
      if (r < 0 && pass == 0) return r; /* the rest stays a step's until it goes */
    }
  return rc;
}

static int mgr_obj_remove_step(ckptio_manager *m, uint64_t step) {
  mgr_objs o;
  int rc = list_steps(m, step, &o);
  if (rc < 0) return rc;
  /* Every object that could be the checkpoint's goes before the rest (in
   * the order a reader would pick them): once the first has gone the step
   * no longer opens, so a removal cut short leaves leftovers, never a
   * damaged checkpoint. */
  for (size_t f = 0; f < MGR_NFILES && rc == 0; f++)
    for (size_t i = 0; i < o.n && rc == 0; i++)
      if (!strcmp(o.v[i].name, mgr_files[f])) rc = remove_obj(m, step, o.v[i].name);
  if (rc == 0) rc = remove_all_but(m, o.v, o.n, NULL, 0, is_checkpoint_file, NULL);
  mgr_objs_free(&o);
  return rc;
}

/* ------------------------------------------------------------ leftovers */

typedef struct named {
  const char *index;   /* the set's index, kept */
  const char **paths;  /* what its reader names */
  size_t n;
  char base[4096];     /* DIR/step-N/ */
} named;

static int keep_named(const char *name, void *arg) {
  named *k = arg;
  if (!strcmp(name, k->index)) return 1;
  size_t bl = strlen(k->base);
  for (size_t i = 0; i < k->n; i++)
    if (!strncmp(k->paths[i], k->base, bl) && !strcmp(k->paths[i] + bl, name)) return 1;
  return 0;
}

static int keep_only(const char *name, void *arg) { return !strcmp(name, arg); }

/* One step's objects v[0..n) whose checkpoint is `main`: removes what of
 * the manager's kind (is_ours) it does not use. A single file uses only
 * itself. A set's index names its shards: when every other object is a
 * shard of one save (the usual case) there is nothing to do; else the
 * index is opened to learn which shards are its, and when it does not open
 * nothing is removed (what it names cannot be told from what it does not). */
static int tidy_step(ckptio_manager *m, const mgr_obj *v, size_t n, const char *main) {
  if (!main) return remove_all_but(m, v, n, NULL, 1, NULL, NULL);
  if (strcmp(main, mgr_files[0]) != 0) return remove_all_but(m, v, n, mgr_files[0], 1, keep_only, (void *)main);
  ckptio_shardname s0 = {0}, s;
  int mixed = 0, seen = 0;
  for (size_t i = 0; i < n && !mixed; i++) {
    if (!strcmp(v[i].name, main) || !is_ours(v[i].name)) continue;
    if (!is_shard(v[i].name, &s)) mixed = 1;
    else if (!seen) s0 = s, seen = 1;
    else mixed = !same_save(&s, &s0);
  }
  if (!mixed) return 0;
  named k = {.index = main};
  char sname[MGR_STEP_NAME_MAX], path[8192];
  mgr_step_name(v[0].step, sname, sizeof(sname));
  snprintf(k.base, sizeof(k.base), "%s/%s/", m->dir, sname);
  obj_path(m, v[0].step, main, path, sizeof(path));
  /* The caller's ckptio_last_open_error is not this call's to change. */
  char keep[CKPTIO_ERRLEN];
  snprintf(keep, sizeof(keep), "%s", ckptio_last_open_error());
  ckptio_reader *r = NULL;
  int rc = ckptio_reader_open(m->ctx, path, &m->opts, &r);
  ckptio_set_open_error(keep);
  if (rc < 0) return 0;
  k.n = ckptio_reader_shard_count(r);
  k.paths = calloc(k.n ? k.n : 1, sizeof(*k.paths));
  if (!k.paths) {
    ckptio_reader_close(r);
    snprintf(m->why, sizeof(m->why), "out of memory");
    return -ENOMEM;
  }
  for (size_t i = 0; i < k.n; i++) ckptio_reader_shard(r, i, &k.paths[i], NULL, NULL);
  rc = remove_all_but(m, v, n, NULL, 1, keep_named, &k);
  free(k.paths);
  ckptio_reader_close(r);
  return rc;
}

static int mgr_obj_sweep(ckptio_manager *m) {
  char prefix[4096];
  snprintf(prefix, sizeof(prefix), "%s/step-", m->dir);
  m->why[0] = '\0';
  /* Uploads only a killed save leaves open (a live one completes or aborts
   * its own): one saving process per DIR, as on a local disk. */
  int rc = m->st->sweep ? m->st->sweep(m->st_self, prefix, m->why, sizeof(m->why)) : 0;
  if (rc < 0) {
    char what[sizeof(prefix) + 64];
    snprintf(what, sizeof(what), "cannot abandon the uploads killed saves left under %s*", prefix);
    return why(m, rc, what);
  }
  mgr_objs o;
  if ((rc = list_steps(m, ~0ull, &o)) < 0) return rc;
  for (size_t i = 0, j; i < o.n && rc == 0; i = j) {
    j = group_end(&o, i);
    rc = tidy_step(m, o.v + i, j - i, main_of(o.v + i, j - i));
  }
  mgr_objs_free(&o);
  return rc;
}

static int mgr_obj_published(ckptio_manager *m, uint64_t step, const char *file) {
  mgr_objs o;
  int rc = list_steps(m, step, &o);
  if (rc < 0) return rc;
  /* A single file saved over a set: the old index would still be opened
   * first, so it goes first, and failing that the save has not taken. */
  rc = tidy_step(m, o.v, o.n, file);
  mgr_objs_free(&o);
  return rc < 0 ? why(m, rc, "what an older save of the step left could not be removed") : 0;
}

/* A save on a storage. No lock (a storage has no flock: one saving
 * process per prefix is the caller's to keep) and no temporary name (an
 * object cannot be renamed): the writer saves under the step's own prefix,
 * where its objects appear only when published, a set's index last; what
 * killed saves left is swept first. */
static int begin_save(ckptio_manager *m, uint64_t step, char *sub, size_t len) {
  if (!m->st->create || !m->st->remove)
    return ckptio_err_fmt(m->err, sizeof(m->err), CKPTIO_E_INVALID_ARG,
                          "%s: its storage has no %s verb, which saves through the manager need", m->dir,
                          !m->st->create ? "create" : "remove");
  int rc = mgr_obj_sweep(m);
  if (rc < 0)
    return ckptio_err_fmt(m->err, sizeof(m->err), rc, "%s: before the save of step %" PRIu64 ": %s", m->dir, step,
                          m->why);
  mgr_step_name(step, sub, len);
  return 0;
}

/* The writer's commit published the step's objects (a set: its index
 * last); what an older save of the step left goes now. */
static int publish(ckptio_manager *m, uint64_t step, const char *file) {
  int rc = mgr_obj_published(m, step, file);
  if (rc < 0)
    ckptio_err_fmt(m->err, sizeof(m->err), rc, "%s: step-%08" PRIu64 "/%s is published, but %s", m->dir, step, file,
                   m->why);
  return rc;
}

static void end_save(ckptio_manager *m, ckptio_held *held) {
  (void)m;
  (void)held; /* nothing held: no lock, and an unpublished upload is swept by the next save */
}

static int remove_step(ckptio_manager *m, uint64_t step, ckptio_held *held) {
  (void)held; /* an object's storage frees it */
  return mgr_obj_remove_step(m, step); /* its checkpoint's object first */
}

const mgr_place mgr_object_place = {
    .scan_steps = mgr_obj_scan_steps,
    .locate = mgr_obj_locate,
    .write_latest = mgr_obj_write_latest,
    .read_latest = mgr_obj_read_latest,
    .begin_save = begin_save,
    .publish = publish,
    .end_save = end_save,
    .remove_step = remove_step,
    .transport_errors = 1,
};
