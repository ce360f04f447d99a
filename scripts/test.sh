#!/usr/bin/env bash
# The README's test command: installs what the tests need, then runs every test.
# Runs on a fresh machine with the Rust toolchain present (Debian/Ubuntu for the system packages).
set -euo pipefail
cd "$(dirname "$0")/.."

# Open MPI, libclang and iproute2 (the mpi backend's tests), python3 with venv (the Python package).
bash scripts/install-deps.sh
echo "== install-deps.sh: its libclang check on fake machines"
bash scripts/tests/install-deps-check.sh

# Every test runs on a build with the mpi backend enabled (it changes nothing for the other
# backends); the default build (no MPI) is built by the main job and linted by CI.
FEATURES="pto-comm/mpi,pto-cli/mpi"

if ! command -v cargo-nextest >/dev/null 2>&1; then
  echo "== installing cargo-nextest"
  cargo install --locked cargo-nextest
fi

# The two-host MPI test creates network namespaces, which needs root and a system that allows
# them (a plain chroot whose / is not a mount point does not); elsewhere it is skipped, and said
# so here (CI runs as root on a full machine).
if [ -z "${PTO_SKIP_TWO_HOSTS:-}" ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "note: not root: the two-host MPI test (network namespaces) is SKIPPED in this run" >&2
    export PTO_SKIP_TWO_HOSTS=1
  else
    probe="pto_probe_$$"
    if ! why=$(ip netns add "$probe" 2>&1); then
      echo "note: network namespaces cannot be made here ($why): the two-host MPI test is SKIPPED in this run" >&2
      export PTO_SKIP_TWO_HOSTS=1
    else
      ip netns del "$probe"
    fi
  fi
fi

echo "== unit, integration and property tests (nextest)"
cargo nextest run --workspace --profile ci --features "$FEATURES"

echo "== documentation examples"
cargo test --workspace --doc --quiet --features "$FEATURES"

echo "== Python package: pip install ./python (into a fresh venv) and its pytest suite"
venv=target/py-venv
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
# maturin builds the extension with cargo; keep its artifacts in this repository's target/.
CARGO_TARGET_DIR="$PWD/target/pto-py" "$venv/bin/python" -m pip install -q "./python[test,simpler]"
# Run from the repository root, so that the installed package (not python/pto) is imported.
"$venv/bin/python" -m pytest -q python/tests

echo "== no stale shared-memory segments left behind"
# A segment is named /pto.<creator pid>.<...>. One whose creator is gone was left behind. Another
# program's live segments (a second copy of this suite, a pto run) are not ours to judge, and a
# test elsewhere may leave a dead creator's segment for a moment on purpose (it sweeps it at
# once): only what is still there a few seconds later counts.
stale() {
  for f in /dev/shm/pto.*; do
    [ -e "$f" ] || continue
    pid=${f#/dev/shm/pto.}
    pid=${pid%%.*}
    case $pid in '' | *[!0-9]*) continue ;; esac
    [ -d "/proc/$pid" ] || echo "${f#/dev/shm/}"
  done
}
if [ -n "$(stale)" ]; then
  sleep 5
  left=$(stale)
  if [ -n "$left" ]; then
    echo "$left" >&2
    echo "tests left pto segments in /dev/shm (their creator is gone)" >&2
    exit 1
  fi
fi
