/*
 * `ckptio verify FILE`: the header is validated when the reader opens, then
 * every recorded CRC32 is checked against the data. The verdict goes to
 * stdout as one line ("OK ..." or "FAILED ..."), as sha256sum -c does.
 */
#include <inttypes.h>
#include <string.h>

#include "cli/cli.h"

void cli_verify_usage(FILE *out) {
  fprintf(out,
          "usage: ckptio verify FILE|INDEX|DIR\n\n"
          "Validates the header (offsets, sizes, dtypes, coverage of the data) and\n"
          "checks the CRC32 of every tensor that has one recorded. Prints OK with\n"
          "the counts of checked and unchecked tensors, the bytes read and GB/s, or\n"
          "FAILED with the rule or tensor that failed. A sharded checkpoint (its\n"
          "*.safetensors.index.json or its directory) is checked as one: the index\n"
          "against every shard, then every shard's CRCs; a line per shard follows OK.\n\n"
          "exit codes: 0 ok; 1 invalid or corrupt file; 2 usage or I/O error\n");
}

/* The library's detail already names the file, the tensor and the rule. */
static void print_failure(const char *path, int rc, const char *detail) {
  if (*detail)
    printf("FAILED %s\n", detail);
  else
    printf("FAILED %s: %s\n", path, ckptio_strerror(rc));
}

int cli_verify_main(int argc, char **argv) {
  const char *path;
  int npaths;
  if (cli_args(argc, argv, "verify", cli_verify_usage, NULL, NULL, "FILE", &path, 1, &npaths)) return CLI_EXIT_USAGE;

  int ret = CLI_EXIT_USAGE;
  ckptio_ctx *ctx = NULL;
  ckptio_reader *r = NULL;
  ckptio_options o;
  cli_verify_options(&o);
  int rc = ckptio_ctx_create(&o, &ctx);
  if (rc < 0) {
    fprintf(stderr, "ckptio verify: %s\n", cli_open_error(rc));
    goto fail;
  }
  if ((rc = ckptio_reader_open(ctx, path, NULL, &r)) < 0) {
    print_failure(path, rc, cli_open_error(rc));
    ret = cli_exit_for_read_error(rc);
    goto fail;
  }
  size_t n = ckptio_reader_count(r), with_crc = 0;
  uint64_t checked_bytes = 0;
  for (size_t i = 0; i < n; i++) {
    ckptio_tensor_info t;
    if (ckptio_reader_info(r, i, &t) < 0) continue;
    /* A split tensor's parts carry the CRCs (the reader checks them all). */
    if (t.has_crc || ckptio_reader_part_count(r, i) > 1) {
      with_crc++;
      checked_bytes += t.nbytes;
    }
  }

  cli_progress bar;
  size_t unchecked = 0;
  cli_progress_start(&bar, "verify", cli_progress_reader, r);
  double t0 = cli_now();
  rc = ckptio_reader_verify(r, &unchecked);
  double secs = cli_now() - t0;
  cli_progress_stop(&bar);
  if (rc < 0) {
    print_failure(path, rc, ckptio_reader_last_error(r));
    ret = cli_exit_for_read_error(rc);
    goto fail;
  }

  char hb[32];
  printf("OK %s: %zu tensors, %zu checked, %zu unchecked; %" PRIu64 " bytes (%s) checked in "
         "%.3f s, %.2f GB/s\n",
         path, n, n - unchecked, unchecked, checked_bytes,
         cli_fmt_bytes(checked_bytes, hb, sizeof(hb)), secs,
         secs > 0 ? (double)checked_bytes / secs / 1e9 : 0.0);
  int dcp = !strcmp(ckptio_reader_format(r), "dcp");
  for (size_t k = 0; k < cli_files_of(r); k++) {
    const char *p;
    size_t nt;
    uint64_t b;
    ckptio_reader_shard(r, k, &p, &nt, &b);
    printf("  %s %zu/%zu %s: %zu %s, %" PRIu64 " bytes (%s)\n", dcp ? "file" : "shard", k + 1, cli_files_of(r), p,
           nt, dcp ? "chunks and byte items" : "tensors", b, cli_fmt_bytes(b, hb, sizeof(hb)));
  }
  if (dcp)
    printf("note: torch.distributed.checkpoint records no checksums in its .metadata; each tensor chunk was checked "
           "against the CRC-32 of its torch.save archive's zip record, byte items (%zu unchecked) for their "
           "place only\n", unchecked);
  if (n && unchecked == n && !dcp)
    printf("note: no CRC32 is recorded in this file; only its structure was checked\n");
  if (with_crc != n - unchecked)
    fprintf(stderr, "ckptio verify: warning: %zu tensors record a CRC32 but %zu were checked\n",
            with_crc, n - unchecked);
  ret = CLI_EXIT_OK;
fail:
  ckptio_reader_close(r);
  ckptio_ctx_free(ctx);
  return ret;
}
