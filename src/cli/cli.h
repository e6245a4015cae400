/*
 * The `ckptio` command's private interface: the subcommands, and the small
 * helpers they share (sizes, clocks, JSON strings, the progress bar, exit
 * codes). Only include/ckptio.h is used from the library.
 */
#ifndef CKPTIO_CLI_H
#define CKPTIO_CLI_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The command ships with the library, at its version, and uses calls of
 * ckptio.h's experimental section (plan_rank, header_bytes, numa_report,
 * ...): declared for every file of it, since each includes this header. */
#define CKPTIO_EXPERIMENTAL
#include "ckptio.h"

/* Exit codes shared by every subcommand. */
enum {
  CLI_EXIT_OK = 0,
  CLI_EXIT_INVALID = 1, /* the file is not a valid checkpoint, or data differ */
  CLI_EXIT_USAGE = 2,   /* bad command line, or an I/O / system error */
};

/* argv[0] of the command, for the reproducing command lines it prints. */
extern const char *cli_program;

/* Subcommands: argv[0] is the subcommand name. */
int cli_inspect_main(int argc, char **argv);
int cli_verify_main(int argc, char **argv);
int cli_bench_main(int argc, char **argv);
int cli_convert_main(int argc, char **argv);
int cli_checkpoints_main(int argc, char **argv);
int cli_tiers_main(int argc, char **argv);

void cli_inspect_usage(FILE *out);
/* inspect --plan NAME:DIM:N on an open reader (src/cli/plan.c). */
int cli_inspect_plan(ckptio_reader *r, const char *spec, int json);
void cli_verify_usage(FILE *out);
void cli_bench_usage(FILE *out);
void cli_convert_usage(FILE *out);
void cli_checkpoints_usage(FILE *out);
void cli_tiers_usage(FILE *out);

/* ------------------------------------------------------------ util.c */

/* Parses "4096", "512MiB", "2G" (binary: K M G T, KiB..TiB), "2GB" (decimal:
 * KB MB GB TB), with an optional fraction ("1.5GiB"). @return 0, or -1. */
int cli_parse_size(const char *s, uint64_t *out);
/* Parses a non-negative decimal int. @return 0, or -1. */
int cli_parse_int(const char *s, int *out);
/* "1.00 GiB", "512.0 MiB", "4096 B" into buf. @return buf. */
const char *cli_fmt_bytes(uint64_t n, char *buf, size_t len);
/* Monotonic seconds. */
double cli_now(void);
/* Writes s as a JSON string literal, quotes included. */
void cli_json_string(FILE *out, const char *s);
/* Writes s quoted for a POSIX shell when it needs quoting. */
void cli_shell_word(FILE *out, const char *s);
/* The detail of the last failed open or context creation in this thread,
 * or the error's name when the library left none. */
const char *cli_open_error(int rc);
/* Which exit code a library error while reading a file maps to. */
int cli_exit_for_read_error(int rc);
/* An option of a command: how many words from argv[i] it took (1, or 2
 * with its value), or 0 when argv[i] is not one of its. */
typedef int (*cli_option_fn)(void *opts, int argc, char **argv, int i);
/* The words of `ckptio CMD`: options through `option` (NULL: none), the
 * others positional, `what` (FILE, DIR) in messages, at least one and at
 * most max of them into args (*n of them). An unknown option, none or too
 * many positional words are printed with why and the usage. @return 0, or
 * CLI_EXIT_USAGE. */
int cli_args(int argc, char **argv, const char *cmd, void (*usage)(FILE *), cli_option_fn option, void *opts,
             const char *what, const char **args, int max, int *n);
/* The listing commands' (checkpoints, tiers) options, for cli_args:
 * --verify and --json. */
typedef struct cli_listing {
  int verify, json;
} cli_listing;
int cli_listing_option(void *listing, int argc, char **argv, int i);
/* A context for reading local checkpoints whole to check their CRC32s
 * (verify, checkpoints, tiers): from the mapping, with a tiny ring, no CUDA. */
void cli_verify_options(ckptio_options *o);
/* Files of a checkpoint made of several: a set's shards, or a DCP
 * checkpoint's .distcp files (no shards: they do not open alone, so the
 * reader's shard count is 0 for them); 0 for one file. */
size_t cli_files_of(ckptio_reader *r);

/* Median, minimum and maximum of n values (n >= 1; v is reordered). */
typedef struct cli_stat {
  double median, min, max;
} cli_stat;
cli_stat cli_stat_of(double *v, size_t n);

/* ------------------------------------------------------------ progress.c */

/* Reports bytes done and in all; called from the progress thread while the
 * operation runs on another. */
typedef void (*cli_progress_fn)(void *arg, uint64_t *done, uint64_t *total);

/* A progress bar on stderr: drawn only when stderr is a terminal and the
 * operation has run for more than a second; polled every 100 ms. */
typedef struct cli_progress {
  int active;
  int drawn;
  int stop;
  char label[64];
  double start;
  cli_progress_fn fn;
  void *arg;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
} cli_progress;

/* Starts the poller (or nothing when stderr is not a terminal). */
void cli_progress_start(cli_progress *p, const char *label, cli_progress_fn fn, void *arg);
/* Stops the poller and erases the bar. Safe on a progress never started. */
void cli_progress_stop(cli_progress *p);

/* Progress functions for the two kinds of handle. */
void cli_progress_writer(void *writer, uint64_t *done, uint64_t *total);
void cli_progress_reader(void *reader, uint64_t *done, uint64_t *total);

/* ------------------------------------------------------------ synth.c */

typedef enum cli_shapes { CLI_SHAPES_LLM, CLI_SHAPES_LINEAR } cli_shapes;

/* A synthetic model: tensors laid out in one page-aligned arena, filled with
 * deterministic pseudo-random bytes and touched before anything is timed. */
typedef struct cli_model {
  cli_shapes shapes;
  int hidden, layers, vocab, inter; /* llm: the dimensions chosen */
  int linear_dim;                   /* linear: d of Linear(d, d) */
  size_t count;
  ckptio_tensor *tensors;           /* data points into arena */
  char **names;                     /* owned */
  uint64_t *arena_offset;           /* tensor i's offset in the arena */
  uint64_t tensor_bytes;            /* sum of every tensor's bytes */
  uint64_t arena_bytes;             /* a multiple of 4096, >= tensor_bytes */
  uint8_t *arena;
} cli_model;

/* Chooses the shapes for about target_bytes (linear with target 0: the
 * 10 x Linear(10000, 10000) model), allocates, fills and touches. */
int cli_model_build(cli_model *m, cli_shapes shapes, uint64_t target_bytes);
void cli_model_free(cli_model *m);
/* A touched page-aligned buffer of n bytes (munmap with cli_buffer_free). */
void *cli_buffer_alloc(uint64_t n);
void cli_buffer_free(void *p, uint64_t n);

/* ------------------------------------------------------------ rawlimit.c */

#define CLI_RAW_BLOCK (8u << 20)
#define CLI_RAW_DEPTH 32

/* Sequential write of n bytes of buf (page-aligned; n a multiple of 4096) to
 * a new file at path with O_DIRECT, CLI_RAW_DEPTH blocks of CLI_RAW_BLOCK in
 * flight, then fdatasync. *direct says whether O_DIRECT was accepted.
 * @return 0 and *seconds, or -errno. */
int cli_raw_write(const char *path, const void *buf, uint64_t n, double *seconds, int *direct);
/* Sequential O_DIRECT read of n bytes of path into buf, same depth. */
int cli_raw_read(const char *path, void *buf, uint64_t n, double *seconds, int *direct);
/* The ways of writing and reading a file the raw limits are the best of:
 * no one way is the disk's ceiling (on this project's VMs a single buffered
 * reader with readahead beat O_DIRECT at depth 32 in the same minutes). */
enum { CLI_RAW_WRITE_DIRECT, CLI_RAW_WRITE_BUFFERED, CLI_RAW_WRITE_WAYS };
enum { CLI_RAW_READ_DIRECT, CLI_RAW_READ_SEQ, CLI_RAW_READ_PAR, CLI_RAW_READ_DEEP, CLI_RAW_READ_WAYS };
const char *cli_raw_write_way_name(int way);
const char *cli_raw_read_way_name(int way);
/* Writes n bytes of buf to a new file at path each way in turn (the last
 * one's file stays, fdatasync'ed and dropped from the page cache), each
 * way's time in seconds[way]. @return 0 or -errno. */
int cli_raw_write_ways(const char *path, const void *buf, uint64_t n,
                       double seconds[CLI_RAW_WRITE_WAYS], int *direct);
/* Reads the first n bytes of path into buf (n bytes, page-aligned) each way
 * in turn, the file dropped from the page cache before each. */
int cli_raw_read_ways(const char *path, void *buf, uint64_t n, double seconds[CLI_RAW_READ_WAYS],
                      int *direct);
/* The shortest of the ways' times that ran (> 0), or 0. */
double cli_raw_best(const double *seconds, int ways);
/* The same write and then read of n bytes at path, but from one buffer of
 * CLI_RAW_DEPTH blocks in transparent huge pages that the requests cycle
 * through, as fio's buffers do: what the disk does when the memory side of
 * each request is a few contiguous pieces. */
int cli_raw_thp(const char *path, uint64_t n, double *write_s, double *read_s);
/* Single-thread memcpy of n bytes. @return seconds. */
double cli_raw_memcpy(void *dst, const void *src, uint64_t n);
/* fdatasync, then drop the file from the page cache. @return 0 or -errno. */
int cli_drop_cache(const char *path);
/* Reads the file once through the page cache so a following load is warm. */
int cli_warm_cache(const char *path);

/* ------------------------------------------------------------ machine.c */

typedef struct cli_machine {
  long nproc;
  uint64_t mem_bytes;
  char kernel[160];
  char cpu[128];
  char fs_type[32];
  char fs_device[256];
  char fs_mount[256];
  char dir[4096]; /* absolute */
} cli_machine;

void cli_machine_probe(cli_machine *m, const char *dir);

#endif
