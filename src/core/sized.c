/* See sized.h. */
#include "core/sized.h"

#include <string.h>

#include "ckptio.h"
#include "core/error.h"

long ckptio_sized_check(const void *p, size_t known, const char *what, char *err, size_t errlen) {
  size_t size;
  memcpy(&size, p, sizeof(size));
  if (size < sizeof(size_t))
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG,
                          "%s: size %zu does not even hold the size field (start from its _INIT macro)", what, size);
  if (size > known + CKPTIO_SIZED_MAX_EXTRA)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG,
                          "%s: size %zu is far beyond this library's %zu: not a struct started from its _INIT macro",
                          what, size, known);
  /* A newer header's struct: accepted when the fields this library does
   * not know hold zero (their defaults, as the newer _INIT sets them), so
   * nothing the caller asked for is silently ignored. */
  const unsigned char *tail = (const unsigned char *)p;
  for (size_t i = known; i < size; i++)
    if (tail[i])
      return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG,
                            "%s: size %zu is larger than this library's %zu and byte %zu past it is not zero: "
                            "a field this version of ckptio does not know is set (built against a newer ckptio.h?)",
                            what, size, known, i - known);
  return (long)(size < known ? size : known);
}

int ckptio_sized_in(const void *in, void *out, size_t known, const char *what, char *err, size_t errlen) {
  if (!in) return 0;
  long n = ckptio_sized_check(in, known, what, err, errlen);
  if (n < 0) return (int)n;
  memcpy((char *)out + sizeof(size_t), (const char *)in + sizeof(size_t), (size_t)n - sizeof(size_t));
  memcpy(out, &known, sizeof(size_t));
  return 0;
}

int ckptio_sized_out(void *out, const void *ours, size_t known, const char *what, char *err, size_t errlen) {
  if (!out) return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "%s: NULL", what);
  long n = ckptio_sized_check(out, known, what, err, errlen);
  if (n < 0) return (int)n;
  memcpy((char *)out + sizeof(size_t), (const char *)ours + sizeof(size_t), (size_t)n - sizeof(size_t));
  return 0;
}
