#!/usr/bin/env python3
"""Metadata at scale (issue 4): millions of tiny files in tar shards, mounted from a packfs index.

    bench/index_scale.py --files 2000000 [--shards 16] [--work /tmp/packfs-index-bench]

Generates (once, cached under --work) a tree of N tiny files in a dedicated tmpfs, K tar shards
made from it by GNU tar (WebDataset style: files only, no directory members) and a squashfs image
(mksquashfs defaults), then measures in one run:

- index build: `packfs index` against `tar -tf` over the same shards, cold (page cache dropped)
  and hot;
- mount time: packfs from its index, cold and hot (median of --repeat), next to squashfuse_ll and
  the kernel's squashfs on the image;
- `find MOUNT | wc -l` (names) and `find MOUNT -printf '%s'` (a stat of every entry) on a fresh
  mount after dropping caches, and again warm (medians over --find-repeat / --stat-repeat mounts), for packfs (default, and `--readdirplus always` as
  packfs-always), squashfuse_ll, kernel squashfs and the tree itself on tmpfs;
- the daemons' memory after mount and after the walks (RssAnon is the heap; RssFile counts mapped
  index pages), and the index size per file.

Ratios are peer time / packfs time: above 1 means packfs is faster. Prints a Markdown table and
writes JSON to --json (default bench/out/index-scale-N.json).
"""
import argparse, json, os, platform, shutil, statistics, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run import PACKFS, daemon_pid, drop_caches, is_mounted, sh  # noqa: E402


def generate(files, shards, dirs, work):
    """Tree on tmpfs + shards + squashfs image, cached by a marker file."""
    ds = os.path.join(work, f"n{files}")
    marker = os.path.join(ds, "done.json")
    tmpfs = os.path.join(work, "tmpfs")
    tree = os.path.join(tmpfs, f"n{files}")
    if os.path.exists(marker) and os.path.isdir(tree):
        return ds, tree
    os.makedirs(os.path.join(ds, "shards"), exist_ok=True)
    os.makedirs(tmpfs, exist_ok=True)
    if not is_mounted(tmpfs):
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20g", "tmpfs", tmpfs], check=True)
    t0 = time.perf_counter()
    shutil.rmtree(tree, ignore_errors=True)
    per_dir = -(-files // dirs)
    lists = [[] for _ in range(shards)]
    for i in range(files):
        d = f"class{i // per_dir:05d}"
        if i % per_dir == 0:
            os.makedirs(os.path.join(tree, d))
        rel = f"{d}/sample{i:08d}.txt"
        fd = os.open(os.path.join(tree, rel), os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, b"%d\n" % i)
        os.close(fd)
        # A fixed scatter of samples over shards, as a shuffled packing would do.
        lists[(i * 7919) % shards].append(rel)
    print(f"tree of {files} files in {time.perf_counter() - t0:.0f} s", flush=True)
    procs = []
    for k, members in enumerate(lists):
        lst = os.path.join(ds, f"shard-{k:03d}.list")
        with open(lst, "w") as f:
            f.write("\n".join(members) + "\n")
        shard = os.path.join(ds, "shards", f"shard-{k:03d}.tar")
        procs.append(subprocess.Popen(["tar", "-cf", shard, "-C", tree, "--no-recursion",
                                       "-T", lst]))
        if len(procs) >= 2:
            procs.pop(0).wait()
    for p in procs:
        p.wait()
    print(f"shards in {time.perf_counter() - t0:.0f} s", flush=True)
    img = os.path.join(ds, "image.sqfs")
    # No duplicate search: with millions of files of a few equal sizes it is quadratic.
    if shutil.which("mksquashfs"):
        subprocess.run(["mksquashfs", tree, img, "-noappend", "-quiet", "-no-progress", "-no-duplicates",
                        "-processors", str(os.cpu_count())], check=True)
    print(f"squashfs in {time.perf_counter() - t0:.0f} s", flush=True)
    with open(marker, "w") as f:
        json.dump({"files": files, "shards": shards, "dirs": dirs}, f)
    return ds, tree


def timed(cmd, shell=False):
    """Wall seconds and peak RSS (KiB) of a command that must succeed."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, shell=shell, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    secs = time.perf_counter() - t0
    if status != 0:
        raise RuntimeError(f"{cmd} failed: {proc.stderr.read().decode(errors='replace')}")
    return secs, usage.ru_maxrss


def shell_out(cmd):
    t0 = time.perf_counter()
    out = subprocess.run(cmd, shell=True, capture_output=True, text=True, check=True).stdout
    return time.perf_counter() - t0, out.strip()


def memory(pid):
    """VmRSS, RssAnon, RssFile, VmHWM in KiB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[key] = int(line.split()[1])
    return out


class Mounted:
    """One peer mounted at `mnt`; `start` returns launch-to-ready seconds."""

    def __init__(self, peer, source, mnt, log=None):
        self.peer, self.source, self.mnt, self.log = peer, source, mnt, log
        os.makedirs(mnt, exist_ok=True)

    def start(self):
        cmd = {
            "packfs": [PACKFS, "mount", *(["-v", "--log-file", self.log] if self.log else []),
                       self.source, self.mnt],
            "packfs-always": [PACKFS, "mount", "--readdirplus", "always", self.source, self.mnt],
            "squashfuse_ll": ["squashfuse_ll", self.source, self.mnt],
            "kernel-squashfs": ["mount", "-t", "squashfs", "-o", "loop,ro", self.source,
                                self.mnt],
        }[self.peer]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{self.peer} mount failed: {done.stderr}")
        while True:
            try:
                os.stat(self.mnt)
                if is_mounted(self.mnt):
                    return time.perf_counter() - t0
            except OSError:
                pass
            time.sleep(0.001)

    def pid(self):
        return daemon_pid(self.mnt) if self.peer != "kernel-squashfs" else None

    def stop(self):
        if not is_mounted(self.mnt):
            return
        if self.peer.startswith("packfs"):
            sh([PACKFS, "umount", self.mnt])
        elif self.peer == "kernel-squashfs":
            sh(["umount", self.mnt])
        else:
            sh(["fusermount3", "-u", self.mnt])
        for _ in range(1000):
            if not is_mounted(self.mnt):
                return
            time.sleep(0.01)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=2_000_000)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--dirs", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=5, help="mounts timed per peer")
    ap.add_argument("--find-repeat", type=int, default=3, help="fresh mounts per `find` walk")
    ap.add_argument("--stat-repeat", type=int, default=1, help="fresh mounts per stat walk")
    ap.add_argument("--work", default="/tmp/packfs-index-bench")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not os.path.exists(PACKFS):
        sys.exit("build first: cargo build --release")
    ds, tree = generate(args.files, args.shards, args.dirs, args.work)
    shards = sorted(os.path.join(ds, "shards", s) for s in os.listdir(os.path.join(ds, "shards")))
    img = os.path.join(ds, "image.sqfs")
    index = os.path.join(ds, "dataset.packfs-index")
    expected = args.files + args.dirs + 1
    res = {"files": args.files, "shards": args.shards, "dirs": args.dirs,
           "machine": f"{os.cpu_count()} CPUs, {platform.release()}",
           "shard_bytes": sum(os.path.getsize(s) for s in shards)}

    # 1. Index build against tar -t.
    tar_t = "for s in " + " ".join(shards) + "; do tar -tf $s; done > /dev/null"
    tar_t_par = "printf '%s\\n' " + " ".join(shards) + " | xargs -P 2 -n 1 tar -tf > /dev/null"
    build = [PACKFS, "index", *shards, "-o", index]
    for temp in ("cold", "hot"):
        for name, cmd, shell in (("tar -t", tar_t, True), ("tar -t x2", tar_t_par, True),
                                 ("packfs index", build, False)):
            if temp == "cold":
                drop_caches()
            secs, rss = timed(cmd, shell=shell)
            res[f"build {name} {temp}"] = secs
            if name == "packfs index":
                res[f"build packfs index {temp} peak_rss_kb"] = rss
            print(f"{name:14s} {temp}: {secs:7.2f} s", flush=True)
    res["index_bytes"] = os.path.getsize(index)
    res["index_bytes_per_file"] = res["index_bytes"] / args.files

    # 2. Mount times.
    mnt = os.path.join(args.work, "mnt")
    peers = [("packfs", index)]
    if shutil.which("squashfuse_ll") and os.path.exists(img):
        peers.append(("squashfuse_ll", img))
    if os.path.exists(img) and os.geteuid() == 0:
        peers.append(("kernel-squashfs", img))
    for peer, source in peers:
        for temp in ("cold", "hot"):
            times = []
            for _ in range(args.repeat):
                m = Mounted(peer, source, os.path.join(mnt, peer))
                if temp == "cold":
                    drop_caches()
                times.append(m.start())
                m.stop()
            res[f"mount {peer} {temp}"] = statistics.median(times)
            print(f"mount {peer:16s} {temp}: median {statistics.median(times) * 1000:7.1f} ms "
                  f"(min {min(times) * 1000:.1f}, max {max(times) * 1000:.1f})", flush=True)
    # 3. Walks, cold then warm, each on a fresh mount; memory of the daemons.
    walks = {"find": "find {} | wc -l", "find-stat": "find {} -printf '%s\\n' | wc -l"}
    # packfs-always: the same index mounted with --readdirplus always (listings carry attributes).
    for peer, source in [*peers[:1], ("packfs-always", index), *peers[1:], ("tmpfs", tree)]:
        for walk, cmd in walks.items():
            runs = {"cold": [], "warm": []}
            for _ in range(args.find_repeat if walk == "find" else args.stat_repeat):
                m = None
                root = tree
                drop_caches()
                if peer != "tmpfs":
                    log = os.path.join(args.work, "packfs.log") if peer == "packfs" else None
                    m = Mounted(peer, source, os.path.join(mnt, peer), log)
                    m.start()
                    root = m.mnt
                    pid = m.pid()
                    if pid and walk == "find":
                        # Right away: packfs's background index check runs during the walk.
                        res[f"mem {peer} after mount"] = memory(pid)
                for temp in ("cold", "warm"):
                    secs, out = shell_out(cmd.format(root))
                    if int(out) != expected:
                        raise RuntimeError(f"{peer} {walk}: {out} entries, expected {expected}")
                    runs[temp].append(secs)
                if m:
                    pid = m.pid()
                    if pid:
                        res[f"mem {peer} after {walk}"] = memory(pid)
                    m.stop()
            for temp, times in runs.items():
                res[f"{walk} {peer} {temp}"] = statistics.median(times)
                print(f"{walk:9s} {peer:16s} {temp}: median {statistics.median(times):6.2f} s "
                      f"of {' '.join(f'{t:.2f}' for t in times)}", flush=True)

    # 4. For reference, a packfs mount that scans the shards (no index); after the walks, so that
    # its reading of every shard does not disturb them.
    m = Mounted("packfs", None, os.path.join(mnt, "packfs"))
    t0 = time.perf_counter()
    subprocess.run([PACKFS, "mount", *shards, m.mnt], check=True, capture_output=True)
    res["mount packfs scan hot"] = time.perf_counter() - t0
    m.stop()

    out = args.json or os.path.join(HERE, "out", f"index-scale-{args.files}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(markdown(res))
    print(f"JSON: {out}")


def markdown(r):
    n = r["files"]
    lines = [f"### {n:,} files in {r['shards']} shards ({r['shard_bytes'] / 1e9:.2f} GB of tar), "
             f"{r['machine']}", ""]
    lines += ["| index build | cold | hot |", "|---|---|---|"]
    for name in ("tar -t", "tar -t x2", "packfs index"):
        lines.append(f"| {name} | {r[f'build {name} cold']:.2f} s | {r[f'build {name} hot']:.2f} s |")
    lines.append(f"| ratio tar -t / packfs index | "
                 f"{r['build tar -t cold'] / r['build packfs index cold']:.2f}x | "
                 f"{r['build tar -t hot'] / r['build packfs index hot']:.2f}x |")
    lines += ["", f"Index: {r['index_bytes']:,} bytes, {r['index_bytes_per_file']:.1f} bytes per "
              f"file; `packfs index` peak RSS {r['build packfs index hot peak_rss_kb'] / 1024:.0f} MB.",
              "", "| mount (median) | cold | hot |", "|---|---|---|"]
    for peer in ("packfs", "squashfuse_ll", "kernel-squashfs"):
        if f"mount {peer} cold" in r:
            lines.append(f"| {peer} | {r[f'mount {peer} cold'] * 1000:.1f} ms | "
                         f"{r[f'mount {peer} hot'] * 1000:.1f} ms |")
    lines.append(f"| packfs scanning the shards (no index) | | "
                 f"{r['mount packfs scan hot'] * 1000:.0f} ms |")
    lines += ["", "| walk | peer | cold | warm | peer / packfs cold | warm |", "|---|---|---|---|---|---|"]
    for walk in ("find", "find-stat"):
        base_c, base_w = r[f"{walk} packfs cold"], r[f"{walk} packfs warm"]
        for peer in ("packfs", "packfs-always", "squashfuse_ll", "kernel-squashfs", "tmpfs"):
            if f"{walk} {peer} cold" not in r:
                continue
            c, w = r[f"{walk} {peer} cold"], r[f"{walk} {peer} warm"]
            lines.append(f"| {walk} | {peer} | {c:.2f} s | {w:.2f} s | {c / base_c:.2f}x | "
                         f"{w / base_w:.2f}x |")
    lines += ["", "| daemon memory (MB) | VmRSS | RssAnon | RssFile |", "|---|---|---|---|"]
    for key in sorted(k for k in r if k.startswith("mem ")):
        m = r[key]
        lines.append(f"| {key[4:]} | {m['VmRSS'] / 1024:.1f} | {m.get('RssAnon', 0) / 1024:.1f} | "
                     f"{m.get('RssFile', 0) / 1024:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
