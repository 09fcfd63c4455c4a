#!/usr/bin/env bash
# From a fresh checkout to a served demo disk: installs the NBD client tools if missing,
# builds cairn (release) and runs `cairn quickstart`. Arguments go to cairn quickstart,
# e.g. scripts/quickstart.sh --size 4G --dir /srv/demo.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
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
exec "${CARGO_TARGET_DIR:-$REPO/target}/release/cairn" quickstart "$@"
