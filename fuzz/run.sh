#!/usr/bin/env bash
# Runs every fuzz target (or those named) for SECONDS each, growing the corpora in fuzz/corpus/.
#   bash fuzz/run.sh [SECONDS] [TARGET...]        (default: 20 s each, all targets)
# CI runs it with the default as a smoke test. cargo-fuzz needs nightly features:
# RUSTC_BOOTSTRAP=1 lets the stable toolchain build it. Targets are built with debug assertions
# (so integer overflow panics) and without a sanitizer: the code under test has no unsafe parsing,
# and the build is twice as fast.
set -euo pipefail
cd "$(dirname "$0")"
seconds=${1:-20}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(scan_tar scan_gzip scan_zstd scan_zip scan_squashfs index)
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked --quiet
export RUSTC_BOOTSTRAP=1
flags=(-O -a -s none)
cargo fuzz build "${flags[@]}"
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  log=$(mktemp)
  if ! cargo fuzz run "${flags[@]}" "$t" "corpus/$t" -- -max_total_time="$seconds" \
      -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1; then
    tail -40 "$log"
    echo "fuzz target $t failed: the input is in fuzz/artifacts/$t/; add it to fuzz/regressions/$t/ once fixed" >&2
    exit 1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  echo "fuzz $t: $runs executions in $seconds s, $cov, no crash"
  rm -f "$log"
done
