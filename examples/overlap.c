/*
 * overlap.c — a checkpoint that costs the training loop its copy, not its
 * write: commit right after the optimizer step, run the next forward and
 * backward (which only read the weights) while ckptio copies them, and wait
 * for the snapshot just before the next optimizer step (which writes them).
 * With snapshot memory sized to the state, the copy is all the loop waits
 * for; the file is written behind.
 *
 * The "model" is host memory: forward and backward read every weight a few
 * times, the optimizer step updates every weight. The program times the
 * same steps without checkpoints, then with one every EVERY steps, and
 * prints the overhead per checkpoint.
 *
 *   cc -std=c11 -O2 overlap.c -I include -L build -lckptio -o overlap
 *   ./overlap /tmp/ckpt [MiB of weights (256)] [steps (40)] [every (10)]
 *
 * Exit status: 0 the last checkpoint holds the weights of its step, 1 not,
 * 2 an error.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckptio.h"

#define NT 8 /* weight tensors */

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct model {
  float *w[NT];
  size_t n; /* floats per tensor */
  double sink;
} model;

/* Forward and backward: read every weight three times. */
static void forward_backward(model *m) {
  for (int pass = 0; pass < 3; pass++)
    for (int t = 0; t < NT; t++) {
      double s = 0;
      for (size_t i = 0; i < m->n; i += 4) s += m->w[t][i] + m->w[t][i + 1] + m->w[t][i + 2] + m->w[t][i + 3];
      m->sink += s;
    }
}

/* The optimizer step: every weight changes. */
static void optimizer_step(model *m, int step) {
  float g = 1e-3f * (float)step;
  for (int t = 0; t < NT; t++)
    for (size_t i = 0; i < m->n; i++) m->w[t][i] = m->w[t][i] * 0.999f + g;
}

static int fail(const char *what, const char *detail) {
  fprintf(stderr, "overlap: %s: %s\n", what, detail);
  return 2;
}

/* Runs `steps` steps, checkpointing every `every` (0: never) into path.
 * *ckpt_step is the step of the last checkpoint, *copy the weights then. */
static int run(ckptio_ctx *ctx, model *m, int steps, int every, const char *path, double *seconds, int *ckpt_step,
               float *copy) {
  ckptio_writer *w = NULL;
  double t0 = now();
  for (int step = 1; step <= steps; step++) {
    forward_backward(m); /* overlaps the copy of a checkpoint started last step */
    if (w) {
      if (ckptio_writer_wait_snapshot(w) < 0) return fail("snapshot", ckptio_writer_last_error(w));
    }
    optimizer_step(m, step);
    if (w && ckptio_writer_poll_durable(w) == 1) { /* done writing: close it without waiting */
      ckptio_writer_close(w);
      w = NULL;
    }
    if (every && step % every == 0) {
      if (w) { /* the previous one is still writing: this is where a slow disk shows */
        if (ckptio_writer_wait_durable(w) < 0) return fail("durable", ckptio_writer_last_error(w));
        ckptio_writer_close(w);
      }
      if (ckptio_writer_open(ctx, path, CKPTIO_FORMAT_SAFETENSORS, NULL, &w) < 0)
        return fail("open", ckptio_last_open_error());
      for (int t = 0; t < NT; t++) {
        char name[32];
        snprintf(name, sizeof(name), "layer%d.weight", t);
        ckptio_tensor d = {.name = name, .dtype = CKPTIO_F32, .ndim = 1, .shape = {(int64_t)m->n}, .data = m->w[t]};
        if (ckptio_writer_add(w, &d) < 0) return fail("add", ckptio_writer_last_error(w));
      }
      if (ckptio_writer_commit_async(w) < 0) return fail("commit", ckptio_writer_last_error(w));
      *ckpt_step = step;
      if (step + every > steps) memcpy(copy, m->w[0], m->n * sizeof(float)); /* the last one, to check */
    }
  }
  if (w) {
    if (ckptio_writer_wait_durable(w) < 0) return fail("durable", ckptio_writer_last_error(w));
    ckptio_writer_close(w);
  }
  *seconds = now() - t0;
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: overlap DIR [MiB of weights (256)] [steps (40)] [every (10)]\n");
    return 2;
  }
  size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 256;
  int steps = argc > 3 ? atoi(argv[3]) : 40, every = argc > 4 ? atoi(argv[4]) : 10;
  char path[4096];
  snprintf(path, sizeof(path), "%s/overlap.safetensors", argv[1]);
  model m = {.n = (mib << 20) / NT / sizeof(float) / 4 * 4};
  for (int t = 0; t < NT; t++) {
    if (!(m.w[t] = malloc(m.n * sizeof(float)))) return fail("malloc", "out of memory");
    for (size_t i = 0; i < m.n; i++) m.w[t][i] = (float)(i % 1000) * 1e-3f;
  }
  float *copy = malloc(m.n * sizeof(float)), *back = malloc(m.n * sizeof(float));
  if (!copy || !back) return fail("malloc", "out of memory");

  /* Snapshot memory for the whole state: the snapshot is the copy alone. */
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  o.snapshot_bytes = NT * m.n * sizeof(float) + (1u << 20);
  o.cuda = 0;
  ckptio_ctx *ctx;
  if (ckptio_ctx_create(&o, &ctx) < 0) return fail("context", ckptio_last_open_error());

  double base, with;
  int ckpt_step = 0, rc;
  if ((rc = run(ctx, &m, steps, 0, path, &base, &ckpt_step, copy)) ||
      (rc = run(ctx, &m, steps, every, path, &with, &ckpt_step, copy)))
    return rc;
  int ckpts = steps / every;
  double per = ckpts ? (with - base) / ckpts : 0;
  printf("overlap: %zu MiB of weights, %d steps: %.3f s without checkpoints, %.3f s with %d\n", mib, steps, base,
         with, ckpts);
  printf("overlap: %.1f ms per step, overhead %.1f ms per checkpoint (%.1f%% of the loop's time)\n",
         base / steps * 1e3, per * 1e3, base > 0 ? (with - base) / base * 100 : 0);

  ckptio_reader *r;
  int64_t i;
  if (ckptio_reader_open(ctx, path, NULL, &r) < 0) return fail("reopen", ckptio_last_open_error());
  if ((i = ckptio_reader_find(r, "layer0.weight")) < 0 ||
      ckptio_reader_load(r, (size_t)i, back, m.n * sizeof(float)) < 0)
    return fail("load", ckptio_reader_last_error(r));
  ckptio_reader_close(r);
  int same = memcmp(back, copy, m.n * sizeof(float)) == 0;
  printf("overlap: the last checkpoint (step %d) %s\n", ckpt_step,
         same ? "holds the weights of its step" : "DOES NOT hold the weights of its step");
  ckptio_ctx_free(ctx);
  for (int t = 0; t < NT; t++) free(m.w[t]);
  free(copy);
  free(back);
  (void)m.sink;
  return same ? 0 : 1;
}
