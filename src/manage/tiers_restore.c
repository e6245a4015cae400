/* The collective restore (ckptio_tiers_restore in ckptio.h). Every rank
 * lists the published copies it holds; the lists are gathered, so every
 * rank computes the same plan: the newest step whose every part has a
 * holder not found damaged, each part from the fastest (own memory, a
 * peer's copy, the durable directory, the storage). The parts that come
 * from peers move (tiers_exchange), every rank checks every CRC32 of its
 * part (or loads it into the caller's tensors, checking as it lands; a
 * peer's copy then lands there straight from the exchange), and
 * the ranks agree; a part that failed marks that copy bad on every rank
 * and the plan is made again without it. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/collective.h"
#include "core/error.h"
#include "core/nameset.h"
#include "manage/tiers.h"

/* One published copy of one part. */
typedef struct holding {
  uint64_t step;
  uint64_t bytes;
  int32_t part;    /* whose part */
  int32_t tier;    /* ckptio_tier */
  int32_t holder;  /* the rank that has it (filled after the gather) */
  int32_t bad;     /* found damaged by a restore */
} holding;

typedef struct list {
  holding *v;
  size_t n, cap;
} list;

static int push(list *l, holding h) {
  int rc = ckptio_array_grow((void **)&l->v, &l->cap, l->n, sizeof(*l->v));
  if (rc == 0) l->v[l->n++] = h;
  return rc;
}

/* The file of part `part` in DIR at step, if the step is marked with
 * `mark` and the file is there. */
static int add_if_held(ckptio_tiers *t, list *l, const char *dir, uint64_t step, const char *mark, int part,
                       int tier) {
  char path[4096];
  int rc = tier == CKPTIO_TIER_PEER ? tiers_path(path, sizeof(path), dir, step, "copy", part)
                                    : tiers_part_path(t, tier, step, part, path, sizeof(path));
  if (!tiers_marked(dir, step, mark) || rc < 0) return 0;
  int64_t size = tiers_file_size(path);
  if (size < 0) return 0;
  return push(l, (holding){step, (uint64_t)size, part, tier, -1, 0});
}

/* This rank's own parts of published steps in the storage. */
static int list_storage(ckptio_tiers *t, list *l) {
  mgr_objs o;
  char why[CKPTIO_ERRLEN], name[64];
  int rc = tiers_obj_scan(t, &o, why);
  if (rc < 0) { /* the storage holds nothing this restore can take: said, not fatal */
    tiers_warn(t, 0, CKPTIO_TIER_STORAGE, rc, "rank %d: cannot list the storage tier: %s", t->comm.rank, why);
    return 0;
  }
  snprintf(name, sizeof(name), "rank-%05d.safetensors", t->comm.rank);
  for (size_t i = 0; i < o.n && rc == 0; i++) {
    if (strcmp(o.v[i].name, TIERS_PUBLISHED) != 0) continue;
    int64_t size = tiers_objs_size(&o, o.v[i].step, name);
    for (size_t k = 0; size < 0 && k < o.n; k++) { /* a step saved with places: its multi-rank file */
      int r, nr;
      if (o.v[k].step == o.v[i].step && tiers_parse_ranks_file(o.v[k].name, &r, &nr) && r == t->comm.rank &&
          nr == t->comm.nranks)
        size = (int64_t)o.v[k].size;
    }
    if (size >= 0) rc = push(l, (holding){o.v[i].step, (uint64_t)size, t->comm.rank, CKPTIO_TIER_STORAGE, -1, 0});
  }
  mgr_objs_free(&o);
  return rc;
}

/* What this rank holds: its own part in memory, on the durable tier and in
 * the storage, and the copies it keeps for others. */
static int list_mine(ckptio_tiers *t, list *l) {
  int me = t->comm.rank, rc = 0;
  for (int tier = 0; tier < CKPTIO_TIERS && rc == 0; tier++) {
    const char *dir = tiers_dir(t, tier);
    if (!dir || (tier == CKPTIO_TIER_PEER && !t->o.peers)) continue;
    if (tier == CKPTIO_TIER_STORAGE) {
      rc = list_storage(t, l);
      continue;
    }
    uint64_t *steps;
    long n = tiers_steps(dir, &steps);
    if (n < 0) continue; /* a tier this rank cannot list holds nothing for it */
    for (long i = 0; i < n && rc == 0; i++) {
      if (tier != CKPTIO_TIER_PEER)
        rc = add_if_held(t, l, dir, steps[i], TIERS_PUBLISHED, me, tier);
      else
        for (int k = 1; k <= t->o.peers && rc == 0; k++)
          rc = add_if_held(t, l, dir, steps[i], TIERS_COPIES, tiers_held(t, me, k), tier);
    }
    free(steps);
  }
  return rc;
}

/* The gathered lists as one, each holding with its holder. */
static int gather(ckptio_tiers *t, const list *mine, list *all) {
  unsigned char *buf = NULL;
  uint64_t *lens = NULL, stride = 0;
  int rc = ckptio_comm_gather(&t->comm, mine->v, mine->n * sizeof(holding), &buf, &lens, &stride, t->err);
  for (int r = 0; rc == 0 && r < t->comm.nranks; r++)
    for (uint64_t i = 0; rc == 0 && i < lens[r] / sizeof(holding); i++) {
      holding h;
      memcpy(&h, buf + (size_t)r * stride + i * sizeof(holding), sizeof(h));
      h.holder = r;
      rc = push(all, h);
    }
  free(buf);
  free(lens);
  return rc;
}

/* The fastest good holding of `part` at `step`, or -1. */
static long best(const list *all, uint64_t step, int part) {
  long pick = -1;
  for (size_t i = 0; i < all->n; i++) {
    const holding *h = &all->v[i];
    if (h->bad || h->step != step || h->part != part) continue;
    if (pick < 0 || h->tier < all->v[pick].tier || (h->tier == all->v[pick].tier && h->holder < all->v[pick].holder))
      pick = (long)i;
  }
  return pick;
}

/* The newest step below `below` whose every part has a good holding, its
 * choices in pick[]; 0 when none. */
static int plan(const ckptio_tiers *t, const list *all, uint64_t *below, int *have_below, long *pick,
                uint64_t *step) {
  for (;;) {
    int found = 0;
    uint64_t s = 0;
    for (size_t i = 0; i < all->n; i++)
      if (!all->v[i].bad && (!*have_below || all->v[i].step < *below) && (!found || all->v[i].step > s))
        s = all->v[i].step, found = 1;
    if (!found) return 0;
    int whole = 1;
    for (int r = 0; r < t->comm.nranks && whole; r++) whole = (pick[r] = best(all, s, r)) >= 0;
    if (whole) {
      *step = s;
      return 1;
    }
    *below = s, *have_below = 1;
  }
}

static const char *tier_word(int tier) {
  static const char *const words[CKPTIO_TIERS] = {"memory", "a peer's copy", "the durable tier", "the storage"};
  return words[tier];
}

/* This rank's part from the storage: downloaded into its memory directory
 * when it has one and the caller loads the path (then checked there, and
 * the load reads memory), else the object itself (a restore that loads it
 * reads it once, straight from the storage). Its path in path. */
static int from_storage(ckptio_tiers *t, uint64_t step, int download, char *path, size_t len, char *why) {
  char obj[4096];
  int rc = tiers_part_path(t, CKPTIO_TIER_STORAGE, step, t->comm.rank, obj, sizeof(obj));
  download = download && t->o.memory_dir;
  if (rc == 0) rc = tiers_path(path, len, download ? t->o.memory_dir : t->o.storage_dir, step, "rank", t->comm.rank);
  if (rc < 0) return ckptio_fail(why, rc, "path too long");
  if (!download) return 0;
  if ((rc = tiers_make_step_dir(t->o.memory_dir, step)) < 0)
    return ckptio_fail(why, rc, "%s: cannot make its step directory: %s", t->o.memory_dir, ckptio_strerror(rc));
  return tiers_obj_download(t, obj, path, why);
}

/* What a restore does with this rank's part once it is here: check it
 * (dests NULL), or load it into dests, checking as it lands. */
typedef struct take {
  const ckptio_tiers_dest *dests;
  size_t n;
} take;

/* This rank's own part fetched where it must be (from the storage), then
 * checked or loaded where it lies: its memory, the durable tier, the
 * storage, or the memory tier's file a peer's copy was received into. Held
 * locally, it runs on a thread of its own beside the exchange, in which
 * this rank may only send (a healthy rank sends the copies of lost ones
 * while it loads its own). */
typedef struct own_part {
  ckptio_tiers *t;
  int tier;
  uint64_t step;
  char *path, *why;
  size_t len;
  const take *tk;
  int code;
} own_part;

static void *take_own(void *arg) {
  own_part *o = arg;
  ckptio_tiers *t = o->t;
  int v;
  if (o->tier == CKPTIO_TIER_STORAGE) v = from_storage(t, o->step, !o->tk->dests, o->path, o->len, o->why);
  else if ((v = tiers_part_path(t, o->tier, o->step, t->comm.rank, o->path, o->len)) < 0)
    ckptio_fail(o->why, v, "path too long");
  if (v == 0)
    v = o->tk->dests ? tiers_load(t, o->path, o->tk->dests, o->tk->n, o->why) : tiers_verify(t, o->path, o->why);
  o->code = v;
  return NULL;
}

/* One attempt at the plan: the moves, and this rank's check. @return 0
 * with *code (0: this rank's part is whole and verified at path; else why
 * not, with why), or a collective failure. */
static int attempt(ckptio_tiers *t, const list *all, const long *pick, uint64_t step, char *path, size_t len,
                   const take *tk, int *code, char *why) {
  int n = t->comm.nranks, me = t->comm.rank, rc = 0;
  tiers_move *moves = calloc((unsigned)n, sizeof(*moves)); /* a move per rank at most (n >= 1: open checks) */
  tiers_stream *into = NULL;
  size_t m = 0;
  if (!moves) return ckptio_fail(t->err, -ENOMEM, "rank %d: no memory to restore", me);
  for (int r = 0; r < n; r++) {
    const holding *h = &all->v[pick[r]];
    if (h->tier != CKPTIO_TIER_PEER) continue;
    tiers_move *v = &moves[m++];
    v->src = h->holder, v->dst = r, v->bytes = h->bytes;
    if (h->holder == me) tiers_path(v->path, sizeof(v->path), t->o.memory_dir, step, "copy", r);
    if (r != me) continue;
    /* A one-pass restore into host memory takes the copy as it arrives. */
    if (tk->dests && tiers_stream_can(tk->dests, tk->n))
      v->into = into = tiers_stream_new(t->ctx, tk->dests, tk->n, h->bytes);
    if (!into) {
      tiers_make_step_dir(t->o.memory_dir, step);
      tiers_path(v->path, sizeof(v->path), t->o.memory_dir, step, "rank", r);
    }
  }
  own_part own = {t, all->v[pick[me]].tier, step, path, why, len, tk, 0};
  int is_own = own.tier != CKPTIO_TIER_PEER;
  pthread_t thread;
  int beside = is_own && m && pthread_create(&thread, NULL, take_own, &own) == 0;
  rc = tiers_exchange(t, moves, m);
  if (beside) pthread_join(thread, NULL);
  else if (is_own && rc == 0) take_own(&own);
  if (rc == 0 && is_own) {
    *code = own.code;
  } else if (rc == 0) { /* a peer's copy: in the tensors, or in the memory tier's file */
    int got = 1;
    for (size_t i = 0; i < m; i++)
      if (moves[i].dst == me && !moves[i].ok) got = 0;
    if (!got) {
      *code = ckptio_fail(why, -EIO, "the copy did not arrive");
    } else if (into) {
      *code = tiers_stream_end(into, why);
    } else {
      take_own(&own);
      *code = own.code;
    }
  }
  tiers_stream_free(into);
  free(moves);
  return rc;
}

static int restore(ckptio_tiers *t, uint64_t *step, char *path, size_t len, const take *tk) {
  tiers_join(t); /* the last save published (or not) first: its failure was warned */
  int n = t->comm.nranks, me = t->comm.rank;
  list mine = {0}, all = {0};
  long *pick = calloc((size_t)n, sizeof(long));
  int32_t *oks = calloc((size_t)n, sizeof(int32_t));
  int rc = pick && oks ? list_mine(t, &mine) : -ENOMEM;
  if (rc == 0) rc = gather(t, &mine, &all);
  if (rc < 0 && rc == -ENOMEM) ckptio_fail(t->err, rc, "rank %d: no memory to restore", me);
  for (int k = 0; k < CKPTIO_TIERS; k++) t->stats.restored_bytes[k] = 0;
  uint64_t below = 0, s = 0;
  int have_below = 0;
  while (rc == 0) {
    if (!plan(t, &all, &below, &have_below, pick, &s)) {
      rc = ckptio_fail(t->err, -ENOENT, "no step is whole and verified in any tier (%zu copies listed%s)",
                       all.n, t->stats.skipped_copies ? ", some of them damaged" : "");
      break;
    }
    char why[CKPTIO_ERRLEN] = "";
    int code = 0;
    rc = attempt(t, &all, pick, s, path, len, tk, &code, why);
    int32_t ok = code == 0;
    if (rc < 0) break;
    if ((rc = t->comm.allgather(t->comm.user, &ok, oks, sizeof(ok))) < 0) {
      ckptio_fail(t->err, rc, "rank %d: the communicator's allgather failed: %s", me, ckptio_strerror(rc));
      break;
    }
    int all_ok = 1;
    for (int r = 0; r < n; r++) {
      if (oks[r]) continue;
      all_ok = 0;
      holding *h = &all.v[pick[r]];
      h->bad = 1;
      if (r == me) {
        char held[48] = "";
        if (h->tier == CKPTIO_TIER_PEER) snprintf(held, sizeof(held), " (held by rank %d)", h->holder);
        t->stats.skipped_copies++;
        tiers_warn(t, s, h->tier, code, "rank %d, step %llu, %s%s: skipped: %s", r, (unsigned long long)s,
                   tier_word(h->tier), held, why);
      }
    }
    if (all_ok) {
      *step = s;
      t->stats.restored_bytes[all.v[pick[me]].tier] += all.v[pick[me]].bytes;
      break;
    }
  }
  free(mine.v);
  free(all.v);
  free(pick);
  free(oks);
  return rc;
}

int ckptio_tiers_restore(ckptio_tiers *t, uint64_t *step, char *path, size_t len) {
  if (!t || !step || !path || !len) return CKPTIO_E_INVALID_ARG;
  take tk = {NULL, 0};
  return restore(t, step, path, len, &tk);
}

int ckptio_tiers_restore_load(ckptio_tiers *t, uint64_t *step, const ckptio_tiers_dest *dests, size_t n) {
  if (!t || !step || (n && !dests)) return CKPTIO_E_INVALID_ARG;
  char path[4096];
  take tk = {dests, n};
  return restore(t, step, path, sizeof(path), &tk);
}
