/* Error codes and messages: every failure carries a code and a sentence that
 * names the file, the tensor and the rule. */
#ifndef CKPTIO_CORE_ERROR_H
#define CKPTIO_CORE_ERROR_H

#include <stdarg.h>
#include <stddef.h>

#define CKPTIO_ERRLEN 512

/* Formats the message into err (if not NULL) and returns code, so a failure
 * is one line: `return ckptio_err_fmt(err, len, CKPTIO_E_X, "...", ...);` */
int ckptio_err_fmt(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The same into a message buffer of CKPTIO_ERRLEN bytes: a reader's, a
 * writer's, or a source's (its reader's): the one way the pipelines report
 * a failure, `return ckptio_fail(r->err, CKPTIO_E_X, "%s: ...", path);` */
#define ckptio_fail(buf, code, ...) ckptio_err_fmt((buf), CKPTIO_ERRLEN, (code), __VA_ARGS__)
/* The va_list form, with fixed text around the message: `before` and
 * `after` (either may be ""). The one formatter behind a parser's own
 * variadic wrapper that adds where the failure was seen to each message
 * (".metadata: ", " (header byte 12)"). Returns code. */
int ckptio_err_vfmt(char *err, size_t errlen, int code, const char *before, const char *after, const char *fmt,
                    va_list ap) __attribute__((format(printf, 6, 0)));

/* The text of errno value errnum ("No space left on device"), static, or
 * "unknown error". Thread-safe, unlike strerror: the one way the library
 * and the command name an errno. */
const char *ckptio_errno_text(int errnum);

/* ckptio_last_open_error, the calling thread's: every public open-type call
 * (the list is at ckptio_last_open_error in ckptio.h) clears it on entry
 * and leaves it set when it fails; no other call touches it, so internal
 * opens (a set's shard writers) report into their caller's buffer instead. */
void ckptio_open_error_clear(void);
/* Keeps the detail of a failed open (no handle to hold it). */
void ckptio_set_open_error(const char *msg);
/* Ends an open-type call: for rc < 0, keeps `detail`, or when it is NULL or
 * "" the line "<call>: <ckptio_strerror(rc)>", so no failure leaves it
 * empty. Returns rc. */
int ckptio_open_error_end(int rc, const char *call, const char *detail);

#endif
