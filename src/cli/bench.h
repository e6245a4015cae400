/*
 * What `ckptio bench` measures and how it reports it: the options, one
 * run's timings and stage statistics, the GPU side of a --device cuda:N run,
 * and the report (a table for people, JSON for scripts).
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
  int gpu;              /* --device: -1 the host, else the GPU ordinal */
  ckptio_format format; /* --format */
  uint64_t max_shard;   /* --max-shard-size: also a sharded save per run; 0: off */
  size_t snapshot;      /* --snapshot-bytes: snapshot memory (CKPTIO_SNAPSHOT_AUTO: auto); 0: none */
  const char *trace;    /* --trace: the stages traced to this file (ckptio_trace_start); NULL: none */
} bench_opts;

/* Seconds of each step of one run, in the order they ran (A B A B), and
 * the library's stage timings of the save and the two loads. The raw_d2h /
 * raw_h2d copies run only with --device cuda:N. */
typedef struct bench_run {
  double save_s, snapshot_s;
  double raw_write_s;    /* the best of raw_write_ways_s, what the ratios use */
  double raw_write_ways_s[CLI_RAW_WRITE_WAYS];
  double raw_d2h_s;
  double raw_h2d_s;
  double cold_s;
  double raw_read_s;     /* the best of raw_read_ways_s */
  double raw_read_ways_s[CLI_RAW_READ_WAYS];
  double thp_write_s, thp_read_s;  /* the raw limits from huge pages */
  double warm_s;
  double memcpy_s;
  double shard_save_s;  /* --max-shard-size: the sharded save, right after the single one */
  size_t nshards;
  ckptio_stats save, cold, warm;
} bench_run;

/* The GPU side of a --device cuda:N run (synth.c): the model's bytes in the
 * memory of one GPU, and what the runtime says the GPU is. Every GPU call
 * goes through the context (its CUDA runtime, its copy streams): the
 * uploads, the downloads and the raw copy limits. */
typedef struct bench_gpu {
  ckptio_ctx *ctx;      /* the bench's context (not owned); NULL: nothing opened */
  int ordinal;
  uint8_t *src, *dst;   /* device arenas laid out like the model's: saved from, loaded into */
  uint64_t bytes;       /* of each */
  uint8_t *pinned;      /* the host buffer the bench pinned (not owned) */
  uint64_t pinned_bytes;
  ckptio_device_info info; /* name ("?" when the runtime cannot say), PCI bus id, runtime file */
} bench_gpu;

/* Allocates the two device arenas on GPU `ordinal` through the context,
 * pins `pinned` (n bytes, page-aligned) and uploads the model's arena
 * through it. @return 0, or a negative code with the reason printed. */
int bench_gpu_open(bench_gpu *g, ckptio_ctx *ctx, int ordinal, const cli_model *m, uint8_t *pinned,
                   uint64_t n);
/* Frees what open made, before its context is freed. Safe on a zeroed struct. */
void bench_gpu_close(bench_gpu *g);
/* One synchronous copy of n bytes between the host and the GPU; *secs (may
 * be NULL) is its time. @return 0, or a negative code, printed. */
int bench_gpu_copy(bench_gpu *g, void *dst, const void *src, uint64_t n, int to_device,
                   double *secs);

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
  const bench_gpu *gpu;    /* --device cuda:N, else NULL */
  const char *numa;        /* ckptio_ctx_numa_report */
  uint64_t staging_peak;   /* max of the stats' staging_bytes */
  const char *load_skipped; /* why the loads were skipped (a .pt the reader refused), or NULL */
} bench_result;

const char *bench_load_name(ckptio_load_method m);
const char *bench_direct_name(int direct);
const char *bench_shapes_name(cli_shapes s);
const char *bench_format_name(ckptio_format f);

/* The command line that reproduces this benchmark, every option explicit. */
void bench_print_command(FILE *out, const bench_opts *o, const ckptio_options *in_force);
void bench_report_table(FILE *out, const bench_result *r);
void bench_report_json(FILE *out, const bench_result *r);

/* `ckptio bench --dir s3://bucket/prefix` (a storage's prefix): the save
 * and loads through the storage next to its own upload and GET limits
 * (bench_s3.c). Removes its objects on the way out. @return an exit code. */
int bench_storage_main(bench_opts *o);
/* One run's timed save of the model to path (a file or a storage's object):
 * open to durable, the bench's metadata on it, a progress bar; the seconds
 * from the open to the snapshot point and to durable, the writer's stats.
 * A failure is printed. @return 0 or its code. */
int bench_save_model(ckptio_ctx *ctx, const char *path, ckptio_format format, const cli_model *m, int run,
                     double *snapshot_s, double *save_s, ckptio_stats *stats);
/* SIGINT, SIGTERM and SIGHUP to handler (restarting system calls): a bench
 * stopped by the user still removes what it wrote. */
void bench_catch_signals(void (*handler)(int));
/* The context options every bench sets from its command line: threads,
 * chunk, staging, snapshot and CRC (a local bench adds its own). */
ckptio_options bench_ctx_options(const bench_opts *o);
/* The process's peak resident memory so far (ru_maxrss), in bytes. */
uint64_t bench_maxrss_bytes(void);

#endif
