/*
 * Reading a zip archive that lives in memory (a file mapping): the central
 * directory, each entry's local header and where its bytes are. Only what
 * torch.save writes is accepted: stored entries, one disk, zip64 records.
 * Never touches files; every offset is checked against the mapping's size.
 */
#ifndef CKPTIO_FORMATS_ZIP_READ_H
#define CKPTIO_FORMATS_ZIP_READ_H

#include <stddef.h>
#include <stdint.h>

/* Bounds a hostile directory cannot push past. A torch checkpoint has two
 * records per storage plus a handful more; names are "<archive>/data/<key>". */
#define CKPTIO_ZIP_MAX_ENTRIES (1u << 22)
#define CKPTIO_ZIP_MAX_NAME 4096

typedef struct ckptio_zip_entry {
  const char *name;        /* NUL-terminated, in the archive's name pool */
  size_t name_len;
  uint16_t method;         /* 0 (stored), unless opened with CKPTIO_ZIP_ALLOW_COMPRESSED */
  uint16_t flags;
  uint32_t crc;            /* from the central directory; 0 may mean "not recorded" */
  uint64_t size;           /* bytes of data, uncompressed */
  uint64_t csize;          /* bytes in the file at data_offset (== size when stored) */
  uint64_t header_offset;  /* absolute offset of the local header */
  uint64_t data_offset;    /* absolute offset of the data: header + 30 + name + local extra */
} ckptio_zip_entry;

typedef struct ckptio_zip {
  ckptio_zip_entry *entries;  /* central directory order */
  size_t count;
  char *names;                /* the name pool (owned) */
  size_t *by_name;            /* entry indices sorted by name, for ckptio_zip_find */
  uint64_t cd_offset, cd_size;
  int zip64;                  /* 1 when zip64 end records were read */
} ckptio_zip;

/* Index compressed entries instead of refusing them, for a caller that
 * wants to say more about the archive first (it must then check methods,
 * e.g. with ckptio_zip_require_stored). */
#define CKPTIO_ZIP_ALLOW_COMPRESSED 1u
/* Walk the end records and the central directory only: the local headers
 * are not read (data_offset is 0, overlaps are not checked). What a reader
 * of an object without a mapping does first, to learn which local headers
 * to fetch before the full open. */
#define CKPTIO_ZIP_CENTRAL_ONLY 2u

/*! ckptio_zip_open() :
 *  Validates the archive in map[0, size) (borrowed; the entries' offsets point
 *  into it) and fills *out (free with ckptio_zip_free). Files that are not
 *  zips get their own message: PyTorch's preview "PYTORCH1" format, a legacy
 *  (pre-1.6) torch.save pickle stream, a tar archive, anything else by its
 *  first bytes. flags: 0 or CKPTIO_ZIP_ALLOW_COMPRESSED, with CKPTIO_ZIP_CENTRAL_ONLY.
 *  @return 0; CKPTIO_E_FORMAT (not a zip, or a kind of zip not supported:
 *          compressed, encrypted, multi-disk); CKPTIO_E_ZIP (corrupt: a
 *          directory or header out of bounds or inconsistent, overlapping
 *          entries, duplicate names); -ENOMEM. On failure err says what was
 *          found and *out is left empty. */
int ckptio_zip_open(const uint8_t *map, uint64_t size, unsigned flags, ckptio_zip *out, char *err,
                    size_t errlen);

/*! ckptio_zip_directory_start() :
 *  Reads only the end records of the archive in map[0, size) (the bytes
 *  from its last 64 KiB + 100 on need to be there, the rest may be zeros)
 *  and gives where the central directory starts: an archive read without a
 *  mapping needs [*start, size) before ckptio_zip_open.
 *  @return 0, or what ckptio_zip_open says of bad end records. */
int ckptio_zip_directory_start(const uint8_t *map, uint64_t size, uint64_t *start, char *err, size_t errlen);

/*! @return 0 when every entry is stored, else CKPTIO_E_FORMAT naming the
 *          first compressed entry and its method. */
int ckptio_zip_require_stored(const ckptio_zip *z, char *err, size_t errlen);

/*! @return the entry named exactly `name`, or NULL. O(log n). */
const ckptio_zip_entry *ckptio_zip_find(const ckptio_zip *z, const char *name);

/*! Frees what ckptio_zip_open allocated; accepts NULL and an empty zip. */
void ckptio_zip_free(ckptio_zip *z);

#endif
