/* Group loads over real MPI processes (run by tests/dist/run.sh under
 * mpirun). Every byte of the model is a function of its tensor's name and
 * its offset, so each rank checks any box it loads without the file.
 *
 *   group_driver prepare FILE        save the model (one process)
 *   group_driver prepare-other FILE  save another checkpoint (the same tensors, other bytes)
 *   group_driver whole FILE          every rank loads every tensor whole
 *   group_driver tp FILE             tensor-parallel shares: column, row and
 *                                    vocabulary splits plus replicated tensors
 *   group_driver fail-crc FILE       a byte of FILE is damaged: every rank fails,
 *                                    the reading rank with its checksum error
 *   group_driver missing FILE        rank 1 asks for a tensor that does not exist
 *   group_driver different FILE      the last rank opens another checkpoint
 *   group_driver kill FILE           rank 1 is SIGKILLed mid-load (mpirun then ends the job)
 *
 * A mode ending in -x passes CKPTIO_GROUP_EXCHANGE: the ranks exchange
 * bytes although they share this machine's page cache (the failures need
 * it: they are the exchange's). One ending in -w has rank r open its own
 * copy, FILE.copyR: one machine, no shared page cache, so the ranks share
 * windows of memory.
 *
 * whole and tp also count the bytes each process read from storage
 * (/proc/self/io read_bytes, the file's pages dropped from the page cache
 * first) and fail when the group read more than 1.02x the bytes its boxes
 * need. Exit 0 when every check held on this rank, 1 otherwise. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CKPTIO_EXPERIMENTAL
#include "ckptio.h"
#include "ckptio_mpi.h"
#include "check.h"

static int rank, nranks, failures;
static uint64_t salt; /* 1: the other checkpoint's bytes */
static int exchange;  /* a mode ending in -x: CKPTIO_GROUP_EXCHANGE */
static int copies;    /* a mode ending in -w: rank r opens FILE.copyR (windows of shared memory) */


/* ------------------------------------------------------------ the model */

typedef struct tdef {
  const char *name;
  ckptio_dtype dtype;
  int ndim;
  int64_t shape[2];
  int split; /* the dim a tensor-parallel rank takes a share of; -1: replicated */
} tdef;

static const tdef kModel[] = {
    {"embed", CKPTIO_BF16, 2, {8192, 1024}, 0},           /* 16 MiB, vocabulary-parallel */
    {"layers.0.qkv", CKPTIO_F32, 2, {1024, 3072}, 1},     /* column-parallel */
    {"layers.0.out", CKPTIO_F32, 2, {1024, 1024}, 0},     /* row-parallel */
    {"layers.0.norm", CKPTIO_F32, 1, {1024}, -1},
    {"layers.1.qkv", CKPTIO_F32, 2, {1024, 3072}, 1},
    {"layers.1.out", CKPTIO_F32, 2, {1024, 1024}, 0},
    {"layers.1.norm", CKPTIO_F32, 1, {1024}, -1},
    {"step", CKPTIO_I64, 0, {0}, -1},
};
#define NT (sizeof(kModel) / sizeof(kModel[0]))

static size_t elem(const tdef *t) { return (size_t)ckptio_dtype_bits(t->dtype) / 8; }

static uint64_t nbytes(const tdef *t) {
  uint64_t n = elem(t);
  for (int d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d];
  return n;
}

static unsigned char byte_at(const tdef *t, uint64_t off) {
  uint32_t h = 2166136261u;
  for (const char *s = t->name; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
  uint64_t x = (off + h + salt) * 0x9E3779B97F4A7C15ull;
  return (unsigned char)(x >> 56);
}

/* The bytes of box [lo, hi) of t, row-major. */
static void fill_box(const tdef *t, const int64_t *lo, const int64_t *hi, unsigned char *out) {
  size_t es = elem(t);
  if (t->ndim == 0) {
    for (size_t b = 0; b < es; b++) out[b] = byte_at(t, b);
    return;
  }
  int64_t cols = t->ndim == 2 ? t->shape[1] : 1;
  int64_t r0 = lo[0], r1 = hi[0], c0 = t->ndim == 2 ? lo[1] : 0, c1 = t->ndim == 2 ? hi[1] : 1;
  for (int64_t r = r0; r < r1; r++)
    for (int64_t c = c0; c < c1; c++)
      for (size_t b = 0; b < es; b++) *out++ = byte_at(t, ((uint64_t)(r * cols + c)) * es + b);
}

static int prepare(const char *file) {
  ckptio_ctx *ctx = NULL;
  ckptio_writer *w = NULL;
  int rc = ckptio_ctx_create(NULL, &ctx);
  if (rc == 0) rc = ckptio_writer_open(ctx, file, CKPTIO_FORMAT_SAFETENSORS, NULL, &w);
  unsigned char *bufs[NT] = {0};
  for (size_t i = 0; i < NT && rc == 0; i++) {
    const tdef *t = &kModel[i];
    int64_t lo[2] = {0, 0};
    bufs[i] = malloc(nbytes(t));
    fill_box(t, lo, t->shape, bufs[i]);
    ckptio_tensor d = {.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .data = bufs[i],
                       .device = CKPTIO_DEVICE_HOST};
    memcpy(d.shape, t->shape, sizeof(t->shape));
    rc = ckptio_writer_add(w, &d);
  }
  if (rc == 0) rc = ckptio_writer_commit(w);
  CHECK(rc == 0, "save %s: %s", file, w ? ckptio_writer_last_error(w) : ckptio_last_open_error());
  ckptio_writer_close(w);
  for (size_t i = 0; i < NT; i++) free(bufs[i]);
  ckptio_ctx_free(ctx);
  return rc;
}

/* ------------------------------------------------------------ the load */

static uint64_t read_bytes(void) {
  FILE *f = fopen("/proc/self/io", "r");
  char line[128];
  unsigned long long v = 0;
  while (f && fgets(line, sizeof(line), f))
    if (sscanf(line, "read_bytes: %llu", &v) == 1) break;
  if (f) fclose(f);
  return v;
}

static void drop_cache(const char *file) {
  int fd = open(file, O_RDONLY);
  if (fd >= 0) {
    fsync(fd); /* dirty pages (a copy just made) are not dropped */
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
}

/* rank 1 of the kill scenario dies in its third exchange. */
static int exchanges;
static int kill_alltoallv(void *user, const void *send, const size_t *sc, void *recv, const size_t *rc) {
  if (++exchanges == 3) raise(SIGKILL);
  return ckptio_mpi_alltoallv_(user, send, sc, recv, rc);
}

typedef struct box {
  const tdef *t;
  int64_t lo[2], hi[2];
} box;

/* This rank's boxes for the mode. */
static size_t boxes_of(const char *mode, box *out) {
  size_t n = 0;
  for (size_t i = 0; i < NT; i++) {
    const tdef *t = &kModel[i];
    box b = {t, {0, 0}, {t->shape[0], t->shape[1]}};
    if (!strcmp(mode, "tp") && t->split >= 0) {
      int64_t len = t->shape[t->split];
      b.lo[t->split] = len * rank / nranks, b.hi[t->split] = len * (rank + 1) / nranks;
    }
    out[n++] = b;
  }
  return n;
}

static void group_load(const char *mode, const char *file) {
  ckptio_ctx *ctx = NULL;
  ckptio_reader *r = NULL;
  MPI_Comm world = MPI_COMM_WORLD;
  ckptio_comm comm;
  CHECK(ckptio_comm_from_mpi(&world, &comm) == 0, "no communicator");
  if (!strcmp(mode, "kill") && rank == 1) comm.alltoallv = kill_alltoallv;
  const char *path = file;
  char other[4096], copy[4096];
  if (copies) {
    snprintf(copy, sizeof(copy), "%s.copy%d", file, rank);
    path = copy;
  }
  if (!strcmp(mode, "different") && rank == nranks - 1) {
    snprintf(other, sizeof(other), "%s.other", file);
    path = other;
  }
  CHECK(ckptio_ctx_create(NULL, &ctx) == 0, "context: %s", ckptio_last_open_error());
  CHECK(ckptio_reader_open(ctx, path, NULL, &r) == 0, "open %s: %s", path, ckptio_last_open_error());
  if (!r) MPI_Abort(MPI_COMM_WORLD, 1);
  box b[NT];
  size_t n = boxes_of(mode, b);
  ckptio_box_request q[NT + 1];
  unsigned char *got[NT + 1];
  uint64_t need = 0;
  memset(q, 0, sizeof(q));
  for (size_t i = 0; i < n; i++) {
    int64_t size[2] = {b[i].hi[0] - b[i].lo[0], b[i].hi[1] - b[i].lo[1]};
    int64_t index = ckptio_reader_find(r, b[i].t->name);
    CHECK(index >= 0, "%s missing", b[i].t->name);
    q[i].index = (size_t)index;
    q[i].dst_bytes = elem(b[i].t) * (b[i].t->ndim > 0 ? (uint64_t)size[0] : 1) *
                     (b[i].t->ndim > 1 ? (uint64_t)size[1] : 1);
    for (int d = 0; d < b[i].t->ndim; d++) q[i].start[d] = b[i].lo[d], q[i].stop[d] = b[i].hi[d];
    got[i] = malloc(q[i].dst_bytes + 1);
    q[i].dst = got[i];
    need += q[i].dst_bytes;
  }
  if (!strcmp(mode, "missing") && rank == 1) {
    q[n] = q[0];
    q[n].index = ckptio_reader_count(r) + 5;
    got[n++] = NULL;
  }
  if (rank == 0) drop_cache(file);
  if (copies) drop_cache(path);
  MPI_Barrier(MPI_COMM_WORLD);
  uint64_t before = read_bytes();
  double t0 = MPI_Wtime();
  int rc = ckptio_reader_load_boxes_group(r, &comm, q, n, 0, exchange ? CKPTIO_GROUP_EXCHANGE : 0);
  double secs = MPI_Wtime() - t0;
  uint64_t mine = read_bytes() - before;
  const char *err = ckptio_reader_last_error(r);
  if (!strcmp(mode, "whole") || !strcmp(mode, "tp")) {
    CHECK(rc == 0, "group load: %s", err);
    for (size_t i = 0; i < n && rc == 0; i++) {
      unsigned char *want = malloc(q[i].dst_bytes + 1);
      fill_box(b[i].t, b[i].lo, b[i].hi, want);
      CHECK(memcmp(want, got[i], q[i].dst_bytes) == 0, "%s: the box's bytes differ", b[i].t->name);
      CHECK(q[i].verified == 1, "%s: not verified", b[i].t->name);
      free(want);
    }
    /* The union of what the ranks asked for is the whole model in both modes. */
    uint64_t total = 0, model = 0, sum_need = 0;
    for (size_t i = 0; i < NT; i++) model += nbytes(&kModel[i]);
    MPI_Allreduce(&mine, &total, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&need, &sum_need, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) {
      printf("%s: %d ranks, %.3f s, read from storage %llu bytes by the group (%.4fx the union of %llu; the "
             "ranks asked for %llu bytes in all)\n",
             mode, nranks, secs, (unsigned long long)total, (double)total / (double)model,
             (unsigned long long)model, (unsigned long long)sum_need);
      CHECK(total <= model + model / 50, "the group read %llu bytes, more than 1.02x the union (%llu)",
            (unsigned long long)total, (unsigned long long)model);
    }
  } else {
    /* Every failure mode: every rank fails and names the rank and the cause. */
    int culprit = !strcmp(mode, "missing") ? 1 : !strcmp(mode, "different") ? nranks - 1 : -1;
    CHECK(rc < 0, "the group load succeeded");
    if (!strcmp(mode, "fail-crc"))
      CHECK(rc == CKPTIO_E_CHECKSUM || (rc == CKPTIO_E_RANK && strstr(err, "checksum")), "%d: %s", rc, err);
    else if (!strcmp(mode, "missing"))
      CHECK(rank == 1 ? rc == CKPTIO_E_INVALID_ARG : rc == CKPTIO_E_RANK && strstr(err, "rank 1"), "%d: %s", rc,
            err);
    else if (!strcmp(mode, "different"))
      CHECK(rc == CKPTIO_E_RANK && strstr(err, "opened another checkpoint"), "%d: %s", rc, err);
    for (size_t i = 0; i < n; i++) CHECK(q[i].verified == 0, "a box counts as loaded after a failure");
    /* Exactly one rank's own checksum error under fail-crc. */
    int own = rc == CKPTIO_E_CHECKSUM, owners = 0;
    MPI_Allreduce(&own, &owners, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (!strcmp(mode, "fail-crc")) CHECK(owners == 1, "%d ranks report the checksum as their own", owners);
    if (rank == 0) printf("%s: every rank failed (culprit %d): %s\n", mode, culprit, err);
  }
  for (size_t i = 0; i < n; i++) free(got[i]);
  ckptio_reader_close(r);
  ckptio_ctx_free(ctx);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  if (argc < 3) {
    fprintf(stderr, "usage: see the top of tests/dist/group_driver.c\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  char mode[64];
  const char *file = argv[2];
  snprintf(mode, sizeof(mode), "%s", argv[1]);
  size_t len = strlen(mode);
  if (len > 2 && !strcmp(mode + len - 2, "-x")) exchange = 1, mode[len - 2] = 0;
  if (len > 2 && !strcmp(mode + len - 2, "-w")) copies = 1, mode[len - 2] = 0;
  if (!strcmp(mode, "prepare") || !strcmp(mode, "prepare-other")) {
    salt = strcmp(mode, "prepare") != 0;
    if (rank == 0) prepare(file);
  } else {
    group_load(mode, file);
  }
  int all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("%s %s: %d ranks, %s\n", mode, file, nranks, all ? "FAILED" : "ok");
  MPI_Finalize();
  return failures ? 1 : 0;
}
