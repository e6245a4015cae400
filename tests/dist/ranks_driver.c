/* Multi-rank checkpoints over real MPI processes (run by tests/dist/run.sh
 * under mpirun). Every rank computes any element of any tensor from its
 * name and global index, so each can build the part it saves and check any
 * box it loads, byte for byte, without the whole tensor.
 *
 *   ranks_driver save DIR SEED        save the model, then load it back
 *   ranks_driver load DIR SEED        load a checkpoint written by any number of ranks
 *   ranks_driver fail-rank R DIR SEED rank R's disk fills mid-save: all fail, DIR keeps its old checkpoint
 *   ranks_driver kill-rank R DIR SEED rank R is killed mid-save (mpirun then ends the job)
 *
 * Exit 0 when every check held on this rank, 1 otherwise. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckptio.h"
#include "ckptio_mpi.h"
#include "check.h"

static int rank, nranks, failures;


/* ------------------------------------------------------------ the model */

typedef struct tdef {
  const char *name;
  ckptio_dtype dtype;
  int ndim;
  int64_t shape[3];
  int split;   /* the dim split across ranks, -1: every rank holds it whole, -2: rank 0 only, 9: 2-D mesh */
} tdef;

static const tdef kModel[] = {
    {"layers.0.attn.qkv", CKPTIO_F32, 2, {1000, 64}, 0},  /* row parallel, uneven for 3 ranks */
    {"layers.0.attn.out", CKPTIO_BF16, 2, {64, 1000}, 1}, /* column parallel */
    {"layers.0.heads", CKPTIO_F32, 3, {4, 6, 96}, 2},
    {"layers.0.mlp", CKPTIO_F32, 2, {64, 48}, 9},
    {"embed", CKPTIO_F32, 2, {4096, 256}, 0},             /* 4 MiB, for real writes */
    {"norm", CKPTIO_F32, 1, {256}, -1},                   /* replicated */
    {"step", CKPTIO_I64, 1, {3}, -2},
};
#define NT (sizeof(kModel) / sizeof(kModel[0]))

static uint32_t hash(const char *s) {
  uint32_t h = 2166136261u;
  while (*s) h = (h ^ (uint8_t)*s++) * 16777619u;
  return h;
}

static size_t elem(ckptio_dtype dt) { return (size_t)ckptio_dtype_bits(dt) / 8; }

/* The bytes of element g (global row-major index) of tensor t in save `seed`. */
static void element(const tdef *t, uint64_t g, uint32_t seed, unsigned char *out) {
  uint64_t v = (uint64_t)hash(t->name) * 2654435761u + g * 0x9E3779B97F4A7C15ull + seed;
  v ^= v >> 29;
  memcpy(out, &v, elem(t->dtype));
}

/* Fills buf with the box [lo, lo + size) of t, row-major. */
static void fill_box(const tdef *t, const int64_t *lo, const int64_t *size, uint32_t seed, unsigned char *buf) {
  uint64_t total = 1, es = elem(t->dtype);
  for (int d = 0; d < t->ndim; d++) total *= (uint64_t)size[d];
  for (uint64_t i = 0; i < total; i++) {
    uint64_t rem = i, g = 0, idx[3];
    for (int d = t->ndim - 1; d >= 0; d--) idx[d] = rem % (uint64_t)size[d], rem /= (uint64_t)size[d];
    for (int d = 0; d < t->ndim; d++) g = g * (uint64_t)t->shape[d] + (uint64_t)lo[d] + idx[d];
    element(t, g, seed, buf + i * es);
  }
}

/* This rank's part of t when `n` ranks hold it: 0 and *has = 0 for none. */
static void part_of(const tdef *t, int r, int n, int64_t *lo, int64_t *size, int *has) {
  *has = 1;
  for (int d = 0; d < t->ndim; d++) lo[d] = 0, size[d] = t->shape[d];
  if (t->split == -2) {
    *has = r == 0;
  } else if (t->split == 9 && n == 4) {
    lo[0] = (r / 2) * (t->shape[0] / 2), size[0] = t->shape[0] / 2;
    lo[1] = (r % 2) * (t->shape[1] / 2), size[1] = t->shape[1] / 2;
  } else if (t->split >= 0) {
    int d = t->split == 9 ? 0 : t->split;
    int64_t a, b;
    ckptio_split_rank(t->shape[d], r, n, &a, &b);
    lo[d] = a, size[d] = b - a;
    *has = b > a;
  }
}

static uint64_t box_bytes(const tdef *t, const int64_t *size) {
  uint64_t b = elem(t->dtype);
  for (int d = 0; d < t->ndim; d++) b *= (uint64_t)size[d];
  return b;
}

/* ------------------------------------------------------------ save */

static ckptio_ctx *make_ctx(void) {
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  o.threads = 2;
  o.staging_bytes = 16u << 20;
  o.chunk_bytes = 1u << 20;
  ckptio_ctx *ctx = NULL;
  if (ckptio_ctx_create(&o, &ctx) < 0) {
    fprintf(stderr, "rank %d: ckptio_ctx_create failed\n", rank);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return ctx;
}

/* Saves the model's parts of this rank. @return the save's code; *msg its
 * message. kill_after_commit: SIGKILL this process once the save is under way. */
static int save(ckptio_ctx *ctx, const char *dir, uint32_t seed, int kill_me, char *msg, size_t len) {
  MPI_Comm world = MPI_COMM_WORLD;
  ckptio_comm comm;
  CHECK(ckptio_comm_from_mpi(&world, &comm) == 0, "comm");
  ckptio_writer *w = NULL;
  int rc = ckptio_writer_open_ranks(ctx, &comm, dir, "model", NULL, &w);
  if (rc < 0) {
    snprintf(msg, len, "%s", ckptio_last_open_error());
    return rc;
  }
  unsigned char *bufs[NT] = {0};
  for (size_t i = 0; i < NT && rc == 0; i++) {
    const tdef *t = &kModel[i];
    int64_t lo[3], size[3];
    int has;
    part_of(t, rank, nranks, lo, size, &has);
    if (!has) continue;
    bufs[i] = malloc(box_bytes(t, size) + 1);
    fill_box(t, lo, size, seed, bufs[i]);
    ckptio_tensor d = {.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .data = bufs[i]};
    memcpy(d.shape, size, sizeof(int64_t) * (size_t)t->ndim);
    rc = t->split == -1 || t->split == -2 ? ckptio_writer_add(w, &d) : ckptio_writer_add_part(w, &d, t->shape, lo);
  }
  if (rc == 0) rc = ckptio_writer_commit_async(w);
  if (kill_me) raise(SIGKILL);
  /* A rank whose commit_async failed still joins the agreement. */
  int rc2 = ckptio_writer_wait_durable(w);
  if (rc == 0) rc = rc2;
  snprintf(msg, len, "%s", ckptio_writer_last_error(w));
  int rc3 = ckptio_writer_close(w);
  if (rc == 0) rc = rc3;
  for (size_t i = 0; i < NT; i++) free(bufs[i]);
  return rc;
}

/* ------------------------------------------------------------ load and check */

/* object: dir is an object storage's prefix, whose GETs also read the gaps
 * of under 64 KiB between a box's runs (ckptio.h, bytes_read); a local
 * file's PREAD reads the box's bytes exactly. Neither reads past the
 * tensor. */
static void check_box(ckptio_reader *r, const tdef *t, const int64_t *lo, const int64_t *size, uint32_t seed,
                      int object) {
  int64_t index = ckptio_reader_find(r, t->name);
  CHECK(index >= 0, "%s not found", t->name);
  if (index < 0) return;
  uint64_t nb = box_bytes(t, size);
  unsigned char *want = malloc(nb + 1), *got = malloc(nb + 1);
  fill_box(t, lo, size, seed, want);
  ckptio_box_request q = {.index = (size_t)index, .dst = got, .dst_bytes = nb, .device = CKPTIO_DEVICE_HOST};
  for (int d = 0; d < t->ndim; d++) q.start[d] = lo[d], q.stop[d] = lo[d] + size[d];
  int rc = ckptio_reader_load_boxes(r, &q, 1);
  CHECK(rc == 0, "%s: load_boxes: %s", t->name, ckptio_reader_last_error(r));
  CHECK(rc != 0 || memcmp(want, got, nb) == 0, "%s: the box's bytes differ (seed %u)", t->name, seed);
  uint64_t whole = box_bytes(t, t->shape);
  CHECK(rc != 0 || (object ? q.bytes_read >= nb && q.bytes_read <= whole : q.bytes_read == nb),
        "%s: read %llu bytes for a box of %llu (the tensor: %llu)", t->name, (unsigned long long)q.bytes_read,
        (unsigned long long)nb, (unsigned long long)whole);
  free(want);
  free(got);
}

/* Every tensor whole (load_many, CRCs checked), then resharded boxes: this
 * rank's share as the ranks of this run split each tensor on another dim. */
static void check_load(ckptio_ctx *ctx, const char *dir, uint32_t seed) {
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  o.load_method = CKPTIO_LOAD_PREAD; /* exactly the bytes asked for */
  ckptio_reader *r = NULL;
  int rc = ckptio_reader_open(ctx, dir, &o, &r);
  CHECK(rc == 0, "open %s: %s", dir, ckptio_last_open_error());
  if (rc < 0) return;
  CHECK(ckptio_reader_count(r) == NT, "%zu tensors", ckptio_reader_count(r));
  size_t unchecked = 1;
  CHECK(ckptio_reader_verify(r, &unchecked) == 0 && unchecked == 0, "verify: %s", ckptio_reader_last_error(r));
  for (size_t i = 0; i < NT; i++) {
    const tdef *t = &kModel[i];
    int64_t lo[3] = {0}, size[3];
    memcpy(size, t->shape, sizeof(size));
    int64_t index = ckptio_reader_find(r, t->name);
    CHECK(index >= 0, "%s missing", t->name);
    if (index < 0) continue;
    uint64_t nb = box_bytes(t, size);
    unsigned char *want = malloc(nb), *got = malloc(nb);
    fill_box(t, lo, size, seed, want);
    CHECK(ckptio_reader_load(r, (size_t)index, got, nb) == 0, "%s: %s", t->name, ckptio_reader_last_error(r));
    CHECK(memcmp(want, got, nb) == 0, "%s: whole tensor differs", t->name);
    free(want);
    free(got);
    /* Resharded: split on the last dim (or the first when saved on the last). */
    int d = t->ndim - 1 == t->split ? 0 : t->ndim - 1;
    int64_t a, b;
    ckptio_split_rank(t->shape[d], rank, nranks, &a, &b);
    lo[d] = a, size[d] = b - a;
    if (b > a) check_box(r, t, lo, size, seed, strncmp(dir, "s3://", 5) == 0);
  }
  ckptio_reader_close(r);
}

/* Files of the checkpoint in dir: no temp file, and the expected count. */
static void check_files(const char *dir, int want_files) {
  DIR *d = opendir(dir);
  struct dirent *e;
  int files = 0, index = 0;
  while (d && (e = readdir(d))) {
    CHECK(!strstr(e->d_name, "ckptio-tmp"), "temp file left: %s", e->d_name);
    if (!strncmp(e->d_name, "model-", 6)) files++;
    if (!strcmp(e->d_name, "model.safetensors.index.json")) index++;
  }
  if (d) closedir(d);
  CHECK(index == 1, "no index");
  if (want_files) CHECK(files == want_files, "%d files, expected %d", files, want_files);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  if (argc < 4) {
    fprintf(stderr, "usage: see the top of tests/dist/ranks_driver.c\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const char *mode = argv[1];
  int victim = -1;
  if (!strcmp(mode, "fail-rank") || !strcmp(mode, "kill-rank")) {
    victim = atoi(argv[2]);
    argv++, argc--;
  }
  const char *dir = argv[2];
  uint32_t seed = (uint32_t)strtoul(argv[3], NULL, 10);
  if (!strcmp(mode, "fail-rank") && rank == victim) setenv("CKPTIO_FAULT", "pwrite:2:ENOSPC", 1); /* before the first write */
  ckptio_ctx *ctx = make_ctx();
  char msg[1024] = "";
  if (!strcmp(mode, "save")) {
    int rc = save(ctx, dir, seed, 0, msg, sizeof(msg));
    CHECK(rc == 0, "save: %s", msg);
    MPI_Barrier(MPI_COMM_WORLD);
    /* every rank holds a split part (a storage prefix is checked by run.sh) */
    if (rank == 0 && !strstr(dir, "://")) check_files(dir, nranks);
    check_load(ctx, dir, seed);
  } else if (!strcmp(mode, "load")) {
    check_load(ctx, dir, seed);
  } else if (!strcmp(mode, "fail-rank")) {
    /* The old checkpoint was saved with seed - 1. */
    int rc = save(ctx, dir, seed, 0, msg, sizeof(msg));
    char want[64];
    snprintf(want, sizeof(want), "rank %d", victim);
    if (rank == victim)
      CHECK(rc == -ENOSPC, "the failing rank got %d (%s), not -ENOSPC", rc, msg);
    else
      CHECK(rc == CKPTIO_E_RANK && strstr(msg, want), "rank got %d: %s", rc, msg);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) check_files(dir, 0);
    unsetenv("CKPTIO_FAULT");
    check_load(ctx, dir, seed - 1);
  } else if (!strcmp(mode, "kill-rank")) {
    save(ctx, dir, seed, rank == victim, msg, sizeof(msg));
    /* Only ranks that finished before mpirun noticed get here. */
  } else {
    fprintf(stderr, "unknown mode %s\n", mode);
    failures++;
  }
  ckptio_ctx_free(ctx);
  int all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("%s %s: %d ranks, %s\n", mode, dir, nranks, all ? "FAILED" : "ok");
  MPI_Finalize();
  return failures ? 1 : 0;
}
