#!/usr/bin/env python3
"""Random reads from one squashfs image: packfs against squashfuse_ll and the kernel's squashfs.

    sudo python3 bench/squashfs_read.py [--dataset imagenet-20k] [--comps zstd,gzip]
        [--readers 1,4,16] [--files 6000] [--deadline 60] [--work /tmp/packfs-bench]

For each compressor the dataset's tree is packed once with mksquashfs (default options: 128 KiB
blocks, files under a block go to fragments). Every peer then mounts that same image. For each
reader count: mount, drop the page cache, read --files sample files (a fixed random sample, whole
files, in random order, split over the readers: bench/workloads.py read) = cold; read them again =
warm; unmount. A fresh mount per pass also empties packfs's decoded-block cache. Ratios are
peer time / packfs time: above 1 means packfs is faster. Prints a table and writes JSON to
bench/out/.
"""
import argparse, json, os, platform, random, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run as harness  # noqa: E402  (the shared mount/measure helpers of bench/run.py)

PACKFS = harness.PACKFS


def build_image(ds, comp):
    img = os.path.join(ds, f"image-{comp}.sqfs")
    if not os.path.exists(img):
        t0 = time.perf_counter()
        subprocess.run(["mksquashfs", os.path.join(ds, "tree"), img + ".tmp", "-comp", comp,
                        "-noappend", "-no-progress", "-quiet"], check=True)
        os.rename(img + ".tmp", img)
        print(f"built {img} in {time.perf_counter() - t0:.1f} s", flush=True)
    return img


def mount(peer, img, mnt, log, cache_size):
    cmd = {
        "packfs": [PACKFS, "mount", "-v", "--cache-size", cache_size, "--log-file", log, img, mnt],
        "squashfuse_ll": ["squashfuse_ll", img, mnt],
        "kernel-squashfs": ["mount", "-t", "squashfs", "-o", "loop,ro", img, mnt],
    }[peer]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{peer} failed to mount: {proc.stderr.strip()}")
    while not harness.is_mounted(mnt):
        time.sleep(0.005)
    os.stat(os.path.join(mnt, "train"))
    return time.perf_counter() - t0


def unmount(peer, mnt):
    if peer == "packfs":
        harness.sh([PACKFS, "umount", mnt])
    elif peer == "squashfuse_ll":
        harness.sh(["fusermount3", "-u", mnt])
    else:
        harness.sh(["umount", "-d", mnt])
    for _ in range(1000):
        if not harness.is_mounted(mnt):
            return
        time.sleep(0.01)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="imagenet-20k", choices=harness.DATASETS)
    ap.add_argument("--comps", default="zstd,gzip")
    ap.add_argument("--readers", default="1,4,16")
    ap.add_argument("--peers", default="packfs,squashfuse_ll,kernel-squashfs")
    ap.add_argument("--files", type=int, default=6000)
    ap.add_argument("--deadline", type=float, default=60)
    ap.add_argument("--cache-size", default="64M")
    ap.add_argument("--work", default="/tmp/packfs-bench")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the kernel peer needs mount -o loop, and cold passes drop caches")
    subprocess.run(["cargo", "build", "--release", "--manifest-path",
                    os.path.join(HERE, "..", "Cargo.toml")], check=True, capture_output=True)
    ds, meta = harness.ensure_dataset(args.dataset, args.work)
    with open(os.path.join(ds, "meta.json")) as f:
        meta = json.load(f)
    paths = []
    for root, _, names in os.walk(os.path.join(ds, "tree")):
        paths += [os.path.relpath(os.path.join(root, n), os.path.join(ds, "tree")) for n in names]
    paths.sort()
    random.Random(7).shuffle(paths)
    listing = os.path.join(args.work, f"{args.dataset}.squashfs-sample")
    with open(listing, "w") as f:
        f.write("".join(p + "\n" for p in paths[:args.files]))
    mnt = os.path.join(args.work, "mnt", "squashfs-read")
    os.makedirs(mnt, exist_ok=True)
    log = os.path.join(args.work, "packfs-squashfs.log")
    results = {"dataset": args.dataset, "meta": meta, "files": args.files,
               "cache_size": args.cache_size, "host": platform.node(),
               "kernel": platform.release(), "cpus": os.cpu_count(), "images": {}, "runs": []}
    readers_list = [int(r) for r in args.readers.split(",")]
    for comp in args.comps.split(","):
        img = build_image(ds, comp)
        results["images"][comp] = os.path.getsize(img)
        for peer in args.peers.split(","):
            for readers in readers_list:
                if os.path.exists(log):
                    os.remove(log)
                mount_s = mount(peer, img, mnt, log, args.cache_size)
                pid = harness.daemon_pid(mnt) if peer != "kernel-squashfs" else None
                run = {"comp": comp, "peer": peer, "readers": readers, "mount_s": mount_s}
                harness.drop_caches()
                for temp in ("cold", "warm"):
                    run[temp] = harness.run_workload("read", readers, mnt, listing, args.deadline)
                if pid:
                    run["memory_kb"] = harness.memory_kb(pid)
                unmount(peer, mnt)
                if peer == "packfs":
                    run["cache"] = harness.log_fields(log, "RAM cache")
                results["runs"].append(run)
                print(f"{comp:5} {peer:16} {readers:3} readers: "
                      f"cold {run['cold'].get('mb_per_s') or 0:7.1f} MB/s, "
                      f"warm {run['warm'].get('mb_per_s') or 0:7.1f} MB/s"
                      f"{'' if run['cold'].get('complete') else ' (cold pass cut at the deadline)'}",
                      flush=True)
    os.makedirs(args.out, exist_ok=True)
    out = os.path.join(args.out, f"squashfs-read-{time.strftime('%Y%m%dT%H%M%S')}.json")
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    print_table(results)
    print(f"\nJSON: {out}")


def print_table(results):
    runs = {(r["comp"], r["peer"], r["readers"]): r for r in results["runs"]}
    peers = sorted({r["peer"] for r in results["runs"]}, key=["packfs", "squashfuse_ll",
                                                               "kernel-squashfs"].index)
    print("\n| image | readers | pass | " + " | ".join(peers) + " |")
    print("|---|---|---|" + "---|" * len(peers))
    for comp in results["images"]:
        for readers in sorted({r["readers"] for r in results["runs"]}):
            for temp in ("cold", "warm"):
                mine = runs.get((comp, "packfs", readers), {}).get(temp, {})
                cells = []
                for peer in peers:
                    r = runs.get((comp, peer, readers), {}).get(temp, {})
                    rate = r.get("mb_per_s")
                    if rate is None:
                        cells.append(r.get("error", "-"))
                        continue
                    cell = f"{rate:.0f} MB/s"
                    if peer != "packfs" and mine.get("mb_per_s"):
                        cell += f" ({mine['mb_per_s'] / rate:.2f}x)"
                    cells.append(cell)
                print(f"| {comp} | {readers} | {temp} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
