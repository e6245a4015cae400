/*
 * `ckptio inspect FILE [--json]`: what a checkpoint holds, read from its
 * header alone (no tensor data is touched): format, sizes, one line per
 * tensor, and the metadata.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"

void cli_inspect_usage(FILE *out) {
  fprintf(out,
          "usage: ckptio inspect FILE|INDEX|DIR [--json] [--plan NAME:DIM:N]\n\n"
          "Prints the format, file size, header size, data start and tensor count,\n"
          "then one line per tensor (name, dtype, shape, byte offset in the file,\n"
          "bytes, recorded CRC32 or \"-\") and the metadata. Only the header is read.\n"
          "A sharded checkpoint (its *.safetensors.index.json, or its directory) is\n"
          "shown as one, with a line per shard (file, tensors, bytes) and each\n"
          "tensor's shard number; a multi-rank checkpoint's split tensors list their\n"
          "parts (offsets and sizes per dimension, file) instead.\n\n"
          "  --json   one JSON object instead of the table\n"
          "  --plan NAME:DIM:N\n"
          "           instead: what each of N tensor-parallel ranks reads of tensor NAME\n"
          "           split on DIM (torch.chunk's rule): its start:stop, bytes, and the\n"
          "           file byte ranges (all of them with --json)\n\n"
          "exit codes: 0 ok; 1 not a valid checkpoint; 2 usage or I/O error\n");
}

/* Open-time facts the reader does not report: the format's magic and, for
 * safetensors, the header length prefix. */
typedef struct file_facts {
  uint64_t file_size;
  const char *format;
  uint64_t header_bytes; /* the JSON header, without the 8-byte prefix */
  uint64_t data_start;
} file_facts;

static int read_facts(const char *path, file_facts *f) {
  memset(f, 0, sizeof(*f));
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  struct stat st;
  uint8_t prefix[8] = {0};
  int rc = 0;
  if (fstat(fd, &st) != 0) {
    rc = -errno;
    goto fail;
  }
  f->file_size = (uint64_t)st.st_size;
  ssize_t got = pread(fd, prefix, sizeof(prefix), 0);
  if (got < 0) {
    rc = -errno;
    goto fail;
  }
  if (got >= 4 && !memcmp(prefix, "PK\3\4", 4)) {
    f->format = "pytorch-zip";
  } else if (got >= 4 && !memcmp(prefix, "\x28\xb5\x2f\xfd", 4)) {
    f->format = "safetensors+zstd"; /* header facts come from the reader */
  } else {
    f->format = "safetensors";
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | prefix[i];
    f->header_bytes = n;
    f->data_start = 8 + n;
  }
fail:
  close(fd);
  return rc;
}

/* An object of a storage ("s3://..."): no file to open; what its reader
 * knows (a safetensors file: header, then the tensors packed). */
static void object_facts(ckptio_reader *r, file_facts *f) {
  memset(f, 0, sizeof(*f));
  f->format = ckptio_reader_format(r);
  f->data_start = ckptio_reader_header_bytes(r);
  f->header_bytes = f->data_start >= 8 ? f->data_start - 8 : 0;
  f->file_size = f->data_start;
  for (size_t i = 0; i < ckptio_reader_count(r); i++) {
    ckptio_tensor_info t;
    if (ckptio_reader_info(r, i, &t) == 0 && t.offset + t.nbytes > f->file_size) f->file_size = t.offset + t.nbytes;
  }
}

static void shape_str(const ckptio_tensor_info *t, char *buf, size_t len) {
  size_t p = 0;
  p += (size_t)snprintf(buf + p, len - p, "[");
  for (int d = 0; d < t->ndim && p < len; d++)
    p += (size_t)snprintf(buf + p, len - p, "%s%" PRId64, d ? ", " : "", t->shape[d]);
  if (p < len) snprintf(buf + p, len - p, "]");
}

/* A set's facts: the sum of its shard files. */
static void set_facts(ckptio_reader *r, file_facts *f) {
  memset(f, 0, sizeof(*f));
  f->format = ckptio_reader_format(r);
  for (size_t k = 0; k < cli_files_of(r); k++) {
    const char *p;
    struct stat st;
    if (ckptio_reader_shard(r, k, &p, NULL, NULL) == 0 && stat(p, &st) == 0) f->file_size += (uint64_t)st.st_size;
  }
}

static void print_shards_json(ckptio_reader *r) {
  printf(",\"shards\":[");
  for (size_t k = 0; k < cli_files_of(r); k++) {
    const char *p;
    size_t nt;
    uint64_t b;
    ckptio_reader_shard(r, k, &p, &nt, &b);
    printf("%s{\"file\":", k ? "," : "");
    cli_json_string(stdout, p);
    printf(",\"tensors\":%zu,\"bytes\":%" PRIu64 "}", nt, b);
  }
  printf("]");
}

static void print_shards_table(ckptio_reader *r) {
  char hb[32];
  printf("%s       %zu\n", strcmp(ckptio_reader_format(r), "dcp") ? "shards" : "files ", cli_files_of(r));
  for (size_t k = 0; k < cli_files_of(r); k++) {
    const char *p;
    size_t nt;
    uint64_t b;
    ckptio_reader_shard(r, k, &p, &nt, &b);
    printf("  %zu  %s  %zu tensors  %" PRIu64 " bytes (%s)\n", k + 1, p, nt, b, cli_fmt_bytes(b, hb, sizeof(hb)));
  }
}

/* A tensor stored in parts (a multi-rank checkpoint): where each lives. */
static void print_parts_json(ckptio_reader *r, size_t i, int ndim, size_t np) {
  printf("\"parts\":[");
  for (size_t k = 0; k < np; k++) {
    const char *p;
    int64_t off[CKPTIO_MAX_DIMS], size[CKPTIO_MAX_DIMS];
    if (ckptio_reader_part(r, i, k, &p, off, size) < 0) continue;
    printf("%s{\"file\":", k ? "," : "");
    cli_json_string(stdout, p);
    printf(",\"offsets\":[");
    for (int d = 0; d < ndim; d++) printf("%s%" PRId64, d ? "," : "", off[d]);
    printf("],\"shape\":[");
    for (int d = 0; d < ndim; d++) printf("%s%" PRId64, d ? "," : "", size[d]);
    printf("]}");
  }
  printf("],");
}

static void print_parts_table(ckptio_reader *r) {
  int any = 0;
  for (size_t i = 0; i < ckptio_reader_count(r); i++) {
    size_t np = ckptio_reader_part_count(r, i);
    ckptio_tensor_info t;
    if (np < 2 || ckptio_reader_info(r, i, &t) < 0) continue;
    if (!any++) printf("\nparts (offsets + sizes per dim, file)\n");
    printf("  %s\n", t.name);
    for (size_t k = 0; k < np; k++) {
      const char *p, *base;
      int64_t off[CKPTIO_MAX_DIMS], size[CKPTIO_MAX_DIMS];
      char box[256];
      size_t at = 0;
      if (ckptio_reader_part(r, i, k, &p, off, size) < 0) continue;
      for (int d = 0; d < t.ndim && at < sizeof(box); d++)
        at += (size_t)snprintf(box + at, sizeof(box) - at, "%s%" PRId64 "+%" PRId64, d ? ", " : "", off[d], size[d]);
      base = strrchr(p, '/');
      printf("    [%s]  %s\n", at ? box : "", base ? base + 1 : p);
    }
  }
}

static void print_json(const char *path, const file_facts *f, ckptio_reader *r) {
  size_t n = ckptio_reader_count(r);
  int sharded = cli_files_of(r) > 0;
  printf("{\"file\":");
  cli_json_string(stdout, path);
  printf(",\"format\":\"%s\",\"file_size\":%" PRIu64 ",\"header_size\":%" PRIu64
         ",\"data_start\":%" PRIu64 ",\"tensor_count\":%zu,",
         f->format, f->file_size, f->header_bytes, f->data_start, n);
  uint64_t frames, csize, plain;
  if (ckptio_reader_compression(r, &frames, &csize, &plain) == 1) {
    const char *filter = ckptio_reader_metadata_get(r, "ckptio.filter");
    printf("\"compression\":{\"codec\":\"zstd-seekable\",\"frames\":%" PRIu64 ",\"compressed_bytes\":%" PRIu64
           ",\"decompressed_bytes\":%" PRIu64 ",\"ratio\":%.4f,\"filter\":\"%s\"},",
           frames, csize, plain, csize ? (double)plain / (double)csize : 0.0, filter ? filter : "none");
  }
  printf("\"tensors\":[");
  for (size_t i = 0; i < n; i++) {
    ckptio_tensor_info t;
    if (ckptio_reader_info(r, i, &t) < 0) continue;
    printf("%s{\"name\":", i ? "," : "");
    cli_json_string(stdout, t.name);
    printf(",\"dtype\":\"%s\",\"shape\":[", ckptio_dtype_name(t.dtype));
    for (int d = 0; d < t.ndim; d++) printf("%s%" PRId64, d ? "," : "", t.shape[d]);
    printf("],\"offset\":%" PRIu64 ",\"nbytes\":%" PRIu64 ",", t.offset, t.nbytes);
    size_t np = ckptio_reader_part_count(r, i);
    if (np > 1)
      print_parts_json(r, i, t.ndim, np);
    else if (sharded)
      printf("\"shard\":%" PRId64 ",", ckptio_reader_shard_of(r, i) + 1);
    printf("\"crc32\":");
    if (t.has_crc)
      printf("\"%08" PRIx32 "\"}", t.crc32);
    else
      printf("null}");
  }
  printf("],\"metadata\":{");
  size_t nm = ckptio_reader_metadata_count(r);
  for (size_t i = 0; i < nm; i++) {
    const char *k, *v;
    if (ckptio_reader_metadata_at(r, i, &k, &v) < 0) continue;
    if (i) putchar(',');
    cli_json_string(stdout, k);
    putchar(':');
    cli_json_string(stdout, v);
  }
  printf("}");
  if (sharded) print_shards_json(r);
  printf("}\n");
}

static void print_table(const char *path, const file_facts *f, ckptio_reader *r) {
  size_t n = ckptio_reader_count(r);
  uint64_t total = 0;
  int wname = 4, wshape = 5, woff = 6, wbytes = 6;
  char shape[256], num[32], hb[32];
  for (size_t i = 0; i < n; i++) {
    ckptio_tensor_info t;
    if (ckptio_reader_info(r, i, &t) < 0) continue;
    total += t.nbytes;
    shape_str(&t, shape, sizeof(shape));
    int l = (int)strlen(t.name);
    if (l > wname) wname = l;
    if ((l = (int)strlen(shape)) > wshape) wshape = l;
    if ((l = snprintf(num, sizeof(num), "%" PRIu64, t.offset)) > woff) woff = l;
    if ((l = snprintf(num, sizeof(num), "%" PRIu64, t.nbytes)) > wbytes) wbytes = l;
  }
  printf("file         %s\n", path);
  printf("format       %s\n", f->format);
  printf("file size    %" PRIu64 " bytes (%s)\n", f->file_size,
         cli_fmt_bytes(f->file_size, hb, sizeof(hb)));
  if (f->data_start) {
    printf("header size  %" PRIu64 " bytes (+ 8-byte length prefix)\n", f->header_bytes);
    printf("data start   %" PRIu64 "\n", f->data_start);
  }
  uint64_t frames, csize, plain;
  if (ckptio_reader_compression(r, &frames, &csize, &plain) == 1) {
    const char *filter = ckptio_reader_metadata_get(r, "ckptio.filter");
    printf("compression  zstd seekable: %" PRIu64 " frames, %" PRIu64 " -> %" PRIu64 " bytes, ratio %.3f, filter %s\n",
           frames, plain, csize, csize ? (double)plain / (double)csize : 0.0, filter ? filter : "none");
  }
  printf("tensors      %zu (%" PRIu64 " bytes, %s)\n", n, total, cli_fmt_bytes(total, hb, sizeof(hb)));
  printf("metadata     %zu keys\n", ckptio_reader_metadata_count(r));
  int sharded = cli_files_of(r) > 0;
  if (sharded) print_shards_table(r);
  printf("\n%-*s  %-5s  %-*s  %*s  %*s  %s%s\n", wname, "name", "dtype", wshape, "shape", woff, "offset",
         wbytes, "nbytes", "crc32", sharded ? "     shard" : "");
  for (size_t i = 0; i < n; i++) {
    ckptio_tensor_info t;
    if (ckptio_reader_info(r, i, &t) < 0) continue;
    shape_str(&t, shape, sizeof(shape));
    char crc[16] = "-";
    if (t.has_crc) snprintf(crc, sizeof(crc), "%08" PRIx32, t.crc32);
    printf("%-*s  %-5s  %-*s  %*" PRIu64 "  %*" PRIu64 "  %s", wname, t.name,
           ckptio_dtype_name(t.dtype), wshape, shape, woff, t.offset, wbytes, t.nbytes, crc);
    size_t np = ckptio_reader_part_count(r, i);
    if (np > 1)
      printf("%*s  %zu parts", (int)(8 - strlen(crc)), "", np);
    else if (sharded)
      printf("%*s  %" PRId64, (int)(8 - strlen(crc)), "", ckptio_reader_shard_of(r, i) + 1);
    printf("\n");
  }
  print_parts_table(r);
  size_t nm = ckptio_reader_metadata_count(r);
  if (nm) printf("\nmetadata\n");
  for (size_t i = 0; i < nm; i++) {
    const char *k, *v;
    if (ckptio_reader_metadata_at(r, i, &k, &v) == 0) printf("  %s = %s\n", k, v);
  }
}

typedef struct inspect_opts {
  const char *plan;
  int json;
} inspect_opts;

static int inspect_option(void *opts, int argc, char **argv, int i) {
  inspect_opts *o = opts;
  if (!strcmp(argv[i], "--json")) return o->json = 1;
  if (!strcmp(argv[i], "--plan") && i + 1 < argc) {
    o->plan = argv[i + 1];
    return 2;
  }
  return 0;
}

int cli_inspect_main(int argc, char **argv) {
  inspect_opts io = {NULL, 0};
  const char *path;
  int n;
  if (cli_args(argc, argv, "inspect", cli_inspect_usage, inspect_option, &io, "FILE", &path, 1, &n))
    return CLI_EXIT_USAGE;
  const char *plan = io.plan;
  const int json = io.json;

  int ret = CLI_EXIT_USAGE;
  ckptio_ctx *ctx = NULL;
  ckptio_reader *r = NULL;
  file_facts facts;
  int rc;
  /* Only the header is read: one thread and the smallest staging ring. */
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  o.threads = 1;
  o.chunk_bytes = 64 << 10;
  o.staging_bytes = 128 << 10;
  if ((rc = ckptio_ctx_create(&o, &ctx)) < 0) {
    fprintf(stderr, "ckptio inspect: %s\n", cli_open_error(rc));
    goto fail;
  }
  if ((rc = ckptio_reader_open(ctx, path, NULL, &r)) < 0) {
    fprintf(stderr, "ckptio inspect: %s\n", cli_open_error(rc));
    ret = cli_exit_for_read_error(rc);
    goto fail;
  }
  if (plan) {
    ret = cli_inspect_plan(r, plan, json);
    goto fail;
  }
  if (cli_files_of(r) > 0) {
    set_facts(r, &facts);
  } else if (ckptio_path_scheme(path)) {
    object_facts(r, &facts);
  } else if ((rc = read_facts(path, &facts)) < 0 &&
             (rc = read_facts(ckptio_reader_shard(r, 0, &path, NULL, NULL) == 0 ? path : "", &facts)) < 0) {
    /* a directory holding one file: its facts are the file's */
    fprintf(stderr, "ckptio inspect: %s: %s\n", path, ckptio_strerror(rc));
    goto fail;
  }
  if (ckptio_reader_compression(r, NULL, NULL, NULL) == 1) { /* the decompressed header's */
    facts.data_start = ckptio_reader_header_bytes(r);
    facts.header_bytes = facts.data_start - 8;
  }
  if (json)
    print_json(path, &facts, r);
  else
    print_table(path, &facts, r);
  ret = fflush(stdout) == 0 ? CLI_EXIT_OK : CLI_EXIT_USAGE;
fail:
  ckptio_reader_close(r);
  ckptio_ctx_free(ctx);
  return ret;
}
