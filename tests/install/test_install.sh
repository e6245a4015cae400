#!/usr/bin/env bash
# Installs the build into a temporary prefix, then builds a small program
# outside the project against the installed tree only, both ways a user
# would: CMake's find_package(ckptio) (shared and static) and pkg-config.
# Then builds the library and command with the default options (about 10 s
# of compiling) and checks that they ignore the tests' CKPTIO_FAULT*
# variables, which the suite's own builds obey.
# Usage: test_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
BUILD=$1 SRC=$2
TMP=$(mktemp -d "${CKPTIO_TEST_TMPDIR:-/tmp}/install.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
PREFIX=$TMP/prefix
fail() { echo "test_install: FAIL: $*" >&2; exit 1; }

cmake --install "$BUILD" --prefix "$PREFIX" >"$TMP/install.log" || { cat "$TMP/install.log"; fail "cmake --install"; }
libdir=$(cd "$PREFIX" && ls -d lib*/libckptio.so.1 | xargs dirname)
for f in include/ckptio.h "$libdir/libckptio.a" "$libdir/libckptio.so" "$libdir/libckptio.so.1" bin/ckptio \
         "$libdir/pkgconfig/ckptio.pc" "$libdir/cmake/ckptio/ckptioConfig.cmake" \
         "$libdir/cmake/ckptio/ckptioConfigVersion.cmake" "$libdir/cmake/ckptio/ckptioTargets.cmake"; do
  [[ -e "$PREFIX/$f" ]] || fail "$f is not installed"
done
soname=$(readelf -d "$PREFIX/$libdir/libckptio.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[[ "$soname" == libckptio.so.1 ]] || fail "SONAME is '$soname', want libckptio.so.1"
version=$(env -u LD_LIBRARY_PATH "$PREFIX/bin/ckptio" --version) || fail "the installed ckptio command does not run"
# The command links the shared library and finds the installed one by its
# RPATH ($ORIGIN/../lib), not the build tree's.
deps=$(env -u LD_LIBRARY_PATH ldd "$PREFIX/bin/ckptio")
lib=$(awk '$1 == "libckptio.so.1" && $2 == "=>" {print $3}' <<<"$deps")
[[ -n "$lib" && "$(readlink -f "$lib")" == "$(readlink -f "$PREFIX/$libdir/libckptio.so.1")" ]] ||
  fail "the installed ckptio command does not load $PREFIX/$libdir/libckptio.so.1: $deps"
echo "test_install: installed $version, SONAME $soname"
# Only ckptio_* is exported by the shared library.
exported=$(nm -D --defined-only "$PREFIX/$libdir/libckptio.so" | awk '$2 ~ /[TDB]/ {print $3}')
others=$(grep -v '^ckptio_' <<<"$exported" || true)
[[ -z "$others" ]] || fail "the shared library exports names other than ckptio_*: $others"

# 1. CMake package, against the prefix only (no source or build tree).
cmake -S "$SRC/tests/install/consumer" -B "$TMP/cm" -DCMAKE_PREFIX_PATH="$PREFIX" >"$TMP/cm.log" 2>&1 \
  || { cat "$TMP/cm.log"; fail "find_package(ckptio)"; }
grep -q "found ckptio ${version#ckptio } in $PREFIX" "$TMP/cm.log" || { cat "$TMP/cm.log"; fail "found another ckptio"; }
cmake --build "$TMP/cm" >"$TMP/cmb.log" 2>&1 || { cat "$TMP/cmb.log"; fail "building against ckptio::ckptio"; }
LD_LIBRARY_PATH="$PREFIX/$libdir" "$TMP/cm/consumer_shared" "$TMP/a.safetensors" || fail "consumer_shared"
# (ldd's output is read whole first: grep -q under pipefail would make a
# SIGPIPE'd ldd fail the pipeline now and then.)
deps=$(ldd "$TMP/cm/consumer_static")
[[ "$deps" != *libckptio* ]] || fail "consumer_static links libckptio.so"
"$TMP/cm/consumer_static" "$TMP/b.safetensors" || fail "consumer_static"
deps=$(LD_LIBRARY_PATH="$PREFIX/$libdir" ldd "$TMP/cm/consumer_shared")
[[ "$deps" == *"$PREFIX/$libdir/libckptio.so.1"* ]] || fail "consumer_shared does not load the installed libckptio.so.1"

# 2. pkg-config, shared then static.
export PKG_CONFIG_PATH="$PREFIX/$libdir/pkgconfig"
[[ "$(pkg-config --modversion ckptio)" == "${version#ckptio }" ]] || fail "pkg-config --modversion"
cc -o "$TMP/pc_shared" "$SRC/tests/install/consumer.c" $(pkg-config --cflags --libs ckptio) || fail "pkg-config build"
LD_LIBRARY_PATH="$PREFIX/$libdir" "$TMP/pc_shared" "$TMP/c.safetensors" || fail "pc_shared"
# The static library with its dependencies' shared libraries (the modules
# in ckptio.pc's Requires.private): a fully static link would also need the
# static libraries of hwloc's own dependencies, which Debian does not ship.
cc -o "$TMP/pc_static" "$SRC/tests/install/consumer.c" $(pkg-config --cflags ckptio) "$PREFIX/$libdir/libckptio.a" \
   $(pkg-config --libs $(pkg-config --print-requires-private ckptio)) -lpthread -ldl || fail "static build"
"$TMP/pc_static" "$TMP/d.safetensors" || fail "pc_static"
echo "test_install: 4 consumers built against $PREFIX only and ran"

# 3. The tests' fault injection stays out of what users build: the library
# configured with the default options (as README.md builds an install) must
# ignore CKPTIO_FAULT* variables a process inherits. Every failing form of
# CKPTIO_FAULT is tried (io/fault.h), with a slow disk on top.
fault_specs=(pwrite:1:EIO pwrite:1:short fsync:1:EIO rename:1:EROFS fallocate:1:ENOSPC)
fault_env() { env CKPTIO_FAULT="$1" CKPTIO_FAULT_WRITE_MBPS=1 CKPTIO_FAULT_READ_MBPS=1 "${@:2}"; }
# The control, where the installed build has it compiled in (scripts/build.sh
# turns it on for the suite's builds): the variable must bite there.
if grep -q '^CKPTIO_FAULT_INJECTION:BOOL=ON$' "$BUILD/CMakeCache.txt"; then
  fault_env pwrite:1:EIO env LD_LIBRARY_PATH="$PREFIX/$libdir" "$TMP/pc_shared" "$TMP/e.safetensors" \
      2>/dev/null && fail "control: the test build ignored CKPTIO_FAULT=pwrite:1:EIO"
  echo "test_install: control: the test build's library fails a save under CKPTIO_FAULT=pwrite:1:EIO"
else
  echo "test_install: no control: $BUILD was configured without CKPTIO_FAULT_INJECTION"
fi
# (Debug only because -O0 compiles fastest; every option keeps its default.)
cmake -S "$SRC" -B "$TMP/default" -G Ninja -DCKPTIO_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Debug >"$TMP/default.log" 2>&1 \
  || { cat "$TMP/default.log"; fail "configuring a default-option build"; }
grep -q '^CKPTIO_FAULT_INJECTION:BOOL=OFF$' "$TMP/default/CMakeCache.txt" || fail "CKPTIO_FAULT_INJECTION is not off by default"
cmake --build "$TMP/default" >>"$TMP/default.log" 2>&1 \
  || { tail -n 30 "$TMP/default.log"; fail "building the default-option library"; }
for spec in "${fault_specs[@]}"; do
  fault_env "$spec" env LD_LIBRARY_PATH="$TMP/default" "$TMP/pc_shared" "$TMP/f.safetensors" \
    || fail "the default build's library failed a save under CKPTIO_FAULT=$spec"
  deps=$(LD_LIBRARY_PATH="$TMP/default" ldd "$TMP/pc_shared")
  [[ "$deps" == *"$TMP/default/libckptio.so.1"* ]] || fail "pc_shared did not load the default build's library"
  # The command (linked with the static library) too: a 16 MiB save at
  # 1 MB/s would take 16 s, so a quick one shows it is not slowed either.
  t0=$(date +%s%N)
  fault_env "$spec" "$TMP/default/ckptio" bench --size 16MiB --runs 1 --dir "$TMP" >"$TMP/bench.log" 2>&1 \
    || { cat "$TMP/bench.log"; fail "the default build's ckptio bench failed under CKPTIO_FAULT=$spec"; }
  ms=$((($(date +%s%N) - t0) / 1000000))
  ((ms < 8000)) || fail "the default build's ckptio bench took $ms ms under CKPTIO_FAULT_WRITE_MBPS=1"
done
echo "test_install: the default-option build ignores CKPTIO_FAULT* (${#fault_specs[@]} specs, 1 MB/s disk)"
