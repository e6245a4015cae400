/*
 * memory_storage.c — a storage of your own behind ckptio's storage
 * interface (ckptio_storage_ops in ckptio.h): checkpoints kept in this
 * process's memory under "mem://NAME". The same three verbs put ckptio in
 * front of any store that can read a byte range: a cache daemon, a
 * database, a network file system's own client.
 *
 * The program saves a small checkpoint to a local file, copies its bytes
 * into the memory store as "mem://model", then loads every tensor back
 * from "mem://model" (CRC-checked, with reads running on many workers at
 * once, which is why read must be thread-safe) and one slice of a tensor,
 * and compares them with what it saved. It also shows the errors a user
 * gets: a name the store does not hold, and a scheme nobody registered.
 *
 *   cc -std=c11 -O2 memory_storage.c -I include -L build -lckptio -o memory_storage
 *   ./memory_storage /tmp/dir
 *
 * Exit status: 0 every byte came back, 1 not, 2 an error.
 */
#define _POSIX_C_SOURCE 200809L
/* Uses the storage interface, of ckptio.h's experimental section. */
#define CKPTIO_EXPERIMENTAL

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckptio.h"

/* ------------------------------------------------------------ the store */

#define OBJECTS_MAX 8

typedef struct object {
  char name[64];
  unsigned char *bytes;
  uint64_t size;
} object;

typedef struct store {
  object objects[OBJECTS_MAX]; /* filled before any reader opens: reads
                                  only look, so they need no lock */
  size_t n;
} store;

static int mem_open_read(void *self, const char *path, void **obj, uint64_t *size, char *err, size_t errlen) {
  store *s = self;
  const char *name = path + strlen("mem://");
  for (size_t i = 0; i < s->n; i++)
    if (!strcmp(s->objects[i].name, name)) {
      *obj = &s->objects[i];
      *size = s->objects[i].size;
      return 0;
    }
  snprintf(err, errlen, "%s: no such object in the memory store", path);
  return -ENOENT;
}

/* Called from many of ckptio's workers at once; ranges never pass size. */
static int mem_read(void *self, void *obj, void *buf, size_t len, uint64_t offset, char *err, size_t errlen) {
  (void)self, (void)err, (void)errlen;
  memcpy(buf, ((object *)obj)->bytes + offset, len);
  return 0;
}

static void mem_close_read(void *self, void *obj) { (void)self, (void)obj; }

static const ckptio_storage_ops memory_ops = {
    .size = sizeof(ckptio_storage_ops),
    .open_read = mem_open_read,
    .read = mem_read,
    .close_read = mem_close_read,
};

/* ------------------------------------------------------------ the program */

#define ROWS 512
#define COLS 1000

static int slurp(const char *path, object *o) {
  FILE *f = fopen(path, "rb");
  if (!f) return -errno;
  fseek(f, 0, SEEK_END);
  o->size = (uint64_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  o->bytes = malloc(o->size ? o->size : 1);
  size_t got = o->bytes ? fread(o->bytes, 1, o->size, f) : 0;
  fclose(f);
  return got == o->size ? 0 : -EIO;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  char path[4096];
  snprintf(path, sizeof(path), "%s/memory_storage.safetensors", argv[1]);
  static float weights[ROWS * COLS], bias[COLS];
  for (size_t i = 0; i < ROWS * COLS; i++) weights[i] = (float)(i % 977) * 0.5f;
  for (size_t i = 0; i < COLS; i++) bias[i] = -(float)i;

  ckptio_ctx *ctx = NULL;
  ckptio_writer *w = NULL;
  ckptio_reader *r = NULL;
  store mem = {.n = 1};
  int status = 2, rc;
  if ((rc = ckptio_ctx_create(NULL, &ctx)) < 0) goto fail;
  ckptio_tensor tw = {"weight", CKPTIO_F32, 2, {ROWS, COLS}, weights, CKPTIO_DEVICE_HOST};
  ckptio_tensor tb = {"bias", CKPTIO_F32, 1, {COLS}, bias, CKPTIO_DEVICE_HOST};
  if ((rc = ckptio_writer_open(ctx, path, CKPTIO_FORMAT_SAFETENSORS, NULL, &w)) < 0 ||
      (rc = ckptio_writer_add(w, &tw)) < 0 || (rc = ckptio_writer_add(w, &tb)) < 0 ||
      (rc = ckptio_writer_commit(w)) < 0)
    goto fail;
  ckptio_writer_close(w);
  w = NULL;
  strcpy(mem.objects[0].name, "model");
  if ((rc = slurp(path, &mem.objects[0])) < 0) goto fail;
  remove(path);

  if ((rc = ckptio_ctx_storage_register(ctx, "mem", &memory_ops, &mem)) < 0) goto fail;
  if ((rc = ckptio_reader_open(ctx, "mem://model", NULL, &r)) < 0) goto fail;
  static float got_w[ROWS * COLS], got_b[COLS], rows[10 * COLS];
  ckptio_load_request reqs[2] = {
      {(size_t)ckptio_reader_find(r, "weight"), got_w, sizeof(got_w), CKPTIO_DEVICE_HOST},
      {(size_t)ckptio_reader_find(r, "bias"), got_b, sizeof(got_b), CKPTIO_DEVICE_HOST},
  };
  if ((rc = ckptio_reader_load_many(r, reqs, 2)) < 0) goto fail;
  if ((rc = ckptio_reader_load_slice(r, reqs[0].index, 0, 100, 110, rows, sizeof(rows), NULL)) < 0) goto fail;
  status = memcmp(got_w, weights, sizeof(weights)) || memcmp(got_b, bias, sizeof(bias)) ||
           memcmp(rows, weights + 100 * COLS, sizeof(rows));
  printf("mem://model: %zu tensors loaded from the memory store, %s\n", ckptio_reader_count(r),
         status ? "DIFFERENT from what was saved" : "every byte as saved");
  ckptio_reader_close(r);
  r = NULL;

  /* What a user sees when the store lacks a name, or nobody serves a scheme. */
  ckptio_reader *none = NULL;
  if (ckptio_reader_open(ctx, "mem://missing", NULL, &none) != -ENOENT ||
      ckptio_reader_open(ctx, "nostore://x", NULL, &none) != CKPTIO_E_INVALID_ARG) {
    fprintf(stderr, "the errors were not the documented ones\n");
    status = 1;
  } else {
    printf("errors: %s\n", ckptio_last_open_error());
  }
  free(mem.objects[0].bytes);
  ckptio_ctx_free(ctx);
  return status;
fail:
  fprintf(stderr, "memory_storage: %s: %s\n", ckptio_strerror(rc),
          r ? ckptio_reader_last_error(r) : w ? ckptio_writer_last_error(w) : ckptio_last_open_error());
  ckptio_reader_close(r);
  ckptio_writer_close(w);
  free(mem.objects[0].bytes);
  ckptio_ctx_free(ctx);
  return 2;
}
