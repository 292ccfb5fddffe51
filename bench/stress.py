#!/usr/bin/env python3
"""Stress: many readers for minutes over one mount of tar shards, a squashfs image and a zip with
large deflated members, every byte checked, with walkers and injected faults; the daemon's RSS
and threads sampled. Not part of CI (it runs for minutes).

Usage: bench/stress.py [--readers 64] [--minutes 10] [--data /tmp/packfs-stress]
                       [--packfs target/release/packfs] [--cache-size 256M]

The dataset is made once under --data by the real tools (GNU tar, mksquashfs, zip) and reused:
  tar/     8 000 files of 1-200 kB in 4 tar shards
  sqfs/    4 000 files of 1-200 kB in a squashfs image (gzip)
  zip/     2 000 small files and 6 files of 24-64 MiB, deflated (served through checkpoints)
One zip member is damaged on purpose after packing: its reads must fail with EIO, never serve
wrong bytes (counted as expected errors). Every 30 s the page cache is dropped (reads go to the
daemon again); every 90 s the daemon is stopped for 2 s (SIGSTOP/SIGCONT).

Prints files and bytes read, errors (expected and not), wrong bytes (must be 0), walker passes,
and the daemon's RSS (min/median/max) against its RAM budget; writes bench/out/stress-*.json.
"""
import argparse, hashlib, json, os, random, signal, statistics, subprocess, sys, time
from multiprocessing import Event, Process, Queue

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def content(seed, size):
    rng = random.Random(seed)
    if size > 4 << 20:
        # Compressible (deflate makes it ~3x smaller) but not trivial: 1 MiB of words from a small
        # vocabulary, then 64 KiB pieces of it at random offsets (farther apart than deflate's
        # 32 KiB window).
        words = [bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
                 for _ in range(4096)]
        text = b" ".join(words[rng.getrandbits(12)] for _ in range(200_000))[: 1 << 20]
        pieces, n = [], 0
        while n < size:
            at = rng.randrange(0, len(text) - 65536)
            pieces.append(text[at : at + 65536])
            n += 65536
        return b"".join(pieces)[:size]
    return rng.randbytes(size)


def digest(data):
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def run(cmd, **kw):
    subprocess.run(cmd, check=True, **kw)


def make_dataset(data, packfs):
    ready = os.path.join(data, "manifest.json")
    if os.path.exists(ready):
        with open(ready) as f:
            return json.load(f)
    src = os.path.join(data, "src")
    manifest = {}
    rng = random.Random(7)

    def write(rel, size, seed):
        path = os.path.join(src, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        body = content(seed, size)
        with open(path, "wb") as f:
            f.write(body)
        manifest[rel] = [size, digest(body)]

    seed = 0
    for top, count in (("tar", 8000), ("sqfs", 4000), ("zip", 2000)):
        for i in range(count):
            seed += 1
            write(f"{top}/c{i % 50:02d}/f{i:05d}.bin", rng.randint(1000, 200_000), seed)
    for i, mib in enumerate((24, 32, 40, 48, 56, 64)):
        seed += 1
        write(f"zip/big/b{i}.txt", mib << 20, seed)
    images = os.path.join(data, "images")
    os.makedirs(images, exist_ok=True)
    tar_files = sorted(r for r in manifest if r.startswith("tar/"))
    for s in range(4):
        lst = os.path.join(data, f"tar-{s}.list")
        with open(lst, "w") as f:
            f.write("\n".join(tar_files[s::4]) + "\n")
        run(["tar", "-C", src, "-cf", os.path.join(images, f"shard-{s}.tar"), "-T", lst])
    run(["mksquashfs", os.path.join(src, "sqfs"), os.path.join(images, "image.sqfs"),
         "-quiet", "-noappend", "-keep-as-directory"], stdout=subprocess.DEVNULL)
    zip_path = os.path.join(images, "data.zip")
    if os.path.exists(zip_path):
        os.remove(zip_path)
    run(["zip", "-qr", "-6", zip_path, "zip"], cwd=src)
    # Damage one small member's data: its CRC-32 no longer matches (zip stores random bytes as
    # they are, so the member is "stored at N").
    victim = "zip/c07/f00007.bin"
    out = subprocess.run([packfs, "ls", "--extents", zip_path],
                         check=True, capture_output=True, text=True).stdout
    line = next(l for l in out.splitlines() if l.startswith(victim + "\t"))
    at = int(line.split(" at ")[1].split()[0])
    with open(zip_path, "r+b") as f:
        f.seek(at + 100)
        b = f.read(1)
        f.seek(at + 100)
        f.write(bytes([b[0] ^ 0x55]))
    manifest[victim].append("damaged")
    with open(ready, "w") as f:
        json.dump(manifest, f)
    return manifest


def reader(mnt, names, manifest, stop, results, seed):
    rng = random.Random(seed)
    files = nbytes = wrong = errors = expected = 0
    kinds = {}
    while not stop.is_set():
        rel = rng.choice(names)
        meta = manifest[rel]
        try:
            with open(os.path.join(mnt, rel), "rb") as f:
                data = f.read()
        except OSError as e:
            if len(meta) > 2:
                expected += 1
            else:
                errors += 1
                kinds[e.strerror] = kinds.get(e.strerror, 0) + 1
            continue
        files += 1
        nbytes += len(data)
        if len(data) != meta[0] or digest(data) != meta[1]:
            wrong += 1
    results.put(("reader", files, nbytes, wrong, errors, expected, kinds))


def walker(mnt, stop, results):
    passes = entries = errors = 0
    while not stop.is_set():
        try:
            for dirpath, dirs, names in os.walk(mnt):
                for n in names:
                    os.stat(os.path.join(dirpath, n))
                    entries += 1
            passes += 1
        except OSError:
            errors += 1
    results.put(("walker", passes, entries, errors))


def status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return int(out["VmRSS"].split()[0]) * 1024, int(out["Threads"])


def size_bytes(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--readers", type=int, default=64)
    ap.add_argument("--walkers", type=int, default=2)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--data", default="/tmp/packfs-stress")
    ap.add_argument("--packfs", default=os.path.join(ROOT, "target/release/packfs"))
    ap.add_argument("--cache-size", default="256M")
    args = ap.parse_args()
    os.makedirs(args.data, exist_ok=True)
    t0 = time.time()
    manifest = make_dataset(args.data, args.packfs)
    print(f"dataset: {len(manifest)} files, {sum(m[0] for m in manifest.values()) / 1e9:.2f} GB "
          f"({time.time() - t0:.0f} s to make or load)", flush=True)
    images = os.path.join(args.data, "images")
    index = os.path.join(args.data, "all.packfs-index")
    t0 = time.time()
    run([args.packfs, "index", "--force", "-o", index] +
        sorted(os.path.join(images, n) for n in os.listdir(images)), stdout=subprocess.DEVNULL)
    print(f"index built in {time.time() - t0:.1f} s", flush=True)
    mnt = os.path.join(args.data, "mnt")
    os.makedirs(mnt, exist_ok=True)
    subprocess.run([args.packfs, "umount", "--if-mounted", mnt], check=False)
    pid_file = os.path.join(args.data, "daemon.pid")
    log = os.path.join(args.data, "daemon.log")
    run([args.packfs, "mount", "--cache-size", args.cache_size, "--pid-file", pid_file,
         "--log-file", log, index, mnt])
    pid = int(open(pid_file).read())
    names = sorted(manifest)
    stop, results = Event(), Queue()
    procs = [Process(target=reader, args=(mnt, names, manifest, stop, results, i))
             for i in range(args.readers)]
    procs += [Process(target=walker, args=(mnt, stop, results)) for _ in range(args.walkers)]
    for p in procs:
        p.start()
    rss, threads, faults = [], [], []
    start = time.time()
    end = start + args.minutes * 60
    next_drop, next_stop = start + 30, start + 90
    try:
        while time.time() < end:
            time.sleep(1)
            r, t = status(pid)
            rss.append(r)
            threads.append(t)
            now = time.time()
            if now >= next_drop:
                with open("/proc/sys/vm/drop_caches", "w") as f:
                    f.write("3\n")
                faults.append("drop_caches")
                next_drop += 30
            if now >= next_stop:
                os.kill(pid, signal.SIGSTOP)
                time.sleep(2)
                os.kill(pid, signal.SIGCONT)
                faults.append("sigstop 2s")
                next_stop += 90
    finally:
        elapsed = time.time() - start
        stop.set()
        got = [results.get() for _ in procs]
        for p in procs:
            p.join()
    alive = os.path.exists(f"/proc/{pid}")
    subprocess.run([args.packfs, "umount", mnt], check=False)
    readers = [g for g in got if g[0] == "reader"]
    walkers = [g for g in got if g[0] == "walker"]
    kinds = {}
    for g in readers:
        for k, v in g[6].items():
            kinds[k] = kinds.get(k, 0) + v
    budget = size_bytes(args.cache_size)
    out = {
        "readers": args.readers, "walkers": args.walkers, "seconds": round(elapsed, 1),
        "files_read": sum(g[1] for g in readers), "bytes_read": sum(g[2] for g in readers),
        "wrong": sum(g[3] for g in readers), "errors": sum(g[4] for g in readers),
        "error_kinds": kinds, "expected_errors": sum(g[5] for g in readers),
        "walker_passes": sum(g[1] for g in walkers), "walker_errors": sum(g[3] for g in walkers),
        "rss_min": min(rss), "rss_median": int(statistics.median(rss)), "rss_max": max(rss),
        "ram_budget": budget, "threads_max": max(threads), "threads_median": int(statistics.median(threads)),
        "faults": {f: faults.count(f) for f in set(faults)}, "daemon_alive_at_end": alive,
    }
    mb = lambda b: f"{b / 1e6:.0f} MB"
    print(f"{out['files_read']} files ({out['bytes_read'] / 1e9:.1f} GB) read by {args.readers} readers "
          f"in {elapsed:.0f} s ({out['files_read'] / elapsed:.0f} files/s); "
          f"wrong: {out['wrong']}; errors: {out['errors']} {kinds or ''}; "
          f"expected EIO (damaged member): {out['expected_errors']}")
    print(f"walkers: {out['walker_passes']} passes, {out['walker_errors']} errors; faults: {out['faults']}")
    print(f"daemon RSS min/median/max {mb(out['rss_min'])} / {mb(out['rss_median'])} / "
          f"{mb(out['rss_max'])} against a RAM budget of {mb(budget)}; threads median "
          f"{out['threads_median']}, max {out['threads_max']}; alive at the end: {alive}")
    os.makedirs(os.path.join(HERE, "out"), exist_ok=True)
    path = os.path.join(HERE, "out", time.strftime("stress-%Y%m%dT%H%M%S.json"))
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"written to {path}")
    return 0 if out["wrong"] == 0 and out["errors"] == 0 and alive else 1


if __name__ == "__main__":
    sys.exit(main())
