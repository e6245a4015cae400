/* Fault injection state: one countdown per operation, atomics only, so the
 * hot path pays one relaxed load when nothing is armed. */
#include "io/fault.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

static _Atomic long countdown[CKPTIO_FAULT_OPS];
static _Atomic int fault_err[CKPTIO_FAULT_OPS];
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

void ckptio_fault_arm(ckptio_fault_op op, long nth, int err) {
  atomic_store(&fault_err[op], err);
  atomic_store(&countdown[op], nth);
}

void ckptio_fault_clear(void) {
  for (int i = 0; i < CKPTIO_FAULT_OPS; i++) atomic_store(&countdown[i], 0);
}

static void env_arm(void) {
  static const char *const ops[] = {"pwrite", "pread", "fsync", "rename"};
  static const struct { const char *name; int err; } errs[] = {
      {"ENOSPC", ENOSPC}, {"EIO", EIO}, {"EROFS", EROFS}, {"short", CKPTIO_FAULT_SHORT}};
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

int ckptio_fault_check(ckptio_fault_op op) {
  pthread_once(&env_once, env_arm);
  if (atomic_load_explicit(&countdown[op], memory_order_relaxed) <= 0) return 0;
  if (atomic_fetch_sub(&countdown[op], 1) != 1) return 0;
  return atomic_load(&fault_err[op]);
}
