#!/usr/bin/env bash
# A real shared file system on this one machine, for tests and benchmarks: its servers in a
# network namespace of their own, its FUSE client on the host, as a compute node sees it.
#
#   bench/sharedfs.sh up FS DIR [N]   servers and data under DIR, client mounted at DIR/mnt
#   bench/sharedfs.sh ops FS DIR      the servers' counts of the operations since `up`, as JSON
#                                     by kind, `total` those a metadata server answers
#   bench/sharedfs.sh down FS DIR     client unmounted, servers stopped, namespace removed
#
# FS is moosefs (MooseFS 3.0: master and chunkserver; its master counts per client), glusterfs
# (GlusterFS 10: glusterd and one brick; one instance at a time) or cephfs (Ceph 16: monitor,
# OSD and MDS, ceph-fuse as the client), each in bench/sharedfs/FS.sh. N (1-250, default 1)
# numbers the instance: its namespace is packfs-KIND-N (mfs, gl, cfs) on the subnet
# 10.77.N.0/24, 10.79.N.0/24 or 10.80.N.0/24, so several can run at once (one per test).
# Servers are started with nsenter into the namespace's network only: `ip netns exec` would
# also give them a private copy of the mount table, which pins every FUSE mount present at that
# moment (a packfs daemon stayed alive 60 s after `packfs umount`). Needs root and Debian's
# moosefs-master, moosefs-chunkserver, moosefs-client and moosefs-cli (.ci/run installs them),
# glusterfs-server and glusterfs-client, or ceph-mon, ceph-osd, ceph-mds, ceph-common and
# ceph-fuse.
set -euo pipefail

usage() {
  sed -n '5,8p' "$0" >&2
  exit 2
}

[ $# -ge 3 ] || usage
action=$1 fs=$2 dir=$3 n=${4:-}
case $fs in
  moosefs | glusterfs | cephfs) ;;
  *) echo "sharedfs.sh: unknown file system '$fs' (known: moosefs, glusterfs, cephfs)" >&2; exit 2 ;;
esac
case $action in
  up | ops | down) ;;
  *) usage ;;
esac

# Whether the client can write a file and read it back within 10 s (the data servers have
# registered).
client_ready() {
  local i
  for i in $(seq 1 100); do
    if echo ready > "$dir/mnt/.ready" 2>/dev/null && [ "$(cat "$dir/mnt/.ready" 2>/dev/null)" = ready ]; then
      rm -f "$dir/mnt/.ready"
      return 0
    fi
    sleep 0.1
  done
  return 1
}

# The instance number is kept in DIR once up, so ops and down need only DIR.
. "$(dirname "$0")/netns.sh"
. "$(dirname "$0")/sharedfs/$fs.sh"
"${fs}_$action"
