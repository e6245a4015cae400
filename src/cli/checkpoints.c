/*
 * `ckptio checkpoints DIR`: a checkpoint manager's directory (one step
 * directory per checkpoint, see ckptio_manager_* in ckptio.h) as a table:
 * step, size, files, complete or not, verified or not (with --verify), and
 * the checkpoint a resume would pick. DIR may be a storage's prefix
 * ("s3://bucket/ckpts"). Reads only; changes nothing.
 */
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"

void cli_checkpoints_usage(FILE *out) {
  fprintf(out,
          "usage: ckptio checkpoints DIR [--verify] [--json]\n\n"
          "Lists the checkpoints of a checkpoint manager's directory (DIR/step-NNNNNNNN/,\n"
          "oldest first; DIR may be an object storage prefix, s3://bucket/ckpts): step,\n"
          "bytes stored, files, and its state: \"complete\" (it opens: every header\n"
          "checked, every shard of a set present), \"verified\" (--verify: every CRC32\n"
          "read and checked too), or INCOMPLETE / CORRUPT with the reason. Then the\n"
          "checkpoint a resume would pick (the newest complete one; with --verify, the\n"
          "newest verified one). Hidden temporaries of a save in progress or killed\n"
          "(on a storage: objects no published checkpoint names) are not listed.\n"
          "Nothing in DIR is changed.\n\n"
          "  --verify  read every checkpoint whole and check its CRC32s\n"
          "  --json    one JSON object: {\"dir\", \"checkpoints\": [...], \"resume\"}\n\n"
          "exit codes: 0 every checkpoint complete (and verified); 1 some are not;\n"
          "2 usage or I/O error\n");
}

static const char *state_of(const ckptio_checkpoint_info *c, int verify) {
  if (!c->complete) return "INCOMPLETE";
  if (verify) return c->verified ? "verified" : "CORRUPT";
  return "complete";
}

int cli_checkpoints_main(int argc, char **argv) {
  const char *dir;
  cli_listing l = {0, 0};
  int ndirs;
  if (cli_args(argc, argv, "checkpoints", cli_checkpoints_usage, cli_listing_option, &l, "DIR", &dir, 1, &ndirs))
    return CLI_EXIT_USAGE;
  const int verify = l.verify, json = l.json;
  /* The manager creates a missing directory; a listing must not. A
   * storage's prefix is never created (the manager asks the storage to
   * list it, and fails naming the URL when it cannot). */
  int object = ckptio_path_scheme(dir) > 0;
  struct stat st;
  if (!object && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))) {
    fprintf(stderr, "ckptio checkpoints: %s: not a directory\n", dir);
    return CLI_EXIT_USAGE;
  }

  int ret = CLI_EXIT_USAGE;
  ckptio_ctx *ctx = NULL;
  ckptio_manager *m = NULL;
  ckptio_options o;
  cli_verify_options(&o);
  if (object) {
    /* An object has no mapping: each read is a request, so 8 MiB ones,
     * 8 in flight. */
    o.load_method = CKPTIO_LOAD_AUTO;
    o.chunk_bytes = 8u << 20;
    o.staging_bytes = 64u << 20;
  }
  int rc = ckptio_ctx_create(&o, &ctx);
  if (rc < 0) {
    fprintf(stderr, "ckptio checkpoints: %s\n", cli_open_error(rc));
    goto out;
  }
  if ((rc = ckptio_manager_open(ctx, dir, NULL, NULL, &m)) < 0) {
    fprintf(stderr, "ckptio checkpoints: %s\n", cli_open_error(rc));
    goto out;
  }
  int64_t n = ckptio_manager_list(m, verify);
  if (n < 0) {
    fprintf(stderr, "ckptio checkpoints: %s\n", ckptio_manager_last_error(m));
    goto out;
  }
  ret = CLI_EXIT_OK;
  int64_t resume = -1;
  if (json) {
    printf("{\"dir\": ");
    cli_json_string(stdout, dir);
    printf(", \"checkpoints\": [");
  } else {
    printf("%-10s %12s %5s  %-10s %s\n", "STEP", "SIZE", "FILES", "STATE", "PATH / REASON");
  }
  for (int64_t i = 0; i < n; i++) {
    ckptio_checkpoint_info c = CKPTIO_CHECKPOINT_INFO_INIT;
    ckptio_manager_checkpoint(m, (size_t)i, &c);
    int good = c.complete && (!verify || c.verified);
    if (good) resume = i;
    if (!good) ret = CLI_EXIT_INVALID;
    if (json) {
      printf("%s\n  {\"step\": %" PRIu64 ", \"dir\": ", i ? "," : "", c.step);
      cli_json_string(stdout, c.dir);
      printf(", \"path\": ");
      cli_json_string(stdout, c.path);
      printf(", \"bytes\": %" PRIu64 ", \"files\": %u, \"complete\": %s, \"verified\": %s, \"error\": ", c.bytes,
             c.files, c.complete ? "true" : "false", c.verified ? "true" : "false");
      cli_json_string(stdout, c.error ? c.detail : "");
      printf("}");
    } else {
      char size[32];
      printf("%-10" PRIu64 " %12s %5u  %-10s %s\n", c.step, cli_fmt_bytes(c.bytes, size, sizeof(size)), c.files,
             state_of(&c, verify), good ? c.path : c.detail);
    }
  }
  ckptio_checkpoint_info r = CKPTIO_CHECKPOINT_INFO_INIT;
  if (resume >= 0) ckptio_manager_checkpoint(m, (size_t)resume, &r);
  if (json) {
    printf("%s], \"resume\": ", n ? "\n" : "");
    if (resume >= 0) {
      printf("{\"step\": %" PRIu64 ", \"path\": ", r.step);
      cli_json_string(stdout, r.path);
      printf("}}\n");
    } else {
      printf("null}\n");
    }
  } else if (resume >= 0) {
    printf("resume: step %" PRIu64 " (%s)\n", r.step, r.path);
  } else {
    printf("resume: none (no %s checkpoint)\n", verify ? "verified" : "complete");
  }
out:
  ckptio_manager_close(m);
  ckptio_ctx_free(ctx);
  return ret;
}
