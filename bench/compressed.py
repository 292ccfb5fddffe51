#!/usr/bin/env python3
"""Compressed tars served by frame and block, against ratarmount on the same files, and
`packfs pack --compress zstd` against `tar | zstd -T0`.

    sudo python3 bench/compressed.py [--dataset imagenet-20k | --tree DIR] [--formats zst,xz,bz2]
        [--frame-sizes 256K,1M] [--files 1000] [--readers 1,8] [--deadline 40]
        [--cache-size 256M] [--work /tmp/packfs-bench] [--index-only]

For the dataset's tree (bench/gen_dataset.py):
1. pack: `packfs pack --compress zstd --shards 1` (at each --frame-sizes) against
   `tar -cf - | zstd -T0 -3` at the same level (wall time, compressed size), both after dropping
   the page cache; and plain `packfs pack`.
2. The images: the plain all.tar; the packed .tar.zst (seekable format, 256 KiB frames);
   `xz -T2 -6` of all.tar (xz's own block size, 24 MiB); `lbzip2 -n 2 -9` (900 kB blocks).
3. For each compressed image, for packfs and for ratarmount (indexed_zstd, python-xz and
   rapidgzip's bzip2 behind it; `-P 2`): the index build (packfs index; ratarmount's first mount,
   which writes its index), page cache dropped first; then a fixed random sample of whole members
   (bench/workloads.py read) with 1 and 8 readers, cold (fresh mount, page cache dropped) then warm,
   and the serving process's peak RSS. The plain tar through packfs is the warm reference.
Prints tables with ratios (packfs / ratarmount, and against the plain tar); JSON to bench/out/.
"""
import argparse, json, os, platform, random, shutil, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run as harness  # noqa: E402
from inflate_read import PACKFS, mount, timed, unmount  # noqa: E402

COMPRESS = {
    "xz": "xz -q -T2 -6 -c {tar} > {out}",
    "bz2": "lbzip2 -n 2 -9 -c {tar} > {out}",
}


def wall(cmd, shell=False):
    harness.drop_caches()
    t0 = time.perf_counter()
    subprocess.run(cmd, shell=shell, check=True, capture_output=True)
    return time.perf_counter() - t0


def pack(args, tree, work, results):
    """`packfs pack --compress zstd` (at each frame size) against tar piped into zstd -T0, same
    level; returns the shard packed with the first frame size."""
    results["pack"] = {"frames": []}
    first = None
    for frame in args.frame_sizes.split(","):
        out = os.path.join(work, f"pack-{frame}")
        secs = wall([PACKFS, "pack", tree, "-o", out, "--name", "all", "--shards", "1",
                     "--compress", "zstd:3", "--frame-size", frame])
        packed = os.path.join(out, "all-000000.tar.zst")
        results["pack"]["frames"].append({"frame": frame, "s": secs,
                                          "bytes": os.path.getsize(packed)})
        first = first or packed
    ref = os.path.join(work, "tar-zstd.tar.zst")
    ref_secs = wall(f"tar -cf - -C {os.path.dirname(tree)} {os.path.basename(tree)} | "
                    f"zstd -q -T0 -3 -c > {ref}", shell=True)
    plain = os.path.join(work, "plain-pack")
    plain_secs = wall([PACKFS, "pack", tree, "-o", plain, "--name", "all", "--shards", "1"])
    tar_bytes = os.path.getsize(os.path.join(plain, "all-000000.tar"))
    shutil.rmtree(plain)
    p = results["pack"]
    p.update({"tar_zstd_s": ref_secs, "tar_zstd_bytes": os.path.getsize(ref),
              "plain_pack_s": plain_secs, "tar_bytes": tar_bytes})
    print(f"tar | zstd -T0 -3: {ref_secs:.1f} s, ratio {tar_bytes / p['tar_zstd_bytes']:.3f}; "
          f"plain pack {plain_secs:.1f} s", flush=True)
    for f in p["frames"]:
        print(f"pack --compress zstd:3 --frame-size {f['frame']}: {f['s']:.1f} s "
              f"({f['s'] / ref_secs:.2f}x tar | zstd), ratio {tar_bytes / f['bytes']:.3f}",
              flush=True)
    os.remove(ref)
    return first


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="imagenet-20k", choices=harness.DATASETS)
    ap.add_argument("--formats", default="zst,xz,bz2")
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--readers", default="1,8")
    ap.add_argument("--deadline", type=float, default=40)
    ap.add_argument("--cache-size", default="256M")
    ap.add_argument("--work", default="/tmp/packfs-bench")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--index-only", action="store_true", help="pack and index times, no reads")
    ap.add_argument("--tree", help="a directory to use instead of a generated dataset (its "
                    "all.tar is made under --work)")
    ap.add_argument("--frame-sizes", default="256K",
                    help="frame sizes to pack with (comma-separated); reads use the first")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: cold passes drop the page cache")
    if not shutil.which("ratarmount"):
        sys.exit("ratarmount is not installed (bench/install_peers.sh)")
    if args.tree:
        tree = os.path.abspath(args.tree)
        ds = os.path.join(args.work, "tree-" + os.path.basename(tree))
        os.makedirs(ds, exist_ok=True)
        meta = {"tree": tree}
        tar = os.path.join(ds, "all.tar")
        if not os.path.exists(tar):
            subprocess.run(["tar", "-cf", tar + ".tmp", "-C", os.path.dirname(tree),
                            os.path.basename(tree)], check=True)
            os.rename(tar + ".tmp", tar)
        args.dataset = "tree-" + os.path.basename(tree)
    else:
        ds, meta = harness.ensure_dataset(args.dataset, args.work)
        tree = os.path.join(ds, "tree")
        tar = os.path.join(ds, "all.tar")
    work = tempfile.mkdtemp(dir=args.work, prefix="compressed-")
    results = {"dataset": args.dataset, "meta": meta, "files": args.files,
               "cache_size": args.cache_size, "host": platform.node(), "cpus": os.cpu_count(),
               "tar_bytes": os.path.getsize(tar), "images": {}, "runs": []}
    formats = args.formats.split(",")
    images = {"tar": tar}
    if "zst" in formats:
        images["zst"] = pack(args, tree, work, results)
    for f in formats:
        if f in COMPRESS:
            out = os.path.join(ds, f"all.tar.{f}")
            if not os.path.exists(out):
                t0 = time.perf_counter()
                subprocess.run(COMPRESS[f].format(tar=tar, out=out + ".tmp"), shell=True,
                               check=True)
                os.rename(out + ".tmp", out)
                print(f"{f}: compressed in {time.perf_counter() - t0:.1f} s", flush=True)
            images[f] = out

    mnt = os.path.join(args.work, "mnt", "compressed")
    os.makedirs(mnt, exist_ok=True)
    index, rat_index = {}, {}
    for name, img in images.items():
        index[name] = os.path.join(work, f"{name}.packfs-index")
        secs = wall([PACKFS, "index", img, "-o", index[name]])
        info = {"bytes": os.path.getsize(img), "index_s": secs,
                "index_bytes": os.path.getsize(index[name])}
        if name != "tar":
            rat_index[name] = os.path.join(work, f"ratarmount-{name}")
            os.makedirs(rat_index[name])
            harness.drop_caches()
            info["ratarmount_index_s"] = mount("ratarmount", img, mnt, None, None,
                                               rat_index[name])
            unmount(mnt)
        results["images"][name] = info
        rat = info.get("ratarmount_index_s")
        print(f"{name:4} {info['bytes'] / 1e6:8.1f} MB: packfs index {secs:6.1f} s"
              + (f", ratarmount {rat:6.1f} s ({rat / secs:.2f}x)" if rat else ""), flush=True)

    if args.index_only:
        images = {}
    paths = []
    for root, _, names in os.walk(tree):
        paths += [os.path.relpath(os.path.join(root, n), tree) for n in names]
    paths.sort()
    random.Random(11).shuffle(paths)
    # Members as the packed shard names them (under the tree's own name) and as all.tar does.
    listing = {}
    # (all.tar of a generated dataset holds the tree's content; of --tree, the tree by its name)
    tar_prefix = os.path.basename(tree) + "/" if args.tree else ""
    for kind, prefix in (("tar", tar_prefix), ("zst", os.path.basename(tree) + "/")):
        listing[kind] = os.path.join(work, f"sample-{kind}")
        with open(listing[kind], "w") as f:
            f.write("".join(prefix + p + "\n" for p in paths[:args.files]))
    log = os.path.join(work, "packfs.log")
    for name in images:
        peers = ["packfs"] if name == "tar" else ["packfs", "ratarmount"]
        for peer in peers:
            for readers in [int(r) for r in args.readers.split(",")]:
                if os.path.exists(log):
                    os.remove(log)
                harness.drop_caches()
                img = index[name] if peer == "packfs" else images[name]
                run = {"image": name, "peer": peer, "readers": readers,
                       "mount_s": mount(peer, img, mnt, log, args.cache_size,
                                        rat_index.get(name))}
                pid = harness.daemon_pid(mnt)
                sample = listing["zst" if name == "zst" else "tar"]
                for temp in ("cold", "warm"):
                    run[temp] = harness.run_workload("read", readers, mnt, sample, args.deadline)
                run["memory_kb"] = harness.memory_kb(pid) if pid else {}
                unmount(mnt)
                time.sleep(0.3)
                results["runs"].append(run)
                print(f"{name} {peer} {readers}: cold {run['cold'].get('files_per_s') or 0:.0f} "
                      f"files/s, warm {run['warm'].get('files_per_s') or 0:.0f} files/s, "
                      f"RSS {run['memory_kb'].get('VmHWM', 0) / 1024:.0f} MB", flush=True)

    def rate(name, peer, readers, temp):
        r = next((r for r in results["runs"] if r["image"] == name and r["peer"] == peer
                  and r["readers"] == readers), None)
        return (r[temp].get("files_per_s") or 0.0) if r else 0.0, r

    print("\n| image | readers | packfs cold files/s | ratarmount cold | packfs/ratarmount | "
          "packfs warm (x plain tar) | ratarmount warm | RSS packfs / ratarmount |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in images:
        if name == "tar" or not rate(name, "packfs", 1, "cold")[1]:
            continue
        for readers in [int(r) for r in args.readers.split(",")]:
            (pc, pr), (rc, rr) = (rate(name, "packfs", readers, "cold"),
                                  rate(name, "ratarmount", readers, "cold"))
            pw, rw = rate(name, "packfs", readers, "warm")[0], rate(name, "ratarmount", readers,
                                                                  "warm")[0]
            tw = rate("tar", "packfs", readers, "warm")[0]
            print(f"| {name} | {readers} | {pc:.0f} | {rc:.0f} | {pc / rc if rc else 0:.2f}x | "
                  f"{pw:.0f} ({pw / tw if tw else 0:.2f}x) | {rw:.0f} | "
                  f"{pr['memory_kb'].get('VmHWM', 0) / 1024:.0f} / "
                  f"{rr['memory_kb'].get('VmHWM', 0) / 1024:.0f} MB |")
    print("\n| image | MB | packfs index s | ratarmount index s | ratarmount/packfs |")
    print("|---|---:|---:|---:|---:|")
    for name, info in results["images"].items():
        rat = info.get("ratarmount_index_s")
        print(f"| {name} | {info['bytes'] / 1e6:.0f} | {info['index_s']:.1f} | "
              + (f"{rat:.1f} | {rat / info['index_s']:.2f}x |" if rat else "- | - |"))
    os.makedirs(args.out, exist_ok=True)
    out = os.path.join(args.out, f"compressed-{args.dataset}-{time.strftime('%Y%m%dT%H%M%S')}.json")
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nJSON: {out}")


if __name__ == "__main__":
    main()
