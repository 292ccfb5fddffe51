#!/usr/bin/env python3
"""Large samples: the per-byte cost. Files of 1, 8, 64 and 512 MB (numpy .npy arrays of random
bytes), stored in tar shards, read cold and warm by 1, 2 and 8 reader processes, whole
(`f.read()`, `np.load`) and in 1 MiB reads, against the same files on the same disk (native),
in tmpfs, in a squashfs image through squashfuse_ll and through the kernel's squashfs. Prints
MB/s, packfs's ratio to native, the daemons' CPU seconds per GB read and the bytes they read
from storage per byte read (cold: /proc/PID/io's read_bytes over the pass).

Peer `packfs-index` mounts the index of `packfs pack`'s shards of the same files (a CRC-32
recorded for every member, checked before its first reply); `packfs` mounts the GNU tar shards
by scanning them (no CRC).

    bench/large.sh [--sizes 1,8,64,512] [--total-mb 1024] [--readers 1,2,8]
                   [--modes read,1m,npload] [--peers native,tmpfs,packfs,squashfuse_ll,kernel-squashfs]
                   [--rounds 3] [--work /tmp/packfs-bench-large] [--packfs BINARY]
                   [--before OLD_BINARY] [--mount-args "..."] [--out bench/out/large.json]

Cold: the page cache is dropped before the pass (tmpfs keeps its files: they are its memory).
Warm: the same pass again at once. Each round measures every peer once, back to back in a
rotating order; a cell is the median of `--rounds` passes, and packfs / native the median of
each round's ratio. `--before` adds a second packfs build (`packfs-before`) to the same rounds.
Root: it drops the page cache and mounts. The data is made once per (sizes, total) under --work.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from multiprocessing import Pool

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run as peers  # noqa: E402  (cache dropping, daemon pids, mount checks)

PACKFS = os.path.join(HERE, "..", "target", "release", "packfs")
MB = 1_000_000
CHUNK = 1 << 20


def make_data(work, sizes, total_mb):
    """native/s{S}/f{i}.npy for each size S (MB), at least two files a size and about
    total_mb of each; shards/s{S}-{k}.tar (two per size, GNU tar); image.sqfs of native/."""
    import numpy as np

    made_with = f"{sizes} {total_mb}\n"
    done = os.path.join(work, "done")
    if os.path.exists(done) and open(done).read() == made_with:
        return
    shutil.rmtree(work, ignore_errors=True)
    native = os.path.join(work, "native")
    rng = np.random.default_rng(1)
    block = rng.integers(0, 256, size=64 << 20, dtype=np.uint8)
    for s in sizes:
        d = os.path.join(native, f"s{s}")
        os.makedirs(d)
        for i in range(max(2, total_mb // s)):
            n = s * MB
            # Random bytes (incompressible), each file from its own place in the block.
            start = (i * 7_919_111) % (len(block) - min(n, len(block)) + 1)
            reps = -(-n // len(block))
            data = np.concatenate([np.roll(block, i)] * reps)[:n] if n > len(block) \
                else block[start:start + n]
            np.save(os.path.join(d, f"f{i:04d}.npy"), data)
    shards = os.path.join(work, "shards")
    os.makedirs(shards)
    for s in sizes:
        names = sorted(os.listdir(os.path.join(native, f"s{s}")))
        for k in range(2):
            part = [f"s{s}/{n}" for n in names[k::2]]
            subprocess.run(["tar", "-cf", os.path.join(shards, f"s{s}-{k}.tar"), "-C", native,
                            *part], check=True)
    if shutil.which("mksquashfs"):
        subprocess.run(["mksquashfs", native, os.path.join(work, "image.sqfs"), "-quiet",
                        "-noappend", "-processors", "2"], check=True, stdout=subprocess.DEVNULL)
    with open(done, "w") as f:
        f.write(made_with)


def read_file(job):
    path, mode = job
    if mode == "npload":
        import numpy as np

        return np.load(path).nbytes
    with open(path, "rb", buffering=0) as f:
        if mode == "read":
            return len(f.read())
        buf = bytearray(CHUNK)
        total = 0
        while True:
            n = f.readinto(buf)
            if not n:
                return total
            total += n


def pack(work, binary):
    """packed/native.packfs-index: `packfs pack` of native/, made once per data set."""
    index = os.path.join(work, "packed", "native.packfs-index")
    if not os.path.exists(index):
        subprocess.run([binary, "pack", "-q", os.path.join(work, "native"), "-o",
                        os.path.join(work, "packed")], check=True)
    return index


def storage_bytes(pid):
    """Bytes the process made storage read (its page-cache misses), from /proc/PID/io."""
    if not pid:
        return 0
    try:
        with open(f"/proc/{pid}/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))
    except (OSError, StopIteration):
        return 0


def cpu_seconds(pid):
    if not pid:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


class Peer:
    def __init__(self, name, work, mount_args, binary=None):
        self.name, self.work, self.mount_args = name, work, mount_args
        self.binary = binary or PACKFS
        self.mnt = os.path.join(work, "mnt", name)
        self.pid = None

    def start(self):
        native = os.path.join(self.work, "native")
        if self.name == "native":
            return native
        if self.name == "tmpfs":
            copy = "/dev/shm/packfs-bench-large"
            if not os.path.exists(os.path.join(copy, "done")):
                shutil.rmtree(copy, ignore_errors=True)
                shutil.copytree(native, copy)
                open(os.path.join(copy, "done"), "w").close()
            return copy
        os.makedirs(self.mnt, exist_ok=True)
        if self.name.startswith("packfs"):
            shards = sorted(os.path.join(self.work, "shards", n)
                            for n in os.listdir(os.path.join(self.work, "shards")))
            if self.name.endswith("-index"):
                shards = [pack(self.work, PACKFS)]
            subprocess.run([self.binary, "mount", "-q", *self.mount_args, *shards, self.mnt],
                           check=True)
        elif self.name == "squashfuse_ll":
            subprocess.run(["squashfuse_ll", os.path.join(self.work, "image.sqfs"), self.mnt],
                           check=True)
        elif self.name == "kernel-squashfs":
            subprocess.run(["mount", "-t", "squashfs", "-o", "loop,ro",
                            os.path.join(self.work, "image.sqfs"), self.mnt], check=True)
        if self.name.startswith("packfs") or self.name == "squashfuse_ll":
            self.pid = peers.daemon_pid(self.mnt)
        return self.mnt

    def stop(self):
        if self.name in ("native", "tmpfs"):
            return
        tool = [self.binary, "umount"] if self.name.startswith("packfs") else ["umount"]
        subprocess.run([*tool, self.mnt], capture_output=True)
        for _ in range(500):
            if not peers.is_mounted(self.mnt):
                break
            time.sleep(0.01)


def measure(peer, size, mode, readers, temp):
    """One pass of `readers` processes over the files of `size` through `peer`: MB/s and the
    daemon's CPU seconds per GB."""
    if temp == "cold":
        peers.drop_caches()
    root = peer.start()
    if peer.name.endswith("-index"):
        root = os.path.join(root, "native")
    d = os.path.join(root, f"s{size}")
    files = sorted(os.path.join(d, n) for n in os.listdir(d))
    with Pool(readers) as pool:
        if temp == "warm":
            one_pass(pool, files, mode)
        cpu0, io0 = cpu_seconds(peer.pid), storage_bytes(peer.pid)
        total, secs = one_pass(pool, files, mode)
        cpu = cpu_seconds(peer.pid) - cpu0
        io = storage_bytes(peer.pid) - io0
    peer.stop()
    return total / secs / MB, cpu / (total / 1e9), io / total


def one_pass(pool, files, mode):
    started = time.perf_counter()
    total = sum(pool.map(read_file, [(f, mode) for f in files], chunksize=1))
    return total, time.perf_counter() - started


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1,8,64,512")
    ap.add_argument("--total-mb", type=int, default=1024)
    ap.add_argument("--readers", default="1,2,8")
    ap.add_argument("--modes", default="read,1m,npload")
    ap.add_argument("--peers", default="native,tmpfs,packfs,squashfuse_ll,kernel-squashfs")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", default="/tmp/packfs-bench-large")
    ap.add_argument("--packfs", default=PACKFS)
    ap.add_argument("--before", help="a second packfs build, measured in the same rounds "
                    "(peer packfs-before)")
    ap.add_argument("--mount-args", default="")
    ap.add_argument("--out", default=os.path.join(HERE, "out", "large.json"))
    args = ap.parse_args()
    globals()["PACKFS"] = os.path.abspath(args.packfs)
    if os.geteuid() != 0:
        sys.exit("large.py needs root: it drops the page cache and mounts")
    sizes = [int(s) for s in args.sizes.split(",")]
    make_data(args.work, sizes, args.total_mb)
    names = [p for p in args.peers.split(",")
             if p not in ("squashfuse_ll",) or shutil.which("squashfuse_ll")]
    if not os.path.exists(os.path.join(args.work, "image.sqfs")):
        names = [p for p in names if p not in ("squashfuse_ll", "kernel-squashfs")]
    if args.before:
        for n in [n for n in names if n.startswith("packfs")]:
            names.insert(names.index(n), n.replace("packfs", "packfs-before"))
    peer_of = {n: Peer(n, args.work, args.mount_args.split(),
                       os.path.abspath(args.before) if n.startswith("packfs-before") else None)
               for n in names}
    rows = []
    # Every round measures each peer once, in a rotating order: the disk and the host drift over
    # minutes, and ratios are taken round by round (native and packfs measured back to back).
    for s in sizes:
        for mode in args.modes.split(","):
            for readers in [int(r) for r in args.readers.split(",")]:
                for temp in ("cold", "warm"):
                    cell = [n for n in names if not (temp == "cold" and n == "tmpfs")]
                    speeds = {n: [] for n in cell}
                    cpus = {n: [] for n in cell}
                    ios = {n: [] for n in cell}
                    for k in range(args.rounds):
                        for peer_name in cell[k % len(cell):] + cell[:k % len(cell)]:
                            speed, cpu, io = measure(peer_of[peer_name], s, mode, readers,
                                                     temp)
                            speeds[peer_name].append(speed)
                            cpus[peer_name].append(cpu)
                            ios[peer_name].append(io)
                    for peer_name in cell:
                        row = {"peer": peer_name, "size_mb": s, "mode": mode, "readers": readers,
                               "temp": temp, "mb_s": round(statistics.median(speeds[peer_name]), 1),
                               "mb_s_all": [round(x, 1) for x in speeds[peer_name]],
                               "cpu_s_per_gb": round(statistics.median(cpus[peer_name]), 3),
                               "storage_per_byte": round(statistics.median(ios[peer_name]), 3)}
                        if "native" in speeds and peer_name != "native":
                            row["vs_native_paired"] = round(statistics.median(
                                a / b for a, b in zip(speeds[peer_name], speeds["native"])), 3)
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"sizes": sizes, "total_mb": args.total_mb, "rounds": args.rounds,
                   "rows": rows}, f, indent=1)
    report(rows, names)


def report(rows, names):
    cells = {}
    for r in rows:
        cells[(r["size_mb"], r["mode"], r["readers"], r["temp"], r["peer"])] = r
    keys = sorted({k[:4] for k in cells}, key=lambda k: (k[3], k[0], k[1], k[2]))
    print()
    daemons = [n for n in names if n.startswith("packfs")]
    print("| temp | size | reads | readers | " + " | ".join(names) + " | " +
          " | ".join(f"{n} / native" for n in daemons) + " | " +
          " | ".join(f"{n} CPU s/GB" for n in daemons) + " | " +
          " | ".join(f"{n} storage/read" for n in daemons) + " |")
    print("|---|---:|---|---:|" + "---:|" * (len(names) + 3 * len(daemons)))
    for k in keys:
        got = [cells.get((*k, n)) for n in names]
        pks = [cells.get((*k, n)) for n in daemons]
        ratios = [f"{p['vs_native_paired']:.2f}x" if p and "vs_native_paired" in p else ""
                  for p in pks]
        cpu = [f"{p['cpu_s_per_gb']:.2f}" if p else "" for p in pks]
        io = [f"{p['storage_per_byte']:.2f}" if p and k[3] == "cold" else "" for p in pks]
        print(f"| {k[3]} | {k[0]} MB | {k[1]} | {k[2]} | " +
              " | ".join(f"{g['mb_s']:,.0f}" if g else "" for g in got) + " | " +
              " | ".join(ratios) + " | " + " | ".join(cpu) + " | " + " | ".join(io) + " |")
    print("\n(packfs / native: the median over rounds of each round's ratio, native and packfs "
          "measured back to back)")


if __name__ == "__main__":
    main()
