#!/usr/bin/env bash
# Walk and read a 100 000-file ImageFolder tree through packfs and on tmpfs, with 1 and 8 readers,
# in one run. Needs root (mount, drop_caches). Usage: bench/core_walk_read.sh [FILES] [WORKDIR]
# Prints one JSON line per pass; docs/benchmarks.md explains the labels.
set -euo pipefail
files=${1:-100000}
work=${2:-/tmp/packfs-bench-core}
here=$(cd "$(dirname "$0")" && pwd)
packfs="$here/../target/release/packfs"
cargo build --release --manifest-path "$here/../Cargo.toml" >/dev/null
tree=/dev/shm/packfs-bench-tree
if [ ! -f "$work/shards/train-000015.tar" ]; then
  rm -rf "$work"
  # The demo generates the tree (~10 KB JPEG-like files, 1000 classes), packs 16 shards, verifies.
  "$packfs" demo --files "$files" --classes 1000 --shards 16 --workdir "$work"
fi
rm -rf "$tree"; cp -a "$work/source" "$tree"
shards="$work/shards/train-{000000..000015}.tar"
pass() { python3 "$here/walk_read.py" "$@"; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "(cannot drop caches)" >&2; }
for readers in 1 8; do
  pass "$tree" --readers "$readers" --label tmpfs
  pass "$tree" --readers "$readers" --label tmpfs --api os
  # Fresh mount after dropping caches: the shards come from disk.
  drop; "$packfs" mount "$shards" "$work/mnt"
  pass "$work/mnt" --readers "$readers" --label packfs-cold-disk
  "$packfs" umount "$work/mnt"
  # Fresh mount, shards in the host page cache: the cost of FUSE and packfs without the disk.
  "$packfs" mount "$shards" "$work/mnt"
  pass "$work/mnt" --readers "$readers" --label packfs-cold-cached
  # Same mount again: names, attributes and data come from the kernel's caches.
  pass "$work/mnt" --readers "$readers" --label packfs-warm
  pass "$work/mnt" --readers "$readers" --label packfs-warm --api os
  "$packfs" umount "$work/mnt"
done
rm -rf "$tree"
