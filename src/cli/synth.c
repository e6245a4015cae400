/*
 * Synthetic models for `ckptio bench`: a Llama-shaped set of tensors scaled
 * to a requested size, or the 10 x Linear(10000, 10000) model of the
 * torch.save comparison. Memory is allocated, filled and touched here, once,
 * so no page fault lands inside a timed region; with --device cuda:N the
 * model is then uploaded to the GPU from pinned memory, through the
 * context's CUDA runtime (the experimental device calls of ckptio.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cli/bench.h"

#define PAGE 4096ull
#define LLM_VOCAB 32000

static uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

void *cli_buffer_alloc(uint64_t n) {
  if (!n) n = PAGE;
  /* MAP_POPULATE faults every page in one kernel call: first touch costs
   * about 20 us per 4 KiB page here, far cheaper in bulk than one by one. */
  void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                 -1, 0);
  if (p == MAP_FAILED) return NULL;
  memset(p, 0, n);
  return p;
}

void cli_buffer_free(void *p, uint64_t n) {
  if (p) munmap(p, n ? n : PAGE);
}

/* wyrand: 8 pseudo-random bytes per step, fast enough to fill gigabytes. */
static void fill_random(uint8_t *p, uint64_t n, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    s += 0xa0761d6478bd642full;
    __uint128_t m = (__uint128_t)s * (s ^ 0xe7037ed1a0b428dbull);
    uint64_t v = (uint64_t)(m >> 64) ^ (uint64_t)m;
    memcpy(p + i, &v, 8);
  }
  for (; i < n; i++) p[i] = (uint8_t)(s >> (8 * (i & 7)));
}

/* ------------------------------------------------------------ shapes */

typedef struct spec {
  char name[96];
  ckptio_dtype dtype;
  int ndim;
  int64_t shape[2];
} spec;

static void add_spec(spec *s, size_t *n, const char *name, ckptio_dtype dt, int ndim, int64_t d0,
                     int64_t d1) {
  spec *t = &s[(*n)++];
  snprintf(t->name, sizeof(t->name), "%s", name);
  t->dtype = dt;
  t->ndim = ndim;
  t->shape[0] = d0;
  t->shape[1] = d1;
}

static uint64_t llm_inter(uint64_t h) { return round_up(8 * h / 3, 256); }
/* Embedding, lm_head (untied, as in Llama 2) and the final norm. */
static uint64_t llm_fixed(uint64_t h, uint64_t vocab) { return 2 * vocab * h * 2 + 4 * h; }
static uint64_t llm_layer(uint64_t h) {
  return 4 * h * h * 2 + 3 * llm_inter(h) * h * 2 + 2 * h * 4;
}

/* Llama keeps about 128 hidden units per layer (4096 / 32, 5120 / 40):
 * take the widest such model that fits, then fill the rest with layers. */
static void llm_choose(cli_model *m, uint64_t target) {
  for (uint64_t h = 16384; h >= 64; h -= 64) {
    uint64_t layers = h / 128 ? h / 128 : 1;
    uint64_t fixed = llm_fixed(h, LLM_VOCAB);
    if (fixed + layers * llm_layer(h) > target) continue;
    /* Nearest, not floor: the file should be about the size asked for. */
    layers = (target - fixed + llm_layer(h) / 2) / llm_layer(h);
    m->hidden = (int)h;
    m->layers = (int)(layers > 100000 ? 100000 : layers);
    m->vocab = LLM_VOCAB;
    m->inter = (int)llm_inter(h);
    return;
  }
  /* Below about 9 MB even one narrow layer with a 32000-word vocabulary is
   * too big: shrink the vocabulary instead. */
  uint64_t h = 64, rest = target > llm_layer(h) + 4 * h ? target - llm_layer(h) - 4 * h : 0;
  m->hidden = (int)h;
  m->layers = 1;
  m->vocab = (int)(rest / (4 * h) ? rest / (4 * h) : 1);
  m->inter = (int)llm_inter(h);
}

static size_t llm_specs(const cli_model *m, spec *s) {
  size_t n = 0;
  int64_t h = m->hidden, v = m->vocab, f = m->inter;
  char nm[96];
  add_spec(s, &n, "model.embed_tokens.weight", CKPTIO_BF16, 2, v, h);
  for (int l = 0; l < m->layers; l++) {
    static const char *const kAttn[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    for (int k = 0; k < 4; k++) {
      snprintf(nm, sizeof(nm), "model.layers.%d.self_attn.%s.weight", l, kAttn[k]);
      add_spec(s, &n, nm, CKPTIO_BF16, 2, h, h);
    }
    snprintf(nm, sizeof(nm), "model.layers.%d.mlp.gate_proj.weight", l);
    add_spec(s, &n, nm, CKPTIO_BF16, 2, f, h);
    snprintf(nm, sizeof(nm), "model.layers.%d.mlp.up_proj.weight", l);
    add_spec(s, &n, nm, CKPTIO_BF16, 2, f, h);
    snprintf(nm, sizeof(nm), "model.layers.%d.mlp.down_proj.weight", l);
    add_spec(s, &n, nm, CKPTIO_BF16, 2, h, f);
    snprintf(nm, sizeof(nm), "model.layers.%d.input_layernorm.weight", l);
    add_spec(s, &n, nm, CKPTIO_F32, 1, h, 0);
    snprintf(nm, sizeof(nm), "model.layers.%d.post_attention_layernorm.weight", l);
    add_spec(s, &n, nm, CKPTIO_F32, 1, h, 0);
  }
  add_spec(s, &n, "model.norm.weight", CKPTIO_F32, 1, h, 0);
  add_spec(s, &n, "lm_head.weight", CKPTIO_BF16, 2, v, h);
  return n;
}

/* nn.Sequential of Linear(d, d): state_dict keys "0.weight", "0.bias", ... */
static size_t linear_specs(const cli_model *m, spec *s) {
  size_t n = 0;
  char nm[96];
  for (int l = 0; l < 10; l++) {
    snprintf(nm, sizeof(nm), "%d.weight", l);
    add_spec(s, &n, nm, CKPTIO_F32, 2, m->linear_dim, m->linear_dim);
    snprintf(nm, sizeof(nm), "%d.bias", l);
    add_spec(s, &n, nm, CKPTIO_F32, 1, m->linear_dim, 0);
  }
  return n;
}

static int linear_choose(uint64_t target) {
  if (!target) return 10000;
  /* 10 * (4 d^2 + 4 d) <= target */
  uint64_t d = 1;
  while (10 * (4 * (d + 1) * (d + 1) + 4 * (d + 1)) <= target && d < 1000000) d++;
  return (int)d;
}

int cli_model_build(cli_model *m, cli_shapes shapes, uint64_t target_bytes) {
  memset(m, 0, sizeof(*m));
  m->shapes = shapes;
  size_t cap;
  if (shapes == CLI_SHAPES_LLM) {
    llm_choose(m, target_bytes);
    cap = 3 + 9 * (size_t)m->layers;
  } else {
    m->linear_dim = linear_choose(target_bytes);
    cap = 20;
  }
  int rc = -ENOMEM;
  spec *s = calloc(cap, sizeof(*s));
  m->tensors = calloc(cap, sizeof(*m->tensors));
  m->names = calloc(cap, sizeof(*m->names));
  m->arena_offset = calloc(cap, sizeof(*m->arena_offset));
  if (!s || !m->tensors || !m->names || !m->arena_offset) goto fail;
  m->count = shapes == CLI_SHAPES_LLM ? llm_specs(m, s) : linear_specs(m, s);

  /* Every tensor starts on a page, as a framework's allocator would place
   * it, so the library may write it with O_DIRECT without copying. */
  uint64_t off = 0;
  for (size_t i = 0; i < m->count; i++) {
    int64_t nb = ckptio_tensor_nbytes(s[i].dtype, s[i].ndim, s[i].shape);
    if (nb < 0) {
      rc = (int)nb;
      goto fail;
    }
    m->arena_offset[i] = off;
    m->tensor_bytes += (uint64_t)nb;
    off = round_up(off + (uint64_t)nb, PAGE);
  }
  m->arena_bytes = off > PAGE ? off : PAGE;
  m->arena = cli_buffer_alloc(m->arena_bytes);
  if (!m->arena) goto fail;
  for (size_t i = 0; i < m->count; i++) {
    if (!(m->names[i] = strdup(s[i].name))) goto fail;
    ckptio_tensor *t = &m->tensors[i];
    t->name = m->names[i];
    t->dtype = s[i].dtype;
    t->ndim = s[i].ndim;
    for (int d = 0; d < s[i].ndim; d++) t->shape[d] = s[i].shape[d];
    t->data = m->arena + m->arena_offset[i];
    t->device = CKPTIO_DEVICE_HOST;
    fill_random(m->arena + m->arena_offset[i],
                (uint64_t)ckptio_tensor_nbytes(t->dtype, t->ndim, t->shape), i + 1);
  }
  free(s);
  return 0;
fail:
  free(s);
  cli_model_free(m);
  return rc;
}

void cli_model_free(cli_model *m) {
  if (m->names)
    for (size_t i = 0; i < m->count; i++) free(m->names[i]);
  free(m->names);
  free(m->tensors);
  free(m->arena_offset);
  cli_buffer_free(m->arena, m->arena_bytes);
  memset(m, 0, sizeof(*m));
}

/* ------------------------------------------------------------ on a GPU */

/* A failed device call of the library: its detail names the call, the GPU
 * and the runtime's error. */
static int gpu_fail(const bench_gpu *g, const char *what, int rc) {
  fprintf(stderr, "ckptio bench: GPU %d: %s: %s\n", g->ordinal, what, cli_open_error(rc));
  return rc;
}

/* host -> device through the pinned buffer, a pinned-sized piece at a time,
 * so the upload runs at the copy engines' speed as a user's would; with
 * src NULL the device range is zeroed. */
static int upload(bench_gpu *g, uint8_t *dst, const uint8_t *src, uint64_t n) {
  for (uint64_t off = 0; off < n;) {
    uint64_t k = n - off < g->pinned_bytes ? n - off : g->pinned_bytes;
    if (src)
      memcpy(g->pinned, src + off, (size_t)k);
    else
      memset(g->pinned, 0, (size_t)k);
    int rc = bench_gpu_copy(g, dst + off, g->pinned, k, 1, NULL);
    if (rc < 0) return rc;
    off += k;
  }
  return 0;
}

int bench_gpu_open(bench_gpu *g, ckptio_ctx *ctx, int ordinal, const cli_model *m, uint8_t *pinned,
                   uint64_t n) {
  memset(g, 0, sizeof(*g));
  g->ctx = ctx;
  g->ordinal = ordinal;
  g->info = (ckptio_device_info)CKPTIO_DEVICE_INFO_INIT;
  int rc, dev = CKPTIO_DEVICE_CUDA(ordinal);
  if ((rc = ckptio_device_describe(ctx, dev, &g->info)) < 0) {
    fprintf(stderr, "ckptio bench: --device cuda:%d: %s\n", ordinal, cli_open_error(rc));
    return rc;
  }
  if (!g->info.name[0]) snprintf(g->info.name, sizeof(g->info.name), "?");
  g->bytes = m->arena_bytes;
  if ((rc = ckptio_device_alloc(ctx, dev, g->bytes, (void **)&g->src)) < 0 ||
      (rc = ckptio_device_alloc(ctx, dev, g->bytes, (void **)&g->dst)) < 0) {
    fprintf(stderr, "ckptio bench: GPU %d: allocating 2 x %llu bytes: %s\n", ordinal,
            (unsigned long long)g->bytes, ckptio_strerror(rc));
    return rc;
  }
  /* Pinned, as a training loop's own staging would be: the raw copies, the
   * uploads and the downloads of --verify run at the DMA engines' speed. */
  if ((rc = ckptio_host_pin(ctx, pinned, n)) < 0) return gpu_fail(g, "pinning the host buffer", rc);
  g->pinned = pinned;
  g->pinned_bytes = n;
  /* Both arenas written once, untimed: the fake's device memory is host
   * pages that fault on first touch, as the host buffers would. */
  rc = upload(g, g->dst, NULL, g->bytes);
  return rc < 0 ? rc : upload(g, g->src, m->arena, m->arena_bytes);
}

void bench_gpu_close(bench_gpu *g) {
  if (!g->ctx) return;
  if (g->pinned) ckptio_host_unpin(g->ctx, g->pinned);
  ckptio_device_free(g->ctx, CKPTIO_DEVICE_CUDA(g->ordinal), g->dst);
  ckptio_device_free(g->ctx, CKPTIO_DEVICE_CUDA(g->ordinal), g->src);
  memset(g, 0, sizeof(*g));
}

int bench_gpu_copy(bench_gpu *g, void *dst, const void *src, uint64_t n, int to_device,
                   double *secs) {
  int gpu = CKPTIO_DEVICE_CUDA(g->ordinal);
  double t0 = cli_now();
  int rc = to_device ? ckptio_device_copy(g->ctx, dst, gpu, src, CKPTIO_DEVICE_HOST, n)
                     : ckptio_device_copy(g->ctx, dst, CKPTIO_DEVICE_HOST, src, gpu, n);
  if (rc < 0) return gpu_fail(g, to_device ? "copying host to device" : "copying device to host", rc);
  if (secs) *secs = cli_now() - t0;
  return 0;
}
