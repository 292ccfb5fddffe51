# Sourced by bench/sharedfs.sh: GlusterFS 10, glusterd and one brick in the namespace, the FUSE
# client on the host. Gluster has no metadata server: every operation goes to the bricks, which
# count them by kind (`gluster volume profile`). One instance at a time: glusterd's CLI socket
# (/run/glusterd.socket) and its bricks' pid files are the machine's.

netns_init gl 10.79 "$dir" "$n"
volume=packfs-$n
gluster_cli() { gluster --mode=script "$@"; }

# The bricks' counts of operations since `up`, by kind (lookup, stat, open, flush, release,
# read, ...), `total` the operations other than read and write (what a metadata server would
# answer), `read_bytes` the data the bricks read.
glusterfs_ops() {
  gluster_cli volume profile "$volume" info cumulative | python3 -c '
import json, sys
ops, total, read_bytes = {}, 0, 0
for line in sys.stdin:
    words = line.split()
    if line.strip().startswith("Data Read:"):
        read_bytes += int(words[2])
    if len(words) >= 6 and words[-2].isdigit() and words[-1].isupper():
        ops[words[-1].lower()] = ops.get(words[-1].lower(), 0) + int(words[-2])
ops["total"] = sum(v for k, v in ops.items() if k not in ("read", "write"))
ops["read_bytes"] = read_bytes
print(json.dumps(ops))'
}

glusterfs_down() {
  if mountpoint -q "$dir/mnt" 2>/dev/null; then
    umount "$dir/mnt" 2>/dev/null || umount -l "$dir/mnt" 2>/dev/null || true
  fi
  if [ -f "$dir/run/glusterd.pid" ] && kill -0 "$(cat "$dir/run/glusterd.pid")" 2>/dev/null; then
    gluster_cli volume stop "$volume" force >/dev/null 2>&1 || true
    kill "$(cat "$dir/run/glusterd.pid")" 2>/dev/null || true
  fi
  # Whatever did not stop (a brick or a glusterd left by a killed run).
  pkill -9 -f "^/usr/sbin/glusterfsd .*--brick-name $dir/brick" 2>/dev/null || true
  pkill -9 -f "^glusterd -f $dir/glusterd.vol" 2>/dev/null || true
  netns_down "$dir"
}

glusterfs_up() {
  for tool in glusterd gluster glusterfs nsenter ip; do
    command -v "$tool" >/dev/null || {
      echo "sharedfs.sh: $tool is missing (apt-get install glusterfs-server glusterfs-client iproute2)" >&2
      exit 1
    }
  done
  if pgrep -x glusterd >/dev/null; then
    echo "sharedfs.sh: a glusterd runs already (one GlusterFS instance at a time: its CLI socket is the machine's)" >&2
    exit 1
  fi
  glusterfs_down
  rm -rf "$dir/glusterd" "$dir/brick" "$dir/log" "$dir/run"
  mkdir -p "$dir/glusterd" "$dir/brick" "$dir/mnt" "$dir/log" "$dir/run"
  netns_up "$dir"
  sed "s|/var/lib/glusterd|$dir/glusterd|" /etc/glusterfs/glusterd.vol > "$dir/glusterd.vol"
  in_ns glusterd -f "$dir/glusterd.vol" -p "$dir/run/glusterd.pid" -l "$dir/log/glusterd.log"
  local i
  for i in $(seq 1 100); do
    gluster_cli peer status >/dev/null 2>&1 && break
    sleep 0.1
  done
  # `force`: the brick is on the root file system.
  gluster_cli volume create "$volume" "$addr:$dir/brick" force >"$dir/log/create.out" 2>&1 &&
    gluster_cli volume start "$volume" >>"$dir/log/create.out" 2>&1 &&
    gluster_cli volume profile "$volume" start >>"$dir/log/create.out" 2>&1 || {
    echo "sharedfs.sh: the GlusterFS volume did not start:" >&2
    cat "$dir/log/create.out" >&2
    tail -n 15 "$dir/log/glusterd.log" >&2
    exit 1
  }
  glusterfs --volfile-server="$addr" --volfile-id="$volume" --log-file="$dir/log/client.log" "$dir/mnt"
  if client_ready; then
    echo "glusterfs $n up: client at $dir/mnt, volume $volume at $addr"
    return 0
  fi
  echo "sharedfs.sh: glusterfs did not come up in 10 s; logs in $dir/log" >&2
  exit 1
}
