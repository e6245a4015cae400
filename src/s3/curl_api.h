/* libcurl, loaded at run time (curl_api.c): the functions the S3 room calls,
 * in one table. The library does not link libcurl, as it does not link the
 * CUDA runtime: a process that never opens an s3:// path never needs it,
 * and a wheel carries no copy of libcurl and the TLS, Kerberos and LDAP
 * libraries under it. curl/curl.h is still needed at build time, for the
 * types and constants. Inside the S3 room only. */
#ifndef CKPTIO_S3_CURL_API_H
#define CKPTIO_S3_CURL_API_H

#include <stddef.h>

#include <curl/curl.h>

typedef struct ckptio_curl_api {
  CURL *(*easy_init)(void);
  CURLcode (*easy_setopt)(CURL *h, CURLoption opt, ...);
  CURLcode (*easy_perform)(CURL *h);
  CURLcode (*easy_getinfo)(CURL *h, CURLINFO info, ...);
  void (*easy_reset)(CURL *h);
  void (*easy_cleanup)(CURL *h);
  const char *(*easy_strerror)(CURLcode cc);
  struct curl_slist *(*slist_append)(struct curl_slist *list, const char *s);
  void (*slist_free_all)(struct curl_slist *list);
} ckptio_curl_api;

/* The table, loaded once per process (thread-safe): dlopen of libcurl.so.4,
 * then libcurl.so, every function resolved, curl_global_init run and the
 * version checked (7.75.0 or newer: AWS SigV4 signing). @return 0 with
 * *out set, or, every time after a failure, the same error: CKPTIO_E_FORMAT
 * when no usable libcurl loads (the sentence says how to install one), -EIO
 * when curl_global_init fails. In a build with CKPTIO_FAULT_INJECTION the
 * variable CKPTIO_FAULT_LIBCURL names the one library to try instead, so
 * a test can make libcurl unloadable. */
int ckptio_curl_load(const ckptio_curl_api **out, char *err, size_t errlen);

#endif
