/* The fake's configuration (environment), its counters, the fault rules that
 * fail the nth call of a function, the per-thread last error, and the error
 * names and strings (the real runtime's wording). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

struct fc_config fc_cfg;
pthread_mutex_t fc_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t fc_progress = PTHREAD_COND_INITIALIZER;
struct fake_cudart_stats fc_st = {.size = sizeof(struct fake_cudart_stats)};
long fc_delay_us = 2000;
long fc_mbps = 20000; /* PCIe 4.0 x16, one direction */
int fc_held;
struct fc_dev *fc_devs;

static const char *const fn_names[FC_NFN] = {
#define FC_NAME(n) #n,
    FC_FUNCS(FC_NAME)
#undef FC_NAME
};

#define MAX_RULES 32
struct rule {
  enum fc_fn fn;
  long nth;           /* 0: every call */
  cudaError_t err;
  int exec;           /* fail when the queued operation runs */
};
static struct rule rules[MAX_RULES];
static int nrules;
static long calls[FC_NFN];
static _Thread_local cudaError_t last_err;

/* ------------------------------------------------------------ errors */

#define E(code, text) {code, #code, text}
static const struct {
  cudaError_t code;
  const char *name, *text;
} errors[] = {
    E(cudaSuccess, "no error"),
    E(cudaErrorInvalidValue, "invalid argument"),
    E(cudaErrorMemoryAllocation, "out of memory"),
    E(cudaErrorInitializationError, "initialization error"),
    E(cudaErrorCudartUnloading, "driver shutting down"),
    E(cudaErrorInvalidConfiguration, "invalid configuration argument"),
    E(cudaErrorInvalidHostPointer, "invalid host pointer"),
    E(cudaErrorInvalidDevicePointer, "invalid device pointer"),
    E(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy"),
    E(cudaErrorStubLibrary, "CUDA driver is a stub library"),
    E(cudaErrorInsufficientDriver, "CUDA driver version is insufficient for CUDA runtime version"),
    E(cudaErrorCallRequiresNewerDriver, "API call is not supported in the installed CUDA driver"),
    E(cudaErrorDevicesUnavailable, "CUDA-capable device(s) is/are busy or unavailable"),
    E(cudaErrorNoDevice, "no CUDA-capable device is detected"),
    E(cudaErrorInvalidDevice, "invalid device ordinal"),
    E(cudaErrorStartupFailure, "startup failure in cuda runtime"),
    E(cudaErrorDeviceUninitialized, "invalid device context"),
    E(cudaErrorECCUncorrectable, "uncorrectable ECC error encountered"),
    E(cudaErrorDeviceAlreadyInUse, "exclusive-thread device already in use by a different thread"),
    E(cudaErrorPeerAccessUnsupported, "peer access is not supported between these two devices"),
    E(cudaErrorNvlinkUncorrectable, "uncorrectable NVLink error detected during the execution"),
    E(cudaErrorContained, "Invalid access of peer GPU memory over nvlink or a hardware error"),
    E(cudaErrorOperatingSystem, "OS call failed or operation not supported on this OS"),
    E(cudaErrorInvalidResourceHandle, "invalid resource handle"),
    E(cudaErrorIllegalState, "the operation cannot be performed in the present state"),
    E(cudaErrorNotReady, "device not ready"),
    E(cudaErrorIllegalAddress, "an illegal memory access was encountered"),
    E(cudaErrorLaunchOutOfResources, "too many resources requested for launch"),
    E(cudaErrorLaunchTimeout, "the launch timed out and was terminated"),
    E(cudaErrorContextIsDestroyed, "context is destroyed"),
    E(cudaErrorAssert, "device-side assert triggered"),
    E(cudaErrorHostMemoryAlreadyRegistered, "part or all of the requested memory range is already mapped"),
    E(cudaErrorHostMemoryNotRegistered, "pointer does not correspond to a registered memory region"),
    E(cudaErrorHardwareStackError, "hardware stack error"),
    E(cudaErrorIllegalInstruction, "an illegal instruction was encountered"),
    E(cudaErrorMisalignedAddress, "misaligned address"),
    E(cudaErrorInvalidAddressSpace, "operation not supported on global/shared address space"),
    E(cudaErrorInvalidPc, "invalid program counter"),
    E(cudaErrorLaunchFailure, "unspecified launch failure"),
    E(cudaErrorNotPermitted, "operation not permitted"),
    E(cudaErrorNotSupported, "operation not supported"),
    E(cudaErrorSystemNotReady, "system not yet initialized"),
    E(cudaErrorSystemDriverMismatch, "system has unsupported display driver / cuda driver combination"),
    E(cudaErrorTimeout, "wait operation timed out"),
    E(cudaErrorUnknown, "unknown error"),
};
#undef E
#define NERRORS (sizeof errors / sizeof errors[0])

const char *fc_error_name(cudaError_t e) {
  for (size_t i = 0; i < NERRORS; i++)
    if (errors[i].code == e) return errors[i].name;
  return "unrecognized error code";
}

const char *fc_error_string(cudaError_t e) {
  for (size_t i = 0; i < NERRORS; i++)
    if (errors[i].code == e) return errors[i].text;
  return "unrecognized error code";
}

cudaError_t fc_ret(cudaError_t e) {
  if (e != cudaSuccess && e != cudaErrorNotReady) last_err = e;
  return e;
}

cudaError_t fc_take_last_error(void) {
  cudaError_t e = last_err;
  last_err = cudaSuccess;
  return e;
}

/* ------------------------------------------------------------ configuration */

static long env_long(const char *name, long dflt, long lo, long hi) {
  const char *s = getenv(name);
  if (!s || !*s) return dflt;
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < lo || v > hi) {
    fprintf(stderr, "fake_cudart: %s=%s is not an integer in [%ld, %ld]\n", name, s, lo, hi);
    abort();
  }
  return v;
}

static int fn_lookup(const char *name, size_t len) {
  /* A _ptds / _ptsz name is the same function with another default stream. */
  if (len > 5 && (!strncmp(name + len - 5, "_ptds", 5) || !strncmp(name + len - 5, "_ptsz", 5)))
    len -= 5;
  for (int i = 0; i < FC_NFN; i++)
    if (strlen(fn_names[i]) == len && !strncmp(fn_names[i], name, len)) return i;
  return -1;
}

static int err_lookup(const char *s, cudaError_t *out) {
  for (size_t i = 0; i < NERRORS; i++)
    if (!strcmp(errors[i].name, s)) {
      *out = errors[i].code;
      return 0;
    }
  char *end;
  long v = strtol(s, &end, 10);
  if (!*s || *end || v <= 0 || v > 100000) return -1;
  *out = (cudaError_t)v;
  return 0;
}

static int exec_capable(enum fc_fn fn) {
  return fn == FC_cudaMemcpyAsync || fn == FC_cudaMemcpy || fn == FC_cudaMemsetAsync ||
         fn == FC_cudaMemset;
}

/* Parses "func:nth:err[:exec],..." into out. @return the count, or -1. */
static int parse_spec(const char *spec, struct rule *out) {
  int n = 0;
  char buf[256];
  while (*spec) {
    size_t len = strcspn(spec, ",");
    if (len == 0 || len >= sizeof buf || n == MAX_RULES) return -1;
    memcpy(buf, spec, len);
    buf[len] = 0;
    spec += len + (spec[len] == ',');
    char *f[5] = {0};
    int nf = 0;
    for (char *save = NULL, *t = strtok_r(buf, ":", &save); t; t = strtok_r(NULL, ":", &save))
      if (nf < 5) f[nf++] = t; else return -1;
    if (nf < 3 || nf > 4) return -1;
    int fn = fn_lookup(f[0], strlen(f[0]));
    char *end;
    long nth = strtol(f[1], &end, 10);
    if (fn < 0 || *end || nth < 0 || err_lookup(f[2], &out[n].err)) return -1;
    out[n].fn = (enum fc_fn)fn;
    out[n].nth = nth;
    out[n].exec = nf == 4;
    if (out[n].exec && (strcmp(f[3], "exec") || !exec_capable(out[n].fn))) return -1;
    n++;
  }
  return n;
}

static void init_once(void) {
  fc_cfg.ndev = (int)env_long("FAKE_CUDART_DEVICES", 1, 0, 64);
  fc_cfg.mem_bytes = (size_t)env_long("FAKE_CUDART_MEM_MB", 4096, 1, 1L << 20) << 20;
  fc_cfg.driver_version = (int)env_long("FAKE_CUDART_DRIVER_VERSION", 13000, 0, 1000000);
  __atomic_store_n(&fc_delay_us, env_long("FAKE_CUDART_DELAY_US", 2000, 0, 60000000),
                   __ATOMIC_RELAXED);
  __atomic_store_n(&fc_mbps, env_long("FAKE_CUDART_MBPS", 20000, 0, 100000000), __ATOMIC_RELAXED);
  fc_devs = calloc(fc_cfg.ndev ? (size_t)fc_cfg.ndev : 1, sizeof *fc_devs);
  if (!fc_devs) abort();
  const char *spec = getenv("FAKE_CUDART_FAIL");
  if (spec && *spec) {
    int n = parse_spec(spec, rules);
    if (n < 0) {
      fprintf(stderr, "fake_cudart: bad FAKE_CUDART_FAIL '%s' (want func:nth:cudaErrorName[:exec],...)\n",
              spec);
      abort();
    }
    nrules = n;
  }
}

void fc_init(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, init_once);
}

cudaError_t fc_enter(enum fc_fn fn, cudaError_t *exec_err) {
  fc_init();
  cudaError_t e = cudaSuccess;
  pthread_mutex_lock(&fc_lock);
  long c = ++calls[fn];
  for (int i = 0; i < nrules; i++) {
    if (rules[i].fn != fn || (rules[i].nth && rules[i].nth != c)) continue;
    if (rules[i].exec && exec_err) *exec_err = rules[i].err;
    else e = rules[i].err;
    break;
  }
  pthread_mutex_unlock(&fc_lock);
  return e;
}

void fc_faults_reset_counts(void) { memset(calls, 0, sizeof calls); }

void fc_note_peaks(void) {
  struct fake_cudart_stats *s = &fc_st;
  if (s->pinned_bytes > s->peak_pinned_bytes) s->peak_pinned_bytes = s->pinned_bytes;
  uint64_t locked = s->pinned_bytes + s->registered_bytes;
  if (locked > s->peak_locked_bytes) s->peak_locked_bytes = locked;
  if (s->device_bytes > s->peak_device_bytes) s->peak_device_bytes = s->device_bytes;
}

/* ------------------------------------------------------------ test API */

int fake_cudart_stats(struct fake_cudart_stats *st) {
  if (!st || st->size < sizeof st->size) return -EINVAL;
  size_t n = st->size < sizeof *st ? st->size : sizeof *st;
  fc_init();
  pthread_mutex_lock(&fc_lock);
  struct fake_cudart_stats copy = fc_st;
  pthread_mutex_unlock(&fc_lock);
  copy.size = n;
  memcpy(st, &copy, n);
  return 0;
}

void fake_cudart_reset_stats(void) {
  fc_init();
  pthread_mutex_lock(&fc_lock);
  struct fake_cudart_stats *s = &fc_st;
  s->async_copies = s->sync_copies = s->pageable_copies = s->memsets = 0;
  s->bytes_h2d = s->bytes_d2h = s->bytes_d2d = s->bytes_h2h = 0;
  s->frees_while_busy = s->exec_failures = 0;
  s->peak_pinned_bytes = s->peak_locked_bytes = s->peak_device_bytes = 0;
  fc_note_peaks();
  fc_faults_reset_counts();
  fc_streams_clear_sticky();
  pthread_mutex_unlock(&fc_lock);
}

int fake_cudart_set_fail(const char *func, long nth, int err) {
  fc_init();
  int fn = -1;
  if (func && ((fn = fn_lookup(func, strlen(func))) < 0 || nth < 0)) return -EINVAL;
  pthread_mutex_lock(&fc_lock);
  int kept = 0;
  for (int i = 0; i < nrules; i++)
    if (func && (int)rules[i].fn != fn) rules[kept++] = rules[i];
  nrules = kept;
  int rc = 0;
  if (func && err) {
    if (nrules == MAX_RULES) rc = -EINVAL;
    else rules[nrules++] = (struct rule){(enum fc_fn)fn, nth, (cudaError_t)err, 0};
  }
  fc_faults_reset_counts();
  pthread_mutex_unlock(&fc_lock);
  return rc;
}

int fake_cudart_set_fail_spec(const char *spec) {
  struct rule parsed[MAX_RULES];
  fc_init();
  int n = parse_spec(spec ? spec : "", parsed);
  if (n < 0) return -EINVAL;
  pthread_mutex_lock(&fc_lock);
  memcpy(rules, parsed, (size_t)n * sizeof parsed[0]);
  nrules = n;
  fc_faults_reset_counts();
  pthread_mutex_unlock(&fc_lock);
  return 0;
}

long fake_cudart_calls(const char *func) {
  int fn = func ? fn_lookup(func, strlen(func)) : -1;
  if (fn < 0) return -1;
  pthread_mutex_lock(&fc_lock);
  long c = calls[fn];
  pthread_mutex_unlock(&fc_lock);
  return c;
}

void fake_cudart_set_delay_us(long us) {
  fc_init();
  __atomic_store_n(&fc_delay_us, us < 0 ? 0 : us, __ATOMIC_RELAXED);
}

void fake_cudart_set_bandwidth_mbps(long mbps) {
  fc_init();
  __atomic_store_n(&fc_mbps, mbps < 0 ? 0 : mbps, __ATOMIC_RELAXED);
}
