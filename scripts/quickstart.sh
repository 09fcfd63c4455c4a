#!/usr/bin/env bash
# From a fresh checkout to a served demo disk: installs the NBD client tools if missing,
# builds cairn (release) and runs `cairn quickstart`. Arguments go to cairn quickstart,
# e.g. scripts/quickstart.sh --array-size 4G --dir /srv/demo.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
ORIG_PATH=$PATH
export PATH="${HOME:-/root}/.cargo/bin:$PATH"

command -v cargo >/dev/null || {
  echo "quickstart: cargo not found; install Rust (https://rustup.rs) first" >&2
  exit 1
}
# The clients the printed examples use (nbdinfo, qemu-img, nbdfuse). Not fatal: cairn
# itself needs none of them.
bash "$REPO/scripts/install-deps.sh" </dev/null ||
  echo "quickstart: could not install the NBD client tools; cairn runs anyway" >&2

echo "quickstart: building cairn (release; the first build takes a few minutes) ..."
(cd "$REPO" && cargo build --release -q -p cairn-cli)
BUILT="${CARGO_TARGET_DIR:-$REPO/target}/release/cairn"

# Put `cairn` on PATH: next to cargo's own installs (rustup puts ~/.cargo/bin on PATH), as
# `cargo install --path crates/cli` would, without building a second time.
# CAIRN_INSTALL_DIR=DIR installs elsewhere; CAIRN_INSTALL_DIR= (empty) skips the step.
INSTALL_DIR=${CAIRN_INSTALL_DIR-${CARGO_HOME:-${HOME:-/root}/.cargo}/bin}
if [ -n "$INSTALL_DIR" ]; then
  mkdir -p "$INSTALL_DIR"
  install -m 0755 "$BUILT" "$INSTALL_DIR/cairn.new" && mv -f "$INSTALL_DIR/cairn.new" "$INSTALL_DIR/cairn"
  echo "quickstart: installed $INSTALL_DIR/cairn"
  case ":$ORIG_PATH:" in
    *":$INSTALL_DIR:"*) ;;
    *) echo "quickstart: $INSTALL_DIR is not on your PATH; add it: export PATH=\"$INSTALL_DIR:\$PATH\"" ;;
  esac
fi
exec "$BUILT" quickstart "$@"
