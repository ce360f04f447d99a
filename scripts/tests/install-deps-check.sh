#!/usr/bin/env bash
# Checks install-deps.sh's libclang test against fake system roots: a machine with only
# libclang-cpp (clang's C++ library) or only the runtime libclang1 (no headers) must be told to
# install libclang-dev; one with libclang.so and clang's headers must not.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT

expect() { # expect <want: missing|ok> <case>
  local out
  if out=$(PTO_DEPS_ROOT="$root/$2" bash "$here/install-deps.sh" --check); then
    [ "$1" = ok ] || { echo "FAIL $2: expected libclang-dev missing, got: $out" >&2; exit 1; }
  else
    [ "$1" = missing ] && [[ "$out" == *libclang-dev* ]] || { echo "FAIL $2: got: $out" >&2; exit 1; }
  fi
  echo "ok   $2 ($out)"
}

# Only libclang-cpp, as on a fresh Debian 12 machine of this kind.
mkdir -p "$root/cpp-only/usr/lib/llvm-14/lib"
touch "$root/cpp-only/usr/lib/llvm-14/lib/libclang-cpp.so.14"
expect missing cpp-only

# The runtime package libclang1-14: the library but not clang's headers.
mkdir -p "$root/runtime/usr/lib/llvm-14/lib" "$root/runtime/usr/lib/x86_64-linux-gnu"
touch "$root/runtime/usr/lib/llvm-14/lib/libclang.so.1" "$root/runtime/usr/lib/x86_64-linux-gnu/libclang-14.so.1"
expect missing runtime

# Nothing at all.
mkdir -p "$root/empty"
expect missing empty

# libclang-dev: libclang.so and the builtin headers.
mkdir -p "$root/dev/usr/lib/llvm-14/lib/clang/14.0.6/include"
touch "$root/dev/usr/lib/llvm-14/lib/libclang.so" "$root/dev/usr/lib/llvm-14/lib/libclang-14.so.1" \
  "$root/dev/usr/lib/llvm-14/lib/clang/14.0.6/include/stddef.h"
expect ok dev
