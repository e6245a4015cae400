/*
 * `ckptio convert IN OUT`: safetensors <-> PyTorch .pt through the pipeline.
 * Contiguous little-endian tensors are handed to the writer as zero-copy
 * views of the input's mapping; every other tensor (split across a DCP or
 * multi-rank checkpoint's files, strided or big-endian in a .pt, in a
 * compressed file) is pulled from the input by the writer's workers as they
 * write it (pull.c). Either way memory stays bounded by the staging rings
 * (plus the page cache), whatever the model's size.
 */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/pull.h"

void cli_convert_usage(FILE *out) {
  fprintf(out,
          "usage: ckptio convert [--format safetensors|pt] [--no-crc] [--max-shard-size SIZE]\n"
          "                      [--compress N [--shuffle]] IN OUT\n\n"
          "Converts between safetensors and PyTorch (torch.save zip) checkpoints. The\n"
          "input's format is detected; the output's comes from --format or OUT's\n"
          "extension (.pt / .pth: PyTorch, anything else: safetensors). Tensor names,\n"
          "dtypes, shapes and string metadata carry over (a .pt's non-tensor values\n"
          "become metadata strings). Input CRCs are verified first; the output\n"
          "gets fresh ones (unless --no-crc) and appears atomically.\n\n"
          "IN may be a sharded or multi-rank checkpoint (its *.safetensors.index.json\n"
          "or its directory) or a torch.distributed.checkpoint directory. With --max-shard-size (e.g. 2GiB, 500MB) OUT is a directory\n"
          "(created if missing) that receives a Hugging Face sharded set:\n"
          "model-00001-of-0000N.safetensors ... and model.safetensors.index.json,\n"
          "published atomically as a set.\n\n"
          "--compress N writes safetensors wrapped in the zstd seekable format at zstd\n"
          "level N (`zstd -d` restores the plain file); --shuffle adds the byte-shuffle\n"
          "filter (better ratio on float weights; only ckptio undoes it). A compressed\n"
          "input is detected; converting it without --compress writes a plain file.\n"
          "Tensors are read from IN as OUT is written: memory stays bounded whatever\n"
          "the model's size.\n"
          "Shards are never compressed (other tools read them directly).\n\n"
          "exit codes: 0 ok; 1 invalid or corrupt input; 2 usage or I/O error\n");
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Adds every tensor of r to w: a view of the input's map when its bytes are
 * the tensor's as they are, else pulled from the input as the writer writes
 * (pull.c). */
static int add_tensors(ckptio_reader *r, const char *in, ckptio_writer *w, int threads, cli_pull **pull,
                       const char **why) {
  for (size_t i = 0; i < ckptio_reader_count(r); i++) {
    ckptio_tensor_info info;
    const void *view;
    int rc;
    ckptio_reader_info(r, i, &info);
    if (ckptio_reader_view(r, i, &view, NULL) == 0) {
      ckptio_tensor t = {info.name, info.dtype, info.ndim, {0}, view, CKPTIO_DEVICE_HOST};
      memcpy(t.shape, info.shape, sizeof(t.shape));
      rc = ckptio_writer_add(w, &t);
    } else if (!*pull && (rc = cli_pull_open(in, threads, pull)) < 0) {
      *why = cli_open_error(rc);
      return rc;
    } else {
      rc = cli_pull_add(*pull, w, i);
    }
    if (rc < 0) {
      *why = ckptio_writer_last_error(w);
      return rc;
    }
  }
  return 0;
}

/* The command line of one conversion. */
typedef struct convert_opts {
  const char *in, *out;
  ckptio_format format;
  int crc, level, shuffle;
  uint64_t max_shard; /* 0: one file */
} convert_opts;

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "ckptio convert: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n\n");
  cli_convert_usage(stderr);
  return CLI_EXIT_USAGE;
}

/* @return 0, or CLI_EXIT_USAGE with the reason printed. */
static int parse_opts(int argc, char **argv, convert_opts *o) {
  enum { OPT_FORMAT = 256, OPT_MAX_SHARD, OPT_COMPRESS, OPT_SHUFFLE, OPT_NOCRC };
  static const struct option kLong[] = {
      {"format", required_argument, 0, OPT_FORMAT},     {"max-shard-size", required_argument, 0, OPT_MAX_SHARD},
      {"compress", required_argument, 0, OPT_COMPRESS}, {"shuffle", no_argument, 0, OPT_SHUFFLE},
      {"no-crc", no_argument, 0, OPT_NOCRC},            {0, 0, 0, 0},
  };
  memset(o, 0, sizeof(*o));
  o->crc = 1;
  const char *fmt = NULL;
  opterr = 0;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "", kLong, NULL)) != -1) {
    char *end;
    long v;
    switch (c) {
      case OPT_FORMAT:
        if (strcmp(optarg, "safetensors") && strcmp(optarg, "pt"))
          return usage_error("--format is safetensors or pt, not '%s'", optarg);
        fmt = optarg;
        break;
      case OPT_MAX_SHARD:
        if (cli_parse_size(optarg, &o->max_shard) < 0 || o->max_shard == 0)
          return usage_error("bad --max-shard-size '%s' (e.g. 2GiB, 500MB)", optarg);
        break;
      case OPT_COMPRESS:
        v = strtol(optarg, &end, 10);
        if (*end || v == 0 || v < -131072 || v > 22)
          return usage_error("--compress wants a zstd level (1-22, or negative), got '%s'", optarg);
        o->level = (int)v;
        break;
      case OPT_SHUFFLE:
        o->shuffle = 1;
        break;
      case OPT_NOCRC:
        o->crc = 0;
        break;
      default:
        return usage_error("unknown or incomplete option '%s'", argv[optind - 1]);
    }
  }
  if (argc - optind != 2) return usage_error("%s", argc - optind < 2 ? "IN and OUT are needed" : "IN and OUT only");
  o->in = argv[optind];
  o->out = argv[optind + 1];
  if (o->max_shard && fmt && strcmp(fmt, "safetensors")) return usage_error("%s", "shards are safetensors");
  if (o->shuffle && !o->level) return usage_error("%s", "--shuffle goes with --compress");
  if (o->max_shard && o->level) return usage_error("%s", "shards are never compressed");
  o->format = !o->max_shard && (fmt ? !strcmp(fmt, "pt") : (ends_with(o->out, ".pt") || ends_with(o->out, ".pth")))
                  ? CKPTIO_FORMAT_PYTORCH
                  : CKPTIO_FORMAT_SAFETENSORS;
  return 0;
}

/* The writer of OUT (one file, or a sharded set in the directory OUT,
 * made if missing) with IN's string metadata. @return 0, or a code with
 * the reason printed. */
static int open_output(ckptio_ctx *ctx, ckptio_reader *r, const convert_opts *o, ckptio_writer **w) {
  if (o->max_shard && mkdir(o->out, 0777) < 0 && errno != EEXIST) {
    int rc = -errno;
    fprintf(stderr, "ckptio convert: %s: %s\n", o->out, ckptio_strerror(rc));
    return rc;
  }
  ckptio_options wo = CKPTIO_OPTIONS_INIT;
  wo.crc = o->crc;
  wo.compress_level = o->level;
  wo.shuffle = o->shuffle;
  int rc = o->max_shard ? ckptio_writer_open_sharded(ctx, o->out, "model", o->format, o->max_shard,
                                                     CKPTIO_SHARD_ORDER_ADDED, NULL, w)
                        : ckptio_writer_open(ctx, o->out, o->format, &wo, w);
  if (rc < 0) {
    fprintf(stderr, "ckptio convert: %s\n", cli_open_error(rc));
    return rc;
  }
  for (size_t i = 0; i < ckptio_reader_metadata_count(r); i++) {
    const char *k, *v;
    ckptio_reader_metadata_at(r, i, &k, &v);
    if (strncmp(k, "ckptio.", 7) == 0) continue; /* the writer writes its own */
    if (!strcmp(k, "total_size") && ckptio_reader_shard_count(r)) continue; /* the index's own */
    if ((rc = ckptio_writer_set_metadata(*w, k, v)) < 0) {
      fprintf(stderr, "ckptio convert: %s\n", ckptio_writer_last_error(*w));
      return rc;
    }
  }
  return 0;
}

/* The line a successful conversion prints. */
static void report(const convert_opts *o, ckptio_reader *r, ckptio_writer *w, double secs) {
  uint64_t total = 0;
  ckptio_writer_progress(w, NULL, &total);
  char hb[32], kind[64];
  snprintf(kind, sizeof(kind), "%s%s", o->format == CKPTIO_FORMAT_PYTORCH ? "pytorch" : "safetensors",
           o->level ? (o->shuffle ? ", zstd + shuffle" : ", zstd") : "");
  if (o->max_shard) snprintf(kind, sizeof(kind), "safetensors, %zu shards", ckptio_writer_shard_count(w));
  printf("OK %s -> %s (%s): %zu tensors, %s in %.3f s, %.2f GB/s\n", o->in, o->out, kind, ckptio_reader_count(r),
         cli_fmt_bytes(total, hb, sizeof(hb)), secs, secs > 0 ? (double)total / secs / 1e9 : 0.0);
}

int cli_convert_main(int argc, char **argv) {
  convert_opts o;
  if (parse_opts(argc, argv, &o)) return CLI_EXIT_USAGE;
  int ret = CLI_EXIT_USAGE, rc;
  ckptio_ctx *ctx = NULL;
  ckptio_reader *r = NULL;
  ckptio_writer *w = NULL; /* one file, or a sharded set */
  cli_pull *pull = NULL;   /* the input's tensors without a view */
  const char *why = "";
  ckptio_options co = CKPTIO_OPTIONS_INIT;
  co.crc = o.crc;
  co.load_method = CKPTIO_LOAD_AUTO; /* verify reads a cold input by O_DIRECT: no page cache mapped into the process */
  if ((rc = ckptio_ctx_create(&co, &ctx)) < 0) {
    fprintf(stderr, "ckptio convert: %s\n", cli_open_error(rc));
    goto fail;
  }
  if ((rc = ckptio_reader_open(ctx, o.in, NULL, &r)) < 0) {
    fprintf(stderr, "ckptio convert: %s\n", cli_open_error(rc));
    ret = cli_exit_for_read_error(rc);
    goto fail;
  }
  /* The input's CRCs are checked before anything is written: a conversion
   * must not launder a corrupt file into one with fresh, matching CRCs.
   * (A DCP checkpoint records none: nothing to read here.) */
  if (o.crc && (rc = ckptio_reader_verify(r, NULL)) < 0) {
    fprintf(stderr, "ckptio convert: %s\n", ckptio_reader_last_error(r));
    ret = cli_exit_for_read_error(rc);
    goto fail;
  }
  if (open_output(ctx, r, &o, &w) < 0) goto fail;
  ckptio_options used = CKPTIO_OPTIONS_INIT; /* ckptio_ctx_options reads its size */
  ckptio_ctx_options(ctx, &used);
  if ((rc = add_tensors(r, o.in, w, used.threads, &pull, &why)) < 0) {
    fprintf(stderr, "ckptio convert: %s\n", *why ? why : ckptio_strerror(rc));
    ret = cli_exit_for_read_error(rc);
    goto fail;
  }
  cli_progress bar;
  double t0 = cli_now();
  cli_progress_start(&bar, "convert", cli_progress_writer, w);
  rc = ckptio_writer_commit(w);
  cli_progress_stop(&bar);
  if (rc < 0) {
    fprintf(stderr, "ckptio convert: %s\n", ckptio_writer_last_error(w));
    goto fail;
  }
  report(&o, r, w, cli_now() - t0);
  ret = CLI_EXIT_OK;
fail:
  ckptio_writer_close(w);
  cli_pull_close(pull);
  ckptio_reader_close(r);
  ckptio_ctx_free(ctx);
  return ret;
}
