#!/usr/bin/env bash
# A daemon's peak RSS under --cache-size 16M while many readers read: 16 readers of a .tar.zst in
# 64 MiB frames, of a .tar.xz in 64 MiB blocks and of a `gzip -9` .tar.gz (each reader reads 256
# KiB of each of its 16 files), and 32 readers of a plain tar staged from mount time (eager and
# lazy; each reader reads 8 files whole). The tree: 256 files of 1 MiB, each of its own byte.
# Prints the median of ROUNDS mounts per build and case (the builds alternate).
#
#   bash bench/memory/readers.sh [PACKFS [PACKFS_TO_COMPARE]]    (ROUNDS=3 by default)
#
# Needs about 1 GB in $WORK (default /tmp); takes a few minutes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
binaries=("${1:-$here/../../target/release/packfs}")
[ $# -ge 2 ] && binaries+=("$2")
rounds=${ROUNDS:-3}
work=$(mktemp -d "${WORK:-/tmp}/packfs-readers.XXXXXX")
trap 'for m in "$work"/mnt*; do fusermount3 -u "$m" 2>/dev/null || true; done; rm -rf "$work"' EXIT

mkdir "$work/tree"
python3 - "$work/tree" <<'EOF'
import sys
for i in range(256):
    with open(f"{sys.argv[1]}/f{i:03d}.bin", "wb") as f:
        f.write(bytes([i]) * (1 << 20))
EOF
tar --format=posix -cf "$work/plain.tar" -C "$work/tree" .
split -b 64M --filter='zstd -q -c' < "$work/plain.tar" > "$work/frames.tar.zst"
xz -q -T2 --block-size=64MiB -c "$work/plain.tar" > "$work/blocks.tar.xz"
gzip -9 -c "$work/plain.tar" > "$work/plain.tar.gz"

# One mount: prints the daemon's peak RSS in MiB after the readers are done.
peak() {
  local bin=$1 source=$2 readers=$3 whole=$4; shift 4
  local mnt stage="$work/stage"
  mnt=$(mktemp -d "$work/mnt.XXXXXX")
  rm -rf "$stage"
  "$bin" mount --cache-size 16M --pid-file "$work/pid" "$@" "$source" "$mnt" >/dev/null 2>&1
  local pid; pid=$(cat "$work/pid")
  local per=$(( 256 / readers ))
  for r in $(seq 0 $(( readers - 1 ))); do
    ( for i in $(seq $(( r * per )) $(( r * per + per - 1 ))); do
        f=$(printf "%s/f%03d.bin" "$mnt" "$i")
        if [ "$whole" = yes ]; then cat "$f" >/dev/null; else head -c 262144 "$f" >/dev/null; fi
      done ) &
  done
  wait
  awk '/VmHWM/ { print int($2 / 1024) }' "/proc/$pid/status"
  "$bin" umount "$mnt" >/dev/null
  rmdir "$mnt"
}

median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

for image in frames.tar.zst blocks.tar.xz plain.tar.gz; do
  for k in "${!binaries[@]}"; do "${binaries[$k]}" index -o "$work/$image.$k.idx" "$work/$image" >/dev/null; done
done

printf "%-28s %-16s %s\n" case binary "peak RSS, MiB (median of $rounds)"
cases=("zstd 64 MiB frames, 16 readers" "xz 64 MiB blocks, 16 readers" "gzip -9, 16 readers"
  "eager staging, 32 readers" "lazy staging, 32 readers")
for c in "${cases[@]}"; do
  declare -A got=()
  for _ in $(seq "$rounds"); do
    for k in "${!binaries[@]}"; do
      bin=${binaries[$k]} name=$k
      case $c in
        zstd*) v=$(peak "$bin" "$work/frames.tar.zst.$name.idx" 16 no) ;;
        xz*) v=$(peak "$bin" "$work/blocks.tar.xz.$name.idx" 16 no) ;;
        gzip*) v=$(peak "$bin" "$work/plain.tar.gz.$name.idx" 16 no) ;;
        eager*) v=$(peak "$bin" "$work/plain.tar" 32 yes --stage "$work/stage") ;;
        lazy*) v=$(peak "$bin" "$work/plain.tar" 32 yes --stage "$work/stage" --stage-mode lazy) ;;
      esac
      got[$bin]="${got[$bin]:-} $v"
    done
  done
  for bin in "${binaries[@]}"; do
    printf "%-28s %-16s %s (%s)\n" "$c" "$(basename "$bin" | cut -c1-16)" \
      "$(tr ' ' '\n' <<<"${got[$bin]}" | grep . | median)" "${got[$bin]# }"
  done
  unset got
done
