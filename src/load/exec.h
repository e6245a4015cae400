/* The executor: runs a plan's jobs on the worker pool — staging slots
 * taken on the queuing thread so the ring bounds what is in flight, GPU
 * copies ordered after the caller's streams, byte swaps, host-to-device
 * copies, timing, progress — then checks the CRCs of checked requests.
 * Every load, slice, verify and compressed or sharded load goes through it. */
#ifndef CKPTIO_LOAD_EXEC_H
#define CKPTIO_LOAD_EXEC_H

#include "load/source.h"


/* What a load reports into (the reader's). */
struct ckptio_exec_out {
  char *err;                      /* CKPTIO_ERRLEN */
  _Atomic uint64_t *done_bytes, *total_bytes;
  ckptio_timers *timers;
  void *const *user_stream;       /* [CKPTIO_GPU_MAX]: the caller's streams */
  int keep_stats;                 /* add to the stats instead of restarting them */
};

/* Plans the requests (each with its source), runs them, checks CRCs.
 * @return 0 or a code with the message in out->err. */
int ckptio_exec(ckptio_ctx *ctx, const ckptio_options *opts, ckptio_xreq *qs, size_t n,
                const ckptio_exec_out *out);

#endif
