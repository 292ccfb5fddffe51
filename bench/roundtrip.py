#!/usr/bin/env python3
"""The cost of one FUSE round trip, and what the transport takes of it.

Times five operations that always reach the daemon (ioctl TCGETS on an open file, 4 KiB and
128 KiB O_DIRECT reads, the lookup of a missing name, a statx that forces GETATTR) from 1, 8 and
32 threads against:
  tmpfs          the same file in /dev/shm (no daemon: the kernel's own cost)
  fuser floor    bench/fuseloop over fuser 0.18, answering from memory (packfs's loop, no work)
  classic floor  bench/fuseloop's own /dev/fuse loop (read + write per request)
  uring floor    bench/fuseloop over FUSE io_uring (one queue per CPU, COMMIT_AND_FETCH)
  packfs         packfs mounting a tar of the same file (its classic loop, the default)
  packfs-uring   the same with --transport uring

Root only (mount(2), the module parameter). Run through bench/roundtrip.sh, which builds.
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FUSELOOP = ROOT / "target/fuseloop/release/fuseloop"
PACKFS = ROOT / "target/release/packfs"
URING_PARAM = Path("/sys/module/fuse/parameters/enable_uring")
OPS = ["ioctl", "read4k", "read128k", "lookup", "getattr"]


def wait_for(path, timeout=10.0):
    end = time.time() + timeout
    while time.time() < end:
        try:
            os.stat(path)
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{path} did not appear within {timeout} s")


def unmount(mnt):
    subprocess.run(["umount", str(mnt)], check=False)
    for _ in range(100):
        if not os.path.ismount(mnt):
            return
        time.sleep(0.05)
    subprocess.run(["umount", "-l", str(mnt)], check=False)


class Fuseloop:
    def __init__(self, transport, threads):
        self.transport, self.threads = transport, threads

    def __enter__(self):
        self.mnt = Path(tempfile.mkdtemp(prefix="fuseloop-"))
        self.proc = subprocess.Popen(
            [FUSELOOP, "serve", self.mnt, "--transport", self.transport,
             "--threads", str(self.threads)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready = self.proc.stdout.readline().split()
        if ready[:1] != ["ready"]:
            raise SystemExit(f"fuseloop did not start: {self.proc.stderr.read()}")
        self.served = ready[1]
        wait_for(self.mnt / "data")
        return self.mnt / "data"

    def __exit__(self, *exc):
        unmount(self.mnt)
        _, err = self.proc.communicate(timeout=30)
        self.log = err.strip()
        os.rmdir(self.mnt)


class Packfs:
    def __init__(self, tar, args):
        self.tar, self.args = tar, args

    def __enter__(self):
        self.mnt = Path(tempfile.mkdtemp(prefix="packfs-rt-"))
        subprocess.run([PACKFS, "mount", "-q", *self.args, self.tar, self.mnt], check=True)
        wait_for(self.mnt / "data")
        status = subprocess.run([PACKFS, "status", self.mnt], capture_output=True,
                                text=True).stdout
        self.served = "uring" if "io_uring" in status else "classic"
        return self.mnt / "data"

    def __exit__(self, *exc):
        subprocess.run([PACKFS, "umount", self.mnt], check=False, capture_output=True)
        os.rmdir(self.mnt)


class Plain:
    def __init__(self, path):
        self.path = path

    def __enter__(self):
        return self.path

    def __exit__(self, *exc):
        pass


def client(path, op, threads, seconds):
    out = subprocess.run(
        [FUSELOOP, "client", path, "--op", op, "--threads", str(threads),
         "--seconds", str(seconds)],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,8,32", help="client threads, comma-separated")
    ap.add_argument("--seconds", type=float, default=2.0, help="per operation and thread count")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--targets", default="tmpfs,fuser,classic,uring,packfs,packfs-uring")
    ap.add_argument("--server-threads", type=int, default=4,
                    help="request threads of the classic servers (packfs's default is 4)")
    ap.add_argument("--out", type=Path, help="JSON results")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the floor mounts with mount(2) and sets enable_uring")
    threads = [int(t) for t in args.threads.split(",")]
    ops = args.ops.split(",")
    targets = args.targets.split(",")

    work = Path(tempfile.mkdtemp(prefix="roundtrip-"))
    shm = Path(tempfile.mkdtemp(prefix="roundtrip-", dir="/dev/shm"))
    data = shm / "data"
    with open(data, "wb") as f:
        f.write(os.urandom(64 << 20))
    subprocess.run(["tar", "cf", work / "data.tar", "-C", shm, "data"], check=True)

    old_param = URING_PARAM.read_text().strip() if URING_PARAM.exists() else None
    if "uring" in targets or "packfs-uring" in targets:
        if old_param is None:
            print("this kernel has no FUSE over io_uring: the uring floor falls back to classic",
                  file=sys.stderr)
        else:
            URING_PARAM.write_text("Y")

    runs, notes = [], {}
    try:
        for target in targets:
            mount = {
                "tmpfs": lambda: Plain(data),
                "fuser": lambda: Fuseloop("fuser", args.server_threads),
                "classic": lambda: Fuseloop("classic", args.server_threads),
                "uring": lambda: Fuseloop("uring", args.server_threads),
                "packfs": lambda: Packfs(work / "data.tar", []),
                "packfs-uring": lambda: Packfs(work / "data.tar", ["--transport", "uring"]),
            }[target]()
            with mount as path:
                for op in ops:
                    for t in threads:
                        r = client(path, op, t, args.seconds)
                        r["target"] = target
                        runs.append(r)
                        print(f"{target:8} {op:9} {t:3} threads: {r['mean_us']:8.2f} µs/op "
                              f"{r['ops_per_s']:9.0f} ops/s", file=sys.stderr)
            if isinstance(mount, Fuseloop):
                notes[target] = {"served_by": mount.served, "log": mount.log}
            if isinstance(mount, Packfs):
                notes[target] = {"served_by": mount.served}
    finally:
        if old_param is not None and ("uring" in targets or "packfs-uring" in targets):
            URING_PARAM.write_text(old_param)
        subprocess.run(["rm", "-rf", work, shm], check=False)

    result = {
        "date": datetime.date.today().isoformat(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "seconds": args.seconds,
        "server_threads": args.server_threads,
        "notes": notes,
        "runs": runs,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print_table(runs, targets, ops, threads)


def print_table(runs, targets, ops, threads):
    by = {(r["target"], r["op"], r["threads"]): r for r in runs}
    names = {"tmpfs": "tmpfs", "fuser": "fuser floor", "classic": "classic floor",
             "uring": "uring floor", "packfs": "packfs classic", "packfs-uring": "packfs uring"}
    print("Mean µs per operation (ops/s in brackets)\n")
    floors = "uring" in targets and "classic" in targets
    packs = "packfs" in targets and "packfs-uring" in targets
    print("| operation | threads | " + " | ".join(names[t] for t in targets) + " |" +
          (" floor uring / classic |" if floors else "") +
          (" packfs uring / classic |" if packs else ""))
    print("|---|---:|" + "---:|" * (len(targets) + floors + packs))
    for op in ops:
        for t in threads:
            cells = []
            for target in targets:
                r = by.get((target, op, t))
                cells.append(f"{r['mean_us']:.1f} ({r['ops_per_s']:,.0f})" if r else "-")
            line = f"| {op} | {t} | " + " | ".join(cells) + " |"
            for uring, classic in [("uring", "classic"), ("packfs-uring", "packfs")]:
                u, c = by.get((uring, op, t)), by.get((classic, op, t))
                if u and c:
                    line += f" {u['mean_us'] / c['mean_us']:.2f}x |"
            print(line)


if __name__ == "__main__":
    main()
