#!/usr/bin/env python3
"""A real DDP loop over packfs with the share sampler: torch.distributed (gloo), 2 simulated
nodes with 2 ranks each on this machine, each node a packfs mount staging its share
(--stage-share K/2, in /dev/shm), a linear classifier over generated 16x16 images. Per epoch:
the mean loss and the bytes the nodes read from the images (the parallel file system's part),
for DistributedSampler (global), q = 0.1 and q = 0. Not an accuracy claim: it shows the sampler
in a real loop (set_epoch, equal counts, no hang at the epoch's end).

    sudo target/test-venv/bin/python bench/ddp.py [--per-class 400] [--epochs 4]
"""
import argparse, json, os, shutil, socket, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("PACKFS_BIN", os.path.join(ROOT, "target", "release", "packfs"))
os.environ["PYTHONPATH"] = os.path.join(ROOT, "python")
import packfs  # noqa: E402

WORKER = os.path.join(ROOT, "python", "tests", "ddp_worker.py")


def make_shards(work, classes, per_class, shards):
    """Class-coloured noisy images, dealt over tar shards so each shard mixes the classes."""
    import numpy as np
    from PIL import Image

    src = os.path.join(work, "src")
    rng = np.random.default_rng(3)
    names = []
    for c in range(classes):
        os.makedirs(os.path.join(src, f"class{c:02d}"))
        colour = rng.integers(0, 256, 3)
        for i in range(per_class):
            pixels = np.clip(colour + rng.normal(0, 60, (16, 16, 3)), 0, 255).astype(np.uint8)
            name = f"class{c:02d}/{i:04d}.jpg"
            Image.fromarray(pixels).save(os.path.join(src, name), quality=90)
            names.append(name)
    rng.shuffle(names)
    out = []
    for k in range(shards):
        shard = os.path.join(work, f"shard-{k:02d}.tar")
        subprocess.run(["tar", "-cf", shard, "-C", src, *sorted(names[k::shards])], check=True)
        out.append(shard)
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(q, shards, nodes, per_node, epochs):
    mounts = []
    try:
        for k in range(nodes):
            stage = f"/dev/shm/packfs-ddp-stage{k}"
            shutil.rmtree(stage, ignore_errors=True)
            # No RAM tier, and the page cache dropped each epoch (DROP_CACHES): every epoch
            # reads as if the dataset were larger than the nodes' memory.
            mounts.append(packfs.mount(shards, stage=stage, stage_share=(k, nodes), cache_size=0))
        for m in mounts:  # as after a prologue: each node's share is staged
            while m.status()["counters"]["stage"]["status"] != "complete":
                time.sleep(0.1)
        port = free_port()
        procs = []
        for rank in range(nodes * per_node):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(nodes * per_node),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       NODE_MOUNT=str(mounts[rank // per_node].path), SHARDS=":".join(shards),
                       Q=q, RANKS_PER_NODE=str(per_node), EPOCHS=str(epochs), BATCH="16", DROP_CACHES="1",
                       OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen([sys.executable, WORKER], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        results = []
        for p in procs:
            out, err = p.communicate(timeout=1800)
            if p.returncode:
                raise RuntimeError(err.decode())
            results.append(json.loads(out))
        return results
    finally:
        for m in mounts:
            m.unmount()
        for k in range(nodes):
            shutil.rmtree(f"/dev/shm/packfs-ddp-stage{k}", ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--classes", type=int, default=8)
    ap.add_argument("--per-class", type=int, default=400)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    args = ap.parse_args()
    nodes, per_node = 2, 2
    work = tempfile.mkdtemp(prefix="packfs-ddp-")
    try:
        shards = make_shards(work, args.classes, args.per_class, args.shards)
        dataset_bytes = sum(f.size for f in packfs.Catalog(shards).files)
        table = {}
        for q in ("global", "0.1", "0"):
            results = run(q, shards, nodes, per_node, args.epochs)
            counts = {len(e["samples"]) for r in results for e in r["epochs"]}
            assert len(counts) == 1, f"unequal counts {counts}"
            table[q] = [
                {"loss": sum(r["epochs"][e]["loss"] for r in results) / len(results),
                 "pfs_bytes": sum(r["epochs"][e]["node_source_bytes"]
                                  for r in results if r["rank"] % per_node == 0)}
                for e in range(args.epochs)
            ]
            print(f"{q}: {counts.pop()} samples per rank per epoch", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"ddp-{time.strftime('%Y%m%dT%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump({"dataset_bytes": dataset_bytes, "nodes": nodes, "ranks_per_node": per_node,
                   "table": table}, f, indent=1)
    print(f"\n{args.classes * args.per_class} images, {dataset_bytes / 1e6:.1f} MB, {nodes} nodes x "
          f"{per_node} ranks, gloo; loss (mean over ranks) / PFS bytes as a fraction of the "
          "dataset\n")
    print("| epoch | " + " | ".join(f"{q}: loss | {q}: PFS" for q in table) + " |")
    print("|---:|" + "---:|---:|" * len(table))
    for e in range(args.epochs):
        cells = []
        for q in table:
            row = table[q][e]
            cells += [f"{row['loss']:.3f}", f"{row['pfs_bytes'] / dataset_bytes:.3f}"]
        print(f"| {e + 1} | " + " | ".join(cells) + " |")
    print(f"\nJSON: {path}")


if __name__ == "__main__":
    main()
