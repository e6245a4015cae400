/* Fault injection state: one countdown per operation, atomics only, so the
 * hot path pays one relaxed load when nothing is armed. */
#include "io/fault.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static _Atomic long countdown[CKPTIO_FAULT_OPS];
static _Atomic int fault_err[CKPTIO_FAULT_OPS];
static _Atomic uint64_t write_rate;    /* bytes per second, 0: off */
static _Atomic uint64_t read_rate;     /* likewise, for reads */
static _Atomic int reads_shared;       /* reads share the device (below) */

void ckptio_fault_arm(ckptio_fault_op op, long nth, int err) {
  atomic_store(&fault_err[op], err);
  atomic_store(&countdown[op], nth);
}

void ckptio_fault_clear(void) {
  for (int i = 0; i < CKPTIO_FAULT_OPS; i++) atomic_store(&countdown[i], 0);
}

/* Only a test build (CMake option CKPTIO_FAULT_INJECTION) reads the
 * environment: in the shipped library an inherited variable must never fail
 * or slow a save. The calls above stay, for the unit tests that link the
 * static library; nothing outside it can reach them. */
#ifndef CKPTIO_FAULT_INJECTION
#define ARM_FROM_ENV() ((void)0)
#else
static pthread_once_t env_once = PTHREAD_ONCE_INIT;
#define ARM_FROM_ENV() pthread_once(&env_once, env_arm)

static void env_arm(void) {
  static const char *const ops[] = {"pwrite", "pread", "fsync", "rename", "fallocate"};
  static const struct { const char *name; int err; } errs[] = {
      {"ENOSPC", ENOSPC}, {"EIO", EIO}, {"EROFS", EROFS}, {"short", CKPTIO_FAULT_SHORT}};
  const char *mbps = getenv("CKPTIO_FAULT_WRITE_MBPS");
  if (mbps && atoll(mbps) > 0) ckptio_fault_slow_writes((uint64_t)atoll(mbps) * 1000000u);
  mbps = getenv("CKPTIO_FAULT_READ_MBPS");
  if (mbps && atoll(mbps) > 0) ckptio_fault_slow_reads((uint64_t)atoll(mbps) * 1000000u);
  const char *spec = getenv("CKPTIO_FAULT");
  if (!spec) return;
  char op[16], er[16];
  long nth;
  char fmt[] = "%15[a-z]:%ld:%15s";
  if (sscanf(spec, fmt, op, &nth, er) != 3) return;
  for (int i = 0; i < CKPTIO_FAULT_OPS; i++)
    for (size_t j = 0; j < sizeof(errs) / sizeof(errs[0]); j++)
      if (!strcmp(op, ops[i]) && !strcmp(er, errs[j].name)) ckptio_fault_arm(i, nth, errs[j].err);
}
#endif

static uint64_t disk_free_ns;          /* when the modeled disk is idle again */
static pthread_mutex_t disk_mu = PTHREAD_MUTEX_INITIALIZER;

/* A fork while a worker holds the modelled disk's lock would leave it held
 * for ever in the child: fork waits for it instead. */
static void disk_lock(void) { pthread_mutex_lock(&disk_mu); }
static void disk_unlock(void) { pthread_mutex_unlock(&disk_mu); }
__attribute__((constructor)) static void disk_atfork(void) { pthread_atfork(disk_lock, disk_unlock, disk_unlock); }

void ckptio_fault_slow_writes(uint64_t bytes_per_second) { atomic_store(&write_rate, bytes_per_second); }
void ckptio_fault_slow_reads(uint64_t bytes_per_second) {
  if (!bytes_per_second) atomic_store(&reads_shared, 0);
  atomic_store(&read_rate, bytes_per_second);
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* One modeled device for reads and writes: each transfer waits for the
 * previous one to end, then for its own bytes' time. */
static void disk_time(_Atomic uint64_t *rate_of, uint64_t len) {
  ARM_FROM_ENV();
  uint64_t rate = atomic_load_explicit(rate_of, memory_order_relaxed);
  if (!rate) return;
  pthread_mutex_lock(&disk_mu);
  uint64_t start = now_ns() > disk_free_ns ? now_ns() : disk_free_ns;
  disk_free_ns = start + (uint64_t)((double)len * 1e9 / (double)rate);
  uint64_t until = disk_free_ns;
  pthread_mutex_unlock(&disk_mu);
  for (uint64_t t = now_ns(); t < until; t = now_ns()) {
    struct timespec ts = {(time_t)((until - t) / 1000000000u), (long)((until - t) % 1000000000u)};
    nanosleep(&ts, NULL);
  }
}

/* The shared device: the reads in flight share its rate equally (processor
 * sharing). `served` counts the bytes each read in flight has received so
 * far; a read of len bytes that starts at served = s ends when it reaches
 * s + len, sooner as others end, later as others start. */
static struct {
  double served;
  uint64_t at_ns;
  int n;
} ps;
static pthread_cond_t ps_cv = PTHREAD_COND_INITIALIZER;

static void ps_advance(uint64_t rate) {
  uint64_t t = now_ns();
  if (ps.n) ps.served += (double)(t - ps.at_ns) * 1e-9 * (double)rate / ps.n;
  ps.at_ns = t;
}

static void shared_time(uint64_t rate, uint64_t len) {
  pthread_mutex_lock(&disk_mu);
  ps_advance(rate);
  double end = ps.served + (double)len;
  ps.n++;
  while (ps.served < end) {
    /* Until the end at today's sharing; an arrival or departure wakes us to
     * reckon again. The condition variable's clock is the realtime one. */
    double wait = (end - ps.served) * ps.n / (double)rate;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)(wait * 1e9) + 1000;
    ts.tv_sec += (time_t)(ns / 1000000000u), ts.tv_nsec = (long)(ns % 1000000000u);
    pthread_cond_timedwait(&ps_cv, &disk_mu, &ts);
    ps_advance(rate);
  }
  ps.n--;
  pthread_cond_broadcast(&ps_cv);
  pthread_mutex_unlock(&disk_mu);
}

void ckptio_fault_slow_reads_shared(uint64_t bytes_per_second) {
  atomic_store(&reads_shared, bytes_per_second != 0);
  ckptio_fault_slow_reads(bytes_per_second);
}

void ckptio_fault_write_time(uint64_t len) { disk_time(&write_rate, len); }
void ckptio_fault_read_time(uint64_t len) {
  uint64_t rate = atomic_load_explicit(&read_rate, memory_order_relaxed);
  if (rate && atomic_load_explicit(&reads_shared, memory_order_relaxed)) shared_time(rate, len);
  else disk_time(&read_rate, len);
}

int ckptio_fault_check(ckptio_fault_op op) {
  ARM_FROM_ENV();
  if (atomic_load_explicit(&countdown[op], memory_order_relaxed) <= 0) return 0;
  if (atomic_fetch_sub(&countdown[op], 1) != 1) return 0;
  return atomic_load(&fault_err[op]);
}
