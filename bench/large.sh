#!/usr/bin/env bash
# The large-sample benchmark in one command: builds packfs, then runs bench/large.py (root: it
# mounts and drops the page cache; numpy from the test venv). Example:
#   bench/large.sh --sizes 8,64 --readers 1,8 --modes 1m
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cargo build --release --manifest-path "$here/../Cargo.toml" >/dev/null
python=${PYTHON:-$here/../target/test-venv/bin/python}
exec "$python" "$here/large.py" "$@"
