#!/usr/bin/env python3
"""`stat` of every file of a fresh mount: one LOOKUP round trip per file, nothing cached yet.

    sudo python3 bench/stat_fresh.py [--files 20000] [--rounds 3] [--packfs BINARY]
                                     [--work /tmp/packfs-bench-stat]

Makes a tree of `--files` files of 100 bytes in 100 directories once, as a GNU tar and as a
squashfs image (mksquashfs defaults: gzip, 128 KiB blocks). Each round mounts every peer fresh
(packfs with its 4 request threads and with one, squashfuse_ll, the kernel's squashfs through a
loop device; the image files stay in the page cache), stats one directory, then every file in
name order and, on another fresh mount, in a shuffled order, timing the stats. Prints each
peer's median seconds and packfs's ratio to each peer (above 1: packfs is faster).
"""
import argparse, os, random, shutil, statistics, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
PACKFS = os.path.join(HERE, "..", "target", "release", "packfs")


def make(work, files):
    tree, tar, sqfs = (os.path.join(work, n) for n in ("tree", "t.tar", "t.sqfs"))
    done = os.path.join(work, "done")
    if os.path.exists(done) and open(done).read() == str(files):
        return tree, tar, sqfs
    shutil.rmtree(work, ignore_errors=True)
    for i in range(files):
        d = os.path.join(tree, f"c{i % 100:03d}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"s{i:06d}.jpg"), "wb") as f:
            f.write(b"x" * 100)
    subprocess.run(["tar", "-cf", tar, "-C", tree, "."], check=True)
    subprocess.run(["mksquashfs", tree, sqfs, "-quiet", "-noappend", "-processors", "2"],
                   check=True, stdout=subprocess.DEVNULL)
    with open(done, "w") as f:
        f.write(str(files))
    return tree, tar, sqfs


def mount(peer, tar, sqfs, mnt, packfs):
    if peer == "packfs":
        subprocess.run([packfs, "mount", "-q", tar, mnt], check=True)
    elif peer == "packfs --threads 1":
        subprocess.run([packfs, "mount", "-q", "--threads", "1", tar, mnt], check=True)
    elif peer == "squashfuse_ll":
        subprocess.run(["squashfuse_ll", sqfs, mnt], check=True)
    else:
        subprocess.run(["mount", "-t", "squashfs", "-o", "loop,ro", sqfs, mnt], check=True)
    for _ in range(500):
        if os.path.isdir(os.path.join(mnt, "c000")):
            return
        time.sleep(0.01)
    sys.exit(f"{peer} did not mount at {mnt}")


def unmount(mnt):
    subprocess.run(["umount", mnt], check=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--packfs", default=PACKFS)
    ap.add_argument("--work", default="/tmp/packfs-bench-stat")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("stat_fresh.py needs root: it mounts squashfs through a loop device")
    tree, tar, sqfs = make(args.work, args.files)
    names = sorted(os.path.relpath(os.path.join(d, n), tree)
                   for d, _, ns in os.walk(tree) for n in ns)
    shuffled = names[:]
    random.Random(3).shuffle(shuffled)
    mnt = os.path.join(args.work, "mnt")
    os.makedirs(mnt, exist_ok=True)
    peers = ["packfs", "packfs --threads 1", "squashfuse_ll", "kernel squashfs"]
    if not shutil.which("squashfuse_ll"):
        peers.remove("squashfuse_ll")
    times = {}
    for r in range(args.rounds):
        for order_name, order in (("name order", names), ("shuffled", shuffled)):
            for peer in peers[r % len(peers):] + peers[:r % len(peers)]:
                mount(peer, tar, sqfs, mnt, os.path.abspath(args.packfs))
                started = time.perf_counter()
                for n in order:
                    os.stat(os.path.join(mnt, n))
                times.setdefault((order_name, peer), []).append(time.perf_counter() - started)
                unmount(mnt)
    print(f"\n{args.files} files, {args.rounds} rounds: seconds to stat every file of a fresh "
          "mount (median), and packfs's speed against each peer\n")
    print("| order | " + " | ".join(peers) + " | " +
          " | ".join(f"packfs vs {p}" for p in peers[1:]) + " |")
    print("|---|" + "---:|" * (2 * len(peers) - 1))
    for order_name in ("name order", "shuffled"):
        med = {p: statistics.median(times[(order_name, p)]) for p in peers}
        print(f"| {order_name} | " + " | ".join(f"{med[p]:.3f}" for p in peers) + " | " +
              " | ".join(f"{med[p] / med['packfs']:.2f}x" for p in peers[1:]) + " |")


if __name__ == "__main__":
    main()
