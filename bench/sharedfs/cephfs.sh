# Sourced by bench/sharedfs.sh: CephFS (Ceph 16), a monitor, an OSD and a metadata server (MDS)
# in the namespace (bench/ceph.sh), ceph-fuse on the host. The client reads data from the OSD
# directly; the MDS answers the metadata requests and counts them by kind.

netns_init cfs 10.80 "$dir" "$n"
. "$(dirname "$0")/ceph.sh"

# The MDS's counts of client requests since `up`, by kind (lookup, getattr, open, readdir, ...),
# `total` all of them.
cephfs_ops() {
  in_ns ceph -c "$conf" daemon mds.a perf dump mds_server | python3 -c '
import json, sys
server = json.load(sys.stdin)["mds_server"]
ops = {k[len("req_"):-len("_latency")]: v["avgcount"] for k, v in server.items()
       if k.startswith("req_") and k.endswith("_latency") and isinstance(v, dict)}
ops["total"] = server["handle_client_request"]
print(json.dumps(ops))'
}

cephfs_down() {
  if mountpoint -q "$dir/mnt" 2>/dev/null; then
    umount "$dir/mnt" 2>/dev/null || umount -l "$dir/mnt" 2>/dev/null || true
  fi
  ceph_down
}

cephfs_up() {
  for tool in ceph-mds ceph-fuse; do
    command -v "$tool" >/dev/null || {
      echo "sharedfs.sh: $tool is missing (apt-get install ceph-mds ceph-fuse)" >&2
      exit 1
    }
  done
  cephfs_down
  mkdir -p "$dir/mds" "$dir/mnt"
  # Room for a benchmark's dataset three times over (tree, shards, squashfs image): sparse.
  ceph_block_bytes=$((24 << 30))
  ceph_up "[mds.a]
mds data = $dir/mds"
  ceph_step "the data pool" ceph_cmd osd pool create cephfs_data 8
  ceph_step "the metadata pool" ceph_cmd osd pool create cephfs_metadata 8
  ceph_step "the file system" ceph_cmd fs new packfs cephfs_metadata cephfs_data
  ceph_step "the MDS" in_ns ceph-mds -i a -c "$conf"
  local i
  for i in $(seq 1 300); do
    in_ns ceph -c "$conf" mds stat 2>/dev/null | grep -q "up:active" && break
    sleep 0.2
  done
  in_ns ceph -c "$conf" mds stat 2>/dev/null | grep -q "up:active" ||
    ceph_fail "the MDS did not become active in 60 s"
  # CEPHFS_CLIENT_CACHE (inodes; ceph-fuse's default 16 384) shrinks the client's cache to
  # what a node with many more files than the test's would keep of them.
  ceph_step "the client" ceph-fuse -c "$conf" -m "$addr" \
    ${CEPHFS_CLIENT_CACHE:+--client_cache_size="$CEPHFS_CLIENT_CACHE"} "$dir/mnt"
  if client_ready; then
    echo "cephfs $n up: client at $dir/mnt, monitor $addr"
    return 0
  fi
  ceph_fail "cephfs did not come up in 10 s"
}
