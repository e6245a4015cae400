/* s3://bucket/key URLs and the percent-encoding SigV4 asks for. No libcurl
 * here: a build without it still parses (and refuses) S3 URLs clearly. */
#include <stdio.h>
#include <string.h>

#include "ckptio.h"
#include "core/error.h"
#include "s3/request.h"
#include "s3/s3.h"

int ckptio_s3_is_url(const char *path) { return path && strncmp(path, "s3://", 5) == 0; }

static int bucket_char(char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '.' || ch == '-';
}
static int alnum_lower(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9'); }

int ckptio_s3_url_parse(const char *url, ckptio_s3_url *out, char *err, size_t errlen) {
  if (!url || !out) return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "S3 URL: NULL argument");
  if (!ckptio_s3_is_url(url))
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "'%s' is not an S3 URL (s3://bucket/key)", url);
  const char *b = url + 5;
  const char *slash = strchr(b, '/');
  size_t blen = slash ? (size_t)(slash - b) : strlen(b);
  if (blen == 0)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "'%s': no bucket name after s3://", url);
  if (blen < 3 || blen > CKPTIO_S3_BUCKET_MAX)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG,
                          "'%s': a bucket name has 3 to 63 characters, this one %zu", url, blen);
  for (size_t i = 0; i < blen; i++) {
    if (!bucket_char(b[i]))
      return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG,
                            "'%s': bucket names hold only a-z 0-9 . - (found '%c')", url, b[i]);
  }
  if (!alnum_lower(b[0]) || !alnum_lower(b[blen - 1]))
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG,
                          "'%s': a bucket name begins and ends with a letter or digit", url);
  const char *key = slash ? slash + 1 : "";
  size_t klen = strlen(key);
  if (klen > CKPTIO_S3_KEY_MAX)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "'%.64s...': the key has %zu bytes, S3 allows %d",
                          url, klen, CKPTIO_S3_KEY_MAX);
  memcpy(out->bucket, b, blen);
  out->bucket[blen] = '\0';
  memcpy(out->key, key, klen + 1);
  return 0;
}

/* SigV4's URI encoding: every byte but A-Z a-z 0-9 - _ . ~ as %XX (upper
 * case), '/' kept in paths. curl 7.88 signs the path and query exactly as
 * given, so what is sent must already be canonical. */
int ckptio_s3_encode(const char *s, int keep_slash, char *out, size_t outlen) {
  static const char hex[] = "0123456789ABCDEF";
  size_t n = 0;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    int plain = (*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
                *p == '-' || *p == '_' || *p == '.' || *p == '~' || (keep_slash && *p == '/');
    if (n + (plain ? 1 : 3) >= outlen) return -1;
    if (plain) {
      out[n++] = (char)*p;
    } else {
      out[n++] = '%';
      out[n++] = hex[*p >> 4];
      out[n++] = hex[*p & 15];
    }
  }
  if (n >= outlen) return -1;
  out[n] = '\0';
  return (int)n;
}

int ckptio_s3_query(const char *const (*params)[2], int n, char *out, size_t outlen) {
  /* SigV4 wants the parameters sorted by name and each as name=value, an
   * empty value included ("uploads="). */
  int order[8];
  if (n > 8) return -1;
  for (int i = 0; i < n; i++) order[i] = i;
  for (int i = 1; i < n; i++) {
    for (int j = i; j > 0 && strcmp(params[order[j - 1]][0], params[order[j]][0]) > 0; j--) {
      int t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  }
  size_t len = 0;
  out[0] = '\0';
  for (int i = 0; i < n; i++) {
    const char *name = params[order[i]][0], *value = params[order[i]][1] ? params[order[i]][1] : "";
    if (i > 0) {
      if (len + 1 >= outlen) return -1;
      out[len++] = '&';
    }
    int k = ckptio_s3_encode(name, 0, out + len, outlen - len);
    if (k < 0) return -1;
    len += (size_t)k;
    if (len + 1 >= outlen) return -1;
    out[len++] = '=';
    k = ckptio_s3_encode(value, 0, out + len, outlen - len);
    if (k < 0) return -1;
    len += (size_t)k;
  }
  out[len] = '\0';
  return (int)len;
}
