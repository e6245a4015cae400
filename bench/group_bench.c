/* Group loads over MPI, timed (bench/group/group_bench.py runs it under
 * mpirun): every rank loads every tensor of PATH whole, alone (each rank
 * reads the whole file: ckptio_reader_load_boxes) or as a group (each
 * stored byte read once per group: ckptio_reader_load_boxes_group).
 *
 *   group_bench PATH alone|group|group-x [STAGING_BYTES]
 *
 * group-x passes CKPTIO_GROUP_EXCHANGE (ranks on this machine exchange
 * bytes instead of sharing the page cache).
 *
 * The time is barrier, open and load, barrier: until every rank holds the
 * model. Rank 0 prints one JSON line: mode, ranks, seconds, the bytes every
 * rank read from storage summed (/proc/self/io read_bytes: local files),
 * the largest peak RSS of a rank (KiB), and the bytes each rank received. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#define CKPTIO_EXPERIMENTAL
#include "ckptio.h"
#include "ckptio_mpi.h"

static uint64_t read_bytes(void) {
  FILE *f = fopen("/proc/self/io", "r");
  char line[128];
  unsigned long long v = 0;
  while (f && fgets(line, sizeof(line), f))
    if (sscanf(line, "read_bytes: %llu", &v) == 1) break;
  if (f) fclose(f);
  return v;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  if (argc < 3 || (strcmp(argv[2], "alone") && strcmp(argv[2], "group") && strcmp(argv[2], "group-x"))) {
    if (rank == 0) fprintf(stderr, "usage: group_bench PATH alone|group|group-x [STAGING_BYTES]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const char *path = argv[1];
  int group = strcmp(argv[2], "alone") != 0;
  unsigned flags = strcmp(argv[2], "group-x") ? 0 : CKPTIO_GROUP_EXCHANGE;
  uint64_t staging = argc > 3 ? strtoull(argv[3], NULL, 10) : 0;
  MPI_Comm world = MPI_COMM_WORLD;
  ckptio_comm comm;
  ckptio_comm_from_mpi(&world, &comm);
  ckptio_ctx *ctx = NULL;
  ckptio_reader *r = NULL;
  if (ckptio_ctx_create(NULL, &ctx) < 0) {
    fprintf(stderr, "rank %d: %s\n", rank, ckptio_last_open_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  uint64_t before = read_bytes();
  double t0 = MPI_Wtime();
  int rc = ckptio_reader_open(ctx, path, NULL, &r);
  if (rc < 0) {
    fprintf(stderr, "rank %d: open %s: %s\n", rank, path, ckptio_last_open_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  size_t n = ckptio_reader_count(r);
  ckptio_box_request *q = calloc(n + 1, sizeof(*q));
  uint64_t held = 0;
  for (size_t i = 0; i < n; i++) {
    ckptio_tensor_info info;
    ckptio_reader_info(r, i, &info);
    q[i].index = i;
    for (int d = 0; d < info.ndim; d++) q[i].stop[d] = info.shape[d];
    q[i].dst = malloc(info.nbytes + 1);
    q[i].dst_bytes = info.nbytes;
    held += info.nbytes;
  }
  rc = group ? ckptio_reader_load_boxes_group(r, &comm, q, n, staging, flags) : ckptio_reader_load_boxes(r, q, n);
  if (rc < 0) {
    fprintf(stderr, "rank %d: %s load: %s\n", rank, argv[2], ckptio_reader_last_error(r));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  double secs = MPI_Wtime() - t0;
  uint64_t mine = read_bytes() - before, all = 0;
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  long rss = ru.ru_maxrss, most = 0;
  MPI_Reduce(&mine, &all, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Reduce(&rss, &most, 1, MPI_LONG, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0)
    printf("{\"mode\": \"%s\", \"ranks\": %d, \"seconds\": %.4f, \"read_bytes\": %llu, \"maxrss_kib\": %ld, "
           "\"bytes_per_rank\": %llu}\n",
           argv[2], nranks, secs, (unsigned long long)all, most, (unsigned long long)held);
  for (size_t i = 0; i < n; i++) free(q[i].dst);
  free(q);
  ckptio_reader_close(r);
  ckptio_ctx_free(ctx);
  MPI_Finalize();
  return 0;
}
