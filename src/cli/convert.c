/*
 * `ckptio convert IN OUT`: safetensors <-> PyTorch .pt through the pipeline.
 * Contiguous little-endian tensors are handed to the writer as zero-copy
 * views of the input's mapping, so memory stays bounded by the staging ring
 * (plus the page cache); strided or big-endian PyTorch tensors and the
 * tensors of a compressed input are materialised in a mapped, unlinked temp
 * file next to the output (see spill) and held there until the commit (the
 * writer borrows them).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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
          "Tensors of a compressed or strided input are copied to an unlinked temp file\n"
          "next to OUT (page cache, not process memory) until the commit.\n"
          "Shards are never compressed (other tools read them directly).\n\n"
          "exit codes: 0 ok; 1 invalid or corrupt input; 2 usage or I/O error\n");
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Bytes of input tensors that cannot be handed over as views (strided or
 * big-endian PyTorch storages, compressed files): loaded into one mapping of
 * an unlinked temp file next to the output, so the kernel can write them
 * back and drop them under memory pressure instead of holding the whole
 * model in anonymous memory until the commit. */
typedef struct spill {
  unsigned char *base;
  size_t size;
} spill;

static int spill_map(spill *sp, const char *dir, uint64_t size, const char **why) {
  static char msg[512];
  char path[4096];
  snprintf(path, sizeof(path), "%s/.ckptio-convert-XXXXXX", dir);
  int fd = mkstemp(path), rc = 0;
  if (fd < 0) rc = -errno;
  else {
    unlink(path);
    if (ftruncate(fd, (off_t)size) < 0) rc = -errno;
    else if ((sp->base = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)
      rc = -errno, sp->base = NULL;
    else sp->size = (size_t)size;
    close(fd);
  }
  if (rc < 0) {
    snprintf(msg, sizeof(msg), "%s: a %llu-byte temp file for tensors that need a copy: %s", dir,
             (unsigned long long)size, ckptio_strerror(rc));
    *why = msg;
  }
  return rc;
}

/* Whether some tensor of r has no view: it must be copied (a split tensor,
 * a strided or big-endian view, a compressed file). */
static int needs_copy(ckptio_reader *r) {
  for (size_t i = 0; i < ckptio_reader_count(r); i++) {
    const void *p;
    if (ckptio_reader_view(r, i, &p, NULL) < 0) return 1;
  }
  return 0;
}

/* Adds every tensor of r to w: a view of the input's map when its bytes are
 * the tensor's as they are (and copy_all is 0), else a copy in the spill
 * mapping. */
static int add_tensors(ckptio_reader *r, ckptio_writer *w, int copy_all, const char *spill_dir, spill *sp,
                       const char **why) {
  size_t n = ckptio_reader_count(r), nload = 0;
  const void **views = calloc(n + 1, sizeof(*views));
  uint64_t *at = calloc(n + 1, sizeof(*at)), total = 0;
  ckptio_load_request *reqs = calloc(n + 1, sizeof(*reqs));
  int rc = 0;
  if (!views || !at || !reqs) {
    rc = -ENOMEM;
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    ckptio_tensor_info info;
    ckptio_reader_info(r, i, &info);
    if (!copy_all && ckptio_reader_view(r, i, &views[i], NULL) == 0) continue;
    views[i] = NULL;
    at[i] = total;
    total += (info.nbytes + 63) & ~(uint64_t)63;
    reqs[nload++] = (ckptio_load_request){i, NULL, info.nbytes, CKPTIO_DEVICE_HOST};
  }
  if (total && (rc = spill_map(sp, spill_dir, total, why)) < 0) goto out;
  for (size_t k = 0; k < nload; k++) reqs[k].dst = sp->base + at[reqs[k].index];
  if (nload && (rc = ckptio_reader_load_many(r, reqs, nload)) < 0) {
    *why = ckptio_reader_last_error(r);
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    ckptio_tensor_info info;
    ckptio_reader_info(r, i, &info);
    ckptio_tensor t = {info.name, info.dtype, info.ndim, {0}, NULL, CKPTIO_DEVICE_HOST};
    memcpy(t.shape, info.shape, sizeof(t.shape));
    t.data = views[i] ? views[i] : sp->base + at[i];
    if ((rc = ckptio_writer_add(w, &t)) < 0) {
      *why = ckptio_writer_last_error(w);
      goto out;
    }
  }
out:
  free(views);
  free(at);
  free(reqs);
  return rc;
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
  spill sp = {NULL, 0};
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
   * must not launder a corrupt file into one with fresh, matching CRCs.
   * When some tensor must be copied anyway (a DCP or multi-rank
   * checkpoint's split tensors), every tensor is copied, its CRCs checked
   * as it loads: one pass over the input instead of a verify pass and then
   * the loads (bench/RESULTS.md, issue 31). */
  int copy_all = crc && needs_copy(r);
  if (crc && !copy_all && (rc = ckptio_reader_verify(r, NULL)) < 0) {
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
  char *slash = strrchr(out, '/');
  char spill_dir[4096];
  if (max_shard) snprintf(spill_dir, sizeof(spill_dir), "%s", out);
  else if (slash) snprintf(spill_dir, sizeof(spill_dir), "%.*s", (int)(slash == out ? 1 : slash - out), out);
  else snprintf(spill_dir, sizeof(spill_dir), ".");
  if ((rc = add_tensors(r, w, copy_all, spill_dir, &sp, &why)) < 0) {
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
  if (sp.base) munmap(sp.base, sp.size);
  ckptio_reader_close(r);
  ckptio_ctx_free(ctx);
  return ret;
}
