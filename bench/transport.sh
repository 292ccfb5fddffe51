#!/usr/bin/env bash
# Classic /dev/fuse loop against FUSE over io_uring on read and DataLoader passes: builds packfs,
# then runs bench/transport.py (root). Example: bench/transport.sh --rounds 2
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cargo build --release --manifest-path "$here/../Cargo.toml" >/dev/null
exec python3 "$here/transport.py" "$@"
