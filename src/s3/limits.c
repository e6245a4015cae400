/* S3's multipart limits turned into a part size: no libcurl here, so a
 * build without S3 still plans (and tests) the same way. */
#include <stdint.h>

#include "s3/s3.h"

uint64_t ckptio_s3_part_size(uint64_t total, uint64_t preferred) {
  /* At least the 5 MiB S3 takes for every part but the last, and large
   * enough that the object fits in 10,000 parts; within that, the caller's
   * size, rounded up to a whole MiB so parts stay page-aligned. */
  const uint64_t mib = 1u << 20;
  uint64_t part = preferred > CKPTIO_S3_PART_MIN ? preferred : CKPTIO_S3_PART_MIN;
  uint64_t least = total / CKPTIO_S3_PARTS_MAX + (total % CKPTIO_S3_PARTS_MAX != 0);
  if (part < least) part = least;
  part = (part + mib - 1) / mib * mib;
  return part > CKPTIO_S3_PART_MAX ? CKPTIO_S3_PART_MAX : part;
}
