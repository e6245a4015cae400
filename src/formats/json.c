/*
 * The strict JSON reader and the string escaper behind the safetensors
 * header. Every read is bounds-checked against the buffer length; nothing
 * here trusts a NUL terminator or recursion deeper than CKPTIO_JSON_MAX_DEPTH.
 */
#include "formats/json.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckptio.h"
#include "core/error.h"

/* ------------------------------------------------------------ UTF-8 */

int ckptio_utf8_check(const uint8_t *s, size_t len, size_t *bad_pos) {
  size_t i = 0;
  while (i < len) {
    /* Headers are nearly all ASCII: test eight bytes at a time. */
    if (len - i >= 8) {
      uint64_t w;
      memcpy(&w, s + i, 8);
      if (!(w & 0x8080808080808080ull)) {
        i += 8;
        continue;
      }
    }
    uint8_t c = s[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      need = 2;
      if (c == 0xE0) lo = 0xA0;  /* overlong */
      if (c == 0xED) hi = 0x9F;  /* UTF-16 surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
      need = 3;
      if (c == 0xF0) lo = 0x90;  /* overlong */
      if (c == 0xF4) hi = 0x8F;  /* above U+10FFFF */
    } else {
      goto fail;
    }
    if (len - i <= need || s[i + 1] < lo || s[i + 1] > hi) goto fail;
    for (size_t k = 2; k <= need; k++)
      if ((s[i + k] & 0xC0) != 0x80) goto fail;
    i += need + 1;
  }
  return 0;
fail:
  if (bad_pos) *bad_pos = i;
  return -1;
}

/* ------------------------------------------------------------ reader */

void ckptio_json_init(ckptio_json *j, const uint8_t *buf, size_t len, char *err, size_t errlen) {
  memset(j, 0, sizeof(*j));
  j->buf = buf;
  j->len = len;
  j->err = err;
  j->errlen = errlen;
}

void ckptio_json_free(ckptio_json *j) {
  if (!j) return;
  free(j->scratch);
  j->scratch = NULL;
  j->scratch_cap = 0;
}

int ckptio_json_fail(ckptio_json *j, const char *what) {
  return ckptio_err_fmt(j->err, j->errlen, CKPTIO_E_HEADER_JSON,
                        "invalid header JSON at header byte %zu%s%s: %s", j->pos,
                        j->context ? ", in " : "", j->context ? j->context : "", what);
}

static int is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static int is_digit(int c) { return c >= '0' && c <= '9'; }

void ckptio_json_skip_ws(ckptio_json *j) {
  while (j->pos < j->len && is_ws(j->buf[j->pos])) j->pos++;
}

int ckptio_json_peek(ckptio_json *j) {
  ckptio_json_skip_ws(j);
  return j->pos < j->len ? j->buf[j->pos] : -1;
}

/* The byte at pos without skipping whitespace (inside tokens), or -1. */
static int at(const ckptio_json *j) { return j->pos < j->len ? j->buf[j->pos] : -1; }

static int expect(ckptio_json *j, int c, const char *what) {
  if (ckptio_json_peek(j) != c) return ckptio_json_fail(j, what);
  j->pos++;
  return 0;
}

static int open_nested(ckptio_json *j, int c, const char *what) {
  if (j->depth >= CKPTIO_JSON_MAX_DEPTH) return ckptio_json_fail(j, "nesting deeper than 64 levels");
  int rc = expect(j, c, what);
  if (rc < 0) return rc;
  j->depth++;
  return 0;
}

int ckptio_json_object_begin(ckptio_json *j) { return open_nested(j, '{', "expected an object"); }
int ckptio_json_array_begin(ckptio_json *j) { return open_nested(j, '[', "expected an array"); }

int ckptio_json_object_next(ckptio_json *j, size_t *count, const char **key) {
  int c = ckptio_json_peek(j);
  if (c == '}') {
    j->pos++;
    j->depth--;
    return 0;
  }
  if (*count > 0) {
    if (c != ',') return ckptio_json_fail(j, "expected ',' or '}' after an object member");
    j->pos++;
    c = ckptio_json_peek(j);
  }
  /* Also refuses a trailing comma: after ',' only a key may follow. */
  if (c != '"') return ckptio_json_fail(j, "expected a string key");
  int rc = ckptio_json_string(j, key, NULL);
  if (rc < 0) return rc;
  rc = expect(j, ':', "expected ':' after an object key");
  if (rc < 0) return rc;
  (*count)++;
  return 1;
}

int ckptio_json_array_next(ckptio_json *j, size_t *count) {
  int c = ckptio_json_peek(j);
  if (c == ']') {
    j->pos++;
    j->depth--;
    return 0;
  }
  if (*count > 0) {
    if (c != ',') return ckptio_json_fail(j, "expected ',' or ']' after an array element");
    j->pos++;
    if (ckptio_json_peek(j) == ']') return ckptio_json_fail(j, "trailing ',' in an array");
  }
  (*count)++;
  return 1;
}

/* Makes room for n more bytes plus the terminator in the scratch string. */
static int scratch_reserve(ckptio_json *j, size_t used, size_t n) {
  if (used + n + 1 <= j->scratch_cap) return 0;
  size_t cap = j->scratch_cap ? j->scratch_cap : 64;
  while (cap < used + n + 1) {
    if (cap > SIZE_MAX / 2) return -ENOMEM;
    cap *= 2;
  }
  char *p = realloc(j->scratch, cap);
  if (!p) return ckptio_err_fmt(j->err, j->errlen, -ENOMEM, "out of memory reading the header");
  j->scratch = p;
  j->scratch_cap = cap;
  return 0;
}

static int hex4(ckptio_json *j, uint32_t *out) {
  uint32_t v = 0;
  if (j->len - j->pos < 4) return ckptio_json_fail(j, "truncated \\u escape");
  for (int k = 0; k < 4; k++) {
    int c = j->buf[j->pos + k], d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else return ckptio_json_fail(j, "bad hex digit in \\u escape");
    v = v << 4 | (uint32_t)d;
  }
  j->pos += 4;
  *out = v;
  return 0;
}

/* Decodes \uXXXX (j->pos just after the 'u'), joining a surrogate pair.
 * Lone surrogates are refused, as serde_json refuses them. */
static int unicode_escape(ckptio_json *j, uint32_t *cp) {
  uint32_t hi, lo;
  int rc = hex4(j, &hi);
  if (rc < 0) return rc;
  if (hi >= 0xDC00 && hi <= 0xDFFF) return ckptio_json_fail(j, "lone low surrogate in \\u escape");
  if (hi >= 0xD800 && hi <= 0xDBFF) {
    if (j->len - j->pos < 2 || j->buf[j->pos] != '\\' || j->buf[j->pos + 1] != 'u')
      return ckptio_json_fail(j, "high surrogate not followed by a \\u low surrogate");
    j->pos += 2;
    rc = hex4(j, &lo);
    if (rc < 0) return rc;
    if (lo < 0xDC00 || lo > 0xDFFF)
      return ckptio_json_fail(j, "high surrogate not followed by a low surrogate");
    hi = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
  }
  if (hi == 0) return ckptio_json_fail(j, "\\u0000 in a string is not supported");
  *cp = hi;
  return 0;
}

static size_t utf8_encode(uint32_t cp, char *o) {
  if (cp < 0x80) {
    o[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (char)(0xC0 | cp >> 6);
    o[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (char)(0xE0 | cp >> 12);
    o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (char)(0xF0 | cp >> 18);
  o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
  o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
  o[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

int ckptio_json_string(ckptio_json *j, const char **out, size_t *n) {
  size_t used = 0;
  int rc = expect(j, '"', "expected a string");
  if (rc < 0) return rc;
  for (;;) {
    /* Copy a run of plain bytes in one go. */
    size_t start = j->pos;
    while (j->pos < j->len) {
      uint8_t c = j->buf[j->pos];
      if (c == '"' || c == '\\' || c < 0x20) break;
      j->pos++;
    }
    size_t run = j->pos - start;
    if ((rc = scratch_reserve(j, used, run + 4)) < 0) return rc;
    memcpy(j->scratch + used, j->buf + start, run);
    used += run;
    int c = at(j);
    if (c < 0) return ckptio_json_fail(j, "unterminated string");
    if (c == '"') {
      j->pos++;
      break;
    }
    if (c < 0x20) return ckptio_json_fail(j, "control character in a string");
    j->pos++; /* the backslash */
    int e = at(j);
    j->pos++;
    switch (e) {
      case '"': case '\\': case '/': j->scratch[used++] = (char)e; break;
      case 'b': j->scratch[used++] = '\b'; break;
      case 'f': j->scratch[used++] = '\f'; break;
      case 'n': j->scratch[used++] = '\n'; break;
      case 'r': j->scratch[used++] = '\r'; break;
      case 't': j->scratch[used++] = '\t'; break;
      case 'u': {
        uint32_t cp = 0;
        if ((rc = unicode_escape(j, &cp)) < 0) return rc;
        used += utf8_encode(cp, j->scratch + used);
        break;
      }
      default:
        j->pos--;
        return ckptio_json_fail(j, e < 0 ? "unterminated escape" : "invalid escape in a string");
    }
  }
  if ((rc = scratch_reserve(j, used, 0)) < 0) return rc;
  j->scratch[used] = '\0';
  if (out) *out = j->scratch;
  if (n) *n = used;
  return 0;
}

int ckptio_json_u64(ckptio_json *j, uint64_t *out) {
  int c = ckptio_json_peek(j);
  if (c == '-') return ckptio_json_fail(j, "negative number where an unsigned integer is expected");
  if (!is_digit(c)) return ckptio_json_fail(j, "expected an unsigned integer");
  size_t start = j->pos;
  uint64_t v = 0;
  while (is_digit(at(j))) {
    uint64_t d = (uint64_t)(at(j) - '0');
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, d, &v)) {
      j->pos = start;
      return ckptio_json_fail(j, "integer above 2^64-1");
    }
    j->pos++;
  }
  if (j->pos - start > 1 && j->buf[start] == '0') {
    j->pos = start;
    return ckptio_json_fail(j, "number with a leading zero");
  }
  c = at(j);
  if (c == '.' || c == 'e' || c == 'E')
    return ckptio_json_fail(j, "fraction or exponent where an unsigned integer is expected");
  *out = v;
  return 0;
}

static int literal(ckptio_json *j, const char *word) {
  size_t n = strlen(word);
  ckptio_json_skip_ws(j);
  if (j->len - j->pos < n || memcmp(j->buf + j->pos, word, n) != 0)
    return ckptio_json_fail(j, "invalid literal");
  j->pos += n;
  return 0;
}

int ckptio_json_null(ckptio_json *j) { return literal(j, "null"); }

/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static int skip_number(ckptio_json *j) {
  if (at(j) == '-') j->pos++;
  if (at(j) == '0') {
    j->pos++;
  } else if (is_digit(at(j))) {
    while (is_digit(at(j))) j->pos++;
  } else {
    return ckptio_json_fail(j, "invalid number");
  }
  if (at(j) == '.') {
    j->pos++;
    if (!is_digit(at(j))) return ckptio_json_fail(j, "invalid number: no digit after '.'");
    while (is_digit(at(j))) j->pos++;
  }
  if (at(j) == 'e' || at(j) == 'E') {
    j->pos++;
    if (at(j) == '+' || at(j) == '-') j->pos++;
    if (!is_digit(at(j))) return ckptio_json_fail(j, "invalid number: no digit in exponent");
    while (is_digit(at(j))) j->pos++;
  }
  return 0;
}

int ckptio_json_skip_value(ckptio_json *j) {
  int rc;
  size_t count = 0;
  switch (ckptio_json_peek(j)) {
    case '{':
      if ((rc = ckptio_json_object_begin(j)) < 0) return rc;
      while ((rc = ckptio_json_object_next(j, &count, NULL)) == 1)
        if ((rc = ckptio_json_skip_value(j)) < 0) return rc;
      return rc;
    case '[':
      if ((rc = ckptio_json_array_begin(j)) < 0) return rc;
      while ((rc = ckptio_json_array_next(j, &count)) == 1)
        if ((rc = ckptio_json_skip_value(j)) < 0) return rc;
      return rc;
    case '"': return ckptio_json_string(j, NULL, NULL);
    case 't': return literal(j, "true");
    case 'f': return literal(j, "false");
    case 'n': return literal(j, "null");
    case '-': case '0': case '1': case '2': case '3': case '4':
    case '5': case '6': case '7': case '8': case '9':
      return skip_number(j);
    case -1: return ckptio_json_fail(j, "unexpected end, expected a value");
    default: return ckptio_json_fail(j, "expected a value");
  }
}

/* ------------------------------------------------------------ writer */

int ckptio_json_out_put(ckptio_json_out *o, const void *s, size_t n) {
  if (n > SIZE_MAX - o->len - 1) return -ENOMEM;
  if (o->len + n > o->cap) {
    size_t cap = o->cap ? o->cap : 256;
    while (cap < o->len + n) {
      if (cap > SIZE_MAX / 2) return -ENOMEM;
      cap *= 2;
    }
    char *p = realloc(o->data, cap);
    if (!p) return -ENOMEM;
    o->data = p;
    o->cap = cap;
  }
  if (n) memcpy(o->data + o->len, s, n);
  o->len += n;
  return 0;
}

int ckptio_json_out_puts(ckptio_json_out *o, const char *s) {
  return ckptio_json_out_put(o, s, strlen(s));
}

int ckptio_json_out_u64(ckptio_json_out *o, uint64_t v) {
  char b[24];
  int n = snprintf(b, sizeof(b), "%" PRIu64, v);
  return ckptio_json_out_put(o, b, (size_t)n);
}

int ckptio_json_out_string(ckptio_json_out *o, const char *s) {
  static const char hex[] = "0123456789abcdef";
  int rc = ckptio_json_out_put(o, "\"", 1);
  while (rc == 0 && *s) {
    size_t run = 0;
    while (s[run] && s[run] != '"' && s[run] != '\\' && (uint8_t)s[run] >= 0x20) run++;
    if (run) {
      rc = ckptio_json_out_put(o, s, run);
      s += run;
      continue;
    }
    char e[6] = {'\\', 0, '0', '0', 0, 0};
    size_t n = 2;
    uint8_t c = (uint8_t)*s++;
    switch (c) {
      case '"': e[1] = '"'; break;
      case '\\': e[1] = '\\'; break;
      case '\b': e[1] = 'b'; break;
      case '\f': e[1] = 'f'; break;
      case '\n': e[1] = 'n'; break;
      case '\r': e[1] = 'r'; break;
      case '\t': e[1] = 't'; break;
      default:
        e[1] = 'u';
        e[4] = hex[c >> 4];
        e[5] = hex[c & 15];
        n = 6;
    }
    rc = ckptio_json_out_put(o, e, n);
  }
  if (rc == 0) rc = ckptio_json_out_put(o, "\"", 1);
  return rc;
}
