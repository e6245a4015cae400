/* What the kill tests' drivers (kill_driver.c, manager_driver.c) share: the
 * small context each saves through, so that a save spans many chunks and a
 * kill lands inside one. Linked like a user's program: public API only. */
#ifndef CKPTIO_TESTS_CRASH_DRIVER_H
#define CKPTIO_TESTS_CRASH_DRIVER_H

#include <stdio.h>
#include <stdlib.h>

#include "ckptio.h"

/* Two workers, 256 KiB chunks, 1 MiB of staging, no GPU; exits 2 saying
 * why when it cannot be made. */
static inline ckptio_ctx *driver_ctx(void) {
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  o.threads = 2;
  o.chunk_bytes = 256 << 10;
  o.staging_bytes = 1 << 20;
  o.cuda = 0;
  ckptio_ctx *ctx = NULL;
  int rc = ckptio_ctx_create(&o, &ctx);
  if (rc < 0) {
    fprintf(stderr, "ctx: %s: %s\n", ckptio_strerror(rc), ckptio_last_open_error());
    exit(2);
  }
  return ctx;
}

#endif
