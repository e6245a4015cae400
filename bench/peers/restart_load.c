/* The C reader's side of bench/peers/restart.py: opens a checkpoint (file,
 * set directory) with CKPTIO_LOAD_AUTO (or CKPTIO_LOAD_DIRECT with a second
 * argument "direct"), loads every tensor into fresh
 * memory (one anonymous mapping in transparent huge pages), touches every
 * byte, and prints "seconds bytes methods" (methods: the stats' ways of
 * reading, e.g. "pread" or "direct"). The clock covers the context, the
 * open, the load and the touch, as a process that restarts pays them.
 * A second argument "pread" or "mmap" asks for that method instead;
 * "private" maps the file instead of loading it (ckptio_reader_map_private,
 * every CRC checked) and touches the tensors where they lie in the map. */
#define CKPTIO_EXPERIMENTAL
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "ckptio.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc < 2 || argc > 3) {
    fprintf(stderr, "usage: restart_load PATH [direct|pread|mmap|private]\n");
    return 2;
  }
  double t0 = now();
  ckptio_ctx *ctx = NULL;
  ckptio_reader *r = NULL;
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  if (argc == 3)
    o.load_method = !strcmp(argv[2], "mmap")      ? CKPTIO_LOAD_MMAP
                    : !strcmp(argv[2], "pread")   ? CKPTIO_LOAD_PREAD
                    : !strcmp(argv[2], "private") ? CKPTIO_LOAD_AUTO
                                                  : CKPTIO_LOAD_DIRECT;
  if (ckptio_ctx_create(NULL, &ctx) < 0 || ckptio_reader_open(ctx, argv[1], &o, &r) < 0) {
    fprintf(stderr, "%s\n", ckptio_last_open_error());
    return 1;
  }
  size_t n = ckptio_reader_count(r);
  uint64_t total = 0, off = 0;
  ckptio_load_request *q = calloc(n, sizeof(*q));
  for (size_t i = 0; i < n; i++) {
    ckptio_tensor_info in;
    ckptio_reader_info(r, i, &in);
    q[i] = (ckptio_load_request){i, NULL, in.nbytes, CKPTIO_DEVICE_HOST};
    total += (in.nbytes + 4095) & ~4095ull;
  }
  void *map = NULL;
  uint64_t map_size = 0;
  if (argc == 3 && !strcmp(argv[2], "private")) {
    if (ckptio_reader_map_private(r, &map, &map_size) < 0) {
      fprintf(stderr, "%s\n", ckptio_reader_last_error(r));
      return 1;
    }
    for (size_t i = 0; i < n; i++) {
      ckptio_tensor_info in;
      ckptio_reader_info(r, i, &in);
      q[i].dst = (unsigned char *)map + in.offset;
    }
  } else {
    unsigned char *buf = mmap(NULL, total ? total : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    madvise(buf, total, MADV_HUGEPAGE);
    for (size_t i = 0; i < n; i++) {
      q[i].dst = buf + off;
      off += (q[i].dst_bytes + 4095) & ~4095ull;
    }
    if (ckptio_reader_load_many(r, q, n) < 0) {
      fprintf(stderr, "%s\n", ckptio_reader_last_error(r));
      return 1;
    }
  }
  uint64_t sum = 0, bytes = 0;
  for (size_t i = 0; i < n; i++) {
    const uint64_t *w = q[i].dst;
    for (uint64_t k = 0; k < q[i].dst_bytes / 8; k++) sum += w[k];
    bytes += q[i].dst_bytes;
  }
  double secs = now() - t0;
  ckptio_stats st = CKPTIO_STATS_INIT;
  ckptio_reader_stats(r, &st);
  const char *names[] = {"auto", "pread", "mmap", "direct"};
  char methods[64] = "";
  for (int m = 1; m < 4; m++)
    if (st.load_methods >> m & 1) snprintf(methods + strlen(methods), sizeof(methods) - strlen(methods), "%s%s", *methods ? "+" : "", names[m]);
  printf("%.6f %llu %s\n", secs, (unsigned long long)bytes, *methods ? methods : "none");
  fprintf(stderr, "checksum %llu\n", (unsigned long long)sum);
  if (map) ckptio_map_free(map, map_size);
  ckptio_reader_close(r);
  ckptio_ctx_free(ctx);
  return 0;
}
