/* The file names of a set's files (shardname.h). */
#include "core/shardname.h"

#include <stdio.h>
#include <string.h>

int ckptio_shardname_format(char *buf, size_t len, const char *prefix, size_t k, size_t n, const char *save_id) {
  if (save_id)
    return snprintf(buf, len, "%s-%05zu-of-%05zu-%.*s.safetensors", prefix, k + 1, n, CKPTIO_SHARDNAME_ID_LEN,
                    save_id);
  return snprintf(buf, len, "%s-%05zu-of-%05zu.safetensors", prefix, k + 1, n);
}

/* Exactly 5 decimal digits at p into *v. @return the end, or NULL. */
static const char *digits5(const char *p, size_t *v) {
  size_t x = 0;
  for (int i = 0; i < 5; i++) {
    if (p[i] < '0' || p[i] > '9') return NULL;
    x = x * 10 + (size_t)(p[i] - '0');
  }
  *v = x;
  return p + 5;
}

static int is_alnum(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

const char *ckptio_shardname_parse(const char *name, const char *prefix, ckptio_shardname *out) {
  static const char ext[] = ".safetensors";
  size_t plen = strlen(prefix), k, n, idlen = 0;
  const char *p = name, *id = NULL;
  if (strncmp(p, prefix, plen) != 0 || p[plen] != '-') return NULL;
  if (!(p = digits5(p + plen + 1, &k)) || strncmp(p, "-of-", 4) != 0 || !(p = digits5(p + 4, &n))) return NULL;
  if (k == 0 || k > n) return NULL;
  if (*p == '-') {
    id = ++p;
    while (idlen < CKPTIO_SHARDNAME_ID_LEN && is_alnum(id[idlen])) idlen++;
    if (idlen == 0) return NULL;
    p += idlen;
  }
  if (strncmp(p, ext, sizeof(ext) - 1) != 0) return NULL;
  if (out) *out = (ckptio_shardname){k - 1, n, id, idlen};
  return p + sizeof(ext) - 1;
}
