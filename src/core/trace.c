/* The trace file (trace.h): spans as Chrome trace-event "X" events in one
 * process-wide buffer under a short lock, written out by write(2) when it
 * fills and when tracing stops (ckptio_trace_stop, or exit). Not stdio: a
 * child of fork must not flush the parent's buffered events into the
 * parent's file at its exit, so the child drops the buffer (atfork). */
#include "core/trace.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckptio.h"
#include "core/error.h"
#include "core/stats.h"

_Atomic int ckptio_trace_sinks;

/* Written out when this full; an event's text is far shorter. */
#define BUF_BYTES (1u << 20)
#define EVENT_MAX 1024
#define DETAIL_MAX 256

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  int fd;          /* -1: no trace file */
  char *buf;
  size_t len;
  int first;       /* no event written yet: no comma before the next */
  int err;         /* the first failed write's -errno */
  unsigned gen;    /* which file: threads name themselves once per file */
  pid_t pid;
} out = {.fd = -1};

/* The calling thread: its id, its name, and the file it was named in. */
static _Thread_local struct {
  pid_t tid;
  unsigned gen;
  char name[16];
} self;

static pid_t my_tid(void) {
  if (!self.tid) self.tid = gettid();
  return self.tid;
}

/* s as the inside of a JSON string, cut to fit cap (with its NUL) at a
 * character boundary, so that the file stays UTF-8. */
static void escape(char *dst, size_t cap, const char *s) {
  size_t n = 0;
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    char tmp[8];
    int k = c == '"' || c == '\\' ? snprintf(tmp, sizeof(tmp), "\\%c", c)
            : c < 0x20            ? snprintf(tmp, sizeof(tmp), "\\u%04x", c)
                                  : snprintf(tmp, sizeof(tmp), "%c", c);
    if (n + (size_t)k >= cap) {
      while (n > 0 && ((unsigned char)dst[n - 1] & 0xc0) == 0x80) n--; /* continuation bytes */
      if (n > 0 && (unsigned char)dst[n - 1] >= 0xc0) n--;               /* their lead byte */
      break;
    }
    memcpy(dst + n, tmp, (size_t)k);
    n += (size_t)k;
  }
  dst[n] = '\0';
}

/* Under mu. */
static void flush_locked(void) {
  for (size_t at = 0; at < out.len;) {
    ssize_t w = write(out.fd, out.buf + at, out.len - at);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (!out.err) out.err = w < 0 ? -errno : -EIO;
      break;
    }
    at += (size_t)w;
  }
  out.len = 0;
}

/* Under mu: one event (an object's text) after the ones before; room is
 * always left for the closing "\n]\n". */
static void append_locked(const char *text, size_t n) {
  if (out.len + n + 2 + 3 > BUF_BYTES) flush_locked();
  if (!out.first) out.buf[out.len++] = ',';
  out.buf[out.len++] = '\n';
  memcpy(out.buf + out.len, text, n);
  out.len += n;
  out.first = 0;
}

/* Under mu: the "M" event naming the calling thread, once per file. */
static void name_thread_locked(void) {
  if (self.gen == out.gen) return;
  self.gen = out.gen;
  char name[16] = "", esc[64], text[EVENT_MAX];
  if (self.name[0]) snprintf(name, sizeof(name), "%s", self.name);
  else pthread_getname_np(pthread_self(), name, sizeof(name));
  escape(esc, sizeof(esc), name);
  int n = snprintf(text, sizeof(text), "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
                   (int)out.pid, (int)my_tid(), esc);
  append_locked(text, (size_t)n);
}

/* One span as an "X" event. Times in microseconds, start and end each
 * rounded down, so a span inside another stays inside it in the file. */
static void record(const ckptio_span *s, uint64_t t1, uint64_t bytes, const char *detail) {
  if (!(atomic_load_explicit(&ckptio_trace_sinks, memory_order_relaxed) & CKPTIO_TRACE_FILE)) return;
  char esc[DETAIL_MAX] = "", text[EVENT_MAX];
  if (detail) escape(esc, sizeof(esc), detail);
  uint64_t ts = s->t0 / 1000, end = t1 / 1000;
  pthread_mutex_lock(&mu);
  if (out.fd >= 0) {
    int n = snprintf(text, sizeof(text),
                     "{\"name\":\"%s\",\"cat\":\"ckptio\",\"ph\":\"X\",\"ts\":%llu,\"dur\":%llu,\"pid\":%d,\"tid\":%d,"
                     "\"args\":{\"bytes\":%llu%s%s%s}}",
                     s->name, (unsigned long long)ts, (unsigned long long)(end - ts), (int)out.pid, (int)my_tid(),
                     (unsigned long long)bytes, detail ? ",\"detail\":\"" : "", esc, detail ? "\"" : "");
    name_thread_locked();
    append_locked(text, (size_t)n);
  }
  pthread_mutex_unlock(&mu);
}

ckptio_span ckptio_trace_begin_on(const char *name, int sinks) {
  if (sinks & CKPTIO_TRACE_NVTX) ckptio_nvtx_push(name);
  return (ckptio_span){name, sinks & CKPTIO_TRACE_FILE ? ckptio_now_ns() : 0, sinks};
}

void ckptio_trace_end_on(const ckptio_span *s, uint64_t bytes, const char *detail) {
  if (s->sinks & CKPTIO_TRACE_NVTX) ckptio_nvtx_pop();
  if (s->sinks & CKPTIO_TRACE_FILE) record(s, ckptio_now_ns(), bytes, detail);
}

void ckptio_trace_thread_name(const char *name) {
  snprintf(self.name, sizeof(self.name), "%s", name);
  pthread_setname_np(pthread_self(), self.name);
}

/* A trace is valid JSON once closed: whatever is still open at exit is. */
static void stop_at_exit(void) { (void)ckptio_trace_stop(); }
static void register_stop_at_exit(void) { atexit(stop_at_exit); }

/* path with each "%p" as the process id: one file per process when several
 * inherit CKPTIO_TRACE (ranks, spawned workers), not one file they all
 * truncate. @return 0, or CKPTIO_E_INVALID_ARG when it does not fit. */
static int expand_path(const char *path, char *out, size_t cap) {
  size_t n = 0;
  for (const char *c = path; *c; c++) {
    char pid[24];
    int is_pid = c[0] == '%' && c[1] == 'p';
    int k = is_pid ? snprintf(pid, sizeof(pid), "%ld", (long)getpid()) : 1;
    if (n + (size_t)k >= cap) return CKPTIO_E_INVALID_ARG;
    memcpy(out + n, is_pid ? pid : c, (size_t)k);
    n += (size_t)k;
    c += is_pid;
  }
  out[n] = '\0';
  return 0;
}

int ckptio_trace_start(const char *path) {
  static pthread_once_t at_exit = PTHREAD_ONCE_INIT;
  char file[4096];
  if (!path || !*path || expand_path(path, file, sizeof(file)) < 0) return CKPTIO_E_INVALID_ARG;
  pthread_mutex_lock(&mu);
  int rc = 0;
  if (out.fd >= 0) {
    rc = CKPTIO_E_STATE;
  } else if (!(out.buf = malloc(BUF_BYTES))) {
    rc = -ENOMEM;
  } else if ((out.fd = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) {
    rc = -errno;
    free(out.buf);
    out.buf = NULL;
  } else {
    out.buf[0] = '[';
    out.len = 1;
    out.first = 1;
    out.err = 0;
    out.gen++;
    out.pid = getpid();
    atomic_fetch_or(&ckptio_trace_sinks, CKPTIO_TRACE_FILE);
  }
  pthread_mutex_unlock(&mu);
  if (rc == 0) pthread_once(&at_exit, register_stop_at_exit);
  return rc;
}

int ckptio_trace_stop(void) {
  pthread_mutex_lock(&mu);
  int rc = CKPTIO_E_STATE;
  if (out.fd >= 0) {
    atomic_fetch_and(&ckptio_trace_sinks, ~CKPTIO_TRACE_FILE);
    memcpy(out.buf + out.len, "\n]\n", 3); /* the room append_locked leaves */
    out.len += 3;
    flush_locked();
    rc = close(out.fd) < 0 && !out.err ? -errno : out.err;
    out.fd = -1;
    free(out.buf);
    out.buf = NULL;
  }
  pthread_mutex_unlock(&mu);
  return rc;
}

/* fork copies the buffer and the descriptor: the child drops both (its
 * exit must not write the parent's events again) and traces nothing until
 * it starts a trace of its own. */
static void fork_lock(void) { pthread_mutex_lock(&mu); }
static void fork_unlock(void) { pthread_mutex_unlock(&mu); }
static void fork_child(void) {
  if (out.fd >= 0) close(out.fd);
  free(out.buf);
  out.fd = -1, out.buf = NULL, out.len = 0;
  atomic_fetch_and(&ckptio_trace_sinks, ~CKPTIO_TRACE_FILE);
  self.tid = 0;
  pthread_mutex_unlock(&mu);
}
__attribute__((constructor)) static void trace_atfork(void) { pthread_atfork(fork_lock, fork_unlock, fork_child); }

/* CKPTIO_TRACE is read once: a trace names one file for the process. An
 * unusable path is said on stderr: the variable asked for a diagnostic,
 * and no call returns there to report it. */
static void init_once(void) {
  const char *path = getenv("CKPTIO_TRACE");
  int rc = path && *path ? ckptio_trace_start(path) : 0;
  if (rc < 0)
    fprintf(stderr, "ckptio: CKPTIO_TRACE=%s: ignored: %s\n", path,
            rc == CKPTIO_E_STATE ? "the program started a trace already" : ckptio_strerror(rc));
  if (ckptio_nvtx_start()) atomic_fetch_or(&ckptio_trace_sinks, CKPTIO_TRACE_NVTX);
}

void ckptio_trace_init(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, init_once);
}
