#!/usr/bin/env bash
# The object-store benchmark in one command: builds packfs, then runs bench/remote.py (root: it
# mounts and drops the page cache). Example: bench/remote.sh --latency 5,20 --readers 8,32
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cargo build --release --manifest-path "$here/../Cargo.toml" >/dev/null
exec python3 "$here/remote.py" "$@"
