/* Error names for ckptio_strerror and the shared message formatter. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ckptio.h"
#include "core/error.h"

static const char *const kNames[] = {
    "invalid argument",
    "call not allowed in this state",
    "header too small",
    "header too large",
    "invalid header length",
    "invalid header: not UTF-8",
    "invalid header deserialization",
    "invalid offset",
    "validation overflow",
    "misaligned slice",
    "tensor invalid info",
    "metadata incomplete buffer",
    "checksum mismatch",
    "not found",
    "duplicate name",
    "unknown dtype",
    "invalid shape",
    "unsupported format",
    "buffer too small",
    "device error",
    "short read or write",
    "pickle refused",
    "corrupt zip archive",
    "corrupt zstd frame or seek table",
    "invalid shard index or inconsistent shard set",
};

const char *ckptio_strerror(int code) {
  if (code >= 0) return "success";
  if (code <= CKPTIO_E_INVALID_ARG && code >= CKPTIO_E_ERROR_MIN)
    return kNames[CKPTIO_E_INVALID_ARG - code];
  if (code > -4096) {
    /* strerror is not thread-safe; the glibc table behind strerrordesc_np is. */
    const char *s = strerrordesc_np(-code);
    if (s) return s;
  }
  return "unknown error";
}

int ckptio_err_fmt(char *err, size_t errlen, int code, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return code;
}

static _Thread_local char open_error[CKPTIO_ERRLEN];

void ckptio_set_open_error(const char *msg) { snprintf(open_error, sizeof(open_error), "%s", msg); }

const char *ckptio_last_open_error(void) { return open_error; }
