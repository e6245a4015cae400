/*
 * `ckptio tiers DIR...`: what tier directories of tiered checkpoints hold
 * (ckptio_tiers_* in ckptio.h): for each step, each rank's part and each
 * copy kept for another rank, its size, whether the step is published for
 * it, and with --verify whether its every CRC32 checks. A node's memory
 * directory shows what that machine holds; the durable directory and the
 * storage's prefix (s3://bucket/job) what the job keeps. Reads only; changes nothing.
 */
#define CKPTIO_EXPERIMENTAL
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

void cli_tiers_usage(FILE *out) {
  fprintf(out,
          "usage: ckptio tiers DIR... [--verify] [--json]\n\n"
          "Lists the tier directories of tiered checkpoints (a node's memory directory,\n"
          "the durable directory, the storage's prefix s3://bucket/job): per step, each\n"
          "rank's part (rank-R) and each copy kept for another rank (copy-R), its size,\n"
          "and its state: \"published\" (the step is marked for it: every rank's part was\n"
          "there, agreed by all ranks), \"unpublished\" (a save in progress or\n"
          "interrupted), and with --verify \"verified\" or CORRUPT.\n"
          "Nothing is changed.\n\n"
          "  --verify  read every file whole and check its CRC32s\n"
          "  --json    one JSON object: {\"dirs\": [{\"dir\", \"files\": [...]}]}\n\n"
          "exit codes: 0 every published file checks; 1 some do not; 2 usage or I/O error\n");
}

/* "" when the file checks, else why not. */
static void check_file(ckptio_ctx *ctx, const char *path, char *why, size_t len) {
  ckptio_reader *r = NULL;
  size_t unchecked = 0;
  why[0] = '\0';
  int rc = ckptio_reader_open(ctx, path, NULL, &r);
  if (rc < 0) {
    snprintf(why, len, "%s", ckptio_last_open_error());
    return;
  }
  if ((rc = ckptio_reader_verify(r, &unchecked)) < 0)
    snprintf(why, len, "%s", ckptio_reader_last_error(r));
  else if (unchecked)
    snprintf(why, len, "%zu tensors without a CRC32", unchecked);
  ckptio_reader_close(r);
}

static int list_dir(ckptio_ctx *ctx, const char *dir, int verify, int json, int first) {
  ckptio_tiers_file *f = NULL;
  int64_t n = ckptio_tiers_list(ctx, dir, &f);
  if (n < 0) {
    fprintf(stderr, "ckptio tiers: %s: %s\n", dir, ckptio_strerror((int)n));
    return CLI_EXIT_USAGE;
  }
  int ret = CLI_EXIT_OK;
  if (json) {
    printf("%s{\"dir\": ", first ? "" : ", ");
    cli_json_string(stdout, dir);
    printf(", \"files\": [");
  } else {
    printf("%s%s\n%-10s %-5s %6s %12s  %-12s %s\n", first ? "" : "\n", dir, "STEP", "KIND", "RANK", "SIZE", "STATE",
           "FILE / REASON");
  }
  for (int64_t i = 0; i < n; i++) {
    char why[512] = "", size[32];
    if (verify) check_file(ctx, f[i].path, why, sizeof(why));
    if (why[0] && f[i].published) ret = CLI_EXIT_INVALID;
    const char *state = why[0] ? "CORRUPT" : !f[i].published ? "unpublished" : verify ? "verified" : "published";
    const char *kind = f[i].copy ? "copy" : "part";
    if (json) {
      printf("%s\n  {\"step\": %" PRIu64 ", \"kind\": \"%s\", \"rank\": %d, \"bytes\": %" PRIu64
             ", \"published\": %s, \"state\": \"%s\", \"path\": ", i ? "," : "", f[i].step, kind, f[i].rank,
             f[i].bytes, f[i].published ? "true" : "false", state);
      cli_json_string(stdout, f[i].path);
      printf(", \"error\": ");
      cli_json_string(stdout, why);
      printf("}");
    } else {
      printf("%-10" PRIu64 " %-5s %6d %12s  %-12s %s\n", f[i].step, kind, f[i].rank,
             cli_fmt_bytes(f[i].bytes, size, sizeof(size)), state, why[0] ? why : f[i].path);
    }
  }
  if (json) printf("%s]}", n ? "\n" : "");
  free(f);
  return ret;
}

int cli_tiers_main(int argc, char **argv) {
  cli_listing l = {0, 0};
  const char **dirs = calloc((size_t)argc, sizeof(*dirs));
  int ndirs;
  if (!dirs) return CLI_EXIT_USAGE;
  if (cli_args(argc, argv, "tiers", cli_tiers_usage, cli_listing_option, &l, "DIR", dirs, argc, &ndirs)) {
    free(dirs);
    return CLI_EXIT_USAGE;
  }
  const int verify = l.verify, json = l.json;
  ckptio_ctx *ctx = NULL;
  ckptio_options o;
  cli_verify_options(&o);
  int rc = ckptio_ctx_create(&o, &ctx);
  if (rc < 0) {
    fprintf(stderr, "ckptio tiers: %s\n", cli_open_error(rc));
    free(dirs);
    return CLI_EXIT_USAGE;
  }
  int ret = CLI_EXIT_OK, first = 1;
  if (json) printf("{\"dirs\": [");
  for (int i = 0; i < ndirs; i++) {
    int r = list_dir(ctx, dirs[i], verify, json, first);
    first = 0;
    ret = r > ret ? r : ret;
  }
  if (json) printf("]}\n");
  ckptio_ctx_free(ctx);
  free(dirs);
  return ret;
}
