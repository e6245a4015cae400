"""The exceptions of the Python binding (ckptio.errors): every failure is a
CkptioError and also the builtin Python code catches (OSError subclasses
with errno set, KeyError, ValueError), carrying the library's error name and
detail. Real failures where they can be provoked here (a missing file, a
directory the user may not enter, a full file system, a flipped byte, a
garbage header, a bad dtype, a second configure), the code-to-class table
for the rest."""

import errno
import os
import pickle
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ckptio
from ckptio import errors


def _save(path):
    ckptio.save_file({"w": np.arange(1000, dtype=np.float32)}, path, metadata={"k": "v"})
    return path


def _common(e, cls, name):
    assert isinstance(e, ckptio.CkptioError), type(e).__mro__
    assert isinstance(e, cls), type(e).__mro__
    assert e.name == name, (e.name, str(e))
    assert e.code < 0
    assert str(e) == e.message and e.message, e


def test_missing_file_is_file_not_found(tmp_path):
    path = tmp_path / "nope.safetensors"
    for call in (ckptio.load_file, ckptio.verify, ckptio.load_metadata):
        with pytest.raises(FileNotFoundError) as info:
            call(path)
        e = info.value
        _common(e, ckptio.CkptioFileNotFoundError, "ENOENT")
        assert isinstance(e, OSError) and e.errno == errno.ENOENT, e
        assert e.code == -errno.ENOENT
        assert e.strerror == os.strerror(errno.ENOENT)
        assert e.filename == str(path), e.filename
        assert str(path) in str(e) and "No such file" in str(e), str(e)
    # An OSError handler written for open() catches it.
    try:
        ckptio.load_file(path)
    except OSError as e:
        assert e.errno == errno.ENOENT
    else:
        raise AssertionError("no exception")


def test_save_into_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        _save(tmp_path / "no" / "such" / "dir" / "m.safetensors")
    assert info.value.errno == errno.ENOENT and info.value.name == "ENOENT"


def _run_child(code, *, wrap=None, timeout=120):
    """Runs `code` in a fresh interpreter with this one's environment (it
    prints the exception's attributes); returns CompletedProcess."""
    argv = [sys.executable, "-c", textwrap.dedent(code)]
    if wrap:
        argv = wrap + argv
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          env=os.environ.copy())


_REPORT = """
    import errno, sys, numpy as np, ckptio
    try:
        {call}
    except ckptio.CkptioError as e:
        print(type(e).__name__, isinstance(e, OSError), getattr(e, "errno", None), e.name,
              isinstance(e, PermissionError), sep="|")
        print(e)
    else:
        print("no exception")
"""


def test_permission_denied_is_permission_error(tmp_path):
    """A file the user may not read: PermissionError, errno EACCES. As root
    (which reads anything) the call runs in a child whose capabilities to
    override file permissions are dropped (setpriv)."""
    path = _save(tmp_path / "m.safetensors")
    os.chmod(path, 0)
    if os.geteuid() != 0:
        with pytest.raises(PermissionError) as info:
            ckptio.load_file(path)
        _common(info.value, ckptio.CkptioPermissionError, "EACCES")
        assert info.value.errno == errno.EACCES
        return
    if not shutil.which("setpriv"):
        pytest.skip("running as root and no setpriv to drop CAP_DAC_OVERRIDE: cannot see EACCES")
    out = _run_child(_REPORT.format(call=f"ckptio.load_file({str(path)!r})"),
                     wrap=["setpriv", "--bounding-set", "-dac_override,-dac_read_search"])
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0].split("|")
    assert first == ["CkptioPermissionError", "True", str(errno.EACCES), "EACCES", "True"], out.stdout
    assert "Permission denied" in out.stdout, out.stdout


def test_full_file_system_is_oserror_enospc(tmp_path):
    """A save onto a full file system: OSError with errno ENOSPC (a 1 MiB
    tmpfs mounted in a mount namespace of the child's own)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if not shutil.which("unshare"):
        pytest.skip("no unshare command: cannot mount a small tmpfs to fill")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {mnt}"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a mount namespace here: {probe.stderr.strip()}")
    call = (f"ckptio.save_file({{'w': np.ones(4 << 20, np.uint8)}}, "
            f"{str(mnt / 'm.safetensors')!r})")
    script = f"mount -t tmpfs -o size=1m tmpfs {mnt} && exec \"$@\""
    out = _run_child(_REPORT.format(call=call), wrap=["unshare", "-m", "sh", "-c", script, "sh"])
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0].split("|")
    assert first[:4] == ["CkptioOSError", "True", str(errno.ENOSPC), "ENOSPC"], out.stdout
    assert "No space left" in out.stdout, out.stdout


def test_flipped_byte_is_checksum_error(tmp_path):
    path = _save(tmp_path / "m.safetensors")
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0x10
    path.write_bytes(raw)
    for call in (ckptio.verify, ckptio.load_file, lambda p: ckptio.load_file(p, mmap=False)):
        with pytest.raises(ckptio.ChecksumError) as info:
            call(path)
        e = info.value
        _common(e, ValueError, "CHECKSUM")
        assert e.code == ckptio.E_CHECKSUM == ckptio.ERRORS["CHECKSUM"]
        assert "checksum mismatch" in e.detail and "'w'" in e.detail, e.detail
        assert e.detail in str(e)
        assert not isinstance(e, OSError)


def test_garbage_is_format_error(tmp_path):
    path = tmp_path / "junk.safetensors"
    path.write_bytes(b"\xff" * 64)
    with pytest.raises(ckptio.FormatError) as info:
        ckptio.load_file(path)
    e = info.value
    _common(e, ValueError, e.name)
    assert e.name.startswith("HEADER_"), e.name
    assert e.code == ckptio.ERRORS[e.name]
    truncated = _save(tmp_path / "t.safetensors")
    truncated.write_bytes(truncated.read_bytes()[:-100])
    with pytest.raises(ckptio.FormatError):
        ckptio.load_file(truncated)


def test_missing_tensor_is_key_error(tmp_path):
    path = _save(tmp_path / "m.safetensors")
    with ckptio.safe_open(path, framework="numpy") as f:
        with pytest.raises(KeyError) as info:
            f.get_tensor("nope")
        _common(info.value, ckptio.TensorNotFoundError, "NOT_FOUND")
        assert info.value.code == ckptio.ERRORS["NOT_FOUND"]
        assert "'nope'" in str(info.value) and str(path) in str(info.value)
        with pytest.raises(KeyError):
            f.get_slice("nope")
        assert f.get_tensor("w").shape == (1000,)   # the file stays usable
        try:                                         # a dict-style handler catches it
            f.get_tensor("nope")
        except LookupError:
            pass


def test_bad_argument_is_value_error(tmp_path):
    with pytest.raises(ValueError) as info:
        ckptio.save_file({"w": ckptio.Tensor("F33", (2,), b"\0" * 8)}, tmp_path / "m.safetensors")
    _common(info.value, ckptio.CkptioValueError, "DTYPE")
    assert not (tmp_path / "m.safetensors").exists()
    # Bad Python arguments never reach the library: plain ValueError / TypeError.
    with pytest.raises(ValueError):
        ckptio.save_file({"w": np.ones(2)}, tmp_path / "m.safetensors", format="h5")
    with pytest.raises(TypeError):
        ckptio.save_file({"w": np.ones(2)}, tmp_path / "m.safetensors", metadata={"k": 1})


def test_configure_after_the_context_is_a_state_error(tmp_path):
    _save(tmp_path / "m.safetensors")   # the context exists from here on
    with pytest.raises(RuntimeError) as info:
        ckptio.configure(threads=2)
    e = info.value
    _common(e, ckptio.CkptioRuntimeError, "STATE")
    assert e.code == ckptio.ERRORS["STATE"]
    assert "before the first save or load" in str(e)


@pytest.mark.parametrize("code,cls,builtin,name", [
    (-errno.ENOENT, "CkptioFileNotFoundError", FileNotFoundError, "ENOENT"),
    (-errno.EACCES, "CkptioPermissionError", PermissionError, "EACCES"),
    (-errno.EPERM, "CkptioPermissionError", PermissionError, "EPERM"),
    (-errno.EEXIST, "CkptioFileExistsError", FileExistsError, "EEXIST"),
    (-errno.EISDIR, "CkptioIsADirectoryError", IsADirectoryError, "EISDIR"),
    (-errno.ENOTDIR, "CkptioNotADirectoryError", NotADirectoryError, "ENOTDIR"),
    (-errno.ENOSPC, "CkptioOSError", OSError, "ENOSPC"),
    (-errno.EIO, "CkptioOSError", OSError, "EIO"),
    ("SHORT_IO", "CkptioOSError", OSError, "SHORT_IO"),
    ("NOT_FOUND", "TensorNotFoundError", KeyError, "NOT_FOUND"),
    ("INVALID_ARG", "CkptioValueError", ValueError, "INVALID_ARG"),
    ("DUPLICATE", "CkptioValueError", ValueError, "DUPLICATE"),
    ("CHECKSUM", "ChecksumError", ValueError, "CHECKSUM"),
    ("HEADER_JSON", "FormatError", ValueError, "HEADER_JSON"),
    ("ZIP", "FormatError", ValueError, "ZIP"),
    ("PICKLE", "FormatError", ValueError, "PICKLE"),
    ("SHARD", "FormatError", ValueError, "SHARD"),
    ("STATE", "CkptioRuntimeError", RuntimeError, "STATE"),
    ("DEVICE", "CkptioRuntimeError", RuntimeError, "DEVICE"),
])
def test_code_to_class(code, cls, builtin, name):
    if isinstance(code, str):
        code = ckptio.ERRORS[code]
    e = errors.from_code(code, "what: why: detail", "detail", filename="f.safetensors")
    assert type(e).__name__ == cls and isinstance(e, builtin) and isinstance(e, ckptio.CkptioError)
    assert (e.code, e.name, e.detail, str(e)) == (code, name, "detail", "what: why: detail")
    if isinstance(e, OSError):
        want = errno.EIO if name == "SHORT_IO" else -code
        assert e.errno == want and e.strerror == os.strerror(want)
        assert e.filename == "f.safetensors"
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is type(e)
    assert (back.code, back.name, back.detail, str(back)) == (e.code, e.name, e.detail, str(e))
    if isinstance(e, OSError):
        assert (back.errno, back.filename) == (e.errno, e.filename)


def test_every_library_code_has_a_class():
    """A code the library gains later must be placed in the table, not fall
    through silently to CkptioRuntimeError."""
    placed = set(errors._CLASSES)
    assert set(ckptio.ERRORS) <= placed, sorted(set(ckptio.ERRORS) - placed)
    assert errors.error_name(-errno.ENOSPC) == "ENOSPC"
    assert errors.error_name(ckptio.ERRORS["ZSTD"]) == "ZSTD"
