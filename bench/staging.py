#!/usr/bin/env python3
"""Node-local staging: copy throughput against cp, and epoch times with a slow source.

    sudo python3 bench/staging.py [--work /tmp/packfs-bench] [--rate-mb 100] [--shards 3]

1. `packfs stage` against `cp` of the same shards into /dev/shm, source warm (page cache) and cold
   (dropped), alternating, best of --rounds.
2. A slow source: the shards are copied into an ext4 image on a loop device whose reads are
   throttled with the cgroup-v1 blkio controller (blkio.throttle.read_bps_device, --rate-mb MB/s);
   the packfs daemon is moved into that cgroup. Before every epoch the page cache is dropped, so
   every byte not staged comes from the throttled device. An epoch is 8 reader processes reading
   every file of the shards once in one shuffled order (bench/workloads.py read), cut at
   --deadline seconds; epoch time is extrapolated from the files read when cut.
Needs root (loop device, cgroup, drop_caches). Writes JSON to bench/out/.
"""
import argparse, json, os, random, shutil, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run as harness  # noqa: E402

PACKFS = harness.PACKFS
CGROUP = "/sys/fs/cgroup/blkio/packfs-bench"


def sh(cmd, check=True, **kw):
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if check and out.returncode != 0:
        raise RuntimeError(f"{cmd}: {out.stderr.strip()}")
    return out


def timed(cmd, cgroup=False):
    pre = (lambda: open(f"{CGROUP}/cgroup.procs", "w").write(str(os.getpid()))) if cgroup else None
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, preexec_fn=pre)
    return time.perf_counter() - t0


def copy_race(shards, dest_root, rounds, cold, cgroup=False):
    """Seconds of the best round of cp and of packfs stage, same shards, same destination FS."""
    best = {"cp": None, "packfs": None}
    for r in range(rounds):
        for tool in (["cp", "packfs"] if r % 2 == 0 else ["packfs", "cp"]):
            dest = os.path.join(dest_root, f"copy-{tool}")
            shutil.rmtree(dest, ignore_errors=True)
            os.makedirs(dest)
            if cold:
                harness.drop_caches()
            cmd = (["cp"] + shards + [dest]) if tool == "cp" else \
                [PACKFS, "stage"] + shards + ["--to", dest]
            secs = timed(cmd, cgroup)
            best[tool] = secs if best[tool] is None else min(best[tool], secs)
            shutil.rmtree(dest, ignore_errors=True)
    size = sum(os.path.getsize(s) for s in shards)
    return {"bytes": size, "cp_s": best["cp"], "packfs_s": best["packfs"],
            "cp_mb_s": size / best["cp"] / 1e6, "packfs_mb_s": size / best["packfs"] / 1e6,
            "ratio": best["cp"] / best["packfs"]}


def setup_slow(work, shards, rate):
    base = os.path.join(work, "slow")
    mnt = os.path.join(base, "mnt")
    img = os.path.join(base, "img.ext4")
    os.makedirs(mnt, exist_ok=True)
    if harness.is_mounted(mnt):
        sh(["umount", mnt])
    size = sum(os.path.getsize(s) for s in shards)
    if os.path.exists(img):
        os.remove(img)
    sh(["truncate", "-s", str(int(size * 1.1) + (64 << 20)), img])
    sh(["mkfs.ext4", "-q", "-F", img])
    loop = sh(["losetup", "-f", "--show", img]).stdout.strip()
    sh(["mount", loop, mnt])
    for s in shards:
        shutil.copy(s, mnt)
    os.sync()
    sh(["mount", "-o", "remount,ro", mnt])
    majmin = sh(["lsblk", "-no", "MAJ:MIN", loop]).stdout.strip()
    os.makedirs(CGROUP, exist_ok=True)
    with open(f"{CGROUP}/blkio.throttle.read_bps_device", "w") as f:
        f.write(f"{majmin} {rate}\n")
    return mnt, loop, [os.path.join(mnt, os.path.basename(s)) for s in shards]


def teardown_slow(mnt, loop):
    sh(["umount", mnt], check=False)
    sh(["losetup", "-d", loop], check=False)


def mount(images, mnt, extra, log, stats):
    os.makedirs(mnt, exist_ok=True)
    if os.path.exists(log):
        os.remove(log)
    pid_file = mnt + ".pid"
    sh([PACKFS, "-v", "mount", "--log-file", log, "--stats-file", stats, "--pid-file", pid_file]
       + extra + images + [mnt])
    with open(pid_file) as f:
        pid = f.read().strip()
    with open(f"{CGROUP}/cgroup.procs", "w") as f:
        f.write(pid)


def unmount(mnt):
    sh([PACKFS, "umount", mnt], check=False)
    time.sleep(0.5)


def stats(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def epoch(mnt, listing, deadline, total_files):
    harness.drop_caches()
    r = harness.run_workload("read", 8, mnt, listing, deadline)
    if "error" in r:
        return r
    r["epoch_s"] = r["seconds"] * total_files / r["files"] if r["files"] else None
    r["complete"] = r["files"] == total_files
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/packfs-bench")
    ap.add_argument("--dataset", default="imagenet-20k")
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--rate-mb", type=float, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--deadline", type=float, default=60)
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    args = ap.parse_args()
    ds, meta = harness.ensure_dataset(args.dataset, args.work)
    shard_dir = os.path.join(ds, "shards")
    all_shards = sorted(os.path.join(shard_dir, n) for n in os.listdir(shard_dir) if n.endswith(".tar"))
    res = {"dataset": args.dataset, "rate_mb_s": args.rate_mb, "copy": {}, "epochs": {}}

    print("== staging throughput against cp (to /dev/shm)")
    for cold in (False, True):
        key = "cold" if cold else "warm"
        r = copy_race(all_shards, "/dev/shm/packfs-bench", args.rounds, cold)
        res["copy"][key] = r
        print(f"{key:5} source, {r['bytes']/1e9:.2f} GB: cp {r['cp_mb_s']:.0f} MB/s, "
              f"packfs stage {r['packfs_mb_s']:.0f} MB/s, ratio {r['ratio']:.2f}x")

    shards = all_shards[:args.shards]
    slow_mnt, loop, slow_shards = setup_slow(args.work, shards, int(args.rate_mb * 1e6))
    try:
        r = copy_race(slow_shards, "/dev/shm/packfs-bench", 1, True, cgroup=True)
        res["copy"]["throttled"] = r
        print(f"throttled source ({args.rate_mb:.0f} MB/s), {r['bytes']/1e9:.2f} GB: cp {r['cp_mb_s']:.0f} MB/s, "
              f"packfs stage {r['packfs_mb_s']:.0f} MB/s, ratio {r['ratio']:.2f}x")

        out = sh([PACKFS, "ls", "--extents"] + slow_shards).stdout
        listing_files = [l.split("\t")[0] for l in out.splitlines() if "\t" in l]
        random.Random(7).shuffle(listing_files)
        listing = os.path.join(args.work, "slow.list")
        with open(listing, "w") as f:
            f.write("\n".join(listing_files) + "\n")
        n = len(listing_files)
        mnt = os.path.join(args.work, "slow-packfs")
        log, st = mnt + ".log", mnt + ".stats.json"
        stage_dir = "/dev/shm/packfs-bench/stage"
        scenarios = [
            ("no stage, exact reads", ["--ram-chunks", "false"], False),
            ("no stage, 1M RAM chunks", ["--ram-chunks", "true"], False),
            ("no stage, 256K RAM chunks", ["--ram-chunks", "true", "--chunk-size", "256K"], False),
            ("eager stage to /dev/shm", ["--stage", stage_dir], True),
        ]
        print(f"== epochs, {n} files of {len(slow_shards)} shards on a device throttled to "
              f"{args.rate_mb:.0f} MB/s, 8 readers")
        for name, extra, staged in scenarios:
            shutil.rmtree(stage_dir, ignore_errors=True)
            mount(slow_shards, mnt, extra, log, st)
            e1 = epoch(mnt, listing, args.deadline, n)
            row = {"epoch1": e1}
            if staged:
                t0 = time.perf_counter()
                while stats(st).get("stage", {}).get("status") not in ("complete",) and \
                        time.perf_counter() - t0 < 600:
                    time.sleep(0.5)
                row["staging_done_after_epoch1_s"] = time.perf_counter() - t0
            before = stats(st)
            e2 = epoch(mnt, listing, args.deadline, n)
            time.sleep(1.2)
            after = stats(st)
            row["epoch2"] = e2
            row["epoch2_source_reads"] = after.get("source", {}).get("reads", 0) - before.get("source", {}).get("reads", 0)
            row["epoch2_source_bytes"] = after.get("source", {}).get("bytes", 0) - before.get("source", {}).get("bytes", 0)
            unmount(mnt)
            row["source_ops"] = harness.log_fields(log, "source operations")
            row["tiers"] = harness.log_fields(log, "bytes served by tier")
            res["epochs"][name] = row
            fmt = lambda e: (f"{e['epoch_s']:.1f} s ({e['files']}/{n} files read)" if e.get("epoch_s") else str(e))
            print(f"{name:28} epoch 1 {fmt(e1)}, epoch 2 {fmt(e2)}, epoch-2 source reads "
                  f"{row['epoch2_source_reads']} ({row['epoch2_source_bytes']/1e6:.1f} MB)"
                  + (f", staging done {row['staging_done_after_epoch1_s']:.1f} s after epoch 1" if staged else ""))
        shutil.rmtree(stage_dir, ignore_errors=True)
    finally:
        teardown_slow(slow_mnt, loop)
        shutil.rmtree("/dev/shm/packfs-bench", ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"staging-{args.dataset}.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print("JSON:", path)


if __name__ == "__main__":
    main()
