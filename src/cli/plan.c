/*
 * `ckptio inspect FILE --plan NAME:DIM:N`: what each of N tensor-parallel
 * ranks reads of one tensor split on DIM (torch.chunk's rule): its range of
 * the dim, the slice's bytes, and the file byte ranges behind it, from
 * ckptio_reader_plan_rank. Only the header is read.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

/* NAME:DIM:N, split at the last two colons (names may hold colons). */
static int parse_spec(const char *spec, char **name, int *dim, int *nranks) {
  const char *c2 = strrchr(spec, ':');
  if (!c2 || c2 == spec) return -1;
  const char *c1 = c2 - 1;
  while (c1 > spec && *c1 != ':') c1--;
  if (c1 == spec) return -1; /* no second colon, or an empty name */
  char *end;
  errno = 0;
  long d = strtol(c1 + 1, &end, 10);
  if (errno || end != c2 || c1 + 1 == c2 || d < 0 || d >= CKPTIO_MAX_DIMS) return -1;
  long n = strtol(c2 + 1, &end, 10);
  if (errno || *end || !c2[1] || n < 1 || n > 1 << 20) return -1;
  if (!(*name = strndup(spec, (size_t)(c1 - spec)))) return -1;
  *dim = (int)d;
  *nranks = (int)n;
  return 0;
}

static void print_shape(const ckptio_tensor_info *t, int dim, int64_t len) {
  printf("[");
  for (int d = 0; d < t->ndim; d++) printf("%s%" PRId64, d ? ", " : "", d == dim ? len : t->shape[d]);
  printf("]");
}

int cli_inspect_plan(ckptio_reader *r, const char *spec, int json) {
  char *name = NULL;
  int dim, nranks, ret = CLI_EXIT_USAGE;
  ckptio_byte_range *ranges = NULL;
  if (parse_spec(spec, &name, &dim, &nranks) < 0) {
    fprintf(stderr, "ckptio inspect: --plan wants NAME:DIM:N (DIM 0-%d, N >= 1), got '%s'\n",
            CKPTIO_MAX_DIMS - 1, spec);
    goto fail;
  }
  int64_t idx = ckptio_reader_find(r, name);
  ckptio_tensor_info t;
  if (idx < 0 || ckptio_reader_info(r, (size_t)idx, &t) < 0) {
    fprintf(stderr, "ckptio inspect: no tensor named '%s'\n", name);
    goto fail;
  }
  /* The dim and the dtype's byte boundaries, checked before any output. */
  int64_t a0, b0, rc0 = ckptio_reader_plan_rank(r, (size_t)idx, dim, 0, nranks, &a0, &b0, NULL, 0);
  if (rc0 < 0) {
    fprintf(stderr, "ckptio inspect: --plan %s: %s: %s\n", spec, ckptio_strerror((int)rc0),
            ckptio_reader_last_error(r));
    ret = rc0 == CKPTIO_E_MISALIGNED ? CLI_EXIT_INVALID : CLI_EXIT_USAGE;
    goto fail;
  }
  if (json) {
    printf("{\"tensor\":");
    cli_json_string(stdout, name);
    printf(",\"dtype\":\"%s\",\"dim\":%d,\"nranks\":%d,\"rule\":\"torch.chunk\",\"ranks\":[",
           ckptio_dtype_name(t.dtype), dim, nranks);
  } else {
    printf("tensor  %s  %s ", name, ckptio_dtype_name(t.dtype));
    print_shape(&t, -1, 0);
    printf("\nplan    dim %d into %d ranks (torch.chunk: chunks of ceil(size / N), the last ranks "
           "get less)\n\n%-5s  %-21s  %-26s  %-7s  %s\n",
           dim, nranks, "rank", "start:stop", "bytes", "ranges", "file span");
  }
  for (int rank = 0; rank < nranks; rank++) {
    int64_t a, b;
    int64_t n = ckptio_reader_plan_rank(r, (size_t)idx, dim, rank, nranks, &a, &b, NULL, 0);
    int64_t nbytes = n < 0 ? n : ckptio_reader_slice_nbytes(r, (size_t)idx, dim, a, b);
    if (n < 0 || nbytes < 0) {
      if (json) printf("]}\n");
      fprintf(stderr, "ckptio inspect: --plan %s: %s: %s\n", spec, ckptio_strerror((int)(n < 0 ? n : nbytes)),
              ckptio_reader_last_error(r));
      ret = (n < 0 ? n : nbytes) == CKPTIO_E_MISALIGNED ? CLI_EXIT_INVALID : CLI_EXIT_USAGE;
      goto fail;
    }
    free(ranges);
    if (!(ranges = calloc((size_t)n + 1, sizeof(*ranges)))) {
      fprintf(stderr, "ckptio inspect: out of memory for %" PRId64 " ranges\n", n);
      goto fail;
    }
    ckptio_reader_plan_rank(r, (size_t)idx, dim, rank, nranks, NULL, NULL, ranges, (size_t)n);
    if (json) {
      printf("%s{\"rank\":%d,\"start\":%" PRId64 ",\"stop\":%" PRId64 ",\"nbytes\":%" PRId64 ",\"ranges\":[",
             rank ? "," : "", rank, a, b, nbytes);
      for (int64_t k = 0; k < n; k++)
        printf("%s[%" PRIu32 ",%" PRIu64 ",%" PRIu64 "]", k ? "," : "", ranges[k].file, ranges[k].offset,
               ranges[k].length);
      printf("]}");
    } else {
      char range[48], hb[32], bytes[64], span[64] = "-";
      snprintf(range, sizeof(range), "%" PRId64 ":%" PRId64, a, b);
      if (n)
        snprintf(span, sizeof(span), "%" PRIu64 "..%" PRIu64, ranges[0].offset,
                 ranges[n - 1].offset + ranges[n - 1].length);
      snprintf(bytes, sizeof(bytes), "%" PRId64 " (%s)", nbytes, cli_fmt_bytes((uint64_t)nbytes, hb, sizeof(hb)));
      printf("%-5d  %-21s  %-26s  %-7" PRId64 "  %s\n", rank, range, bytes, n, span);
    }
  }
  if (json) printf("]}\n");
  ret = fflush(stdout) == 0 ? CLI_EXIT_OK : CLI_EXIT_USAGE;
fail:
  free(ranges);
  free(name);
  return ret;
}
