#!/usr/bin/env python3
"""Several nodes on one machine: N packfs mounts of one index on bench/pfssim (each a "node",
with its own stage directory and --stage-share K/N), one reader process per node iterating its
sampler (plain reads, no decode) for a few epochs. Per epoch and node: PFS bytes and requests
(the node's packfs source counters; the simulator's totals beside them), staged bytes, files/s.

    sudo bash bench/pfs.sh --help >/dev/null   # builds packfs and pfssim once
    sudo target/test-venv/bin/python bench/nodes.py [--datasets imagenet-20k] [--nodes 4]

Rows: DistributedSampler without staging; DistributedSampler with shares (the waste); the share
sampler at Q = 0, 0.1, 0.3, 1; the same with peers (`q0.1-peers`, `q1-peers`: each node's
daemon in a network namespace of its own, started with `nsenter --net`, the namespaces joined by
a bridge in another, every node reading the other shares from the node that stages them,
`--peers`); a full copy per node; and, cold without staging, the shard-ordered sampler against
random order. Per epoch also the latency of each sample read (p50, p99), apart for samples of
the node's own share (staged here) and of the others (from the PFS, or from a peer). The page cache is dropped before every epoch, as
for a dataset larger than a node's memory. Needs torch (the samplers) in the Python running it.
"""
import argparse, json, multiprocessing as mp, os, shutil, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "python")]
import pfs as pfsbench  # noqa: E402
import run as peers  # noqa: E402

PACKFS = pfsbench.PACKFS
os.environ.setdefault("PACKFS_BIN", PACKFS)

import packfs  # noqa: E402

ROWS = ["ddp-nostage", "ddp-shares", "q0", "q0.1", "q0.3", "q1", "q0.1-peers", "q1-peers",
        "full-copy", "random-cold", "shard-ordered-cold"]
PEER_PORT = 7797
HINTS = True  # the share sampler sends each epoch's order to the mount (--no-hints: not)


def sampler_for(row, dataset, catalog, root, nodes, node, epoch):
    import torch.utils.data as tud
    from packfs.torch import ShardOrderedSampler, ShareSampler

    if row.startswith("q"):
        s = ShareSampler(dataset, catalog, root, q=float(row[1:].removesuffix("-peers")),
                         num_replicas=nodes, rank=node, ranks_per_node=1, seed=0, hints=HINTS)
    elif row == "shard-ordered-cold":
        s = ShardOrderedSampler(dataset, catalog, root, num_replicas=nodes, rank=node, seed=0,
                                run_length=64, buffer=4)
    else:
        s = tud.DistributedSampler(dataset, num_replicas=nodes, rank=node, seed=0)
    s.set_epoch(epoch)
    return s


def reader(row, root, rel_paths, catalog, nodes, node, epochs, barrier, out):
    dataset = [os.path.join(root, p) for p in rel_paths]  # what the samplers index
    local = [catalog.image_shares[f.image] == node for f in catalog.files]
    for epoch in range(epochs):
        order = list(sampler_for(row, dataset, catalog, root, nodes, node, epoch))
        barrier.wait()  # the parent dropped caches and read the counters
        lat = ([], [])  # seconds per sample: other shares', this node's
        t = time.perf_counter()
        for i in order:
            t0 = time.perf_counter()
            packfs.open_bytes(dataset[i])
            lat[local[i]].append(time.perf_counter() - t0)
        out.put((node, epoch, len(order), time.perf_counter() - t, lat))
        barrier.wait()


def percentiles(secs):
    if not secs:
        return None
    s = sorted(secs)
    at = lambda q: round(s[min(len(s) - 1, int(q * len(s)))] * 1e3, 3)  # noqa: E731
    return {"n": len(s), "p50_ms": at(0.5), "p99_ms": at(0.99)}


class Net:
    """One network namespace per node, joined by a bridge in another, as tests/peers.rs builds
    them; daemons enter theirs with `nsenter --net` (never `ip netns exec`, whose private mount
    table would pin every FUSE mount)."""

    def __init__(self, nodes, tag=91):
        self.nodes = [f"pfsb{tag}n{k}" for k in range(nodes)]
        self.switch = f"pfsb{tag}sw"
        self.addrs = [f"10.78.{tag}.{k + 1}" for k in range(nodes)]
        self.down()
        sw = self.switch
        script = [f"ip netns add {sw}", f"ip -n {sw} link add br0 type bridge",
                  f"ip -n {sw} link set br0 up"]
        for k, (ns, addr) in enumerate(zip(self.nodes, self.addrs)):
            a, b = f"pb{tag}n{k}", f"pb{tag}s{k}"
            script += [f"ip netns add {ns}", f"ip link add {a} type veth peer name {b}",
                       f"ip link set {a} netns {ns}", f"ip link set {b} netns {sw}",
                       f"ip -n {sw} link set {b} master br0", f"ip -n {sw} link set {b} up",
                       f"ip -n {ns} addr add {addr}/24 dev {a}", f"ip -n {ns} link set {a} up",
                       f"ip -n {ns} link set lo up"]
        subprocess.run(["bash", "-ec", "\n".join(script)], check=True)

    def down(self):
        for ns in self.nodes + [self.switch]:
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)


class NodeMount:
    """`packfs mount` run in node k's namespace; the mount is in the host's table."""

    def __init__(self, net, k, source, mnt, args):
        self.path = mnt
        subprocess.run(["nsenter", f"--net=/run/netns/{net.nodes[k]}", PACKFS, "mount", *args,
                        source, mnt], check=True)

    def unmount(self):
        subprocess.run([PACKFS, "umount", self.path], check=True)


def cpu_seconds(pid):
    """User and system CPU time of process `pid` so far (all its threads)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def served(mnt):
    """A node's source and stage counters, as its stats file (rewritten every second) has them."""
    c = packfs.status(mnt)[0]["counters"]
    p = c.get("peers") or {}
    # With peers, the images' reads count the chunks the peers gave: the PFS gave the rest.
    return {"pfs_bytes": c["source"]["bytes"] - p.get("fetched_bytes", 0),
            "pfs_reads": c["source"]["reads"],  # with peers: reads of the images, peers' too
            "peer_bytes": p.get("fetched_bytes", 0), "peer_chunks": p.get("fetched_chunks", 0),
            "fallbacks": sum((p.get("fallbacks") or {}).values()),
            "peer_latency": p.get("peers", []),
            "staged": (c.get("stage") or {}).get("present_bytes", 0),
            "stage_status": (c.get("stage") or {}).get("status"),
            "cpu_s": cpu_seconds(c["pid"])}


def one_row(row, pfs, work, nodes, epochs, rel_paths, dataset_bytes, cache_size):
    mounts = []
    stages = []
    net = Net(nodes) if row.endswith("-peers") else None
    try:
        if net:
            secret = os.path.join(work, "peers.secret")
            with open(os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                f.write(os.urandom(24).hex())
            peer_list = ",".join(f"{a}:{PEER_PORT}" for a in net.addrs)
        for k in range(nodes):
            mnt = os.path.join(work, "mnt", f"node{k}")
            os.makedirs(mnt, exist_ok=True)
            opts = dict(cache_size=cache_size, quiet=True,
                        log_file=os.path.join(work, f"node{k}.log"))
            if row.endswith("-cold"):
                opts["ram_chunks"] = "true"  # chunks pay off only for reads in archive order
            if row not in ("ddp-nostage", "random-cold", "shard-ordered-cold"):
                stage = f"/dev/shm/packfs-nodes-stage{k}"
                shutil.rmtree(stage, ignore_errors=True)
                stages.append(stage)
                opts["stage"] = stage
                if row != "full-copy":
                    opts["stage_share"] = (k, nodes)
            index = pfs.path(os.path.basename(pfs.index))
            if net:
                args = ["--cache-size", cache_size, "--quiet", "--log-file", opts["log_file"],
                        "--stage", opts["stage"], "--stage-share", f"{k}/{nodes}",
                        "--peers", peer_list, "--peer-secret", secret]
                mounts.append(NodeMount(net, k, index, mnt, args))
            else:
                mounts.append(packfs.mount(index, mnt, **opts))
        catalog = packfs.Catalog(pfs.path(os.path.basename(pfs.index)), shares=nodes)
        barrier = mp.Barrier(nodes + 1)
        out = mp.Queue()
        procs = [mp.Process(target=reader, args=(row, str(m.path), rel_paths, catalog, nodes, k,
                                                 epochs, barrier, out))
                 for k, m in enumerate(mounts)]
        for p in procs:
            p.start()
        result = {"epochs": []}
        for epoch in range(epochs):
            if epoch == 1 and stages:
                t = time.perf_counter()
                while any(served(m.path)["stage_status"] != "complete" for m in mounts):
                    time.sleep(0.2)
                result["stage_wait_s"] = round(time.perf_counter() - t, 1)
            peers.drop_caches()
            time.sleep(1.2)  # the stats files catch up
            before = [served(m.path) for m in mounts]
            sim_before = pfs.counters()
            sim_cpu = cpu_seconds(pfs.proc.pid)
            barrier.wait()
            barrier.wait()
            time.sleep(1.2)  # the stats files catch up
            after = [served(m.path) for m in mounts]
            sim = pfsbench.ops_between(sim_before, pfs.counters())
            per_node = [out.get() for _ in range(nodes)]
            per_node.sort(key=lambda r: r[0])
            ep = {"nodes": []}
            remote, own = [], []
            for k, (_, _, files, secs, (lat_remote, lat_own)) in enumerate(per_node):
                remote += lat_remote
                own += lat_own
                ep["nodes"].append({
                    "files": files, "files_per_s": round(files / secs, 1),
                    "pfs_bytes": after[k]["pfs_bytes"] - before[k]["pfs_bytes"],
                    "pfs_reads": after[k]["pfs_reads"] - before[k]["pfs_reads"],
                    "peer_bytes": after[k]["peer_bytes"] - before[k]["peer_bytes"],
                    "peer_chunks": after[k]["peer_chunks"] - before[k]["peer_chunks"],
                    "fallbacks": after[k]["fallbacks"] - before[k]["fallbacks"],
                    "staged": after[k]["staged"]})
            ep["sample_latency"] = {"own_share": percentiles(own),
                                    "other_shares": percentiles(remote)}
            # CPU time of the four daemons (serving peers included) and of the simulated PFS.
            ep["cpu_s"] = {"daemons": round(sum(a["cpu_s"] - b["cpu_s"]
                                                for a, b in zip(after, before)), 2),
                           "pfs": round(cpu_seconds(pfs.proc.pid) - sim_cpu, 2)}
            ep["peer_bytes"] = sum(n["peer_bytes"] for n in ep["nodes"])
            ep["fallbacks"] = sum(n["fallbacks"] for n in ep["nodes"])
            ep["pfs_bytes"] = sum(n["pfs_bytes"] for n in ep["nodes"])
            ep["pfs_fraction"] = round(ep["pfs_bytes"] / dataset_bytes, 4)
            ep["pfs_reads"] = sum(n["pfs_reads"] for n in ep["nodes"])
            ep["peer_requests"] = sum(n["peer_chunks"] for n in ep["nodes"])
            ep["sim"] = {"reads": sim["reads"], "bytes": sim["bytes"], "meta": sim["meta"]}
            # Files/s of the job: all files over the slowest node's time.
            ep["files_per_s"] = round(sum(n["files"] for n in ep["nodes"]) / max(
                n["files"] / n["files_per_s"] for n in ep["nodes"]), 1)
            result["epochs"].append(ep)
            lat = ep["sample_latency"]
            print(f"  {row} epoch {epoch + 1}: {ep['files_per_s']} files/s, PFS "
                  f"{ep['pfs_bytes'] / 1e6:.0f} MB ({ep['pfs_fraction']:.3f} of the dataset) in "
                  f"{ep['pfs_reads']} reads (simulator: {sim['bytes'] / 1e6:.0f} MB in {sim['reads']} "
                  f"reads), peers {ep['peer_bytes'] / 1e6:.0f} MB in {ep['peer_requests']} requests, {ep['fallbacks']} fallbacks, staged per "
                  f"node {[round(n['staged'] / 1e6) for n in ep['nodes']]} MB; CPU {ep['cpu_s']}; "
                  f"sample latency "
                  f"own share {lat['own_share']}, other shares {lat['other_shares']}", flush=True)
        if net:
            # Each node's fetches of whole chunks from each other node, over the row.
            result["peer_latency"] = [served(m.path)["peer_latency"] for m in mounts]
        for p in procs:
            p.join()
        return result
    finally:
        for m in mounts:
            m.unmount()
        for s in stages:
            shutil.rmtree(s, ignore_errors=True)
        if net:
            net.down()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", default="imagenet-20k")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--cache-size", default="64M", help="each node's --cache-size")
    ap.add_argument("--cold-cache-size", default="1G",
                    help="--cache-size of the two cold rows (read with --ram-chunks true)")
    ap.add_argument("--profile", default="typical")
    ap.add_argument("--no-hints", action="store_true",
                    help="the share sampler sends no order: every read waits for its bytes "
                    "(sample latency is then the latency of the tier that serves it)")
    ap.add_argument("--work", default="/tmp/packfs-bench")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("nodes.py needs root: it drops the page cache")
    os.makedirs(args.out, exist_ok=True)
    mp.set_start_method("fork")
    global HINTS
    HINTS = not args.no_hints
    results = {"nodes": args.nodes, "profile": args.profile, "hints": HINTS, "datasets": {}}
    path = os.path.join(args.out, f"nodes-{time.strftime('%Y%m%dT%H%M%S')}.json")
    for dsname in args.datasets.split(","):
        ds, meta = peers.ensure_dataset(dsname, args.work)
        pfs = pfsbench.Pfs(ds, args.work, args.profile, ["--data-cache", "none"])
        try:
            catalog = packfs.Catalog(pfs.path(os.path.basename(pfs.index)))
            rel = [os.fsdecode(f.path) for f in catalog.files]
            total = sum(f.size for f in catalog.files)
            entry = {"files": len(rel), "bytes": total, "rows": {}}
            print(f"{dsname}: {len(rel)} files, {total / 1e6:.0f} MB, {len(catalog.images)} "
                  f"images, {args.nodes} nodes", flush=True)
            for row in args.rows.split(","):
                cache = args.cold_cache_size if row.endswith("-cold") else args.cache_size
                entry["rows"][row] = one_row(row, pfs, args.work, args.nodes, args.epochs, rel,
                                             total, cache)
                results["datasets"][dsname] = entry
                with open(path, "w") as f:
                    json.dump(results, f, indent=1)
        finally:
            pfs.stop()
    print(f"JSON: {path}")


if __name__ == "__main__":
    main()
