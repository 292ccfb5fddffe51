#!/usr/bin/env bash
# Walk and read a 100 000-file ImageFolder tree through packfs and on tmpfs, with 1 and 8 readers,
# in one run. Needs root (mount, drop_caches). Usage: bench/core_walk_read.sh [FILES] [WORKDIR]
set -euo pipefail
files=${1:-100000}
work=${2:-/tmp/packfs-bench-core}
here=$(cd "$(dirname "$0")" && pwd)
packfs="$here/../target/release/packfs"
cargo build --release --manifest-path "$here/../Cargo.toml" >/dev/null
rm -rf "$work" /dev/shm/packfs-bench-tree
# The demo generates the tree (~10 KB JPEG-like files, 1000 classes), packs 16 shards, verifies.
"$packfs" demo --files "$files" --classes 1000 --shards 16 --workdir "$work"
cp -a "$work/source" /dev/shm/packfs-bench-tree
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "(cannot drop caches)" >&2; }
for readers in 1 8; do
  python3 "$here/walk_read.py" /dev/shm/packfs-bench-tree --readers "$readers" --label tmpfs
  # Fresh mount: nothing of the mount is cached; the shards are read from disk.
  drop
  "$packfs" mount "$work/shards/train-{000000..000015}.tar" "$work/mnt"
  python3 "$here/walk_read.py" "$work/mnt" --readers "$readers" --label packfs-cold
  # Second pass on the same mount: names, attributes and data come from the kernel's caches.
  python3 "$here/walk_read.py" "$work/mnt" --readers "$readers" --label packfs-warm
  "$packfs" umount "$work/mnt"
done
rm -rf /dev/shm/packfs-bench-tree
