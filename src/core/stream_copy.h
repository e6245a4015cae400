/* Bulk copies into memory that is not read again soon (a save's staging
 * slot, a load's destination tensor): streaming stores write whole cache
 * lines to memory without first reading the destination's lines into the
 * cache, so a large copy moves 2 bytes of memory traffic per byte instead
 * of 3. On this project's 2-core AMD EPYC VM a 1 GiB copy runs 1.5x
 * glibc's memcpy alone and 1.25x with both cores copying. */
#ifndef CKPTIO_CORE_STREAM_COPY_H
#define CKPTIO_CORE_STREAM_COPY_H

#include <stddef.h>

/* Copies below this size go through memcpy: their destinations are likely
 * read soon, from the cache memcpy leaves them in. */
#define CKPTIO_STREAM_COPY_MIN (64u << 10)

/* memcpy(dst, src, n), with streaming stores on x86-64 for n of at least
 * CKPTIO_STREAM_COPY_MIN. Its stores are visible to other threads in order
 * once it returns (it ends with a store fence). */
void ckptio_stream_copy(void *dst, const void *src, size_t n);

#endif
