#!/usr/bin/env python3
"""Walk and read every file of a tree, with N reader processes; print one JSON line of figures.

Usage: walk_read.py ROOT --readers N [--api open|os] [--label NAME]
The walk is os.walk plus a stat of every file; the read opens, reads whole and closes every file,
in a shuffled order shared by all runs (seeded), split over N processes. `--api open` reads with
Python's open() as PIL and ImageFolder do (it calls isatty(), an ioctl, on every open); `--api os`
uses os.open/os.read, which does not.
"""
import argparse, json, os, random, time
from multiprocessing import Pool


def walk(root):
    files = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            os.stat(path)
            files.append(path)
    return files


def read_all(paths):
    total = 0
    for p in paths:
        with open(p, "rb") as f:
            total += len(f.read())
    return total


def read_all_os(paths):
    total = 0
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
        os.close(fd)
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--readers", type=int, default=1)
    ap.add_argument("--label", default="")
    ap.add_argument("--api", choices=["open", "os"], default="open")
    args = ap.parse_args()
    t0 = time.perf_counter()
    files = walk(args.root)
    walk_s = time.perf_counter() - t0
    files.sort()
    random.Random(1).shuffle(files)
    chunks = [files[i :: args.readers] for i in range(args.readers)]
    t0 = time.perf_counter()
    reader = read_all if args.api == "open" else read_all_os
    if args.readers == 1:
        total = reader(files)
    else:
        with Pool(args.readers) as pool:
            total = sum(pool.map(reader, chunks))
    read_s = time.perf_counter() - t0
    print(json.dumps({
        "label": args.label, "api": args.api, "readers": args.readers, "files": len(files), "bytes": total,
        "walk_s": round(walk_s, 3), "read_s": round(read_s, 3),
        "files_per_s": round(len(files) / read_s), "mb_per_s": round(total / read_s / 1e6, 1),
    }))


if __name__ == "__main__":
    main()
