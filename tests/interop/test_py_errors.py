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
    for call in (ckptio.verify, ckptio.load_file, lambda p: ckptio.load_file(p, backend="pread")):
        with pytest.raises(ckptio.ChecksumError) as info:
            call(path)
        e = info.value
        _common(e, ValueError, "CHECKSUM")
        assert e.code == ckptio.E_CHECKSUM == ckptio.ERRORS["CHECKSUM"]
        assert "checksum mismatch" in e.detail and "'w'" in e.detail, e.detail
        # The message says the detail after the path it names first, once.
        assert e.detail.split(": ", 1)[1] in str(e) and str(e).count(str(path)) == 1, str(e)
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
        with pytest.raises(LookupError):             # a dict-style handler catches it
            f.get_tensor("nope")


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
    ("NOT_FOUND", "CkptioTensorNotFoundError", KeyError, "NOT_FOUND"),
    ("INVALID_ARG", "CkptioValueError", ValueError, "INVALID_ARG"),
    ("DUPLICATE", "CkptioValueError", ValueError, "DUPLICATE"),
    ("CHECKSUM", "CkptioChecksumError", ValueError, "CHECKSUM"),
    ("HEADER_JSON", "CkptioFormatError", ValueError, "HEADER_JSON"),
    ("ZIP", "CkptioFormatError", ValueError, "ZIP"),
    ("PICKLE", "CkptioFormatError", ValueError, "PICKLE"),
    ("SHARD", "CkptioFormatError", ValueError, "SHARD"),
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


def _said_once(msg, path, cause):
    """msg names path and cause, each once, and no ': '-separated clause
    of it twice (a layer repeating what the one below said)."""
    clauses = msg.split(": ")
    assert len(clauses) == len(set(clauses)), msg
    assert msg.count(str(path)) == 1, (str(path), msg)
    assert msg.count(cause) == 1, (cause, msg)


def _modules():
    """(module, framework, a tensor dict to save) of ckptio.numpy and, when
    torch imports, ckptio.torch."""
    import ckptio.numpy
    out = [(ckptio.numpy, "numpy", {"w": np.ones(4, np.float32)})]
    try:
        import torch
        import ckptio.torch
    except ImportError:
        return out
    return out + [(ckptio.torch, "pt", {"w": torch.ones(4)})]


def _read_all(module, framework, path):
    with module.safe_open(path, framework=framework) as f:
        for name in f.keys():
            f.get_tensor(name)


_PERMISSION_CHILD = """
    import numpy as np, ckptio
    for call in (lambda: ckptio.load_file({locked!r}),
                 lambda: ckptio.save_file({{"w": np.ones(2)}}, {saved!r})):
        try:
            call()
        except PermissionError as e:
            print(e)
"""


def test_messages_say_each_thing_once(tmp_path):
    """The failures of load_file, safe_open and save_file (numpy and torch
    modules) name the file and the cause once each: before, each layer
    repeated the one below ("cannot open P: No such file or directory: P:
    No such file or directory")."""
    good = _save(tmp_path / "good.safetensors")
    raw = good.read_bytes()
    (tmp_path / "truncated.safetensors").write_bytes(raw[:-100])
    flipped = bytearray(raw)
    flipped[-3] ^= 0x10
    (tmp_path / "crc.safetensors").write_bytes(flipped)
    n = int.from_bytes(raw[:8], "little")
    header = raw[8:8 + n].replace(b'"F32"', b'"F33"')
    (tmp_path / "dtype.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + raw[8 + n:])
    (tmp_path / "dir.safetensors").mkdir()
    loads = {"missing": "No such file or directory", "truncated": "file truncated",
             "crc": "checksum mismatch", "dtype": "unknown dtype", "dir": "a directory must hold"}
    for module, framework, tensors in _modules():
        for stem, cause in loads.items():
            path = tmp_path / f"{stem}.safetensors"
            for call in (module.load_file, lambda p: _read_all(module, framework, p)):
                with pytest.raises(ckptio.CkptioError) as info:
                    call(path)
                _said_once(str(info.value), path, cause)
        saves = {tmp_path / "dir.safetensors": "Is a directory",
                 tmp_path / "no" / "m.safetensors": "No such file or directory"}
        for path, cause in saves.items():
            with pytest.raises(ckptio.CkptioError) as info:
                module.save_file(tensors, path)
            _said_once(str(info.value), path, cause)
    bad = tmp_path / "bad.safetensors"
    with pytest.raises(ckptio.CkptioValueError) as info:
        ckptio.save_file({"w": ckptio.Tensor("F33", (2,), b"\0" * 8)}, bad)
    _said_once(str(info.value), bad, "unknown dtype")
    # Permission denied: as root only in a child without the capabilities
    # that override file permissions.
    locked = _save(tmp_path / "locked.safetensors")
    os.chmod(locked, 0)
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    saved = ro / "x.safetensors"
    wrap = None
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("running as root and no setpriv to drop CAP_DAC_OVERRIDE: cannot see EACCES")
        wrap = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
    out = _run_child(_PERMISSION_CHILD.format(locked=str(locked), saved=str(saved)), wrap=wrap)
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and len(lines) == 2, (out.stdout, out.stderr)
    _said_once(lines[0], locked, "Permission denied")
    _said_once(lines[1], saved, "Permission denied")


def test_compose_leaves_out_what_is_said():
    compose = errors._compose
    assert compose("cannot open /a/b", "No such file or directory",
                   "/a/b: No such file or directory") == "cannot open /a/b: No such file or directory"
    # A shorter form of the description in the detail stands for it.
    assert compose("cannot open /a/b", "corrupt zip archive", "/a/b: corrupt zip: no end record") == \
        "cannot open /a/b: corrupt zip: no end record"
    # Not said: kept, in order.
    assert compose("tensor 'w'", "unknown dtype", "") == "tensor 'w': unknown dtype"
    assert compose("cannot save /a/b", "invalid argument", "/a/b/c: x") == \
        "cannot save /a/b: invalid argument: /a/b/c: x"
