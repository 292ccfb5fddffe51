#!/usr/bin/env python3
"""Classic /dev/fuse loop against FUSE over io_uring on whole workloads, in one run.

For each transport, packfs mounts the tar shards of a dataset made by gen_dataset.py (real JPEGs;
imagenet-20k by default) and runs bench/workloads.py:
  cold   a fresh mount (shards in the host page cache, nothing in the mount's caches): every
         file opened with Python's open() (one isatty ioctl each), read whole, in a shuffled order
  warm   the same mount again: data and names in the kernel's caches, only the ioctl goes out
  loader a DataLoader epoch (PIL decode, resize) over the first 5 000 files, fresh mount
with 1 and 8 readers (loader: 4 workers), and the same on a copy of the tree in /dev/shm (tmpfs).
Passes of the two transports alternate, `--rounds` times; the table gives the best round.

Root only (mount, the module parameter). bench/transport.sh builds and runs it.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKFS = HERE.parent / "target/release/packfs"
URING_PARAM = Path("/sys/module/fuse/parameters/enable_uring")


def workload(kind, root, listing, readers):
    out = subprocess.run(
        [sys.executable, HERE / "workloads.py", kind, root, "--list", listing,
         "--readers", str(readers), "--deadline", "300"],
        check=True, capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return r["files"] / r["seconds"]


class Mounted:
    def __init__(self, shards, transport):
        self.shards, self.transport = shards, transport

    def __enter__(self):
        self.mnt = Path(tempfile.mkdtemp(prefix="packfs-transport-"))
        env = dict(os.environ, PACKFS_TRANSPORT=self.transport)
        subprocess.run([PACKFS, "mount", "-q", *self.shards, self.mnt], check=True, env=env)
        status = subprocess.run([PACKFS, "status", self.mnt], capture_output=True,
                                text=True).stdout
        if (self.transport == "uring") != ("io_uring" in status):
            raise SystemExit(f"{self.transport} asked, status says:\n{status}")
        return self.mnt

    def __exit__(self, *exc):
        subprocess.run([PACKFS, "umount", self.mnt], check=False)
        os.rmdir(self.mnt)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="/tmp/packfs-bench/imagenet-20k")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--loader", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: it mounts and sets fuse's enable_uring")
    data = Path(args.dataset)
    shards = sorted(str(p) for p in (data / "shards").glob("train-*.tar"))
    if not shards:
        raise SystemExit(f"no shards under {data}: make them with bench/gen_dataset.py")
    tree = data / "tree"
    names = sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file())
    random.Random(1).shuffle(names)
    work = Path(tempfile.mkdtemp(prefix="packfs-transport-"))
    listing = work / "list"
    listing.write_text("\n".join(names) + "\n")
    shm = Path(tempfile.mkdtemp(prefix="packfs-transport-", dir="/dev/shm"))
    subprocess.run(["cp", "-a", tree, shm / "tree"], check=True)
    old = URING_PARAM.read_text().strip() if URING_PARAM.exists() else None
    if old is None:
        raise SystemExit("this kernel has no FUSE over io_uring")
    URING_PARAM.write_text("Y")
    results = {}

    def record(key, rate):
        results.setdefault(key, []).append(rate)
        print(f"{' '.join(map(str, key)):32} {rate:9.0f} files/s", file=sys.stderr)

    try:
        for _ in range(args.rounds):
            for readers in (1, 8):
                record(("tmpfs", "read", readers), workload("read", shm / "tree", listing, readers))
                for transport in ("classic", "uring"):
                    with Mounted(shards, transport) as mnt:
                        record((transport, "cold", readers),
                               workload("read", mnt, listing, readers))
                        record((transport, "warm", readers),
                               workload("read", mnt, listing, readers))
        if args.loader:
            record(("tmpfs", "loader", 4), workload("loader", shm / "tree", listing, 4))
            for transport in ("classic", "uring"):
                with Mounted(shards, transport) as mnt:
                    record((transport, "loader", 4), workload("loader", mnt, listing, 4))
    finally:
        URING_PARAM.write_text(old)
        subprocess.run(["rm", "-rf", work, shm], check=False)

    best = {k: max(v) for k, v in results.items()}
    if args.out:
        args.out.write_text(json.dumps(
            {"dataset": str(data), "files": len(names), "rounds": args.rounds,
             "runs": [{"target": k[0], "pass": k[1], "readers": k[2], "files_per_s": v}
                      for k, v in results.items()]}, indent=1) + "\n")
    print("| pass | readers | tmpfs | classic | uring | uring / classic |")
    print("|---|---:|---:|---:|---:|---:|")
    for pass_, readers in [("cold", 1), ("cold", 8), ("warm", 1), ("warm", 8), ("loader", 4)]:
        c, u = best.get(("classic", pass_, readers)), best.get(("uring", pass_, readers))
        t = best.get(("tmpfs", "loader" if pass_ == "loader" else "read", readers))
        if c is None or u is None:
            continue
        print(f"| {pass_} | {readers} | {t:,.0f} | {c:,.0f} | {u:,.0f} | {u / c:.2f}x |")


if __name__ == "__main__":
    main()
