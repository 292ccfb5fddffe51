#!/usr/bin/env bash
# A real shared file system on this one machine, for tests and benchmarks: its servers in a
# network namespace of their own, its FUSE client on the host, as a compute node sees it.
#
#   bench/sharedfs.sh up moosefs DIR [N]   servers and data under DIR, client mounted at DIR/mnt
#   bench/sharedfs.sh ops moosefs DIR      the master's operation counters for the mount, as JSON
#                                          (this hour's and the last hour's)
#   bench/sharedfs.sh down moosefs DIR     client unmounted, servers stopped, namespace removed
#
# N (1-250, default 1) numbers the instance: its namespace is packfs-mfs-N, its subnet
# 10.77.N.0/24, so several can run at once (one per test). Servers are started with nsenter
# into the namespace's network only: `ip netns exec` would also give them a private copy of the
# mount table, which pins every FUSE mount present at that moment (a packfs daemon stayed alive
# 60 s after `packfs umount`). Needs root and Debian's moosefs-master, moosefs-chunkserver,
# moosefs-client and moosefs-cli (.ci/run installs them).
set -euo pipefail

usage() {
  sed -n '5,7p' "$0" >&2
  exit 2
}

[ $# -ge 3 ] || usage
action=$1 fs=$2 dir=$3 n=${4:-}
[ "$fs" = moosefs ] || { echo "sharedfs.sh: unknown file system '$fs' (known: moosefs)" >&2; exit 2; }

# The instance number is kept in DIR once up, so ops and down need only DIR.
if [ -z "$n" ]; then
  n=$(cat "$dir/instance" 2>/dev/null || echo 1)
fi
case $n in
  '' | *[!0-9]*) echo "sharedfs.sh: instance number '$n' is not 1-250" >&2; exit 2 ;;
esac
[ "$n" -ge 1 ] && [ "$n" -le 250 ] || { echo "sharedfs.sh: instance number $n is not 1-250" >&2; exit 2; }
ns=packfs-mfs-$n
host_if=pfsmfs${n}h
ns_if=pfsmfs${n}n
master=10.77.$n.2
in_ns() { nsenter --net="/run/netns/$ns" "$@"; }

# The master's counters of the mount's operations, by name: statfs getattr setattr lookup mkdir
# rmdir symlink readlink mknod unlink rename link readdir open read write total; `current` for
# this hour, `last` for the hour before (the master starts new counts each hour: a count that
# went down since it was read last is `last` minus the earlier count plus `current`). `read` and
# `write` here are the client asking where a chunk's data lies (the data itself comes from the
# chunkserver), so they are requests the metadata server answers too.
ops() {
  local current last
  current=$(mfscli -H "$master" -SMO -m 1 -p -s ' ' 2>/dev/null | grep -F "$dir/mnt" | head -1) || true
  last=$(mfscli -H "$master" -SMO -m 0 -p -s ' ' 2>/dev/null | grep -F "$dir/mnt" | head -1) || true
  [ -n "$current" ] && [ -n "$last" ] || { echo "sharedfs.sh: no mount of $dir/mnt known to the master at $master" >&2; exit 1; }
  # Each line: "active mounts, operations: IP PATH c1 ... c17" (words split on spaces).
  python3 - "$current" "$last" <<'EOF'
import json, sys
names = ("statfs getattr setattr lookup mkdir rmdir symlink readlink mknod unlink rename link "
         "readdir open read write total").split()
counts = lambda line: dict(zip(names, (int(w) for w in line.split()[-len(names):])))
print(json.dumps({"current": counts(sys.argv[1]), "last": counts(sys.argv[2])}))
EOF
}

down() {
  if mountpoint -q "$dir/mnt" 2>/dev/null; then
    umount "$dir/mnt" 2>/dev/null || umount -l "$dir/mnt" 2>/dev/null || true
  fi
  if [ -e "/run/netns/$ns" ]; then
    [ -f "$dir/mfschunkserver.cfg" ] && in_ns mfschunkserver -c "$dir/mfschunkserver.cfg" stop >/dev/null 2>&1 || true
    [ -f "$dir/mfsmaster.cfg" ] && in_ns mfsmaster -c "$dir/mfsmaster.cfg" stop >/dev/null 2>&1 || true
  fi
  # Whatever did not stop (a server left by a killed run).
  pkill -9 -f "mfs(master|chunkserver) -c $dir/" 2>/dev/null || true
  ip link del "$host_if" 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
}

up() {
  for tool in mfsmaster mfschunkserver mfsmount mfscli nsenter ip; do
    command -v "$tool" >/dev/null || {
      echo "sharedfs.sh: $tool is missing (apt-get install moosefs-master moosefs-chunkserver moosefs-client moosefs-cli iproute2)" >&2
      exit 1
    }
  done
  down
  mkdir -p "$dir/master" "$dir/chunks/data" "$dir/mnt"
  echo "$n" > "$dir/instance"
  ip netns add "$ns"
  ip link add "$host_if" type veth peer name "$ns_if"
  ip link set "$ns_if" netns "$ns"
  ip addr add "10.77.$n.1/24" dev "$host_if"
  ip link set "$host_if" up
  in_ns ip addr add "$master/24" dev "$ns_if"
  in_ns ip link set "$ns_if" up
  in_ns ip link set lo up

  cp /var/lib/mfs/metadata.mfs.empty "$dir/master/metadata.mfs"
  cat > "$dir/mfsmaster.cfg" <<EOF
WORKING_USER = root
WORKING_GROUP = root
DATA_PATH = $dir/master
EXPORTS_FILENAME = $dir/mfsexports.cfg
TOPOLOGY_FILENAME = $dir/mfstopology.cfg
SYSLOG_IDENT = packfs-mfsmaster-$n
EOF
  echo '* / rw,alldirs,maproot=0:0' > "$dir/mfsexports.cfg"
  : > "$dir/mfstopology.cfg"
  cat > "$dir/mfschunkserver.cfg" <<EOF
WORKING_USER = root
WORKING_GROUP = root
DATA_PATH = $dir/chunks
HDD_CONF_FILENAME = $dir/mfshdd.cfg
MASTER_HOST = $master
SYSLOG_IDENT = packfs-mfschunkserver-$n
EOF
  echo "$dir/chunks/data" > "$dir/mfshdd.cfg"
  in_ns mfsmaster -c "$dir/mfsmaster.cfg" start >"$dir/master.log" 2>&1
  in_ns mfschunkserver -c "$dir/mfschunkserver.cfg" start >"$dir/chunkserver.log" 2>&1
  mfsmount "$dir/mnt" -H "$master" >"$dir/client.log" 2>&1
  # One copy of each chunk: there is one chunkserver.
  mfssetgoal -r 1 "$dir/mnt" >/dev/null
  # Ready when the chunkserver has registered and a file can be written and read back.
  local i
  for i in $(seq 1 100); do
    if echo ready > "$dir/mnt/.ready" 2>/dev/null && [ "$(cat "$dir/mnt/.ready" 2>/dev/null)" = ready ]; then
      rm -f "$dir/mnt/.ready"
      echo "moosefs $n up: client at $dir/mnt, master $master"
      return 0
    fi
    sleep 0.1
  done
  echo "sharedfs.sh: moosefs did not come up in 10 s; logs in $dir" >&2
  exit 1
}

case $action in
  up) up ;;
  ops) ops ;;
  down) down ;;
  *) usage ;;
esac
