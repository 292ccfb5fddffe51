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
. "$(dirname "$0")/ceph.sh"

down() { ceph_down; }

up() {
  for tool in radosgw radosgw-admin curl; do
    command -v "$tool" >/dev/null || {
      echo "s3gw.sh: $tool is missing (apt-get install radosgw curl)" >&2
      exit 1
    }
  done
  down
  mkdir -p "$dir/rgw"
  # The watcher comes first, so that a start that fails half-way is taken down too.
  if [ -n "${S3GW_DOWN_WITH:-}" ]; then
    setsid nohup bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; bash "$2" down "$3"; rm -rf "$3"' \
      s3gw-watch "$S3GW_DOWN_WITH" "$0" "$dir" >/dev/null 2>&1 </dev/null &
  fi
  # S3 requests are signed and checked by the gateway (cephx, inside the cluster, is off).
  ceph_up "[client.rgw.a]
rgw frontends = beast endpoint=$addr:8080
rgw data = $dir/rgw"
  ceph_step "the gateway" in_ns radosgw -c "$conf" -n client.rgw.a
  local i code=000
  for i in $(seq 1 300); do
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://$addr:8080/" 2>/dev/null || true)
    [ "$code" = 200 ] && break
    sleep 0.2
  done
  [ "$code" = 200 ] || ceph_fail "the gateway did not answer in 60 s (last status $code); logs in $dir/log"
  local key secret
  key=PACKFS$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr a-f A-F)
  secret=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  ceph_step "the S3 user" in_ns radosgw-admin -c "$conf" user create --uid packfs --display-name packfs \
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
