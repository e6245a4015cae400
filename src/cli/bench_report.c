/*
 * The report of `ckptio bench`: how to reproduce it, the machine, the
 * options, then median and min-max of each rate and of each ratio to the raw
 * limit measured in the same run. Ratios are taken per run (the pair ran
 * side by side) before the median, so drift between runs cancels.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench.h"

typedef enum series {
  S_SAVE, S_RAW_WRITE, S_SAVE_RATIO, S_SNAPSHOT, S_SAVE_S,
  S_COLD, S_RAW_READ, S_COLD_RATIO,
  S_WARM, S_MEMCPY, S_WARM_RATIO,
  S_COUNT
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
    case S_COLD: return gbps(data, x->cold_s);
    case S_RAW_READ: return gbps(raw, x->raw_read_s);
    case S_COLD_RATIO: return gbps(data, x->cold_s) / gbps(raw, x->raw_read_s);
    case S_WARM: return gbps(data, x->warm_s);
    case S_MEMCPY: return gbps(raw, x->memcpy_s);
    case S_WARM_RATIO: return gbps(data, x->warm_s) / gbps(raw, x->memcpy_s);
    default: return 0;
  }
}

static cli_stat stat_of(const bench_result *r, series k) {
  double v[1000];
  size_t n = 0;
  for (int i = 0; i < r->runs_done && n < 1000; i++) v[n++] = value(r, &r->runs[i], k);
  return cli_stat_of(v, n);
}

void bench_print_command(FILE *out, const bench_opts *o, const ckptio_options *f) {
  cli_shell_word(out, o->argv0);
  fputs(" bench", out);
  if (o->size_given || o->shapes == CLI_SHAPES_LLM) {
    fputs(" --size ", out);
    cli_shell_word(out, o->size_str);
  }
  fprintf(out, " --shapes %s --dir ", bench_shapes_name(o->shapes));
  cli_shell_word(out, o->dir);
  fprintf(out, " --runs %d --threads %d --chunk %zu --staging %zu%s%s --direct %s --load %s%s",
          o->runs, f->threads, f->chunk_bytes, f->staging_bytes, f->crc ? "" : " --no-crc",
          f->fsync ? "" : " --no-fsync", bench_direct_name(f->direct_io),
          bench_load_name(f->load_method), o->verify ? " --verify" : "");
  if (o->keep) {
    fputs(" --keep ", out);
    cli_shell_word(out, o->keep);
  }
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
  fprintf(out, "ckptio %s bench: %d run%s, each step next to its raw limit (A B A B)\n\n",
          ckptio_version_string(), r->runs_done, r->runs_done == 1 ? "" : "s");
  fputs("command   ", out);
  bench_print_command(out, r->opts, f);
  fprintf(out, "\nmachine   %ld cpus (%s), %s memory, %s\n", mc->nproc, mc->cpu[0] ? mc->cpu : "?",
          cli_fmt_bytes(mc->mem_bytes, b1, sizeof(b1)), mc->kernel);
  fprintf(out, "disk      %s on %s (%s at %s); raw write %s, raw read %s, %d x %u MiB in flight\n",
          mc->dir, mc->fs_type, mc->fs_device[0] ? mc->fs_device : "?",
          mc->fs_mount[0] ? mc->fs_mount : "?", r->raw_direct_write ? "O_DIRECT" : "buffered",
          r->raw_direct_read ? "O_DIRECT" : "buffered", CLI_RAW_DEPTH, CLI_RAW_BLOCK >> 20);
  fprintf(out, "options   threads %d, chunk %s, staging %s, crc %s, fsync %s, direct %s, load %s, "
          "verify %s\n",
          f->threads, cli_fmt_bytes(f->chunk_bytes, b1, sizeof(b1)),
          cli_fmt_bytes(f->staging_bytes, b2, sizeof(b2)), f->crc ? "on" : "off",
          f->fsync ? "on" : "off", bench_direct_name(f->direct_io), bench_load_name(f->load_method),
          r->opts->verify ? "on (every byte compared, every CRC checked)" : "off");
  fputs("model     ", out);
  model_line(out, r);
  fprintf(out, "\nfile      %" PRIu64 " bytes\n\n", r->file_bytes);

  fprintf(out, "  %-30s %10s %10s %10s\n", "", "median", "min", "max");
  row(out, r, "save", "GB/s", S_SAVE);
  row(out, r, "raw O_DIRECT write", "GB/s", S_RAW_WRITE);
  row(out, r, "save / raw write", "x", S_SAVE_RATIO);
  row(out, r, "save time", "s", S_SAVE_S);
  row(out, r, "time to snapshot", "s", S_SNAPSHOT);
  fputc('\n', out);
  row(out, r, "cold load (direct)", "GB/s", S_COLD);
  row(out, r, "raw O_DIRECT read", "GB/s", S_RAW_READ);
  row(out, r, "cold load / raw read", "x", S_COLD_RATIO);
  fputc('\n', out);
  char warm[48];
  snprintf(warm, sizeof(warm), "warm load (%s)", bench_load_name(f->load_method));
  row(out, r, warm, "GB/s", S_WARM);
  row(out, r, "memcpy (1 thread)", "GB/s", S_MEMCPY);
  row(out, r, "warm load / memcpy", "x", S_WARM_RATIO);
  uint64_t above = r->rss_peak > r->rss_baseline ? r->rss_peak - r->rss_baseline : 0;
  fprintf(out, "\npeak RSS  %s; %s above the model's tensors and load buffers (%s)\n",
          cli_fmt_bytes(r->rss_peak, b1, sizeof(b1)), cli_fmt_bytes(above, b2, sizeof(b2)),
          cli_fmt_bytes(r->rss_baseline, b3, sizeof(b3)));
}

static void json_stat(FILE *out, const char *key, const bench_result *r, series k) {
  cli_stat s = stat_of(r, k);
  fprintf(out, ",\"%s\":{\"median\":%.6g,\"min\":%.6g,\"max\":%.6g}", key, s.median, s.min, s.max);
}

void bench_report_json(FILE *out, const bench_result *r) {
  const cli_machine *mc = r->machine;
  const cli_model *m = r->model;
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
  fprintf(out, ",\"version\":\"%s\"", ckptio_version_string());
  fprintf(out, ",\"machine\":{\"nproc\":%ld,\"mem_bytes\":%" PRIu64 ",\"cpu\":", mc->nproc,
          mc->mem_bytes);
  cli_json_string(out, mc->cpu);
  fputs(",\"kernel\":", out);
  cli_json_string(out, mc->kernel);
  fputs(",\"dir\":", out);
  cli_json_string(out, mc->dir);
  fputs(",\"fs_type\":", out);
  cli_json_string(out, mc->fs_type);
  fputs(",\"fs_device\":", out);
  cli_json_string(out, mc->fs_device);
  fputs(",\"fs_mount\":", out);
  cli_json_string(out, mc->fs_mount);
  fprintf(out,
          "},\"options\":{\"shapes\":\"%s\",\"runs\":%d,\"threads\":%d,\"chunk_bytes\":%zu,"
          "\"staging_bytes\":%zu,\"crc\":%s,\"fsync\":%s,\"direct\":\"%s\",\"load\":\"%s\","
          "\"verify\":%s}",
          bench_shapes_name(m->shapes), r->opts->runs, f->threads, f->chunk_bytes,
          f->staging_bytes, f->crc ? "true" : "false", f->fsync ? "true" : "false",
          bench_direct_name(f->direct_io), bench_load_name(f->load_method),
          r->opts->verify ? "true" : "false");
  fprintf(out, ",\"model\":{\"tensors\":%zu,\"bytes\":%" PRIu64 ",\"file_bytes\":%" PRIu64,
          m->count, m->tensor_bytes, r->file_bytes);
  if (m->shapes == CLI_SHAPES_LLM)
    fprintf(out, ",\"hidden\":%d,\"layers\":%d,\"vocab\":%d,\"inter\":%d}", m->hidden, m->layers,
            m->vocab, m->inter);
  else
    fprintf(out, ",\"linear_dim\":%d}", m->linear_dim);
  fprintf(out,
          ",\"raw\":{\"bytes\":%" PRIu64 ",\"block_bytes\":%u,\"in_flight\":%d,"
          "\"direct_write\":%s,\"direct_read\":%s}",
          r->raw_bytes, CLI_RAW_BLOCK, CLI_RAW_DEPTH, r->raw_direct_write ? "true" : "false",
          r->raw_direct_read ? "true" : "false");
  fputs(",\"runs\":[", out);
  for (int i = 0; i < r->runs_done; i++) {
    const bench_run *x = &r->runs[i];
    fprintf(out,
            "%s{\"save_s\":%.6f,\"snapshot_s\":%.6f,\"raw_write_s\":%.6f,\"cold_load_s\":%.6f,"
            "\"raw_read_s\":%.6f,\"warm_load_s\":%.6f,\"memcpy_s\":%.6f}",
            i ? "," : "", x->save_s, x->snapshot_s, x->raw_write_s, x->cold_s, x->raw_read_s,
            x->warm_s, x->memcpy_s);
  }
  fputc(']', out);
  json_stat(out, "save_gbps", r, S_SAVE);
  json_stat(out, "raw_write_gbps", r, S_RAW_WRITE);
  json_stat(out, "save_vs_raw_write", r, S_SAVE_RATIO);
  json_stat(out, "save_s", r, S_SAVE_S);
  json_stat(out, "snapshot_s", r, S_SNAPSHOT);
  json_stat(out, "cold_load_gbps", r, S_COLD);
  json_stat(out, "raw_read_gbps", r, S_RAW_READ);
  json_stat(out, "cold_load_vs_raw_read", r, S_COLD_RATIO);
  json_stat(out, "warm_load_gbps", r, S_WARM);
  json_stat(out, "memcpy_gbps", r, S_MEMCPY);
  json_stat(out, "warm_load_vs_memcpy", r, S_WARM_RATIO);
  uint64_t above = r->rss_peak > r->rss_baseline ? r->rss_peak - r->rss_baseline : 0;
  fprintf(out,
          ",\"peak_rss_bytes\":%" PRIu64 ",\"rss_baseline_bytes\":%" PRIu64
          ",\"rss_above_model_bytes\":%" PRIu64 "}\n",
          r->rss_peak, r->rss_baseline, above);
}
