#!/usr/bin/env python3
"""The engine in a training process against the daemon, on the same images, in one run: peak
resident memory of `packfs.Engine` (16 threads, and 1, over the interpreter with the module
loaded; the callers' buffers made before the baseline) and of a daemon's mount (16 threads
reading through it: VmHWM), both under a 16 MiB cache, each thread reading 1 MiB at random
offsets of random files.

    python3 bench/memory/engine.py [--mib 240] [--reads 30] [--dir /tmp/packfs-engine-memory]

Needs a release build (`cargo build --release`: target/release/packfs and libpackfs.so), xz,
bzip2, zstd and split. The images: a tar of 24 files of text (random words, about 2.5:1 under
xz), as `.tar.xz` with 64 MiB blocks, `.tar.bz2` (-9) and 64 MiB zstd frames.
"""

import argparse
import os
import random
import resource
import subprocess
import sys
import tarfile
import io
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(ROOT, "target/release/packfs")
MODULE = os.path.join(ROOT, "target/release/libpackfs.so")


def make_images(dir, mib):
    tar = os.path.join(dir, "d.tar")
    if not os.path.exists(tar):
        rng = random.Random(3)
        words = [bytes(rng.randrange(97, 123) for _ in range(rng.randrange(3, 9)))
                 for _ in range(5000)]
        per = (mib << 20) // 24
        with tarfile.open(tar, "w", format=tarfile.GNU_FORMAT) as t:
            for i in range(24):
                parts, n = [], 0
                while n < per:
                    w = words[rng.randrange(len(words))]
                    parts.append(w + b" ")
                    n += len(w) + 1
                data = b"".join(parts)[:per]
                info = tarfile.TarInfo(f"f{i:02}.txt")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    made = {
        "64 MiB xz blocks": ("d.tar.xz", f"xz -T2 -0 --block-size=64MiB -c {tar} > d.tar.xz"),
        "bzip2 -9": ("d.tar.bz2", f"bzip2 -9 -c {tar} > d.tar.bz2"),
        "64 MiB zstd frames": ("d.frames.tar.zst",
                               f"split -b 64M --filter='zstd -q -c' < {tar} > d.frames.tar.zst"),
    }
    for what, (name, cmd) in made.items():
        if not os.path.exists(os.path.join(dir, name)):
            subprocess.run(cmd, shell=True, check=True, cwd=dir)
    return {what: os.path.join(dir, name) for what, (name, _) in made.items()}


ENGINE = r"""
import os, random, resource, sys, threading
sys.path.insert(0, sys.argv[4])
import packfs
from packfs.engine import native
native()
image, threads, reads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
bufs = [bytearray(1 << 20) for _ in range(threads)]
for b in bufs:
    b[::4096] = b"x" * len(b[::4096])
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with packfs.Engine(image, cache_size="16M") as e:
    names = sorted(n for n, k in e.scandir("") if k == "f")
    def work(k):
        rng = random.Random(k)
        for _ in range(reads):
            n = rng.choice(names)
            at = rng.randrange(0, e.stat(n).st_size - (1 << 20))
            assert e.readinto(n, bufs[k], at) == 1 << 20
    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    [t.start() for t in ts]
    [t.join() for t in ts]
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)
"""


def engine_peak(image, threads, reads):
    out = subprocess.run(
        [sys.executable, "-c", ENGINE, image, str(threads), str(reads), os.path.join(ROOT, "python")],
        env={**os.environ, "PACKFS_NATIVE": MODULE}, capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def daemon_peak(image, threads, reads, dir):
    mnt, pid_file = os.path.join(dir, "mnt"), os.path.join(dir, "daemon.pid")
    os.makedirs(mnt, exist_ok=True)
    subprocess.run([BIN, "mount", "--quiet", "--cache-size", "16M", "--pid-file", pid_file,
                    image, mnt], check=True)
    pid = int(open(pid_file).read())
    try:
        names = sorted(os.listdir(mnt))

        def work(k):
            rng = random.Random(k)
            for _ in range(reads):
                path = os.path.join(mnt, rng.choice(names))
                with open(path, "rb", buffering=0) as f:
                    at = rng.randrange(0, os.path.getsize(path) - (1 << 20))
                    assert len(os.pread(f.fileno(), 1 << 20, at)) == 1 << 20

        ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        hwm = next(l for l in open(f"/proc/{pid}/status") if l.startswith("VmHWM"))
        return int(hwm.split()[1]) / 1024
    finally:
        subprocess.run([BIN, "umount", mnt], check=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=240, help="MiB of the tar (default 240)")
    p.add_argument("--reads", type=int, default=30, help="reads per thread (default 30)")
    p.add_argument("--dir", default="/tmp/packfs-engine-memory")
    args = p.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    print("| images | engine, 16 threads (MiB) | engine, 1 thread | daemon, 16 threads | "
          "engine / daemon |")
    print("|---|---:|---:|---:|---:|")
    for what, image in make_images(args.dir, args.mib).items():
        many = engine_peak(image, 16, args.reads)
        one = engine_peak(image, 1, max(args.reads // 3, 1))
        daemon = daemon_peak(image, 16, args.reads, args.dir)
        print(f"| {what} | {many:.1f} | {one:.1f} | {daemon:.1f} | {many / daemon:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
