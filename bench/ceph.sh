# Sourced by bench/s3gw.sh and bench/sharedfs/cephfs.sh: a one-monitor, one-OSD Ceph cluster
# under a directory, its daemons in the instance's network namespace (bench/netns.sh, sourced
# first: in_ns, addr, dir). The OSD's disk is a sparse file beside its data directory (inside
# it, bluestore's own `block` link would loop) of ceph_block_bytes (default 4 GiB). Cephx is off inside the cluster: nothing
# but the host reaches the namespace.

conf=$dir/ceph.conf

# Stops with what failed and the end of the daemons' logs: a cluster that does not come up must
# say why where it is reported (a CI log), not only in DIR.
ceph_fail() {
  echo "$(basename "$0"): $1" >&2
  local f
  for f in "$dir"/log/*; do
    [ -s "$f" ] || continue
    echo "--- last lines of $f" >&2
    tail -n 15 "$f" >&2
  done
  exit 1
}

# Runs a step of `up`; a failure names it.
ceph_step() {
  local what=$1
  shift
  "$@" >>"$dir/log/steps.out" 2>&1 || ceph_fail "$what failed (exit $?): $*"
}

# Retries a cluster command while the monitor settles (the first ones can meet an election).
ceph_cmd() {
  local i
  for i in $(seq 1 50); do
    in_ns ceph -c "$conf" "$@" 2>/dev/null && return 0
    sleep 0.2
  done
  in_ns ceph -c "$conf" "$@"
}

# The OSD, tried again if it stops at start (a monitor command refused as 'wrong fsid').
ceph_start_osd() {
  local i
  for i in 1 2 3; do
    in_ns ceph-osd -i 0 -c "$conf" && return 0
    sleep 1
  done
  return 1
}

# Every daemon and client of this cluster stopped, the namespace removed.
ceph_down() {
  pkill -f "(radosgw|ceph-osd|ceph-mon|ceph-mds|ceph-fuse) .*-c $conf" 2>/dev/null || true
  sleep 0.5
  pkill -9 -f "(radosgw|ceph-osd|ceph-mon|ceph-mds|ceph-fuse) .*-c $conf" 2>/dev/null || true
  netns_down "$dir"
}

# The namespace, the monitor and the OSD up; `extra` is appended to ceph.conf (the sections of
# the daemons the caller starts next).
ceph_up() {
  local extra=$1 tool fsid
  for tool in ceph-mon ceph-osd monmaptool ceph nsenter ip; do
    command -v "$tool" >/dev/null || {
      echo "$(basename "$0"): $tool is missing (apt-get install ceph-mon ceph-osd ceph-common iproute2)" >&2
      exit 1
    }
  done
  rm -rf "$dir/mon" "$dir/osd0" "$dir/osd0.block" "$dir/run" "$dir/log" "$dir/monmap"
  mkdir -p "$dir/mon" "$dir/osd0" "$dir/run" "$dir/log"
  netns_up "$dir"
  fsid=$(cat /proc/sys/kernel/random/uuid)
  cat > "$conf" <<CONF
[global]
fsid = $fsid
mon host = $addr
mon initial members = a
auth cluster required = none
auth service required = none
auth client required = none
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon warn on pool no redundancy = false
osd objectstore = bluestore
osd crush chooseleaf type = 0
run dir = $dir/run
admin socket = $dir/run/\$name.asok
log file = $dir/log/\$name.log
[mon.a]
mon data = $dir/mon
[osd.0]
osd data = $dir/osd0
bluestore block path = $dir/osd0.block
bluestore block create = true
bluestore block size = ${ceph_block_bytes:-4294967296}
osd memory target = 939524096
# The OSD's own map updates at start are commands to the monitor that can go out before it has
# the monitor's map ('wrong fsid', exit 250, about one start in ten): its place is given below.
osd class update on start = false
osd crush update on start = false
$extra
CONF
  ceph_step "the monitor map" monmaptool --create --add a "$addr" --fsid "$fsid" "$dir/monmap"
  ceph_step "the monitor's store" in_ns ceph-mon --mkfs -i a --monmap "$dir/monmap" -c "$conf"
  ceph_step "the monitor" in_ns ceph-mon -i a -c "$conf"
  ceph_step "the OSD's id (is the monitor up?)" ceph_cmd osd create
  ceph_step "the OSD's disk" in_ns ceph-osd -i 0 --mkfs -c "$conf"
  ceph_step "the OSD" ceph_start_osd
  ceph_step "the OSD's place in the map" ceph_cmd osd crush add osd.0 1.0 host=localhost root=default
}
