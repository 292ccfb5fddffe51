#!/usr/bin/env bash
# A real S3 store on this one machine: Ceph's RADOS Gateway over a one-OSD Ceph whose disk is a
# sparse file, its daemons in a network namespace of their own. Unlike a mock it checks
# signatures, keys, clock skew and expiry, and answers with the proper S3 error codes.
#
#   bench/s3gw.sh up DIR [N]    cluster under DIR; prints the endpoint, writes DIR/env
#                               (PACKFS_S3_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)
#   bench/s3gw.sh ops DIR       the gateway's request counters, as JSON (req, failed_req, get, ...)
#   bench/s3gw.sh key DIR add|rm ID [SECRET]
#                               another access key for the same user, or one taken away
#   bench/s3gw.sh down DIR      daemons stopped, namespace removed
#
# N (1-250, default 1) numbers the instance: namespace packfs-rgw-N, endpoint
# http://10.78.N.2:8080. With S3GW_DOWN_WITH=PID, `up` also leaves a watcher that takes the
# instance down (and removes DIR) once process PID is gone: tests share one instance per test
# process, and a killed test run leaves nothing behind. A step that fails says which, with the
# end of the daemons' logs. Daemons are started with nsenter into the namespace's network only
# (`ip netns exec` would pin every FUSE mount present). Needs root and Debian's ceph-mon,
# ceph-osd, radosgw and ceph-common. Comes up in about 15-25 s.
set -euo pipefail

usage() {
  sed -n '6,11p' "$0" >&2
  exit 2
}

[ $# -ge 2 ] || usage
action=$1 dir=$2 n=
[ "$action" = up ] && n=${3:-}
. "$(dirname "$0")/netns.sh"
netns_init rgw 10.78 "$dir" "$n"
conf=$dir/ceph.conf

down() {
  pkill -f "(radosgw|ceph-osd|ceph-mon) .*-c $conf" 2>/dev/null || true
  sleep 0.5
  pkill -9 -f "(radosgw|ceph-osd|ceph-mon) .*-c $conf" 2>/dev/null || true
  netns_down "$dir"
}

# Stops with what failed and the end of the daemons' logs: a cluster that does not come up must
# say why where it is reported (a CI log), not only in DIR.
fail() {
  echo "s3gw.sh: $1" >&2
  local f
  for f in "$dir"/log/*; do
    [ -s "$f" ] || continue
    echo "--- last lines of $f" >&2
    tail -n 15 "$f" >&2
  done
  exit 1
}

# Runs a step of `up`; a failure names it.
step() {
  local what=$1
  shift
  "$@" >>"$dir/log/steps.out" 2>&1 || fail "$what failed (exit $?): $*"
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
start_osd() {
  local i
  for i in 1 2 3; do
    in_ns ceph-osd -i 0 -c "$conf" && return 0
    sleep 1
  done
  return 1
}

up() {
  for tool in ceph-mon ceph-osd radosgw radosgw-admin monmaptool ceph nsenter ip curl; do
    command -v "$tool" >/dev/null || {
      echo "s3gw.sh: $tool is missing (apt-get install ceph-mon ceph-osd radosgw ceph-common iproute2 curl)" >&2
      exit 1
    }
  done
  down
  rm -rf "$dir/mon" "$dir/osd0" "$dir/osd0.block" "$dir/run" "$dir/log" "$dir/monmap"
  mkdir -p "$dir/mon" "$dir/osd0" "$dir/run" "$dir/log" "$dir/rgw"
  netns_up "$dir"
  # The watcher comes first, so that a start that fails half-way is taken down too.
  if [ -n "${S3GW_DOWN_WITH:-}" ]; then
    setsid nohup bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; bash "$2" down "$3"; rm -rf "$3"' \
      s3gw-watch "$S3GW_DOWN_WITH" "$0" "$dir" >/dev/null 2>&1 </dev/null &
  fi

  local fsid
  fsid=$(cat /proc/sys/kernel/random/uuid)
  # Cephx off inside the cluster (nothing else reaches the namespace); S3 requests are still
  # signed and checked by the gateway. One OSD, pools of one copy; the OSD's disk a 4 GiB sparse
  # file beside its data directory (inside it, bluestore's own `block` link would loop).
  cat > "$conf" <<EOF
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
bluestore block size = 4294967296
osd memory target = 939524096
# The OSD's own map updates at start are commands to the monitor that can go out before it has
# the monitor's map ('wrong fsid', exit 250, about one start in ten): its place is given below.
osd class update on start = false
osd crush update on start = false
[client.rgw.a]
rgw frontends = beast endpoint=$addr:8080
rgw data = $dir/rgw
EOF
  step "the monitor map" monmaptool --create --add a "$addr" --fsid "$fsid" "$dir/monmap"
  step "the monitor's store" in_ns ceph-mon --mkfs -i a --monmap "$dir/monmap" -c "$conf"
  step "the monitor" in_ns ceph-mon -i a -c "$conf"
  step "the OSD's id (is the monitor up?)" ceph_cmd osd create
  step "the OSD's disk" in_ns ceph-osd -i 0 --mkfs -c "$conf"
  step "the OSD" start_osd
  step "the OSD's place in the map" ceph_cmd osd crush add osd.0 1.0 host=localhost root=default
  step "the gateway" in_ns radosgw -c "$conf" -n client.rgw.a
  local i code=000
  for i in $(seq 1 300); do
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://$addr:8080/" 2>/dev/null || true)
    [ "$code" = 200 ] && break
    sleep 0.2
  done
  [ "$code" = 200 ] || fail "the gateway did not answer in 60 s (last status $code); logs in $dir/log"
  local key secret
  key=PACKFS$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr a-f A-F)
  secret=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  step "the S3 user" in_ns radosgw-admin -c "$conf" user create --uid packfs --display-name packfs \
    --access-key "$key" --secret-key "$secret"
  umask 077
  cat > "$dir/env" <<EOF
PACKFS_S3_ENDPOINT=http://$addr:8080
AWS_ACCESS_KEY_ID=$key
AWS_SECRET_ACCESS_KEY=$secret
EOF
  echo "rgw $n up: endpoint http://$addr:8080, keys in $dir/env"
}

# Another access key of the S3 user, or one removed (a rotation, as a key service does it).
key() {
  local verb=${1:-} id=${2:-} secret=${3:-}
  case $verb in
    add) [ -n "$secret" ] || usage
      in_ns radosgw-admin -c "$conf" key create --uid packfs --key-type s3 \
        --access-key "$id" --secret-key "$secret" >/dev/null ;;
    rm) [ -n "$id" ] || usage
      in_ns radosgw-admin -c "$conf" key rm --uid packfs --key-type s3 --access-key "$id" >/dev/null ;;
    *) usage ;;
  esac
}

ops() {
  in_ns ceph -c "$conf" daemon client.rgw.a perf dump | python3 -c '
import json, sys
rgw = json.load(sys.stdin)["rgw"]
print(json.dumps({k: v for k, v in rgw.items() if isinstance(v, int)}))'
}

case $action in
  up) up ;;
  ops) ops ;;
  key) key "${@:3}" ;;
  down) down ;;
  *) usage ;;
esac
