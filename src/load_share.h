/* What load.c lends to slice.c: its gather, byte swap, mapping and GPU
 * ordering helpers, so a partial load moves bytes exactly as a whole one. */
#ifndef CKPTIO_LOAD_SHARE_H
#define CKPTIO_LOAD_SHARE_H

#include "reader_internal.h"

/* Calls run(arg, storage byte offset, bytes) for each stretch of logical
 * elements [first, first + count) of a strided view that is contiguous in
 * its storage, in row-major order (the walk gather and plans share). */
void ckptio_view_runs(const ckptio_entry *e, uint64_t first, uint64_t count,
                      void (*run)(void *arg, uint64_t off, uint64_t len), void *arg);
/* Logical elements [first, first + count) of a strided view, row-major,
 * from its storage at base into dst. */
void ckptio_load_gather(unsigned char *dst, const unsigned char *base, const ckptio_entry *e,
                        uint64_t first, uint64_t count);
/* Swaps a big-endian entry's elements in place (nothing for little-endian
 * entries or one-byte elements; a complex number's two floats apart). */
void ckptio_load_byteswap(const ckptio_entry *e, unsigned char *p, uint64_t len);
/* Maps the pages of [p, p + len) in one call (@return 0, or
 * CKPTIO_E_SHORT_IO when the file no longer holds them) / drops them once
 * copied. */
int ckptio_load_populate(const unsigned char *p, uint64_t len);
void ckptio_load_unmap(const unsigned char *p, uint64_t len);
/* Each GPU in the mask waits on the caller's stream; events[ord] are
 * created for the caller to destroy. @return 0 or a failure (message set). */
int ckptio_load_order_after_caller(ckptio_reader *r, uint64_t gpus, void **events);
/* Copies n pinned bytes at src (staging slot `slot`, or the registered file
 * map) to dst on GPU `gpu` on its H2D stream and waits on the slot's own
 * event, so the slot can be reused and no other piece's copy is waited for. On failure the message reads "<path>: <what>tensor '<name>' to
 * GPU n: <CUDA error>". @return 0 or the CUDA failure's code. */
int ckptio_load_h2d(ckptio_reader *r, int gpu, const void *slot, void *dst, const void *src, uint64_t n,
                    const char *what, const char *name, char *msg, size_t len);
/* `dst` must be memory of `device` (when need > 0); `what` names it in the
 * message. @return 0, or CKPTIO_E_DEVICE / a CUDA failure (message set). */
int ckptio_load_check_device(ckptio_reader *r, const ckptio_entry *e, const void *dst, int device, uint64_t need,
                             const char *what);
/* 1 when the page cache holds most of the requested tensors' bytes. */
int ckptio_load_mostly_cached(ckptio_reader *r, const ckptio_load_request *reqs, size_t n);

#endif
