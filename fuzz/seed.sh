#!/usr/bin/env bash
# Writes the seed corpora under fuzz/corpus/ from small archives made by the real tools (GNU tar,
# bsdtar, Info-ZIP zip, mksquashfs, gzip, packfs index). Run once; the fuzzer grows the corpora
# from there, and the grown corpora are committed.
set -euo pipefail
cd "$(dirname "$0")"
packfs=${PACKFS:-../target/debug/packfs}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src=$work/src
mkdir -p "$src/d/sub" "$src/e"
printf 'hello\n' > "$src/d/a.txt"
head -c 3000 /dev/urandom > "$src/d/b.bin"
seq 1 400 > "$src/d/sub/c.txt"
ln -s ../d/a.txt "$src/e/link"
truncate -s 100K "$src/d/sparse" && printf 'x' | dd of="$src/d/sparse" bs=1 seek=50000 conv=notrunc 2>/dev/null
long=$(printf 'n%.0s' {1..120})
printf 'long\n' > "$src/d/$long"
mkdir -p corpus/{scan_tar,scan_gzip,scan_zstd,scan_zip,scan_squashfs,index}
(cd "$src" && tar --format=gnu --exclude=sparse -cf "$OLDPWD/corpus/scan_tar/gnu.tar" d e)
(cd "$src" && tar --format=pax --exclude=sparse -cf "$OLDPWD/corpus/scan_tar/pax.tar" d e)
(cd "$src" && tar --format=gnu --sparse -cf "$OLDPWD/corpus/scan_tar/sparse.tar" d/sparse)
(cd "$src" && tar --format=ustar -cf "$OLDPWD/corpus/scan_tar/ustar.tar" d/a.txt d/sub)
(cd "$src" && bsdtar --exclude sparse -cf "$OLDPWD/corpus/scan_tar/bsdtar.tar" d e)
gzip -9 -c corpus/scan_tar/gnu.tar > corpus/scan_gzip/gnu.tar.gz
gzip -1 -c corpus/scan_tar/pax.tar > corpus/scan_gzip/pax.tar.gz
zstd -q -19 --check -c corpus/scan_tar/gnu.tar > corpus/scan_zstd/gnu.tar.zst
# Frames of 2 KiB of tar each, concatenated, and a skippable frame at the start (as pzstd writes).
split -b 2048 corpus/scan_tar/pax.tar "$work/part." && printf '\x50\x2a\x4d\x18\x04\x00\x00\x00abcd' > corpus/scan_zstd/frames.tar.zst \
  && for p in "$work"/part.*; do zstd -q -c "$p"; done >> corpus/scan_zstd/frames.tar.zst
(cd "$src" && zip -qr "$OLDPWD/corpus/scan_zip/deflated.zip" d e -x d/sparse)
(cd "$src" && zip -qr0 "$OLDPWD/corpus/scan_zip/stored.zip" d/a.txt d/sub)
mksquashfs "$src" corpus/scan_squashfs/gzip.sqfs -quiet -noappend -all-root >/dev/null
mksquashfs "$src" corpus/scan_squashfs/xz.sqfs -quiet -noappend -comp xz -b 4096 >/dev/null
mksquashfs "$src" corpus/scan_squashfs/zstd-nofrag.sqfs -quiet -noappend -comp zstd -no-fragments >/dev/null
for t in gnu sparse; do
  "$packfs" index -o corpus/index/$t.packfs-index corpus/scan_tar/$t.tar >/dev/null
done
"$packfs" index -o corpus/index/zip.packfs-index corpus/scan_zip/deflated.zip >/dev/null
"$packfs" index -o corpus/index/sqfs.packfs-index corpus/scan_squashfs/gzip.sqfs >/dev/null
"$packfs" index -o corpus/index/gz.packfs-index corpus/scan_gzip/gnu.tar.gz >/dev/null
"$packfs" index -o corpus/index/zst.packfs-index corpus/scan_zstd/frames.tar.zst >/dev/null
du -sh corpus/*
