/* The compressed side of a reader: a zstd seekable file is opened by
 * decompressing only its header frame(s) and reading the seek table; loads
 * decompress only the frames that hold the requested tensors, in parallel
 * on the pool, straight into host destinations when a frame lies inside one
 * tensor, else through a staging slot (pinned, so GPU copies go from it). */
#ifndef CKPTIO_COMPRESS_ZLOAD_H
#define CKPTIO_COMPRESS_ZLOAD_H

#include <stdint.h>

#include "reader_internal.h"

/* Reads the seek table and decompresses the safetensors header: on success
 * r->z is set and *header (malloc'd, the caller frees) holds the header_len
 * JSON bytes after the 8-byte length; *plain_size is the decompressed file's
 * size. @return 0 or a negative code with r->err set. */
int ckptio_zread_open(ckptio_reader *r, uint8_t **header, uint64_t *header_len, uint64_t *plain_size);
/* Once the index is built: takes the filter from the metadata (an unknown
 * filter is CKPTIO_E_FORMAT). */
int ckptio_zread_adopt(ckptio_reader *r);
void ckptio_zread_free(struct ckptio_zsrc *z);
/* ckptio_reader_run for a compressed file (requests validated). */
int ckptio_zread_run(ckptio_reader *r, const ckptio_load_request *reqs, size_t n, int check);
/* Partial loads (slices): plain bytes [from[i], to[i]) of tensor
 * reqs[i].index into reqs[i].dst (which receives byte from[i]), each range
 * inside its tensor; only the frames holding them are decompressed, each
 * once however many ranges it holds. No CRC check (a range cannot be
 * verified). Ordering after the caller's streams is the caller's. */
int ckptio_zread_ranges(ckptio_reader *r, const ckptio_load_request *reqs, const uint64_t *from, const uint64_t *to,
                        size_t n);
/* The plain bytes of the frames holding ranges [from[i], to[i]), given in
 * ascending order: what a partial load decompresses. */
uint64_t ckptio_zread_frame_bytes(const ckptio_reader *r, const uint64_t *from, const uint64_t *to, size_t n);
/* Calls emit(arg, file offset, bytes) for each frame holding plain bytes
 * [a, b) that is not *last (the frame emitted before: ranges come in
 * ascending order), updating *last; start with *last = (size_t)-1. */
void ckptio_zread_frames_of(const ckptio_reader *r, uint64_t a, uint64_t b, size_t *last,
                            void (*emit)(void *arg, uint64_t off, uint64_t len), void *arg);
/* Frames, bytes on disk before the seek table... see ckptio_reader_compression. */
void ckptio_zread_describe(const struct ckptio_zsrc *z, uint64_t *frames, uint64_t *compressed, uint64_t *plain);

#endif
