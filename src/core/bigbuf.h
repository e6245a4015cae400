/* Large scratch buffers that are written once and dropped: an anonymous
 * mapping aligned to 2 MiB with transparent huge pages asked for, so the
 * first touch costs one fault per 2 MiB instead of one per 4 KiB (where
 * THP is off, the advice is ignored). */
#ifndef CKPTIO_CORE_BIGBUF_H
#define CKPTIO_CORE_BIGBUF_H

#include <stddef.h>

/* A buffer of at least `bytes` (0: NULL), or NULL when out of memory. */
void *ckptio_bigbuf_alloc(size_t bytes);
/* Frees a buffer of ckptio_bigbuf_alloc(bytes); NULL is ignored. */
void ckptio_bigbuf_free(void *p, size_t bytes);

#endif
