/* Multi-rank save and load throughput, run by bench/dist.sh under mpirun
 * next to fio's raw write and read with as many jobs as ranks.
 *
 *   dist_bench save DIR GIB [N [PAUSE]]  the ranks save GIB GiB of 8 row-split
 *                              tensors (durable), N times in one process (default 1):
 *                              the first into DIR, the later ones ("save-warm", the
 *                              process's pool, ring and pages already in use, as a
 *                              training loop's) into DIR.warm (each replacing the one
 *                              before), PAUSE seconds apart (default 0; a training
 *                              step: what a save leaves to do behind it, such as
 *                              faulting in the staging it skipped, gets that time)
 *   dist_bench load DIR        each rank loads its rows of every tensor (cache dropped first)
 *   dist_bench reshard DIR     each rank loads its columns: bytes read / bytes needed
 *   dist_bench raw-write DIR GIB   the limit: each rank writes its share to its own
 *                              file, O_DIRECT, 8 MiB blocks, 16 in flight, fdatasync
 *   dist_bench raw-read DIR    each rank reads its file back the same way (cache dropped)
 *
 * Every figure is timed the same way: barrier, work, barrier, on the wall clock.
 * Rank 0 prints one line: "<mode> ranks=N bytes=B seconds=S [read=R]". */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckptio.h"
#include "ckptio_mpi.h"

#define NTENSORS 8
#define COLS 4096

static int rank, nranks;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what, const char *msg) {
  fprintf(stderr, "rank %d: %s: %s\n", rank, what, msg);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Cold loads: the page cache holds none of the checkpoint. */
static void drop_cache(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    char p[4096];
    snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
    int fd = open(p, O_RDONLY);
    if (fd < 0) continue;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
  if (d) closedir(d);
}

/* ------------------------------------------------------------ raw limit */

#define RAW_BLOCK (8u << 20)
#define RAW_DEPTH 16

typedef struct raw {
  int fd, writing;
  unsigned char *buf;
  uint64_t n;
  atomic_uint_fast64_t next;
  atomic_int err;
} raw;

static void *raw_worker(void *arg) {
  raw *j = arg;
  for (;;) {
    uint64_t off = atomic_fetch_add(&j->next, RAW_BLOCK);
    if (off >= j->n) break;
    size_t len = (size_t)(j->n - off < RAW_BLOCK ? j->n - off : RAW_BLOCK);
    ssize_t r = j->writing ? pwrite(j->fd, j->buf + off, len, (off_t)off) : pread(j->fd, j->buf + off, len, (off_t)off);
    if (r != (ssize_t)len) atomic_store(&j->err, r < 0 ? errno : EIO);
  }
  return NULL;
}

/* Opens this rank's raw file and its buffer, outside the timing, as the
 * saves' buffers are filled before theirs. */
static int raw_open(raw *j, const char *dir, int writing, uint64_t n) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/raw-%05d", dir, rank);
  memset(j, 0, sizeof(*j));
  j->writing = writing, j->n = n;
  j->fd = open(path, (writing ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY) | O_DIRECT, 0644);
  if (j->fd < 0) return errno;
  if (!writing) posix_fadvise(j->fd, 0, 0, POSIX_FADV_DONTNEED);
  j->buf = aligned_alloc(4096, (size_t)n + 4096);
  memset(j->buf, rank + 1, (size_t)n);
  return 0;
}

/* The timed part: the share through RAW_DEPTH threads, O_DIRECT; writing
 * allocates the file first (as a save does its temp file) and ends with
 * fdatasync. */
static int raw_io(raw *j) {
  if (j->writing && fallocate(j->fd, 0, 0, (off_t)j->n) < 0 && ftruncate(j->fd, (off_t)j->n) < 0) return errno;
  pthread_t t[RAW_DEPTH];
  for (int i = 0; i < RAW_DEPTH; i++) pthread_create(&t[i], NULL, raw_worker, j);
  for (int i = 0; i < RAW_DEPTH; i++) pthread_join(t[i], NULL);
  if (j->writing && fdatasync(j->fd) < 0) atomic_store(&j->err, errno);
  close(j->fd);
  return atomic_load(&j->err);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  if (argc < 3) die("usage", "dist_bench save|load|reshard DIR [GIB]");
  const char *mode = argv[1], *dir = argv[2];
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  ckptio_ctx *ctx = NULL;
  if (ckptio_ctx_create(&o, &ctx) < 0) die("context", ckptio_last_open_error());
  double t0, secs = 0;
  uint64_t bytes = 0, read = 0;
  if (!strncmp(mode, "raw-", 4)) {
    int writing = !strcmp(mode, "raw-write");
    double gib = argc > 3 ? atof(argv[3]) : 1.0;
    uint64_t share = ((uint64_t)(gib * (double)(1ull << 30)) / (uint64_t)nranks) & ~(uint64_t)4095;
    if (!writing) {
      struct stat st;
      char path[4096];
      snprintf(path, sizeof(path), "%s/raw-%05d", dir, rank);
      share = stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
    }
    raw j;
    int e = raw_open(&j, dir, writing, share);
    if (e) die(mode, strerror(e));
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = now();
    if ((e = raw_io(&j))) die(mode, strerror(e));
    MPI_Barrier(MPI_COMM_WORLD);
    secs = now() - t0;
    free(j.buf);
    MPI_Allreduce(&share, &bytes, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  } else if (!strcmp(mode, "save")) {
    double gib = argc > 3 ? atof(argv[3]) : 1.0;
    int64_t rows = (int64_t)(gib * (double)(1ull << 30) / NTENSORS / COLS / 4);
    int64_t a, b;
    ckptio_split_rank(rows, rank, nranks, &a, &b);
    size_t part = (size_t)(b - a) * COLS * 4;
    unsigned char *buf = aligned_alloc(4096, part * NTENSORS + 4096);
    for (size_t i = 0; i < part * NTENSORS; i += 4096) buf[i] = (unsigned char)(i >> 12) ^ (unsigned char)rank;
    MPI_Comm world = MPI_COMM_WORLD;
    ckptio_comm comm;
    ckptio_comm_from_mpi(&world, &comm);
    int saves = argc > 4 ? atoi(argv[4]) : 1;
    double pause = argc > 5 ? atof(argv[5]) : 0;
    char warm[4096];
    snprintf(warm, sizeof(warm), "%s.warm", dir);
    if (rank == 0 && saves > 1) mkdir(warm, 0755);
    bytes = (uint64_t)rows * COLS * 4 * NTENSORS;
    for (int s = 0; s < saves; s++) {
      if (s && pause > 0) {
        struct timespec ts = {(time_t)pause, (long)((pause - (double)(time_t)pause) * 1e9)};
        nanosleep(&ts, NULL);
      }
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = now();
      ckptio_writer *w = NULL;
      if (ckptio_writer_open_ranks(ctx, &comm, s ? warm : dir, "model", NULL, &w) < 0)
        die("open", ckptio_last_open_error());
      for (int k = 0; k < NTENSORS; k++) {
        char name[32];
        snprintf(name, sizeof(name), "layers.%d.w", k);
        int64_t global[2] = {rows, COLS}, off[2] = {a, 0};
        ckptio_tensor t = {.name = name, .dtype = CKPTIO_F32, .ndim = 2, .shape = {b - a, COLS}, .data = buf + k * part};
        if (ckptio_writer_add_part(w, &t, global, off) < 0) die("add", ckptio_writer_last_error(w));
      }
      if (ckptio_writer_commit(w) < 0) die("commit", ckptio_writer_last_error(w));
      ckptio_writer_close(w);
      MPI_Barrier(MPI_COMM_WORLD);
      secs = now() - t0;
      if (rank == 0 && s + 1 < saves)
        printf("%s ranks=%d bytes=%llu seconds=%.4f read=0\n", s ? "save-warm" : "save", nranks,
               (unsigned long long)bytes, secs);
      if (s + 1 < saves) fflush(stdout);
    }
    if (saves > 1) mode = "save-warm";
    free(buf);
  } else {
    int columns = !strcmp(mode, "reshard");
    if (!columns && strcmp(mode, "load")) die("mode", mode);
    if (rank == 0) drop_cache(dir);
    ckptio_options lo = CKPTIO_OPTIONS_INIT;
    if (columns) lo.load_method = CKPTIO_LOAD_PREAD;
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = now();
    ckptio_reader *r = NULL;
    if (ckptio_reader_open(ctx, dir, &lo, &r) < 0) die("open", ckptio_last_open_error());
    size_t n = ckptio_reader_count(r);
    ckptio_box_request *q = calloc(n, sizeof(*q));
    uint64_t mine = 0;
    for (size_t i = 0; i < n; i++) {
      ckptio_tensor_info info;
      ckptio_reader_info(r, i, &info);
      int d = columns ? 1 : 0;
      q[i].index = i;
      q[i].stop[0] = info.shape[0], q[i].stop[1] = info.shape[1];
      ckptio_split_rank(info.shape[d], rank, nranks, &q[i].start[d], &q[i].stop[d]);
      q[i].dst_bytes = (uint64_t)ckptio_reader_box_nbytes(r, i, q[i].start, q[i].stop);
      q[i].dst = aligned_alloc(4096, q[i].dst_bytes + 4096);
      mine += q[i].dst_bytes;
    }
    if (ckptio_reader_load_boxes(r, q, n) < 0) die("load", ckptio_reader_last_error(r));
    uint64_t got = 0;
    for (size_t i = 0; i < n; i++) got += q[i].bytes_read, free(q[i].dst);
    ckptio_reader_close(r);
    MPI_Barrier(MPI_COMM_WORLD);
    secs = now() - t0;
    MPI_Allreduce(&mine, &bytes, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&got, &read, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    free(q);
  }
  if (rank == 0)
    printf("%s ranks=%d bytes=%llu seconds=%.4f read=%llu\n", mode, nranks, (unsigned long long)bytes, secs,
           (unsigned long long)read);
  ckptio_ctx_free(ctx);
  MPI_Finalize();
  return 0;
}
