#!/usr/bin/env bash
# One command for the whole comparison: builds packfs, then runs bench/run.py with the arguments.
# Example: bench/run.sh --dataset tiny-200k --peers all
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cargo build --release --manifest-path "$here/../Cargo.toml" >/dev/null
exec python3 "$here/run.py" "$@"
