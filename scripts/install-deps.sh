#!/usr/bin/env bash
# Installs the system packages pto's tests need on a fresh Debian/Ubuntu machine: Open MPI (the
# `mpi` feature and `mpirun`), libclang (bindgen in mpi-sys), iproute2 (the two-host MPI test
# creates network namespaces), and python3 with venv (the Python package's tests). Does nothing
# when they are present. Needs root or sudo.
set -euo pipefail

missing=()
command -v mpicc >/dev/null 2>&1 || missing+=(libopenmpi-dev)
command -v mpirun >/dev/null 2>&1 || missing+=(openmpi-bin)
ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || ls /usr/lib/*/libclang*.so* >/dev/null 2>&1 || missing+=(libclang-dev)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
python3 -c "import venv, ensurepip" >/dev/null 2>&1 || missing+=(python3-venv)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "== installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "need root to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" build-essential pkg-config
