#!/usr/bin/env bash
# The FUSE round-trip benchmark in one command: builds packfs and bench/fuseloop, then runs
# bench/roundtrip.py (root: it mounts with mount(2) and sets fuse's enable_uring).
# Example: bench/roundtrip.sh --threads 1,8,32 --out docs/benchmarks/roundtrip-DATE.json
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cargo build --release --manifest-path "$here/../Cargo.toml" >/dev/null
CARGO_TARGET_DIR="$here/../target/fuseloop" \
    cargo build --release --manifest-path "$here/fuseloop/Cargo.toml" >/dev/null
exec python3 "$here/roundtrip.py" "$@"
