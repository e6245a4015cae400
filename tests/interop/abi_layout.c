/*
 * Prints, as JSON, the layout of the public structs and the constants that
 * python/ckptio/_lib.py copies from include/ckptio.h, as the C compiler sees
 * them; the interop tests compare the binding against this (and the error
 * names against the header's text, so this file need not list every code).
 */

/* Uses ckptio_byte_range, of ckptio.h's experimental section. */
#define CKPTIO_EXPERIMENTAL

#include <stddef.h>
#include <stdio.h>

#include "ckptio.h"

#define FIELD(T, f) printf("%s\"%s.%s\": [%zu, %zu]", sep(), #T, #f, offsetof(T, f), \
                           sizeof(((T *)0)->f))
#define SIZE(T) printf("%s\"%s\": %zu", sep(), #T, sizeof(T))
#define CONST(c) printf("%s\"%s\": %lld", sep(), #c, (long long)(c))

static int first = 1;
static const char *sep(void) {
  const char *s = first ? "" : ", ";
  first = 0;
  return s;
}

int main(void) {
  printf("{\"sizeof\": {");
  first = 1;
  SIZE(ckptio_tensor);
  SIZE(ckptio_tensor_info);
  SIZE(ckptio_options);
  SIZE(ckptio_load_request);
  SIZE(ckptio_slice_request);
  SIZE(ckptio_byte_range);
  SIZE(ckptio_box_request);
  SIZE(ckptio_comm);
  SIZE(ckptio_stats);
  SIZE(ckptio_manager_options);
  SIZE(ckptio_checkpoint_info);
  printf("},\n \"fields\": {");
  first = 1;
  FIELD(ckptio_tensor, name);
  FIELD(ckptio_tensor, dtype);
  FIELD(ckptio_tensor, ndim);
  FIELD(ckptio_tensor, shape);
  FIELD(ckptio_tensor, data);
  FIELD(ckptio_tensor, device);
  FIELD(ckptio_tensor_info, name);
  FIELD(ckptio_tensor_info, dtype);
  FIELD(ckptio_tensor_info, ndim);
  FIELD(ckptio_tensor_info, shape);
  FIELD(ckptio_tensor_info, nbytes);
  FIELD(ckptio_tensor_info, offset);
  FIELD(ckptio_tensor_info, has_crc);
  FIELD(ckptio_tensor_info, crc32);
  FIELD(ckptio_tensor_info, strided);
  FIELD(ckptio_options, size);
  FIELD(ckptio_options, threads);
  FIELD(ckptio_options, chunk_bytes);
  FIELD(ckptio_options, staging_bytes);
  FIELD(ckptio_options, crc);
  FIELD(ckptio_options, direct_io);
  FIELD(ckptio_options, fsync);
  FIELD(ckptio_options, load_method);
  FIELD(ckptio_options, cuda);
  FIELD(ckptio_options, numa);
  FIELD(ckptio_options, compress_level);
  FIELD(ckptio_options, shuffle);
  FIELD(ckptio_options, snapshot_bytes);
  FIELD(ckptio_options, open_flags);
  FIELD(ckptio_load_request, index);
  FIELD(ckptio_load_request, dst);
  FIELD(ckptio_load_request, dst_bytes);
  FIELD(ckptio_load_request, device);
  FIELD(ckptio_slice_request, index);
  FIELD(ckptio_slice_request, dim);
  FIELD(ckptio_slice_request, start);
  FIELD(ckptio_slice_request, stop);
  FIELD(ckptio_slice_request, dst);
  FIELD(ckptio_slice_request, dst_bytes);
  FIELD(ckptio_slice_request, device);
  FIELD(ckptio_slice_request, verified);
  FIELD(ckptio_slice_request, bytes_read);
  FIELD(ckptio_byte_range, file);
  FIELD(ckptio_byte_range, offset);
  FIELD(ckptio_byte_range, length);
  FIELD(ckptio_box_request, index);
  FIELD(ckptio_box_request, start);
  FIELD(ckptio_box_request, stop);
  FIELD(ckptio_box_request, dst);
  FIELD(ckptio_box_request, dst_bytes);
  FIELD(ckptio_box_request, device);
  FIELD(ckptio_box_request, verified);
  FIELD(ckptio_box_request, bytes_read);
  FIELD(ckptio_comm, size);
  FIELD(ckptio_comm, rank);
  FIELD(ckptio_comm, nranks);
  FIELD(ckptio_comm, user);
  FIELD(ckptio_comm, allgather);
  FIELD(ckptio_comm, broadcast);
  FIELD(ckptio_comm, alltoallv);
  FIELD(ckptio_stats, size);
  FIELD(ckptio_stats, bytes);
  FIELD(ckptio_stats, seconds);
  FIELD(ckptio_stats, snapshot_seconds);
  FIELD(ckptio_stats, device_seconds);
  FIELD(ckptio_stats, copy_seconds);
  FIELD(ckptio_stats, write_seconds);
  FIELD(ckptio_stats, commit_seconds);
  FIELD(ckptio_stats, threads);
  FIELD(ckptio_stats, staging_bytes);
  FIELD(ckptio_stats, direct_bytes);
  FIELD(ckptio_stats, load_methods);
  FIELD(ckptio_manager_options, size);
  FIELD(ckptio_manager_options, keep_last);
  FIELD(ckptio_manager_options, keep_every);
  FIELD(ckptio_manager_options, format);
  FIELD(ckptio_manager_options, max_shard_bytes);
  FIELD(ckptio_manager_options, verify);
  FIELD(ckptio_checkpoint_info, size);
  FIELD(ckptio_checkpoint_info, step);
  FIELD(ckptio_checkpoint_info, dir);
  FIELD(ckptio_checkpoint_info, path);
  FIELD(ckptio_checkpoint_info, bytes);
  FIELD(ckptio_checkpoint_info, files);
  FIELD(ckptio_checkpoint_info, complete);
  FIELD(ckptio_checkpoint_info, verified);
  FIELD(ckptio_checkpoint_info, error);
  FIELD(ckptio_checkpoint_info, detail);
  printf("},\n \"options_init\": [");
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  printf("%zu, %d, %zu, %zu, %d, %d, %d, %d, %d, %d, %d, %d, %zu, %u", o.size, o.threads, o.chunk_bytes,
         o.staging_bytes, o.crc, o.direct_io, o.fsync, (int)o.load_method, o.cuda, o.numa,
         o.compress_level, o.shuffle, o.snapshot_bytes, o.open_flags);
  printf("],\n \"constants\": {");
  first = 1;
  CONST(CKPTIO_MAX_DIMS);
  CONST(CKPTIO_DEVICE_HOST);
  CONST(CKPTIO_AUTO);
  CONST(CKPTIO_FORMAT_SAFETENSORS);
  CONST(CKPTIO_FORMAT_PYTORCH);
  CONST(CKPTIO_E_INVALID_ARG);
  CONST(CKPTIO_E_CHECKSUM);
  CONST(CKPTIO_E_SHARD);
  CONST(CKPTIO_E_ERROR_MIN);
  printf("}}\n");
  return 0;
}
