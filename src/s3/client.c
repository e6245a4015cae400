/* The S3 client object: its settings (from a config struct or the
 * environment, as AWS tools take them) and its pool of libcurl handles. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckptio.h"
#include "core/error.h"
#include "s3/curl_api.h"
#include "s3/request.h"
#include "s3/s3.h"

static const char *pick(const char *given, const char *env1, const char *env2) {
  if (given) return given;
  const char *v = getenv(env1);
  if ((!v || !*v) && env2) v = getenv(env2);
  return v && *v ? v : NULL;
}

static int dup_into(char **dst, const char *src) {
  if (!src) return 0;
  *dst = strdup(src);
  return *dst ? 0 : -ENOMEM;
}

int ckptio_s3_client_create(const ckptio_s3_config *cfg, ckptio_s3_client **out, char *err,
                            size_t errlen) {
  static const ckptio_s3_config none;
  if (!out) return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "S3 client: NULL out");
  *out = NULL;
  if (!cfg) cfg = &none;
  /* libcurl is loaded here, at the first client: a process that never
   * opens an s3:// path never needs it. */
  const ckptio_curl_api *curl = NULL;
  int lrc = ckptio_curl_load(&curl, err, errlen);
  if (lrc < 0) return lrc;
  const char *endpoint = pick(cfg->endpoint, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL");
  const char *region = pick(cfg->region, "AWS_REGION", "AWS_DEFAULT_REGION");
  const char *access = pick(cfg->access_key, "AWS_ACCESS_KEY_ID", NULL);
  const char *secret = pick(cfg->secret_key, "AWS_SECRET_ACCESS_KEY", NULL);
  const char *token = pick(cfg->session_token, "AWS_SESSION_TOKEN", NULL);
  if (!access || !secret)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG,
                          "S3 client: no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                          "(or the options' access and secret key)");
  if (endpoint && strncmp(endpoint, "http://", 7) != 0 && strncmp(endpoint, "https://", 8) != 0)
    return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG,
                          "S3 client: endpoint '%s' is not an http:// or https:// URL", endpoint);
  if (!region) region = "us-east-1";
  for (const char *p = region; *p; p++) {
    /* The region goes into CURLOPT_AWS_SIGV4, where ':' separates fields. */
    if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-'))
      return ckptio_err_fmt(err, errlen, CKPTIO_E_INVALID_ARG, "S3 client: region '%s' is not a region name",
                            region);
  }
  ckptio_s3_client *c = calloc(1, sizeof(*c));
  if (!c) return ckptio_err_fmt(err, errlen, -ENOMEM, "S3 client: out of memory");
  c->curl = curl;
  int rc = -ENOMEM;
  if (dup_into(&c->endpoint, endpoint) || dup_into(&c->region, region) || dup_into(&c->access_key, access) ||
      dup_into(&c->secret_key, secret) || dup_into(&c->session_token, token)) {
    ckptio_err_fmt(err, errlen, rc, "S3 client: out of memory");
    goto fail;
  }
  if (c->endpoint) {
    size_t n = strlen(c->endpoint);
    while (n > 0 && c->endpoint[n - 1] == '/') c->endpoint[--n] = '\0';
  }
  snprintf(c->sigv4, sizeof(c->sigv4), "aws:amz:%s:s3", c->region);
  c->max_attempts = cfg->max_attempts > 0 ? cfg->max_attempts : 5;
  c->backoff_base_ms = cfg->backoff_base_ms > 0 ? cfg->backoff_base_ms : 50;
  c->backoff_max_ms = cfg->backoff_max_ms > 0 ? cfg->backoff_max_ms : 5000;
  c->connect_timeout_ms = cfg->connect_timeout_ms > 0 ? cfg->connect_timeout_ms : 10000;
  c->low_speed_seconds = cfg->low_speed_seconds > 0 ? cfg->low_speed_seconds : 30;
  c->low_speed_bytes = cfg->low_speed_bytes > 0 ? cfg->low_speed_bytes : 1;
  if (cfg->list_page_size > 0) snprintf(c->page_size, sizeof(c->page_size), "%d", cfg->list_page_size);
  rc = pthread_mutex_init(&c->lock, NULL);
  if (rc) {
    rc = ckptio_err_fmt(err, errlen, -rc, "S3 client: pthread_mutex_init: %s", ckptio_errno_text(rc));
    goto fail;
  }
  *out = c;
  return 0;
fail:
  free(c->endpoint);
  free(c->region);
  free(c->access_key);
  free(c->secret_key);
  free(c->session_token);
  free(c);
  return rc;
}

void ckptio_s3_client_free(ckptio_s3_client *c) {
  if (!c) return;
  while (c->idle) {
    ckptio_s3_handle *h = c->idle;
    c->idle = h->next;
    c->curl->easy_cleanup(h->curl);
    free(h);
  }
  pthread_mutex_destroy(&c->lock);
  free(c->endpoint);
  free(c->region);
  free(c->access_key);
  if (c->secret_key) memset(c->secret_key, 0, strlen(c->secret_key));
  free(c->secret_key);
  free(c->session_token);
  free(c);
}

void ckptio_s3_client_stats(ckptio_s3_client *c, ckptio_s3_stats *out) {
  if (!c || !out) return;
  out->requests = atomic_load(&c->requests);
  out->attempts = atomic_load(&c->attempts);
  out->retries = atomic_load(&c->retries);
  out->connects = atomic_load(&c->connects);
  out->bytes_in = atomic_load(&c->bytes_in);
  out->bytes_out = atomic_load(&c->bytes_out);
}

ckptio_s3_handle *ckptio_s3_handle_take(ckptio_s3_client *c) {
  pthread_mutex_lock(&c->lock);
  ckptio_s3_handle *h = c->idle;
  if (h) c->idle = h->next;
  pthread_mutex_unlock(&c->lock);
  if (h) return h;
  h = calloc(1, sizeof(*h));
  if (!h) return NULL;
  h->curl = c->curl->easy_init();
  if (!h->curl) {
    free(h);
    return NULL;
  }
  return h;
}

void ckptio_s3_handle_give(ckptio_s3_client *c, ckptio_s3_handle *h) {
  if (!h) return;
  pthread_mutex_lock(&c->lock);
  h->next = c->idle;
  c->idle = h;
  pthread_mutex_unlock(&c->lock);
}
