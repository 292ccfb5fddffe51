#!/usr/bin/env python3
"""What Python's default open() costs per file on a packfs mount, and what packfs's loader saves:
warm passes (best of 3) in one process over the same files on a packfs mount and on a tmpfs copy:

- plain reads: open(p, "rb").read() (CPython asks isatty(), an ioctl FUSE forwards to the daemon)
  against packfs.open_bytes(p);
- decoding: torchvision's default loader against packfs.torch.pil_loader (RGB PIL images).

    sudo target/test-venv/bin/python bench/loader.py [--dataset imagenet-20k] [--decode 2000]
"""
import argparse, os, shutil, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "python")]
import run as peers  # noqa: E402

os.environ.setdefault("PACKFS_BIN", os.path.join(HERE, "..", "target", "release", "packfs"))
import packfs  # noqa: E402


OPEN = "open(p, 'rb')"


def default_open(p):
    with open(p, "rb") as f:
        return f.read()


def best(fn, paths):
    rates = []
    for _ in range(3):
        t = time.perf_counter()
        for p in paths:
            fn(p)
        rates.append(len(paths) / (time.perf_counter() - t))
    return max(rates)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="imagenet-20k")
    ap.add_argument("--decode", type=int, default=2000, help="files decoded per pass")
    ap.add_argument("--work", default="/tmp/packfs-bench")
    args = ap.parse_args()
    from torchvision.datasets.folder import default_loader
    from packfs.torch import pil_loader

    ds, _ = peers.ensure_dataset(args.dataset, args.work)
    shards = sorted(os.path.join(ds, "shards", s) for s in os.listdir(os.path.join(ds, "shards"))
                    if s.endswith(".tar"))
    copy = f"/dev/shm/packfs-loader-{args.dataset}"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(os.path.join(ds, "tree"), copy)
    rows = {}
    try:
        with packfs.mount(shards, cache_size="4G") as m:
            for name, root in (("packfs", str(m.path)), ("tmpfs", copy)):
                rel = [os.path.relpath(os.path.join(d, n), root)
                       for d, _, ns in os.walk(root) for n in ns]
                rel.sort()
                paths = [os.path.join(root, r) for r in rel]
                for p in paths:  # warm: every file once in the page cache
                    packfs.open_bytes(p)
                few = paths[:: max(1, len(paths) // args.decode)]
                rows[name] = {
                    OPEN: best(default_open, paths),
                    "packfs.open_bytes": best(packfs.open_bytes, paths),
                    "default_loader": best(default_loader, few),
                    "packfs.torch.pil_loader": best(pil_loader, few),
                }
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    print(f"\n{args.dataset}, warm, one process, files/s (best of 3):\n")
    print("| read | packfs | tmpfs | packfs / tmpfs |\n|---|---:|---:|---:|")
    for k in rows["packfs"]:
        a, b = rows["packfs"][k], rows["tmpfs"][k]
        print(f"| {k} | {a:,.0f} | {b:,.0f} | {a / b:.2f}x |")
    p = rows["packfs"]
    print(f"\npackfs: open_bytes / open() = {p['packfs.open_bytes'] / p[OPEN]:.2f}x; "
          f"pil_loader / default_loader = {p['packfs.torch.pil_loader'] / p['default_loader']:.2f}x")

if __name__ == "__main__":
    main()
