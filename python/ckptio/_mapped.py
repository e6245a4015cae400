"""Zero-copy loads: results that are views of one private, copy-on-write
mapping of the file (ckptio_reader_map_private), CRC-checked by the library
over that mapping before any view is made.

Lifetime: the mapping is a ctypes array over its address; every numpy
array (np.frombuffer) and torch tensor (torch.frombuffer) made from it holds
a reference to that array, and a finalizer unmaps it when the last of them
goes. The reader can be closed at once: the mapping does not depend on it.

What cannot be a view is copied by the caller (load_many): strided PyTorch
views and big-endian entries (ckptio_reader_view refuses them), and tensors
whose offset is not a multiple of their element size (torch and numpy
kernels may assume aligned elements).
"""

import ctypes
import weakref

from . import _lib


def map_file(reader):
    """The reader's file, privately mapped and CRC-checked (with the reader's
    crc option): a ctypes uint8 array over the mapping, or None for an empty
    file or a checkpoint no single mapping holds (a sharded set or a
    compressed file: the caller copies). Raises CkptioError on a bad CRC or a failed mmap."""
    lib = reader.lib
    base, size = ctypes.c_void_p(), ctypes.c_uint64()
    rc = lib.ckptio_reader_map_private(reader.handle, ctypes.byref(base), ctypes.byref(size))
    if rc == _lib.ERRORS["FORMAT"]:
        return None
    reader.check(rc, "zero-copy map")
    if not base.value:
        return None
    try:
        mapping = (ctypes.c_uint8 * size.value).from_address(base.value)
        # Not at exit: arrays may still be in use by other finalizers then,
        # and the process unmapping is the same release.
        weakref.finalize(mapping, lib.ckptio_map_free, base.value, size.value).atexit = False
    except BaseException:
        lib.ckptio_map_free(base.value, size.value)
        raise
    return mapping


def viewable(reader, index, info, elem_size):
    """Whether tensor `index` can be returned as a view of the mapping."""
    if info.strided or info.nbytes == 0 or info.offset % max(elem_size, 1):
        return False
    p, n = ctypes.c_void_p(), ctypes.c_uint64()
    # The library's own rule (strided or big-endian: no view); its refusal
    # only sets the reader's message, which the next failure overwrites.
    return reader.lib.ckptio_reader_view(reader.handle, index, ctypes.byref(p),
                                         ctypes.byref(n)) == 0


def stats(lib, fn, handle):
    """A ckptio_stats of `handle` (fn: ckptio_writer_stats / _reader_stats)
    as a dict: bytes, seconds, per-stage busy seconds, threads, staging_bytes."""
    out = _lib.Stats.init()
    rc = fn(handle, ctypes.byref(out))
    if rc < 0:
        return None
    return out.as_dict()
