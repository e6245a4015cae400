/* See options.h. */
#include "core/options.h"

#include <unistd.h>

#include "core/error.h"

static int out_of(char *err, size_t errlen, const char *field, int v, const char *allowed) {
  return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "ckptio_options: %s is %d, not %s", field, v, allowed);
}

int ckptio_options_check(const ckptio_options *o, char *err, size_t errlen) {
  static const char tri[] = "CKPTIO_AUTO (-1), 0 or 1";
  if (o->direct_io < CKPTIO_AUTO || o->direct_io > 1) return out_of(err, errlen, "direct_io", o->direct_io, tri);
  if (o->cuda < CKPTIO_AUTO || o->cuda > 1) return out_of(err, errlen, "cuda", o->cuda, tri);
  if (o->numa < CKPTIO_AUTO || o->numa > 1) return out_of(err, errlen, "numa", o->numa, tri);
  if (o->load_method < CKPTIO_LOAD_AUTO || o->load_method > CKPTIO_LOAD_DIRECT)
    return out_of(err, errlen, "load_method", (int)o->load_method, "CKPTIO_LOAD_AUTO to CKPTIO_LOAD_DIRECT");
  if (o->threads < 0) return out_of(err, errlen, "threads", o->threads, "0 (the default) or more");
  if (o->shuffle < 0 || o->shuffle > 1) return out_of(err, errlen, "shuffle", o->shuffle, "0 or 1");
  if (o->open_flags & ~CKPTIO_OPEN_TORCH_RECORDS)
    return out_of(err, errlen, "open_flags", (int)o->open_flags, "0 or CKPTIO_OPEN_TORCH_RECORDS");
  return 0;
}

size_t ckptio_options_snapshot_bytes(size_t asked, size_t chunk_bytes) {
  if (asked == CKPTIO_SNAPSHOT_AUTO) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    asked = pages > 0 && page > 0 ? (size_t)pages / 4 * (size_t)page : 0;
  }
  return chunk_bytes ? asked / chunk_bytes * chunk_bytes : asked;
}

/* Sizes print as signed: CKPTIO_SNAPSHOT_AUTO is -1, as CKPTIO_AUTO. */
static int not_per_call(char *err, size_t errlen, const char *field, long long call, long long ctx) {
  return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG,
                        "ckptio_options: %s is %lld here but %lld on the context: a context option, set once at "
                        "ckptio_ctx_create (per call, leave it at CKPTIO_OPTIONS_INIT's value)",
                        field, call, ctx);
}

int ckptio_options_check_call(const ckptio_options *ctx, const ckptio_options *call, char *err, size_t errlen) {
  const ckptio_options init = CKPTIO_OPTIONS_INIT;
  ckptio_options c = *call;
  /* The struct the context was created with asked for AUTO or a snapshot
   * size that was rounded down to whole chunks: the same request is the
   * same. */
  if (ckptio_options_snapshot_bytes(c.snapshot_bytes, ctx->chunk_bytes) == ctx->snapshot_bytes)
    c.snapshot_bytes = ctx->snapshot_bytes;
  /* A field left at its initial value is "the context's": every caller
   * starts from CKPTIO_OPTIONS_INIT and sets what it means to set. */
#define CHECK_CONTEXT(f)                                                                                      \
  if (c.f != init.f && c.f != ctx->f) return not_per_call(err, errlen, #f, (long long)call->f, (long long)ctx->f);
#define CHECK_CALL(f)
#define CHECK(f, kind) CHECK_##kind(f)
  CKPTIO_OPTION_FIELDS(CHECK)
#undef CHECK
#undef CHECK_CALL
#undef CHECK_CONTEXT
  return 0;
}

void ckptio_options_merge_call(const ckptio_options *ctx, const ckptio_options *call, ckptio_options *out) {
  *out = *ctx;
#define MERGE_CONTEXT(f)
#define MERGE_CALL(f) out->f = call->f;
#define MERGE(f, kind) MERGE_##kind(f)
  CKPTIO_OPTION_FIELDS(MERGE)
#undef MERGE
#undef MERGE_CALL
#undef MERGE_CONTEXT
}
