/* libcurl loaded at run time, once (curl_api.h says why): libcurl.so.4, the
 * SONAME every libcurl since 7.16 has, then libcurl.so (a development
 * symlink, for a libcurl installed under that name only). Every function
 * goes into one table; a missing one, or a libcurl older than SigV4
 * signing, unloads it and the S3 verbs fail with the reason. The only file
 * of the library that names libcurl's functions. */
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckptio.h"
#include "core/error.h"
#include "s3/curl_api.h"

/* What a user without libcurl reads, after the reason: the package that
 * holds libcurl.so.4 on the common distributions. */
#define INSTALL_HINT \
  "install it (Debian/Ubuntu: apt-get install libcurl4; RHEL/Fedora: dnf install libcurl; Alpine: apk add libcurl)"

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static ckptio_curl_api api;
static int load_rc;
static char load_err[CKPTIO_ERRLEN];

static void *open_first(const char *const *names, int n, char *why, size_t whylen, const char **name) {
  size_t used = 0;
  why[0] = '\0';
  for (int i = 0; i < n; i++) {
    void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h) {
      *name = names[i];
      return h;
    }
    /* dlerror names the file that failed, which may be a library libcurl
     * needs rather than libcurl: say which name it was loading. */
    const char *e = dlerror();
    if (!e) e = "not loaded";
    size_t nl = strlen(names[i]);
    int named = strncmp(e, names[i], nl) == 0 && e[nl] == ':';
    int k = snprintf(why + used, whylen - used, "%s%s%s%s", used ? "; " : "", named ? "" : names[i],
                     named ? "" : ": ", e);
    if (k > 0) used += (size_t)k < whylen - used ? (size_t)k : whylen - used - 1;
  }
  return NULL;
}

static void load(void) {
  const char *names[] = {"libcurl.so.4", "libcurl.so"};
  int n = 2;
#ifdef CKPTIO_FAULT_INJECTION
  /* A test build only: the library to try instead, so a test can see what
   * a machine without libcurl gets. Production builds never read it. */
  const char *fault = getenv("CKPTIO_FAULT_LIBCURL");
  if (fault && *fault) {
    names[0] = fault;
    n = 1;
  }
#endif
  char why[768];
  const char *name = NULL;
  void *h = open_first(names, n, why, sizeof(why), &name);
  if (!h) {
    load_rc = ckptio_err_fmt(load_err, sizeof(load_err), CKPTIO_E_FORMAT,
                             "S3 (s3://) needs libcurl 4 at run time, which could not be loaded (%s): " INSTALL_HINT,
                             why);
    return;
  }
  char path[512];
  struct link_map *lm = NULL;
  snprintf(path, sizeof(path), "%s", dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name[0] ? lm->l_name : name);
  CURLcode (*global_init)(long) = NULL;
  curl_version_info_data *(*version_info)(CURLversion) = NULL;
  /* Object pointers to function pointers through memcpy: ISO C has no
   * cast between them, POSIX guarantees the representation. */
#define RESOLVE(dst, sym)                                                                                     \
  do {                                                                                                        \
    void *p_ = dlsym(h, sym);                                                                                 \
    if (!p_) {                                                                                                \
      load_rc = ckptio_err_fmt(load_err, sizeof(load_err), CKPTIO_E_FORMAT,                                   \
                               "S3 (s3://) needs libcurl 4 at run time: %s, the library loaded as %s, has no " \
                               "%s (is it libcurl?): " INSTALL_HINT,                                          \
                               path, name, sym);                                                              \
      goto fail;                                                                                              \
    }                                                                                                         \
    memcpy(&(dst), &p_, sizeof(dst));                                                                         \
  } while (0)
  RESOLVE(global_init, "curl_global_init");
  RESOLVE(version_info, "curl_version_info");
  RESOLVE(api.easy_init, "curl_easy_init");
  RESOLVE(api.easy_setopt, "curl_easy_setopt");
  RESOLVE(api.easy_perform, "curl_easy_perform");
  RESOLVE(api.easy_getinfo, "curl_easy_getinfo");
  RESOLVE(api.easy_reset, "curl_easy_reset");
  RESOLVE(api.easy_cleanup, "curl_easy_cleanup");
  RESOLVE(api.easy_strerror, "curl_easy_strerror");
  RESOLVE(api.slist_append, "curl_slist_append");
  RESOLVE(api.slist_free_all, "curl_slist_free_all");
#undef RESOLVE
  /* The library loaded may be older than the headers built against:
   * SigV4 signing came in 7.75.0. */
  const curl_version_info_data *v = version_info(CURLVERSION_NOW);
  if (!v || v->version_num < 0x074B00) {
    load_rc = ckptio_err_fmt(load_err, sizeof(load_err), CKPTIO_E_FORMAT,
                             "S3 (s3://): libcurl %s (%s) has no AWS SigV4 signing (7.75.0 or newer is needed)",
                             v && v->version ? v->version : "?", path);
    goto fail;
  }
  /* curl_global_init is not thread-safe on every libcurl: once per process,
   * never cleaned up (another library in the process may use libcurl), and
   * the library never unloaded after it. */
  CURLcode cc = global_init(CURL_GLOBAL_DEFAULT);
  if (cc != CURLE_OK) {
    load_rc = ckptio_err_fmt(load_err, sizeof(load_err), -EIO, "S3 (s3://): libcurl (%s) failed to start: %s", path,
                             api.easy_strerror(cc));
    memset(&api, 0, sizeof(api));
    return;
  }
  return;
fail:
  memset(&api, 0, sizeof(api));
  dlclose(h);
}

int ckptio_curl_load(const ckptio_curl_api **out, char *err, size_t errlen) {
  pthread_once(&load_once, load);
  if (load_rc < 0) {
    *out = NULL;
    return ckptio_err_fmt(err, errlen, load_rc, "%s", load_err);
  }
  *out = &api;
  return 0;
}
