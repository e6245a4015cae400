/* Just enough XML for S3's replies: find an element by name, take its text
 * with the five entities and numeric references decoded. S3's replies are
 * flat records (no CDATA, no comments inside the elements read here). */
#include <stdlib.h>
#include <string.h>

#include "s3/request.h"

/* The next "<tag>", "<tag ...>" or "<tag/>" in [p, end); *self for <tag/>. */
static const char *open_tag(const char *p, const char *end, const char *tag, size_t tlen, const char **after,
                            int *self) {
  while (p < end && (p = memchr(p, '<', (size_t)(end - p))) != NULL) {
    const char *q = p + 1;
    if ((size_t)(end - q) > tlen && memcmp(q, tag, tlen) == 0 &&
        (q[tlen] == '>' || q[tlen] == ' ' || q[tlen] == '/' || q[tlen] == '\t' || q[tlen] == '\n')) {
      const char *gt = memchr(q + tlen, '>', (size_t)(end - q - tlen));
      if (!gt) return NULL;
      *self = gt[-1] == '/';
      *after = gt + 1;
      return p;
    }
    p = q;
  }
  return NULL;
}

const char *ckptio_s3_xml_find(const char *p, const char *end, const char *tag, const char **body,
                               const char **body_end) {
  size_t tlen = strlen(tag);
  const char *after;
  int self;
  if (!p || !open_tag(p, end, tag, tlen, &after, &self)) return NULL;
  if (self) {
    *body = *body_end = after;
    return after;
  }
  /* The matching close: S3's records do not nest an element in itself. */
  for (const char *q = after; q < end && (q = memchr(q, '<', (size_t)(end - q))) != NULL; q++) {
    if ((size_t)(end - q) >= tlen + 3 && q[1] == '/' && memcmp(q + 2, tag, tlen) == 0 && q[2 + tlen] == '>') {
      *body = after;
      *body_end = q;
      return q + tlen + 3;
    }
  }
  return NULL;
}

static size_t put_utf8(unsigned long cp, char *o) {
  if (cp < 0x80) {
    o[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (char)(0xC0 | (cp >> 6));
    o[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (char)(0xE0 | (cp >> 12));
    o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (char)(0xF0 | (cp >> 18));
  o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  o[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

int ckptio_s3_xml_text(const char *p, const char *end, const char *tag, char *out, size_t outlen) {
  static const struct {
    const char *name;
    char ch;
  } kEntities[] = {{"amp;", '&'}, {"lt;", '<'}, {"gt;", '>'}, {"quot;", '"'}, {"apos;", '\''}};
  const char *b, *e;
  if (!outlen || !ckptio_s3_xml_find(p, end, tag, &b, &e)) return -1;
  size_t n = 0;
  while (b < e) {
    char tmp[4];
    size_t k = 1;
    tmp[0] = *b;
    const char *next = b + 1;
    if (*b == '&') {
      const char *semi = memchr(b, ';', (size_t)(e - b));
      if (semi && b[1] == '#') {
        unsigned long cp = b[2] == 'x' ? strtoul(b + 3, NULL, 16) : strtoul(b + 2, NULL, 10);
        if (cp > 0 && cp <= 0x10FFFF) {
          k = put_utf8(cp, tmp);
          next = semi + 1;
        }
      } else if (semi) {
        for (size_t i = 0; i < sizeof(kEntities) / sizeof(kEntities[0]); i++) {
          size_t len = strlen(kEntities[i].name);
          if ((size_t)(semi + 1 - (b + 1)) == len && memcmp(b + 1, kEntities[i].name, len) == 0) {
            tmp[0] = kEntities[i].ch;
            next = semi + 1;
          }
        }
      }
    }
    if (n + k >= outlen) {
      out[n] = '\0'; /* what fits, still a string */
      return -2;
    }
    memcpy(out + n, tmp, k);
    n += k;
    b = next;
  }
  out[n] = '\0';
  return (int)n;
}
