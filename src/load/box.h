/* Boxes of tensors (box.c): the requests that load an N-dimensional box
 * from the stored parts overlapping it; used by box loads, and by whole
 * loads and slices of tensors stored in parts. */
#ifndef CKPTIO_LOAD_BOX_H
#define CKPTIO_LOAD_BOX_H

#include "load/reader.h"

/* A growing array of executor requests. */
typedef struct ckptio_xreqs {
  ckptio_xreq *q;
  size_t n, cap;
} ckptio_xreqs;

/* Appends a copy of *q. @return 0 or -ENOMEM. */
int ckptio_xreqs_push(ckptio_xreqs *v, const ckptio_xreq *q);

/* The stored parts of tensor `index`: the source's list, or `one` (filled
 * here) for a tensor stored whole. @return their count (>= 1). */
size_t ckptio_reader_parts_of(const ckptio_reader *r, size_t index, const ckptio_spart **out, ckptio_spart *one);

/* Checks the box [start, stop) of tensor `index`; *nbytes its bytes.
 * @return 0 or a code, the reader's message set. */
int ckptio_box_check(ckptio_reader *r, size_t index, const int64_t *start, const int64_t *stop, uint64_t *nbytes);

/* Appends the requests that load the (checked, non-empty) box into dst
 * (NULL: read and check only) on GPU `gpu` (or -1). With check, every part
 * the box holds whole has its CRC compared; *verified (may be NULL) says
 * whether that covers every byte of the box. */
int ckptio_box_reqs(ckptio_reader *r, size_t index, const int64_t *start, const int64_t *stop, unsigned char *dst,
                    int gpu, int check, ckptio_xreqs *v, int *verified);

/* Appends a read-and-check request (no destination) for each stored part
 * with a CRC that the box [start, stop) touches but does not hold whole,
 * so that its CRC is checked too; *verified says whether every part it
 * touches has a CRC. @return 0 or -ENOMEM. */
int ckptio_box_check_reqs(ckptio_reader *r, size_t index, const int64_t *start, const int64_t *stop,
                          ckptio_xreqs *v, int *verified);

#endif
