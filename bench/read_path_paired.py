#!/usr/bin/env python3
"""Two packfs builds mounted at once over the same images, read in alternation: the page cache is
dropped before each cold pass, and neither mount is remade between rounds, so drift and mount
cycles hit both builds alike (bench/read_path.py remounts each build every round).

    sudo ROUNDS=12 python3 bench/read_path_paired.py READERS IMAGE... [--warm] \
        [--before /tmp/packfs-before] [--after target/release/packfs]

Uses the file lists bench/read_path.py left in /tmp/packfs-bench (1 reader: its one-reader list,
else its eight-reader list). Prints each build's median files/s (and every round), the daemon's
CPU time per file, and the ratio of the medians after/before.
"""
import argparse, os, statistics, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run as harness  # noqa: E402


def cpu(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("readers", type=int)
    ap.add_argument("images", nargs="+")
    ap.add_argument("--before", default="/tmp/packfs-before")
    ap.add_argument("--after", default=os.path.join(os.path.dirname(HERE), "target/release/packfs"))
    ap.add_argument("--lists", default="/tmp/packfs-bench")
    ap.add_argument("--warm", action="store_true",
                    help="read each mount once first and never drop the page cache (warm passes)")
    args = ap.parse_args()
    listing = os.path.join(args.lists, "read-path-one.list" if args.readers == 1
                           else "read-path-eight.list")
    mounts = {}
    for name, binary in (("before", args.before), ("after", args.after)):
        mnt = f"/tmp/paired-{name}"
        os.makedirs(mnt, exist_ok=True)
        subprocess.run([binary, "mount", *args.images, mnt], check=True, capture_output=True)
        pid = int(subprocess.run(["pgrep", "-n", "-f", f"{binary} .*{mnt}"], capture_output=True,
                                 text=True).stdout.split()[0])
        mounts[name] = (binary, mnt, pid)
    if args.warm:
        for _, mnt, _ in mounts.values():
            harness.run_workload("read", args.readers, mnt, listing, 60)
    rate = {k: [] for k in mounts}
    cost = {k: [] for k in mounts}
    try:
        for r in range(int(os.environ.get("ROUNDS", "8"))):
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for name in order:
                _, mnt, pid = mounts[name]
                if not args.warm:
                    harness.drop_caches()
                started = cpu(pid)
                out = harness.run_workload("read", args.readers, mnt, listing, 60)
                rate[name].append(out.get("files_per_s") or 0)
                cost[name].append((cpu(pid) - started) * 1e6 / (out.get("files") or 1))
    finally:
        for binary, mnt, _ in mounts.values():
            subprocess.run([binary, "umount", mnt], check=False)
    for name in mounts:
        print(name, round(statistics.median(rate[name])), [round(x) for x in rate[name]],
              "cpu us/file", round(statistics.median(cost[name])))
    print("after/before", round(statistics.median(rate["after"]) / statistics.median(rate["before"]), 3))


if __name__ == "__main__":
    main()
