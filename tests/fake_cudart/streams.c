/* Streams and events. Every stream, and each device's default stream, has a
 * worker thread that runs its queue in order; copies take fc_delay_us plus their modeled time,
 * so a host that reads before synchronising sees stale data. Destroyed
 * streams and events are never freed (a stale handle or a queued op keeps
 * pointing at valid memory, and their addresses are never reused, so a stale
 * handle is always cudaErrorInvalidResourceHandle). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

enum op_kind { OP_COPY, OP_SET, OP_RECORD, OP_WAIT };

struct fc_op {
  struct fc_op *next;
  enum op_kind kind;
  char *dst;            /* alias addresses the worker can touch */
  const char *src;
  int value;
  size_t n;
  uintptr_t udst, usrc; /* the caller's addresses, for fc_wait_range_idle */
  cudaError_t exec_err;
  struct fc_event *ev;
  uint64_t gen;
};

struct fc_stream {
  int device;
  unsigned flags;
  int is_default;
  int dying;            /* destroyed: drain, then the worker exits */
  pthread_cond_t cv;    /* work queued or dying */
  struct fc_op *head, *tail;  /* head is running or next */
  uint64_t submitted, completed;
  cudaError_t sticky;
  uint64_t model_ns;    /* when the modeled copy engine finishes its last op */
  struct fc_stream *next_live, *next_all;
};

struct fc_event {
  int device;
  unsigned flags;
  uint64_t recorded;    /* generation of the latest cudaEventRecord */
  uint64_t done;        /* highest generation completed */
  cudaError_t err;      /* the recording stream's sticky error when it completed */
  struct timespec when;
  struct fc_event *next;
};

static struct fc_stream *live_streams;  /* created, not destroyed */
static struct fc_stream *all_streams;   /* worker running (incl. default streams) */
static struct fc_stream *dead_streams;  /* worker exited; kept, see above */
static struct fc_event *live_events, *dead_events;

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void sleep_until_ns(uint64_t when) {
  struct timespec ts = {(time_t)(when / 1000000000u), (long)(when % 1000000000u)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL)) {
  }
}

static void unlink_all(struct fc_stream *s) {
  for (struct fc_stream **pp = &all_streams; *pp; pp = &(*pp)->next_all)
    if (*pp == s) {
      *pp = s->next_all;
      break;
    }
}

/* Under fc_lock; may drop it to sleep and copy. */
static void run_op(struct fc_stream *s, struct fc_op *op) {
  struct fc_event *ev = op->ev;
  switch (op->kind) {
  case OP_WAIT:
    while (ev->done < op->gen) pthread_cond_wait(&fc_progress, &fc_lock);
    if (ev->err && !s->sticky) s->sticky = ev->err;
    return;
  case OP_RECORD:
    if (op->gen > ev->done) {
      ev->done = op->gen;
      ev->err = s->sticky;
      clock_gettime(CLOCK_MONOTONIC, &ev->when);
    }
    return;
  case OP_COPY:
  case OP_SET:
    while (fc_held) pthread_cond_wait(&fc_progress, &fc_lock);
    if (s->sticky) return;  /* a failed stream runs nothing more */
    pthread_mutex_unlock(&fc_lock);
    /* The op ends at a modeled time: its delay plus n / bandwidth after the
     * stream's previous op ended (or now, when the stream was idle). Deadlines
     * are absolute, so a late wake-up of one op does not delay the next. */
    long mbps = __atomic_load_n(&fc_mbps, __ATOMIC_RELAXED);
    uint64_t start = now_ns() > s->model_ns ? now_ns() : s->model_ns;
    uint64_t end = start + (uint64_t)__atomic_load_n(&fc_delay_us, __ATOMIC_RELAXED) * 1000u +
                   (mbps > 0 ? (uint64_t)(op->n * 1000u / (size_t)mbps) : 0);
    s->model_ns = end;
    if (!op->exec_err) {
      if (op->kind == OP_COPY) memmove(op->dst, op->src, op->n);
      else memset(op->dst, op->value, op->n);
    }
    sleep_until_ns(end);
    pthread_mutex_lock(&fc_lock);
    if (op->exec_err) {
      s->sticky = op->exec_err;
      if (!fc_devs[s->device].sticky) fc_devs[s->device].sticky = op->exec_err;
      fc_st.exec_failures++;
    }
    return;
  }
}

static void *worker(void *arg) {
  struct fc_stream *s = arg;
  pthread_mutex_lock(&fc_lock);
  for (;;) {
    while (!s->head && !s->dying) pthread_cond_wait(&s->cv, &fc_lock);
    if (!s->head) break;
    struct fc_op *op = s->head;
    run_op(s, op);
    s->head = op->next;
    if (!s->head) s->tail = NULL;
    s->completed++;
    free(op);
    pthread_cond_broadcast(&fc_progress);
  }
  unlink_all(s);
  s->next_all = dead_streams;
  dead_streams = s;
  pthread_mutex_unlock(&fc_lock);
  return NULL;
}

/* Under fc_lock. */
static cudaError_t stream_new(int device, unsigned flags, int is_default, struct fc_stream **out) {
  struct fc_stream *s = calloc(1, sizeof *s);
  if (!s) return cudaErrorMemoryAllocation;
  s->device = device;
  s->flags = flags;
  s->is_default = is_default;
  pthread_cond_init(&s->cv, NULL);
  /* Workers take no signals: those belong to the process under test. */
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t t;
  int rc = pthread_create(&t, &attr, worker, s);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  pthread_attr_destroy(&attr);
  if (rc) {
    pthread_cond_destroy(&s->cv);
    free(s);
    return cudaErrorMemoryAllocation;
  }
  s->next_all = all_streams;
  all_streams = s;
  *out = s;
  return cudaSuccess;
}

cudaError_t fc_stream_get(cudaStream_t h, struct fc_stream **out) {
  if (!h || h == cudaStreamLegacy || h == cudaStreamPerThread) {
    struct fc_dev *v = &fc_devs[fc_current_device()];
    if (!v->null_stream) {
      cudaError_t e = stream_new(fc_current_device(), 0, 1, &v->null_stream);
      if (e) return e;
    }
    *out = v->null_stream;
    return cudaSuccess;
  }
  for (struct fc_stream *s = live_streams; s; s = s->next_live)
    if ((cudaStream_t)s == h) {
      *out = s;
      return cudaSuccess;
    }
  return cudaErrorInvalidResourceHandle;
}

int fc_stream_device(const struct fc_stream *s) { return s->device; }
cudaError_t fc_stream_sticky(const struct fc_stream *s) { return s->sticky; }

static cudaError_t push(struct fc_stream *s, struct fc_op *op, uint64_t *ticket) {
  if (!op) return cudaErrorMemoryAllocation;
  op->next = NULL;
  if (s->tail) s->tail->next = op;
  else s->head = op;
  s->tail = op;
  s->submitted++;
  if (ticket) *ticket = s->submitted;
  pthread_cond_signal(&s->cv);
  return cudaSuccess;
}

cudaError_t fc_stream_push_copy(struct fc_stream *s, char *dst, const char *src, int value,
                                size_t n, uintptr_t udst, uintptr_t usrc, cudaError_t exec_err,
                                uint64_t *ticket) {
  if (s->sticky) return s->sticky;
  struct fc_op *op = calloc(1, sizeof *op);
  if (op) {
    op->kind = src ? OP_COPY : OP_SET;
    op->dst = dst;
    op->src = src;
    op->value = value;
    op->n = n;
    op->udst = udst;
    op->usrc = usrc;
    op->exec_err = exec_err;
  }
  return push(s, op, ticket);
}

void fc_stream_wait(struct fc_stream *s, uint64_t ticket) {
  while (s->completed < ticket) pthread_cond_wait(&fc_progress, &fc_lock);
}

static int overlaps(uintptr_t a, size_t an, uintptr_t b, size_t bn) {
  return a < b + bn && b < a + an;
}

int fc_wait_range_idle(uintptr_t a, size_t n) {
  int waited = 0;
  for (;;) {
    int busy = 0;
    for (struct fc_stream *s = all_streams; s && !busy; s = s->next_all)
      for (struct fc_op *op = s->head; op && !busy; op = op->next)
        busy = (op->kind == OP_COPY || op->kind == OP_SET) &&
               (overlaps(op->udst, op->n, a, n) ||
                (op->kind == OP_COPY && overlaps(op->usrc, op->n, a, n)));
    if (!busy) return waited;
    waited = 1;
    pthread_cond_wait(&fc_progress, &fc_lock);
  }
}

void fc_streams_clear_sticky(void) {
  for (struct fc_stream *s = all_streams; s; s = s->next_all) s->sticky = cudaSuccess;
  for (struct fc_event *e = live_events; e; e = e->next) e->err = cudaSuccess;
  for (int d = 0; d < fc_cfg.ndev; d++) fc_devs[d].sticky = cudaSuccess;
}

void fc_streams_leaks(int *count) {
  for (struct fc_stream *s = live_streams; s; s = s->next_live, (*count)++)
    fprintf(stderr, "fake_cudart: leaked stream %p on device %d\n", (void *)s, s->device);
  for (struct fc_event *e = live_events; e; e = e->next, (*count)++)
    fprintf(stderr, "fake_cudart: leaked event %p on device %d\n", (void *)e, e->device);
}

/* ------------------------------------------------------------ streams */

cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
  cudaError_t e = fc_enter(FC_cudaStreamCreateWithFlags, NULL);
  if (e || (e = fc_need_device())) return fc_ret(e);
  if (!pStream || (flags & ~(unsigned)cudaStreamNonBlocking)) return fc_ret(cudaErrorInvalidValue);
  struct fc_stream *s;
  pthread_mutex_lock(&fc_lock);
  e = stream_new(fc_current_device(), flags, 0, &s);
  if (!e) {
    s->next_live = live_streams;
    live_streams = s;
    fc_st.streams++;
    *pStream = (cudaStream_t)s;
  }
  pthread_mutex_unlock(&fc_lock);
  return fc_ret(e);
}

cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream) {
  cudaError_t e = fc_enter(FC_cudaStreamDestroy, NULL);
  if (e || (e = fc_need_device())) return fc_ret(e);
  e = cudaErrorInvalidResourceHandle;
  pthread_mutex_lock(&fc_lock);
  for (struct fc_stream **pp = &live_streams; *pp; pp = &(*pp)->next_live) {
    struct fc_stream *s = *pp;
    if ((cudaStream_t)s != stream) continue;
    *pp = s->next_live;
    /* As in CUDA, queued work still runs; the worker exits once drained. */
    s->dying = 1;
    pthread_cond_signal(&s->cv);
    fc_st.streams--;
    e = cudaSuccess;
    break;
  }
  pthread_mutex_unlock(&fc_lock);
  return fc_ret(e);
}

cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t stream) {
  struct fc_stream *s;
  cudaError_t injected = fc_enter(FC_cudaStreamSynchronize, NULL), e = fc_need_device();
  if (e) return fc_ret(e);
  pthread_mutex_lock(&fc_lock);
  e = fc_stream_get(stream, &s);
  if (!e) {
    /* An injected error still waits: it stands for a failure found at the sync. */
    fc_stream_wait(s, s->submitted);
    e = injected ? injected : s->sticky;
  }
  pthread_mutex_unlock(&fc_lock);
  return fc_ret(e);
}

cudaError_t CUDARTAPI cudaDeviceSynchronize(void) {
  cudaError_t injected = fc_enter(FC_cudaDeviceSynchronize, NULL), e = fc_need_device();
  if (e) return fc_ret(e);
  int d = fc_current_device();
  pthread_mutex_lock(&fc_lock);
  /* The list can change while we wait, so restart until a pass finds all idle. */
  for (int again = 1; again;) {
    again = 0;
    for (struct fc_stream *s = all_streams; s; s = s->next_all)
      if (s->device == d && s->completed < s->submitted) {
        fc_stream_wait(s, s->submitted);
        again = 1;
        break;
      }
  }
  e = injected ? injected : fc_devs[d].sticky;
  pthread_mutex_unlock(&fc_lock);
  return fc_ret(e);
}

/* ------------------------------------------------------------ events */

static struct fc_event *event_get(cudaEvent_t h) {
  for (struct fc_event *e = live_events; e; e = e->next)
    if ((cudaEvent_t)e == h) return e;
  return NULL;
}

cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  cudaError_t e = fc_enter(FC_cudaEventCreateWithFlags, NULL);
  if (e || (e = fc_need_device())) return fc_ret(e);
  unsigned known = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
  if (!event || (flags & ~known) ||
      ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming)))
    return fc_ret(cudaErrorInvalidValue);
  struct fc_event *ev = calloc(1, sizeof *ev);
  if (!ev) return fc_ret(cudaErrorMemoryAllocation);
  ev->device = fc_current_device();
  ev->flags = flags;
  pthread_mutex_lock(&fc_lock);
  ev->next = live_events;
  live_events = ev;
  fc_st.events++;
  pthread_mutex_unlock(&fc_lock);
  *event = (cudaEvent_t)ev;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t event) {
  cudaError_t e = fc_enter(FC_cudaEventDestroy, NULL);
  if (e || (e = fc_need_device())) return fc_ret(e);
  e = cudaErrorInvalidResourceHandle;
  pthread_mutex_lock(&fc_lock);
  for (struct fc_event **pp = &live_events; *pp; pp = &(*pp)->next) {
    struct fc_event *ev = *pp;
    if ((cudaEvent_t)ev != event) continue;
    *pp = ev->next;
    ev->next = dead_events;
    dead_events = ev;
    fc_st.events--;
    e = cudaSuccess;
    break;
  }
  pthread_mutex_unlock(&fc_lock);
  return fc_ret(e);
}

cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  cudaError_t e = fc_enter(FC_cudaEventRecord, NULL);
  if (e || (e = fc_need_device())) return fc_ret(e);
  struct fc_stream *s;
  pthread_mutex_lock(&fc_lock);
  struct fc_event *ev = event_get(event);
  if (!ev) e = cudaErrorInvalidResourceHandle;
  else if (!(e = fc_stream_get(stream, &s))) {
    if (s->device != ev->device) e = cudaErrorInvalidResourceHandle;  /* as CUDA: same device */
    else if (s->sticky) e = s->sticky;
    else {
      struct fc_op *op = calloc(1, sizeof *op);
      if (op) {
        op->kind = OP_RECORD;
        op->ev = ev;
        op->gen = ev->recorded + 1;
      }
      if (!(e = push(s, op, NULL))) ev->recorded++;
    }
  }
  pthread_mutex_unlock(&fc_lock);
  return fc_ret(e);
}

cudaError_t CUDARTAPI cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                          unsigned int flags) {
  cudaError_t e = fc_enter(FC_cudaStreamWaitEvent, NULL);
  if (e || (e = fc_need_device())) return fc_ret(e);
  if (flags & ~(unsigned)cudaEventWaitExternal) return fc_ret(cudaErrorInvalidValue);
  struct fc_stream *s;
  pthread_mutex_lock(&fc_lock);
  struct fc_event *ev = event_get(event);
  if (!ev) e = cudaErrorInvalidResourceHandle;
  else if (!(e = fc_stream_get(stream, &s)) && ev->recorded) {
    /* Waits for the record made before this call; a never-recorded event
     * is complete, as in CUDA. */
    struct fc_op *op = calloc(1, sizeof *op);
    if (op) {
      op->kind = OP_WAIT;
      op->ev = ev;
      op->gen = ev->recorded;
    }
    e = push(s, op, NULL);
  }
  pthread_mutex_unlock(&fc_lock);
  return fc_ret(e);
}

cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t event) {
  cudaError_t injected = fc_enter(FC_cudaEventSynchronize, NULL), e = fc_need_device();
  if (e) return fc_ret(e);
  pthread_mutex_lock(&fc_lock);
  struct fc_event *ev = event_get(event);
  if (!ev) {
    e = cudaErrorInvalidResourceHandle;
  } else {
    uint64_t gen = ev->recorded;
    while (ev->done < gen) pthread_cond_wait(&fc_progress, &fc_lock);
    e = injected ? injected : ev->err;
  }
  pthread_mutex_unlock(&fc_lock);
  return fc_ret(e);
}

cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t event) {
  cudaError_t e = fc_enter(FC_cudaEventQuery, NULL);
  if (e || (e = fc_need_device())) return fc_ret(e);
  pthread_mutex_lock(&fc_lock);
  struct fc_event *ev = event_get(event);
  if (!ev) e = cudaErrorInvalidResourceHandle;
  else if (ev->done < ev->recorded) e = cudaErrorNotReady;
  else e = ev->err;
  pthread_mutex_unlock(&fc_lock);
  return fc_ret(e);
}

cudaError_t CUDARTAPI cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  cudaError_t e = fc_enter(FC_cudaEventElapsedTime, NULL);
  if (e || (e = fc_need_device())) return fc_ret(e);
  if (!ms) return fc_ret(cudaErrorInvalidValue);
  pthread_mutex_lock(&fc_lock);
  struct fc_event *a = event_get(start), *b = event_get(end);
  if (!a || !b || !a->recorded || !b->recorded ||
      ((a->flags | b->flags) & cudaEventDisableTiming))
    e = cudaErrorInvalidResourceHandle;
  else if (a->done < a->recorded || b->done < b->recorded)
    e = cudaErrorNotReady;
  else
    *ms = (float)((double)(b->when.tv_sec - a->when.tv_sec) * 1e3 +
                  (double)(b->when.tv_nsec - a->when.tv_nsec) / 1e6);
  pthread_mutex_unlock(&fc_lock);
  return fc_ret(e);
}
