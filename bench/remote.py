#!/usr/bin/env python3
"""packfs over shards in an object store against one object per file, through a store with
injected latency (tests/support/objserver.py serves both layouts from /dev/shm over HTTP/1.1 and
counts every request).

For each latency (ms per request) and each reader count, one cold epoch of random reads (or, with
`--order archive`, of the files in the order the shards hold them, shard after shard, the readers
taking the next file in turn; with `--order shards`, each reader walking its own shards in that
order, as WebDataset's DataLoader workers do):
  - per-object: every sample is its own object, fetched with one GET each by N threads
    (keep-alive connections), the access pattern of mountpoint-s3 over one object per file;
  - packfs: the samples in tar shards, mounted from a local index (`packfs mount INDEX`), N
    threads reading the files in random order through the mount;
  - packfs --stage: epoch 1 while the eager stager copies the shards to /dev/shm, then epoch 2
    from a cold page cache once staging is complete;
  - packfs + hints: as packfs, the epoch's order first sent to the mount (`packfs.Hints`, what
    packfs.torch's samplers do), so the daemon fetches the samples ahead of the readers.
Requests and bytes are the server's counts; rss is the daemon's peak (VmHWM). Usage:
  bench/remote.sh [--files 4000] [--size 110000] [--shards 8] [--latency 5,20] [--readers 8,32]
      [--order random|archive|shards] [--runs object,packfs,stage,hints] [--mount-args "..."]
      [--packfs BINARY] [--before OLD_BINARY] [--rounds N]
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import http.client
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PACKFS = os.path.join(ROOT, "target/release/packfs")
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("PACKFS_BIN", PACKFS)
import packfs as packfs_py  # noqa: E402 - the package of this tree, driving this tree's binary
OBJSERVER = os.path.join(ROOT, "tests/support/objserver.py")


def make_dataset(work, files, size, shards):
    objects = os.path.join(work, "objects")
    # Reused only if made with the same parameters (a run with others read a stale layout).
    made_with = f"{files} {size} {shards}\n"
    done = os.path.join(work, "done")
    if os.path.exists(done) and open(done).read() == made_with:
        return objects
    shutil.rmtree(work, ignore_errors=True)
    rnd = random.Random(1)
    os.makedirs(os.path.join(objects, "flat"))
    names = []
    for i in range(files):
        # Sizes spread around `size`, as JPEGs are.
        n = max(1000, int(rnd.gauss(size, size / 4)))
        name = f"train/c{i % 100:03d}/s{i:07d}.jpg"
        path = os.path.join(objects, "flat", name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(os.urandom(n))
        names.append(name)
    rnd.shuffle(names)
    per = (len(names) + shards - 1) // shards
    for s in range(shards):
        with tarfile.open(os.path.join(objects, f"shard-{s:06d}.tar"), "w", format=tarfile.GNU_FORMAT) as t:
            for name in sorted(names[s * per:(s + 1) * per]):
                t.add(os.path.join(objects, "flat", name), arcname=name)
    with open(done, "w") as f:
        f.write(made_with)
    return objects


def start_server(root):
    proc = subprocess.Popen([sys.executable, OBJSERVER, "--root", root], stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline().split()[1])
    return proc, f"http://127.0.0.1:{port}"


def control(url, what):
    return json.loads(urllib.request.urlopen(f"{url}/{what}").read())


def drop_caches():
    subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], check=False)


def run_threads(n, items, work):
    """Runs work(item) over items with n threads; returns seconds."""
    lock = threading.Lock()
    queue = list(items)

    def take():
        while True:
            with lock:
                if not queue:
                    return
                item = queue.pop()
            yield item

    return run_walks([take() for _ in range(n)], work)


def run_walks(walks, work):
    """Runs work(item) over each walk's items in order, a thread per walk; returns seconds."""
    errors = []

    def worker(walk):
        state = {}
        for item in walk:
            try:
                work(item, state)
            except Exception as e:  # noqa: BLE001 - counted and reported
                errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(w,)) for w in walks]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} reads failed, e.g. {errors[0]}")
    return time.perf_counter() - started


def run_order(n, order, work):
    """`order` is the files for n threads to share, or (`--order shards`) a walk per thread."""
    if order and isinstance(order[0], list):
        return run_walks(order, work)
    return run_threads(n, order, work)


def files_in(order):
    return sum(len(w) for w in order) if order and isinstance(order[0], list) else len(order)


def per_object_epoch(url, names, readers):
    host, port = url.split("//")[1].split(":")

    def get(name, state):
        conn = state.get("conn") or http.client.HTTPConnection(host, int(port), timeout=60)
        state["conn"] = conn
        conn.request("GET", "/flat/" + name)
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200 or not body:
            raise RuntimeError(f"{name}: {resp.status}")

    return run_order(readers, names, get)


def mount_epoch(mnt, names, readers):
    def read(name, _state):
        with open(os.path.join(mnt, name), "rb") as f:
            while f.read(1 << 20):
                pass

    return run_order(readers, names, read)


def packfs(*args, env=None):
    return subprocess.run([PACKFS, *args], check=True, capture_output=True, text=True, env=env)


def stage_status(mnt):
    out = subprocess.run([PACKFS, "status", "--json", mnt], capture_output=True, text=True).stdout
    st = json.loads(out)[0]["counters"].get("stage") or {}
    return st.get("status")


def daemon_rss_mb(mnt):
    """The mount's daemon's peak resident memory (VmHWM), in MB."""
    out = subprocess.run([PACKFS, "status", "--json", mnt], capture_output=True, text=True).stdout
    pid = json.loads(out)[0]["counters"]["pid"]
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    return None


def read_order(order):
    """The files in the order the readers take them (each takes the last one left)."""
    if order and isinstance(order[0], list):
        return [name for walk in order for name in walk]
    return order[::-1]


def row(kind, latency, readers, secs, stats, files, rss=None):
    return {
        "run": kind,
        "latency_ms": latency,
        "readers": readers,
        "seconds": round(secs, 3),
        "files_per_s": round(files / secs, 1),
        "requests": stats["requests"],
        "gets": stats["gets"],
        "mb": round(stats["bytes"] / 1e6, 1),
        "max_in_flight": stats.get("max_in_flight"),
        "requests_per_file": round(stats["requests"] / files, 3),
        "rss_mb": rss,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=4000)
    ap.add_argument("--size", type=int, default=110_000)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--latency", default="5,20")
    ap.add_argument("--readers", default="8,32")
    ap.add_argument("--work", default="/dev/shm/packfs-bench-remote")
    ap.add_argument("--out", default=os.path.join(HERE, "out/remote.json"))
    ap.add_argument("--mount-args", default="", help="extra options for every packfs mount")
    ap.add_argument("--runs", default="object,packfs,stage", help="which runs, of object,packfs,stage")
    ap.add_argument("--order", default="random", choices=["random", "archive", "shards"])
    ap.add_argument("--packfs", default=PACKFS, help="the packfs binary")
    ap.add_argument("--before", help="a second packfs build whose packfs and hints runs go in "
                    "the same cells, after this one's (rows marked 'before')")
    ap.add_argument("--rounds", type=int, default=1, help="passes over every cell")
    args = ap.parse_args()
    globals()["PACKFS"] = os.path.abspath(args.packfs)
    builds = [("", os.path.abspath(args.packfs))]
    if args.before:
        builds.append((" (before)", os.path.abspath(args.before)))

    objects = make_dataset(args.work, args.files, args.size, args.shards)
    flat = os.path.join(objects, "flat")
    names = []
    for d, _, fs in os.walk(flat):
        names += [os.path.relpath(os.path.join(d, f), flat) for f in fs]
    server, url = start_server(objects)
    env = dict(os.environ, PACKFS_REMOTE_REQUESTS="64")
    shards = f"{url}/shard-{{000000..{args.shards - 1:06d}}}.tar"
    index = os.path.join(args.work, "remote.packfs-index")
    packfs("index", "-o", index, "--force", shards, env=env)
    mnt = os.path.join(args.work, "mnt")
    stage = os.path.join(args.work, "stage")
    os.makedirs(mnt, exist_ok=True)
    rows = []
    try:
        for latency in [float(x) for x in args.latency.split(",")]:
            control(url, f"_latency?ms={latency}")
            for readers in [int(x) for x in args.readers.split(",")]:
                order = names[:]
                random.Random(readers).shuffle(order)
                if args.order in ("archive", "shards"):
                    in_shard = []
                    for k in range(args.shards):
                        with tarfile.open(os.path.join(objects, f"shard-{k:06d}.tar")) as t:
                            in_shard.append([m.name for m in t.getmembers() if m.isfile()])
                    # The reader threads take files from the end of the list.
                    order = [name for files in in_shard for name in files][::-1]
                if args.order == "shards":
                    order = [[name for files in in_shard[r::readers] for name in files]
                             for r in range(readers)]

                runs = args.runs.split(",")
                extra = args.mount_args.split()
                if "object" in runs:
                    control(url, "_reset")
                    secs = per_object_epoch(url, order, readers)
                    rows.append(row("one object per file", latency, readers, secs, control(url, "_stats"), files_in(order)))

                for tag, build in builds * args.rounds:
                    globals()["PACKFS"] = build
                    if "packfs" in runs:
                        drop_caches()
                        packfs("mount", *extra, index, mnt, env=env)
                        control(url, "_reset")
                        secs = mount_epoch(mnt, order, readers)
                        rows.append(row("packfs" + tag, latency, readers, secs, control(url, "_stats"),
                                        files_in(order), daemon_rss_mb(mnt)))
                        packfs("umount", mnt)

                    if "hints" in runs:
                        drop_caches()
                        packfs("mount", *extra, index, mnt, env=env)
                        control(url, "_reset")
                        started = time.perf_counter()
                        hints = packfs_py.Hints(mnt)
                        hints.send(read_order(order))
                        sent = time.perf_counter() - started
                        secs = sent + mount_epoch(mnt, order, readers)
                        hints.close()
                        rows.append(row("packfs + hints" + tag, latency, readers, secs, control(url, "_stats"),
                                        files_in(order), daemon_rss_mb(mnt)))
                        time.sleep(1.1)
                        la = packfs_py.status(mnt)[0]["counters"]["lookahead"]
                        rows[-1]["hints"] = {k: la[k] for k in (
                            "first_reads", "missed", "late", "fetched", "requests", "dropped_unread",
                            "window_peak")}
                        print(json.dumps(rows[-1]), flush=True)
                        packfs("umount", mnt)

                globals()["PACKFS"] = builds[0][1]
                if "stage" not in runs:
                    continue
                shutil.rmtree(stage, ignore_errors=True)
                drop_caches()
                packfs("mount", *extra, "--stage", stage, index, mnt, env=env)
                control(url, "_reset")
                secs = mount_epoch(mnt, order, readers)
                rows.append(row("packfs --stage, epoch 1", latency, readers, secs, control(url, "_stats"), files_in(order)))
                while stage_status(mnt) != "complete":
                    time.sleep(0.2)
                drop_caches()
                control(url, "_reset")
                secs = mount_epoch(mnt, order, readers)
                rows.append(row("packfs --stage, epoch 2", latency, readers, secs, control(url, "_stats"), files_in(order)))
                packfs("umount", mnt)
                for r in rows[-2:]:
                    print(json.dumps(r), flush=True)
    finally:
        subprocess.run([PACKFS, "umount", "--if-mounted", mnt], capture_output=True)
        server.kill()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"files": len(names), "shards": args.shards, "order": args.order, "rows": rows},
                  f, indent=1)
    tar_bytes = sum(os.path.getsize(os.path.join(objects, f"shard-{k:06d}.tar"))
                    for k in range(args.shards))
    print()
    print(f"{len(names)} files of ~{args.size // 1000} kB, {args.shards} shards "
          f"({tar_bytes / 1e6:.0f} MB, {-(-tar_bytes // (1 << 20))} chunks of 1 MiB); cold epoch, "
          f"{args.order} order")
    print()
    print("| latency | readers | run | files/s | vs first run | requests/file | MB | daemon RSS MB |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|")
    base = {}
    for r in rows:
        key = (r["latency_ms"], r["readers"])
        base.setdefault(key, r)
        b = base[key]
        print(f"| {r['latency_ms']:g} ms | {r['readers']} | {r['run']} | {r['files_per_s']:,.0f} | "
              f"{r['files_per_s'] / b['files_per_s']:.2f}x | {r['requests_per_file']} | {r['mb']:,.0f} | "
              f"{r['rss_mb'] if r['rss_mb'] is not None else ''} |")


if __name__ == "__main__":
    main()
