# Sourced by bench/sharedfs.sh and bench/s3gw.sh: one network namespace per instance of a
# server, joined to the host by a veth pair. Servers are started in it with `in_ns` (nsenter into
# its network only: `ip netns exec` would also give them a private copy of the mount table, which
# pins every FUSE mount present at that moment).
#
# An instance is claimed by its DIR (/run/packfs-netns/NAMESPACE/dir) from `up` to the end of
# `down`: a second `up` of the same number fails (exit 3) instead of sharing the address, and a
# late `down` of an old DIR never removes a namespace a newer DIR has since made.
#
# netns_init KIND SUBNET DIR [N] sets n (the instance: N, else the one kept in DIR, else 1;
# 1-250), ns (packfs-KIND-N), host_if, ns_if and addr (SUBNET.N.2, the servers' address).

netns_init() {
  local kind=$1 subnet=$2 dir=$3
  n=${4:-}
  if [ -z "$n" ]; then
    n=$(cat "$dir/instance" 2>/dev/null || echo 1)
  fi
  case $n in
    '' | *[!0-9]*) echo "$(basename "$0"): instance number '$n' is not 1-250" >&2; exit 2 ;;
  esac
  [ "$n" -ge 1 ] && [ "$n" -le 250 ] || { echo "$(basename "$0"): instance number $n is not 1-250" >&2; exit 2; }
  ns=packfs-$kind-$n
  host_if=pfs$kind${n}h
  ns_if=pfs$kind${n}n
  host_addr=$subnet.$n.1
  addr=$subnet.$n.2
}

in_ns() { nsenter --net="/run/netns/$ns" "$@"; }

netns_claims=/run/packfs-netns

# The DIR that holds the claim on this instance, if any.
netns_owner() { cat "$netns_claims/$ns/dir" 2>/dev/null || true; }

# The namespace and its link, with the instance number kept in DIR for later calls.
netns_up() {
  local dir owner
  dir=$(cd "$1" && pwd)
  mkdir -p "$netns_claims"
  if ! mkdir "$netns_claims/$ns" 2>/dev/null; then
    owner=$(netns_owner)
    # A claim whose DIR is gone was left by a run that could not take it down.
    if [ -n "$owner" ] && [ "$owner" != "$dir" ] && [ -d "$owner" ]; then
      echo "$(basename "$0"): instance $n is in use by $owner; take it down ($0 down ... $owner) or choose another number" >&2
      exit 3
    fi
  fi
  echo "$dir" > "$netns_claims/$ns/dir"
  echo "$n" > "$1/instance"
  ip netns del "$ns" 2>/dev/null || true
  ip link del "$host_if" 2>/dev/null || true
  ip netns add "$ns"
  ip link add "$host_if" type veth peer name "$ns_if"
  ip link set "$ns_if" netns "$ns"
  ip addr add "$host_addr/24" dev "$host_if"
  ip link set "$host_if" up
  in_ns ip addr add "$addr/24" dev "$ns_if"
  in_ns ip link set "$ns_if" up
  in_ns ip link set lo up
}

# Removes the namespace and its link, unless another DIR has claimed the instance since.
netns_down() {
  local dir owner
  dir=$(cd "$1" 2>/dev/null && pwd) || return 0
  owner=$(netns_owner)
  [ -z "$owner" ] || [ "$owner" = "$dir" ] || return 0
  ip link del "$host_if" 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "${netns_claims:?}/$ns"
}
