#!/usr/bin/env bash
# Runs every test cairn has: `cargo fmt --check`, `cargo clippy -D warnings`,
# `cargo test --workspace`, then the
# interop tests in tests/interop/ that drive the real tools (nbdinfo, nbdcopy, nbdsh, qemu-img, fio,
# nbdfuse + loop + mkfs) against `cairn serve`.
#
# Usage: scripts/test.sh [TOPIC...]     e.g. scripts/test.sh nbdinfo badreq
#   With TOPICs, runs only those interop scripts (and skips fmt, clippy and cargo test).
#   CI=true: a missing tool fails its test instead of skipping it.
#   SKIP_CARGO_TEST=1: interop tests only (no fmt or clippy either).
#
# Installs missing system packages first (scripts/install-deps.sh, needs root or sudo).
# Ends with one line "interop: N passed, N failed[, N skipped]" and exits non-zero if
# the fmt check, clippy, cargo test or any interop test failed.
set -uo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
export PATH="${HOME:-/root}/.cargo/bin:$PATH:/usr/sbin:/sbin"
START=$(date +%s)

section() { printf '\n=== %s\n' "$*"; }

command -v cargo >/dev/null || {
  echo "test: cargo not found; install Rust (https://rustup.rs) or add ~/.cargo/bin to PATH" >&2
  exit 1
}

section "system packages"
if ! bash scripts/install-deps.sh </dev/null; then
  echo "test: installing system packages failed; interop tests will skip (or fail in CI)" >&2
  [ "${CI:-}" = true ] && exit 1
fi

TOPICS=("$@")
cargo_status=0
fmt_status=0
clippy_status=0
if [ ${#TOPICS[@]} -eq 0 ] && [ "${SKIP_CARGO_TEST:-0}" != 1 ]; then
  section "cargo fmt --all -- --check"
  cargo fmt --all -- --check </dev/null || fmt_status=$?
  section "cargo clippy --workspace --all-targets -- -D warnings"
  if ! cargo clippy --version >/dev/null 2>&1; then
    rustup component add clippy rustfmt </dev/null || true
  fi
  cargo clippy --workspace --all-targets -- -D warnings </dev/null || clippy_status=$?
  section "cargo test --workspace"
  cargo test --workspace </dev/null || cargo_status=$?
fi

section "build cairn (release) for the interop tests"
if ! cargo build --release -p cairn-cli </dev/null; then
  echo "test: cannot build cairn; no interop test can run"
  echo "interop: 0 passed, 1 failed"
  exit 1
fi
export CAIRN=${CARGO_TARGET_DIR:-$REPO/target}/release/cairn

if [ ${#TOPICS[@]} -eq 0 ]; then
  # Quick topics first, so a broken server shows up early.
  TOPICS=(cli nbdinfo badreq qemu nbdcopy fio fs shutdown bench)
  for f in tests/interop/*.sh; do
    t=$(basename "$f" .sh)
    case $t in lib | *_lib) continue ;; esac
    case " ${TOPICS[*]} " in *" $t "*) ;; *) TOPICS+=("$t") ;; esac
  done
fi

RESULTS=$(mktemp "${TMPDIR:-/tmp}/cairn-interop-results.XXXXXX")
trap 'rm -f "$RESULTS"' EXIT
export INTEROP_RESULTS=$RESULTS
for t in "${TOPICS[@]}"; do
  script=tests/interop/$t.sh
  if [ ! -f "$script" ]; then
    echo "test: no interop topic $t (have: $(ls tests/interop | sed -n 's/\.sh$//p' | grep -v -e '^lib$' -e '_lib$' | tr '\n' ' '))"
    echo "FAIL $t/missing" >>"$RESULTS"
    continue
  fi
  section "interop: $t"
  before=$(wc -l <"$RESULTS")
  bash "$script" </dev/null
  status=$?
  # A script that died before recording anything still counts as a failure.
  if [ "$status" -ne 0 ] && [ "$(wc -l <"$RESULTS")" -eq "$before" ]; then
    echo "FAIL $t/script (exit $status)" >>"$RESULTS"
  fi
done

passed=$(grep -c '^PASS' "$RESULTS")
failed=$(grep -c '^FAIL' "$RESULTS")
skipped=$(grep -c '^SKIP' "$RESULTS")

section "summary ($(($(date +%s) - START)) s)"
if [ "$fmt_status" -ne 0 ]; then echo "cargo fmt --check: FAILED (run cargo fmt --all)"; fi
if [ "$clippy_status" -ne 0 ]; then echo "cargo clippy -D warnings: FAILED"; fi
if [ "$cargo_status" -ne 0 ]; then echo "cargo test --workspace: FAILED (exit $cargo_status)"; fi
grep -E '^(FAIL|SKIP)' "$RESULTS" | sed 's/^/  /'
if [ "$skipped" -gt 0 ]; then
  echo "  !!!!! $skipped interop test(s) SKIPPED: a tool is missing, see SKIP lines above !!!!!"
fi
line="interop: $passed passed, $failed failed"
[ "$skipped" -gt 0 ] && line="$line, $skipped skipped"
echo "$line"
[ "$failed" -eq 0 ] && [ "$cargo_status" -eq 0 ] && [ "$fmt_status" -eq 0 ] && [ "$clippy_status" -eq 0 ]
