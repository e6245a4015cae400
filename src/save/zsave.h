/* The compressed side of a save: the planned safetensors file cut into
 * frames (the header alone in a frame of RAW blocks, the data in frames of
 * a few MiB cut at tensor boundaries where that costs little), each frame
 * shuffled (optionally) and compressed on the worker that filled it, then
 * written at its place in the file as soon as every earlier frame's size is
 * known; the seek table goes last.
 *
 * The header holds CRCs known only after the data. It gets a frame of its
 * own made of RAW blocks, whose size depends only on the header's length
 * (fixed by the plan), so the data frames' offsets never wait for it and the
 * final header is rewritten in place at the end. The alternatives were
 * worse: compressing the header last shifts every data frame (or needs the
 * data twice), and moving it to the end would stop `zstd -d` from giving a
 * safetensors file. The cost is the header stored uncompressed: a few KiB to
 * a few MiB against GiBs of data. */
#ifndef CKPTIO_COMPRESS_ZSAVE_H
#define CKPTIO_COMPRESS_ZSAVE_H

#include <stddef.h>
#include <stdint.h>

#include "io/file.h"

typedef struct ckptio_zsave ckptio_zsave;

/* One tensor of the planned file, in file order. */
typedef struct ckptio_zsave_tensor {
  uint64_t offset, nbytes;
  size_t elem;            /* bytes per element (1 for sub-byte types) */
} ckptio_zsave_tensor;

typedef struct ckptio_zsave_params {
  int level, shuffle, threads;
  ckptio_tmpfile *out;     /* the temp file (buffered) or the object; frames go
                              in file order, the header frame and the seek
                              table last */
  uint64_t header_bytes;   /* plain file: data start */
  uint64_t file_size;      /* plain file */
  uint64_t max_frame;      /* decompressed bytes per data frame (a staging slot) */
  size_t buffers;          /* compressed frames held at once (>= 1) */
  const ckptio_zsave_tensor *tensors;
  size_t count;
} ckptio_zsave_params;

/* 0 when level is a zstd level other than 0, else CKPTIO_E_INVALID_ARG with
 * the range in err. */
int ckptio_zsave_check_level(int level, char *err, size_t errlen);

/* Plans the frames. @return 0 and *out, or a negative code with err set. */
int ckptio_zsave_open(const ckptio_zsave_params *p, ckptio_zsave **out, char *err, size_t errlen);
void ckptio_zsave_free(ckptio_zsave *z);

uint64_t ckptio_zsave_frames(const ckptio_zsave *z);
/* Plain-file offset where frame c starts (c == frames: the file size). */
uint64_t ckptio_zsave_start(const ckptio_zsave *z, uint64_t c);
/* The frame holding plain-file offset pos. */
uint64_t ckptio_zsave_frame_of(const ckptio_zsave *z, uint64_t pos);

/* Frame 0 (the header) is never queued: finish writes it. Data frames are
 * 1 .. frames-1. Coordinator, in frame order, before filling frame c: waits until a
 * compressed-frame buffer is free for it. @return 0, or the error of a
 * failed frame (so the coordinator stops). */
int ckptio_zsave_reserve(ckptio_zsave *z, uint64_t c);
/* Worker: compresses frame c (its plain bytes in buf, which may be used as
 * scratch) and writes it, with any later frames that were waiting for its
 * size. @return 0 or a negative code with the detail in msg. */
int ckptio_zsave_frame(ckptio_zsave *z, uint64_t c, uint8_t *buf, size_t len, char *msg, size_t msglen);
/* A frame that will never come: wakes the coordinator with rc. */
void ckptio_zsave_abort(ckptio_zsave *z, int rc);
/* After every frame: rewrites the header frame with the final header
 * (header_bytes bytes) and writes the seek table. @return 0 and the
 * compressed file's size, or a negative code with err set. */
int ckptio_zsave_finish(ckptio_zsave *z, const uint8_t *header, uint64_t *file_size, char *err, size_t errlen);

#endif
