"""The exceptions ckptio raises, rooted at CkptioError and each also derived
from the builtin a Python program already catches:

    CkptioError                       .code .name .detail .message
    +-- CkptioOSError(OSError)        a system call failed: .errno, .strerror,
    |   |                             .filename set ("[Errno 28]" = ENOSPC ...);
    |   |                             also a read or write cut short (SHORT_IO)
    |   +-- CkptioFileNotFoundError(FileNotFoundError)   ENOENT
    |   +-- CkptioPermissionError(PermissionError)       EACCES, EPERM
    |   +-- CkptioFileExistsError(FileExistsError)       EEXIST
    |   +-- CkptioIsADirectoryError(IsADirectoryError)   EISDIR
    |   +-- CkptioNotADirectoryError(NotADirectoryError) ENOTDIR
    +-- CkptioSafetensorError         every other failure: what safetensors
        |                             raises as SafetensorError (also
        |                             ckptio.SafetensorError)
        +-- CkptioTensorNotFoundError(KeyError)  no tensor of that name (NOT_FOUND)
        +-- CkptioValueError(ValueError)  a bad argument: INVALID_ARG, DTYPE,
        |                             SHAPE, DUPLICATE, OVERFLOW, BUFFER_TOO_SMALL
        +-- CkptioFormatError(ValueError) a corrupt or unsupported file: HEADER_*,
        |                             INVALID_OFFSET, TENSOR_INFO, ZIP, PICKLE,
        |                             ZSTD, SHARD, FORMAT, ...
        +-- CkptioChecksumError(ValueError) a tensor's bytes differ from its CRC32
        +-- CkptioRuntimeError(RuntimeError)  the call is not allowed now (STATE),
                                      no usable device (DEVICE), another rank
                                      failed (RANK)

The naming rule: every class ckptio defines is named Ckptio<what>Error, so
that none shadows a builtin or another package's class in a module that
imports both. The names of ckptio 1.0 stay as aliases of the same classes
(FormatError, ChecksumError, TensorNotFoundError), and SafetensorError is
CkptioSafetensorError under the name safetensors gives its own class, so
`except SafetensorError` written for safetensors catches ckptio's failures
when the import changes (safetensors raises OSErrors, such as
FileNotFoundError, for system calls too).

`code` is the library's negative code (a CKPTIO_E_* value, see
ckptio.ERRORS, or -errno); `name` its name ("CHECKSUM", or the errno name
such as "ENOSPC"); `detail` the library's message for the failure (file,
tensor, rule), "" when it gave none; str(e) is the whole message.
Bad Python arguments found before any library call raise plain TypeError /
ValueError, or CkptioTypeError (both) where safetensors raises ValueError
and ckptio 1.0 raised TypeError."""

from __future__ import annotations

import errno as _errno
import os
import re
from typing import Dict, Optional, Tuple, Type, Union

from . import _lib

__all__ = ["CkptioError", "CkptioOSError", "CkptioFileNotFoundError", "CkptioPermissionError",
           "CkptioFileExistsError", "CkptioIsADirectoryError", "CkptioNotADirectoryError",
           "CkptioSafetensorError", "CkptioTensorNotFoundError", "CkptioValueError",
           "CkptioFormatError", "CkptioChecksumError", "CkptioRuntimeError", "CkptioTypeError",
           "SafetensorError", "TensorNotFoundError", "FormatError", "ChecksumError",
           "error_name", "from_code", "check"]


class CkptioError(Exception):
    """A failure reported by libckptio (see the module's docstring for the
    classes). Attributes: code (negative: CKPTIO_E_* or -errno), name
    ("CHECKSUM", "ENOENT", ...), detail (the library's message, or ""),
    message (str(e))."""

    code: int = 0
    name: str = ""
    detail: str = ""
    message: str = ""

    def __str__(self) -> str:
        return self.message or super().__str__()

    def __reduce__(self) -> Tuple[object, Tuple[int, str, str, Optional[str]]]:
        # Picklable (torch.distributed.checkpoint sends a rank's exception to
        # the others): rebuilt by from_code, the same class and attributes.
        filename = getattr(self, "filename", None)
        return (from_code, (self.code, self.message, self.detail,
                            filename if isinstance(filename, str) else None))


class CkptioOSError(CkptioError, OSError):
    """A system call failed (errno set), or a read or write moved fewer
    bytes than asked (code ERRORS["SHORT_IO"], errno EIO)."""


class CkptioFileNotFoundError(CkptioOSError, FileNotFoundError):
    """No such file or directory (ENOENT)."""


class CkptioPermissionError(CkptioOSError, PermissionError):
    """Permission denied (EACCES, EPERM)."""


class CkptioFileExistsError(CkptioOSError, FileExistsError):
    """The file exists (EEXIST)."""


class CkptioIsADirectoryError(CkptioOSError, IsADirectoryError):
    """A directory where a file was expected (EISDIR)."""


class CkptioNotADirectoryError(CkptioOSError, NotADirectoryError):
    """A file where a directory was expected (ENOTDIR)."""


class CkptioSafetensorError(CkptioError):
    """A failure that is not a system call's: the file, the tensor or the
    call is wrong. safetensors raises its SafetensorError for these; the
    name SafetensorError is this class too (see the module's docstring)."""


class CkptioTensorNotFoundError(CkptioSafetensorError, KeyError):
    """The checkpoint has no tensor (or key) of that name."""


class CkptioValueError(CkptioSafetensorError, ValueError):
    """The library refused an argument: a bad dtype, shape, duplicate name,
    a buffer of the wrong size, an invalid option."""


class CkptioFormatError(CkptioSafetensorError, ValueError):
    """The file is not a valid checkpoint of a format this build reads
    (corrupt header, archive, pickle, zstd frame, shard set), or asks for
    something the format cannot do."""


class CkptioChecksumError(CkptioSafetensorError, ValueError):
    """A tensor's bytes do not match the CRC32 recorded for them: the file is
    corrupt."""


class CkptioRuntimeError(CkptioSafetensorError, RuntimeError):
    """The call cannot run now: the object's state forbids it, the device is
    unavailable or failed, or another rank of a multi-rank save failed."""


class CkptioTypeError(TypeError, ValueError):
    """A save's argument of the wrong kind, found before any library call
    (no code): not a mapping of tensors, a value that is no tensor, a sparse
    tensor. safetensors raises ValueError there and ckptio 1.0 raised
    TypeError, so it is both and handlers written for either catch it."""


# The names safetensors and ckptio 1.0 gave these classes (the same objects).
SafetensorError = CkptioSafetensorError
TensorNotFoundError = CkptioTensorNotFoundError
FormatError = CkptioFormatError
ChecksumError = CkptioChecksumError


_ERRNO_CLASSES: Dict[int, Type[CkptioOSError]] = {
    _errno.ENOENT: CkptioFileNotFoundError,
    _errno.EACCES: CkptioPermissionError,
    _errno.EPERM: CkptioPermissionError,
    _errno.EEXIST: CkptioFileExistsError,
    _errno.EISDIR: CkptioIsADirectoryError,
    _errno.ENOTDIR: CkptioNotADirectoryError,
}

# The library's codes by their names (ckptio_error_name): the names are the
# header's, the values are read from the library, never copied here.
_CLASSES: Dict[str, Type[CkptioError]] = {
    "CHECKSUM": CkptioChecksumError,
    "NOT_FOUND": CkptioTensorNotFoundError,
    "SHORT_IO": CkptioOSError,
    **dict.fromkeys(("INVALID_ARG", "DTYPE", "SHAPE", "DUPLICATE", "OVERFLOW",
                     "BUFFER_TOO_SMALL"), CkptioValueError),
    **dict.fromkeys(("HEADER_TOO_SMALL", "HEADER_TOO_LARGE", "HEADER_LENGTH", "HEADER_UTF8",
                     "HEADER_JSON", "INVALID_OFFSET", "MISALIGNED", "TENSOR_INFO",
                     "INCOMPLETE_BUFFER", "FORMAT", "PICKLE", "ZIP", "ZSTD", "SHARD"),
                    CkptioFormatError),
    **dict.fromkeys(("STATE", "DEVICE", "RANK"), CkptioRuntimeError),
}


def error_name(code: int) -> str:
    """The name of a negative library code: the enum's name without
    CKPTIO_E_ ("CHECKSUM"), or for -errno the errno name ("ENOSPC"), or
    "UNKNOWN"."""
    if -1000 < code < 0:
        return _errno.errorcode.get(-code, "UNKNOWN")
    name = _lib.lib().ckptio_error_name(code)
    return name.decode() if name else "UNKNOWN"


def from_code(code: int, message: str, detail: str = "",
              filename: Optional[str] = None) -> CkptioError:
    """The exception for library code `code` (negative), not raised:
    its class by the code (see the module's docstring), with `message` as
    str(e) and the library's `detail`; an OSError's filename is `filename`."""
    name = error_name(code)
    if -1000 < code < 0 or name == "SHORT_IO":
        err = -code if code > -1000 else _errno.EIO
        cls: Type[CkptioError] = _ERRNO_CLASSES.get(err, CkptioOSError)
        args: Tuple[Union[int, str], ...] = (err, os.strerror(err))
        e = cls(*args, filename) if filename is not None else cls(*args)
    else:
        e = _CLASSES.get(name, CkptioRuntimeError)(message)
    e.code, e.name, e.detail, e.message = code, name, detail, message
    return e


def _said(clause: str, text: str) -> bool:
    """Whether `text` already says `clause`: holds it after its start or a
    space, ending at its end or a ':'."""
    return re.search(r"(?:^|\s)" + re.escape(clause) + r"(?=:|$)", text) is not None


def _compose(what: str, desc: str, detail: str) -> str:
    """The message "<what>: <desc>: <detail>" with each thing said once. The
    library's detail mostly begins with the path `what` already names and
    says the code's description `desc` itself, or a shorter form of it
    ("corrupt zip: ..." for "corrupt zip archive"): desc is left out when
    the detail says it (or such a form), and each ": "-separated clause of
    the detail that the message already says."""
    clauses = detail.split(": ") if detail else []
    low = desc.lower()
    if low not in detail.lower() and not any(low.startswith(c.lower() + " ") for c in clauses if c):
        clauses.insert(0, desc)
    out = what
    for c in clauses:
        if c and not _said(c, out):
            out += ": " + c
    return out


def check(rc: int, what: str, detail: Optional[bytes] = None,
          filename: Optional[str] = None) -> int:
    """rc when it is >= 0; else raises from_code's exception, its message
    _compose(what, the code's description, detail): "<what>: <why>", each
    clause once."""
    if rc >= 0:
        return rc
    desc = _lib.lib().ckptio_strerror(rc).decode(errors="replace")
    text = detail.decode(errors="replace") if detail else ""
    raise from_code(rc, _compose(what, desc, text), text, filename)
