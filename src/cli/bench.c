/*
 * `ckptio bench`: saves and loads a synthetic model through one context and,
 * in the same run, interleaved A B A B, measures the raw limits of the same
 * disk and memory (and, with --device cuda:N, of the GPU's copy engines), so
 * the report can give ratios that survive the drift of a shared machine.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <libgen.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/bench.h"

#define ALIGN 4096ull

void cli_bench_usage(FILE *out) {
  fprintf(out,
          "usage: ckptio bench [options]\n\n"
          "Builds a synthetic model in memory, then for each run saves it (timed, with\n"
          "the time to the snapshot point), writes the same bytes with raw O_DIRECT\n"
          "(32 x 8 MiB in flight, then fdatasync), loads it cold (page cache dropped,\n"
          "CKPTIO_LOAD_DIRECT), reads it raw with O_DIRECT, loads it warm (file in the\n"
          "page cache) and memcpys the same bytes. Reports median and min-max of GB/s\n"
          "and of each ratio to its raw limit, plus time to snapshot and peak RSS.\n\n"
          "  --size BYTES        model size, e.g. 1GiB, 512MiB, 2G, 4096 (default 1GiB;\n"
          "                      linear without --size: 10 x Linear(10000, 10000), 4 GB)\n"
          "  --shapes llm|linear llm: Llama-like bf16 layers scaled to --size (default);\n"
          "                      linear: 10 x Linear(d, d) fp32 weights + bias [d]\n"
          "  --dir DIR           where the files go (default: the --keep directory, or .);\n"
          "                      or a storage's prefix, s3://bucket/prefix: the save and\n"
          "                      both loads go through the object storage, next to its own\n"
          "                      limits (a plain multipart upload, parallel ranged GETs)\n"
          "  --keep PATH         leave the last checkpoint written at PATH\n"
          "  --runs N            runs (default 3)\n"
          "  --threads N         library worker threads (default: library's)\n"
          "  --chunk BYTES       pipeline chunk (default: library's)\n"
          "  --staging BYTES     staging ring size (default: library's)\n"
          "  --no-crc            no CRC32 on save or load\n"
          "  --no-fsync          no fdatasync / directory fsync on commit\n"
          "  --direct auto|on|off  O_DIRECT for the save's writes (default auto)\n"
          "  --load auto|pread|mmap|direct  method of the warm load (default auto)\n"
          "  --verify            compare every loaded byte and check every CRC32\n"
          "  --format safetensors|pt  file format (default safetensors; pt: torch.save zip)\n"
          "  --device host|cuda:N  where the tensors live (default host). cuda:N: the model\n"
          "                      is uploaded to GPU N, saved from it and loaded back onto it\n"
          "                      (--verify downloads and compares); adds the pinned\n"
          "                      cudaMemcpy D2H and H2D limits of the same byte count\n"
          "  --snapshot-bytes BYTES|auto  snapshot memory (pinned, beyond --staging): a\n"
          "                      save that fits is snapshotted after its copies alone;\n"
          "                      reports the time to snapshot next to the copy limit\n"
          "  --max-shard-size BYTES  also save the model as a Hugging Face sharded set\n"
          "                      (shards of at most BYTES, written concurrently) right\n"
          "                      after each single-file save; reports both side by side\n"
          "  --json              one JSON object on stdout instead of the table\n"
          "  --trace FILE        write the library's stages of every save and load, per\n"
          "                      thread, to FILE in the Chrome trace-event format (open\n"
          "                      it in ui.perfetto.dev or chrome://tracing)\n\n"
          "The report breaks each save and load into the library's stages (device copy,\n"
          "copy + CRC, write, commit; read, host to device) from ckptio_*_stats.\n\n"
          "exit codes: 0 ok; 1 loaded data differ (--verify); 2 usage or I/O error, or\n"
          "CUDA unavailable with --device cuda:N\n");
}

/* ------------------------------------------------------------ cleanup */

/* The two scratch files, unlinked on any exit, including Ctrl-C. */
static char g_ckpt[4200], g_raw[4200], g_shards[4200];
/* A signal during a save waits for its end: the library's temp file is only
 * removed by the library, and a killed save would leave it behind. */
static volatile sig_atomic_t g_in_save, g_pending, g_tty;

/* The sharded save's directory and what is in it. Not async-signal-safe
 * (opendir), but a signal during a save is deferred to its end. */
static void remove_shards(void) {
  DIR *d = g_shards[0] ? opendir(g_shards) : NULL;
  struct dirent *e;
  char p[4600];
  while (d && (e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
      snprintf(p, sizeof(p), "%s/%s", g_shards, e->d_name);
      unlink(p);
    }
  if (d) closedir(d);
  if (g_shards[0]) rmdir(g_shards);
}

static void remove_scratch(void) {
  if (g_ckpt[0]) unlink(g_ckpt);
  if (g_raw[0]) unlink(g_raw);
  remove_shards();
}

static void die_by(int sig) {
  remove_scratch(); /* unlink is async-signal-safe */
  signal(sig, SIG_DFL);
  raise(sig);
}

static void on_signal(int sig) {
  if (g_in_save && !g_pending) {
    static const char kMsg[] = "\nckptio bench: interrupted; stopping when this save ends "
                               "(again to stop now)\n";
    g_pending = sig;
    if (g_tty) {
      ssize_t ignored = write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
      (void)ignored;
    }
    return;
  }
  die_by(sig);
}

void bench_catch_signals(void (*handler)(int)) {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = handler;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
}

static void install_cleanup(void) {
  bench_catch_signals(on_signal);
  g_tty = isatty(STDERR_FILENO);
}

/* --keep on another filesystem: rename cannot cross, so copy. */
static int copy_file(const char *from, const char *to) {
  int in = open(from, O_RDONLY | O_CLOEXEC), out = -1, rc = 0;
  char *buf = malloc(8u << 20);
  if (in < 0 || !buf) {
    rc = in < 0 ? -errno : -ENOMEM;
    goto fail;
  }
  if ((out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) {
    rc = -errno;
    goto fail;
  }
  for (;;) {
    ssize_t r = read(in, buf, 8u << 20);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) rc = -errno;
    if (r <= 0) break;
    for (ssize_t w = 0; w < r;) {
      ssize_t k = write(out, buf + w, (size_t)(r - w));
      if (k < 0 && errno == EINTR) continue;
      if (k < 0) {
        rc = -errno;
        goto fail;
      }
      w += k;
    }
  }
  if (!rc && fsync(out) != 0) rc = -errno;
fail:
  if (out >= 0 && close(out) != 0 && !rc) rc = -errno;
  if (in >= 0) close(in);
  free(buf);
  return rc;
}

/* ------------------------------------------------------------ options */

const char *bench_load_name(ckptio_load_method m) {
  switch (m) {
    case CKPTIO_LOAD_PREAD: return "pread";
    case CKPTIO_LOAD_MMAP: return "mmap";
    case CKPTIO_LOAD_DIRECT: return "direct";
    default: return "auto";
  }
}

const char *bench_direct_name(int direct) {
  return direct == CKPTIO_AUTO ? "auto" : direct ? "on" : "off";
}

const char *bench_shapes_name(cli_shapes s) { return s == CLI_SHAPES_LLM ? "llm" : "linear"; }

const char *bench_format_name(ckptio_format f) { return f == CKPTIO_FORMAT_PYTORCH ? "pt" : "safetensors"; }

/* "host" / "cpu" is the host, "cuda" GPU 0, "cuda:N" GPU N. */
static int parse_device(const char *s, int *gpu) {
  if (!strcmp(s, "host") || !strcmp(s, "cpu")) {
    *gpu = -1;
    return 0;
  }
  if (!strcmp(s, "cuda")) {
    *gpu = 0;
    return 0;
  }
  return strncmp(s, "cuda:", 5) || cli_parse_int(s + 5, gpu) < 0 || *gpu > 1023 ? -1 : 0;
}

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "ckptio bench: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n(ckptio bench --help lists the options)\n");
  return CLI_EXIT_USAGE;
}

static int parse_opts(int argc, char **argv, bench_opts *o) {
  enum { OPT_SIZE = 256, OPT_SHAPES, OPT_DIR, OPT_KEEP, OPT_RUNS, OPT_THREADS, OPT_CHUNK, OPT_STAGING,
         OPT_NOCRC, OPT_NOFSYNC, OPT_DIRECT, OPT_LOAD, OPT_VERIFY, OPT_JSON, OPT_FORMAT,
         OPT_DEVICE, OPT_MAX_SHARD, OPT_SNAPSHOT, OPT_TRACE };
  static const struct option kLong[] = {
      {"size", required_argument, 0, OPT_SIZE},       {"shapes", required_argument, 0, OPT_SHAPES},
      {"dir", required_argument, 0, OPT_DIR},         {"keep", required_argument, 0, OPT_KEEP},
      {"runs", required_argument, 0, OPT_RUNS},       {"threads", required_argument, 0, OPT_THREADS},
      {"chunk", required_argument, 0, OPT_CHUNK},     {"staging", required_argument, 0, OPT_STAGING},
      {"no-crc", no_argument, 0, OPT_NOCRC},          {"no-fsync", no_argument, 0, OPT_NOFSYNC},
      {"direct", required_argument, 0, OPT_DIRECT},   {"load", required_argument, 0, OPT_LOAD},
      {"verify", no_argument, 0, OPT_VERIFY},         {"json", no_argument, 0, OPT_JSON},
      {"format", required_argument, 0, OPT_FORMAT},   {"device", required_argument, 0, OPT_DEVICE},
      {"max-shard-size", required_argument, 0, OPT_MAX_SHARD},
      {"snapshot-bytes", required_argument, 0, OPT_SNAPSHOT},
      {"trace", required_argument, 0, OPT_TRACE},
      {0, 0, 0, 0},
  };
  memset(o, 0, sizeof(*o));
  o->argv0 = "ckptio";
  o->size_str = "1GiB";
  o->size = 1ull << 30;
  o->runs = 3;
  o->crc = 1;
  o->fsync = 1;
  o->direct = CKPTIO_AUTO;
  o->load = CKPTIO_LOAD_AUTO;
  o->gpu = -1;
  o->format = CKPTIO_FORMAT_SAFETENSORS;
  opterr = 0;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "", kLong, NULL)) != -1) {
    switch (c) {
      case OPT_TRACE:
        o->trace = optarg;
        break;
      case OPT_SNAPSHOT: {
        uint64_t v = 0;
        if (!strcmp(optarg, "auto")) o->snapshot = CKPTIO_SNAPSHOT_AUTO;
        else if (cli_parse_size(optarg, &v) < 0) return usage_error("bad --snapshot-bytes '%s' (e.g. 4GiB, auto)", optarg);
        else o->snapshot = (size_t)v;
        break;
      }
      case OPT_MAX_SHARD:
        if (cli_parse_size(optarg, &o->max_shard) < 0 || !o->max_shard)
          return usage_error("bad --max-shard-size '%s' (e.g. 2GiB, 500MB)", optarg);
        break;
      case OPT_SIZE:
        if (cli_parse_size(optarg, &o->size) < 0 || !o->size)
          return usage_error("bad --size '%s' (e.g. 1GiB, 512MiB, 2G, 4096)", optarg);
        o->size_str = optarg;
        o->size_given = 1;
        break;
      case OPT_SHAPES:
        if (!strcmp(optarg, "llm"))
          o->shapes = CLI_SHAPES_LLM;
        else if (!strcmp(optarg, "linear"))
          o->shapes = CLI_SHAPES_LINEAR;
        else
          return usage_error("bad --shapes '%s' (llm or linear)", optarg);
        break;
      case OPT_DIR: o->dir = optarg; break;
      case OPT_KEEP: o->keep = optarg; break;
      case OPT_RUNS:
        if (cli_parse_int(optarg, &o->runs) < 0 || o->runs < 1 || o->runs > 1000)
          return usage_error("bad --runs '%s' (1 to 1000)", optarg);
        break;
      case OPT_THREADS:
        if (cli_parse_int(optarg, &o->threads) < 0 || o->threads < 1 || o->threads > 1024)
          return usage_error("bad --threads '%s' (1 to 1024)", optarg);
        break;
      case OPT_CHUNK:
        if (cli_parse_size(optarg, &o->chunk) < 0 || !o->chunk)
          return usage_error("bad --chunk '%s'", optarg);
        break;
      case OPT_STAGING:
        if (cli_parse_size(optarg, &o->staging) < 0 || !o->staging)
          return usage_error("bad --staging '%s'", optarg);
        break;
      case OPT_NOCRC: o->crc = 0; break;
      case OPT_NOFSYNC: o->fsync = 0; break;
      case OPT_DIRECT:
        if (!strcmp(optarg, "auto"))
          o->direct = CKPTIO_AUTO;
        else if (!strcmp(optarg, "on"))
          o->direct = 1;
        else if (!strcmp(optarg, "off"))
          o->direct = 0;
        else
          return usage_error("bad --direct '%s' (auto, on or off)", optarg);
        break;
      case OPT_LOAD:
        if (!strcmp(optarg, "auto"))
          o->load = CKPTIO_LOAD_AUTO;
        else if (!strcmp(optarg, "pread"))
          o->load = CKPTIO_LOAD_PREAD;
        else if (!strcmp(optarg, "mmap"))
          o->load = CKPTIO_LOAD_MMAP;
        else if (!strcmp(optarg, "direct"))
          o->load = CKPTIO_LOAD_DIRECT;
        else
          return usage_error("bad --load '%s' (auto, pread, mmap or direct)", optarg);
        break;
      case OPT_VERIFY: o->verify = 1; break;
      case OPT_JSON: o->json = 1; break;
      case OPT_FORMAT:
        if (!strcmp(optarg, "safetensors"))
          o->format = CKPTIO_FORMAT_SAFETENSORS;
        else if (!strcmp(optarg, "pt") || !strcmp(optarg, "pytorch"))
          o->format = CKPTIO_FORMAT_PYTORCH;
        else
          return usage_error("bad --format '%s' (safetensors or pt)", optarg);
        break;
      case OPT_DEVICE:
        if (parse_device(optarg, &o->gpu) < 0)
          return usage_error("bad --device '%s' (host, cuda or cuda:N)", optarg);
        break;
      default:
        return usage_error("unknown or incomplete option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc) return usage_error("unexpected argument '%s'", argv[optind]);
  return 0;
}

/* ------------------------------------------------------------ one run */

typedef struct bench_state {
  bench_opts *o;
  cli_model *m;
  ckptio_ctx *ctx;
  uint8_t *dst;          /* load destinations (host), or the downloads of a GPU load */
  ckptio_load_request *reqs;
  uint64_t raw_bytes;
  int run;
  bench_gpu *gpu;        /* --device cuda:N, else NULL */
  const char *load_skipped; /* set when the reader refuses the format: loads are skipped */
} bench_state;

/* The library's detail names the file and the rule; the bare error name is
 * the fallback when it has none. */
static int fail_msg(const char *step, int rc, const char *detail) {
  fprintf(stderr, "ckptio bench: %s: %s\n", step, detail && *detail ? detail : ckptio_strerror(rc));
  return rc;
}

int bench_save_model(ckptio_ctx *ctx, const char *path, ckptio_format format, const cli_model *m, int run,
                     double *snapshot_s, double *save_s, ckptio_stats *stats) {
  ckptio_writer *w = NULL;
  cli_progress bar = {0};
  char label[32], runs[16];
  snprintf(label, sizeof(label), "run %d save", run + 1);
  snprintf(runs, sizeof(runs), "%d", run + 1);
  double t0 = cli_now();
  int rc = ckptio_writer_open(ctx, path, format, NULL, &w);
  if (rc < 0) return fail_msg("save: open", rc, cli_open_error(rc));
  if ((rc = ckptio_writer_set_metadata(w, "bench.shapes", bench_shapes_name(m->shapes))) < 0 ||
      (rc = ckptio_writer_set_metadata(w, "bench.run", runs)) < 0)
    goto out;
  for (size_t i = 0; i < m->count && rc == 0; i++) rc = ckptio_writer_add(w, &m->tensors[i]);
  if (rc == 0) rc = ckptio_writer_commit_async(w);
  if (rc < 0) goto out;
  cli_progress_start(&bar, label, cli_progress_writer, w);
  rc = ckptio_writer_wait_snapshot(w);
  *snapshot_s = cli_now() - t0;
  if (rc >= 0) rc = ckptio_writer_wait_durable(w);
  *save_s = cli_now() - t0;
  cli_progress_stop(&bar);
  stats->size = sizeof(*stats);
  ckptio_writer_stats(w, stats);
out:
  if (rc < 0) fail_msg("save", rc, ckptio_writer_last_error(w));
  int rc2 = ckptio_writer_close(w);
  return rc < 0 ? rc : rc2 < 0 ? fail_msg("save: close", rc2, NULL) : 0;
}

static int bench_save(bench_state *s, bench_run *out) {
  unlink(g_ckpt); /* every save makes a new file, as the raw write does */
  return bench_save_model(s->ctx, g_ckpt, s->o->format, s->m, s->run, &out->snapshot_s, &out->save_s, &out->save);
}

/* The same model as a sharded set (--max-shard-size), timed like the
 * single-file save: open to durable, index included. */
static int bench_shard_save(bench_state *s, bench_run *out) {
  ckptio_writer *w = NULL;
  remove_shards(); /* every save makes new files */
  if (mkdir(g_shards, 0777) < 0) return fail_msg("sharded save: mkdir", -errno, g_shards);
  double t0 = cli_now();
  int rc = ckptio_writer_open_sharded(s->ctx, g_shards, "model", CKPTIO_FORMAT_SAFETENSORS, s->o->max_shard,
                                      CKPTIO_SHARD_ORDER_ADDED, NULL, &w);
  if (rc < 0) return fail_msg("sharded save: open", rc, cli_open_error(rc));
  for (size_t i = 0; i < s->m->count && rc == 0; i++) rc = ckptio_writer_add(w, &s->m->tensors[i]);
  if (rc == 0) rc = ckptio_writer_commit(w);
  out->shard_save_s = cli_now() - t0;
  out->nshards = ckptio_writer_shard_count(w);
  if (rc < 0) fail_msg("sharded save", rc, ckptio_writer_last_error(w));
  int rc2 = ckptio_writer_close(w);
  return rc < 0 ? rc : rc2;
}

/* Every byte as saved? Names the first tensor that differs. A GPU load is
 * downloaded into s->dst first. */
static int compare(bench_state *s, const char *what) {
  int rc;
  if (s->gpu && (rc = bench_gpu_copy(s->gpu, s->dst, s->gpu->dst, s->m->arena_bytes, 0, NULL)) < 0)
    return rc;
  for (size_t i = 0; i < s->m->count; i++) {
    uint64_t nb = (uint64_t)ckptio_tensor_nbytes(s->m->tensors[i].dtype, s->m->tensors[i].ndim,
                                                 s->m->tensors[i].shape);
    uint64_t off = s->m->arena_offset[i];
    if (memcmp(s->dst + off, s->m->arena + off, nb)) {
      fprintf(stderr, "ckptio bench: %s load: tensor '%s' differs from what was saved\n", what,
              s->m->tensors[i].name);
      return CKPTIO_E_CHECKSUM;
    }
  }
  return 0;
}

/* Zeroed destinations make a load that silently skips bytes visible; on a
 * GPU they are zeroed by an upload of zeros. */
static int clear_dst(bench_state *s) {
  memset(s->dst, 0, s->m->arena_bytes);
  return s->gpu ? bench_gpu_copy(s->gpu, s->gpu->dst, s->dst, s->m->arena_bytes, 1, NULL) : 0;
}

/* The reader does not take every format this build writes yet (a .pt while
 * the torch reader is being wired in): the save is still measured, the loads
 * are skipped with the library's reason. */
static char g_skip_why[512];

static int bench_load(bench_state *s, ckptio_load_method method, const char *what,
                      double *secs, ckptio_stats *st) {
  ckptio_reader *r = NULL;
  cli_progress bar = {0};
  char label[48];
  snprintf(label, sizeof(label), "run %d %s load", s->run + 1, what);
  ckptio_options lo = CKPTIO_OPTIONS_INIT;
  ckptio_ctx_options(s->ctx, &lo);
  lo.load_method = method;
  int rc = s->o->verify ? clear_dst(s) : 0;
  if (rc < 0) return rc;
  uint8_t *base = s->gpu ? s->gpu->dst : s->dst;
  int device = s->gpu ? CKPTIO_DEVICE_CUDA(s->gpu->ordinal) : CKPTIO_DEVICE_HOST;
  double t0 = cli_now();
  rc = ckptio_reader_open(s->ctx, g_ckpt, &lo, &r);
  int refused = rc == CKPTIO_E_FORMAT || (rc <= CKPTIO_E_HEADER_TOO_SMALL && rc >= CKPTIO_E_HEADER_JSON);
  if (refused && s->o->format != CKPTIO_FORMAT_SAFETENSORS) {
    snprintf(g_skip_why, sizeof(g_skip_why), "%s", cli_open_error(rc));
    s->load_skipped = g_skip_why;
    fprintf(stderr, "ckptio bench: loading the %s file: %s; the loads are skipped, only the "
            "save is measured\n", bench_format_name(s->o->format), g_skip_why);
    return 0;
  }
  if (rc < 0) {
    fail_msg("load: open", rc, cli_open_error(rc));
    goto fail;
  }
  for (size_t i = 0; i < s->m->count; i++) {
    int64_t idx = ckptio_reader_find(r, s->m->tensors[i].name);
    if (idx < 0) {
      rc = (int)idx;
      fprintf(stderr, "ckptio bench: load: tensor '%s' not in the file: %s\n",
              s->m->tensors[i].name, ckptio_strerror(rc));
      goto fail;
    }
    s->reqs[i].index = (size_t)idx;
    s->reqs[i].dst = base + s->m->arena_offset[i];
    s->reqs[i].device = device;
    s->reqs[i].dst_bytes = (uint64_t)ckptio_tensor_nbytes(
        s->m->tensors[i].dtype, s->m->tensors[i].ndim, s->m->tensors[i].shape);
  }
  cli_progress_start(&bar, label, cli_progress_reader, r);
  rc = ckptio_reader_load_many(r, s->reqs, s->m->count);
  *secs = cli_now() - t0;
  cli_progress_stop(&bar);
  if (rc < 0) {
    fail_msg("load", rc, ckptio_reader_last_error(r));
    goto fail;
  }
  st->size = sizeof(*st);
  ckptio_reader_stats(r, st); /* before verify replaces them */
  if (s->o->verify) {
    if ((rc = compare(s, what)) < 0) goto fail;
    size_t unchecked = 0;
    if ((rc = ckptio_reader_verify(r, &unchecked)) < 0) {
      fail_msg("verify", rc, ckptio_reader_last_error(r));
      goto fail;
    }
    if (s->o->crc && unchecked) {
      fprintf(stderr, "ckptio bench: verify: %zu tensors saved with --crc have no CRC32\n",
              unchecked);
      rc = CKPTIO_E_CHECKSUM;
      goto fail;
    }
  }
fail:
  ckptio_reader_close(r);
  return rc;
}

static int raw_fail(const char *step, int rc) {
  fprintf(stderr, "ckptio bench: %s %s: %s\n", step, g_raw, ckptio_strerror(rc));
  return rc;
}

/* Cold load, raw read, warm load; stops after the cold one when the reader
 * refuses the format. */
static int bench_loads(bench_state *s, bench_result *res, bench_run *out) {
  int rc;
  if ((rc = cli_drop_cache(g_ckpt)) < 0) return fail_msg("dropping the page cache", rc, NULL);
  if ((rc = bench_load(s, CKPTIO_LOAD_DIRECT, "cold", &out->cold_s, &out->cold)) < 0 || s->load_skipped)
    return rc;
  if ((rc = cli_raw_read_ways(g_raw, s->dst, s->raw_bytes, out->raw_read_ways_s,
                              &res->raw_direct_read)) < 0)
    return raw_fail("raw read", rc);
  out->raw_read_s = cli_raw_best(out->raw_read_ways_s, CLI_RAW_READ_WAYS);
  if ((rc = cli_raw_thp(g_raw, s->raw_bytes, &out->thp_write_s, &out->thp_read_s)) < 0)
    return raw_fail("raw write and read from huge pages", rc);

  /* A save with O_DIRECT and an O_DIRECT load leave the file out of the page
   * cache: read it once, untimed, so the next load is the warm one. */
  if ((rc = cli_warm_cache(g_ckpt)) < 0) return fail_msg("reading the file into the page cache", rc, NULL);
  return bench_load(s, s->o->load, "warm", &out->warm_s, &out->warm);
}

static int bench_one(bench_state *s, bench_result *res, bench_run *out) {
  g_in_save = 1;
  int rc = bench_save(s, out);
  if (rc == 0 && s->o->max_shard) rc = bench_shard_save(s, out);
  g_in_save = 0;
  if (g_pending) die_by(g_pending);
  if (rc < 0) return rc;
  unlink(g_raw);
  if ((rc = cli_raw_write_ways(g_raw, s->m->arena, s->raw_bytes, out->raw_write_ways_s,
                               &res->raw_direct_write)) < 0)
    return raw_fail("raw write", rc);
  out->raw_write_s = cli_raw_best(out->raw_write_ways_s, CLI_RAW_WRITE_WAYS);
  /* The copy engines' limits, each next to the step it bounds: device to
   * pinned host after the save, pinned host to device before the load. */
  if (s->gpu) {
    if ((rc = bench_gpu_copy(s->gpu, s->dst, s->gpu->src, s->raw_bytes, 0, &out->raw_d2h_s)) < 0 ||
        (rc = bench_gpu_copy(s->gpu, s->gpu->dst, s->dst, s->raw_bytes, 1, &out->raw_h2d_s)) < 0)
      return rc;
  }
  if (!s->load_skipped && (rc = bench_loads(s, res, out)) < 0) return rc;
  out->memcpy_s = cli_raw_memcpy(s->dst, s->m->arena, s->raw_bytes);
  return 0;
}

uint64_t bench_maxrss_bytes(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (uint64_t)ru.ru_maxrss * 1024;
}

ckptio_options bench_ctx_options(const bench_opts *o) {
  ckptio_options co = CKPTIO_OPTIONS_INIT;
  co.threads = o->threads;
  co.chunk_bytes = o->chunk;
  co.staging_bytes = o->staging;
  co.snapshot_bytes = o->snapshot;
  co.crc = o->crc;
  return co;
}

/* --dir, or --keep's directory (same filesystem as the kept file, so it
 * is renamed, never copied; its text in buf), or ".": a directory, or the
 * reason printed. @return 0 or -1. */
static int bench_dir(bench_opts *o, char *buf, size_t len) {
  if (!o->dir && o->keep) {
    snprintf(buf, len, "%s", o->keep);
    o->dir = dirname(buf);
  }
  if (!o->dir) o->dir = ".";
  struct stat st;
  int dir_ok = stat(o->dir, &st) == 0;
  if (dir_ok && S_ISDIR(st.st_mode)) return 0;
  fprintf(stderr, "ckptio bench: --dir %s: %s\n", o->dir, dir_ok ? "not a directory" : ckptio_strerror(-errno));
  return -1;
}

/* The context of the runs, and with --device the model moved to that GPU.
 * @return 0, or -1 with the reason printed. */
static int open_context(bench_state *s, bench_result *res, bench_gpu *gpu) {
  const bench_opts *o = s->o;
  ckptio_options co = bench_ctx_options(o);
  co.fsync = o->fsync;
  co.direct_io = o->direct;
  co.load_method = o->load;
  int rc = ckptio_ctx_create(&co, &s->ctx);
  if (rc < 0) {
    fprintf(stderr, "ckptio bench: creating the context (--threads %d --chunk %llu --staging %llu): %s\n",
            o->threads, (unsigned long long)o->chunk, (unsigned long long)o->staging, cli_open_error(rc));
    return -1;
  }
  res->ctx_opts = (ckptio_options)CKPTIO_OPTIONS_INIT;
  ckptio_ctx_options(s->ctx, &res->ctx_opts);
  res->numa = ckptio_ctx_numa_report(s->ctx);
  if (o->gpu < 0) return 0;
  const char *why = NULL;
  if (!ckptio_ctx_cuda(s->ctx, &why)) {
    fprintf(stderr, "ckptio bench: --device cuda:%d: %s\n", o->gpu, why);
    return -1;
  }
  cli_model *model = s->m;
  if (bench_gpu_open(gpu, s->ctx, o->gpu, model, s->dst, model->arena_bytes) < 0) return -1;
  /* From here the model lives on the GPU: the host arena stays the
   * pattern that loads are compared with and raw writes write. */
  for (size_t i = 0; i < model->count; i++) {
    model->tensors[i].data = gpu->src + model->arena_offset[i];
    model->tensors[i].device = CKPTIO_DEVICE_CUDA(o->gpu);
  }
  s->gpu = gpu;
  res->gpu = gpu;
  return 0;
}

/* --keep: the last run's checkpoint moved to path. @return 0, or a code
 * with the reason printed. */
static int keep_file(const char *path) {
  int rc = rename(g_ckpt, path) == 0 ? 0 : errno == EXDEV ? copy_file(g_ckpt, path) : -errno;
  if (rc < 0) fprintf(stderr, "ckptio bench: --keep %s: %s\n", path, ckptio_strerror(rc));
  return rc;
}

static int bench_main(bench_opts o) {
  /* A storage's prefix (s3://bucket/prefix): objects, not files; its own
   * flow and limits (bench_s3.c). */
  if (ckptio_path_scheme(o.dir)) return bench_storage_main(&o);
  char keepdir[4096];
  if (bench_dir(&o, keepdir, sizeof(keepdir)) < 0) return CLI_EXIT_USAGE;
  struct stat st;

  int ret = CLI_EXIT_USAGE, rc;
  cli_machine machine;
  cli_model model;
  memset(&model, 0, sizeof(model));
  bench_state s;
  memset(&s, 0, sizeof(s));
  bench_run *runs = calloc((size_t)o.runs, sizeof(*runs));
  bench_result res;
  memset(&res, 0, sizeof(res));
  bench_gpu gpu;
  memset(&gpu, 0, sizeof(gpu));
  cli_machine_probe(&machine, o.dir);
  snprintf(g_ckpt, sizeof(g_ckpt), "%s/.ckptio-bench-%ld.%s", machine.dir, (long)getpid(),
           o.format == CKPTIO_FORMAT_PYTORCH ? "pt" : "safetensors");
  snprintf(g_raw, sizeof(g_raw), "%s/.ckptio-bench-%ld.raw", machine.dir, (long)getpid());
  if (o.max_shard) snprintf(g_shards, sizeof(g_shards), "%s/.ckptio-bench-%ld.shards", machine.dir, (long)getpid());
  install_cleanup();
  if (!runs) goto fail;

  if ((rc = cli_model_build(&model, o.shapes, o.size_given || o.shapes == CLI_SHAPES_LLM ? o.size : 0)) < 0) {
    fail_msg("building the model", rc, NULL);
    goto fail;
  }
  s.o = &o;
  s.m = &model;
  s.raw_bytes = (model.tensor_bytes + ALIGN - 1) / ALIGN * ALIGN;
  s.dst = cli_buffer_alloc(model.arena_bytes);
  s.reqs = calloc(model.count, sizeof(*s.reqs));
  if (!s.dst || !s.reqs) {
    fail_msg("allocating load buffers", -ENOMEM, NULL);
    goto fail;
  }
  res.rss_baseline = bench_maxrss_bytes();

  if (open_context(&s, &res, &gpu) < 0) goto fail;

  res.opts = &o;
  res.machine = &machine;
  res.model = &model;
  res.raw_bytes = s.raw_bytes;
  res.runs = runs;
  for (s.run = 0; s.run < o.runs; s.run++) {
    if ((rc = bench_one(&s, &res, &runs[s.run])) < 0) {
      /* A data mismatch is the one failure that is the library's answer. */
      ret = rc == CKPTIO_E_CHECKSUM ? CLI_EXIT_INVALID : CLI_EXIT_USAGE;
      goto fail;
    }
    res.runs_done++;
    const ckptio_stats *x[] = {&runs[s.run].save, &runs[s.run].cold, &runs[s.run].warm};
    for (int k = 0; k < 3; k++)
      if (x[k]->staging_bytes > res.staging_peak) res.staging_peak = x[k]->staging_bytes;
  }
  res.load_skipped = s.load_skipped;
  if (stat(g_ckpt, &st) == 0) res.file_bytes = (uint64_t)st.st_size;
  res.rss_peak = bench_maxrss_bytes();

  if (o.keep && keep_file(o.keep) < 0) goto fail;
  if (o.json)
    bench_report_json(stdout, &res);
  else
    bench_report_table(stdout, &res);
  ret = fflush(stdout) == 0 ? CLI_EXIT_OK : CLI_EXIT_USAGE;
fail:
  remove_scratch();
  bench_gpu_close(&gpu);
  ckptio_ctx_free(s.ctx);
  free(s.reqs);
  cli_buffer_free(s.dst, model.arena_bytes);
  cli_model_free(&model);
  free(runs);
  return ret;
}

/* The bench, traced with --trace: the trace covers every run and is
 * complete (valid JSON) when the command exits. */
int cli_bench_main(int argc, char **argv) {
  bench_opts o;
  if (parse_opts(argc, argv, &o)) return CLI_EXIT_USAGE;
  o.argv0 = cli_program;
  int rc = o.trace ? ckptio_trace_start(o.trace) : 0;
  if (rc < 0) {
    fprintf(stderr, "ckptio bench: --trace %s: %s\n", o.trace, ckptio_strerror(rc));
    return CLI_EXIT_USAGE;
  }
  int ret = bench_main(o);
  if (o.trace && (rc = ckptio_trace_stop()) < 0) {
    fprintf(stderr, "ckptio bench: --trace %s: writing the trace: %s\n", o.trace, ckptio_strerror(rc));
    if (ret == CLI_EXIT_OK) ret = CLI_EXIT_USAGE;
  }
  return ret;
}
