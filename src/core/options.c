/* See options.h. */
#include "core/options.h"

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
  return 0;
}
