"""ckptio against the real safetensors and numpy packages: files ckptio writes
open in safetensors with the same values, files safetensors writes load in
ckptio identically, and ckptio's CRCs catch what safetensors cannot see.
Run by ctest (label interop) through run_pytest.sh with the project's venv."""

import ctypes
import json
import os
import pathlib
import re
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
import safetensors
import safetensors.numpy
from safetensors import safe_open

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
import ckptio  # noqa: E402
import library_version  # noqa: E402 - tests/interop's own

RAW_DTYPES = ["BF16", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ",
              "F4", "F6_E2M3", "F6_E3M2"]

USER_METADATA = {
    "framework": "ckptio-interop-test",
    "step": "1234",
    "unicode": "grüße ✓ 模型",
    "escapes": 'line1\nline2 "quoted" back\\slash\ttab',
}


# ------------------------------------------------------------ fixtures

def numpy_tensors():
    """Every dtype numpy can represent, plus 0-d, empty and odd sizes, and a
    tensor larger than one pipeline chunk with an odd tail."""
    rng = np.random.default_rng(20240917)
    t = {}
    t["bool"] = rng.integers(0, 2, (3, 5)).astype(np.bool_)
    t["u8"] = rng.integers(0, 256, (7,), dtype=np.uint8)
    t["i8"] = rng.integers(-128, 128, (2, 3, 5), dtype=np.int8)
    t["i16"] = rng.integers(-2**15, 2**15, (4, 3), dtype=np.int16)
    t["u16"] = rng.integers(0, 2**16, (5,), dtype=np.uint16)
    t["f16"] = rng.standard_normal((3, 5)).astype(np.float16)
    t["i32"] = rng.integers(-2**31, 2**31, (2, 2, 2), dtype=np.int32)
    t["u32"] = rng.integers(0, 2**32, (9,), dtype=np.uint32)
    t["f32"] = np.array([0.0, -0.0, 1.5, np.inf, -np.inf, np.nan, 1e-45, 3.4e38],
                        dtype=np.float32)
    t["f64"] = rng.standard_normal((3, 1, 4))
    t["i64"] = np.array([np.iinfo(np.int64).min, -1, 0, np.iinfo(np.int64).max], np.int64)
    t["u64"] = np.array([0, 1, np.iinfo(np.uint64).max], np.uint64)
    t["c64"] = (rng.standard_normal(5) + 1j * rng.standard_normal(5)).astype(np.complex64)
    t["scalar_f32"] = np.array(3.25, dtype=np.float32)
    t["scalar_bool"] = np.array(True)
    t["empty_f32"] = np.zeros((0,), np.float32)
    t["empty_3d_i16"] = np.zeros((3, 0, 2), np.int16)
    t["odd_u8"] = np.array([42], np.uint8)
    t["layers.0.attn/q_proj.weight"] = rng.standard_normal((3, 7)).astype(np.float32)
    t["ünï cöde \"name\" \\"] = np.arange(3, dtype=np.int32)
    # 9 MiB + 4 bytes: more than one default 8 MiB chunk, ending off-page.
    t["big_f32"] = rng.standard_normal(9 * 262144 + 1).astype(np.float32)
    return t


def raw_tensors():
    """Tensors of the dtypes numpy lacks, as raw bytes."""
    rng = np.random.default_rng(7)
    t = {}
    f32 = rng.standard_normal((4, 6)).astype(np.float32)
    bf16 = (f32.view(np.uint32) >> 16).astype(np.uint16)  # truncation is a valid bf16
    t["bf16"] = ckptio.Tensor("BF16", (4, 6), bf16.tobytes())
    t["bf16_scalar"] = ckptio.Tensor("BF16", (), b"\x80\x3f")
    t["bf16_empty"] = ckptio.Tensor("BF16", (0, 4), b"")
    for dt in ["F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ"]:
        t[dt.lower()] = ckptio.Tensor(dt, (3, 7), rng.integers(0, 256, 21, np.uint8).tobytes())
    t["f4"] = ckptio.Tensor("F4", (5, 2), bytearray(rng.integers(0, 256, 5, np.uint8)))
    t["f6_e2m3"] = ckptio.Tensor("F6_E2M3", (4,), rng.integers(0, 256, 3, np.uint8))
    t["f6_e3m2"] = ckptio.Tensor("F6_E3M2", (2, 4), memoryview(bytes(range(6))))
    return t


def expected_bytes(value):
    if isinstance(value, ckptio.Tensor):
        return value.tobytes()
    return np.ascontiguousarray(value).tobytes()


def expected_dtype(value):
    if isinstance(value, ckptio.Tensor):
        return value.dtype
    for name, dt in ckptio.NUMPY_DTYPES.items():
        if value.dtype == dt:
            return name
    raise AssertionError(value.dtype)


def expected_shape(value):
    return list(value.shape)


def assert_same(got, want, name):
    """Bit-identical: dtype, shape and every byte (NaN included)."""
    if isinstance(want, ckptio.Tensor):
        assert isinstance(got, ckptio.Tensor), name
        assert got.dtype == want.dtype, name
        assert got.shape == want.shape, name
        assert got.tobytes() == want.tobytes(), name
    else:
        assert isinstance(got, np.ndarray), (name, type(got))
        assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
        assert got.shape == want.shape, (name, got.shape, want.shape)
        assert got.tobytes() == want.tobytes(), name


def read_raw(path):
    """The file's bytes, the data start and the header JSON, parsed here
    without either library."""
    raw = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    return raw, 8 + n, header


def write_raw_safetensors(path, tensors, metadata=None):
    """A minimal spec-following safetensors writer (8-aligned data, as the
    reference writes), for dtypes the safetensors Python API cannot write."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    data = b""
    for name, t in tensors.items():
        b = expected_bytes(t)
        header[name] = {"dtype": expected_dtype(t), "shape": expected_shape(t),
                        "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    js = json.dumps(header, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)
    pathlib.Path(path).write_bytes(struct.pack("<Q", len(js)) + js + data)


# ------------------------------------------------------------ (a) ckptio -> safetensors

def test_ckptio_file_opens_in_safetensors(tmp_path):
    tensors = {**numpy_tensors(), **raw_tensors()}
    path = tmp_path / "ckptio.safetensors"
    ckptio.save_file(tensors, path, metadata=USER_METADATA)

    raw, data_start, header = read_raw(path)
    # Our layout promises: JSON padded with spaces to a 4096-aligned data start.
    assert data_start % 4096 == 0, data_start
    assert raw[8:9] == b"{" and raw[8:data_start].rstrip(b" ").endswith(b"}")
    assert len(raw) == data_start + sum(len(expected_bytes(v)) for v in tensors.values())

    meta = header["__metadata__"]
    for k, v in USER_METADATA.items():
        assert meta[k] == v, k
    assert "ckptio.version" in meta
    for name, value in tensors.items():
        entry = header[name]
        assert entry["dtype"] == expected_dtype(value), name
        assert entry["shape"] == expected_shape(value), name
        begin, end = entry["data_offsets"]
        want = expected_bytes(value)
        assert raw[data_start + begin:data_start + end] == want, name
        crc = meta["ckptio.crc32." + name]
        assert len(crc) == 8 and int(crc, 16) == zlib.crc32(want), name
    assert set(header) - {"__metadata__"} == set(tensors)
    assert {k for k in meta if k.startswith("ckptio.crc32.")} == \
           {"ckptio.crc32." + n for n in tensors}

    with safe_open(str(path), framework="numpy") as f:
        assert f.metadata() == meta
        assert set(f.keys()) == set(tensors)
        for name, value in tensors.items():
            sl = f.get_slice(name)
            assert sl.get_dtype() == expected_dtype(value), name
            assert sl.get_shape() == expected_shape(value), name
            if not isinstance(value, ckptio.Tensor):
                assert_same(f.get_tensor(name), value, name)

    # And ckptio reads its own file back identically.
    back = ckptio.load_file(path)
    assert set(back) == set(tensors)
    for name, value in tensors.items():
        assert_same(back[name], value, name)
    back_meta = ckptio.load_metadata(path)
    back_meta.pop("ckptio.version", None)
    assert back_meta == USER_METADATA
    assert ckptio.verify(path) == 0


def test_ckptio_numpy_file_loads_with_safetensors_numpy(tmp_path):
    tensors = numpy_tensors()
    path = tmp_path / "np.safetensors"
    ckptio.save_file(tensors, path, metadata={"k": "v"})
    loaded = safetensors.numpy.load_file(str(path))
    assert set(loaded) == set(tensors)
    for name, value in tensors.items():
        assert_same(loaded[name], value, name)


def test_ckptio_without_crc_writes_no_crc_keys(tmp_path):
    tensors = numpy_tensors()
    path = tmp_path / "nocrc.safetensors"
    ckptio.save_file(tensors, path, metadata={"k": "v"}, crc=False)
    _, _, header = read_raw(path)
    meta = header.get("__metadata__", {})
    assert meta.get("k") == "v"
    assert not [k for k in meta if k.startswith("ckptio.crc32.")]
    assert ckptio.verify(path) == len(tensors)
    for name, value in safetensors.numpy.load_file(str(path)).items():
        assert_same(value, tensors[name], name)


def test_ckptio_rejects_bad_tensors(tmp_path):
    path = tmp_path / "bad.safetensors"
    with pytest.raises(ckptio.CkptioError) as e:  # 3 x 4 bits is not whole bytes
        ckptio.save_file({"f4": ckptio.Tensor("F4", (3,), b"\x00\x00")}, path)
    assert e.value.code == ckptio.ERRORS["MISALIGNED"], e.value
    with pytest.raises(ValueError):  # buffer shorter than the shape says
        ckptio.save_file({"bf": ckptio.Tensor("BF16", (4,), b"\x00" * 6)}, path)
    with pytest.raises(ckptio.CkptioError) as e:
        ckptio.save_file({"x": ckptio.Tensor("BF17", (1,), b"\x00\x00")}, path)
    assert e.value.code == ckptio.ERRORS["DTYPE"], e.value
    assert not path.exists()
    assert os.listdir(tmp_path) == []  # no temp file left behind


# ------------------------------------------------------------ (b) safetensors -> ckptio

def test_safetensors_numpy_file_loads_in_ckptio(tmp_path):
    tensors = numpy_tensors()
    path = tmp_path / "st.safetensors"
    safetensors.numpy.save_file(tensors, str(path), metadata=USER_METADATA)
    loaded = ckptio.load_file(path)
    assert set(loaded) == set(tensors)
    for name, value in tensors.items():
        assert_same(loaded[name], value, name)
    assert ckptio.load_metadata(path) == USER_METADATA


def test_raw_dtype_file_loads_in_ckptio(tmp_path):
    tensors = {**raw_tensors(), "f32": np.arange(5, dtype=np.float32)}
    path = tmp_path / "raw.safetensors"
    write_raw_safetensors(path, tensors, metadata={"k": "v"})
    with safe_open(str(path), framework="numpy") as f:  # the reference accepts it
        assert set(f.keys()) == set(tensors)
    loaded = ckptio.load_file(path)
    assert set(loaded) == set(tensors)
    for name, value in tensors.items():
        assert_same(loaded[name], value, name)


# ------------------------------------------------------------ (c) no CRC keys

def test_safetensors_file_without_crc_verifies_unchecked(tmp_path):
    tensors = numpy_tensors()
    with_meta = tmp_path / "meta.safetensors"
    safetensors.numpy.save_file(tensors, str(with_meta), metadata={"format": "np"})
    assert ckptio.verify(with_meta) == len(tensors)
    no_meta = tmp_path / "nometa.safetensors"
    safetensors.numpy.save_file(tensors, str(no_meta))
    assert ckptio.verify(no_meta) == len(tensors)
    assert ckptio.load_metadata(no_meta) == {}


# ------------------------------------------------------------ (d) corruption

def test_corrupted_byte_fails_checksum_in_ckptio_only(tmp_path):
    tensors = numpy_tensors()
    path = tmp_path / "corrupt.safetensors"
    ckptio.save_file(tensors, path)
    raw, data_start, header = read_raw(path)
    victim = "f64"
    begin, end = header[victim]["data_offsets"]
    pos = data_start + (begin + end) // 2
    bad = bytearray(raw)
    bad[pos] ^= 0x01
    path.write_bytes(bytes(bad))

    with pytest.raises(ckptio.CkptioError) as e:
        ckptio.verify(path)
    assert e.value.code == ckptio.E_CHECKSUM
    assert "checksum" in str(e.value).lower() and victim in str(e.value), str(e.value)
    with pytest.raises(ckptio.CkptioError) as e:
        ckptio.load_file(path)
    assert e.value.code == ckptio.E_CHECKSUM
    assert "checksum" in str(e.value).lower() and victim in str(e.value), str(e.value)

    # Without CRC checks the (corrupted) bytes load as they are.
    loaded = ckptio.load_file(path, crc=False)
    assert loaded[victim].tobytes() != tensors[victim].tobytes()
    assert_same(loaded["f32"], tensors["f32"], "f32")

    # safetensors has no checksums: it opens the file and returns the bad value.
    with safe_open(str(path), framework="numpy") as f:
        got = f.get_tensor(victim)
    assert got.tobytes() == bytes(bad[data_start + begin:data_start + end])
    assert got.tobytes() != tensors[victim].tobytes()


def test_truncated_file_fails_in_both(tmp_path):
    path = tmp_path / "trunc.safetensors"
    ckptio.save_file(numpy_tensors(), path)
    raw = path.read_bytes()
    path.write_bytes(raw[:-1])
    with pytest.raises(ckptio.CkptioError) as e:
        ckptio.load_file(path)
    assert e.value.code == ckptio.ERRORS["INCOMPLETE_BUFFER"], e.value
    with pytest.raises(Exception):
        with safe_open(str(path), framework="numpy") as f:
            f.keys()


def test_binding_matches_header_layout():
    # ctest builds tests/interop/abi_layout.c: the header as the compiler sees it.
    exe = os.environ.get("CKPTIO_ABI_LAYOUT")
    if not exe:
        pytest.skip("CKPTIO_ABI_LAYOUT not set: run through ctest")
    layout = json.loads(subprocess.run([exe], check=True, capture_output=True,
                                       text=True).stdout)
    lib = ckptio._lib
    structs = {"ckptio_tensor": lib.Tensor_, "ckptio_tensor_info": lib.TensorInfo,
               "ckptio_options": lib.Options, "ckptio_load_request": lib.LoadRequest,
               "ckptio_slice_request": lib.SliceRequest, "ckptio_byte_range": lib.ByteRange,
               "ckptio_stats": lib.Stats, "ckptio_box_request": lib.BoxRequest, "ckptio_comm": lib.Comm}
    for cname, cls in structs.items():
        assert ctypes.sizeof(cls) == layout["sizeof"][cname], cname
        c_fields = {k.split(".", 1)[1]: v for k, v in layout["fields"].items()
                    if k.startswith(cname + ".")}
        assert [f[0] for f in cls._fields_] == list(c_fields), cname
        for name, (offset, size) in c_fields.items():
            field = getattr(cls, name)
            assert (field.offset, field.size) == (offset, size), f"{cname}.{name}"
    init = lib.Options.init()
    assert [getattr(init, f[0]) for f in lib.Options._fields_] == layout["options_init"]
    const = layout["constants"]
    assert const["CKPTIO_MAX_DIMS"] == lib.MAX_DIMS
    assert const["CKPTIO_DEVICE_HOST"] == lib.DEVICE_HOST
    assert const["CKPTIO_AUTO"] == lib.AUTO
    assert const["CKPTIO_FORMAT_SAFETENSORS"] == lib.FORMAT_SAFETENSORS
    assert const["CKPTIO_FORMAT_PYTORCH"] == lib.FORMAT_PYTORCH
    assert const["CKPTIO_E_INVALID_ARG"] == ckptio.ERRORS["INVALID_ARG"]
    assert const["CKPTIO_E_CHECKSUM"] == ckptio.E_CHECKSUM
    assert const["CKPTIO_E_ERROR_MIN"] == min(ckptio.ERRORS.values())
    # Every code of enum ckptio_error, by name, as the header spells it.
    header = (pathlib.Path(__file__).resolve().parents[2] / "include" / "ckptio.h").read_text()
    enum = header[header.index("typedef enum ckptio_error"):]
    enum = enum[:enum.index("} ckptio_error;")]
    codes = {m[1]: int(m[2]) for m in re.finditer(r"CKPTIO_E_(\w+) = (-\d+)", enum)}
    assert codes == ckptio.ERRORS


def test_binding_error_codes_match_library():
    # The binding's copy of enum ckptio_error must name what the library names.
    strerror = ckptio._lib.lib().ckptio_strerror
    for name, code in ckptio.ERRORS.items():
        assert strerror(code).decode() != "unknown error", name
    assert "checksum" in strerror(ckptio.E_CHECKSUM).decode().lower()
    assert "dtype" in strerror(ckptio.ERRORS["DTYPE"]).decode().lower()
    assert "not found" in strerror(ckptio.ERRORS["NOT_FOUND"]).decode().lower()
    assert strerror(min(ckptio.ERRORS.values()) - 1).decode() == "unknown error"


def test_versions_reported():
    # The library's version: that of this tree (it asserts so), not of
    # another build or an installed copy.
    version = library_version.checked_library_version()
    # Printed with -rA / -s: which real packages this run was judged against.
    print(f"numpy {np.__version__} safetensors {safetensors.__version__} ckptio {version}")
