#!/usr/bin/env python3
"""packfs against its peers, same data, same run: one command, a table, JSON and a chart.

    bench/run.sh --dataset tiny-200k --peers all [--deadline 60] [--work /tmp/packfs-bench]

For each peer the harness mounts the dataset (timing launch to the first successful stat), runs
every workload cold (after dropping the page cache) and warm, records the daemon's peak RSS, and
unmounts. Ratios in the table are peer time / packfs time for the same work: above 1 means packfs
is faster. See docs/benchmarks.md.
"""
import argparse, json, os, platform, random, shutil, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
PACKFS = os.path.join(HERE, "..", "target", "release", "packfs")

DATASETS = {
    "smoke": dict(files=2000, classes=20, profile="tiny", shards=4),
    "tiny-200k": dict(files=200_000, classes=1000, profile="tiny", shards=16),
    "imagenet-20k": dict(files=20_000, classes=100, profile="imagenet", shards=8),
    # The same samples, fewer: the real shared file systems' runs (bench/pfs.py --fs ...).
    "imagenet-5k": dict(files=5_000, classes=100, profile="imagenet", shards=8),
}
PEERS = ["native", "tmpfs", "squashfuse_ll", "squashfuse", "kernel-squashfs", "ratarmount",
         "archivemount", "packfs"]
WORKLOADS = [("walk", 1), ("stat", 1), ("scan", 1), ("read", 1), ("read", 4), ("read", 16),
             ("loader", 2), ("loader", 8)]


def sh(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def is_mounted(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def daemon_pid(mnt):
    """The process serving `mnt`: the one whose command line names it."""
    me = os.getpid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if mnt.encode() in args and not any(b"run.py" in a or b"workloads.py" in a for a in args):
            return int(pid)
    return None


def memory_kb(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmHWM", "VmRSS")):
                    k, v = line.split(":")
                    out[k] = int(v.split()[0])
    except OSError:
        pass
    return out


class Peer:
    """Mounts one dataset one way. `root` is the directory that holds train/."""

    def __init__(self, name, ds, work):
        self.name, self.ds, self.work = name, ds, work
        self.mnt = os.path.join(work, "mnt", name)
        self.root = self.mnt
        self.extra = {}

    def missing(self):
        need = {"squashfuse_ll": ["squashfuse_ll"], "squashfuse": ["squashfuse"],
                "kernel-squashfs": ["mount"], "ratarmount": ["ratarmount", "fusermount"],
                "archivemount": ["archivemount", "fusermount"], "packfs": []}.get(self.name, [])
        for tool in need:
            if not shutil.which(tool):
                return f"{tool} is not installed (bench/install_peers.sh)"
        if "squashfs" in self.name and not os.path.exists(self.path("image.sqfs")):
            return "no squashfs image (mksquashfs missing when the dataset was generated)"
        if self.name == "kernel-squashfs" and os.geteuid() != 0:
            return "needs root for mount -o loop"
        if self.name == "packfs" and not os.path.exists(PACKFS):
            return "packfs release binary missing"
        return None

    def path(self, *p):
        return os.path.join(self.ds, *p)

    def command(self):
        shards = sorted(os.path.join(self.path("shards"), s)
                        for s in os.listdir(self.path("shards")) if s.endswith(".tar"))
        index_dir = os.path.join(self.work, "ratarmount-index")
        img = self.path("image.sqfs")
        return {
            "squashfuse_ll": ["squashfuse_ll", img, self.mnt],
            "squashfuse": ["squashfuse", img, self.mnt],
            "kernel-squashfs": ["mount", "-t", "squashfs", "-o", "loop,ro", img, self.mnt],
            "ratarmount": ["ratarmount", "--index-folders", index_dir, *shards, self.mnt],
            "archivemount": ["archivemount", "-o", "readonly", self.path("all.tar"), self.mnt],
            "packfs": [PACKFS, "mount", "-v", "--log-file", os.path.join(self.work, "packfs.log"),
                       self.index_path(), self.mnt],
        }[self.name]

    def index_path(self):
        return os.path.join(self.work, f"{os.path.basename(self.ds)}.packfs-index")

    def start(self):
        """Mounts; returns seconds from launch to the first successful stat of train/."""
        if self.name == "native":
            self.root = self.path("tree")
            return 0.0
        if self.name == "tmpfs":
            self.root = f"/dev/shm/packfs-bench-{os.path.basename(self.ds)}"
            if not os.path.exists(self.root):
                shutil.copytree(self.path("tree"), self.root)
            return 0.0
        os.makedirs(self.mnt, exist_ok=True)
        if self.name == "ratarmount":
            # First mount builds the index (timed apart), the measured mount reuses it.
            shutil.rmtree(os.path.join(self.work, "ratarmount-index"), ignore_errors=True)
            os.makedirs(os.path.join(self.work, "ratarmount-index"))
            self.extra["index_build_s"] = self._mount(self.command())
            self.stop()
        if self.name == "packfs":
            # As recommended: the index is built once (timed apart), the measured mount maps it.
            t0 = time.perf_counter()
            subprocess.run([PACKFS, "index", "-o", self.index_path(),
                            *sorted(os.path.join(self.path("shards"), s)
                                    for s in os.listdir(self.path("shards")) if s.endswith(".tar"))],
                           check=True, capture_output=True)
            self.extra["index_build_s"] = time.perf_counter() - t0
        return self._mount(self.command())

    def _mount(self, cmd):
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        while True:
            if is_mounted(self.mnt):
                try:
                    os.stat(os.path.join(self.mnt, "train"))
                    return time.perf_counter() - t0
                except OSError:
                    pass
            if proc.poll() not in (None, 0):
                raise RuntimeError(f"{cmd[0]} failed: {proc.stderr.read().strip()}")
            if time.perf_counter() - t0 > 1800:
                raise RuntimeError(f"{cmd[0]} did not mount within 30 min")
            time.sleep(0.005)

    def stop(self):
        if self.name == "tmpfs":
            # The copy holds RAM that the other peers' page caches should have.
            shutil.rmtree(self.root, ignore_errors=True)
            return
        if self.name == "native" or not is_mounted(self.mnt):
            return
        if self.name == "kernel-squashfs":
            sh(["umount", self.mnt])
        elif self.name == "packfs":
            sh([PACKFS, "umount", self.mnt])
        else:
            helper = shutil.which("fusermount3") or "fusermount"
            if sh([helper, "-u", self.mnt]).returncode != 0:
                sh([helper, "-uz", self.mnt])
        for _ in range(500):
            if not is_mounted(self.mnt):
                break
            time.sleep(0.01)


def run_workload(kind, readers, root, listing, deadline, split="interleave", hints=False):
    cmd = [sys.executable, os.path.join(HERE, "workloads.py"), kind, root,
           "--readers", str(readers), "--deadline", str(deadline), "--split", split]
    if hints:
        cmd.append("--hints")
    if kind in ("read", "loader"):
        cmd += ["--list", listing]
    out = sh(cmd)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1]}
    r = json.loads(out.stdout)
    r["files_per_s"] = r["files"] / r["seconds"] if r["seconds"] else None
    r["mb_per_s"] = r["bytes"] / r["seconds"] / 1e6 if r["seconds"] and r["bytes"] else None
    return r


def torch_available():
    return sh([sys.executable, "-c", "import torch, torchvision"]).returncode == 0


def ensure_dataset(name, work):
    spec = DATASETS[name]
    ds = os.path.join(work, name)
    if not os.path.exists(os.path.join(ds, "meta.json")):
        subprocess.run([sys.executable, os.path.join(HERE, "gen_dataset.py"), ds,
                        "--files", str(spec["files"]), "--classes", str(spec["classes"]),
                        "--profile", spec["profile"], "--shards", str(spec["shards"])], check=True)
    with open(os.path.join(ds, "meta.json")) as f:
        return ds, json.load(f)


def write_reading_order(ds, listing):
    """One shuffled reading order for every peer (paths relative to the plain tree, fixed seed);
    returns it."""
    files = []
    for dirpath, _, names in os.walk(os.path.join(ds, "tree")):
        files += [os.path.relpath(os.path.join(dirpath, n), os.path.join(ds, "tree")) for n in names]
    files.sort()
    random.Random(7).shuffle(files)
    with open(listing, "w") as f:
        f.write("\n".join(files) + "\n")
    return files


def log_fields(log, marker):
    """The key=value integers of the last line of a packfs log that contains `marker`."""
    try:
        with open(log) as f:
            lines = [l for l in f if marker in l]
    except OSError:
        return {}
    if not lines:
        return {}
    fields = dict(kv.split("=", 1) for kv in lines[-1].split() if "=" in kv)
    return {k: int(v) for k, v in fields.items() if v.isdigit()}


def packfs_counters(log):
    """The backing-file operations packfs logs when it unmounts."""
    fields = log_fields(log, "source operations")
    return {k: v for k, v in fields.items() if k in ("opens", "reads", "bytes")}


def label(kind, readers):
    return kind if kind in ("walk", "stat", "scan") else f"{kind}-{readers}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", choices=DATASETS, default="smoke")
    ap.add_argument("--peers", default="all")
    ap.add_argument("--deadline", type=float, default=60, help="seconds per pass at most")
    ap.add_argument("--workloads", default="all",
                    help="comma-separated labels, e.g. loader-2,loader-8 (default: all)")
    ap.add_argument("--work", default="/tmp/packfs-bench")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--chart", metavar="JSON", help="only redraw the table and chart of a saved run")
    ap.add_argument("--markdown", action="store_true", help="with --chart: the table as Markdown")
    args = ap.parse_args()
    if args.chart:
        with open(args.chart) as f:
            saved = json.load(f)
        if args.markdown:
            print_markdown(saved)
        else:
            print_table(saved)
        chart(saved, os.path.splitext(args.chart)[0] + ".png")
        return
    peers = PEERS if args.peers == "all" else args.peers.split(",")
    os.makedirs(args.out, exist_ok=True)
    ds, meta = ensure_dataset(args.dataset, args.work)
    listing = os.path.join(args.work, f"{args.dataset}.list")
    write_reading_order(ds, listing)
    have_torch = torch_available()
    results = {"dataset": args.dataset, "meta": meta, "deadline_s": args.deadline,
               "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                           "python": platform.python_version()},
               "cold_possible": drop_caches(), "peers": {}}
    for name in peers:
        peer = Peer(name, ds, args.work)
        why = peer.missing()
        if why:
            print(f"{name}: MISSING: {why}", flush=True)
            results["peers"][name] = {"missing": why}
            continue
        entry = {"workloads": {}}
        try:
            entry["mount_s"] = round(peer.start(), 4)
            entry.update(peer.extra)
            for kind, readers in WORKLOADS:
                if kind == "loader" and not have_torch:
                    continue
                if args.workloads != "all" and label(kind, readers) not in args.workloads.split(","):
                    continue
                w = {}
                for mode in ("cold", "warm"):
                    if mode == "cold":
                        drop_caches()
                    w[mode] = run_workload(kind, readers, peer.root, listing, args.deadline)
                entry["workloads"][label(kind, readers)] = w
                print(f"{name:16} {label(kind, readers):8} "
                      + "  ".join(f"{m}: {fmt_rate(w[m])}" for m in w), flush=True)
            pid = daemon_pid(peer.mnt) if name not in ("native", "tmpfs", "kernel-squashfs") else None
            if pid:
                entry["memory_kb"] = memory_kb(pid)
        except Exception as e:  # a peer that fails is reported, the others still run
            entry["error"] = str(e)
            print(f"{name}: ERROR: {e}", flush=True)
        finally:
            peer.stop()
        if name == "packfs":
            time.sleep(0.5)
            entry["backing_ops"] = packfs_counters(os.path.join(args.work, "packfs.log"))
        results["peers"][name] = entry
    if not have_torch:
        results["loader"] = "torch/torchvision not installed: DataLoader epochs skipped"
    stamp = time.strftime("%Y%m%dT%H%M%S")
    path = os.path.join(args.out, f"{args.dataset}-{stamp}.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print_table(results)
    chart(results, os.path.join(args.out, f"{args.dataset}.png"))
    print(f"\nJSON: {path}\nchart: {os.path.join(args.out, args.dataset + '.png')}")


def fmt_rate(r):
    if "error" in r:
        return "error: " + r["error"][:40]
    s = f"{r['files_per_s']:9.0f} files/s"
    if r.get("mb_per_s"):
        s += f" {r['mb_per_s']:7.1f} MB/s"
    return s + ("" if r["complete"] else " (deadline)")


def seconds_per_file(r):
    if not r or "error" in r or not r.get("files"):
        return None
    return r["seconds"] / r["files"]


def print_table(results):
    peers = {k: v for k, v in results["peers"].items() if "workloads" in v}
    base = peers.get("packfs", {}).get("workloads", {})
    names = list(peers)
    print(f"\n{results['dataset']}: {results['meta']['files']} files, "
          f"{results['meta']['bytes'] / 1e6:.0f} MB; files/s, and (peer time / packfs time)")
    print(f"{'workload':14}" + "".join(f"{n:>24}" for n in names))
    for wl in (base or next(iter(peers.values()))["workloads"]):
        for mode in ("cold", "warm"):
            row = f"{wl + ' ' + mode:14}"
            for n in names:
                r = peers[n]["workloads"].get(wl, {}).get(mode)
                mine, theirs = seconds_per_file(base.get(wl, {}).get(mode)), seconds_per_file(r)
                if theirs is None:
                    row += f"{'-':>24}"
                    continue
                ratio = f"({theirs / mine:.2f}x)" if mine else ""
                mark = "" if r["complete"] else "*"
                row += f"{1 / theirs:>14.0f}{mark:1}{ratio:>9}"
            print(row)
    print("* = stopped at the deadline; rate over the part done")
    for n, v in results["peers"].items():
        if "missing" in v:
            print(f"{n}: missing ({v['missing']})")
            continue
        extra = [f"mount {v.get('mount_s', '-')} s"]
        if "index_build_s" in v:
            extra.append(f"index build {v['index_build_s']:.2f} s")
        if "memory_kb" in v:
            extra.append(f"peak RSS {v['memory_kb'].get('VmHWM', 0) / 1024:.1f} MB")
        if v.get("backing_ops"):
            extra.append("backing files: " + ", ".join(f"{k} {x}" for k, x in v["backing_ops"].items()))
        print(f"{n}: " + "; ".join(extra))


def print_markdown(results):
    """The results as Markdown tables for docs/benchmarks.md."""
    peers = {k: v for k, v in results["peers"].items() if "workloads" in v}
    base = peers.get("packfs", {}).get("workloads", {})
    names = list(peers)
    print("| workload | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for wl in base:
        for mode in ("cold", "warm"):
            cells = []
            mine = seconds_per_file(base.get(wl, {}).get(mode))
            for n in names:
                r = peers[n]["workloads"].get(wl, {}).get(mode)
                theirs = seconds_per_file(r)
                if theirs is None:
                    cells.append("-")
                    continue
                mark = "" if r["complete"] else "\\*"
                ratio = "" if n == "packfs" else f" ({theirs / mine:.2f}x)"
                cells.append(f"{1 / theirs:,.0f}{mark}{ratio}")
            print(f"| {wl} {mode} | " + " | ".join(cells) + " |")
    print()
    print("| peer | launch to first stat | peak RSS | notes |")
    print("|---|---:|---:|---|")
    for n, v in results["peers"].items():
        if "missing" in v:
            print(f"| {n} | - | - | missing: {v['missing']} |")
            continue
        rss = v.get("memory_kb", {}).get("VmHWM")
        notes = []
        if "index_build_s" in v:
            how = "first mount" if n == "ratarmount" else "packfs index, once"
            notes.append(f"index build {v['index_build_s']:.2f} s ({how})")
        if v.get("backing_ops"):
            notes.append("backing files: " + ", ".join(f"{k} {x:,}" for k, x in v["backing_ops"].items()))
        if "error" in v:
            notes.append("error: " + v["error"])
        print(f"| {n} | {v.get('mount_s', 0):.3f} s | {f'{rss / 1024:.1f} MB' if rss else '-'} | {'; '.join(notes)} |")


def pyplot():
    """matplotlib's pyplot drawing to files, or None (with a message) when it is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no chart")
        return None
    return plt


def chart(results, path):
    plt = pyplot()
    if plt is None:
        return
    peers = {k: v for k, v in results["peers"].items() if "workloads" in v}
    workloads = [w for w in next(iter(peers.values()))["workloads"]]
    fig, axes = plt.subplots(1, 2, figsize=(14, 0.5 + 0.45 * len(workloads) * len(peers) / 3), sharey=True)
    for ax, mode in zip(axes, ("cold", "warm")):
        height = 0.8 / len(peers)
        for i, (name, v) in enumerate(peers.items()):
            ys, xs = [], []
            for j, wl in enumerate(workloads):
                s = seconds_per_file(v["workloads"].get(wl, {}).get(mode))
                if s:
                    ys.append(j + i * height)
                    xs.append(1 / s)
            ax.barh(ys, xs, height=height, label=name)
        ax.set_xscale("log")
        ax.set_title(f"{results['dataset']} ({mode}): files/s, log scale")
        ax.set_yticks([j + 0.4 - height / 2 for j in range(len(workloads))])
        ax.set_yticklabels(workloads)
        ax.invert_yaxis()
        ax.grid(axis="x", which="both", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(peers), fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
