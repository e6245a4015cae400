/*
 * What `ckptio bench` measures and how it reports it: the options, one
 * run's timings, and the report (a table for people, JSON for scripts).
 */
#ifndef CKPTIO_CLI_BENCH_H
#define CKPTIO_CLI_BENCH_H

#include "cli/cli.h"

typedef struct bench_opts {
  const char *argv0;
  const char *size_str; /* as given, or the default */
  uint64_t size;
  int size_given;
  cli_shapes shapes;
  const char *dir;
  const char *keep;
  int runs;
  int threads;
  uint64_t chunk, staging;
  int crc, fsync;
  int direct; /* CKPTIO_AUTO, 0, 1 */
  ckptio_load_method load;
  int verify, json;
} bench_opts;

/* Seconds of each step of one run, in the order they ran (A B A B). */
typedef struct bench_run {
  double save_s, snapshot_s;
  double raw_write_s;
  double cold_s;
  double raw_read_s;
  double warm_s;
  double memcpy_s;
} bench_run;

typedef struct bench_result {
  const bench_opts *opts;
  const cli_machine *machine;
  const cli_model *model;
  ckptio_options ctx_opts; /* in force, defaults resolved */
  uint64_t raw_bytes;      /* bytes moved by the raw write / read / memcpy */
  uint64_t file_bytes;     /* size of the checkpoint file */
  int raw_direct_write, raw_direct_read;
  int runs_done;
  bench_run *runs;
  uint64_t rss_baseline;   /* ru_maxrss once the model and buffers exist */
  uint64_t rss_peak;       /* ru_maxrss at the end */
} bench_result;

const char *bench_load_name(ckptio_load_method m);
const char *bench_direct_name(int direct);
const char *bench_shapes_name(cli_shapes s);

/* The command line that reproduces this benchmark, every option explicit. */
void bench_print_command(FILE *out, const bench_opts *o, const ckptio_options *in_force);
void bench_report_table(FILE *out, const bench_result *r);
void bench_report_json(FILE *out, const bench_result *r);

#endif
