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

int cli_convert_main(int argc, char **argv) {
  const char *in = NULL, *out = NULL, *fmt = NULL;
  int crc = 1, level = 0, shuffle = 0;
  uint64_t max_shard = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--format") && i + 1 < argc) {
      fmt = argv[++i];
    } else if (!strcmp(argv[i], "--max-shard-size") && i + 1 < argc) {
      if (cli_parse_size(argv[++i], &max_shard) < 0 || max_shard == 0) {
        fprintf(stderr, "ckptio convert: bad --max-shard-size '%s'\n", argv[i]);
        return CLI_EXIT_USAGE;
      }
    } else if (!strcmp(argv[i], "--compress") && i + 1 < argc) {
      char *end;
      long v = strtol(argv[++i], &end, 10);
      if (*end || v == 0 || v < -131072 || v > 22) {
        fprintf(stderr, "ckptio convert: --compress wants a zstd level (1-22, or negative), got '%s'\n", argv[i]);
        return CLI_EXIT_USAGE;
      }
      level = (int)v;
    } else if (!strcmp(argv[i], "--shuffle")) {
      shuffle = 1;
    } else if (!strcmp(argv[i], "--no-crc")) {
      crc = 0;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      fprintf(stderr, "ckptio convert: unknown option '%s'\n\n", argv[i]);
      cli_convert_usage(stderr);
      return CLI_EXIT_USAGE;
    } else if (!in) {
      in = argv[i];
    } else if (!out) {
      out = argv[i];
    } else {
      fprintf(stderr, "ckptio convert: IN and OUT only\n");
      return CLI_EXIT_USAGE;
    }
  }
  if (!in || !out || (fmt && strcmp(fmt, "safetensors") && strcmp(fmt, "pt")) ||
      (max_shard && fmt && strcmp(fmt, "safetensors")) || (shuffle && !level) || (max_shard && level)) {
    cli_convert_usage(stderr);
    return CLI_EXIT_USAGE;
  }
  ckptio_format format = CKPTIO_FORMAT_SAFETENSORS;
  if (!max_shard && (fmt ? !strcmp(fmt, "pt") : (ends_with(out, ".pt") || ends_with(out, ".pth"))))
    format = CKPTIO_FORMAT_PYTORCH;

  int ret = CLI_EXIT_USAGE, rc;
  ckptio_ctx *ctx = NULL;
  ckptio_reader *r = NULL;
  ckptio_writer *w = NULL; /* one file, or a sharded set */
  cli_pull *pull = NULL; /* the input's tensors without a view */
  const char *why = "";
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  o.crc = crc;
  o.load_method = CKPTIO_LOAD_AUTO; /* verify reads a cold input by O_DIRECT: no page cache mapped into the process */
  if ((rc = ckptio_ctx_create(&o, &ctx)) < 0) {
    fprintf(stderr, "ckptio convert: %s\n", cli_open_error(rc));
    goto fail;
  }
  if ((rc = ckptio_reader_open(ctx, in, NULL, &r)) < 0) {
    fprintf(stderr, "ckptio convert: %s\n", cli_open_error(rc));
    ret = cli_exit_for_read_error(rc);
    goto fail;
  }
  /* The input's CRCs are checked before anything is written: a conversion
   * must not launder a corrupt file into one with fresh, matching CRCs.
   * (A DCP checkpoint records none: nothing to read here.) */
  if (crc && (rc = ckptio_reader_verify(r, NULL)) < 0) {
    fprintf(stderr, "ckptio convert: %s\n", ckptio_reader_last_error(r));
    ret = cli_exit_for_read_error(rc);
    goto fail;
  }
  if (max_shard && mkdir(out, 0777) < 0 && errno != EEXIST) {
    fprintf(stderr, "ckptio convert: %s: %s\n", out, ckptio_strerror(-errno));
    goto fail;
  }
  ckptio_options wo = o;
  wo.compress_level = level;
  wo.shuffle = shuffle;
  rc = max_shard ? ckptio_writer_open_sharded(ctx, out, "model", format, max_shard, CKPTIO_SHARD_ORDER_ADDED, NULL, &w)
                 : ckptio_writer_open(ctx, out, format, &wo, &w);
  if (rc < 0) {
    fprintf(stderr, "ckptio convert: %s\n", cli_open_error(rc));
    goto fail;
  }
  for (size_t i = 0; i < ckptio_reader_metadata_count(r); i++) {
    const char *k, *v;
    ckptio_reader_metadata_at(r, i, &k, &v);
    if (strncmp(k, "ckptio.", 7) == 0) continue; /* the writer writes its own */
    if (!strcmp(k, "total_size") && ckptio_reader_shard_count(r)) continue; /* the index's own */
    if ((rc = ckptio_writer_set_metadata(w, k, v)) < 0) {
      fprintf(stderr, "ckptio convert: %s\n", ckptio_writer_last_error(w));
      goto fail;
    }
  }
  ckptio_options used = CKPTIO_OPTIONS_INIT; /* ckptio_ctx_options reads its size */
  ckptio_ctx_options(ctx, &used);
  if ((rc = add_tensors(r, in, w, used.threads, &pull, &why)) < 0) {
    fprintf(stderr, "ckptio convert: %s\n", *why ? why : ckptio_strerror(rc));
    ret = cli_exit_for_read_error(rc);
    goto fail;
  }
  cli_progress bar;
  uint64_t total = 0;
  double t0 = cli_now();
  cli_progress_start(&bar, "convert", cli_progress_writer, w);
  rc = ckptio_writer_commit(w);
  cli_progress_stop(&bar);
  if (rc < 0) {
    fprintf(stderr, "ckptio convert: %s\n", ckptio_writer_last_error(w));
    goto fail;
  }
  ckptio_writer_progress(w, NULL, &total);
  char hb[32];
  double secs = cli_now() - t0;
  char kind[64];
  snprintf(kind, sizeof(kind), "%s%s", format == CKPTIO_FORMAT_PYTORCH ? "pytorch" : "safetensors",
           level ? (shuffle ? ", zstd + shuffle" : ", zstd") : "");
  if (max_shard) snprintf(kind, sizeof(kind), "safetensors, %zu shards", ckptio_writer_shard_count(w));
  printf("OK %s -> %s (%s): %zu tensors, %s in %.3f s, %.2f GB/s\n", in, out, kind, ckptio_reader_count(r),
         cli_fmt_bytes(total, hb, sizeof(hb)), secs, secs > 0 ? (double)total / secs / 1e9 : 0.0);
  ret = CLI_EXIT_OK;
fail:
  ckptio_writer_close(w);
  cli_pull_close(pull);
  ckptio_reader_close(r);
  ckptio_ctx_free(ctx);
  return ret;
}
