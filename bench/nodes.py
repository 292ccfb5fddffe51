#!/usr/bin/env python3
"""Several nodes on one machine: N packfs mounts of one index on bench/pfssim (each a "node",
with its own stage directory and --stage-share K/N), one reader process per node iterating its
sampler (plain reads, no decode) for a few epochs. Per epoch and node: PFS bytes and requests
(the node's packfs source counters; the simulator's totals beside them), staged bytes, files/s.

    sudo bash bench/pfs.sh --help >/dev/null   # builds packfs and pfssim once
    sudo target/test-venv/bin/python bench/nodes.py [--datasets imagenet-20k] [--nodes 4]

Rows: DistributedSampler without staging; DistributedSampler with shares (the waste); the share
sampler at Q = 0, 0.1, 0.3, 1; a full copy per node; and, cold without staging, the
shard-ordered sampler against random order. The page cache is dropped before every epoch, as
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

ROWS = ["ddp-nostage", "ddp-shares", "q0", "q0.1", "q0.3", "q1", "full-copy", "random-cold",
        "shard-ordered-cold"]


def sampler_for(row, dataset, catalog, root, nodes, node, epoch):
    import torch.utils.data as tud
    from packfs.torch import ShardOrderedSampler, ShareSampler

    if row.startswith("q"):
        s = ShareSampler(dataset, catalog, root, q=float(row[1:]), num_replicas=nodes, rank=node,
                         ranks_per_node=1, seed=0)
    elif row == "shard-ordered-cold":
        s = ShardOrderedSampler(dataset, catalog, root, num_replicas=nodes, rank=node, seed=0,
                                run_length=64, buffer=4)
    else:
        s = tud.DistributedSampler(dataset, num_replicas=nodes, rank=node, seed=0)
    s.set_epoch(epoch)
    return s


def reader(row, root, rel_paths, catalog, nodes, node, epochs, barrier, out):
    dataset = [os.path.join(root, p) for p in rel_paths]  # what the samplers index
    for epoch in range(epochs):
        order = list(sampler_for(row, dataset, catalog, root, nodes, node, epoch))
        barrier.wait()  # the parent dropped caches and read the counters
        t = time.perf_counter()
        for i in order:
            packfs.open_bytes(dataset[i])
        out.put((node, epoch, len(order), time.perf_counter() - t))
        barrier.wait()


def served(mnt):
    """A node's source and stage counters, as its stats file (rewritten every second) has them."""
    c = packfs.status(mnt)[0]["counters"]
    return {"pfs_bytes": c["source"]["bytes"], "pfs_reads": c["source"]["reads"],
            "staged": (c.get("stage") or {}).get("present_bytes", 0),
            "stage_status": (c.get("stage") or {}).get("status")}


def one_row(row, pfs, work, nodes, epochs, rel_paths, dataset_bytes, cache_size):
    mounts = []
    stages = []
    try:
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
            mounts.append(packfs.mount(pfs.path(os.path.basename(pfs.index)), mnt, **opts))
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
            barrier.wait()
            barrier.wait()
            time.sleep(1.2)  # the stats files catch up
            after = [served(m.path) for m in mounts]
            sim = pfsbench.ops_between(sim_before, pfs.counters())
            per_node = [out.get() for _ in range(nodes)]
            per_node.sort()
            ep = {"nodes": []}
            for k, (_, _, files, secs) in enumerate(per_node):
                ep["nodes"].append({
                    "files": files, "files_per_s": round(files / secs, 1),
                    "pfs_bytes": after[k]["pfs_bytes"] - before[k]["pfs_bytes"],
                    "pfs_reads": after[k]["pfs_reads"] - before[k]["pfs_reads"],
                    "staged": after[k]["staged"]})
            ep["pfs_bytes"] = sum(n["pfs_bytes"] for n in ep["nodes"])
            ep["pfs_fraction"] = round(ep["pfs_bytes"] / dataset_bytes, 4)
            ep["pfs_reads"] = sum(n["pfs_reads"] for n in ep["nodes"])
            ep["sim"] = {"reads": sim["reads"], "bytes": sim["bytes"], "meta": sim["meta"]}
            # Files/s of the job: all files over the slowest node's time.
            ep["files_per_s"] = round(sum(n["files"] for n in ep["nodes"]) / max(
                n["files"] / n["files_per_s"] for n in ep["nodes"]), 1)
            result["epochs"].append(ep)
            print(f"  {row} epoch {epoch + 1}: {ep['files_per_s']} files/s, PFS "
                  f"{ep['pfs_bytes'] / 1e6:.0f} MB ({ep['pfs_fraction']:.3f} of the dataset) in "
                  f"{ep['pfs_reads']} reads, staged per node "
                  f"{[round(n['staged'] / 1e6) for n in ep['nodes']]} MB", flush=True)
        for p in procs:
            p.join()
        return result
    finally:
        for m in mounts:
            m.unmount()
        for s in stages:
            shutil.rmtree(s, ignore_errors=True)


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
    ap.add_argument("--work", default="/tmp/packfs-bench")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("nodes.py needs root: it drops the page cache")
    os.makedirs(args.out, exist_ok=True)
    mp.set_start_method("fork")
    results = {"nodes": args.nodes, "profile": args.profile, "datasets": {}}
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
