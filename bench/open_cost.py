#!/usr/bin/env python3
"""What one Python open() costs on a FUSE mount: warm reads of the same files with open(p, "rb")
(default buffering: CPython up to 3.13 calls isatty(), an ioctl that FUSE forwards to the daemon)
and with open(p, "rb", buffering=0) (no isatty), on packfs, squashfuse_ll and the kernel's squashfs.

    sudo python3 bench/open_cost.py [--image PATH] [--files 4000]

Uses the zstd image and sample list left by bench/squashfs_read.py. Prints µs per file (best of 3
warm passes).
"""
import argparse, os, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import squashfs_read as sq  # noqa: E402


def best_pass(paths, buffering):
    best = None
    for _ in range(3):
        t = time.perf_counter()
        for p in paths:
            with open(p, "rb", buffering=buffering) as f:
                f.read()
        dt = (time.perf_counter() - t) / len(paths)
        best = dt if best is None else min(best, dt)
    return best * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", default="/tmp/packfs-bench/imagenet-20k/image-zstd.sqfs")
    ap.add_argument("--list", default="/tmp/packfs-bench/imagenet-20k.squashfs-sample")
    ap.add_argument("--files", type=int, default=4000)
    ap.add_argument("--work", default="/tmp/packfs-bench")
    args = ap.parse_args()
    with open(args.list) as f:
        rel = [line.strip() for line in f][:args.files]
    mnt = os.path.join(args.work, "mnt", "open-cost")
    os.makedirs(mnt, exist_ok=True)
    print(f"{args.files} files, warm, µs per file (best of 3 passes)\n")
    print("| peer | open(p, 'rb') | open(p, 'rb', buffering=0) |")
    print("|---|---|---|")
    for peer in ("packfs", "squashfuse_ll", "kernel-squashfs"):
        sq.mount(peer, args.image, mnt, os.path.join(args.work, "open-cost.log"), "64M")
        paths = [os.path.join(mnt, r) for r in rel]
        best_pass(paths, 0)  # fill the page cache
        buffered, raw = best_pass(paths, -1), best_pass(paths, 0)
        sq.unmount(peer, mnt)
        print(f"| {peer} | {buffered:.0f} | {raw:.0f} |", flush=True)


if __name__ == "__main__":
    main()
