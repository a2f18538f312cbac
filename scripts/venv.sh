#!/usr/bin/env bash
# Sourced by the scripts: ensure_venv makes or refreshes the project's Python environment (.venv)
# from python/requirements.txt (every version pinned) and points $PY at its interpreter.
#
# Why a venv of Debian's Python 3.11: the CPU build of torch 2.13.0 the requirements pin is a
# CPython 3.11 wheel, and Debian's python3.11-dev gives CMake the headers to build the extension
# for that interpreter. SKETCHSGD_BASE_PYTHON picks another 3.11 interpreter. The build tree's
# package (build/default/python) and the folders examples/, scripts/ and benchmarks/ (whose
# modules import each other) are put on the venv's path by a .pth file, so every script runs as
# `.venv/bin/python script.py` with no PYTHONPATH.
# pip install into the venv, quiet but for errors (the machine's pip configuration names index
# folders that do not exist, and pip warns about each one).
_pip() {
  local venv=$1
  shift
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 |
    { grep -v "is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"
}

ensure_venv() {
  local root base stamp want
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  VENV=${SKETCHSGD_VENV:-$root/.venv}
  base=${SKETCHSGD_BASE_PYTHON:-/usr/bin/python3.11}
  if [ ! -x "$VENV/bin/python" ]; then
    "$base" -c 'import venv, ensurepip' 2>/dev/null || ensure_packages python3.11-venv python3.11-dev
    echo "== making the Python environment $VENV ($base)"
    "$base" -m venv "$VENV" || { echo "could not make $VENV with $base" >&2; return 1; }
  fi
  stamp=$VENV/.requirements.sha256
  want=$(sha256sum "$root/python/requirements.txt" | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "== installing python/requirements.txt into $VENV"
    _pip "$VENV" -r "$root/python/requirements.txt" || { echo "pip could not install python/requirements.txt" >&2; return 1; }
    echo "$want" >"$stamp"
  fi
  # The CUDA build links cuBLAS; a toolkit without it (nvcc alone) takes NVIDIA's wheel.
  if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
    local cuda=${CUDA_HOME:-/usr/local/cuda}
    if ! ls "$cuda"/lib64/libcublas.so* "$cuda"/targets/*/lib/libcublas.so* >/dev/null 2>&1 &&
       ! "$VENV/bin/python" -m pip show -q nvidia-cublas >/dev/null 2>&1; then
      echo "== the CUDA toolkit has no cuBLAS: installing python/requirements-cuda.txt into $VENV"
      _pip "$VENV" -r "$root/python/requirements-cuda.txt" \
        || { echo "pip could not install python/requirements-cuda.txt" >&2; return 1; }
    fi
  fi
  "$VENV/bin/python" - "$root/build/default/python" "$root/examples" "$root/scripts" "$root/benchmarks" <<'PY'
import os, site, sys
pth = os.path.join(site.getsitepackages()[0], "sketchsgd-build.pth")
open(pth, "w").write("".join(p + "\n" for p in sys.argv[1:]))
PY
  PY=$VENV/bin/python
  export PY
}

# Run as a command (bash scripts/venv.sh): make or refresh .venv now.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  source "$(dirname "$0")/packages.sh"
  ensure_venv
  echo "$PY"
fi
