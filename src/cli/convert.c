/*
 * `ckptio convert IN OUT`: safetensors <-> PyTorch .pt through the pipeline.
 * Contiguous little-endian tensors are handed to the writer as zero-copy
 * views of the input's mapping, so memory stays bounded by the staging ring
 * (plus the page cache); only strided or big-endian PyTorch tensors are
 * materialised, and held until the commit (the writer borrows them).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"

void cli_convert_usage(FILE *out) {
  fprintf(out,
          "usage: ckptio convert [--format safetensors|pt] [--no-crc] [--max-shard-size SIZE]\n"
          "                      [--compress N [--shuffle]] IN OUT\n\n"
          "Converts between safetensors and PyTorch (torch.save zip) checkpoints. The\n"
          "input's format is detected; the output's comes from --format or OUT's\n"
          "extension (.pt / .pth: PyTorch, anything else: safetensors). Tensor names,\n"
          "dtypes, shapes and string metadata carry over (a .pt's non-tensor values\n"
          "become metadata strings). Input CRCs are verified on the way; the output\n"
          "gets fresh ones (unless --no-crc) and appears atomically.\n\n"
          "IN may be a sharded checkpoint (its *.safetensors.index.json or its\n"
          "directory). With --max-shard-size (e.g. 2GiB, 500MB) OUT is a directory\n"
          "(created if missing) that receives a Hugging Face sharded set:\n"
          "model-00001-of-0000N.safetensors ... and model.safetensors.index.json,\n"
          "published atomically as a set.\n\n"
          "--compress N writes safetensors wrapped in the zstd seekable format at zstd\n"
          "level N (`zstd -d` restores the plain file); --shuffle adds the byte-shuffle\n"
          "filter (better ratio on float weights; only ckptio undoes it). A compressed\n"
          "input is detected; converting it without --compress writes a plain file.\n"
          "Tensors of a compressed or strided input are held in memory until commit.\n"
          "Shards are never compressed (other tools read them directly).\n\n"
          "exit codes: 0 ok; 1 invalid or corrupt input; 2 usage or I/O error\n");
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* The output: one file, or a sharded set. */
typedef struct sink {
  ckptio_writer *w;
  ckptio_shard_writer *s;
} sink;

static int sink_add(sink *o, const ckptio_tensor *t) {
  return o->s ? ckptio_shard_writer_add(o->s, t) : ckptio_writer_add(o->w, t);
}
static int sink_meta(sink *o, const char *k, const char *v) {
  return o->s ? ckptio_shard_writer_set_metadata(o->s, k, v) : ckptio_writer_set_metadata(o->w, k, v);
}
static const char *sink_error(sink *o) {
  return o->s ? ckptio_shard_writer_last_error(o->s) : ckptio_writer_last_error(o->w);
}
static void progress_shards(void *s, uint64_t *done, uint64_t *total) {
  ckptio_shard_writer_progress(s, done, total);
}

/* Adds every tensor of r to w: a view of the map when the bytes are the
 * tensor's as they are, else a loaded copy kept in *owned until commit. */
static int add_tensors(ckptio_reader *r, sink *w, void ***owned, const char **why) {
  size_t n = ckptio_reader_count(r);
  *owned = calloc(n + 1, sizeof(void *));
  if (!*owned) return -12;
  for (size_t i = 0; i < n; i++) {
    ckptio_tensor_info info;
    ckptio_reader_info(r, i, &info);
    ckptio_tensor t = {info.name, info.dtype, info.ndim, {0}, NULL, CKPTIO_DEVICE_HOST};
    memcpy(t.shape, info.shape, sizeof(t.shape));
    const void *view = NULL;
    int rc = ckptio_reader_view(r, i, &view, NULL);
    if (rc < 0) { /* strided or big-endian: materialise it */
      if (!((*owned)[i] = malloc(info.nbytes ? info.nbytes : 1))) return -12;
      rc = ckptio_reader_load(r, i, (*owned)[i], info.nbytes);
      if (rc < 0) {
        *why = ckptio_reader_last_error(r);
        return rc;
      }
      view = (*owned)[i];
    }
    t.data = view;
    if ((rc = sink_add(w, &t)) < 0) {
      *why = sink_error(w);
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
  sink w = {NULL, NULL};
  void **owned = NULL;
  const char *why = "";
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  o.crc = crc;
  o.load_method = CKPTIO_LOAD_MMAP;
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
   * must not launder a corrupt file into one with fresh, matching CRCs. */
  if (crc && (rc = ckptio_reader_verify(r, NULL)) < 0) {
    fprintf(stderr, "ckptio convert: %s\n", ckptio_reader_last_error(r));
    ret = cli_exit_for_read_error(rc);
    goto fail;
  }
  if (max_shard && mkdir(out, 0777) < 0 && errno != EEXIST) {
    fprintf(stderr, "ckptio convert: %s: %s\n", out, strerror(errno));
    goto fail;
  }
  ckptio_options wo = o;
  wo.compress_level = level;
  wo.shuffle = shuffle;
  rc = max_shard ? ckptio_shard_writer_open(ctx, out, "model", format, max_shard, NULL, &w.s)
                 : ckptio_writer_open(ctx, out, format, &wo, &w.w);
  if (rc < 0) {
    fprintf(stderr, "ckptio convert: %s\n", cli_open_error(rc));
    goto fail;
  }
  for (size_t i = 0; i < ckptio_reader_metadata_count(r); i++) {
    const char *k, *v;
    ckptio_reader_metadata_at(r, i, &k, &v);
    if (strncmp(k, "ckptio.", 7) == 0) continue; /* the writer writes its own */
    if (!strcmp(k, "total_size") && ckptio_reader_shard_count(r)) continue; /* the index's own */
    if ((rc = sink_meta(&w, k, v)) < 0) {
      fprintf(stderr, "ckptio convert: %s\n", sink_error(&w));
      goto fail;
    }
  }
  if ((rc = add_tensors(r, &w, &owned, &why)) < 0) {
    fprintf(stderr, "ckptio convert: %s\n", *why ? why : ckptio_strerror(rc));
    ret = cli_exit_for_read_error(rc);
    goto fail;
  }
  cli_progress bar;
  uint64_t total = 0;
  double t0 = cli_now();
  if (w.s) cli_progress_start(&bar, "convert", progress_shards, w.s);
  else cli_progress_start(&bar, "convert", cli_progress_writer, w.w);
  rc = w.s ? ckptio_shard_writer_commit(w.s) : ckptio_writer_commit(w.w);
  cli_progress_stop(&bar);
  if (rc < 0) {
    fprintf(stderr, "ckptio convert: %s\n", sink_error(&w));
    goto fail;
  }
  if (w.s) ckptio_shard_writer_progress(w.s, NULL, &total);
  else ckptio_writer_progress(w.w, NULL, &total);
  char hb[32];
  double secs = cli_now() - t0;
  char kind[64];
  snprintf(kind, sizeof(kind), "%s%s", format == CKPTIO_FORMAT_PYTORCH ? "pytorch" : "safetensors",
           level ? (shuffle ? ", zstd + shuffle" : ", zstd") : "");
  if (w.s) snprintf(kind, sizeof(kind), "safetensors, %zu shards", ckptio_shard_writer_shard_count(w.s));
  printf("OK %s -> %s (%s): %zu tensors, %s in %.3f s, %.2f GB/s\n", in, out, kind, ckptio_reader_count(r),
         cli_fmt_bytes(total, hb, sizeof(hb)), secs, secs > 0 ? (double)total / secs / 1e9 : 0.0);
  ret = CLI_EXIT_OK;
fail:
  ckptio_writer_close(w.w);
  ckptio_shard_writer_close(w.s);
  for (size_t i = 0; owned && r && i < ckptio_reader_count(r); i++) free(owned[i]);
  free(owned);
  ckptio_reader_close(r);
  ckptio_ctx_free(ctx);
  return ret;
}
