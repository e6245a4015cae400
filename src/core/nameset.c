#include "core/nameset.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int ckptio_array_grow(void **arr, size_t *cap, size_t len, size_t elem) {
  if (len < *cap) return 0;
  size_t ncap = *cap ? *cap * 2 : 16;
  void *n = realloc(*arr, ncap * elem);
  if (!n) return -ENOMEM;
  *arr = n;
  *cap = ncap;
  return 0;
}

static uint64_t name_hash(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

int ckptio_nameset_insert(ckptio_nameset *s, const char *name, size_t count, ckptio_name_of name_of,
                          const void *items) {
  if ((count + 1) * 2 > s->cap) {
    size_t ncap = s->cap ? s->cap * 2 : 64;
    size_t *n = calloc(ncap, sizeof(size_t));
    if (!n) return -ENOMEM;
    for (size_t i = 0; i < count; i++) {
      size_t h = name_hash(name_of(items, i)) & (ncap - 1);
      while (n[h]) h = (h + 1) & (ncap - 1);
      n[h] = i + 1;
    }
    free(s->slots);
    s->slots = n;
    s->cap = ncap;
  }
  size_t h = name_hash(name) & (s->cap - 1);
  for (; s->slots[h]; h = (h + 1) & (s->cap - 1))
    if (strcmp(name_of(items, s->slots[h] - 1), name) == 0) return 0;
  s->slots[h] = count + 1;
  return 1;
}

void ckptio_nameset_free(ckptio_nameset *s) {
  free(s->slots);
  s->slots = NULL;
  s->cap = 0;
}
