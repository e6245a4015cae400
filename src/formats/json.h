/*
 * A strict, bounded JSON reader and writer, only as much as the safetensors
 * header needs. The reader is pull-style: the caller walks the schema it
 * expects and the reader checks the grammar as it goes, so there is no tree
 * to allocate. Input must already be valid UTF-8 (check with ckptio_utf8_check).
 */
#ifndef CKPTIO_FORMATS_JSON_H
#define CKPTIO_FORMATS_JSON_H

#include <stddef.h>
#include <stdint.h>

/* Nesting above this is refused: recursion in skip_value stays bounded. */
#define CKPTIO_JSON_MAX_DEPTH 64

/* ------------------------------------------------------------ UTF-8 */

/* Strict UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF).
 * @return 0, or -1 with *bad_pos the offset of the first bad byte. */
int ckptio_utf8_check(const uint8_t *s, size_t len, size_t *bad_pos);

/* ------------------------------------------------------------ reader */

typedef struct ckptio_json {
  const uint8_t *buf;   /* borrowed for the reader's lifetime */
  size_t len, pos;
  int depth;
  char *scratch;        /* the last string read, unescaped, NUL-terminated */
  size_t scratch_cap;
  char *err;            /* borrowed; messages go here */
  size_t errlen;
  const char *context;  /* borrowed; NULL or what is being read ("tensor 'w'"),
                           added to grammar error messages */
} ckptio_json;

/* All readers return 0 (or 1 where said) on success, CKPTIO_E_HEADER_JSON
 * on a grammar error (message: byte offset and what was expected), or
 * -ENOMEM. */
void ckptio_json_init(ckptio_json *j, const uint8_t *buf, size_t len, char *err, size_t errlen);
void ckptio_json_free(ckptio_json *j);

/* Skips JSON whitespace (space, tab, LF, CR). */
void ckptio_json_skip_ws(ckptio_json *j);
/* @return the next byte after whitespace, not consumed, or -1 at the end. */
int ckptio_json_peek(ckptio_json *j);

/* Consumes '{'. Then call object_next until it returns 0:
 * @return 1 with *key (borrowed: valid until the next string is read) and the
 * ':' consumed, 0 when '}' was consumed, or a negative code. *count starts at
 * 0 and counts members, so commas are checked. */
int ckptio_json_object_begin(ckptio_json *j);
int ckptio_json_object_next(ckptio_json *j, size_t *count, const char **key);

/* Consumes '['. array_next: 1 when an element follows, 0 when ']' was
 * consumed, or a negative code. */
int ckptio_json_array_begin(ckptio_json *j);
int ckptio_json_array_next(ckptio_json *j, size_t *count);

/* A string, unescaped to UTF-8 (surrogate pairs joined). *out is borrowed
 * until the next string is read; *n is its length. \u0000 is refused: every
 * string ends up as a C string. */
int ckptio_json_string(ckptio_json *j, const char **out, size_t *n);
/* A non-negative integer without fraction or exponent that fits 64 bits. */
int ckptio_json_u64(ckptio_json *j, uint64_t *out);
/* Consumes `null`. */
int ckptio_json_null(ckptio_json *j);
/* Checks and skips any value (nesting bounded by CKPTIO_JSON_MAX_DEPTH). */
int ckptio_json_skip_value(ckptio_json *j);
/* Formats "invalid header JSON at header byte <pos>[, in <context>]: <what>" and returns
 * CKPTIO_E_HEADER_JSON. */
int ckptio_json_fail(ckptio_json *j, const char *what);

/* ------------------------------------------------------------ writer */

/* A growing byte buffer. Zero-initialise; data is malloc'd (free it). */
typedef struct ckptio_json_out {
  char *data;
  size_t len, cap;
} ckptio_json_out;

/* @return 0 or -ENOMEM. */
int ckptio_json_out_put(ckptio_json_out *o, const void *s, size_t n);
int ckptio_json_out_puts(ckptio_json_out *o, const char *s);
int ckptio_json_out_u64(ckptio_json_out *o, uint64_t v);
/* Appends s as a quoted JSON string: '"' and '\' escaped, control bytes as
 * \b \t \n \f \r or \u00XX, everything else (UTF-8) as is. */
int ckptio_json_out_string(ckptio_json_out *o, const char *s);

#endif
