#!/usr/bin/env bash
# The parallel-file-system benchmark in one command: builds packfs and the simulator (bench/pfssim),
# then runs bench/pfs.py with the arguments. Example: bench/pfs.sh --datasets imagenet-20k
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cargo build --release --manifest-path "$here/../Cargo.toml" >/dev/null
CARGO_TARGET_DIR="$here/../target/pfssim" cargo build --release --manifest-path "$here/pfssim/Cargo.toml" >/dev/null
exec python3 "$here/pfs.py" "$@"
