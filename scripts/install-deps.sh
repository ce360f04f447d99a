#!/usr/bin/env bash
# Installs the system packages pto's tests need on a fresh Debian/Ubuntu machine: Open MPI (the
# `mpi` feature and `mpirun`), libclang and clang's headers (bindgen in mpi-sys), iproute2 (the
# two-host MPI test creates network namespaces), python3 with venv (the Python package's tests)
# and a C and C++ compiler (the plugin tests). Does nothing when they are present. Needs root or
# sudo to install. The tests call no other program but what every Debian has (sh, mount,
# unshare, setpriv from util-linux); they read /proc themselves rather than call procps.
#
#   bash scripts/install-deps.sh           check, then install what is missing
#   bash scripts/install-deps.sh --check   only print what is missing (exit 1 if anything is)
#
# PTO_DEPS_ROOT (tests only) checks the libclang files under another root folder.
set -euo pipefail

root="${PTO_DEPS_ROOT:-}"

# bindgen (through clang-sys) loads `libclang.so`, `libclang-N.so` or `libclang.so.N`, and
# parses C headers with clang's own builtin headers (stddef.h, stdarg.h...). `libclang-cpp.so.N`
# is a different library (clang's C++ API), and the runtime-only package libclang1 has the
# library but not the headers: neither is enough.
has_libclang() {
  local dirs=() d f
  if [ -n "${LIBCLANG_PATH:-}" ] && [ -z "$root" ]; then
    dirs+=("$LIBCLANG_PATH")
  fi
  for d in "$root"/usr/lib/llvm-*/lib "$root"/usr/lib/*-linux-gnu "$root"/usr/lib "$root"/usr/lib64 "$root"/usr/local/lib; do
    [ -d "$d" ] && dirs+=("$d")
  done
  local lib=""
  for d in "${dirs[@]}"; do
    for f in "$d"/libclang.so "$d"/libclang-[0-9]*.so "$d"/libclang.so.[0-9]* "$d"/libclang-[0-9]*.so.[0-9]*; do
      if [ -e "$f" ]; then lib="$f"; break 2; fi
    done
  done
  [ -n "$lib" ] || return 1
  for f in "$root"/usr/lib/llvm-*/lib/clang/*/include/stddef.h "$root"/usr/lib/clang/*/include/stddef.h \
    "$root"/usr/local/lib/clang/*/include/stddef.h; do
    [ -e "$f" ] && return 0
  done
  return 1
}

missing=()
if [ -n "$root" ]; then
  # Test mode: only the libclang check, against files under $root.
  has_libclang || missing+=(libclang-dev)
else
  command -v mpicc >/dev/null 2>&1 || missing+=(libopenmpi-dev)
  command -v mpirun >/dev/null 2>&1 || missing+=(openmpi-bin)
  has_libclang || missing+=(libclang-dev)
  command -v ip >/dev/null 2>&1 || missing+=(iproute2)
  command -v python3 >/dev/null 2>&1 || missing+=(python3)
  python3 -c "import venv, ensurepip" >/dev/null 2>&1 || missing+=(python3-venv)
  # cc and c++: the plugin tests compile C and C++ plugins.
  { command -v cc && command -v c++; } >/dev/null 2>&1 || missing+=(build-essential)
fi

if [ "${1:-}" = "--check" ]; then
  if [ ${#missing[@]} -eq 0 ]; then
    echo "nothing missing"
    exit 0
  fi
  echo "missing: ${missing[*]}"
  exit 1
fi
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
[ -z "$root" ] || { echo "PTO_DEPS_ROOT is for --check only" >&2; exit 2; }
echo "== installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || {
    echo "need root or sudo to install: ${missing[*]} (install them, then run this again)" >&2
    exit 1
  }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" build-essential pkg-config
if ! has_libclang; then
  echo "libclang-dev is installed but bindgen's libclang.so or clang's headers are still missing" >&2
  exit 1
fi
