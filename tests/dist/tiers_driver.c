/* Tiered checkpoints over real MPI processes (run by tests/dist/run.sh,
 * scenario "tiers"): ranks grouped into nodes of RPN ranks, node n's
 * memory directory WORK/node<n>/shm (a machine lost is that directory
 * wiped), one durable directory WORK/durable shared by all. Every rank's
 * part of step s is computed from (rank, s), so a restored part is checked
 * byte for byte.
 *
 *   tiers_driver WORK save FIRST LAST    saves steps FIRST..LAST
 *   tiers_driver WORK restore STEP TIERS restores: must be step STEP (0: any
 *                                        step whose parts all check), rank r's
 *                                        part from TIERS[r] (m: own memory, p: a
 *                                        peer, d: durable, s: storage, ?: any)
 *   tiers_driver WORK none               restore must find nothing (-ENOENT)
 *   tiers_driver WORK save-placed FIRST LAST  saves as `save`, with each rank's
 *                                        tensors placed in global ones (its rows
 *                                        of w, its 3 values of b), at 4 ranks
 *   tiers_driver WORK restore-global STEP restores at this run's world size
 *                                        from the durable or storage multi-rank checkpoint:
 *                                        this rank's rows of w and all of b
 *
 * TIERS_BACKGROUND set: saves in background mode (the tiers filled by the
 * handle's thread). TIERS_STORAGE=PREFIX (an s3:// prefix): a storage tier
 * there, every 2nd step, keeping 2, and no durable tier (restore letter s).
 * TIERS_NO_MEMORY set: no memory tier and no peers (the storage alone). Warnings go to stderr as "rank R warning: ...". Exit 0
 * when every check held on this rank. */
#define CKPTIO_EXPERIMENTAL
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckptio.h"
#include "ckptio_mpi.h"
#include "check.h"

static int rank, nranks, failures;
#define RPN 2
#define COLS 1024
#define N_W (1 << 18) /* 1 MiB of f32 per rank, as N_W / COLS rows of w */
#define SAVED_RANKS 4 /* the world size of save-placed */

static float value(int r, uint64_t step, size_t i) { return (float)(r * 1000003 + (int)step * 7919 + (int)(i % 65521)); }

static void on_warning(void *arg, uint64_t step, int tier, int code, const char *message) {
  (void)arg;
  fprintf(stderr, "rank %d warning: step %llu tier %d (%s): %s\n", rank, (unsigned long long)step, tier,
          ckptio_strerror(code), message);
}

static int open_tiers(ckptio_ctx *ctx, ckptio_comm *comm, const char *work, ckptio_tiers **t) {
  static char mem[4096], dur[4096];
  int rpn = nranks % RPN ? 1 : RPN; /* a restart at 3 ranks: one per node */
  snprintf(mem, sizeof(mem), "%s/node%d/shm", work, rank / rpn);
  snprintf(dur, sizeof(dur), "%s/durable", work);
  char node[4096];
  snprintf(node, sizeof(node), "%s/node%d", work, rank / rpn);
  mkdir(node, 0777);
  ckptio_tiers_options o = CKPTIO_TIERS_OPTIONS_INIT;
  o.memory_dir = mem;
  o.memory_keep = 2;
  o.peers = nranks / rpn > 1; /* a restart at 2 ranks: one node, no peers */
  o.ranks_per_node = rpn;
  o.durable_dir = dur;
  o.durable_every = 2;
  o.durable_keep = 2;
  o.background = getenv("TIERS_BACKGROUND") != NULL;
  if ((o.storage_dir = getenv("TIERS_STORAGE"))) {
    o.durable_dir = NULL;
    o.storage_every = 2;
    o.storage_keep = 2;
  }
  if (getenv("TIERS_NO_MEMORY")) o.memory_dir = NULL, o.peers = 0;
  int rc = ckptio_tiers_open(ctx, comm, &o, t);
  CHECK(rc == 0, "ckptio_tiers_open: %s", ckptio_last_open_error());
  if (rc == 0) ckptio_tiers_set_warning(*t, on_warning, NULL);
  return rc;
}

/* Rank r's tensors at each step: w (its N_W values as rows of COLS) and
 * b = {r, step, 7}. Placed, they are rows r * N_W / COLS... of a global w
 * and values 3r..3r+2 of a global b. */
static void save(ckptio_tiers *t, uint64_t first, uint64_t last, int placed) {
  float *w = malloc(N_W * sizeof(float));
  ckptio_tiers_place places[2] = {{{SAVED_RANKS * N_W / COLS, COLS}, {rank * N_W / COLS, 0}},
                                  {{SAVED_RANKS * 3}, {rank * 3}}};
  for (uint64_t s = first; s <= last; s++) {
    for (size_t i = 0; i < N_W; i++) w[i] = value(rank, s, i);
    int64_t b[3] = {rank, (int64_t)s, 7};
    ckptio_tensor ts[2] = {{"w", CKPTIO_F32, 2, {N_W / COLS, COLS}, w, CKPTIO_DEVICE_HOST},
                           {"b", CKPTIO_I64, 1, {3}, b, CKPTIO_DEVICE_HOST}};
    int rc = placed ? ckptio_tiers_save_placed(t, s, ts, places, 2) : ckptio_tiers_save(t, s, ts, 2);
    CHECK(rc == 0, "save step %llu: %s", (unsigned long long)s, ckptio_tiers_last_error(t));
  }
  free(w);
}

/* The part at path is rank's part of step: every byte. */
static void check_part(ckptio_ctx *ctx, const char *path, uint64_t step) {
  ckptio_reader *r = NULL;
  int rc = ckptio_reader_open(ctx, path, NULL, &r);
  CHECK(rc == 0, "open %s: %s", path, ckptio_last_open_error());
  if (rc) return;
  float *w = malloc(N_W * sizeof(float));
  int64_t b[3] = {0};
  CHECK(ckptio_reader_count(r) == 2, "%s: %zu tensors", path, ckptio_reader_count(r));
  for (size_t i = 0; i < ckptio_reader_count(r); i++) {
    ckptio_tensor_info info;
    ckptio_reader_info(r, i, &info);
    if (!strcmp(info.name, "w")) rc = ckptio_reader_load(r, i, w, N_W * sizeof(float));
    else rc = ckptio_reader_load(r, i, b, sizeof(b));
    CHECK(rc == 0, "load %s: %s", info.name, ckptio_reader_last_error(r));
  }
  CHECK(b[0] == rank && b[1] == (int64_t)step && b[2] == 7, "b = %lld %lld %lld", (long long)b[0],
        (long long)b[1], (long long)b[2]);
  size_t bad = 0;
  for (size_t i = 0; i < N_W; i++) bad += w[i] != value(rank, step, i);
  CHECK(bad == 0, "%zu elements of w differ from step %llu's", bad, (unsigned long long)step);
  free(w);
  ckptio_reader_close(r);
}

static void restore(ckptio_ctx *ctx, ckptio_tiers *t, uint64_t want, const char *tiers) {
  uint64_t step = 0;
  char path[4096];
  int rc = ckptio_tiers_restore(t, &step, path, sizeof(path));
  CHECK(rc == 0, "restore: %s", ckptio_tiers_last_error(t));
  if (rc) return;
  ckptio_tiers_stats st = CKPTIO_TIERS_STATS_INIT;
  ckptio_tiers_stats_get(t, &st);
  const uint64_t *got = st.restored_bytes;
  printf("rank %d restored step %llu from %s: memory %llu peer %llu durable %llu storage %llu bytes, "
         "%llu copies skipped\n", rank, (unsigned long long)step, path, (unsigned long long)got[0],
         (unsigned long long)got[1], (unsigned long long)got[2], (unsigned long long)got[3],
         (unsigned long long)st.skipped_copies);
  CHECK(!want || step == want, "restored step %llu, expected %llu", (unsigned long long)step,
        (unsigned long long)want);
  char tier = (int)strlen(tiers) > rank ? tiers[rank] : '?';
  int from = got[0] ? 'm' : got[1] ? 'p' : got[2] ? 'd' : got[3] ? 's' : '-';
  CHECK(tier == '?' || tier == from, "part from tier %c, expected %c", from, tier);
  int tiers_used = !!got[0] + !!got[1] + !!got[2] + !!got[3];
  CHECK(tiers_used == 1, "bytes from %d tiers", tiers_used);
  check_part(ctx, path, step);
}

/* A box of tensor name of the checkpoint r: dims [start, stop). */
static int load_box(ckptio_reader *r, const char *name, int ndim, const int64_t *start, const int64_t *stop,
                    void *dst, uint64_t bytes) {
  int64_t idx = ckptio_reader_find(r, name);
  CHECK(idx >= 0, "no tensor %s", name);
  if (idx < 0) return -1;
  ckptio_box_request q;
  memset(&q, 0, sizeof(q));
  q.index = (size_t)idx, q.dst = dst, q.dst_bytes = bytes, q.device = CKPTIO_DEVICE_HOST;
  memcpy(q.start, start, (size_t)ndim * sizeof(int64_t));
  memcpy(q.stop, stop, (size_t)ndim * sizeof(int64_t));
  int rc = ckptio_reader_load_boxes(r, &q, 1);
  CHECK(rc == 0, "load box of %s: %s", name, ckptio_reader_last_error(r));
  return rc;
}

/* The restore at this run's world size: this rank's share of w's rows and
 * all of b, from the durable or storage tier's multi-rank checkpoint. */
static void restore_global(ckptio_ctx *ctx, ckptio_tiers *t, uint64_t want) {
  uint64_t step = 0;
  char path[4096];
  int rc = ckptio_tiers_restore_global(t, &step, path, sizeof(path));
  CHECK(rc == 0, "restore_global: %s", ckptio_tiers_last_error(t));
  if (rc) return;
  CHECK(step == want, "restored step %llu, expected %llu", (unsigned long long)step, (unsigned long long)want);
  ckptio_reader *r = NULL;
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  o.crc = 0; /* checked by the restore */
  rc = ckptio_reader_open(ctx, path, &o, &r);
  CHECK(rc == 0, "open %s: %s", path, ckptio_last_open_error());
  if (rc) return;
  int64_t rows = SAVED_RANKS * N_W / COLS, first = rows * rank / nranks, last = rows * (rank + 1) / nranks;
  int64_t start[2] = {first, 0}, stop[2] = {last, COLS};
  size_t n = (size_t)(last - first) * COLS, bad = 0;
  float *w = malloc(n * sizeof(float));
  if (load_box(r, "w", 2, start, stop, w, n * sizeof(float)) == 0)
    for (size_t k = 0; k < n; k++) {
      size_t g = (size_t)first * COLS + k; /* element g of the global w: rank g / N_W's element g % N_W */
      bad += w[k] != value((int)(g / N_W), step, g % N_W);
    }
  CHECK(bad == 0, "%zu elements of rows %lld-%lld of w differ from step %llu's", bad, (long long)first,
        (long long)last, (unsigned long long)step);
  int64_t b[SAVED_RANKS * 3], b0[1] = {0}, b1[1] = {SAVED_RANKS * 3};
  if (load_box(r, "b", 1, b0, b1, b, sizeof(b)) == 0)
    for (int k = 0; k < SAVED_RANKS; k++)
      CHECK(b[3 * k] == k && b[3 * k + 1] == (int64_t)step && b[3 * k + 2] == 7, "b of rank %d", k);
  ckptio_tiers_stats st = CKPTIO_TIERS_STATS_INIT;
  ckptio_tiers_stats_get(t, &st);
  printf("rank %d of %d restored step %llu from %s: rows %lld-%lld of w, %llu bytes checked\n", rank, nranks,
         (unsigned long long)step, path, (long long)first, (long long)last,
         (unsigned long long)(st.restored_bytes[CKPTIO_TIER_DURABLE] + st.restored_bytes[CKPTIO_TIER_STORAGE]));
  free(w);
  ckptio_reader_close(r);
}

int main(int argc, char **argv) {
  /* Background saves call the communicator from the handle's thread. */
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm world;
  MPI_Comm_dup(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &nranks);
  if (argc < 3) {
    fprintf(stderr, "usage: tiers_driver WORK save FIRST LAST | restore STEP TIERS | none\n");
    return 2;
  }
  ckptio_ctx *ctx = NULL;
  ckptio_comm comm;
  ckptio_tiers *t = NULL;
  if (ckptio_ctx_create(NULL, &ctx) != 0 || ckptio_comm_from_mpi(&world, &comm) != 0 ||
      open_tiers(ctx, &comm, argv[1], &t) != 0) {
    fprintf(stderr, "rank %d: setup failed: %s\n", rank, ckptio_last_open_error());
    MPI_Abort(world, 1);
  }
  if ((!strcmp(argv[2], "save") || !strcmp(argv[2], "save-placed")) && argc == 5) {
    save(t, strtoull(argv[3], NULL, 10), strtoull(argv[4], NULL, 10), !strcmp(argv[2], "save-placed"));
    int rc = ckptio_tiers_wait(t);
    CHECK(rc == 0, "the last save's finish: %s", ckptio_tiers_last_error(t));
  } else if (!strcmp(argv[2], "restore") && argc == 5) {
    restore(ctx, t, strtoull(argv[3], NULL, 10), argv[4]);
  } else if (!strcmp(argv[2], "restore-global") && argc == 4) {
    restore_global(ctx, t, strtoull(argv[3], NULL, 10));
  } else if (!strcmp(argv[2], "none")) {
    uint64_t step;
    char path[4096];
    int rc = ckptio_tiers_restore(t, &step, path, sizeof(path));
    CHECK(rc == -ENOENT, "restore with nothing left returned %d (%s)", rc, ckptio_tiers_last_error(t));
    printf("rank %d: nothing to restore: %s\n", rank, ckptio_tiers_last_error(t));
  } else {
    fprintf(stderr, "tiers_driver: unknown mode %s\n", argv[2]);
    failures++;
  }
  ckptio_tiers_close(t);
  ckptio_ctx_free(ctx);
  int all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, world);
  MPI_Comm_free(&world);
  MPI_Finalize();
  return all ? 1 : 0;
}
