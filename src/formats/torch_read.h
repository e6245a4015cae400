/*
 * PyTorch checkpoints (torch.save zip archives), reading: the archive, its
 * data.pkl and storage records turned into the generic index, without
 * executing anything. Pure format code over a byte range; no OS calls.
 */
#ifndef CKPTIO_FORMATS_TORCH_READ_H
#define CKPTIO_FORMATS_TORCH_READ_H

#include <stddef.h>
#include <stdint.h>

#include "formats/index.h"

/*! ckptio_torch_parse() :
 *  Indexes the torch.save archive in map[0, size) (borrowed for the call
 *  only: the index copies every name and value). Tensors are named by their
 *  path in the saved object, dict keys and list indices joined with '.'
 *  ("model.layer.weight", "optimizer.state.0.exp_avg"); int, float, bool, str
 *  and None leaves become metadata under their path. Every tensor is checked
 *  against its storage record: the record exists, its size is the storage's
 *  numel x element size, the view stays inside it, one dtype per storage.
 *  Entries: a row-major contiguous view is [offset, offset + nbytes) of its
 *  own bytes (has_crc when that is the whole record and the zip recorded a
 *  CRC); any other view is strided over its whole record. byteorder "big"
 *  sets byteswap on multi-byte dtypes. Sorted by offset, then name.
 *  @return 0 and *out (free with ckptio_index_free), or CKPTIO_E_FORMAT (not
 *          a torch.save archive: legacy, tar, preview, TorchScript, compressed
 *          ...), CKPTIO_E_ZIP, CKPTIO_E_PICKLE, CKPTIO_E_DTYPE (no ckptio
 *          equivalent, or one storage used as two dtypes), CKPTIO_E_NOT_FOUND
 *          (a storage record missing), CKPTIO_E_TENSOR_INFO (record size, a
 *          view outside its storage), CKPTIO_E_SHAPE, CKPTIO_E_OVERFLOW,
 *          CKPTIO_E_DUPLICATE (two tensors with one name), -ENOMEM; err names
 *          the record, tensor or pickle byte. *out is empty on failure. */
int ckptio_torch_parse(const uint8_t *map, uint64_t size, ckptio_index *out, char *err, size_t errlen);

/* Flags of ckptio_torch_parse_flags. */
#define CKPTIO_TORCH_RECORDS 1u  /* index the archive's records, not its tensors */

/*! As ckptio_torch_parse; with CKPTIO_TORCH_RECORDS the entries are the
 *  records a caller needs to rebuild the saved object itself (as
 *  ckptio.torch.load_checkpoint does): "data.pkl" and each storage record
 *  the pickle uses, "data/<key>", each a 1-D U8 entry of the whole record
 *  with the zip's CRC (names relative to the archive folder). Every check
 *  of the tensor walk is still made (the pickle's allowlist, each storage's
 *  record and size, each tensor's view inside its record), but the walk
 *  itself is not: containers, keys and scalars are the caller's to read.
 *  A big-endian archive is refused (CKPTIO_E_FORMAT). */
int ckptio_torch_parse_flags(const uint8_t *map, uint64_t size, unsigned flags, ckptio_index *out, char *err,
                             size_t errlen);

#endif
