#!/usr/bin/env bash
# Memory against what archives declare: peak RSS of `packfs ls` and `packfs index`, and a daemon's
# RSS under --cache-size 16M (mounted from the image and from its index, after reading 1 MiB at
# three places, and for the zip after reading all of it), for a 40 GiB-inflating zip member and
# gzip-compressed tars of 16 and 100 GiB; and scans of a .tar.bz2 of 3 GiB of zeros (bzip2 -9)
# and of squashfs images whose inode tables claim 1 GiB, with a daemon's peak for those.
#
#   bash bench/memory/run.sh [PACKFS [PACKFS_TO_COMPARE]]    (default: target/release/packfs)
#
# Needs about 2 GB of free disk in $WORK (default /tmp) for the images' checkpoint tables and
# indexes; takes a few minutes (every scan inflates the whole stream once).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
binaries=("${1:-$here/../../target/release/packfs}")
[ $# -ge 2 ] && binaries+=("$2")
work=$(mktemp -d "${WORK:-/tmp}/packfs-memory.XXXXXX")
trap 'for m in "$work"/mnt-*; do fusermount3 -u "$m" 2>/dev/null || umount "$m" 2>/dev/null || true; done; rm -rf "$work"' EXIT

python3 "$here/make_images.py" zip "$work/bomb.zip" 40G
python3 "$here/make_images.py" targz "$work/16g.tar.gz" 16G
python3 "$here/make_images.py" targz "$work/100g.tar.gz" 100G
python3 "$here/make_images.py" tarbz2 "$work/zeros.tar.bz2" 3G
for comp in gzip xz zstd; do python3 "$here/make_images.py" "sqfs-$comp" "$work/$comp.sqfs" 1G; done

mib() { echo $(( $1 / 1024 )); }
status_mib() { mib "$(awk -v f="$2" '$1 == f { print $2 }' "/proc/$1/status")"; }

printf "%-14s %-13s %-7s %-34s %10s\n" binary image decoded measure "MiB"
for bin in "${binaries[@]}"; do
  name=$(basename "$bin")
  # Image, decoded size, a file in it, and where to read it (MiB).
  for spec in "bomb.zip 40G zeros.bin 0,20000,40000" "16g.tar.gz 16G zeros-015.bin 0,500,1000" \
      "100g.tar.gz 100G zeros-099.bin 0,500,1000"; do
    read -r image decoded file offsets <<<"$spec"
    row() { printf "%-14s %-13s %-7s %-34s %10s\n" "${name:0:14}" "$image" "$decoded" "$1" "$2"; }
    if [ "$image" != 100g.tar.gz ]; then
      kib=$( { /usr/bin/time -f %M "$bin" ls "$work/$image" >/dev/null; } 2>&1 | tail -1)
      row "ls: peak RSS" "$(mib "$kib")"
    fi
    index="$work/$image.packfs-index"
    kib=$( { /usr/bin/time -f %M "$bin" index -o "$index" "$work/$image" >/dev/null; } 2>&1 | tail -1)
    row "index: peak RSS" "$(mib "$kib")"
    row "index: file size" "$(( $(stat -c %s "$index") >> 20 ))"
    for from in image index; do
      [ "$image" = 100g.tar.gz ] && [ $from = image ] && continue
      src="$work/$image"
      [ $from = index ] && src=$index
      mnt="$work/mnt-$from"
      mkdir -p "$mnt"
      "$bin" mount --cache-size 16M --pid-file "$work/pid" "$src" "$mnt" >/dev/null 2>&1
      pid=$(cat "$work/pid")
      # The background check of an index reads it all: let it finish.
      sleep 3
      for at in ${offsets//,/ }; do
        dd if="$mnt/$file" of=/dev/null bs=1M count=1 skip=$at status=none
      done
      row "daemon from $from: RSS now" "$(status_mib "$pid" VmRSS:)"
      row "daemon from $from: RSS peak" "$(status_mib "$pid" VmHWM:)"
      row "daemon from $from: anonymous" "$(status_mib "$pid" RssAnon:)"
      row "daemon from $from: files" "$(status_mib "$pid" RssFile:)"
      if [ "$image" = bomb.zip ]; then
        # Every byte of the member: every checkpoint's window is used once.
        dd if="$mnt/$file" of=/dev/null bs=4M status=none
        row "daemon from $from, all read: RSS" "$(status_mib "$pid" VmRSS:)"
        row "daemon from $from, all read: peak" "$(status_mib "$pid" VmHWM:)"
      fi
      "$bin" umount "$mnt"
    done
    rm -f "$index"
  done
  # Scans only: a .tar.bz2 of zeros (46 MB blocks bzip2 does not declare), and squashfs images
  # whose inode tables claim 1 GiB of metadata; a daemon reads the one file of each squashfs.
  for image in zeros.tar.bz2 gzip.sqfs xz.sqfs zstd.sqfs; do
    row() { printf "%-14s %-13s %-7s %-34s %10s\n" "${name:0:14}" "$image" "" "$1" "$2"; }
    for verb in ls index; do
      args=("$verb" "$work/$image")
      [ $verb = index ] && args+=(-o "$work/$image.packfs-index")
      failed=
      /usr/bin/time -o "$work/time" -f %M "$bin" "${args[@]}" >/dev/null 2>&1 || failed=" (failed)"
      row "$verb: peak RSS" "$(mib "$(tail -1 "$work/time")")$failed"
    done
    rm -f "$work/$image.packfs-index"
    case $image in *.sqfs)
      mnt="$work/mnt-sqfs"; mkdir -p "$mnt"
      if "$bin" mount --cache-size 16M --pid-file "$work/pid" "$work/$image" "$mnt" >/dev/null 2>&1; then
        pid=$(cat "$work/pid")
        cat "$mnt/a.txt" >/dev/null
        row "daemon: RSS peak" "$(status_mib "$pid" VmHWM:)"
        "$bin" umount "$mnt"
      else
        row "daemon: RSS peak" "(mount failed)"
      fi
    esac
  done
done
