/* The storages of a context (the public ckptio_storage_ops, include/ckptio.h):
 * which table of verbs serves a path "SCHEME://...", the built-in S3 one
 * made on first use. Paths without a scheme are local files, which the io
 * room serves as always. */
#ifndef CKPTIO_STORAGE_STORAGE_H
#define CKPTIO_STORAGE_STORAGE_H

#include <stddef.h>
#include <stdint.h>

/* Objects of a storage (ckptio_storage_ops) come from ckptio.h's
 * experimental section, whoever includes this header. */
#ifndef CKPTIO_EXPERIMENTAL
#define CKPTIO_EXPERIMENTAL
#endif
#include "ckptio.h"
#include "core/scatter.h"

typedef struct ckptio_storages ckptio_storages;

/* One registered storage: its verbs and the self handed to them. */
typedef struct ckptio_storage {
  ckptio_storage_ops ops;
  void *self;
} ckptio_storage;

int ckptio_storages_create(ckptio_storages **out);
/* Frees the table and the built-in storages it made. Accepts NULL. */
void ckptio_storages_free(ckptio_storages *t);
/* ckptio_ctx_storage_register's work (its codes; message in err). */
int ckptio_storages_register(ckptio_storages *t, const char *scheme, const ckptio_storage_ops *ops, void *self,
                             char *err, size_t errlen);
/* The storage that serves path: 0 for a local file (no "SCHEME://"), 1
 * with *out, or a code with the reason in err (no storage for the scheme;
 * the built-in S3 one could not be made: no credentials, no libcurl). The
 * storage lives as long as the table. */
int ckptio_storages_find(ckptio_storages *t, const char *path, const ckptio_storage **out, char *err,
                         size_t errlen);

/* A size for create meaning "not known yet": the object is as long as what
 * was written when it is published, written at any offsets, in pieces of
 * any length, each byte once (a compressed save: frames in file order, the
 * header frame at offset 0 and the seek table last). Internal: the public
 * contract of create (ckptio.h) stays "size known first"; only storages
 * ckptio_storage_unsized names are handed it. */
#define CKPTIO_STORAGE_UNSIZED UINT64_MAX
/* 1 when st takes CKPTIO_STORAGE_UNSIZED (the built-in S3 one). */
int ckptio_storage_unsized(const ckptio_storage *st);

/* Bytes [offset, offset + the spans' lengths) of an object that ops opened
 * (obj), into the spans in order: the built-in S3 storage with one ranged
 * GET whose body goes straight to the spans; any other storage with its
 * read verb once per span that has a place. @return 0 or the verb's code,
 * its sentence in err. */
int ckptio_storage_read_spans(const ckptio_storage_ops *ops, void *self, void *obj, const ckptio_scatter *spans,
                              size_t n, uint64_t offset, char *err, size_t errlen);

/* The built-in S3 storage (s3_storage.c): a client from the environment.
 * @return 0 and *self for the s3 verbs, or a code with the reason. */
int ckptio_s3_storage_create(void **self, char *err, size_t errlen);
void ckptio_s3_storage_free(void *self);
extern const ckptio_storage_ops ckptio_s3_storage_ops;

#endif
