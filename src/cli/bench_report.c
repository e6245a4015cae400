/*
 * The report of `ckptio bench`: how to reproduce it, the machine, the
 * options, then median and min-max of each rate and of each ratio to the raw
 * limit measured in the same run, and the library's own stage timings next
 * to the raw limit each stage runs into. Ratios are taken per run (the pair
 * ran side by side) before the median, so drift between runs cancels.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench.h"

typedef enum series {
  S_SAVE, S_RAW_WRITE, S_SAVE_RATIO, S_SNAPSHOT, S_SAVE_S, S_RAW_D2H,
  S_COLD, S_RAW_READ, S_COLD_RATIO, S_RAW_H2D, S_COLD_LIMIT_RATIO,
  S_WARM, S_MEMCPY, S_WARM_RATIO, S_WARM_H2D_RATIO,
  S_SHARD_SAVE, S_SHARD_RATIO, S_COPY_LIMIT, S_SNAPSHOT_RATIO,
  S_THP_WRITE, S_THP_READ,
  /* Each way of the raw limits (rawlimit.c); S_RAW_WRITE / S_RAW_READ are
   * the best of them in each run. */
  S_RAW_WRITE_WAY, S_RAW_READ_WAY = S_RAW_WRITE_WAY + CLI_RAW_WRITE_WAYS,
  S_COUNT = S_RAW_READ_WAY + CLI_RAW_READ_WAYS
} series;

static double gbps(uint64_t bytes, double s) { return s > 0 ? (double)bytes / s / 1e9 : 0; }

static double value(const bench_result *r, const bench_run *x, series k) {
  uint64_t data = r->model->tensor_bytes, raw = r->raw_bytes;
  switch (k) {
    case S_SAVE: return gbps(data, x->save_s);
    case S_RAW_WRITE: return gbps(raw, x->raw_write_s);
    case S_SAVE_RATIO: return gbps(data, x->save_s) / gbps(raw, x->raw_write_s);
    case S_SNAPSHOT: return x->snapshot_s;
    case S_SAVE_S: return x->save_s;
    case S_RAW_D2H: return gbps(raw, x->raw_d2h_s);
    case S_RAW_H2D: return gbps(raw, x->raw_h2d_s);
    case S_WARM_H2D_RATIO: return gbps(data, x->warm_s) / gbps(raw, x->raw_h2d_s);
    case S_COLD: return gbps(data, x->cold_s);
    case S_RAW_READ: return gbps(raw, x->raw_read_s);
    case S_THP_WRITE: return gbps(raw, x->thp_write_s);
    case S_THP_READ: return gbps(raw, x->thp_read_s);
    case S_COLD_RATIO: return gbps(data, x->cold_s) / gbps(raw, x->raw_read_s);
    /* A pipelined GPU load can at best run at the slower of its stages. */
    case S_COLD_LIMIT_RATIO: {
      double limit = x->raw_read_s > x->raw_h2d_s ? x->raw_read_s : x->raw_h2d_s;
      return gbps(data, x->cold_s) / gbps(raw, limit);
    }
    case S_WARM: return gbps(data, x->warm_s);
    case S_MEMCPY: return gbps(raw, x->memcpy_s);
    case S_WARM_RATIO: return gbps(data, x->warm_s) / gbps(raw, x->memcpy_s);
    case S_SHARD_SAVE: return gbps(data, x->shard_save_s);
    case S_SHARD_RATIO: return x->shard_save_s > 0 ? x->save_s / x->shard_save_s : 0; /* GB/s over GB/s */
    /* What a snapshot cannot beat: copying the tensors' bytes out once, by
     * memcpy from host tensors or by pinned cudaMemcpy from a GPU. */
    case S_COPY_LIMIT: return (r->gpu ? x->raw_d2h_s : x->memcpy_s) * (double)data / (double)raw;
    case S_SNAPSHOT_RATIO: {
      double lim = (r->gpu ? x->raw_d2h_s : x->memcpy_s) * (double)data / (double)raw;
      return lim > 0 ? x->snapshot_s / lim : 0;
    }
    default:
      if (k >= S_RAW_READ_WAY) return gbps(raw, x->raw_read_ways_s[k - S_RAW_READ_WAY]);
      if (k >= S_RAW_WRITE_WAY) return gbps(raw, x->raw_write_ways_s[k - S_RAW_WRITE_WAY]);
      return 0;
  }
}

static cli_stat stat_of(const bench_result *r, series k) {
  double v[1000];
  size_t n = 0;
  for (int i = 0; i < r->runs_done && n < 1000; i++) v[n++] = value(r, &r->runs[i], k);
  return cli_stat_of(v, n);
}

/* ------------------------------------------------------------ stages */

/* The three timed operations of a run, and the stages of their stats. */
typedef enum op { OP_SAVE, OP_COLD, OP_WARM } op;
typedef enum stage { ST_DEVICE, ST_COPY, ST_WRITE, ST_COMMIT } stage;

static const ckptio_stats *op_stats(const bench_run *x, op o) {
  return o == OP_SAVE ? &x->save : o == OP_COLD ? &x->cold : &x->warm;
}

static double stage_busy(const ckptio_stats *st, stage k) {
  switch (k) {
    case ST_DEVICE: return st->device_seconds;
    case ST_COPY: return st->copy_seconds;
    case ST_WRITE: return st->write_seconds;
    default: return st->commit_seconds;
  }
}

/* Busy seconds are summed over the workers: bytes x workers / busy is the
 * rate the stage alone would allow with every worker on it. The commit runs
 * on one thread, so its bound would mean nothing. */
static cli_stat stage_stat(const bench_result *r, op o, stage k, int bound) {
  double v[1000];
  size_t n = 0;
  for (int i = 0; i < r->runs_done && n < 1000; i++) {
    const ckptio_stats *st = op_stats(&r->runs[i], o);
    double busy = stage_busy(st, k);
    v[n++] = !bound ? busy : busy > 0 ? (double)st->bytes * st->threads / busy / 1e9 : 0;
  }
  return cli_stat_of(v, n);
}

static void stage_row(FILE *out, const bench_result *r, const char *opname, op o, stage k,
                      const char *name, const char *limit, series lim) {
  char bound[24] = "-";
  if (k != ST_COMMIT) snprintf(bound, sizeof(bound), "%.2f", stage_stat(r, o, k, 1).median);
  fprintf(out, "  %-10s %-28s %8.3f %10s", opname, name, stage_stat(r, o, k, 0).median, bound);
  if (limit) fprintf(out, "  %9.2f  %s", stat_of(r, lim).median, limit);
  fputc('\n', out);
}

static void stage_table(FILE *out, const bench_result *r) {
  int gpu = r->gpu != NULL, threads = r->ctx_opts.threads;
  fprintf(out, "\nstages (median; busy time summed over the %d workers; bound = bytes x %d / busy,\n"
          "        the rate that stage alone would allow; the raw limit measured in this run)\n",
          threads, threads);
  fprintf(out, "  %-10s %-28s %8s %10s %10s\n", "", "", "busy s", "bound GB/s", "raw GB/s");
  if (gpu) stage_row(out, r, "save", OP_SAVE, ST_DEVICE, "device to host (waiting)", "pinned D2H", S_RAW_D2H);
  stage_row(out, r, gpu ? "" : "save", OP_SAVE, ST_COPY, gpu ? "CRC in staging" : "copy + CRC", NULL,
            S_COUNT);
  stage_row(out, r, "", OP_SAVE, ST_WRITE, "write", "raw write (best)", S_RAW_WRITE);
  stage_row(out, r, "", OP_SAVE, ST_COMMIT, "commit (fdatasync, rename)", NULL, S_COUNT);
  if (r->load_skipped) {
    fprintf(out, "  %-10s skipped: %s\n", "loads", r->load_skipped);
    return;
  }
  stage_row(out, r, "cold load", OP_COLD, ST_COPY, "read (O_DIRECT) + CRC", "raw read (best)", S_RAW_READ);
  if (gpu) stage_row(out, r, "", OP_COLD, ST_DEVICE, "host to device", "pinned H2D", S_RAW_H2D);
  char warm[48];
  snprintf(warm, sizeof(warm), "read (%s) + CRC", bench_load_name(r->ctx_opts.load_method));
  stage_row(out, r, "warm load", OP_WARM, ST_COPY, warm, "memcpy", S_MEMCPY);
  if (gpu) stage_row(out, r, "", OP_WARM, ST_DEVICE, "host to device", "pinned H2D", S_RAW_H2D);
}

void bench_print_command(FILE *out, const bench_opts *o, const ckptio_options *f) {
  cli_shell_word(out, o->argv0);
  fputs(" bench", out);
  if (o->size_given || o->shapes == CLI_SHAPES_LLM) {
    fputs(" --size ", out);
    cli_shell_word(out, o->size_str);
  }
  fprintf(out, " --shapes %s --format %s", bench_shapes_name(o->shapes), bench_format_name(o->format));
  if (o->gpu >= 0)
    fprintf(out, " --device cuda:%d", o->gpu);
  else
    fputs(" --device host", out);
  fputs(" --dir ", out);
  cli_shell_word(out, o->dir);
  if (f->snapshot_bytes) fprintf(out, " --snapshot-bytes %zu", f->snapshot_bytes);
  fprintf(out, " --runs %d --threads %d --chunk %zu --staging %zu%s%s --direct %s --load %s%s",
          o->runs, f->threads, f->chunk_bytes, f->staging_bytes, f->crc ? "" : " --no-crc",
          f->fsync ? "" : " --no-fsync", bench_direct_name(f->direct_io),
          bench_load_name(f->load_method), o->verify ? " --verify" : "");
  if (o->keep) {
    fputs(" --keep ", out);
    cli_shell_word(out, o->keep);
  }
  if (o->max_shard) fprintf(out, " --max-shard-size %llu", (unsigned long long)o->max_shard);
  if (o->json) fputs(" --json", out);
}

static void model_line(FILE *out, const bench_result *r) {
  const cli_model *m = r->model;
  char b[32];
  if (m->shapes == CLI_SHAPES_LLM)
    fprintf(out, "llm: hidden %d, %d layers, vocab %d, mlp %d", m->hidden, m->layers, m->vocab,
            m->inter);
  else
    fprintf(out, "linear: 10 x Linear(%d, %d) fp32 + bias", m->linear_dim, m->linear_dim);
  fprintf(out, "; %zu tensors, %s (%" PRIu64 " bytes)", m->count,
          cli_fmt_bytes(m->tensor_bytes, b, sizeof(b)), m->tensor_bytes);
}

static void row(FILE *out, const bench_result *r, const char *name, const char *unit, series k) {
  cli_stat s = stat_of(r, k);
  if (!strcmp(unit, "x"))
    fprintf(out, "  %-30s %9.2fx %9.2fx %9.2fx\n", name, s.median, s.min, s.max);
  else if (!strcmp(unit, "s"))
    fprintf(out, "  %-24s %-5s %9.3f  %9.3f  %9.3f\n", name, unit, s.median, s.min, s.max);
  else
    fprintf(out, "  %-24s %-5s %9.2f  %9.2f  %9.2f\n", name, unit, s.median, s.min, s.max);
}

void bench_report_table(FILE *out, const bench_result *r) {
  const cli_machine *mc = r->machine;
  const ckptio_options *f = &r->ctx_opts;
  char b1[32], b2[32], b3[32];
  fprintf(out, "ckptio %s bench: %d run%s, each step next to its raw limit (A B A B)\n",
          ckptio_version_string(), r->runs_done, r->runs_done == 1 ? "" : "s");
  /* First, where it cannot be missed: what the runtime says the GPU is (a
   * stand-in such as the test runtime says so in its name). */
  if (r->gpu) fprintf(out, "on GPU    cuda:%d: %s\n", r->gpu->ordinal, r->gpu->info.name);
  fputc('\n', out);
  fputs("command   ", out);
  bench_print_command(out, r->opts, f);
  fprintf(out, "\nmachine   %ld cpus (%s), %s memory, %s\n", mc->nproc, mc->cpu[0] ? mc->cpu : "?",
          cli_fmt_bytes(mc->mem_bytes, b1, sizeof(b1)), mc->kernel);
  fprintf(out, "disk      %s on %s (%s at %s); O_DIRECT %s\n", mc->dir, mc->fs_type,
          mc->fs_device[0] ? mc->fs_device : "?", mc->fs_mount[0] ? mc->fs_mount : "?",
          r->raw_direct_write && r->raw_direct_read ? "accepted" : "refused (those ways ran buffered)");
  fputs("limits    raw write: the best in each run of", out);
  for (int w = 0; w < CLI_RAW_WRITE_WAYS; w++) fprintf(out, "%s %s", w ? ";" : "", cli_raw_write_way_name(w));
  fputs("\n          raw read: the best of", out);
  for (int w = 0; w < CLI_RAW_READ_WAYS; w++) fprintf(out, "%s %s", w ? ";" : "", cli_raw_read_way_name(w));
  fputs(" (the file dropped from the page cache before each)\n", out);
  char b4[32];
  fprintf(out, "options   threads %d, chunk %s, staging %s, snapshot memory %s, crc %s, fsync %s, direct %s, "
          "load %s, verify %s\n",
          f->threads, cli_fmt_bytes(f->chunk_bytes, b1, sizeof(b1)),
          cli_fmt_bytes(f->staging_bytes, b2, sizeof(b2)),
          f->snapshot_bytes ? cli_fmt_bytes(f->snapshot_bytes, b4, sizeof(b4)) : "none", f->crc ? "on" : "off",
          f->fsync ? "on" : "off", bench_direct_name(f->direct_io), bench_load_name(f->load_method),
          r->opts->verify ? "on (every byte compared, every CRC checked)" : "off");
  if (r->gpu)
    fprintf(out, "gpu       cuda:%d %s (PCI %s), runtime %s; %s\n", r->gpu->ordinal, r->gpu->info.name,
            r->gpu->info.pci_bus_id, r->gpu->info.runtime, r->numa && *r->numa ? r->numa : "NUMA: -");
  fprintf(out, "format    %s\n", bench_format_name(r->opts->format));
  fputs("model     ", out);
  model_line(out, r);
  fprintf(out, "\nfile      %" PRIu64 " bytes\n", r->file_bytes);
  if (r->opts->max_shard && r->runs_done)
    fprintf(out, "shards    %zu files of at most %s of tensors (--max-shard-size), written concurrently\n",
            r->runs[0].nshards, cli_fmt_bytes(r->opts->max_shard, b1, sizeof(b1)));
  fputc('\n', out);

  fprintf(out, "  %-30s %10s %10s %10s\n", "", "median", "min", "max");
  row(out, r, "save", "GB/s", S_SAVE);
  row(out, r, "raw write O_DIRECT 32x8M", "GB/s", S_RAW_WRITE_WAY + CLI_RAW_WRITE_DIRECT);
  row(out, r, "raw write buffered+sync", "GB/s", S_RAW_WRITE_WAY + CLI_RAW_WRITE_BUFFERED);
  row(out, r, "raw write (best)", "GB/s", S_RAW_WRITE);
  row(out, r, "save / raw write", "x", S_SAVE_RATIO);
  if (!r->load_skipped) row(out, r, "raw write, 2 MiB pages", "GB/s", S_THP_WRITE);
  row(out, r, "save time", "s", S_SAVE_S);
  row(out, r, "time to snapshot", "s", S_SNAPSHOT);
  row(out, r, r->gpu ? "copy limit (pinned D2H)" : "copy limit (memcpy)", "s", S_COPY_LIMIT);
  row(out, r, "snapshot / copy limit", "x", S_SNAPSHOT_RATIO);
  if (r->opts->max_shard && r->runs_done) {
    row(out, r, "sharded save", "GB/s", S_SHARD_SAVE);
    row(out, r, "sharded / single-file save", "x", S_SHARD_RATIO);
  }
  if (r->gpu) row(out, r, "pinned D2H (cudaMemcpy)", "GB/s", S_RAW_D2H);
  fputc('\n', out);
  if (r->load_skipped) {
    fprintf(out, "  loads skipped: %s\n", r->load_skipped);
  } else {
    row(out, r, "cold load (direct)", "GB/s", S_COLD);
    row(out, r, "raw read O_DIRECT 32x8M", "GB/s", S_RAW_READ_WAY + CLI_RAW_READ_DIRECT);
    row(out, r, "raw read buffered 1x1M", "GB/s", S_RAW_READ_WAY + CLI_RAW_READ_SEQ);
    row(out, r, "raw read buffered 16x8M", "GB/s", S_RAW_READ_WAY + CLI_RAW_READ_PAR);
    row(out, r, "raw read O_DIRECT 64x8M", "GB/s", S_RAW_READ_WAY + CLI_RAW_READ_DEEP);
    row(out, r, "raw read (best)", "GB/s", S_RAW_READ);
    row(out, r, "cold load / raw read", "x", S_COLD_RATIO);
    row(out, r, "raw read, 2 MiB pages", "GB/s", S_THP_READ);
    if (r->gpu) {
      row(out, r, "pinned H2D (cudaMemcpy)", "GB/s", S_RAW_H2D);
      row(out, r, "cold load / min(read, H2D)", "x", S_COLD_LIMIT_RATIO);
    }
    fputc('\n', out);
    char warm[48];
    snprintf(warm, sizeof(warm), "warm load (%s)", bench_load_name(f->load_method));
    row(out, r, warm, "GB/s", S_WARM);
    row(out, r, "memcpy (1 thread)", "GB/s", S_MEMCPY);
    row(out, r, "warm load / memcpy", "x", S_WARM_RATIO);
    if (r->gpu) row(out, r, "warm load / pinned H2D", "x", S_WARM_H2D_RATIO);
  }
  stage_table(out, r);
  uint64_t above = r->rss_peak > r->rss_baseline ? r->rss_peak - r->rss_baseline : 0;
  fprintf(out, "\npeak RSS  %s; %s above the model's tensors and load buffers (%s)\n",
          cli_fmt_bytes(r->rss_peak, b1, sizeof(b1)), cli_fmt_bytes(above, b2, sizeof(b2)),
          cli_fmt_bytes(r->rss_baseline, b3, sizeof(b3)));
  fprintf(out, "pinned    staging %s (ckptio_stats.staging_bytes)",
          cli_fmt_bytes(r->staging_peak, b1, sizeof(b1)));
  fputc('\n', out);
  /* The last run's: how much went straight between file and tensors. */
  const bench_run *last = &r->runs[r->opts->runs - 1];
  fprintf(out, "in place  save %.0f%%, cold load %.0f%% of the bytes with no staging copy "
          "(ckptio_stats.direct_bytes)\n", last->save.bytes ? 100.0 * last->save.direct_bytes / last->save.bytes : 0,
          last->cold.bytes ? 100.0 * last->cold.direct_bytes / last->cold.bytes : 0);
}

static void json_stat(FILE *out, const char *key, const bench_result *r, series k) {
  cli_stat s = stat_of(r, k);
  fprintf(out, ",\"%s\":{\"median\":%.6g,\"min\":%.6g,\"max\":%.6g}", key, s.median, s.min, s.max);
}

static void json_run_stats(FILE *out, const char *key, const ckptio_stats *st) {
  fprintf(out,
          ",\"%s\":{\"bytes\":%" PRIu64 ",\"seconds\":%.6f,\"snapshot_seconds\":%.6f,"
          "\"device_seconds\":%.6f,\"copy_seconds\":%.6f,\"write_seconds\":%.6f,"
          "\"commit_seconds\":%.6f,\"threads\":%d,\"staging_bytes\":%" PRIu64 ",\"direct_bytes\":%" PRIu64 "}",
          key, st->bytes, st->seconds, st->snapshot_seconds, st->device_seconds, st->copy_seconds,
          st->write_seconds, st->commit_seconds, st->threads, st->staging_bytes, st->direct_bytes);
}

/* ,"key":"value" with value escaped. */
static void json_str_field(FILE *out, const char *key, const char *value) {
  fprintf(out, ",\"%s\":", key);
  cli_json_string(out, value);
}

/* The JSON report's head: the command that reproduces it, the version,
 * the format and the device. */
static void json_head(FILE *out, const bench_result *r) {
  const ckptio_options *f = &r->ctx_opts;
  fputs("{\"command\":", out);
  char *cmd = NULL;
  size_t cmdlen = 0;
  FILE *mem = open_memstream(&cmd, &cmdlen);
  if (mem) {
    bench_print_command(mem, r->opts, f);
    fclose(mem);
  }
  cli_json_string(out, cmd ? cmd : "");
  free(cmd);
  fprintf(out, ",\"version\":\"%s\",\"format\":\"%s\"", ckptio_version_string(),
          bench_format_name(r->opts->format));
  if (r->gpu) {
    fprintf(out, ",\"device\":\"cuda:%d\"", r->gpu->ordinal);
    json_str_field(out, "cuda_runtime", r->gpu->info.runtime);
    json_str_field(out, "gpu_name", r->gpu->info.name);
    json_str_field(out, "pci_bus_id", r->gpu->info.pci_bus_id);
  } else {
    fputs(",\"device\":\"host\"", out);
  }
  if (r->load_skipped) json_str_field(out, "loads_skipped", r->load_skipped);
}

static void json_machine(FILE *out, const cli_machine *mc) {
  fprintf(out, ",\"machine\":{\"nproc\":%ld,\"mem_bytes\":%" PRIu64, mc->nproc, mc->mem_bytes);
  json_str_field(out, "cpu", mc->cpu);
  json_str_field(out, "kernel", mc->kernel);
  json_str_field(out, "dir", mc->dir);
  json_str_field(out, "fs_type", mc->fs_type);
  json_str_field(out, "fs_device", mc->fs_device);
  json_str_field(out, "fs_mount", mc->fs_mount);
  fputc('}', out);
}

/* The options in force, the model and the raw limits' setup. */
static void json_setup(FILE *out, const bench_result *r) {
  const cli_model *m = r->model;
  const ckptio_options *f = &r->ctx_opts;
  fprintf(out,
          ",\"options\":{\"shapes\":\"%s\",\"runs\":%d,\"threads\":%d,\"chunk_bytes\":%zu,"
          "\"staging_bytes\":%zu,\"crc\":%s,\"fsync\":%s,\"direct\":\"%s\",\"load\":\"%s\","
          "\"verify\":%s,\"snapshot_bytes\":%zu}",
          bench_shapes_name(m->shapes), r->opts->runs, f->threads, f->chunk_bytes,
          f->staging_bytes, f->crc ? "true" : "false", f->fsync ? "true" : "false",
          bench_direct_name(f->direct_io), bench_load_name(f->load_method),
          r->opts->verify ? "true" : "false", f->snapshot_bytes);
  fprintf(out, ",\"model\":{\"tensors\":%zu,\"bytes\":%" PRIu64 ",\"file_bytes\":%" PRIu64,
          m->count, m->tensor_bytes, r->file_bytes);
  if (m->shapes == CLI_SHAPES_LLM)
    fprintf(out, ",\"hidden\":%d,\"layers\":%d,\"vocab\":%d,\"inter\":%d}", m->hidden, m->layers,
            m->vocab, m->inter);
  else
    fprintf(out, ",\"linear_dim\":%d}", m->linear_dim);
  fprintf(out,
          ",\"raw\":{\"bytes\":%" PRIu64 ",\"block_bytes\":%u,\"in_flight\":%d,"
          "\"direct_write\":%s,\"direct_read\":%s",
          r->raw_bytes, CLI_RAW_BLOCK, CLI_RAW_DEPTH, r->raw_direct_write ? "true" : "false",
          r->raw_direct_read ? "true" : "false");
  /* The ways each run's raw_write_ways_s / raw_read_ways_s are in. */
  fputs(",\"write_ways\":[", out);
  for (int w = 0; w < CLI_RAW_WRITE_WAYS; w++) {
    if (w) fputc(',', out);
    cli_json_string(out, cli_raw_write_way_name(w));
  }
  fputs("],\"read_ways\":[", out);
  for (int w = 0; w < CLI_RAW_READ_WAYS; w++) {
    if (w) fputc(',', out);
    cli_json_string(out, cli_raw_read_way_name(w));
  }
  fputs("]}", out);
}

/* Every run's times and the library's stats of its save and loads. */
static void json_runs(FILE *out, const bench_result *r) {
  fputs(",\"runs\":[", out);
  for (int i = 0; i < r->runs_done; i++) {
    const bench_run *x = &r->runs[i];
    fprintf(out,
            "%s{\"save_s\":%.6f,\"snapshot_s\":%.6f,\"raw_write_s\":%.6f,\"cold_load_s\":%.6f,"
            "\"raw_read_s\":%.6f,\"warm_load_s\":%.6f,\"memcpy_s\":%.6f",
            i ? "," : "", x->save_s, x->snapshot_s, x->raw_write_s, x->cold_s, x->raw_read_s,
            x->warm_s, x->memcpy_s);
    fputs(",\"raw_write_ways_s\":[", out);
    for (int w = 0; w < CLI_RAW_WRITE_WAYS; w++) fprintf(out, "%s%.6f", w ? "," : "", x->raw_write_ways_s[w]);
    fputs("],\"raw_read_ways_s\":[", out);
    for (int w = 0; w < CLI_RAW_READ_WAYS; w++) fprintf(out, "%s%.6f", w ? "," : "", x->raw_read_ways_s[w]);
    fputc(']', out);
    if (r->gpu) fprintf(out, ",\"raw_d2h_s\":%.6f,\"raw_h2d_s\":%.6f", x->raw_d2h_s, x->raw_h2d_s);
    json_run_stats(out, "save_stats", &x->save);
    if (!r->load_skipped) {
      json_run_stats(out, "cold_load_stats", &x->cold);
      json_run_stats(out, "warm_load_stats", &x->warm);
    }
    fputc('}', out);
  }
  fputc(']', out);
}

/* Median, min and max of each rate and ratio over the runs; staging and
 * memory. */
static void json_figures(FILE *out, const bench_result *r) {
  json_stat(out, "save_gbps", r, S_SAVE);
  json_stat(out, "raw_write_gbps", r, S_RAW_WRITE);
  json_stat(out, "raw_write_direct_gbps", r, S_RAW_WRITE_WAY + CLI_RAW_WRITE_DIRECT);
  json_stat(out, "raw_write_buffered_gbps", r, S_RAW_WRITE_WAY + CLI_RAW_WRITE_BUFFERED);
  json_stat(out, "save_vs_raw_write", r, S_SAVE_RATIO);
  json_stat(out, "save_s", r, S_SAVE_S);
  if (r->opts->max_shard) {
    json_stat(out, "sharded_save_gbps", r, S_SHARD_SAVE);
    json_stat(out, "sharded_vs_single_save", r, S_SHARD_RATIO);
    fprintf(out, ",\"shards\":%zu", r->runs_done ? r->runs[0].nshards : (size_t)0);
  }
  json_stat(out, "snapshot_s", r, S_SNAPSHOT);
  json_stat(out, "copy_limit_s", r, S_COPY_LIMIT);
  json_stat(out, "snapshot_vs_copy_limit", r, S_SNAPSHOT_RATIO);
  if (!r->load_skipped) {
    json_stat(out, "cold_load_gbps", r, S_COLD);
    json_stat(out, "raw_read_gbps", r, S_RAW_READ);
    json_stat(out, "raw_read_direct_gbps", r, S_RAW_READ_WAY + CLI_RAW_READ_DIRECT);
    json_stat(out, "raw_read_seq_gbps", r, S_RAW_READ_WAY + CLI_RAW_READ_SEQ);
    json_stat(out, "raw_read_par_gbps", r, S_RAW_READ_WAY + CLI_RAW_READ_PAR);
    json_stat(out, "raw_read_deep_gbps", r, S_RAW_READ_WAY + CLI_RAW_READ_DEEP);
    json_stat(out, "cold_load_vs_raw_read", r, S_COLD_RATIO);
    json_stat(out, "raw_write_thp_gbps", r, S_THP_WRITE);
    json_stat(out, "raw_read_thp_gbps", r, S_THP_READ);
    json_stat(out, "warm_load_gbps", r, S_WARM);
    json_stat(out, "warm_load_vs_memcpy", r, S_WARM_RATIO);
  }
  json_stat(out, "memcpy_gbps", r, S_MEMCPY);
  if (r->gpu) {
    json_stat(out, "raw_d2h_gbps", r, S_RAW_D2H);
    json_stat(out, "raw_h2d_gbps", r, S_RAW_H2D);
    if (!r->load_skipped) json_stat(out, "warm_load_vs_raw_h2d", r, S_WARM_H2D_RATIO);
    if (!r->load_skipped) json_stat(out, "cold_load_vs_slower_limit", r, S_COLD_LIMIT_RATIO);
  }
  fprintf(out, ",\"staging_bytes\":%" PRIu64, r->staging_peak);
  uint64_t above = r->rss_peak > r->rss_baseline ? r->rss_peak - r->rss_baseline : 0;
  fprintf(out,
          ",\"peak_rss_bytes\":%" PRIu64 ",\"rss_baseline_bytes\":%" PRIu64
          ",\"rss_above_model_bytes\":%" PRIu64 "}\n",
          r->rss_peak, r->rss_baseline, above);
}

void bench_report_json(FILE *out, const bench_result *r) {
  json_head(out, r);
  json_machine(out, r->machine);
  json_setup(out, r);
  json_runs(out, r);
  json_figures(out, r);
}
