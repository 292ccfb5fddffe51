#!/usr/bin/env python3
"""The headline benchmark: epochs on a parallel file system, simulated or real, same data, same run.

    bench/pfs.sh [--datasets imagenet-20k,tiny-200k] [--profile typical] [--readers 8,32]
                 [--orders random,archive] [--fs pfssim|moosefs|glusterfs|cephfs]
                 [--idle SECONDS]
                 [--packfs BINARY]

With `--fs moosefs`, `glusterfs` or `cephfs` the data lives on a real file system started for
the run (bench/sharedfs.sh: servers in a network namespace, FUSE client on the host) instead of
the simulator, and the operations counted are its servers' (bench/sharedfs.py). `--idle SECONDS` also counts the
operations each packfs mount sends while nothing reads, after its passes (the image watcher's
cost). `--packfs` measures another build.

The dataset (plain tree, tar shards, squashfs image) is copied to /dev/shm and served through
bench/pfssim, a FUSE file system that answers like a busy Lustre/GPFS client (a latency per
metadata RPC, 8 of them in flight, a latency and a bandwidth per read) and counts every
operation. Each way of reading the data is then mounted on top of it, fresh for every run:

  native           the ImageFolder tree on the PFS (what users do today)
  packfs           packfs over the tar shards on the PFS, index on the PFS, nothing staged
  packfs-stage     the same with --stage /dev/shm/... (eager: every shard copied in the background)
  packfs-lazy      the same with --stage-mode lazy (the chunks reads touch)
  packfs-hints     packfs, each pass's order sent to the mount first (packfs.Hints; the
                   DataLoader through packfs.torch.HintedSampler): samples fetched ahead
  squashfuse_ll    over a squashfs image on the PFS
  kernel-squashfs  mount -o loop of the same image file on the PFS
  shm-copy         tar -x of the shards to /dev/shm first (time included), then local reads

Per run: time to first sample (launch to the first file read), an ImageFolder scan, epoch 1 and
epoch 2 of a shuffled read of every file with N readers (no decode), or one DataLoader epoch
(decode + resize) with N workers; for each, files/s, the PFS operations by kind and the bytes
read from the PFS (the simulator's counters), and the daemon's peak RSS. With `--orders
random,archive` the read epochs also run in archive order (the shards' member order, each
reader a contiguous slice: WebDataset-style epochs, the shard-ordered sampler). Per run, the PFS
bytes from mount to the end (staging included) against the dataset's bytes. Results: a table,
JSON and a chart in bench/out/. See docs/benchmarks/parallel-fs.md.
"""
import argparse, json, os, platform, shutil, subprocess, sys, tarfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run as peers  # noqa: E402  (dataset generation, cache dropping, RSS, mount checks)
import sharedfs  # noqa: E402  (a real shared file system in place of the simulator)

PACKFS = os.path.join(HERE, "..", "target", "release", "packfs")
PFSSIM = os.path.join(HERE, "..", "target", "pfssim", "release", "pfssim")
CONFIGS = ["native", "packfs", "packfs-stage", "packfs-lazy", "packfs-hints", "squashfuse_ll",
           "kernel-squashfs", "shm-copy"]
META = ("lookup", "getattr", "open", "release", "opendir", "readdir", "releasedir", "readlink",
        "statfs")


def sh(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


class Pfs:
    """pfssim over a copy of the dataset in /dev/shm, so that dropping the page cache empties
    the client's caches but not the simulated servers'."""

    def __init__(self, ds, work, profile, extra):
        name = os.path.basename(ds)
        self.backing = f"/dev/shm/pfssim-backing-{name}"
        self.mnt = os.path.join(work, "mnt", f"pfs-{name}")
        self.stats = os.path.join(work, f"pfssim-{name}.json")
        if not os.path.exists(os.path.join(self.backing, ".complete")):
            shutil.rmtree(self.backing, ignore_errors=True)
            os.makedirs(self.backing)
            print(f"copying {name} to {self.backing} (the simulated servers' storage)", flush=True)
            shutil.copytree(os.path.join(ds, "tree"), os.path.join(self.backing, "tree"))
            os.makedirs(os.path.join(self.backing, "shards"))
            for s in sorted(os.listdir(os.path.join(ds, "shards"))):
                if s.endswith(".tar"):
                    shutil.copy(os.path.join(ds, "shards", s), os.path.join(self.backing, "shards"))
            shutil.copy(os.path.join(ds, "image.sqfs"), self.backing)
            open(os.path.join(self.backing, ".complete"), "w").close()
        # The index lives on the PFS, beside the shards, and names them by their PFS paths.
        self.index = os.path.join(self.backing, f"{name}.packfs-index")
        os.makedirs(self.mnt, exist_ok=True)
        self.proc = subprocess.Popen([PFSSIM, "--profile", profile, "--stats", self.stats,
                                      "--allow-other", *extra, self.backing, self.mnt],
                                     stderr=subprocess.PIPE, text=True)
        for _ in range(500):
            if peers.is_mounted(self.mnt) and os.path.exists(self.stats):
                break
            if self.proc.poll() is not None:
                raise RuntimeError("pfssim failed: " + self.proc.stderr.read())
            time.sleep(0.01)
        if not os.path.exists(self.index):
            shards = sorted(os.path.join(self.mnt, "shards", s)
                            for s in os.listdir(os.path.join(self.mnt, "shards")))
            tmp = os.path.join(self.backing, "index.tmp")
            subprocess.run([PACKFS, "index", "-q", "-o", tmp, *shards], check=True)
            os.rename(tmp, self.index)

    def path(self, *p):
        return os.path.join(self.mnt, *p)

    def counters(self):
        time.sleep(0.25)  # the simulator rewrites its counters every 100 ms
        with open(self.stats) as f:
            return json.load(f)

    def stop(self):
        sh(["umount", self.mnt])
        self.proc.wait(timeout=60)


def ops_between(before, after):
    ops = {k: after["ops"][k] - before["ops"][k] for k in after["ops"]}
    # A real file system may say what it counts as metadata (sharedfs.py).
    meta = (after["meta"] - before["meta"] if "meta" in after else sum(ops[k] for k in META))
    return {"meta": meta, "reads": ops["read"], "bytes": after["read_bytes"] - before["read_bytes"],
            "by_kind": {k: v for k, v in ops.items() if v}}


class Config:
    """One way of reading the dataset on the PFS; `start` mounts it and returns its root."""

    def __init__(self, name, pfs, work, dsname):
        self.name, self.pfs, self.work, self.dsname = name, pfs, work, dsname
        self.mnt = os.path.join(work, "mnt", f"pfs-{name}")
        self.stage = f"/dev/shm/packfs-pfs-stage-{dsname}"
        self.copy = f"/dev/shm/packfs-pfs-copy-{dsname}"
        self.pid = None

    def missing(self):
        tool = {"squashfuse_ll": "squashfuse_ll", "kernel-squashfs": "mount"}.get(self.name)
        if tool and not shutil.which(tool):
            return f"{tool} is not installed (bench/install_peers.sh)"
        return None

    def start(self):
        n = self.name
        if n == "native":
            return self.pfs.path("tree")
        if n == "shm-copy":
            shutil.rmtree(self.copy, ignore_errors=True)
            os.makedirs(self.copy)
            # One shard after the other, as a job script would (parallel GNU tars extracting into
            # the same class directories race on creating them).
            for s in sorted(os.listdir(self.pfs.path("shards"))):
                subprocess.run(["tar", "-xf", self.pfs.path("shards", s), "-C", self.copy], check=True)
            return self.copy
        os.makedirs(self.mnt, exist_ok=True)
        if n.startswith("packfs"):
            cmd = [PACKFS, "mount", "-q", "--log-file", os.path.join(self.work, "packfs-pfs.log"),
                   self.pfs.path(os.path.basename(self.pfs.index)), self.mnt]
            if n not in ("packfs", "packfs-hints"):
                shutil.rmtree(self.stage, ignore_errors=True)
                cmd[3:3] = ["--stage", self.stage]
                if n == "packfs-lazy":
                    cmd[3:3] = ["--stage-mode", "lazy"]
            subprocess.run(cmd, check=True)
        elif n == "squashfuse_ll":
            subprocess.run(["squashfuse_ll", self.pfs.path("image.sqfs"), self.mnt], check=True)
        elif n == "kernel-squashfs":
            subprocess.run(["mount", "-t", "squashfs", "-o", "loop,ro",
                            self.pfs.path("image.sqfs"), self.mnt], check=True)
        if n != "kernel-squashfs":
            self.pid = peers.daemon_pid(self.mnt)
        return self.mnt

    def wait_staged(self):
        """Eager staging: waits until every shard is staged (epoch 2 must not touch the PFS)."""
        if self.name != "packfs-stage":
            return None
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 1800:
            out = sh([PACKFS, "status", "--json", self.mnt])
            st = (json.loads(out.stdout or "[{}]")[0].get("counters") or {}).get("stage") or {}
            if st and st.get("present_bytes") == st.get("total_bytes"):
                return time.perf_counter() - t0
            time.sleep(0.2)
        raise RuntimeError("staging did not finish in 30 min")

    def stage_counters(self):
        """The stage's counters now (None without a stage): copied, from reads, lagged reads."""
        if self.name not in ("packfs-stage", "packfs-lazy"):
            return None
        out = sh([PACKFS, "status", "--json", self.mnt])
        try:
            st = json.loads(out.stdout)[0]["counters"]["stage"] or {}
        except (ValueError, KeyError, IndexError, TypeError):
            return None
        return {k: st.get(k) for k in ("present_bytes", "copied_bytes", "copied_from_reads",
                                       "lagged_reads")}

    def latencies(self):
        """packfs's own per-operation latency percentiles (its status counters)."""
        if not self.name.startswith("packfs"):
            return None
        out = sh([PACKFS, "status", "--json", self.mnt])
        try:
            reqs = json.loads(out.stdout)[0]["counters"]["requests"]
        except (ValueError, KeyError, IndexError):
            return None
        return {op: {k: v for k, v in r.items() if k in ("count", "p50_us", "p90_us", "p99_us")}
                for op, r in reqs.items() if r.get("count")}

    def stop(self):
        if self.name == "native":
            return
        if self.name == "shm-copy":
            shutil.rmtree(self.copy, ignore_errors=True)
            return
        if peers.is_mounted(self.mnt):
            sh([PACKFS, "umount", self.mnt] if self.name.startswith("packfs")
               else ["umount", self.mnt])
        for _ in range(500):
            if not peers.is_mounted(self.mnt):
                break
            time.sleep(0.01)
        shutil.rmtree(self.stage, ignore_errors=True)


def first_sample(root, rel):
    with open(os.path.join(root, rel), "rb") as f:
        return len(f.read())


def workload(kind, root, listing, readers, deadline, split="interleave", hints=False):
    r = peers.run_workload(kind, readers, root, listing, deadline, split, hints)
    if "error" in r:
        raise RuntimeError(f"{kind} failed: {r['error']}")
    return r


def cpu_times(pid):
    """(seconds the whole machine was busy, seconds it idled, seconds `pid` ran) so far."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]
    daemon = 0
    if pid:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read().rsplit(")", 1)[1].split()
            daemon = int(stat[11]) + int(stat[12])
        except OSError:
            pass
    return (sum(fields) - idle) / tick, idle / tick, daemon / tick


def one_run(cfg, pfs, job, readers, listing, first, deadline, split="interleave", idle_s=0):
    """Fresh mount, cold client: time to first sample, then the job's passes."""
    peers.drop_caches()
    out = {}
    before = pfs.counters()
    t0 = time.perf_counter()
    root = cfg.start()
    first_sample(root, first)
    out["first_sample_s"] = round(time.perf_counter() - t0, 4)
    mark = pfs.counters()
    out["setup_ops"] = ops_between(before, mark)
    passes = [("scan", "scan", 1), ("epoch1", "read", readers), ("epoch2", "read", readers)] \
        if job == "read" else [("loader", "loader", readers)]
    if job == "read" and (readers != 8 or split != "interleave"):
        passes = passes[1:]  # the scan does not depend on the readers: once per config
    for label, kind, n in passes:
        if label == "epoch2":
            waited = cfg.wait_staged()
            if waited is not None:
                out["waited_for_stage_s"] = round(waited, 2)
                mark = pfs.counters()
        cpu0 = cpu_times(cfg.pid)
        r = workload(kind, root, listing, n, deadline, split, cfg.name == "packfs-hints")
        cpu1 = cpu_times(cfg.pid)
        busy, idle, daemon = (b - a for a, b in zip(cpu0, cpu1))
        # Whether the pass was CPU-bound on this machine, and what packfs itself took.
        r["cpu"] = {"idle_pct": round(100 * idle / max(busy + idle, 1e-9), 1),
                    "daemon_cpu_s": round(daemon, 2)}
        after = pfs.counters()
        r["pfs"] = ops_between(mark, after)
        mark = after
        if label == "epoch1" and (st := cfg.stage_counters()):
            r["stage"] = st
            print(f"  {cfg.name:16} after epoch1: stage {st}", flush=True)
        out[label] = r
        print(f"  {cfg.name:16} {job}-{readers:<3} {label:7} {r['files_per_s']:9.0f} files/s  "
              f"PFS: {r['pfs']['meta']:7} metadata ops, {r['pfs']['reads']:7} reads, "
              f"{r['pfs']['bytes'] / 1e6:8.1f} MB  CPU idle {r['cpu']['idle_pct']:4.1f}%, "
              f"daemon {r['cpu']['daemon_cpu_s']:.2f} s", flush=True)
    # Everything the PFS served from mount to here: setup, epochs and the staging copy.
    out["total_pfs"] = ops_between(before, pfs.counters())
    if idle_s and cfg.name.startswith("packfs"):
        # The watcher checks each shard read since its last check first (one a second).
        time.sleep(min(idle_s, 20))
        mark = pfs.counters()
        time.sleep(idle_s)
        out["idle"] = {"seconds": idle_s, "pfs": ops_between(mark, pfs.counters())}
        print(f"  {cfg.name:16} idle {idle_s:.0f} s: {out['idle']['pfs']['meta']} metadata ops",
              flush=True)
    out["latency_us"] = cfg.latencies()
    if cfg.pid:
        out["memory_kb"] = peers.memory_kb(cfg.pid)
    cfg.stop()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", default="imagenet-20k,tiny-200k")
    ap.add_argument("--profile", default="typical", help="pfssim profile: none, fast, typical, loaded")
    ap.add_argument("--sim-args", default="", help="more pfssim options, e.g. '--meta-us 1000'")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--readers", default="8,32")
    ap.add_argument("--orders", default="random",
                    help="read epochs in a shuffled order, in archive order (contiguous slices), or both")
    ap.add_argument("--workers", default="2,8", help="DataLoader workers ('' to skip)")
    ap.add_argument("--deadline", type=float, default=600, help="seconds per pass at most")
    ap.add_argument("--work", default="/tmp/packfs-bench")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--chart", metavar="JSON", help="only redraw the table and chart of a saved run")
    ap.add_argument("--fs", default="pfssim", choices=("pfssim", "moosefs", "glusterfs", "cephfs"),
                    help="the storage: the simulator, or a real file system started for the run")
    ap.add_argument("--idle", type=float, default=0,
                    help="seconds to count each packfs mount's operations while idle")
    ap.add_argument("--packfs", default=PACKFS, help="the packfs binary to measure")
    ap.add_argument("--keep-fs", action="store_true",
                    help="leave the real file system up with the dataset, for the next run")
    args = ap.parse_args()
    # packfs-hints's workloads import this tree's packfs package, which drives the binary measured.
    os.environ["PACKFS_BIN"] = os.path.abspath(args.packfs)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(HERE, "..", "python")] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    globals()["PACKFS"] = os.path.abspath(args.packfs)
    if args.chart:
        with open(args.chart) as f:
            saved = json.load(f)
        report(saved)
        chart(saved, os.path.splitext(args.chart)[0] + ".png")
        return
    if os.geteuid() != 0:
        sys.exit("pfs.py needs root: it drops the page cache and mounts a loop device")
    os.makedirs(args.out, exist_ok=True)
    orders = args.orders.split(",")
    jobs = [("read", int(n), order) for order in orders for n in args.readers.split(",") if n]
    if peers.torch_available():
        jobs += [("loader", int(n), "random") for n in args.workers.split(",") if n]
    else:
        print("torch/torchvision missing (WITH_TORCH=1 bench/install_peers.sh): no DataLoader runs")
    results = {"profile": args.profile if args.fs == "pfssim" else args.fs,
               "sim_args": args.sim_args if args.fs == "pfssim" else "", "fs": args.fs,
               "machine": {"cpus": os.cpu_count(), "kernel": platform.release()}, "datasets": {}}
    stamp = time.strftime("%Y%m%dT%H%M%S")
    label = results["profile"]
    path = os.path.join(args.out, f"pfs-{label}-{stamp}.json")
    for dsname in args.datasets.split(","):
        ds, meta = peers.ensure_dataset(dsname, args.work)
        pfs = (Pfs(ds, args.work, args.profile, args.sim_args.split()) if args.fs == "pfssim"
               else sharedfs.SharedFs(args.fs, ds, args.work, PACKFS, keep=args.keep_fs))
        listing = os.path.join(args.work, f"{dsname}.pfs.list")
        files = peers.write_reading_order(ds, listing)
        archive_listing = os.path.join(args.work, f"{dsname}.pfs.archive.list")
        write_archive_order(ds, archive_listing)
        entry = {"meta": meta, "shards": len(os.listdir(pfs.path("shards"))), "configs": {},
                 "bytes": sum(os.path.getsize(pfs.path("shards", s))
                              for s in os.listdir(pfs.path("shards")))}
        try:
            for name in args.configs.split(","):
                cfg = Config(name, pfs, args.work, dsname)
                why = cfg.missing()
                if why:
                    entry["configs"][name] = {"missing": why}
                    print(f"{name}: MISSING: {why}")
                    continue
                runs = {}
                for job, n, order in jobs:
                    key = f"{job}-{n}" + ("-archive" if order == "archive" else "")
                    try:
                        runs[key] = one_run(cfg, pfs, job, n,
                                            archive_listing if order == "archive" else listing,
                                            files[0], args.deadline,
                                            "contiguous" if order == "archive" else "interleave",
                                            # Idle once per config, after its first run.
                                            args.idle if not runs else 0)
                    except Exception as e:  # a config that fails is reported; the rest still run
                        cfg.stop()
                        runs[key] = {"error": str(e)}
                        print(f"  {name} {key}: ERROR: {e}", flush=True)
                entry["configs"][name] = runs
        finally:
            pfs.stop()
        results["datasets"][dsname] = entry
        with open(path, "w") as f:  # after each dataset: a long run interrupted keeps what it did
            json.dump(results, f, indent=1)
    report(results)
    chart(results, os.path.join(args.out, f"pfs-{label}.png"))
    print(f"\nJSON: {path}\nchart: {os.path.join(args.out, f'pfs-{label}.png')}")


def write_archive_order(ds, listing):
    """Every regular file in the shards' member order, shard after shard (paths relative to the
    tree: the shards hold the tree's paths)."""
    files = []
    for s in sorted(os.listdir(os.path.join(ds, "shards"))):
        if s.endswith(".tar"):
            with tarfile.open(os.path.join(ds, "shards", s)) as tar:
                files += [m.name for m in tar if m.isfile()]
    with open(listing, "w") as f:
        f.write("\n".join(files) + "\n")
    return files


def rate(run, label):
    r = (run or {}).get(label)
    return r["files"] / r["seconds"] if r and r.get("seconds") else None


def report(results):
    """Markdown tables: files/s with the ratio to native files, and PFS operations per epoch."""
    for dsname, entry in results["datasets"].items():
        cfgs = {k: v for k, v in entry["configs"].items() if "missing" not in v}
        files = entry["meta"]["files"]
        print(f"\n### {dsname}: {files:,} files, {entry['shards']} shards, profile "
              f"{results['profile']} {results.get('sim_args', '')}\n")
        jobs = sorted({j for v in cfgs.values() for j in v}, key=lambda j: (j[0] != "r", j))
        print("| run | " + " | ".join(cfgs) + " |")
        print("|---|" + "---:|" * len(cfgs))
        native = cfgs.get("native", {})
        rows = [("first sample (s)", None, None)]
        for job in jobs:
            labels = ["scan", "epoch1", "epoch2"] if job.startswith("read") else ["loader"]
            rows += [(f"{job} {lab}", job, lab) for lab in labels
                     if any(lab in (v.get(job) or {}) for v in cfgs.values())]
        for title, job, lab in rows:
            cells = []
            for name, v in cfgs.items():
                if job is None:
                    first = next((r["first_sample_s"] for r in v.values() if "first_sample_s" in r), None)
                    cells.append(f"{first:.3f}" if first is not None else "-")
                    continue
                run = v.get(job) or {}
                if "error" in run:
                    cells.append("error")
                    continue
                mine, base = rate(run, lab), rate(native.get(job), lab)
                if mine is None:
                    cells.append("-")
                    continue
                ratio = f" ({mine / base:.1f}x)" if base and name != "native" else ""
                cells.append(f"{mine:,.0f}{ratio}")
            print(f"| {title} | " + " | ".join(cells) + " |")
        print(f"\nPFS operations per pass (metadata ops / reads / MB read), "
              f"{files:,} files:\n")
        print("| run | " + " | ".join(cfgs) + " |")
        print("|---|" + "---:|" * len(cfgs))
        for title, job, lab in rows[1:]:
            cells = []
            for name, v in cfgs.items():
                r = ((v.get(job) or {}).get(lab) or {}).get("pfs")
                cells.append(f"{r['meta']:,} / {r['reads']:,} / {r['bytes'] / 1e6:,.0f}" if r else "-")
            print(f"| {title} | " + " | ".join(cells) + " |")
        if entry.get("bytes"):
            print(f"\nPFS bytes from mount to the end of the run (staging included) / dataset "
                  f"({entry['bytes'] / 1e6:,.0f} MB) and PFS reads / (dataset / 1 MiB):\n")
            print("| run | " + " | ".join(cfgs) + " |")
            print("|---|" + "---:|" * len(cfgs))
            for job in jobs:
                cells = []
                for name, v in cfgs.items():
                    t = (v.get(job) or {}).get("total_pfs")
                    cells.append(f"{t['bytes'] / entry['bytes']:.2f}x / "
                                 f"{t['reads'] / (entry['bytes'] / 2**20):.2f}" if t else "-")
                print(f"| {job} | " + " | ".join(cells) + " |")
        print("\n| config | setup PFS ops (mount + first sample) | idle metadata ops per minute "
              "| peak RSS | packfs p50/p99 read |")
        print("|---|---|---:|---:|---|")
        for name, v in cfgs.items():
            run = next((r for r in v.values() if "setup_ops" in r), {})
            s = run.get("setup_ops", {})
            rss = max((r.get("memory_kb", {}).get("VmHWM", 0) for r in v.values()), default=0)
            lat = (run.get("latency_us") or {}).get("read")
            lat = f"{lat['p50_us']:.0f} / {lat['p99_us']:.0f} µs" if lat else "-"
            idle = [r["idle"] for r in v.values() if "idle" in r]
            idle = (f"{60 * sum(i['pfs']['meta'] for i in idle) / sum(i['seconds'] for i in idle):,.1f}"
                    if idle else "-")
            print(f"| {name} | {s.get('meta', 0):,} metadata, {s.get('reads', 0):,} reads, "
                  f"{s.get('bytes', 0) / 1e6:,.1f} MB | {idle} | "
                  f"{f'{rss / 1024:.1f} MB' if rss else '-'} | {lat} |")


def chart(results, path):
    plt = peers.pyplot()
    if plt is None:
        return
    dsets = list(results["datasets"].items())
    fig, axes = plt.subplots(1, len(dsets), figsize=(7 * len(dsets), 4.5), squeeze=False)
    for ax, (dsname, entry) in zip(axes[0], dsets):
        cfgs = {k: v for k, v in entry["configs"].items() if "missing" not in v}
        bars = [(j, lab) for j in ("read-8", "read-32", "loader-2", "loader-8")
                for lab in (("epoch1", "epoch2") if j.startswith("read") else ("loader",))]
        width = 0.8 / max(len(cfgs), 1)
        for i, (name, v) in enumerate(cfgs.items()):
            xs = [k + i * width for k in range(len(bars))]
            ys = [rate(v.get(j), lab) or 0 for j, lab in bars]
            ax.bar(xs, ys, width=width, label=name)
        ax.set_yscale("log")
        ax.set_xticks([k + 0.4 - width / 2 for k in range(len(bars))])
        ax.set_xticklabels([f"{j}\n{lab}" for j, lab in bars], fontsize=8)
        where = ("simulated PFS" if results.get("fs", "pfssim") == "pfssim" else "") + f" ({results['profile']})"
        ax.set_title(f"{dsname} on{where}: files/s, log scale")
        ax.grid(axis="y", which="both", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
