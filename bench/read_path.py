#!/usr/bin/env python3
"""The read path of two packfs builds side by side, on the same data, in one run: before and after
a change that should not change speed.

    sudo python3 bench/read_path.py --before /tmp/packfs-before [--after target/release/packfs]
        [--before-args OPTS] [--after-args OPTS] [--files 6000] [--rounds 3] [--work /tmp/packfs-bench]
        [--images tar,squashfs-zstd,zip-deflate,pack-index]

Makes a dataset of incompressible sample files (lognormal sizes, median 60 KB) once, packed as 4
tar shards, one zstd squashfs image (128 KiB blocks) and one deflated zip; `pack-index` mounts
the index of `packfs pack`'s 4 shards of the same files (a CRC-32 recorded per member, checked
before its first reply), made by the `--after` build. For each round, each
image kind and each build (the builds alternate, so drift hits both): mount, drop the page cache,
read a fixed shuffled sample whole with 1 reader, drop again, read another with 8 readers (cold:
the source, decoding and the tiers), then the 8-reader sample again (warm: served by the page
cache, so what is left is the per-open cost of the FUSE round trips). Prints each build's median
files/s over the rounds per cell (with the range), the ratio of the medians after/before
(above 1: after is faster), the median of each round's ratio, and the daemon's CPU time per file. Single passes on a small VM vary by +-20%; the median of interleaved
rounds is what to compare.
"""
import argparse, json, os, random, shlex, statistics, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run as harness  # noqa: E402


def make_dataset(root, files):
    tree = os.path.join(root, "tree")
    if os.path.exists(os.path.join(root, "done")):
        return tree
    rng = random.Random(1)
    for i in range(files):
        d = os.path.join(tree, f"class_{i % 50:03d}")
        os.makedirs(d, exist_ok=True)
        size = int(min(400_000, max(4_000, rng.lognormvariate(11.0, 0.8))))
        with open(os.path.join(d, f"sample_{i:06d}.jpg"), "wb") as f:
            f.write(os.urandom(size))
    classes = sorted(os.listdir(tree))
    for k in range(4):
        subprocess.run(["tar", "-cf", os.path.join(root, f"shard-{k}.tar"), "-C", tree]
                       + classes[k::4], check=True)
    subprocess.run(["mksquashfs", tree, os.path.join(root, "image.sqfs"), "-comp", "zstd",
                    "-quiet", "-no-progress", "-noappend"], check=True)
    subprocess.run(["zip", "-q", "-r", "-1", os.path.join(root, "image.zip"), "."], cwd=tree,
                   check=True)
    open(os.path.join(root, "done"), "w").close()
    return tree


def pack_index(root, tree, binary):
    """root/packed/read-path.packfs-index: `packfs pack` of the classes of `tree` (each class
    directory at the mount's root, as in the tar shards), made once."""
    index = os.path.join(root, "packed", "read-path.packfs-index")
    if not os.path.exists(index):
        classes = sorted(os.path.join(tree, c) for c in os.listdir(tree))
        subprocess.run([binary, "pack", "-q", "--shards", "4", "--name", "read-path", *classes,
                        "-o", os.path.join(root, "packed")], check=True)
    return index


def samples(tree, work, n):
    rel = []
    for d, _, names in os.walk(tree):
        rel += [os.path.relpath(os.path.join(d, x), tree) for x in names]
    rel.sort()
    random.Random(7).shuffle(rel)
    lists = []
    for name, part in (("one", rel[:n // 3]), ("eight", rel[n // 3:])):
        path = os.path.join(work, f"read-path-{name}.list")
        with open(path, "w") as f:
            f.write("".join(p + "\n" for p in part))
        lists.append(path)
    return lists


def measure(binary, extra, images, mnt, lists, deadline):
    subprocess.run([binary, "mount", *extra, *images, mnt], check=True, capture_output=True)
    while not harness.is_mounted(mnt):
        time.sleep(0.005)
    pid = daemon_pid(binary, mnt)
    out, cpu = {}, {}
    for cell, readers, listing, cold in (("cold-1", 1, lists[0], True),
                                         ("cold-8", 8, lists[1], True),
                                         ("warm-8", 8, lists[1], False)):
        if cold:
            harness.drop_caches()
        before = cpu_seconds(pid)
        out[cell] = harness.run_workload("read", readers, mnt, listing, deadline)
        files = out[cell].get("files") or 0
        cpu[cell] = (cpu_seconds(pid) - before) * 1e6 / files if files else 0
    subprocess.run([binary, "umount", mnt], check=True)
    while harness.is_mounted(mnt):
        time.sleep(0.01)
    return {k: v.get("files_per_s") or 0 for k, v in out.items()}, cpu


def daemon_pid(binary, mnt):
    """The daemon serving `mnt` (the newest process of `binary` whose command line names it)."""
    found = subprocess.run(["pgrep", "-n", "-f", f"{binary} .*{mnt}"], capture_output=True,
                           text=True).stdout.split()
    return int(found[0]) if found else None


def cpu_seconds(pid):
    """User + system CPU seconds of `pid` so far (0 when unknown)."""
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", default=harness.PACKFS)
    # Mount options of each side: the same build with and without an option, e.g.
    # --before target/release/packfs --after-args "--trace /tmp/t.json" (the cost of tracing).
    ap.add_argument("--before-args", default="")
    ap.add_argument("--after-args", default="")
    ap.add_argument("--files", type=int, default=6000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--deadline", type=float, default=60)
    ap.add_argument("--work", default="/tmp/packfs-bench")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--images", default="tar,squashfs-zstd,zip-deflate",
                    help="which images to read, comma-separated")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: cold passes drop the page cache")
    root = os.path.join(args.work, "read-path")
    tree = make_dataset(root, args.files)
    lists = samples(tree, args.work, args.files)
    mnt = os.path.join(args.work, "mnt", "read-path")
    os.makedirs(mnt, exist_ok=True)
    kinds = {
        "tar": [os.path.join(root, f"shard-{k}.tar") for k in range(4)],
        "squashfs-zstd": [os.path.join(root, "image.sqfs")],
        "zip-deflate": [os.path.join(root, "image.zip")],
    }
    if "pack-index" in args.images.split(","):
        kinds["pack-index"] = [pack_index(root, tree, os.path.abspath(args.after))]
    kinds = {k: v for k, v in kinds.items() if k in args.images.split(",")}
    builds = {"before": (os.path.abspath(args.before), shlex.split(args.before_args)),
              "after": (os.path.abspath(args.after), shlex.split(args.after_args))}
    rates, cpu = {}, {}
    for rnd in range(args.rounds):
        for kind, images in kinds.items():
            order = list(builds.items()) if rnd % 2 == 0 else list(builds.items())[::-1]
            for name, (binary, extra) in order:
                got, used = measure(binary, extra, images, mnt, lists, args.deadline)
                for cell, rate in got.items():
                    rates.setdefault(f"{kind} {cell} {name}", []).append(rate)
                    cpu.setdefault(f"{kind} {cell} {name}", []).append(used[cell])
                print(f"round {rnd + 1} {kind:14} {name:6} "
                      + " ".join(f"{c} {r:7.0f}/s" for c, r in got.items()), flush=True)
    # Pairwise: the median of each round's after/before, which drift between rounds cancels.
    print("\n| image | pass | before files/s, median (range) | after files/s, median (range) "
          "| after/before | pairwise | daemon CPU us/file, before / after |")
    print("|---|---|---:|---:|---:|---:|---:|")
    shown = lambda v: f"{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})"
    for kind in kinds:
        for cell in ("cold-1", "cold-8", "warm-8"):
            b, a = rates[f"{kind} {cell} before"], rates[f"{kind} {cell} after"]
            ratio = statistics.median(a) / statistics.median(b) if statistics.median(b) else 0
            pairs = statistics.median(x / y for x, y in zip(a, b) if y)
            used = (statistics.median(cpu[f"{kind} {cell} {n}"]) for n in ("before", "after"))
            print(f"| {kind} | {cell} | {shown(b)} | {shown(a)} | {ratio:.2f} | {pairs:.2f} "
                  f"| {' / '.join(f'{u:.0f}' for u in used)} |")
    os.makedirs(args.out, exist_ok=True)
    out = os.path.join(args.out, f"read-path-{time.strftime('%Y%m%dT%H%M%S')}.json")
    with open(out, "w") as f:
        json.dump({"files": args.files, "rounds": args.rounds, "before": builds["before"],
                   "after": builds["after"], "rates": rates,
                   "daemon_cpu_us_per_file": cpu}, f, indent=1)
    print(f"\nJSON: {out}")


if __name__ == "__main__":
    main()
