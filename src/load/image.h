/* An object's image: what a header parse written for a mapped file (a zip's
 * end records, central directory and local headers; a zstd seek table and
 * header frames) reads from an object of a storage, which has no mapping.
 * The image is an anonymous mapping of the object's size, zero wherever
 * nothing was fetched (MAP_NORESERVE: untouched pages cost no memory), so
 * the format code runs unchanged over it and a byte it reads that was not
 * fetched is a zero its checks refuse, never a fault. Bytes are fetched by
 * ranged reads through the storage's read verb, nearby ranges merged into
 * one request, ranges already fetched skipped. Freed once the parse is over:
 * the tensors are read by the source's jobs as for any object. */
#ifndef CKPTIO_LOAD_IMAGE_H
#define CKPTIO_LOAD_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "io/rfile.h"
#include "pool/pool.h"

typedef struct ckptio_image {
  const ckptio_rfile *f;    /* the object (borrowed) */
  ckptio_pool *pool;        /* runs a fetch's reads in parallel (borrowed) */
  unsigned char *base;      /* f->size bytes; NULL when the object is empty */
  uint64_t size;
  uint64_t (*have)[2];      /* fetched [start, end) spans, in fetch order */
  size_t nhave, cap;
  unsigned reads;           /* requests sent (tests and messages) */
} ckptio_image;

/* A byte range a parse needs. */
typedef struct ckptio_span {
  uint64_t off, len;
} ckptio_span;

/* Maps the image of f and fetches its first `head` and last `tail` bytes
 * (one read when they meet); later fetches run their reads on `pool` (from
 * a thread that is none of its workers). @return 0, or a code with
 * "<path>: ..." in err (CKPTIO_ERRLEN). */
int ckptio_image_open(ckptio_image *im, const ckptio_rfile *f, ckptio_pool *pool, uint64_t head, uint64_t tail,
                      char *err);
/* Fetches the spans (clamped to the object) not yet fetched: sorted, those
 * less than `gap` bytes apart merged into one read of at most `cap` bytes
 * (a span longer than cap is one read of its own), the reads in parallel.
 * @return 0 or a code, err set. */
int ckptio_image_fetch(ckptio_image *im, ckptio_span *spans, size_t n, uint64_t gap, uint64_t cap, char *err);
/* Whether [off, off + len) was fetched by one read. */
int ckptio_image_has(const ckptio_image *im, uint64_t off, uint64_t len);
void ckptio_image_close(ckptio_image *im);

#endif
