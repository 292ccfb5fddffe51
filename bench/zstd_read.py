#!/usr/bin/env python3
"""`.tar.zst` served by frame, against the same tar uncompressed.

    sudo python3 bench/zstd_read.py [--dataset imagenet-20k] [--files 2000] [--readers 1,8]
        [--cache-size 256M] [--work /tmp/packfs-bench]

The dataset's all.tar is compressed twice at level 3: by `pzstd -p 2` (its own frame size) and in
frames of 1 MiB of tar (`split -b 1M --filter 'zstd -3'`, concatenated). For each image and the
plain tar: the time of `packfs index` (page cache dropped first) and the index size; then a fixed
random sample of whole members (bench/workloads.py read) over 1 and 8 readers, cold (fresh mount,
page cache dropped) then warm, with the bytes decoded per byte served and the daemon's peak RSS.
Ratios are against the plain tar in the same run. Prints a table; JSON to bench/out/.
"""
import argparse, json, os, platform, random, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run as harness  # noqa: E402
from inflate_read import PACKFS, inflated, mount, timed, unmount  # noqa: E402

VARIANTS = {
    "pzstd": "pzstd -q -p 2 -3 -c {tar} > {out}",
    "frames-1M": "split -b 1M --filter 'zstd -q -3 -c' {tar} > {out}",
}


def frames_of(img):
    """The frame count `packfs ls --extents` reports for the image's first file."""
    out = subprocess.run([PACKFS, "ls", "--extents", img], check=True, capture_output=True,
                         text=True).stdout
    for line in out.splitlines():
        words = line.split()
        if "frames" in words:
            return int(words[words.index("frames") - 1])
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="imagenet-20k", choices=harness.DATASETS)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--readers", default="1,8")
    ap.add_argument("--deadline", type=float, default=120)
    ap.add_argument("--cache-size", default="256M")
    ap.add_argument("--work", default="/tmp/packfs-bench")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: cold passes drop the page cache")
    ds, meta = harness.ensure_dataset(args.dataset, args.work)
    tar = os.path.join(ds, "all.tar")
    images = {"tar": tar}
    results = {"dataset": args.dataset, "meta": meta, "files": args.files,
               "cache_size": args.cache_size, "host": platform.node(), "cpus": os.cpu_count(),
               "tar_bytes": os.path.getsize(tar), "images": {}, "runs": []}
    for name, cmd in VARIANTS.items():
        out = os.path.join(ds, f"all.{name}.tar.zst")
        if not os.path.exists(out):
            t0 = time.perf_counter()
            subprocess.run(cmd.format(tar=tar, out=out + ".tmp"), shell=True, check=True)
            os.rename(out + ".tmp", out)
            print(f"{name}: compressed in {time.perf_counter() - t0:.1f} s", flush=True)
        images[name] = out
    work = tempfile.mkdtemp(dir=args.work, prefix="zstd-")
    index = {}
    for name, img in images.items():
        index[name] = os.path.join(work, f"{name}.packfs-index")
        harness.drop_caches()
        secs = timed([PACKFS, "index", img, "-o", index[name]])
        info = {"bytes": os.path.getsize(img), "index_s": secs,
                "index_bytes": os.path.getsize(index[name]),
                "frames": frames_of(index[name]) if name != "tar" else None}
        results["images"][name] = info
        print(f"{name:10} {info['bytes'] / 1e6:8.1f} MB, {info['frames'] or '-'} frames, index "
              f"{secs:5.1f} s ({info['index_bytes'] / 1e6:.1f} MB)", flush=True)

    paths = []
    tree = os.path.join(ds, "tree")
    for root, _, names in os.walk(tree):
        paths += [os.path.relpath(os.path.join(root, n), tree) for n in names]
    paths.sort()
    random.Random(11).shuffle(paths)
    listing = os.path.join(work, "sample")
    with open(listing, "w") as f:
        f.write("".join(p + "\n" for p in paths[:args.files]))
    mnt = os.path.join(args.work, "mnt", "zstd")
    os.makedirs(mnt, exist_ok=True)
    log = os.path.join(work, "packfs.log")
    for name in images:
        for readers in [int(r) for r in args.readers.split(",")]:
            if os.path.exists(log):
                os.remove(log)
            harness.drop_caches()
            run = {"image": name, "readers": readers,
                   "mount_s": mount("packfs", index[name], mnt, log, args.cache_size, None)}
            pid = harness.daemon_pid(mnt)
            for temp in ("cold", "warm"):
                run[temp] = harness.run_workload("read", readers, mnt, listing, args.deadline)
            run["memory_kb"] = harness.memory_kb(pid) if pid else {}
            unmount(mnt)
            time.sleep(0.3)
            run["decoded_bytes"] = inflated(log)
            results["runs"].append(run)

    def rate(name, readers, temp):
        r = next(r for r in results["runs"] if r["image"] == name and r["readers"] == readers)
        return r[temp].get("mb_per_s") or 0.0, r
    print("\n| image | readers | cold MB/s (x tar) | warm MB/s (x tar) | decoded/served | peak RSS |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in images:
        for readers in [int(r) for r in args.readers.split(",")]:
            (cold, r), (warm, _) = rate(name, readers, "cold"), rate(name, readers, "warm")
            tcold, twarm = rate("tar", readers, "cold")[0], rate("tar", readers, "warm")[0]
            served = sum(r[t].get("bytes", 0) for t in ("cold", "warm"))
            ratio = (r.get("decoded_bytes") or 0) / served if served else 0
            print(f"| {name} | {readers} | {cold:.1f} ({cold / tcold:.2f}x) | {warm:.1f} "
                  f"({warm / twarm:.2f}x) | {ratio:.2f} | "
                  f"{r['memory_kb'].get('VmHWM', 0) / 1024:.0f} MB |")
    os.makedirs(args.out, exist_ok=True)
    out = os.path.join(args.out, f"zstd-read-{time.strftime('%Y%m%dT%H%M%S')}.json")
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nJSON: {out}")


if __name__ == "__main__":
    main()
