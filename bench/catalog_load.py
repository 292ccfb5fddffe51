#!/usr/bin/env python3
"""How long `packfs.Catalog(index)` takes for an ImageNet-sized dataset: one tar shard per 10 000
members of ImageNet-like names (empty files: only the catalog matters), written by Python's
tarfile, indexed by `packfs index`, then loaded (median of 3), with the share sampler's setup
over it beside.

    python3 bench/catalog_load.py [--files 1281167] [--work /tmp/packfs-catalog-bench]
"""
import argparse, os, statistics, subprocess, sys, tarfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("PACKFS_BIN", os.path.join(ROOT, "target", "release", "packfs"))
import packfs  # noqa: E402


def shards(files, work):
    names = [f"train/n{i // 1281:08d}/n{i // 1281:08d}_{i:07d}.JPEG" for i in range(files)]
    out = []
    per = 10_000
    for k in range(0, files, per):
        path = os.path.join(work, f"shard-{k // per:04d}.tar")
        out.append(path)
        if os.path.exists(path):
            continue
        with tarfile.open(path + ".tmp", "w", format=tarfile.GNU_FORMAT) as tar:
            for name in names[k : k + per]:
                tar.addfile(tarfile.TarInfo(name))
        os.rename(path + ".tmp", path)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=1_281_167)
    ap.add_argument("--work", default="/tmp/packfs-catalog-bench")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    t = time.perf_counter()
    images = shards(args.files, args.work)
    print(f"{len(images)} shards ready in {time.perf_counter() - t:.0f} s", flush=True)
    index = os.path.join(args.work, f"n{args.files}.packfs-index")
    if not os.path.exists(index):
        subprocess.run([packfs.binary(), "index", "-q", "-o", index, *images], check=True)
    times = []
    for _ in range(3):
        t = time.perf_counter()
        catalog = packfs.Catalog(index, shares=4)
        times.append(time.perf_counter() - t)
    assert len(catalog) == args.files
    print(f"packfs.Catalog: {len(catalog)} files, {len(catalog.images)} images: "
          f"median {statistics.median(times):.2f} s (runs: {', '.join(f'{x:.2f}' for x in times)})")
    try:
        from packfs.torch import ShareSampler
    except ImportError:
        return
    paths = [f.path for f in catalog.files]
    t = time.perf_counter()
    sampler = ShareSampler(paths, catalog, q=0.1, num_replicas=16, rank=5, ranks_per_node=4)
    setup = time.perf_counter() - t
    t = time.perf_counter()
    n = len(list(sampler))
    print(f"ShareSampler (4 nodes x 4 ranks): setup {setup:.2f} s, one epoch's order "
          f"{time.perf_counter() - t:.2f} s ({n} samples for this rank)")


if __name__ == "__main__":
    main()
