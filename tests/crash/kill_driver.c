/* The saving side of the kill test (kill_test.py): `save KIND PATH` saves
 * sequence numbers 1, 2, 3... to the same path in a loop until killed (or
 * COUNT saves),
 * printing "begin N", "snapshot N" and "durable N" as each save passes those
 * points (sequence numbers from START when given); `check KIND PATH` opens what is at the path, verifies every CRC,
 * finds which save's bytes it holds, and prints "seq=N strays=K" (K: temp
 * files in the directory). Kinds: single (safetensors), pt (PyTorch zip),
 * sharded (a Hugging Face set of 3 shards), resharded (a set of 3 shards,
 * then of 5, in turn), zstd (compressed), ranks (a one-rank multi-rank
 * save), ranks3 (three threads as the ranks of one save). Linked like a
 * user's program: public API only. */
#include <dirent.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckptio.h"
#include "driver.h"

#define NTENSORS 4
static const int64_t kRows[NTENSORS] = {512, 384, 256, 8};
#define COLS 1024 /* F32: 4.6 MiB in all */

/* Every byte depends on the save, the tensor and the element. */
static uint32_t value(uint64_t seq, int k, uint64_t i) {
  uint64_t x = seq * 0x9E3779B97F4A7C15ull ^ ((uint64_t)k << 56) ^ (i * 0xBF58476D1CE4E5B9ull);
  x ^= x >> 31;
  return (uint32_t)x;
}

static int usage(void) {
  fprintf(stderr, "usage: kill_driver save|check single|pt|sharded|resharded|zstd|ranks|ranks3 PATH [COUNT [START]]\n");
  return 2;
}

/* Three threads as the ranks of one save: the collectives meet at a barrier
 * and pass their bytes through one shared buffer. */
#define NRANKS 3
typedef struct {
  pthread_barrier_t barrier;
  char *shared;
  size_t cap;
  const void *root_buf;
} group;
typedef struct {
  group *g;
  int rank, rc;
  ckptio_ctx *ctx;
  const char *path;
  uint64_t seq;
  uint32_t **bufs;
} rank_job;

static int group_allgather(void *user, const void *send, void *recv, size_t bytes) {
  rank_job *j = user;
  pthread_barrier_wait(&j->g->barrier);
  if (j->rank == 0 && j->g->cap < NRANKS * bytes) {
    j->g->shared = realloc(j->g->shared, NRANKS * bytes);
    j->g->cap = NRANKS * bytes;
  }
  pthread_barrier_wait(&j->g->barrier);
  memcpy(j->g->shared + (size_t)j->rank * bytes, send, bytes);
  pthread_barrier_wait(&j->g->barrier);
  memcpy(recv, j->g->shared, NRANKS * bytes);
  pthread_barrier_wait(&j->g->barrier);
  return 0;
}

static int group_broadcast(void *user, void *buf, size_t bytes, int root) {
  rank_job *j = user;
  if (j->rank == root) j->g->root_buf = buf;
  pthread_barrier_wait(&j->g->barrier);
  if (j->rank != root) memcpy(buf, j->g->root_buf, bytes);
  pthread_barrier_wait(&j->g->barrier);
  return 0;
}

static int open_writer(ckptio_ctx *ctx, const char *kind, const char *path, uint64_t seq, ckptio_writer **w) {
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  if (!strcmp(kind, "single")) return ckptio_writer_open(ctx, path, CKPTIO_FORMAT_SAFETENSORS, NULL, w);
  if (!strcmp(kind, "pt")) return ckptio_writer_open(ctx, path, CKPTIO_FORMAT_PYTORCH, NULL, w);
  if (!strcmp(kind, "zstd")) {
    o.compress_level = 1;
    return ckptio_writer_open(ctx, path, CKPTIO_FORMAT_SAFETENSORS, &o, w);
  }
  if (!strcmp(kind, "sharded") || !strcmp(kind, "resharded")) {
    /* resharded: 3 shards, then 5, so each save replaces a set of another size */
    uint64_t shard = !strcmp(kind, "resharded") && seq % 2 == 0 ? 1u << 20 : 2u << 20;
    return ckptio_writer_open_sharded(ctx, path, "model", CKPTIO_FORMAT_SAFETENSORS, shard, CKPTIO_SHARD_ORDER_ADDED,
                                      NULL, w);
  }
  if (!strcmp(kind, "ranks")) {
    ckptio_comm c;
    ckptio_comm_single(&c);
    return ckptio_writer_open_ranks(ctx, &c, path, "model", NULL, w);
  }
  return CKPTIO_E_INVALID_ARG;
}

static int add_tensors(ckptio_writer *w, uint64_t seq, uint32_t **bufs, int rank, int nranks) {
  char meta[32];
  snprintf(meta, sizeof(meta), "%llu", (unsigned long long)seq);
  int rc = ckptio_writer_set_metadata(w, "seq", meta);
  for (int k = rank; k < NTENSORS && rc == 0; k += nranks) {
    char name[32];
    snprintf(name, sizeof(name), "t%d", k);
    ckptio_tensor t = {.name = name, .dtype = CKPTIO_F32, .ndim = 2, .shape = {kRows[k], COLS}, .data = bufs[k]};
    rc = ckptio_writer_add(w, &t);
  }
  return rc;
}

/* One rank's side of a ranks3 save, on its own context (as a process would). */
static void *rank_save(void *arg) {
  rank_job *j = arg;
  ckptio_comm c = {sizeof(ckptio_comm), j->rank, NRANKS, j, group_allgather, group_broadcast, NULL};
  ckptio_writer *w = NULL;
  int rc = ckptio_writer_open_ranks(j->ctx, &c, j->path, "model", NULL, &w);
  if (rc == 0) rc = add_tensors(w, j->seq, j->bufs, j->rank, NRANKS);
  /* Every rank takes part in the commit even after a local failure, so the
   * others' collectives meet it; the commit then fails on all of them. */
  int commit = w ? ckptio_writer_commit(w) : rc;
  if (rc == 0) rc = commit;
  if (rc < 0) fprintf(stderr, "rank %d: %s\n", j->rank, w ? ckptio_writer_last_error(w) : ckptio_last_open_error());
  ckptio_writer_close(w);
  j->rc = rc;
  return NULL;
}

static int save_ranks3(ckptio_ctx **ctxs, const char *path, uint64_t seq, uint32_t **bufs) {
  group g = {.shared = NULL};
  pthread_barrier_init(&g.barrier, NULL, NRANKS);
  rank_job jobs[NRANKS];
  pthread_t th[NRANKS];
  for (int r = 0; r < NRANKS; r++) {
    jobs[r] = (rank_job){&g, r, 0, ctxs[r], path, seq, bufs};
    pthread_create(&th[r], NULL, rank_save, &jobs[r]);
  }
  int rc = 0;
  for (int r = 0; r < NRANKS; r++) {
    pthread_join(th[r], NULL);
    if (jobs[r].rc < 0) rc = jobs[r].rc;
  }
  pthread_barrier_destroy(&g.barrier);
  free(g.shared);
  return rc;
}

static void say(const char *event, uint64_t seq) {
  printf("%s %llu\n", event, (unsigned long long)seq);
  fflush(stdout);
}

static int save_loop(const char *kind, const char *path, uint64_t count, uint64_t start) {
  int ranks3 = !strcmp(kind, "ranks3");
  ckptio_ctx *ctxs[NRANKS];
  for (int r = 0; r < (ranks3 ? NRANKS : 1); r++) ctxs[r] = driver_ctx();
  uint32_t *bufs[NTENSORS];
  for (int k = 0; k < NTENSORS; k++) bufs[k] = malloc((size_t)kRows[k] * COLS * 4);
  int failed = 0;
  for (uint64_t n = 0, seq = start; n < count; n++, seq++) {
    for (int k = 0; k < NTENSORS; k++)
      for (uint64_t i = 0; i < (uint64_t)kRows[k] * COLS; i++) bufs[k][i] = value(seq, k, i);
    if (ranks3) {
      say("begin", seq);
      if (save_ranks3(ctxs, path, seq, bufs) < 0) {
        failed = 1;
        break;
      }
      say("durable", seq);
      continue;
    }
    ckptio_writer *w = NULL;
    int rc = open_writer(ctxs[0], kind, path, seq, &w);
    if (rc == 0) rc = add_tensors(w, seq, bufs, 0, 1);
    say("begin", seq);
    if (rc == 0) rc = ckptio_writer_commit_async(w);
    if (rc == 0) rc = ckptio_writer_wait_snapshot(w);
    say("snapshot", seq);
    if (rc == 0) rc = ckptio_writer_wait_durable(w);
    if (rc < 0) {
      fprintf(stderr, "save %llu: %s\n", (unsigned long long)seq, w ? ckptio_writer_last_error(w) : ckptio_last_open_error());
      ckptio_writer_close(w);
      failed = 1;
      break;
    }
    ckptio_writer_close(w);
    say("durable", seq);
  }
  for (int k = 0; k < NTENSORS; k++) free(bufs[k]);
  for (int r = 0; r < (ranks3 ? NRANKS : 1); r++) ckptio_ctx_free(ctxs[r]);
  return failed;
}

static int strays_in(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  int n = 0;
  while (d && (e = readdir(d))) n += strstr(e->d_name, "ckptio-tmp") != NULL;
  if (d) closedir(d);
  return n;
}

/* What is at the path: nothing (seq 0), or one whole save. */
static int check(const char *kind, const char *path) {
  char dir[4096];
  const char *slash = strrchr(path, '/');
  if (!strcmp(kind, "sharded") || !strcmp(kind, "resharded") || !strncmp(kind, "ranks", 5))
    snprintf(dir, sizeof(dir), "%s", path);
  else snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
  ckptio_ctx *ctx = driver_ctx();
  ckptio_reader *r = NULL;
  int rc = ckptio_reader_open(ctx, path, NULL, &r);
  if (rc == -2 /* -ENOENT: no save finished yet */ ||
      (rc == CKPTIO_E_SHARD && strstr(ckptio_last_open_error(), "exactly one"))) {
    printf("seq=0 strays=%d\n", strays_in(dir));
    ckptio_ctx_free(ctx);
    return 0;
  }
  if (rc < 0) {
    printf("BAD open: %s\n", ckptio_last_open_error());
    return 1;
  }
  size_t unchecked = 99;
  if ((rc = ckptio_reader_verify(r, &unchecked)) < 0 || unchecked) {
    printf("BAD verify: %s (unchecked %zu)\n", ckptio_reader_last_error(r), unchecked);
    return 1;
  }
  const char *m = ckptio_reader_metadata_get(r, "seq");
  uint64_t seq = m ? strtoull(m, NULL, 10) : 0;
  if (ckptio_reader_count(r) != NTENSORS) {
    printf("BAD: %zu tensors\n", ckptio_reader_count(r));
    return 1;
  }
  for (int k = 0; k < NTENSORS; k++) {
    char name[32];
    snprintf(name, sizeof(name), "t%d", k);
    int64_t idx = ckptio_reader_find(r, name);
    uint64_t n = (uint64_t)kRows[k] * COLS;
    uint32_t *buf = malloc(n * 4);
    if (idx < 0 || ckptio_reader_load(r, (size_t)idx, buf, n * 4) < 0) {
      printf("BAD load %s: %s\n", name, ckptio_reader_last_error(r));
      return 1;
    }
    for (uint64_t i = 0; i < n; i++)
      if (buf[i] != value(seq, k, i)) {
        printf("BAD: %s element %llu is not save %llu's\n", name, (unsigned long long)i, (unsigned long long)seq);
        return 1;
      }
    free(buf);
  }
  ckptio_reader_close(r);
  ckptio_ctx_free(ctx);
  printf("seq=%llu strays=%d\n", (unsigned long long)seq, strays_in(dir));
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 4 || argc > 6) return usage();
  if (!strcmp(argv[1], "save"))
    return save_loop(argv[2], argv[3], argc >= 5 ? strtoull(argv[4], NULL, 10) : UINT64_MAX,
                     argc == 6 ? strtoull(argv[5], NULL, 10) : 1);
  if (!strcmp(argv[1], "check")) return check(argv[2], argv[3]);
  return usage();
}
