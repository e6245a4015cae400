/*
 * `ckptio bench --dir s3://bucket/prefix` (or any SCHEME:// a storage
 * serves): the save and the loads of the synthetic model through an object
 * storage, each next to the storage's own limit measured in the same run
 * (A B A B), as the local bench sets them next to the disk's.
 *
 * The limits go through the very verbs the library's pipelines call
 * (ckptio_ctx_storage: create / write / publish, open_read / read), with
 * nothing of a checkpoint around them: no format, no staging ring, no CRC.
 * An upload is 8 MiB parts straight from the model's memory, 16 or 32 in
 * flight; a download is ranged GETs of the saved object into one touched
 * buffer, 8 MiB ones 16 or 32 in flight and 16 MiB ones (two whole parts,
 * as the library's loads into host memory) 32 in flight. So a ratio below
 * 1 is what the pipeline costs over the storage client; what the client
 * itself costs next to other clients is for bench/s3 (a plain libcurl
 * client and boto3, in the same rounds).
 *
 * On object storage there is no page cache to drop or fill: both loads
 * fetch every byte. "cold" is the first load after the save, "warm" the
 * same load again (a server with a cache of its own may serve it faster).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/bench.h"

#define SB_PART (8ull << 20) /* the parts and ranges of the limits: the library's default chunk */
#define SB_WAYS 2
static const int kDepth[SB_WAYS] = {16, 32}; /* runai's S3 concurrency; the library's default workers */
/* The download's ways: requests in flight, bytes a GET. */
#define SB_GET_WAYS 3
static const struct {
  int depth;
  uint64_t range;
} kGet[SB_GET_WAYS] = {{16, SB_PART}, {32, SB_PART}, {32, 2 * SB_PART}};

typedef struct sb_run {
  double save_s, snapshot_s, cold_s, warm_s;
  double put_s[SB_WAYS], get_s[SB_GET_WAYS];
  ckptio_stats save, cold, warm;
} sb_run;

typedef struct sb {
  bench_opts *o;
  cli_model *m;
  ckptio_ctx *ctx;
  const ckptio_storage_ops *ops;
  void *self;
  uint8_t *dst; /* load destinations and the downloads' buffer, touched */
  uint64_t dst_bytes;
  ckptio_load_request *reqs;
  uint64_t raw_bytes;   /* uploaded by the upload limit: tensor bytes rounded up to 4 KiB */
  uint64_t get_bytes;   /* read by the download limit: the object's first bytes, as many */
  uint64_t obj_bytes;   /* the saved object */
  char base[4096], ckpt[4200], raw[4200];
  char err[1024];
} sb;

static volatile sig_atomic_t g_stop; /* a signal: stop at the next step, then clean up */

static void on_signal(int sig) {
  if (g_stop) { /* the second: now, leaving the objects (say where) */
    static const char kMsg[] = "\nckptio bench: stopped; objects named .ckptio-bench-* may remain\n";
    ssize_t ignored = write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
    (void)ignored;
    signal(sig, SIG_DFL);
    raise(sig);
  }
  g_stop = sig;
}

static int fail(sb *s, const char *step, int rc, const char *detail) {
  fprintf(stderr, "ckptio bench: %s: %s\n", step, detail && *detail ? detail : ckptio_strerror(rc));
  (void)s;
  return rc;
}

/* ------------------------------------------------------------ the limits */

typedef struct xfer {
  sb *s;
  void *obj;
  uint8_t *buf;
  uint64_t n, part;          /* part: the bytes of each request */
  int writing;
  atomic_uint_fast64_t next; /* the next part */
  atomic_int rc;             /* the first failure */
  char err[512];             /* its sentence, written by the thread that set rc */
} xfer;

static void *xfer_worker(void *arg) {
  xfer *x = arg;
  char e[512];
  for (;;) {
    uint64_t off = (uint64_t)atomic_fetch_add(&x->next, 1) * x->part;
    if (off >= x->n || atomic_load(&x->rc)) break;
    size_t len = (size_t)(x->n - off < x->part ? x->n - off : x->part);
    e[0] = '\0';
    int rc = x->writing ? x->s->ops->write(x->s->self, x->obj, x->buf + off, len, off, e, sizeof(e))
                        : x->s->ops->read(x->s->self, x->obj, x->buf + off, len, off, e, sizeof(e));
    int none = 0;
    if (rc < 0 && atomic_compare_exchange_strong(&x->rc, &none, rc)) snprintf(x->err, sizeof(x->err), "%s", e);
  }
  return NULL;
}

/* depth threads, each one request at a time: depth requests in flight. */
static int xfer_run(xfer *x, int depth) {
  pthread_t t[64];
  int started = 0;
  for (; started < depth; started++)
    if (pthread_create(&t[started], NULL, xfer_worker, x) != 0) break;
  if (!started) return -EAGAIN;
  for (int i = 0; i < started; i++) pthread_join(t[i], NULL);
  return atomic_load(&x->rc);
}

/* A plain multipart upload of raw_bytes of the model's memory: create,
 * parts, publish (CompleteMultipartUpload), all inside the time, as the
 * save has them inside its own. */
static int raw_put(sb *s, int depth, double *secs) {
  xfer x = {.s = s, .buf = s->m->arena, .n = s->raw_bytes, .part = SB_PART, .writing = 1};
  double t0 = cli_now();
  int rc = s->ops->create(s->self, s->raw, s->raw_bytes, SB_PART, &x.obj, s->err, sizeof(s->err));
  if (rc < 0) return fail(s, "raw upload: create", rc, s->err);
  if ((rc = xfer_run(&x, depth)) < 0) {
    s->ops->abandon(s->self, x.obj);
    return fail(s, "raw upload", rc, x.err);
  }
  if ((rc = s->ops->publish(s->self, x.obj, s->err, sizeof(s->err))) < 0)
    return fail(s, "raw upload: publish", rc, s->err);
  *secs = cli_now() - t0;
  return 0;
}

/* Ranged GETs of the saved object's first get_bytes into the touched
 * destinations, the way kGet[way]. The HEAD of open_read is inside the
 * time, as the load has its own open inside its time. */
static int raw_get(sb *s, int way, double *secs) {
  xfer x = {.s = s, .buf = s->dst, .n = s->get_bytes, .part = kGet[way].range};
  uint64_t size = 0;
  double t0 = cli_now();
  int rc = s->ops->open_read(s->self, s->ckpt, &x.obj, &size, s->err, sizeof(s->err));
  if (rc < 0) return fail(s, "raw GET: open", rc, s->err);
  if (size != s->obj_bytes) {
    s->ops->close_read(s->self, x.obj);
    return fail(s, "raw GET", -EIO, "the object changed size between runs");
  }
  rc = xfer_run(&x, kGet[way].depth);
  *secs = cli_now() - t0;
  s->ops->close_read(s->self, x.obj);
  return rc < 0 ? fail(s, "raw GET", rc, x.err) : 0;
}

/* ------------------------------------------------------------ save, loads */

static int save(sb *s, int run, sb_run *out) {
  return bench_save_model(s->ctx, s->ckpt, CKPTIO_FORMAT_SAFETENSORS, s->m, run, &out->snapshot_s, &out->save_s,
                          &out->save);
}

static int load(sb *s, int run, const char *what, double *secs, ckptio_stats *st) {
  ckptio_reader *r = NULL;
  cli_progress bar = {0};
  char label[48];
  snprintf(label, sizeof(label), "run %d %s load", run + 1, what);
  if (s->o->verify) memset(s->dst, 0, s->dst_bytes); /* a skipped byte shows */
  double t0 = cli_now();
  int rc = ckptio_reader_open(s->ctx, s->ckpt, NULL, &r);
  if (rc < 0) return fail(s, "load: open", rc, cli_open_error(rc));
  for (size_t i = 0; i < s->m->count && rc == 0; i++) {
    int64_t idx = ckptio_reader_find(r, s->m->tensors[i].name);
    if (idx < 0) {
      rc = (int)idx;
      fprintf(stderr, "ckptio bench: load: tensor '%s' not in the object\n", s->m->tensors[i].name);
      break;
    }
    s->reqs[i].index = (size_t)idx;
    s->reqs[i].dst = s->dst + s->m->arena_offset[i];
    s->reqs[i].device = CKPTIO_DEVICE_HOST;
    s->reqs[i].dst_bytes = (uint64_t)ckptio_tensor_nbytes(s->m->tensors[i].dtype, s->m->tensors[i].ndim,
                                                          s->m->tensors[i].shape);
  }
  if (rc == 0) {
    cli_progress_start(&bar, label, cli_progress_reader, r);
    rc = ckptio_reader_load_many(r, s->reqs, s->m->count);
    *secs = cli_now() - t0;
    cli_progress_stop(&bar);
    if (rc < 0) fail(s, "load", rc, ckptio_reader_last_error(r));
  }
  if (rc == 0) {
    st->size = sizeof(*st);
    ckptio_reader_stats(r, st);
  }
  for (size_t i = 0; rc == 0 && s->o->verify && i < s->m->count; i++)
    if (memcmp(s->dst + s->m->arena_offset[i], s->m->arena + s->m->arena_offset[i], s->reqs[i].dst_bytes)) {
      fprintf(stderr, "ckptio bench: %s load: tensor '%s' differs from what was saved\n", what,
              s->m->tensors[i].name);
      rc = CKPTIO_E_CHECKSUM;
    }
  size_t unchecked = 0;
  if (rc == 0 && s->o->verify && (rc = ckptio_reader_verify(r, &unchecked)) < 0)
    fail(s, "verify", rc, ckptio_reader_last_error(r));
  ckptio_reader_close(r);
  return rc;
}

/* One run, A B A B: save, the upload limit (each way), the cold load, the
 * download limit (each way), the warm load. */
static int one_run(sb *s, int run, sb_run *out) {
  int rc = save(s, run, out);
  if (rc == 0 && !s->obj_bytes) { /* the object's size (untimed): the GETs read as many bytes as the upload */
    void *obj = NULL;
    if ((rc = s->ops->open_read(s->self, s->ckpt, &obj, &s->obj_bytes, s->err, sizeof(s->err))) < 0)
      return fail(s, "open", rc, s->err);
    s->ops->close_read(s->self, obj);
    s->get_bytes = s->obj_bytes < s->raw_bytes ? s->obj_bytes : s->raw_bytes;
  }
  for (int w = 0; rc == 0 && w < SB_WAYS && !g_stop; w++) rc = raw_put(s, kDepth[w], &out->put_s[w]);
  if (rc == 0 && !g_stop) rc = load(s, run, "cold", &out->cold_s, &out->cold);
  for (int w = 0; rc == 0 && w < SB_GET_WAYS && !g_stop; w++) rc = raw_get(s, w, &out->get_s[w]);
  if (rc == 0 && !g_stop) rc = load(s, run, "warm", &out->warm_s, &out->warm);
  return rc;
}

/* The bench's objects removed, and any upload of theirs still open
 * aborted. @return 0, or the first failure (printed). */
static int cleanup(sb *s) {
  char prefix[4200];
  int rc = 0, r;
  const char *paths[] = {s->ckpt, s->raw};
  for (int i = 0; i < 2; i++)
    if ((r = s->ops->remove ? s->ops->remove(s->self, paths[i], s->err, sizeof(s->err)) : 0) < 0 && !rc)
      rc = fail(s, "removing the bench's objects", r, s->err);
  snprintf(prefix, sizeof(prefix), "%s/.ckptio-bench-%ld.", s->base, (long)getpid());
  if (s->ops->sweep && (r = s->ops->sweep(s->self, prefix, s->err, sizeof(s->err))) < 0 && !rc)
    rc = fail(s, "aborting the bench's open uploads", r, s->err);
  return rc;
}

/* ------------------------------------------------------------ report */

enum { K_SAVE, K_PUT, K_SAVE_RATIO = K_PUT + SB_WAYS, K_PUT_BEST, K_SAVE_S, K_SNAP_S, K_COLD, K_GET,
       K_COLD_RATIO = K_GET + SB_GET_WAYS, K_GET_BEST, K_WARM, K_WARM_RATIO, K_SAVE_COPY, K_SAVE_WRITE,
       K_SAVE_COMMIT, K_COLD_READ, K_COUNT };

static double gbps(uint64_t n, double s) { return s > 0 ? (double)n / s / 1e9 : 0; }

/* The shortest of the n ways' times (0: none ran). */
static double best(const double *t, int n) {
  double b = 0;
  for (int w = 0; w < n; w++)
    if (t[w] > 0 && (b == 0 || t[w] < b)) b = t[w];
  return b;
}

static double value(const sb *s, const sb_run *x, int k) {
  uint64_t data = s->m->tensor_bytes;
  if (k >= K_PUT && k < K_PUT + SB_WAYS) return gbps(s->raw_bytes, x->put_s[k - K_PUT]);
  if (k >= K_GET && k < K_GET + SB_GET_WAYS) return gbps(s->get_bytes, x->get_s[k - K_GET]);
  switch (k) {
    case K_SAVE: return gbps(data, x->save_s);
    case K_PUT_BEST: return gbps(s->raw_bytes, best(x->put_s, SB_WAYS));
    case K_SAVE_RATIO: return gbps(data, x->save_s) / gbps(s->raw_bytes, best(x->put_s, SB_WAYS));
    case K_SAVE_S: return x->save_s;
    case K_SNAP_S: return x->snapshot_s;
    case K_COLD: return gbps(data, x->cold_s);
    case K_GET_BEST: return gbps(s->get_bytes, best(x->get_s, SB_GET_WAYS));
    case K_COLD_RATIO: return gbps(data, x->cold_s) / gbps(s->get_bytes, best(x->get_s, SB_GET_WAYS));
    case K_WARM: return gbps(data, x->warm_s);
    case K_WARM_RATIO: return gbps(data, x->warm_s) / gbps(s->get_bytes, best(x->get_s, SB_GET_WAYS));
    case K_SAVE_COPY: return x->save.copy_seconds;
    case K_SAVE_WRITE: return x->save.write_seconds;
    case K_SAVE_COMMIT: return x->save.commit_seconds;
    case K_COLD_READ: return x->cold.copy_seconds;
    default: return 0;
  }
}

static cli_stat stat_of(const sb *s, const sb_run *runs, int n, int k) {
  double v[1000];
  int i = 0;
  for (; i < n && i < 1000; i++) v[i] = value(s, &runs[i], k);
  return cli_stat_of(v, (size_t)i);
}

static void row(FILE *out, const sb *s, const sb_run *runs, int n, const char *name, const char *unit, int k) {
  cli_stat st = stat_of(s, runs, n, k);
  if (!strcmp(unit, "x"))
    fprintf(out, "  %-30s %9.2fx %9.2fx %9.2fx\n", name, st.median, st.min, st.max);
  else
    fprintf(out, "  %-24s %-5s %9.3f  %9.3f  %9.3f\n", name, unit, st.median, st.min, st.max);
}

static void print_command(FILE *out, const sb *s, const ckptio_options *f) {
  cli_shell_word(out, s->o->argv0);
  fputs(" bench --size ", out);
  cli_shell_word(out, s->o->size_str);
  fprintf(out, " --shapes %s --dir ", bench_shapes_name(s->o->shapes));
  cli_shell_word(out, s->o->dir);
  fprintf(out, " --runs %d --threads %d --chunk %zu --staging %zu%s%s%s", s->o->runs, f->threads, f->chunk_bytes,
          f->staging_bytes, f->crc ? "" : " --no-crc", s->o->verify ? " --verify" : "", s->o->json ? " --json" : "");
}

/* The JSON keys of the series, in the enum's order. */
static const char *kNames[] = {"save_gbps",          "raw_upload_16_gbps",   "raw_upload_32_gbps",
                               "save_vs_raw_upload", "raw_upload_gbps",      "save_s",
                               "snapshot_s",         "cold_load_gbps",       "raw_get_16_gbps",
                               "raw_get_32_gbps",    "raw_get_32x16m_gbps",  "cold_load_vs_raw_get",
                               "raw_get_gbps",       "warm_load_gbps",       "warm_load_vs_raw_get",
                               "save_copy_busy_s",   "save_write_busy_s",    "save_commit_s",
                               "cold_read_busy_s"};
_Static_assert(sizeof(kNames) / sizeof(kNames[0]) == K_COUNT, "a JSON key per series");

static void report_json(FILE *out, const sb *s, const sb_run *runs, int n, const ckptio_options *f,
                        uint64_t rss_base, uint64_t rss_peak) {
  char *buf = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&buf, &len);
  if (m) {
    print_command(m, s, f);
    fclose(m);
  }
  fputs("{\"command\":", out);
  cli_json_string(out, buf ? buf : "");
  free(buf);
  fprintf(out, ",\"version\":");
  cli_json_string(out, ckptio_version_string());
  fputs(",\"storage\":", out);
  cli_json_string(out, s->base);
  fprintf(out, ",\"limits_via\":\"ckptio_ctx_storage verbs\",\"part_bytes\":%llu,\"depths\":[%d,%d]",
          (unsigned long long)SB_PART, kDepth[0], kDepth[1]);
  fputs(",\"get_ways\":[", out);
  for (int w = 0; w < SB_GET_WAYS; w++)
    fprintf(out, "%s{\"depth\":%d,\"range_bytes\":%llu}", w ? "," : "", kGet[w].depth,
            (unsigned long long)kGet[w].range);
  fputc(']', out);
  fprintf(out, ",\"model\":{\"tensors\":%zu,\"bytes\":%" PRIu64 ",\"object_bytes\":%" PRIu64 "}", s->m->count,
          s->m->tensor_bytes, s->obj_bytes);
  fprintf(out, ",\"raw\":{\"upload_bytes\":%" PRIu64 ",\"get_bytes\":%" PRIu64 "}", s->raw_bytes, s->get_bytes);
  fputs(",\"runs\":[", out);
  for (int i = 0; i < n; i++)
    fprintf(out, "%s{\"save_s\":%.6f,\"snapshot_s\":%.6f,\"raw_upload_s\":[%.6f,%.6f],\"cold_s\":%.6f,"
            "\"raw_get_s\":[%.6f,%.6f,%.6f],\"warm_s\":%.6f}", i ? "," : "", runs[i].save_s, runs[i].snapshot_s,
            runs[i].put_s[0], runs[i].put_s[1], runs[i].cold_s, runs[i].get_s[0], runs[i].get_s[1], runs[i].get_s[2],
            runs[i].warm_s);
  fputs("]", out);
  for (int k = 0; k < K_COUNT; k++) {
    cli_stat st = stat_of(s, runs, n, k);
    fprintf(out, ",\"%s\":{\"median\":%.6g,\"min\":%.6g,\"max\":%.6g}", kNames[k], st.median, st.min, st.max);
  }
  fprintf(out, ",\"peak_rss_bytes\":%" PRIu64 ",\"rss_baseline_bytes\":%" PRIu64 "}\n", rss_peak, rss_base);
}

static void report_table(FILE *out, const sb *s, const sb_run *runs, int n, const ckptio_options *f,
                         const cli_machine *mc, uint64_t rss_base, uint64_t rss_peak) {
  char b1[32], b2[32], b3[32];
  const char *ep = getenv("AWS_ENDPOINT_URL");
  fprintf(out, "ckptio %s bench: %d run%s on a storage, each step next to the storage's own limit (A B A B)\n\n",
          ckptio_version_string(), n, n == 1 ? "" : "s");
  fputs("command   ", out);
  print_command(out, s, f);
  fprintf(out, "\nmachine   %ld cpus (%s), %s memory, %s\n", mc->nproc, mc->cpu[0] ? mc->cpu : "?",
          cli_fmt_bytes(mc->mem_bytes, b1, sizeof(b1)), mc->kernel);
  fprintf(out, "storage   %s", s->base);
  if (!strncmp(s->base, "s3://", 5)) fprintf(out, " (endpoint %s)", ep && *ep ? ep : "AWS's, from AWS_REGION");
  fprintf(out, "\nlimits    the storage's own, through the library's storage client (ckptio_ctx_storage's\n"
          "          verbs, as the pipelines call them), with no format, staging ring or CRC:\n"
          "          raw upload: one multipart upload of the same bytes, %llu MiB parts straight from the\n"
          "          model's memory, %d or %d in flight, create + parts + complete timed;\n"
          "          raw GET: %llu MiB ranged GETs of the saved object, %d or %d in flight, and %llu MiB\n"
          "          ones %d in flight, into one touched buffer, its HEAD timed; the best way of each run\n"
          "          is the limit\n",
          (unsigned long long)(SB_PART >> 20), kDepth[0], kDepth[1], (unsigned long long)(kGet[0].range >> 20),
          kGet[0].depth, kGet[1].depth, (unsigned long long)(kGet[2].range >> 20), kGet[2].depth);
  fprintf(out, "options   threads %d, chunk %s, staging %s, crc %s, verify %s\n", f->threads,
          cli_fmt_bytes(f->chunk_bytes, b1, sizeof(b1)), cli_fmt_bytes(f->staging_bytes, b2, sizeof(b2)),
          f->crc ? "on" : "off", s->o->verify ? "on (every byte compared, every CRC checked)" : "off");
  fputs("model     ", out);
  if (s->m->shapes == CLI_SHAPES_LLM)
    fprintf(out, "llm: hidden %d, %d layers, vocab %d, mlp %d", s->m->hidden, s->m->layers, s->m->vocab,
            s->m->inter);
  else
    fprintf(out, "linear: 10 x Linear(%d, %d) fp32 + bias", s->m->linear_dim, s->m->linear_dim);
  fprintf(out, "; %zu tensors, %s (%" PRIu64 " bytes)\nobject    %" PRIu64 " bytes; the limits move %" PRIu64
          " (upload) and %" PRIu64 " (GET)\n\n", s->m->count, cli_fmt_bytes(s->m->tensor_bytes, b1, sizeof(b1)),
          s->m->tensor_bytes, s->obj_bytes, s->raw_bytes, s->get_bytes);
  fprintf(out, "  %-30s %10s %10s %10s\n", "", "median", "min", "max");
  row(out, s, runs, n, "save", "GB/s", K_SAVE);
  row(out, s, runs, n, "raw upload 16x8M", "GB/s", K_PUT);
  row(out, s, runs, n, "raw upload 32x8M", "GB/s", K_PUT + 1);
  row(out, s, runs, n, "raw upload (best)", "GB/s", K_PUT_BEST);
  row(out, s, runs, n, "save / raw upload", "x", K_SAVE_RATIO);
  row(out, s, runs, n, "save time", "s", K_SAVE_S);
  row(out, s, runs, n, "time to snapshot", "s", K_SNAP_S);
  fputc('\n', out);
  row(out, s, runs, n, "cold load (first fetch)", "GB/s", K_COLD);
  row(out, s, runs, n, "raw GET 16x8M", "GB/s", K_GET);
  row(out, s, runs, n, "raw GET 32x8M", "GB/s", K_GET + 1);
  row(out, s, runs, n, "raw GET 32x16M", "GB/s", K_GET + 2);
  row(out, s, runs, n, "raw GET (best)", "GB/s", K_GET_BEST);
  row(out, s, runs, n, "cold load / raw GET", "x", K_COLD_RATIO);
  row(out, s, runs, n, "warm load (again)", "GB/s", K_WARM);
  row(out, s, runs, n, "warm load / raw GET", "x", K_WARM_RATIO);
  fprintf(out, "\nstages (median; busy time summed over the %d workers)\n", f->threads);
  row(out, s, runs, n, "save: copy + CRC", "s", K_SAVE_COPY);
  row(out, s, runs, n, "save: write (UploadPart)", "s", K_SAVE_WRITE);
  row(out, s, runs, n, "save: commit (Complete)", "s", K_SAVE_COMMIT);
  row(out, s, runs, n, "cold load: GET + CRC", "s", K_COLD_READ);
  uint64_t above = rss_peak > rss_base ? rss_peak - rss_base : 0, staging = 0;
  for (int i = 0; i < n; i++)
    if (runs[i].save.staging_bytes > staging) staging = runs[i].save.staging_bytes;
  fprintf(out, "\npeak RSS  %s; %s above the model's tensors and load buffers (%s)\n",
          cli_fmt_bytes(rss_peak, b1, sizeof(b1)), cli_fmt_bytes(above, b2, sizeof(b2)),
          cli_fmt_bytes(rss_base, b3, sizeof(b3)));
  fprintf(out, "staging   %s (ckptio_stats.staging_bytes)\n", cli_fmt_bytes(staging, b1, sizeof(b1)));
}

/* ------------------------------------------------------------ main */

int bench_storage_main(bench_opts *o) {
  if (o->keep || o->gpu >= 0 || o->max_shard || o->format != CKPTIO_FORMAT_SAFETENSORS) {
    fprintf(stderr, "ckptio bench: --dir %s: on a storage the bench saves safetensors from host memory only "
            "(no --keep, --device cuda, --max-shard-size or --format pt)\n", o->dir);
    return CLI_EXIT_USAGE;
  }
  sb s;
  memset(&s, 0, sizeof(s));
  s.o = o;
  size_t len = strlen(o->dir);
  while (len > 0 && o->dir[len - 1] == '/') len--;
  if (len >= sizeof(s.base) - 64) {
    fprintf(stderr, "ckptio bench: --dir is too long\n");
    return CLI_EXIT_USAGE;
  }
  memcpy(s.base, o->dir, len);
  snprintf(s.ckpt, sizeof(s.ckpt), "%s/.ckptio-bench-%ld.safetensors", s.base, (long)getpid());
  snprintf(s.raw, sizeof(s.raw), "%s/.ckptio-bench-%ld.raw", s.base, (long)getpid());

  int ret = CLI_EXIT_USAGE, rc, made = 0;
  cli_machine machine;
  cli_model model;
  memset(&model, 0, sizeof(model));
  sb_run *runs = calloc((size_t)o->runs, sizeof(*runs));
  int done = 0;
  cli_machine_probe(&machine, ".");
  if (!runs) goto out;
  if ((rc = cli_model_build(&model, o->shapes, o->size_given || o->shapes == CLI_SHAPES_LLM ? o->size : 0)) < 0) {
    fail(&s, "building the model", rc, NULL);
    goto out;
  }
  s.m = &model;
  s.raw_bytes = (model.tensor_bytes + 4095) / 4096 * 4096;
  s.dst_bytes = model.arena_bytes > s.raw_bytes ? model.arena_bytes : s.raw_bytes;
  s.dst = cli_buffer_alloc(s.dst_bytes);
  s.reqs = calloc(model.count, sizeof(*s.reqs));
  if (!s.dst || !s.reqs) {
    fail(&s, "allocating load buffers", -ENOMEM, NULL);
    goto out;
  }
  uint64_t rss_base = bench_maxrss_bytes();

  ckptio_options co = bench_ctx_options(o);
  if ((rc = ckptio_ctx_create(&co, &s.ctx)) < 0) {
    fail(&s, "creating the context", rc, cli_open_error(rc));
    goto out;
  }
  ckptio_options f = CKPTIO_OPTIONS_INIT;
  ckptio_ctx_options(s.ctx, &f);
  rc = ckptio_ctx_storage(s.ctx, s.ckpt, &s.ops, &s.self, s.err, sizeof(s.err));
  if (rc <= 0 || !s.ops->create || !s.ops->read) {
    fail(&s, "--dir", rc < 0 ? rc : CKPTIO_E_INVALID_ARG,
         rc < 0 ? s.err : "the storage cannot be written (no create verb)");
    goto out;
  }
  made = 1;
  bench_catch_signals(on_signal);

  for (; done < o->runs && !g_stop; done++) {
    if ((rc = one_run(&s, done, &runs[done])) < 0) {
      ret = rc == CKPTIO_E_CHECKSUM ? CLI_EXIT_INVALID : CLI_EXIT_USAGE;
      goto out;
    }
  }
  if (g_stop) {
    fprintf(stderr, "ckptio bench: interrupted; the bench's objects removed\n");
    ret = 128 + g_stop;
    goto out;
  }
  uint64_t rss_peak = bench_maxrss_bytes();
  if (o->json)
    report_json(stdout, &s, runs, done, &f, rss_base, rss_peak);
  else
    report_table(stdout, &s, runs, done, &f, &machine, rss_base, rss_peak);
  ret = fflush(stdout) == 0 ? CLI_EXIT_OK : CLI_EXIT_USAGE;
out:
  if (made && cleanup(&s) < 0 && ret == CLI_EXIT_OK) ret = CLI_EXIT_USAGE;
  ckptio_ctx_free(s.ctx);
  free(s.reqs);
  cli_buffer_free(s.dst, s.dst_bytes);
  cli_model_free(&model);
  free(runs);
  return ret;
}
