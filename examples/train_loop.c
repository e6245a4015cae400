/*
 * train_loop.c — checkpointing a C training loop with ckptio without
 * stalling it, then restoring the checkpoint straight onto the GPU.
 *
 * The "training" is a cudaMemsetAsync per weight on the loop's own stream:
 * step s sets every byte of weight i to value(s, i), so the bytes of a
 * checkpoint tell exactly which step they were taken at. The CUDA runtime is
 * loaded with dlopen ($CKPTIO_CUDART, else libcudart.so.13), as ckptio does;
 * without CUDA the same loop runs on host tensors and says so.
 *
 *   cc -std=c11 -O2 train_loop.c -I include -L build -lckptio -ldl -o train_loop
 *   ./train_loop /tmp/ckpt [steps] [every]
 *
 * Exit status: 0 restored values match, 1 they do not, 2 an error.
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckptio.h"

/* ------------------------------------------------------------ the "framework" */

/* The few CUDA runtime calls the loop makes for itself; cudaError_t is an
 * int, cudaStream_t a pointer (cuda_runtime_api.h is not needed). */
static struct {
  int (*SetDevice)(int);
  int (*Malloc)(void **, size_t);
  int (*Free)(void *);
  int (*StreamCreateWithFlags)(void **, unsigned);
  int (*StreamDestroy)(void *);
  int (*StreamSynchronize)(void *);
  int (*MemsetAsync)(void *, int, size_t, void *);
  int (*Memcpy)(void *, const void *, size_t, int);
  const char *(*GetErrorName)(int);
} cu;
static void *cu_lib;
#define CUDA_MEMCPY_DEVICE_TO_HOST 2
#define CUDA_STREAM_NON_BLOCKING 1

static int load_cuda(void) {
  const char *path = getenv("CKPTIO_CUDART");
  if (!(cu_lib = dlopen(path && *path ? path : "libcudart.so.13", RTLD_NOW | RTLD_LOCAL))) return -1;
#define SYM(f) (*(void **)&cu.f = dlsym(cu_lib, "cuda" #f))
  if (!SYM(SetDevice) || !SYM(Malloc) || !SYM(Free) || !SYM(StreamCreateWithFlags) ||
      !SYM(StreamDestroy) || !SYM(StreamSynchronize) || !SYM(MemsetAsync) || !SYM(Memcpy) ||
      !SYM(GetErrorName)) {
    dlclose(cu_lib);
    cu_lib = NULL;
    return -1;
  }
#undef SYM
  return 0;
}

/* A toy model: its weights live on GPU 0, or on the host without CUDA. */
#define NW 4
typedef struct model {
  int gpu;             /* 1: weights are device memory of GPU 0 */
  void *stream;        /* the loop's stream (non-blocking, like a framework's) */
  ckptio_tensor t[NW]; /* what ckptio is handed: name, dtype, shape, pointer, device */
  size_t nbytes[NW];
} model;

static const struct {
  const char *name;
  ckptio_dtype dtype;
  int ndim;
  int64_t d0, d1;
} kWeights[NW] = {
    {"embed.weight", CKPTIO_BF16, 2, 4096, 256},
    {"layer0.weight", CKPTIO_F32, 2, 512, 512},
    {"layer0.bias", CKPTIO_F32, 1, 512, 0},
    {"head.weight", CKPTIO_BF16, 2, 256, 4096},
};

static int value(int step, int i) { return (step * 16 + i + 1) & 0xff; }

static int cuda_check(int e, const char *what) {
  if (!e) return 0;
  fprintf(stderr, "train_loop: %s: %s\n", what, cu.GetErrorName(e));
  return -1;
}

static int model_create(model *m, int gpu) {
  memset(m, 0, sizeof(*m));
  m->gpu = gpu;
  if (gpu && (cuda_check(cu.SetDevice(0), "cudaSetDevice") ||
              cuda_check(cu.StreamCreateWithFlags(&m->stream, CUDA_STREAM_NON_BLOCKING), "cudaStreamCreate")))
    return -1;
  for (int i = 0; i < NW; i++) {
    ckptio_tensor *t = &m->t[i];
    t->name = kWeights[i].name;
    t->dtype = kWeights[i].dtype;
    t->ndim = kWeights[i].ndim;
    t->shape[0] = kWeights[i].d0;
    t->shape[1] = kWeights[i].d1;
    t->device = gpu ? CKPTIO_DEVICE_CUDA(0) : CKPTIO_DEVICE_HOST;
    m->nbytes[i] = (size_t)ckptio_tensor_nbytes(t->dtype, t->ndim, t->shape);
    void *p = NULL;
    if (gpu ? cuda_check(cu.Malloc(&p, m->nbytes[i]), "cudaMalloc") : !(p = malloc(m->nbytes[i])))
      return -1;
    t->data = p;
  }
  return 0;
}

static void model_free(model *m) {
  for (int i = 0; i < NW; i++) {
    if (m->gpu && m->t[i].data) cu.Free((void *)m->t[i].data);
    if (!m->gpu) free((void *)m->t[i].data);
  }
  if (m->stream) cu.StreamDestroy(m->stream);
}

/* One training step: queued on the loop's stream, never waited for. */
static int train_step(model *m, int step) {
  for (int i = 0; i < NW; i++) {
    if (!m->gpu)
      memset((void *)m->t[i].data, value(step, i), m->nbytes[i]);
    else if (cuda_check(cu.MemsetAsync((void *)m->t[i].data, value(step, i), m->nbytes[i], m->stream),
                        "cudaMemsetAsync"))
      return -1;
  }
  return 0;
}

/* ------------------------------------------------------------ checkpoints */

static int fail(const char *what, int rc, const char *detail) {
  fprintf(stderr, "train_loop: %s: %s\n", what, detail && *detail ? detail : ckptio_strerror(rc));
  return rc;
}

/* Starts a checkpoint of the weights as they are after every step queued so
 * far on the loop's stream, and returns at the snapshot point: from then on
 * the loop may modify the weights while ckptio writes the file. */
static int checkpoint_start(ckptio_ctx *ctx, const char *path, model *m, ckptio_writer **out) {
  ckptio_writer *w = NULL;
  int rc = ckptio_writer_open(ctx, path, CKPTIO_FORMAT_SAFETENSORS, NULL, &w);
  if (rc < 0) return fail("ckptio_writer_open", rc, ckptio_last_open_error());
  for (int i = 0; i < NW && rc >= 0; i++) rc = ckptio_writer_add(w, &m->t[i]); /* borrowed */
  /* The weights are produced on m->stream: ckptio records an event on it at
   * commit and its copy streams wait for that event. Without this it would
   * order after the legacy default stream, which a non-blocking stream like
   * ours does not synchronise with: the copies could read half-done steps. */
  if (rc >= 0 && m->gpu) rc = ckptio_writer_set_stream(w, CKPTIO_DEVICE_CUDA(0), m->stream);
  if (rc >= 0) rc = ckptio_writer_commit_async(w);
  /* Snapshot: every byte has left the weights (into pinned staging or onto
   * disk). Until here the weights are borrowed: a step queued earlier would
   * race with ckptio's copies. The device was never synchronised. */
  if (rc >= 0) rc = ckptio_writer_wait_snapshot(w);
  if (rc < 0) {
    fail("checkpoint", rc, ckptio_writer_last_error(w));
    ckptio_writer_close(w);
    return rc;
  }
  *out = w;
  return 0;
}

/* Durable: the file is complete, fdatasync'ed and renamed over `path`; until
 * then `path` still holds the previous checkpoint, intact. */
static int checkpoint_finish(ckptio_writer *w, int step) {
  if (!w) return 0;
  int rc = ckptio_writer_wait_durable(w);
  ckptio_stats st = CKPTIO_STATS_INIT;
  if (rc >= 0 && ckptio_writer_stats(w, &st) == 0)
    printf("  checkpoint of step %d durable: %.1f MB, snapshot after %.1f ms, durable after %.1f ms\n", step,
           (double)st.bytes / 1e6, st.snapshot_seconds * 1e3, st.seconds * 1e3);
  if (rc < 0) fail("checkpoint", rc, ckptio_writer_last_error(w));
  int rc2 = ckptio_writer_close(w); /* the save's outcome again; frees the writer */
  return rc < 0 ? rc : rc2;
}

/* Restores the checkpoint at `path` into the model's weights, on the device
 * they live on, and checks that every byte is the value of step `step`. */
static int restore_and_check(ckptio_ctx *ctx, const char *path, model *m, int step) {
  ckptio_reader *r = NULL;
  ckptio_load_request req[NW];
  unsigned char *host = NULL;
  int rc = ckptio_reader_open(ctx, path, NULL, &r);
  if (rc < 0) return fail("ckptio_reader_open", rc, ckptio_last_open_error());
  for (int i = 0; i < NW; i++) {
    int64_t idx = ckptio_reader_find(r, m->t[i].name);
    if (idx < 0) {
      rc = fail(m->t[i].name, (int)idx, "not in the checkpoint");
      goto out;
    }
    req[i] = (ckptio_load_request){(size_t)idx, (void *)m->t[i].data, m->nbytes[i], m->t[i].device};
  }
  /* ckptio's host-to-device copies run on its own streams: work of ours
   * still queued on these buffers must be finished first. */
  if (m->gpu && (rc = cuda_check(cu.StreamSynchronize(m->stream), "cudaStreamSynchronize")) < 0) goto out;
  /* Returns when the data is in the destinations (copies complete), each
   * tensor's CRC32 checked. */
  if ((rc = ckptio_reader_load_many(r, req, NW)) < 0) {
    fail("ckptio_reader_load_many", rc, ckptio_reader_last_error(r));
    goto out;
  }
  for (int i = 0; i < NW && rc == 0; i++) {
    const unsigned char *b = m->t[i].data;
    if (m->gpu) {
      free(host);
      if (!(host = malloc(m->nbytes[i]))) {
        rc = -ENOMEM;
        break;
      }
      if ((rc = cuda_check(cu.Memcpy(host, b, m->nbytes[i], CUDA_MEMCPY_DEVICE_TO_HOST), "cudaMemcpy")) < 0)
        break;
      b = host;
    }
    for (size_t k = 0; k < m->nbytes[i]; k++)
      if (b[k] != value(step, i)) {
        fprintf(stderr, "train_loop: %s byte %zu is %d, step %d wrote %d\n", m->t[i].name, k, b[k], step,
                value(step, i));
        rc = 1;
        break;
      }
  }
out:
  free(host);
  ckptio_reader_close(r);
  return rc;
}

/* ------------------------------------------------------------ the loop */

int main(int argc, char **argv) {
  if (argc < 2 || argc > 4) {
    fprintf(stderr, "usage: train_loop DIR [steps (22)] [checkpoint every (5)]\n");
    return 2;
  }
  int steps = argc > 2 ? atoi(argv[2]) : 22, every = argc > 3 ? atoi(argv[3]) : 5;
  if (steps < 1 || every < 1) {
    fprintf(stderr, "train_loop: steps and every must be positive\n");
    return 2;
  }
  if (mkdir(argv[1], 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "train_loop: mkdir %s: %s\n", argv[1], strerror(errno));
    return 2;
  }
  char path[4096];
  snprintf(path, sizeof(path), "%s/model.safetensors", argv[1]);

  /* One context for the whole run: its worker pool and pinned staging ring
   * are made once and reused by every checkpoint and by the restore. */
  ckptio_ctx *ctx = NULL;
  model m;
  memset(&m, 0, sizeof(m));
  ckptio_writer *pending = NULL;
  int pending_step = 0, saved_step = 0, ret = 2;
  int rc = ckptio_ctx_create(NULL, &ctx);
  if (rc < 0) {
    fail("ckptio_ctx_create", rc, ckptio_last_open_error());
    return 2;
  }
  const char *why = NULL;
  int gpu = ckptio_ctx_cuda(ctx, &why);
  if (gpu && load_cuda() < 0) {
    gpu = 0;
    why = "CUDA unavailable: the example could not load the runtime for its own kernels";
  }
  const char *rt = getenv("CKPTIO_CUDART");
  if (gpu)
    printf("train_loop: weights on GPU 0 (runtime %s)\n", rt && *rt ? rt : "libcudart.so.13");
  else
    printf("train_loop: %s; falling back to host tensors\n", why);
  if (model_create(&m, gpu) < 0) goto out;

  for (int step = 1; step <= steps; step++) {
    if (train_step(&m, step) < 0) goto out;
    if (step % every) continue;
    /* One checkpoint in flight at a time: the previous one has been written
     * while the last `every` steps ran; make sure it is durable. */
    rc = checkpoint_finish(pending, pending_step); /* closes it, even on failure */
    pending = NULL;
    if (rc < 0) goto out;
    saved_step = pending_step;
    if ((rc = checkpoint_start(ctx, path, &m, &pending)) < 0) goto out;
    pending_step = step;
    printf("step %d: snapshot taken, training continues while the file is written\n", step);
    /* The next step may now overwrite the weights: the checkpoint keeps the
     * values of this step. */
  }
  rc = checkpoint_finish(pending, pending_step);
  pending = NULL;
  if (rc < 0) goto out;
  saved_step = pending_step;
  if (!saved_step) {
    printf("train_loop: no checkpoint in %d steps\n", steps);
    ret = 0;
    goto out;
  }

  /* As a restarted job would: the weights are cleared, then loaded from
   * the last durable checkpoint onto the device they live on. */
  for (int i = 0; i < NW; i++) {
    if (!m.gpu)
      memset((void *)m.t[i].data, 0, m.nbytes[i]);
    else if (cuda_check(cu.MemsetAsync((void *)m.t[i].data, 0, m.nbytes[i], m.stream), "cudaMemsetAsync"))
      goto out;
  }
  rc = restore_and_check(ctx, path, &m, saved_step);
  if (rc == 0)
    printf("restored step %d onto the %s: every byte matches\n", saved_step, m.gpu ? "GPU" : "host");
  ret = rc == 0 ? 0 : rc == 1 ? 1 : 2;
out:
  ckptio_writer_close(pending);
  if (m.gpu && m.stream) cu.StreamSynchronize(m.stream);
  model_free(&m);
  ckptio_ctx_free(ctx);
  if (cu_lib) dlclose(cu_lib);
  return ret;
}
