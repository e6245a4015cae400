/*
 * PyTorch (torch.save) files as a writer layout: the zip archive PyTorch's
 * own writer (caffe2 inline_container.cc over its patched miniz) produces,
 * byte for byte apart from the serialization id, planned before any data is
 * written. Pure layout code: no files, no threads.
 */
#ifndef CKPTIO_FORMATS_TORCH_WRITE_H
#define CKPTIO_FORMATS_TORCH_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "formats/layout.h"

/* Every record's data starts at a multiple of this (".storage_alignment"). */
#define CKPTIO_TORCH_ALIGN 64
/* The folder name when the caller gives none (torch.save uses the file's
 * basename without its extension; readers take it from the first entry). */
#define CKPTIO_TORCH_DEFAULT_ARCHIVE "archive"
/* User metadata, when there is any: a record "<archive>/" this name, after
 * .data/serialization_id, holding a compact JSON object of string -> string
 * in the order given. torch.load (weights_only, mmap, and the
 * calculate_storage_offsets fast path) ignores records it does not ask for,
 * so the file stays a plain torch.save file. Without metadata there is no
 * such record. */
#define CKPTIO_TORCH_META_RECORD "ckptio_metadata.json"

/*! ckptio_torch_layout() :
 *  Lays out a torch.save file of the n tensors, as an OrderedDict in input
 *  order: records data.pkl, .format_version, .storage_alignment, byteorder,
 *  data/0 .. data/n-1 (input i is storage key i, so out->order is 0..n-1),
 *  version, .data/serialization_id (deterministic: derived from the pickle
 *  and the metadata), then the metadata record if nmeta > 0.
 *  Every byte that is not tensor data is in out->extents. The small
 *  records' CRCs are real; the tensors' are 0 until out->set_crc(l, i, crc)
 *  patches input i's CRC into its data descriptor and central directory
 *  entry (the extents marked holds_crc). with_crc = 0 leaves them 0
 *  (PyTorch's "no crc" mode, which torch.load accepts) and set_crc NULL.
 *  @in          borrowed for the call; names must be unique UTF-8 (the
 *               caller checks uniqueness; invalid UTF-8 is refused here).
 *  @meta        copied (into the metadata record).
 *  @archive_name NULL or "" for CKPTIO_TORCH_DEFAULT_ARCHIVE; copied.
 *  @return 0 and *out (free with ckptio_layout_free), or a negative code
 *          with a message in err: CKPTIO_E_DTYPE names the tensor whose
 *          dtype PyTorch cannot hold (F4, F6_E2M3, F6_E3M2),
 *          CKPTIO_E_OVERFLOW, CKPTIO_E_INVALID_ARG, -ENOMEM. On failure
 *          *out is all zero. */
int ckptio_torch_layout(const ckptio_layout_input *in, size_t n, const ckptio_kv *meta,
                        size_t nmeta, int with_crc, const char *archive_name,
                        ckptio_layout *out, char *err, size_t errlen);

/*! As ckptio_torch_layout, with the caller's data.pkl (pickle[0,
 *  pickle_len), copied) instead of an OrderedDict of the inputs: input i is
 *  still record data/<i>, and the pickle's persistent ids must name those
 *  records, each with the input's byte count (numel x element size). The
 *  pickle is run on the safe reader first: what torch's weights_only
 *  allowlist refuses, or a storage that is not an input of its size, is
 *  refused here (CKPTIO_E_PICKLE, CKPTIO_E_FORMAT, CKPTIO_E_INVALID_ARG)
 *  before anything is written. pickle NULL: ckptio_torch_layout. */
int ckptio_torch_layout_pickle(const ckptio_layout_input *in, size_t n, const uint8_t *pickle,
                               size_t pickle_len, const ckptio_kv *meta, size_t nmeta, int with_crc,
                               const char *archive_name, ckptio_layout *out, char *err, size_t errlen);

/*! The torch dtype name ("float32", "float8_e4m3fn") ckptio writes for
 *  dtype, or NULL when PyTorch has no equivalent. */
const char *ckptio_torch_dtype_name(ckptio_dtype dtype);

#endif
