#!/usr/bin/env python3
"""The engine in the process (packfs.Engine) against the other ways to read one shard's members
by path, measured in one run: the packfs FUSE mount, ratarmountcore's fsspec filesystem,
fsspec's tar://, wids, and the same files on tmpfs (native). Prints ratios against the mount and
native files, and writes the raw figures as JSON (docs/benchmarks/inprocess.md).

    sudo PACKFS_BIN=target/release/packfs PACKFS_NATIVE=target/release/libpackfs.so \\
        PYTHONPATH=python target/test-venv/bin/python bench/inprocess.py --out bench/out/inprocess.json

Cells, each in a fresh process (its peak RSS is reported with it), rounds alternating peers:
  random   every member once in a random order, with 1, 8 and 32 threads; warm (every cache
           warm after one pass) and cold (the kernel's caches dropped before the pass: root)
  loader   a DataLoader epoch (2 workers) of JPEGs decoded by PIL: packfs.datasets.ImageFolder
           against torchvision's ImageFolder over the mount and over the native files
  npz      4 MiB .npz samples loaded with numpy (MLPerf Storage's U-Net-like shape)
Needs torch, torchvision, fsspec, numpy, wids and ratarmountcore (pip) in the Python that runs it.
"""

import argparse
import hashlib
import io
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

PEERS = ["engine", "mount", "ratarmount", "fsspec-tar", "wids", "native"]


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


# ---- what each peer does in a cell (in its own process) ----

def opener(peer, data):
    """A function path -> bytes for `peer`, and what must stay open."""
    shard, mnt, native = data["shard"], data["mnt"], data["native"]
    if peer == "engine":
        import packfs
        engine = packfs.Engine(shard, cache_size="256M")
        return engine.read
    if peer == "mount":
        return lambda p: _read_file(os.path.join(mnt, p))
    if peer == "native":
        root = data["native_cold"] if data.get("cold") else native
        return lambda p: _read_file(os.path.join(root, p))
    if peer in ("ratarmount", "fsspec-tar"):
        # One filesystem per thread: ratarmountcore's SQLite index is its opening thread's.
        import threading
        local = threading.local()

        def make():
            if peer == "ratarmount":
                from ratarmountcore.SQLiteIndexedTarFsspec import SQLiteIndexedTarFileSystem
                return SQLiteIndexedTarFileSystem(shard, writeIndex=True, skip_instance_cache=True)
            import fsspec
            return fsspec.filesystem("tar", fo=shard, skip_instance_cache=True)

        def read(p):
            fs = getattr(local, "fs", None)
            if fs is None:
                fs = local.fs = make()
            return fs.cat_file(p)

        read(data["paths"][0])
        return read
    if peer == "wids":
        import threading
        from wids.wids_tar import TarFileReader
        local = threading.local()
        names = {}

        def read(p):
            reader = getattr(local, "reader", None)
            if reader is None:
                reader = local.reader = TarFileReader(shard, verbose=False)
                if not names:
                    names.update({n: i for i, n in enumerate(reader.names())})
            return reader.get_file(names[p])[1].getvalue()

        read(data["paths"][0])
        return read
    raise SystemExit(f"unknown peer {peer}")


def _read_file(path):
    # os.open and one read: Python's open() adds an isatty ioctl, a round trip on a mount.
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        return os.read(fd, size) if size else b""
    finally:
        os.close(fd)


def cell_random(peer, threads, data, seed):
    read = opener(peer, data)
    paths = list(data["paths"])
    random.Random(seed).shuffle(paths)
    if not data.get("cold"):
        for p in paths:  # warm every cache the peer has
            read(p)
    # Each thread reads every threads-th path of the order: no queue between them.
    slices = [paths[i::threads] for i in range(threads)]
    with ThreadPoolExecutor(threads) as pool:
        start = time.perf_counter()
        total = sum(pool.map(lambda part: sum(len(read(p)) for p in part), slices))
        took = time.perf_counter() - start
    assert total == data["bytes"], (peer, total, data["bytes"])
    return {"files_per_s": len(paths) / took, "seconds": took}


def cell_loader(peer, data):
    import torch
    import torchvision
    from torch.utils.data import DataLoader

    tf = torchvision.transforms.Compose([torchvision.transforms.CenterCrop(56),
                                         torchvision.transforms.ToTensor()])
    if peer == "engine":
        from packfs.datasets import ImageFolder
        ds = ImageFolder(data["jpeg_shard"], transform=tf, cache_size="256M")
    else:
        root = data["jpeg_mnt"] if peer == "mount" else data["jpeg_native"]
        ds = torchvision.datasets.ImageFolder(root, transform=tf)
    loader = DataLoader(ds, batch_size=64, shuffle=True, num_workers=2,
                        generator=torch.Generator().manual_seed(0))
    for _ in loader:  # warm
        pass
    start = time.perf_counter()
    n = sum(len(y) for _, y in loader)
    took = time.perf_counter() - start
    return {"files_per_s": n / took, "seconds": took}


def cell_npz(peer, data):
    import numpy as np

    paths = list(data["npz_paths"])
    if peer == "engine":
        import packfs
        engine = packfs.Engine(data["npz_shard"], cache_size="256M")
        # A file object over the engine (np.load of a BytesIO is three times slower, for the
        # engine's bytes and a native file's alike).
        load = lambda p: np.load(engine.open(p))["x"]  # noqa: E731
    else:
        root = data["npz_mnt"] if peer == "mount" else data["npz_native"]
        load = lambda p: np.load(os.path.join(root, p))["x"]  # noqa: E731
    for p in paths:
        load(p)
    start = time.perf_counter()
    for _ in range(3):
        for p in paths:
            assert load(p).shape == (1024, 1024)
    took = time.perf_counter() - start
    return {"files_per_s": 3 * len(paths) / took, "seconds": took}


def run_cell(args):
    data = json.loads(args.cell_data)
    kind, peer = args.cell[0], args.cell[1]
    if kind == "random":
        out = cell_random(peer, int(args.cell[2]), data, int(args.cell[3]))
    elif kind == "loader":
        out = cell_loader(peer, data)
    else:
        out = cell_npz(peer, data)
    out["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


# ---- the parent: data, mounts, cells, ratios ----

def make_data(base, files, seed):
    rng = random.Random(seed)
    src = os.path.join(base, "src")
    paths, total = [], 0
    for i in range(files):
        path = f"train/c{i % 20:02}/s{i:05}.JPEG"
        size = rng.randrange(8_000, 200_000)
        os.makedirs(os.path.join(src, os.path.dirname(path)), exist_ok=True)
        with open(os.path.join(src, path), "wb") as f:
            f.write(rng.randbytes(size))
        paths.append(path)
        total += size
    shard = os.path.join(base, "shard.tar")
    subprocess.run(["tar", "-C", src, "-cf", shard, "train"], check=True)
    native = tempfile.mkdtemp(prefix="packfs-bench-", dir="/dev/shm")
    shutil.copytree(os.path.join(src, "train"), os.path.join(native, "train"))
    return {"shard": shard, "native": native, "native_cold": src, "paths": paths, "bytes": total}


def make_jpegs(base, count):
    from PIL import Image
    import numpy as np

    src = os.path.join(base, "jpeg")
    rng = np.random.default_rng(0)
    for i in range(count):
        d = os.path.join(src, f"class{i % 10}")
        os.makedirs(d, exist_ok=True)
        pixels = rng.integers(0, 255, (96, 96, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(os.path.join(d, f"{i:05}.jpg"), quality=90)
    shard = os.path.join(base, "jpeg.tar")
    subprocess.run(["tar", "-C", src, "-cf", shard, "."], check=True)
    native = tempfile.mkdtemp(prefix="packfs-bench-jpeg-", dir="/dev/shm")
    shutil.copytree(src, native, dirs_exist_ok=True)
    return shard, native


def make_npz(base, count):
    import numpy as np

    src = os.path.join(base, "npz")
    os.makedirs(src)
    rng = np.random.default_rng(1)
    paths = []
    for i in range(count):
        p = f"{i:04}.npz"
        np.savez(os.path.join(src, p), x=rng.random((1024, 1024), dtype=np.float32))
        paths.append(p)
    shard = os.path.join(base, "npz.tar")
    subprocess.run(["tar", "-C", src, "-cf", shard, *paths], check=True)
    native = tempfile.mkdtemp(prefix="packfs-bench-npz-", dir="/dev/shm")
    for p in paths:
        shutil.copy(os.path.join(src, p), native)
    return shard, native, paths


def mount(binary, image, mnt):
    os.makedirs(mnt, exist_ok=True)
    subprocess.run([binary, "mount", "--cache-size", "256M", image, mnt], check=True)


def cell(spec, data, cold=False):
    if cold:
        drop_caches()
    payload = json.dumps({**data, "cold": cold})
    done = subprocess.run([sys.executable, __file__, "--cell", *map(str, spec),
                           "--cell-data", payload], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"cell {spec} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--threads", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--peers", default=",".join(PEERS))
    ap.add_argument("--parts", default="warm,cold,loader,npz")
    ap.add_argument("--jpegs", type=int, default=2000)
    ap.add_argument("--npz", type=int, default=48)
    ap.add_argument("--out")
    ap.add_argument("--cell", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--cell-data", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cell:
        return run_cell(args)
    binary = os.environ.get("PACKFS_BIN", "target/release/packfs")
    peers = args.peers.split(",")
    parts = args.parts.split(",")
    threads = [int(t) for t in args.threads.split(",")]
    base = tempfile.mkdtemp(prefix="packfs-inprocess-", dir="/var/tmp")
    mounts = []
    results = {"files": args.files, "rounds": args.rounds, "cells": {}}
    try:
        data = make_data(base, args.files, 5)
        data["mnt"] = os.path.join(base, "mnt")
        mount(binary, data["shard"], data["mnt"])
        mounts.append(data["mnt"])
        if "loader" in parts:
            data["jpeg_shard"], data["jpeg_native"] = make_jpegs(base, args.jpegs)
            data["jpeg_mnt"] = os.path.join(base, "jpeg-mnt")
            mount(binary, data["jpeg_shard"], data["jpeg_mnt"])
            mounts.append(data["jpeg_mnt"])
        if "npz" in parts:
            data["npz_shard"], data["npz_native"], data["npz_paths"] = make_npz(base, args.npz)
            data["npz_mnt"] = os.path.join(base, "npz-mnt")
            mount(binary, data["npz_shard"], data["npz_mnt"])
            mounts.append(data["npz_mnt"])
        specs = []
        for mode in ("warm", "cold"):
            if mode in parts:
                specs += [(mode, ("random", p, t)) for t in threads for p in peers]
        if "loader" in parts:
            specs += [("loader", ("loader", p)) for p in ("engine", "mount", "native")]
        if "npz" in parts:
            specs += [("npz", ("npz", p)) for p in ("engine", "mount", "native")]
        for r in range(args.rounds):
            for mode, spec in specs:
                full = spec + (r,) if spec[0] == "random" else spec
                got = cell(full, data, cold=(mode == "cold"))
                key = "/".join([mode, *map(str, spec[1:])])
                results["cells"].setdefault(key, []).append(got)
                print(f"round {r + 1} {key}: {got['files_per_s']:.0f} files/s, "
                      f"rss {got['rss_mib']:.0f} MiB", flush=True)
    finally:
        for m in mounts:
            subprocess.run([binary, "umount", m], check=False)
        for d in (data.get("native"), data.get("jpeg_native"), data.get("npz_native"), base):
            if d:
                shutil.rmtree(d, ignore_errors=True)
    report(results)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


def report(results):
    med = {k: statistics.median(c["files_per_s"] for c in v) for k, v in results["cells"].items()}
    rss = {k: max(c["rss_mib"] for c in v) for k, v in results["cells"].items()}
    print("\nmedian files/s, and ratios of the engine:")
    for key in sorted(med):
        parts = key.split("/")
        line = f"{key:28} {med[key]:10.0f}/s  rss {rss[key]:6.0f} MiB"
        if parts[1] == "engine":
            for peer in PEERS[1:]:
                other = "/".join([parts[0], peer, *parts[2:]])
                if other in med:
                    line += f"  {med[key] / med[other]:.2f}x {peer}"
        print(line)
    results["medians"] = med


if __name__ == "__main__":
    main()
