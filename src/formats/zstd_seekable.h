/*
 * The zstd seekable format (facebook/zstd contrib/seekable_format, FORMATS.md
 * section 3): independent frames, then a skippable frame holding the seek
 * table. Bytes only: reads and builds the table, builds a zstd frame of RAW
 * blocks (fixed size, for a header rewritten in place). No files, no threads.
 */
#ifndef CKPTIO_FORMATS_ZSTD_SEEKABLE_H
#define CKPTIO_FORMATS_ZSTD_SEEKABLE_H

#include <stddef.h>
#include <stdint.h>

#define CKPTIO_ZS_FRAME_MAGIC 0xFD2FB528u     /* a zstd frame */
#define CKPTIO_ZS_SKIP_MAGIC 0x184D2A5Eu      /* the seek table's skippable frame */
#define CKPTIO_ZS_SEEK_MAGIC 0x8F92EAB1u      /* last 4 bytes of the file */
#define CKPTIO_ZS_MAX_FRAMES 0x8000000u
#define CKPTIO_ZS_MAX_FRAME_BYTES (1ull << 30) /* decompressed, per frame */
#define CKPTIO_ZS_FOOTER 9                    /* u32 count, u8 descriptor, u32 magic */

typedef struct ckptio_zs_frame {
  uint64_t coff, doff;   /* compressed (file) and decompressed offsets */
  uint32_t csize, dsize;
} ckptio_zs_frame;

typedef struct ckptio_zs_table {
  ckptio_zs_frame *frames; /* malloc'd */
  size_t count;
  uint64_t csize_total;    /* bytes of frames, before the table */
  uint64_t dsize_total;    /* the decompressed stream */
  uint64_t table_bytes;    /* the skippable frame, header included */
  uint32_t max_dsize;
  int checksums;           /* entries carry XXH64 low bits (read, not checked) */
} ckptio_zs_table;

/* 1 when the file starts with a zstd frame (its first 4 bytes). */
int ckptio_zs_detect(const uint8_t *prefix, uint64_t file_size);

/* Reads and checks the seek table at the end of a file of file_size bytes
 * (the whole file in `file`): footer magic, reserved descriptor bits, frame
 * count <= CKPTIO_ZS_MAX_FRAMES, table inside the file, every frame's
 * decompressed size <= 1 GiB and compressed size > 0, compressed sizes
 * adding up to exactly the bytes before the table; u64 arithmetic
 * throughout. @return 0 and *out (free with ckptio_zs_table_free), or
 * CKPTIO_E_ZSTD / -ENOMEM with the rule in err. */
int ckptio_zs_table_parse(const uint8_t *file, uint64_t file_size, ckptio_zs_table *out, char *err,
                          size_t errlen);
void ckptio_zs_table_free(ckptio_zs_table *t);

/* The frame holding decompressed offset pos (pos < dsize_total). */
size_t ckptio_zs_find(const ckptio_zs_table *t, uint64_t pos);

/* Bytes of a seek table of n frames without checksums, and the table. */
uint64_t ckptio_zs_table_bytes(uint64_t n);
void ckptio_zs_table_write(const uint32_t *csize, const uint32_t *dsize, size_t n, uint8_t *out);

/* A zstd frame of RAW blocks carrying len bytes verbatim: its size depends
 * on len only, so it can be rewritten in place once the bytes change. */
uint64_t ckptio_zs_raw_frame_bytes(uint64_t len);
void ckptio_zs_raw_frame_write(const uint8_t *src, uint64_t len, uint8_t *out);

#endif
