/* The saving side of the manager's kill test (manager_kill_test.py): `save`
 * resumes from the newest complete checkpoint and saves steps in a loop
 * until killed; `check` lists the directory, verifies and loads every
 * checkpoint against the bytes its step must hold, and prints what it
 * found. Linked like a user's program, against the public API only. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>

#include "ckptio.h"
#include "driver.h"

#define NTENSORS 3
static int64_t kRows[NTENSORS] = {256, 384, 40};
#define COLS 1024 /* F32: 1 MiB, 1.5 MiB, 160 KiB per checkpoint (times --scale) */

/* The value of element i of tensor k at `step`: every byte depends on all
 * three, so bytes of another step or tensor never pass for these. */
static float value(uint64_t step, int k, uint64_t i) {
  uint64_t x = (step + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)k << 56) ^ (i * 0xBF58476D1CE4E5B9ull);
  x ^= x >> 31;
  return (float)(x & 0xFFFFFF);
}

static void fill(float *buf, uint64_t step, int k) {
  uint64_t n = (uint64_t)kRows[k] * COLS;
  for (uint64_t i = 0; i < n; i++) buf[i] = value(step, k, i);
}

static int usage(void) {
  fprintf(stderr,
          "usage: crash_driver save DIR [--sharded] [--keep K] [--every N] [--steps N] [--scale S]\n"
          "       crash_driver check DIR [--scale S]\n"
          "DIR may be a storage's prefix (s3://bucket/ckpts); --scale multiplies the\n"
          "tensors' rows (a save long enough to be killed mid-upload).\n");
  return 2;
}

static void on_warning(void *arg, uint64_t step, int code, const char *msg) {
  (void)arg;
  (void)step;
  (void)code;
  fprintf(stderr, "warning: %s\n", msg);
}

static int save_loop(const char *dir, ckptio_manager_options *mo, long steps) {
  ckptio_ctx *ctx = driver_ctx();
  ckptio_manager *m = NULL;
  int rc = ckptio_manager_open(ctx, dir, mo, NULL, &m);
  if (rc < 0) {
    fprintf(stderr, "open: %s\n", ckptio_last_open_error());
    return 2;
  }
  ckptio_manager_set_warning(m, on_warning, NULL);
  uint64_t step = 0;
  rc = ckptio_manager_latest(m, &step, NULL, 0);
  if (rc < 0) {
    fprintf(stderr, "latest: %s\n", ckptio_manager_last_error(m));
    return 2;
  }
  step = rc == 1 ? step + 1 : 1;
  float *bufs[NTENSORS];
  for (int k = 0; k < NTENSORS; k++) bufs[k] = malloc((size_t)kRows[k] * COLS * sizeof(float));
  for (long n = 0; steps < 0 || n < steps; n++, step++) {
    ckptio_writer *w = NULL;
    if ((rc = ckptio_manager_save_begin(m, step, &w)) < 0) break;
    for (int k = 0; k < NTENSORS && rc == 0; k++) {
      fill(bufs[k], step, k);
      char name[16];
      snprintf(name, sizeof(name), "t%d", k);
      ckptio_tensor t = {name, CKPTIO_F32, 2, {kRows[k], COLS}, bufs[k], CKPTIO_DEVICE_HOST};
      rc = ckptio_writer_add(w, &t);
    }
    if (rc == 0) rc = ckptio_writer_commit_async(w);
    if (rc == 0) rc = ckptio_writer_wait_snapshot(w);
    int end = ckptio_manager_save_end(m, w);
    if (rc == 0) rc = end;
    if (rc < 0) break;
    printf("durable %" PRIu64 "\n", step); /* the power-loss test's floor for latest */
    fflush(stdout);
  }
  if (rc < 0) fprintf(stderr, "save of step %" PRIu64 ": %s\n", step, ckptio_manager_last_error(m));
  for (int k = 0; k < NTENSORS; k++) free(bufs[k]);
  ckptio_manager_close(m);
  ckptio_ctx_free(ctx);
  return rc < 0 ? 2 : 0;
}

/* Loads every tensor of the checkpoint and compares it with its step's. */
static int check_content(ckptio_ctx *ctx, const char *path, uint64_t step) {
  ckptio_reader *r = NULL;
  if (ckptio_reader_open(ctx, path, NULL, &r) < 0) {
    printf("BAD %s: %s\n", path, ckptio_last_open_error());
    return -1;
  }
  int bad = ckptio_reader_count(r) != NTENSORS;
  for (int k = 0; k < NTENSORS && !bad; k++) {
    char name[16];
    snprintf(name, sizeof(name), "t%d", k);
    int64_t i = ckptio_reader_find(r, name);
    uint64_t n = (uint64_t)kRows[k] * COLS;
    float *got = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
    fill(want, step, k);
    bad = i < 0 || ckptio_reader_load(r, (size_t)i, got, n * sizeof(float)) < 0 ||
          memcmp(got, want, n * sizeof(float)) != 0;
    free(got);
    free(want);
    if (bad) printf("BAD %s: tensor %s differs from step %" PRIu64 "'s\n", path, name, step);
  }
  ckptio_reader_close(r);
  return bad ? -1 : 0;
}

static int count_strays(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL) n += strncmp(e->d_name, ".ckptio-mgr-", 12) == 0;
  if (d) closedir(d);
  return n;
}

static int check(const char *dir) {
  ckptio_ctx *ctx = driver_ctx();
  ckptio_manager_options mo = CKPTIO_MANAGER_OPTIONS_INIT;
  mo.verify = 1;
  ckptio_manager *m = NULL;
  if (ckptio_manager_open(ctx, dir, &mo, NULL, &m) < 0) {
    printf("BAD open: %s\n", ckptio_last_open_error());
    return 1;
  }
  int64_t n = ckptio_manager_list(m, 1);
  int bad = n < 0, complete = 0;
  uint64_t newest = 0;
  for (int64_t i = 0; i < n; i++) {
    ckptio_checkpoint_info info = CKPTIO_CHECKPOINT_INFO_INIT;
    ckptio_manager_checkpoint(m, (size_t)i, &info);
    /* Publication is atomic: a published checkpoint is never partial. */
    if (!info.complete || !info.verified) {
      printf("BAD %s: %s %s\n", info.dir, info.complete ? "complete but not verified:" : "incomplete:",
             info.detail);
      bad = 1;
      continue;
    }
    if (check_content(ctx, info.path, info.step) < 0) bad = 1;
    complete++;
    newest = info.step;
  }
  uint64_t latest = 0;
  int found = ckptio_manager_latest(m, &latest, NULL, 0);
  if (found != (complete > 0) || (found == 1 && latest != newest)) {
    printf("BAD latest: found %d step %" PRIu64 ", newest complete %" PRIu64 "\n", found, latest, newest);
    bad = 1;
  }
  printf("complete=%d latest=%" PRId64 " strays=%d\n", complete, found == 1 ? (int64_t)latest : (int64_t)-1,
         count_strays(dir));
  ckptio_manager_close(m);
  ckptio_ctx_free(ctx);
  return bad ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc < 3) return usage();
  ckptio_manager_options mo = CKPTIO_MANAGER_OPTIONS_INIT;
  long steps = -1;
  for (int i = 3; i < argc; i++) {
    if (!strcmp(argv[i], "--scale") && i + 1 < argc && atoi(argv[i + 1]) > 0) {
      int scale = atoi(argv[++i]);
      for (int k = 0; k < NTENSORS; k++) kRows[k] *= scale;
    } else if (!strcmp(argv[1], "check")) {
      return usage();
    } else if (!strcmp(argv[i], "--sharded"))
      mo.max_shard_bytes = 1 << 20;
    else if (!strcmp(argv[i], "--keep") && i + 1 < argc)
      mo.keep_last = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--every") && i + 1 < argc)
      mo.keep_every = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
      steps = atol(argv[++i]);
    else
      return usage();
  }
  if (!strcmp(argv[1], "check")) return check(argv[2]);
  if (strcmp(argv[1], "save") != 0) return usage();
  return save_loop(argv[2], &mo, steps);
}
