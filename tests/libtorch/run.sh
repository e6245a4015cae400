#!/usr/bin/env bash
# Installs the build into a temporary prefix, builds the libtorch adapter
# test and example against it and the venv's libtorch, runs both.
# Usage: run.sh BUILD_DIR SOURCE_DIR PYTHON. Exits 77 (skip) without torch.
set -euo pipefail
BUILD=$1 SRC=$2 PY=$3
TORCH_PREFIX=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null) || {
  echo "SKIP: torch is not installed in $PY (scripts/setup.sh installs it)"; exit 77; }
TMP=$(mktemp -d "${CKPTIO_TEST_TMPDIR:-/tmp}/libtorch.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
cmake --install "$BUILD" --prefix "$TMP/prefix" >/dev/null
# libtorch's CMake package looks for the CUDA toolkit of a CUDA wheel; the
# adapter itself needs none of it.
cmake -S "$SRC/tests/libtorch" -B "$TMP/b" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$TMP/prefix;$TORCH_PREFIX" >"$TMP/configure.log" 2>&1 \
  || { tail -40 "$TMP/configure.log"; echo "FAIL: configuring against libtorch"; exit 1; }
cmake --build "$TMP/b" -j2 >"$TMP/build.log" 2>&1 || { tail -40 "$TMP/build.log"; echo "FAIL: build"; exit 1; }
export LD_LIBRARY_PATH="$TMP/prefix/lib:${LD_LIBRARY_PATH:-}"
export CKPTIO_TEST_TMPDIR="$TMP"
"$TMP/b/test_torch_adapter"
"$TMP/b/train" "$TMP" 200 50
# What the adapter wrote opens in the real torch and safetensors packages.
"$PY" - "$TMP" <<'PYEOF'
import sys, torch, safetensors.torch
d = sys.argv[1]
net = torch.load(f"{d}/libtorch_net.pt", weights_only=True)
assert net["fc1.weight"].shape == (16, 8) and "bn.running_mean" in net, sorted(net)
st = safetensors.torch.load_file(f"{d}/libtorch_all.safetensors")
assert len(st) == 19 and st["t_BFloat16"].dtype == torch.bfloat16 and st["transposed"].shape == (3, 6), st.keys()
print("ok: torch.load and safetensors open what the adapter wrote")
PYEOF
