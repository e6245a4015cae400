/* Tiered checkpoints timed over real MPI processes (bench/tiers.sh runs it):
 * every rank its own node (ranks_per_node 1), one peer copy, memory
 * directories $TIERS_SHM/node<r>/shm (a tmpfs; WORK when unset), durable
 * WORK/durable. Times are the slowest
 * rank's, after a barrier.
 *
 *   tiers_bench WORK MIB save ROUNDS   per round: a snapshot copy of the part
 *                                      into touched memory, by memcpy and by
 *                                      streaming stores as ckptio copies (x86-64
 *                                      SSE2; memcpy elsewhere), a save to
 *                                      memory + peers, the same in background
 *                                      mode (its stall, and the time until its
 *                                      finish), a durable-only save, and
 *                                      the part's bytes written into a new file
 *                                      beside the memory tier (its ceiling)
 *   tiers_bench WORK MIB restore STEP NAME   a restore (+ loading every tensor
 *                                      into memory), reported under NAME, with
 *                                      the bytes per tier; durable parts are
 *                                      dropped from the page cache first; a
 *                                      NAME ending in "-load": one pass,
 *                                      ckptio_tiers_restore_load into the memory
 *   tiers_bench WORK MIB storage BUCKET a save to memory and s3://BUCKET/tiers-
 *                                      bench-storage (the storage tier), every
 *                                      memory directory wiped, then a restore
 *                                      from the storage tier (+ the load)
 *   tiers_bench WORK MIB s3 BUCKET     the reference: each rank's part saved to
 *                                      s3://BUCKET, then loaded back whole (run
 *                                      under tests/s3/weed_server.py)
 * TIERS_THREADS=N gives each rank's context N workers (ckptio_options.threads). */
#define CKPTIO_EXPERIMENTAL
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckptio.h"
#include "ckptio_mpi.h"

static int rank, nranks;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The slowest rank's seconds for what `t0` started, after the barrier that began it. */
static double slowest(double t0) {
  double mine = now() - t0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD); /* not ckptio's communicator */
  return all;
}

static ckptio_tiers *open_tiers(ckptio_ctx *ctx, ckptio_comm *comm, const char *shm, const char *work, int memory,
                               int durable, int background) {
  static char mem[4096], dur[4096], node[4096];
  snprintf(node, sizeof(node), "%s/node%d", shm, rank);
  mkdir(node, 0777);
  snprintf(mem, sizeof(mem), "%s/shm", node);
  snprintf(dur, sizeof(dur), "%s/durable", work);
  ckptio_tiers_options o = CKPTIO_TIERS_OPTIONS_INIT;
  o.memory_dir = memory ? mem : NULL;
  o.memory_keep = 1;
  o.peers = memory && nranks > 1 ? 1 : 0;
  o.durable_dir = durable ? dur : NULL;
  o.durable_keep = 1;
  o.background = background;
  ckptio_tiers *t = NULL;
  if (ckptio_tiers_open(ctx, comm, &o, &t) != 0) {
    fprintf(stderr, "rank %d: %s\n", rank, ckptio_last_open_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return t;
}

#if defined(__x86_64__)
#include <emmintrin.h>
/* The copy a save makes of host tensors (ckptio's src/core/stream_copy.c
 * does the same): streaming 16-byte stores, which skip reading the
 * destination into the cache (malloc gives the 16-byte alignment they need). */
static void stream_copy(void *dst, const void *src, size_t n) {
  for (size_t i = 0; i + 64 <= n; i += 64)
    for (size_t k = 0; k < 64; k += 16)
      _mm_stream_si128((__m128i *)((char *)dst + i + k), _mm_loadu_si128((const __m128i *)((const char *)src + i + k)));
  _mm_sfence();
  memcpy((char *)dst + (n & ~(size_t)63), (const char *)src + (n & ~(size_t)63), n & 63);
}
#else
static void stream_copy(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
#endif

/* The ceiling of one memory copy: the part's bytes written into a new
 * file beside the memory tier's (8 MiB pwrites), then removed. */
static void raw_write(const char *shm, const void *data, size_t bytes) {
  char path[4200];
  snprintf(path, sizeof(path), "%s/node%d/raw.bin", shm, rank);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (size_t off = 0; fd >= 0 && off < bytes; off += 8 << 20)
    if (pwrite(fd, (const char *)data + off, bytes - off < (8u << 20) ? bytes - off : 8u << 20, (off_t)off) < 0) break;
  if (fd >= 0) close(fd);
  unlink(path);
}

/* Removes this rank's node directory (its memory tier): a machine lost. */
static void wipe_node(const char *shm) {
  char cmd[4300];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s/node%d'", shm, rank);
  if (system(cmd) != 0) fprintf(stderr, "rank %d: %s failed\n", rank, cmd);
}

static void must(int rc, ckptio_tiers *t, const char *what) {
  if (rc == 0) return;
  fprintf(stderr, "rank %d: %s: %s\n", rank, what, ckptio_tiers_last_error(t));
  MPI_Abort(MPI_COMM_WORLD, 1);
}

int main(int argc, char **argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided); /* background saves */
  MPI_Comm world;
  MPI_Comm_dup(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &nranks);
  if (argc < 5 || (!strcmp(argv[3], "restore") && argc < 6)) {
    fprintf(stderr, "usage: tiers_bench WORK MIB save ROUNDS | restore STEP NAME | s3 BUCKET\n");
    return 2;
  }
  const char *work = argv[1], *shm = getenv("TIERS_SHM");
  if (!shm) shm = work;
  size_t bytes = (size_t)strtoull(argv[2], NULL, 10) << 20, n = bytes / 4;
  ckptio_ctx *ctx = NULL;
  ckptio_comm comm;
  /* Snapshot memory for a whole part: a background save returns after one copy. */
  ckptio_options co = CKPTIO_OPTIONS_INIT;
  co.snapshot_bytes = bytes + (64u << 20);
  if (getenv("TIERS_THREADS")) co.threads = atoi(getenv("TIERS_THREADS")); /* workers per rank; 0: the default */
  if (ckptio_ctx_create(&co, &ctx) != 0 || ckptio_comm_from_mpi(&world, &comm) != 0) MPI_Abort(world, 1);
  if (!strcmp(argv[3], "save")) {
    float *w = malloc(bytes), *copy = malloc(bytes);
    for (size_t i = 0; i < n; i++) w[i] = (float)(i % 1000 + rank);
    memset(copy, 1, bytes);
    ckptio_tensor tensor = {"w", CKPTIO_F32, 1, {(int64_t)n}, w, CKPTIO_DEVICE_HOST};
    ckptio_tiers *sync = open_tiers(ctx, &comm, shm, work, 1, 0, 0), *bg = open_tiers(ctx, &comm, shm, work, 1, 0, 1),
                 *disk = open_tiers(ctx, &comm, shm, work, 0, 1, 0);
    int rounds = atoi(argv[4]);
    for (int r = 1; r <= rounds; r++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = now();
      memcpy(copy, w, bytes);
      double c = slowest(t0);
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = now();
      stream_copy(copy, w, bytes);
      double cs = slowest(t0);
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = now();
      must(ckptio_tiers_save(sync, (uint64_t)r, &tensor, 1), sync, "save to memory + peers");
      double f = slowest(t0);
      /* The background save of the next step: the stall, then its finish. */
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = now();
      must(ckptio_tiers_save(bg, (uint64_t)(rounds + r), &tensor, 1), bg, "background save");
      double stall = slowest(t0);
      must(ckptio_tiers_wait(bg), bg, "background finish");
      double finished = slowest(t0);
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = now();
      must(ckptio_tiers_save(disk, (uint64_t)r, &tensor, 1), disk, "durable save");
      double d = slowest(t0);
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = now();
      raw_write(shm, w, bytes);
      double m = slowest(t0);
      if (rank == 0)
        printf("RESULT {\"round\": %d, \"copy\": %.4f, \"copy_stream\": %.4f, \"memory_peers\": %.4f, \"background_stall\": %.4f, "
               "\"background_finish\": %.4f, \"durable\": %.4f, \"raw_shm_write\": %.4f}\n", r, c, cs, f, stall,
               finished, d, m);
    }
    ckptio_tiers_close(bg);
    ckptio_tiers_close(sync);
    ckptio_tiers_close(disk);
    free(w);
    free(copy);
  } else if (!strcmp(argv[3], "s3")) {
    /* The reference a tier restore is held against: this rank's part of the
     * same size saved to object storage, then loaded whole from there by
     * a fresh reader (its own GETs), every byte into memory. */
    char url[4200];
    snprintf(url, sizeof(url), "s3://%s/tiers-bench/rank-%05d.safetensors", argv[4], rank);
    float *w = malloc(bytes);
    for (size_t i = 0; i < n; i++) w[i] = (float)(i % 1000 + rank);
    ckptio_tensor tensor = {"w", CKPTIO_F32, 1, {(int64_t)n}, w, CKPTIO_DEVICE_HOST};
    ckptio_writer *wr = NULL;
    if (ckptio_writer_open(ctx, url, CKPTIO_FORMAT_SAFETENSORS, NULL, &wr) != 0 || ckptio_writer_add(wr, &tensor) != 0 ||
        ckptio_writer_commit(wr) != 0) {
      fprintf(stderr, "rank %d: save to %s: %s\n", rank, url, wr ? ckptio_writer_last_error(wr) : ckptio_last_open_error());
      MPI_Abort(world, 1);
    }
    ckptio_writer_close(wr);
    memset(w, 0, bytes);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now();
    ckptio_reader *r = NULL;
    if (ckptio_reader_open(ctx, url, NULL, &r) != 0 || ckptio_reader_load(r, 0, w, bytes) != 0) {
      fprintf(stderr, "rank %d: load of %s: %s\n", rank, url, r ? ckptio_reader_last_error(r) : ckptio_last_open_error());
      MPI_Abort(world, 1);
    }
    ckptio_reader_close(r);
    double s = slowest(t0);
    if (rank == 0) printf("RESULT {\"restore\": \"s3\", \"seconds\": %.4f}\n", s);
    free(w);
  } else if (!strcmp(argv[3], "storage")) {
    /* The storage tier: a save to memory and the storage (uploaded from the
     * memory part), every machine's memory lost, the restore from storage
     * (each part downloaded into its memory directory, checked there) and
     * the load: what a job that lost every machine pays. */
    char prefix[4200];
    snprintf(prefix, sizeof(prefix), "s3://%s/tiers-bench-storage", argv[4]);
    char mem[4200];
    snprintf(mem, sizeof(mem), "%s/node%d", shm, rank);
    mkdir(mem, 0777);
    strcat(mem, "/shm");
    ckptio_tiers_options o = CKPTIO_TIERS_OPTIONS_INIT;
    o.memory_dir = mem;
    o.memory_keep = 1;
    o.storage_dir = prefix;
    o.storage_keep = 1;
    ckptio_tiers *t = NULL;
    if (ckptio_tiers_open(ctx, &comm, &o, &t) != 0) {
      fprintf(stderr, "rank %d: %s\n", rank, ckptio_last_open_error());
      MPI_Abort(world, 1);
    }
    float *w = malloc(bytes);
    for (size_t i = 0; i < n; i++) w[i] = (float)(i % 1000 + rank);
    ckptio_tensor tensor = {"w", CKPTIO_F32, 1, {(int64_t)n}, w, CKPTIO_DEVICE_HOST};
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now();
    must(ckptio_tiers_save(t, 1, &tensor, 1), t, "save");
    double saved = slowest(t0);
    wipe_node(shm);
    memset(w, 1, bytes);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = now();
    uint64_t step = 0;
    ckptio_tiers_dest d = {"w", w, bytes, CKPTIO_DEVICE_HOST};
    must(ckptio_tiers_restore_load(t, &step, &d, 1), t, "restore_load");
    double s = slowest(t0);
    ckptio_tiers_stats st = CKPTIO_TIERS_STATS_INIT;
    ckptio_tiers_stats_get(t, &st);
    if (rank == 0)
      printf("RESULT {\"restore\": \"storage-load\", \"seconds\": %.4f, \"save_memory_and_storage\": %.4f, "
             "\"storage_bytes_rank0\": %llu}\n", s, saved, (unsigned long long)st.restored_bytes[CKPTIO_TIER_STORAGE]);
    ckptio_tiers_close(t);
    free(w);
  } else {
    ckptio_tiers *t = open_tiers(ctx, &comm, shm, work, 1, 1, 0);
    char dur[4200];
    snprintf(dur, sizeof(dur), "%s/durable/step-%08llu/rank-%05d.safetensors", work,
             strtoull(argv[4], NULL, 10), rank);
    int fd = open(dur, O_RDONLY);
    if (fd >= 0) {
      fdatasync(fd);
      posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      close(fd);
    }
    float *w = malloc(bytes);
    memset(w, 1, bytes); /* the model's memory exists: a restore fills it (as the S3 reference does) */
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now();
    uint64_t step = 0;
    char path[4096];
    size_t nl = strlen(argv[5]);
    double found, s;
    if (nl > 5 && !strcmp(argv[5] + nl - 5, "-load")) { /* one pass: loaded as each CRC is checked */
      ckptio_tiers_dest d = {"w", w, bytes, CKPTIO_DEVICE_HOST};
      must(ckptio_tiers_restore_load(t, &step, &d, 1), t, "restore_load");
      found = s = slowest(t0);
    } else {
      must(ckptio_tiers_restore(t, &step, path, sizeof(path)), t, "restore");
      found = slowest(t0);
      /* Every CRC of the part was checked by the restore: loaded without a
       * second check, as docs/TIERS.md advises. */
      ckptio_options lo = CKPTIO_OPTIONS_INIT;
      ckptio_ctx_options(ctx, &lo);
      lo.crc = 0;
      ckptio_reader *r = NULL;
      if (ckptio_reader_open(ctx, path, &lo, &r) != 0 || ckptio_reader_load(r, 0, w, bytes) != 0) MPI_Abort(world, 1);
      ckptio_reader_close(r);
      s = slowest(t0);
    }
    ckptio_tiers_stats st = CKPTIO_TIERS_STATS_INIT;
    ckptio_tiers_stats_get(t, &st);
    unsigned long long per[3], sum[3];
    for (int k = 0; k < 3; k++) per[k] = st.restored_bytes[k];
    MPI_Reduce(per, sum, 3, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, world);
    if (rank == 0)
      printf("RESULT {\"restore\": \"%s\", \"step\": %llu, \"seconds\": %.4f, \"verified_part\": %.4f, "
             "\"memory_bytes\": %llu, \"peer_bytes\": %llu, \"durable_bytes\": %llu}\n", argv[5],
             (unsigned long long)step, s, found, sum[0], sum[1], sum[2]);
    ckptio_tiers_close(t);
    free(w);
  }
  ckptio_ctx_free(ctx);
  MPI_Comm_free(&world);
  MPI_Finalize();
  return 0;
}
