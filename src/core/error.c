/* Error names for ckptio_strerror and the shared message formatter. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ckptio.h"
#include "core/error.h"

/* In enum order from CKPTIO_E_INVALID_ARG down: the enum's name without
 * "CKPTIO_E_" (bindings build their tables from it), and the text. */
static const struct {
  const char *name, *text;
} kErrors[] = {
    {"INVALID_ARG", "invalid argument"},
    {"STATE", "call not allowed in this state"},
    {"HEADER_TOO_SMALL", "header too small"},
    {"HEADER_TOO_LARGE", "header too large"},
    {"HEADER_LENGTH", "invalid header length"},
    {"HEADER_UTF8", "invalid header: not UTF-8"},
    {"HEADER_JSON", "invalid header deserialization"},
    {"INVALID_OFFSET", "invalid offset"},
    {"OVERFLOW", "validation overflow"},
    {"MISALIGNED", "misaligned slice"},
    {"TENSOR_INFO", "tensor invalid info"},
    {"INCOMPLETE_BUFFER", "metadata incomplete buffer"},
    {"CHECKSUM", "checksum mismatch"},
    {"NOT_FOUND", "not found"},
    {"DUPLICATE", "duplicate name"},
    {"DTYPE", "unknown dtype"},
    {"SHAPE", "invalid shape"},
    {"FORMAT", "unsupported format"},
    {"BUFFER_TOO_SMALL", "buffer too small"},
    {"DEVICE", "device error"},
    {"SHORT_IO", "short read or write"},
    {"PICKLE", "pickle refused"},
    {"ZIP", "corrupt zip archive"},
    {"ZSTD", "corrupt zstd frame or seek table"},
    {"SHARD", "invalid shard index or inconsistent shard set"},
    {"RANK", "another rank failed or the ranks disagree"},
};
_Static_assert(sizeof(kErrors) / sizeof(kErrors[0]) == CKPTIO_E_INVALID_ARG - CKPTIO_E_ERROR_MIN + 1,
               "one entry per code of enum ckptio_error");

/* -errno codes are above the library's, and the kernel's errno values all
 * lie below 4096. */
static int is_errno_code(int code) { return code < 0 && code > CKPTIO_E_INVALID_ARG; }

const char *ckptio_errno_text(int errnum) {
  /* strerror is not thread-safe (it may format an unknown value into a
   * static buffer); the glibc table behind strerrordesc_np is read-only. */
  const char *s = errnum > 0 && errnum < 4096 ? strerrordesc_np(errnum) : NULL;
  return s ? s : "unknown error";
}

const char *ckptio_strerror(int code) {
  if (code >= 0) return "success";
  if (code <= CKPTIO_E_INVALID_ARG && code >= CKPTIO_E_ERROR_MIN)
    return kErrors[CKPTIO_E_INVALID_ARG - code].text;
  return is_errno_code(code) ? ckptio_errno_text(-code) : "unknown error";
}

const char *ckptio_error_name(int code) {
  if (code <= CKPTIO_E_INVALID_ARG && code >= CKPTIO_E_ERROR_MIN) return kErrors[CKPTIO_E_INVALID_ARG - code].name;
  /* "ENOMEM": the same read-only glibc table, by symbol. */
  return is_errno_code(code) ? strerrorname_np(-code) : NULL;
}

int ckptio_err_vfmt(char *err, size_t errlen, int code, const char *before, const char *after, const char *fmt,
                    va_list ap) {
  if (!err || !errlen) return code;
  /* Each part where the one before it ended; a part that does not fit is
   * cut, and what follows it dropped. Nothing is written before the
   * message unless `before` says something (a message may quote err's own
   * text, as ckptio_err_fmt's callers always could). */
  size_t n = *before ? (size_t)snprintf(err, errlen, "%s", before) : 0;
  if (n < errlen) {
    int m = vsnprintf(err + n, errlen - n, fmt, ap);
    n += m > 0 ? (size_t)m : 0;
  }
  if (*after && n < errlen) snprintf(err + n, errlen - n, "%s", after);
  return code;
}

int ckptio_err_fmt(char *err, size_t errlen, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  code = ckptio_err_vfmt(err, errlen, code, "", "", fmt, ap);
  va_end(ap);
  return code;
}

static _Thread_local char open_error[CKPTIO_ERRLEN];

void ckptio_set_open_error(const char *msg) { snprintf(open_error, sizeof(open_error), "%s", msg); }

void ckptio_open_error_clear(void) { open_error[0] = '\0'; }

int ckptio_open_error_end(int rc, const char *call, const char *detail) {
  if (rc >= 0) return rc;
  if (detail && *detail) {
    if (detail != open_error) ckptio_set_open_error(detail); /* (it may be the buffer itself) */
  } else snprintf(open_error, sizeof(open_error), "%s: %s", call, ckptio_strerror(rc));
  return rc;
}

const char *ckptio_last_open_error(void) { return open_error; }
