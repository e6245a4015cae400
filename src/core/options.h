/* The rules of ckptio_options in one place: the fields that take a fixed
 * set of values, checked wherever options come in (the context, every
 * writer and reader per call, the manager at open, not at its first save),
 * and the context-only fields, which a per-call struct may not change. */
#ifndef CKPTIO_CORE_OPTIONS_H
#define CKPTIO_CORE_OPTIONS_H

#include <stddef.h>

#include "ckptio.h"

/* Every field of ckptio_options after size, in its order, once: X(field,
 * CONTEXT) for the context-only ones, which a call shares and cannot
 * change (the pool, the ring, the GPU state), X(field, CALL) for the ones
 * each save or load may set. What the checks and the merge of a per-call
 * struct walk; a field added to the struct is added here.
 * tests/abi/check_exports.py checks it against the struct. */
#define CKPTIO_OPTION_FIELDS(X)                                                                               \
  X(threads, CONTEXT) X(chunk_bytes, CONTEXT) X(staging_bytes, CONTEXT) X(crc, CALL) X(direct_io, CALL)      \
  X(fsync, CALL) X(load_method, CALL) X(cuda, CONTEXT) X(numa, CONTEXT) X(compress_level, CALL)              \
  X(shuffle, CALL) X(snapshot_bytes, CONTEXT) X(open_flags, CALL)

/* 0, or CKPTIO_E_INVALID_ARG with err (if not NULL) naming the field and
 * its allowed values. */
int ckptio_options_check(const ckptio_options *o, char *err, size_t errlen);

/* The snapshot memory a context asked for `asked` (CKPTIO_SNAPSHOT_AUTO:
 * a quarter of physical memory) holds, in whole chunks of chunk_bytes. */
size_t ckptio_options_snapshot_bytes(size_t asked, size_t chunk_bytes);

/* A per-call struct against the options of its context (`ctx`, defaults
 * resolved, as ckptio_ctx_options gives them): each CONTEXT field of
 * CKPTIO_OPTION_FIELDS must be left at CKPTIO_OPTIONS_INIT's value or say what the context has
 * (asked as the context was, or as resolved), since a call cannot change
 * the pool, the ring or the GPU state it shares. 0, or
 * CKPTIO_E_INVALID_ARG with err (if not NULL) naming the first field that
 * differs, both values and where to set it: never ignored. */
int ckptio_options_check_call(const ckptio_options *ctx, const ckptio_options *call, char *err, size_t errlen);

/* The options of one call: the context's (`ctx`), with the CALL fields of
 * `call` (checked by ckptio_options_check_call first). */
void ckptio_options_merge_call(const ckptio_options *ctx, const ckptio_options *call, ckptio_options *out);

#endif
