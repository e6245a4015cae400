#!/usr/bin/env bash
# The Python wheel as a user gets it: pip builds it from this checkout
# (pyproject.toml, scikit-build-core, CMake), a fresh venv without the
# project's packages installs it, and there, with no CKPTIO_LIB and no
# PYTHONPATH, `import ckptio` saves, loads and verifies a file with the
# library inside the package, and the `ckptio` command inspects and verifies
# it. Exit 77 (skip) when the build needs or numpy cannot be had.
# Usage: test_wheel.sh <project venv python> <scratch dir>
set -u

PY="${1:?usage: test_wheel.sh <python> <scratch dir>}"
TMP="${2:?usage: test_wheel.sh <python> <scratch dir>}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# Whatever the caller's shell points at must not help the installed package.
unset CKPTIO_LIB PYTHONPATH PYTHONHOME CKPTIO_ABI_LAYOUT

skip() { echo "SKIP wheel: $*"; exit 77; }
fail() { echo "FAIL wheel: $*"; exit 1; }
t0=$SECONDS
step() { echo "wheel: [$((SECONDS - t0)) s] $*"; }

[[ -x "$PY" ]] || skip "no Python venv at $PY; run scripts/setup.sh to create it"
# --no-build-isolation builds offline with the venv's backend, so it must be there.
"$PY" -c "import scikit_build_core" 2>/dev/null ||
  skip "the venv at $PY cannot import scikit_build_core; run scripts/setup.sh"
numpy_version="$("$PY" -c 'import numpy; print(numpy.__version__)' 2>/dev/null)" ||
  skip "the venv at $PY cannot import numpy; run scripts/setup.sh"

rm -rf "$TMP" && mkdir -p "$TMP/dist" "$TMP/work" || fail "cannot make $TMP"

step "pip wheel $ROOT"
"$PY" -m pip wheel --no-build-isolation --no-deps --disable-pip-version-check -q \
      -w "$TMP/dist" "$ROOT" > "$TMP/pip-wheel.log" 2>&1 ||
  { tail -n 40 "$TMP/pip-wheel.log"; fail "pip wheel failed (log above)"; }
wheels=("$TMP"/dist/ckptio-*.whl)
[[ ${#wheels[@]} == 1 && -f "${wheels[0]}" ]] || fail "expected one ckptio wheel in $TMP/dist"
WHEEL="${wheels[0]}"
step "built $(basename "$WHEEL") ($(stat -c %s "$WHEEL") bytes)"

# The wheel holds the package with the library and the program in it, and
# nothing from the tree that is not the package.
"$PY" - "$WHEEL" <<'EOF' || fail "the wheel's contents are wrong"
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = {"ckptio/__init__.py", "ckptio/torch.py", "ckptio/_lib.py", "ckptio/_cli.py",
        "ckptio/libckptio.so", "ckptio/_bin/ckptio"}
missing = need - names
stray = [n for n in names if not n.startswith(("ckptio/", "ckptio-")) or "__pycache__" in n]
print("wheel: contents:", " ".join(sorted(names)))
if missing or stray:
    sys.exit(f"missing {sorted(missing)}, stray {sorted(stray)}")
EOF

VENV="$TMP/venv"
step "python -m venv $VENV (no system site packages)"
"$PY" -m venv "$VENV" || fail "python -m venv failed"
VPY="$VENV/bin/python"
"$VPY" -c "import numpy" 2>/dev/null && fail "the fresh venv already has numpy: it is not clean"

# The wheel itself installs offline (--no-deps); its one dependency, numpy,
# comes from the registry or pip's cache: the same version as the project's
# venv, so that a warm cache serves it.
step "pip install the wheel"
"$VPY" -m pip install -q --disable-pip-version-check --no-deps "$WHEEL" ||
  fail "pip install $WHEEL failed"
step "pip install numpy==$numpy_version"
if ! out="$("$VPY" -m pip install -q --disable-pip-version-check "numpy==$numpy_version" 2>&1)"; then
  echo "$out" | tail -n 5
  skip "numpy $numpy_version cannot be installed into a fresh venv (no registry and not in pip's cache)"
fi
"$VPY" -m pip check --disable-pip-version-check || fail "pip check: the wheel's dependencies are not met"

# Run from a directory with no ckptio in it, so only the installed one imports.
cd "$TMP/work" || fail "cd $TMP/work"
step "save / load / verify in the fresh venv"
"$VPY" - "$VENV" "$TMP/work" <<'EOF' || fail "the round trip in the fresh venv failed"
import importlib.metadata, os, pathlib, sys
import numpy as np
import ckptio
from ckptio import _lib

venv, work = (pathlib.Path(p).resolve() for p in sys.argv[1:3])
assert "CKPTIO_LIB" not in os.environ and "PYTHONPATH" not in os.environ
pkg = pathlib.Path(ckptio.__file__).resolve().parent
assert venv in pkg.parents, f"ckptio imported from {pkg}, not from {venv}"
lib = pathlib.Path(_lib.lib()._name).resolve()
assert lib == pkg / "libckptio.so", f"the library loaded is {lib}, not the package's"
version = _lib.lib().ckptio_version_string().decode()
assert importlib.metadata.version("ckptio") == version, (importlib.metadata.version("ckptio"), version)
print(f"wheel: ckptio {version} from {pkg}, library {lib}")

rng = np.random.default_rng(14)
tensors = {"w": rng.standard_normal((64, 33), dtype=np.float32),
           "b": np.arange(-5, 5, dtype=np.int64),
           "flag": np.array([True, False, True])}
path = work / "m.safetensors"
ckptio.save_file(tensors, path, metadata={"step": "7"})
for mmap in (True, False):
    back = ckptio.load_file(path, mmap=mmap)
    assert sorted(back) == sorted(tensors), sorted(back)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and np.array_equal(back[name], t), name
assert ckptio.load_metadata(path)["step"] == "7"
ckptio.verify(path)

# A flipped byte in the tensor data is caught by the CRC.
bad = work / "bad.safetensors"
raw = bytearray(path.read_bytes())
raw[-1] ^= 0x40
bad.write_bytes(raw)
try:
    ckptio.verify(bad)
except ckptio.CkptioError as e:
    assert e.code == ckptio.E_CHECKSUM, e
else:
    raise AssertionError("verify passed a flipped byte")
print("wheel: save / load / verify round trip OK")
EOF

step "the ckptio command"
CLI="$VENV/bin/ckptio"
[[ -x "$CLI" ]] || fail "pip did not install $CLI"
"$CLI" --version || fail "ckptio --version failed"
out="$("$CLI" inspect m.safetensors)" || { echo "$out"; fail "ckptio inspect failed"; }
echo "$out"
for want in "format       safetensors" "step = 7" $'\nw ' $'\nb ' $'\nflag '; do
  [[ "$out" == *"$want"* ]] || fail "ckptio inspect does not show '${want#$'\n'}'"
done
"$CLI" verify m.safetensors || fail "ckptio verify of an intact file failed"
"$CLI" verify bad.safetensors
rc=$?
((rc == 1)) || fail "ckptio verify of a flipped file exited $rc, not 1"

# The wheel is a production build (pyproject.toml leaves CMake's
# CKPTIO_FAULT_INJECTION off): the tests' fault variables, inherited, must
# neither fail nor slow a save (a 1 MB/s disk would make this 8 MB one take
# 8 s). A test build of the library fails the first pwrite here.
step "CKPTIO_FAULT* set: the wheel's library ignores them"
for spec in pwrite:1:EIO fsync:1:EIO rename:1:EROFS; do
  CKPTIO_FAULT="$spec" CKPTIO_FAULT_WRITE_MBPS=1 CKPTIO_FAULT_READ_MBPS=1 "$VPY" - "$TMP/work" <<'EOF' ||
import pathlib, sys, time
import numpy as np
import ckptio
path = pathlib.Path(sys.argv[1]) / "fault.safetensors"
t = {"w": np.arange(2 << 20, dtype=np.float32)}
t0 = time.monotonic()
ckptio.save_file(t, path)
assert np.array_equal(ckptio.load_file(path)["w"], t["w"])
took = time.monotonic() - t0
assert took < 4, f"a save and load of 8 MB took {took:.1f} s under CKPTIO_FAULT_WRITE_MBPS=1"
EOF
    fail "the wheel's library obeyed CKPTIO_FAULT=$spec or the slow disk"
done

step "done"
echo "wheel: OK"
