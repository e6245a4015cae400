/*
 * `ckptio`: the command-line face of the library. This file only dispatches
 * to a subcommand and prints the overall usage; each subcommand parses its
 * own options and owns its --help.
 */
#include <signal.h>
#include <string.h>

#include "cli/cli.h"

typedef struct command {
  const char *name;
  const char *summary;
  int (*run)(int argc, char **argv);
  void (*usage)(FILE *out);
} command;

static const command kCommands[] = {
    {"inspect", "list the tensors and metadata of a checkpoint", cli_inspect_main,
     cli_inspect_usage},
    {"verify", "check a checkpoint's structure and every checksum", cli_verify_main,
     cli_verify_usage},
    {"convert", "convert between safetensors and PyTorch .pt", cli_convert_main,
     cli_convert_usage},
    {"bench", "save / load throughput next to this machine's raw limits", cli_bench_main,
     cli_bench_usage},
    {"checkpoints", "list a checkpoint manager's directory (steps, sizes, state)",
     cli_checkpoints_main, cli_checkpoints_usage},
    {"tiers", "list tier directories of tiered checkpoints (parts, copies, state)", cli_tiers_main,
     cli_tiers_usage},
};
#define NCOMMANDS (sizeof(kCommands) / sizeof(kCommands[0]))

static void usage(FILE *out) {
  fprintf(out,
          "usage: ckptio <command> [options]\n"
          "       ckptio <command> --help\n"
          "       ckptio --version\n\n"
          "commands:\n");
  for (size_t i = 0; i < NCOMMANDS; i++)
    fprintf(out, "  %-11s %s\n", kCommands[i].name, kCommands[i].summary);
  fprintf(out,
          "\nexit codes: 0 success; 1 the file is not a valid checkpoint (or loaded\n"
          "data differ); 2 bad usage, or an I/O or system error.\n");
}

static const command *find_command(const char *name) {
  for (size_t i = 0; i < NCOMMANDS; i++)
    if (!strcmp(kCommands[i].name, name)) return &kCommands[i];
  return NULL;
}

const char *cli_program = "ckptio";

int main(int argc, char **argv) {
  cli_program = argv[0];
  /* A closed pipe (ckptio inspect F | head) must end the command quietly,
   * even when the parent left SIGPIPE ignored. */
  signal(SIGPIPE, SIG_DFL);
  if (argc < 2) {
    usage(stderr);
    return CLI_EXIT_USAGE;
  }
  const char *name = argv[1];
  if (!strcmp(name, "--help") || !strcmp(name, "-h")) {
    usage(stdout);
    return CLI_EXIT_OK;
  }
  if (!strcmp(name, "--version")) {
    printf("ckptio %s\n", ckptio_version_string());
    return CLI_EXIT_OK;
  }
  if (!strcmp(name, "help")) {
    const command *c = argc > 2 ? find_command(argv[2]) : NULL;
    if (argc > 2 && !c) {
      fprintf(stderr, "ckptio: unknown command '%s'\n", argv[2]);
      return CLI_EXIT_USAGE;
    }
    if (c)
      c->usage(stdout);
    else
      usage(stdout);
    return CLI_EXIT_OK;
  }
  const command *c = find_command(name);
  if (!c) {
    fprintf(stderr, "ckptio: unknown command '%s'\n\n", name);
    usage(stderr);
    return CLI_EXIT_USAGE;
  }
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "--")) break;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      c->usage(stdout);
      return CLI_EXIT_OK;
    }
  }
  return c->run(argc - 1, argv + 1);
}
