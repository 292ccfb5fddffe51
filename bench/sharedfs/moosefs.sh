# Sourced by bench/sharedfs.sh: MooseFS 3.0, a master and a chunkserver in the namespace, the
# FUSE client on the host. Its master counts every request of each client.

netns_init mfs 10.77 "$dir" "$n"
master=$addr
# The MooseFS CLI (another program in its place for the tests of the counting).
mfscli=${PACKFS_MFSCLI:-mfscli}

# The master's counts of the mount's operations since `up`, by name: statfs getattr setattr
# lookup mkdir rmdir symlink readlink mknod unlink rename link readdir open read write total.
# The master counts by the hour (this hour's and the last's): the running totals are kept in
# DIR/ops.json, and a count lower than the one seen before means a new hour began, whose first
# part is the last hour's count beyond it. `read` and `write` here are the client asking where a
# chunk's data lies (the data itself comes from the chunkserver), so they are requests the
# metadata server answers too.
moosefs_ops() {
  local current last
  current=$("$mfscli" -H "$master" -SMO -m 1 -p -s ' ' 2>/dev/null | grep -F "$dir/mnt" | head -1) || true
  last=$("$mfscli" -H "$master" -SMO -m 0 -p -s ' ' 2>/dev/null | grep -F "$dir/mnt" | head -1) || true
  [ -n "$current" ] && [ -n "$last" ] || { echo "sharedfs.sh: no mount of $dir/mnt known to the master at $master" >&2; exit 1; }
  # Each line: "active mounts, operations: IP PATH c1 ... c17" (words split on spaces).
  python3 - "$current" "$last" "$dir/ops.json" <<'EOF'
import json, os, sys
names = ("statfs getattr setattr lookup mkdir rmdir symlink readlink mknod unlink rename link "
         "readdir open read write total").split()
counts = lambda line: dict(zip(names, (int(w) for w in line.split()[-len(names):])))
now, last, path = counts(sys.argv[1]), counts(sys.argv[2]), sys.argv[3]
try:
    with open(path) as f:
        state = json.load(f)
except FileNotFoundError:
    state = {"seen": now, "totals": dict.fromkeys(names, 0)}
for k, v in now.items():
    was = state["seen"][k]
    state["totals"][k] += v - was if v >= was else max(last[k] - was, 0) + v
state["seen"] = now
with open(path + ".tmp", "w") as f:
    json.dump(state, f)
os.replace(path + ".tmp", path)
print(json.dumps(state["totals"]))
EOF
}

moosefs_down() {
  if mountpoint -q "$dir/mnt" 2>/dev/null; then
    umount "$dir/mnt" 2>/dev/null || umount -l "$dir/mnt" 2>/dev/null || true
  fi
  if [ -e "/run/netns/$ns" ]; then
    [ -f "$dir/mfschunkserver.cfg" ] && in_ns mfschunkserver -c "$dir/mfschunkserver.cfg" stop >/dev/null 2>&1 || true
    [ -f "$dir/mfsmaster.cfg" ] && in_ns mfsmaster -c "$dir/mfsmaster.cfg" stop >/dev/null 2>&1 || true
  fi
  # Whatever did not stop (a server left by a killed run).
  pkill -9 -f "mfs(master|chunkserver) -c $dir/" 2>/dev/null || true
  netns_down "$dir"
}

moosefs_up() {
  for tool in mfsmaster mfschunkserver mfsmount mfscli nsenter ip; do
    command -v "$tool" >/dev/null || {
      echo "sharedfs.sh: $tool is missing (apt-get install moosefs-master moosefs-chunkserver moosefs-client moosefs-cli iproute2)" >&2
      exit 1
    }
  done
  moosefs_down
  mkdir -p "$dir/master" "$dir/chunks/data" "$dir/mnt"
  rm -f "$dir/ops.json"
  netns_up "$dir"

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
  if client_ready; then
    echo "moosefs $n up: client at $dir/mnt, master $master"
    return 0
  fi
  echo "sharedfs.sh: moosefs did not come up in 10 s; logs in $dir" >&2
  exit 1
}

