/* Objects of a save into a storage (objects.h). */
#include "save/objects.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/shardname.h"
#include "ctx/ctx.h"
#include "io/file.h"

int ckptio_objects_put(const ckptio_storage *store, const char *path, const void *data, size_t len, int sync,
                       char *err, size_t errlen) {
  ckptio_tmpfile t;
  memset(&t, 0, sizeof(t));
  int rc = ckptio_tmpfile_open_object(&t, path, len, len, &store->ops, store->self, err, errlen);
  if (rc == 0 && (rc = ckptio_tmpfile_write(&t, data, len, 0, err, errlen)) < 0) ckptio_tmpfile_abort(&t);
  if (rc == 0) rc = ckptio_tmpfile_commit(&t, len, sync, NULL, err, errlen);
  return rc;
}

void ckptio_objects_remove(const ckptio_storage *store, const char *path) {
  char ignored[256];
  if (store->ops.remove) store->ops.remove(store->self, path, ignored, sizeof(ignored));
}

/* Whether name is a file of prefix, a storage's or a local set's. */
static int is_file_name(const char *name, const char *prefix) {
  const char *rest = ckptio_shardname_parse(name, prefix, NULL);
  return rest && !*rest;
}

typedef struct stale {
  const ckptio_storage *store;
  const char *dir, *prefix;
  char *const *keep;
  size_t n;
} stale;

static int remove_if_stale(void *arg, const char *path, uint64_t size) {
  const stale *st = arg;
  size_t d = strlen(st->dir);
  (void)size;
  if (strncmp(path, st->dir, d) || path[d] != '/' || !is_file_name(path + d + 1, st->prefix)) return 0;
  for (size_t k = 0; k < st->n; k++)
    if (!strcmp(st->keep[k], path)) return 0;
  ckptio_objects_remove(st->store, path);
  return 0;
}

void ckptio_objects_sweep(const ckptio_storage *store, const char *dir, const char *prefix, char *const *keep,
                          size_t n) {
  const ckptio_storage_ops *ops = &store->ops;
  char ignored[256], *under = ckptio_path_join(dir, prefix);
  stale st = {store, dir, prefix, keep, n};
  if (under && ops->list && ops->remove) ops->list(store->self, under, remove_if_stale, &st, ignored, sizeof(ignored));
  if (under && ops->sweep) ops->sweep(store->self, under, ignored, sizeof(ignored));
  free(under);
}
