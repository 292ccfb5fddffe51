#!/usr/bin/env python3
"""Seekable inflate: a .tar.gz against the same tar uncompressed and against ratarmount, and a zip
of large deflated members.

    sudo python3 bench/inflate_read.py [--dataset imagenet-20k] [--files 2000] [--readers 1,8]
        [--cache-size 256M] [--zip] [--work /tmp/packfs-bench]

tar.gz part: the dataset's all.tar and its 8 shards are gzipped once (gzip -6). Index build:
`packfs index` of the .tar.gz, of the 8 .tar.gz shards and of the plain tar, against ratarmount's
first mount of the .tar.gz and of the 8 shards (it builds its own index, into an empty folder). Reads: a fixed random sample of whole members (bench/workloads.py
read), split over 1 and 8 readers, cold (fresh mount, page cache dropped) then warm, from packfs on
the .tar.gz, packfs on the plain tar, and ratarmount on the .tar.gz (with its index built). For
packfs the daemon's peak RSS and the bytes it inflated per byte served are printed.

zip part (--zip): a zip with one 1 GiB and 100 x 32 MiB members (JPEG bytes of the dataset,
deflated by `zip -1`); random 4 KiB reads of the 1 GiB member and whole-member reads of the
32 MiB ones, with MB/s, inflated bytes per served byte and peak RSS.

Prints figures and writes JSON to bench/out/.
"""
import argparse, json, os, platform, random, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run as harness  # noqa: E402

PACKFS = harness.PACKFS


def timed(cmd):
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - t0


def wait_mounted(mnt):
    for _ in range(100_000):
        if harness.is_mounted(mnt):
            return
        time.sleep(0.01)
    raise RuntimeError(f"{mnt} never mounted")


def unmount(mnt):
    subprocess.run(["fusermount3", "-u", mnt], capture_output=True)
    for _ in range(1000):
        if not harness.is_mounted(mnt):
            return
        time.sleep(0.01)


def mount(peer, img, mnt, log, cache, index_dir):
    imgs = img if isinstance(img, list) else [img]
    if peer == "ratarmount":
        cmd = ["ratarmount", "--index-folders", index_dir, *imgs, mnt]
    else:
        cmd = [PACKFS, "mount", "-v", "--cache-size", cache, "--log-file", log, img, mnt]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    wait_mounted(mnt)
    return time.perf_counter() - t0


def inflated(log):
    return harness.log_fields(log, "RAM cache").get("loaded_bytes")


def tar_gz(args, ds, results):
    tar = os.path.join(ds, "all.tar")
    gz = os.path.join(ds, "all.tar.gz")
    if not os.path.exists(gz):
        t0 = time.perf_counter()
        subprocess.run(f"gzip -6 -c {tar} > {gz}.tmp && mv {gz}.tmp {gz}", shell=True, check=True)
        print(f"gzip -6 of all.tar: {time.perf_counter() - t0:.1f} s", flush=True)
    results["tar_bytes"], results["gz_bytes"] = os.path.getsize(tar), os.path.getsize(gz)
    work = tempfile.mkdtemp(dir=args.work, prefix="inflate-")
    idx = {}
    for name, img in (("gz", gz), ("tar", tar)):
        idx[name] = os.path.join(work, f"{name}.packfs-index")
        harness.drop_caches()
        results[f"index_s_{name}"] = timed([PACKFS, "index", img, "-o", idx[name]])
    results["index_bytes_gz"] = os.path.getsize(idx["gz"])
    rat_index = os.path.join(work, "ratarmount-index")
    os.makedirs(rat_index)
    mnt = os.path.join(args.work, "mnt", "inflate")
    os.makedirs(mnt, exist_ok=True)
    harness.drop_caches()
    results["ratarmount_first_mount_s"] = mount("ratarmount", gz, mnt, None, None, rat_index)
    unmount(mnt)
    print(f"index: packfs .tar.gz {results['index_s_gz']:.1f} s ({results['index_bytes_gz']} B), "
          f"packfs .tar {results['index_s_tar']:.2f} s, ratarmount first mount "
          f"{results['ratarmount_first_mount_s']:.1f} s", flush=True)
    # The same data as 8 gzipped shards: packfs scans shards in parallel.
    shards = sorted(os.path.join(ds, "shards", n) for n in os.listdir(os.path.join(ds, "shards"))
                    if n.endswith(".tar"))
    gz_shards = [s + ".gz" for s in shards]
    todo = [s for s in shards if not os.path.exists(s + ".gz")]
    if todo:
        subprocess.run("printf '%s\\n' " + " ".join(todo) + " | xargs -P 2 -I{} sh -c 'gzip -6 -c {} > {}.gz'",
                       shell=True, check=True)
    harness.drop_caches()
    results["index_s_gz_shards"] = timed([PACKFS, "index", *gz_shards, "-o",
                                          os.path.join(work, "shards.packfs-index")])
    rat_shards = os.path.join(work, "ratarmount-shards")
    os.makedirs(rat_shards)
    harness.drop_caches()
    results["ratarmount_first_mount_shards_s"] = mount("ratarmount", gz_shards, mnt, None, None,
                                                       rat_shards)
    unmount(mnt)
    print(f"index of 8 .tar.gz shards: packfs {results['index_s_gz_shards']:.1f} s, ratarmount "
          f"first mount {results['ratarmount_first_mount_shards_s']:.1f} s", flush=True)

    paths = []
    tree = os.path.join(ds, "tree")
    for root, _, names in os.walk(tree):
        paths += [os.path.relpath(os.path.join(root, n), tree) for n in names]
    paths.sort()
    random.Random(11).shuffle(paths)
    listing = os.path.join(work, "sample")
    with open(listing, "w") as f:
        f.write("".join(p + "\n" for p in paths[:args.files]))
    log = os.path.join(work, "packfs.log")
    for peer, img in (("packfs-gz", idx["gz"]), ("packfs-tar", idx["tar"]), ("ratarmount", gz)):
        for readers in [int(r) for r in args.readers.split(",")]:
            if os.path.exists(log):
                os.remove(log)
            harness.drop_caches()
            kind = "ratarmount" if peer == "ratarmount" else "packfs"
            run = {"peer": peer, "readers": readers,
                   "mount_s": mount(kind, img, mnt, log, args.cache_size, rat_index)}
            pid = harness.daemon_pid(mnt)
            for temp in ("cold", "warm"):
                run[temp] = harness.run_workload("read", readers, mnt, listing, args.deadline)
            run["memory_kb"] = harness.memory_kb(pid) if pid else {}
            unmount(mnt)
            time.sleep(0.3)
            if kind == "packfs":
                run["inflated_bytes"] = inflated(log)
            results["runs"].append(run)
            served = sum(run[t].get("bytes", 0) for t in ("cold", "warm"))
            ratio = (run.get("inflated_bytes") or 0) / served if served else 0
            print(f"{peer:11} {readers} readers: cold {run['cold'].get('mb_per_s') or 0:7.1f} MB/s"
                  f", warm {run['warm'].get('mb_per_s') or 0:7.1f} MB/s, peak RSS "
                  f"{run['memory_kb'].get('VmHWM', 0) / 1024:.0f} MB"
                  + (f", inflated/served {ratio:.2f}" if kind == "packfs" else ""), flush=True)


def zip_part(args, ds, results):
    tree = os.path.join(ds, "tree")
    zdir = os.path.join(args.work, "bigzip")
    img = os.path.join(args.work, "big.zip")
    if not os.path.exists(img):
        os.makedirs(zdir, exist_ok=True)
        files = sorted(os.path.join(r, n) for r, _, ns in os.walk(tree) for n in ns)

        def fill(path, size, start):
            with open(path, "wb") as out:
                i = start
                while out.tell() < size:
                    with open(files[i % len(files)], "rb") as f:
                        out.write(f.read()[: size - out.tell()])
                    i += 1
            return i

        at = fill(os.path.join(zdir, "huge.bin"), 1 << 30, 0)
        for k in range(100):
            at = fill(os.path.join(zdir, f"m{k:03}.bin"), 32 << 20, at)
        t0 = time.perf_counter()
        subprocess.run(["zip", "-q", "-1", "-r", img, "."], cwd=zdir, check=True)
        print(f"zip -1: {time.perf_counter() - t0:.1f} s", flush=True)
    work = tempfile.mkdtemp(dir=args.work, prefix="zip-")
    index = os.path.join(work, "z.packfs-index")
    harness.drop_caches()
    results["zip_index_s"] = timed([PACKFS, "index", img, "-o", index])
    results["zip_index_bytes"] = os.path.getsize(index)
    mnt = os.path.join(args.work, "mnt", "inflate")
    log = os.path.join(work, "packfs.log")
    code = r"""
import os, random, sys, time, json, threading
mnt, mode, readers = sys.argv[1], sys.argv[2], int(sys.argv[3])
res = {"bytes": 0}
lock = threading.Lock()
def work(k):
    rng = random.Random(k)
    got = 0
    if mode == "4k":
        fd = os.open(os.path.join(mnt, "huge.bin"), os.O_RDONLY)
        for _ in range(400):
            got += len(os.pread(fd, 4096, rng.randrange(0, (1 << 30) - 4096)))
        os.close(fd)
    else:
        for name in rng.sample(range(100), 12):
            with open(os.path.join(mnt, f"m{name:03}.bin"), "rb") as f:
                while b := f.read(1 << 20):
                    got += len(b)
    with lock:
        res["bytes"] += got
t0 = time.perf_counter()
ts = [threading.Thread(target=work, args=(k,)) for k in range(readers)]
[t.start() for t in ts]; [t.join() for t in ts]
res["seconds"] = time.perf_counter() - t0
print(json.dumps(res))
"""
    for mode in ("4k", "whole"):
        for readers in [int(r) for r in args.readers.split(",")]:
            if os.path.exists(log):
                os.remove(log)
            harness.drop_caches()
            mount("packfs", index, mnt, log, args.cache_size, None)
            pid = harness.daemon_pid(mnt)
            out = subprocess.run([sys.executable, "-c", code, mnt, mode, str(readers)],
                                 check=True, capture_output=True, text=True)
            r = json.loads(out.stdout)
            mem = harness.memory_kb(pid) if pid else {}
            unmount(mnt)
            time.sleep(0.3)
            r.update(mode=mode, readers=readers, memory_kb=mem, inflated_bytes=inflated(log))
            results["zip_runs"].append(r)
            print(f"zip {mode:5} {readers} readers: {r['bytes'] / r['seconds'] / 1e6:7.1f} MB/s, "
                  f"inflated/served {(r['inflated_bytes'] or 0) / r['bytes']:.2f}, peak RSS "
                  f"{mem.get('VmHWM', 0) / 1024:.0f} MB", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="imagenet-20k", choices=harness.DATASETS)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--readers", default="1,8")
    ap.add_argument("--deadline", type=float, default=120)
    ap.add_argument("--cache-size", default="256M")
    ap.add_argument("--zip", action="store_true")
    ap.add_argument("--no-tar", action="store_true")
    ap.add_argument("--work", default="/tmp/packfs-bench")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: cold passes drop the page cache")
    subprocess.run(["cargo", "build", "--release", "--manifest-path",
                    os.path.join(HERE, "..", "Cargo.toml")], check=True, capture_output=True)
    ds, meta = harness.ensure_dataset(args.dataset, args.work)
    results = {"dataset": args.dataset, "meta": meta, "files": args.files,
               "cache_size": args.cache_size, "host": platform.node(), "cpus": os.cpu_count(),
               "runs": [], "zip_runs": []}
    if not args.no_tar:
        tar_gz(args, ds, results)
    if args.zip:
        zip_part(args, ds, results)
    os.makedirs(args.out, exist_ok=True)
    out = os.path.join(args.out, f"inflate-read-{time.strftime('%Y%m%dT%H%M%S')}.json")
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nJSON: {out}")


if __name__ == "__main__":
    main()
