#!/usr/bin/env python3
"""ImageNet as downloaded, a tar of class tars: packfs against ratarmount --recursive, and
against the same samples as flat shards.

    bench/nested.py [--dataset imagenet-5k] [--readers 1,8] [--ratarmount PATH] [--work DIR]

The dataset's tree (bench/run.py makes it) is packed as ImageNet's training set is: one GNU tar
per class (`train/<class>.tar`, its files at the top), all of them in one outer tar. Each config
then, from a cold page cache:
  packfs-nested   `packfs index --strip-inner-extension OUTER` (timed: "first"), then a mount
                  of that index (timed: "mount")
  packfs-flat     the dataset's 8 tar shards: `packfs index` (first), mount of the index
  ratarmount      `ratarmount --recursive --strip-recursive-tar-extension OUTER` (first: it
                  builds its index), unmounted and mounted again (mount: the index is reused)
and runs an ImageFolder scan and a cold epoch of every file in one shuffled order with N
readers. Each config's samples are checked against the tree (a sample of 200 files). Prints a
table with the ratio of each config's files/s to packfs-flat's, and writes JSON to bench/out.
"""
import argparse, json, os, random, shutil, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run as peers  # noqa: E402  (dataset generation, cache dropping, workloads, mount checks)

PACKFS = os.path.join(HERE, "..", "target", "release", "packfs")


def sh(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {out.stderr.strip()[-2000:]}")
    return out.stdout


def tar_of_tars(ds, work):
    """ds's tree as ImageNet ships it: work/train.tar holding train/<class>.tar (made once)."""
    outer = os.path.join(work, "train.tar")
    if os.path.exists(outer):
        return outer
    classes = os.path.join(work, "classes")
    os.makedirs(os.path.join(classes, "train"), exist_ok=True)
    train = os.path.join(ds, "tree", "train")
    for c in sorted(os.listdir(train)):
        files = sorted(os.listdir(os.path.join(train, c)))
        sh(["tar", "--format=gnu", "-cf", os.path.join(classes, "train", f"{c}.tar"),
            "-C", os.path.join(train, c), *files])
    sh(["tar", "--format=gnu", "-cf", outer + ".part", "-C", classes, "train"])
    os.rename(outer + ".part", outer)
    shutil.rmtree(classes)
    return outer


class Config:
    def __init__(self, name, ds, work, outer, ratarmount):
        self.name, self.ds, self.work, self.outer = name, ds, work, outer
        self.ratarmount = ratarmount
        self.mnt = os.path.join(work, f"mnt-{name}")

    def first(self):
        """What a first use costs: building the index (packfs) or the first mount (ratarmount)."""
        peers.drop_caches()
        t0 = time.perf_counter()
        if self.name == "packfs-nested":
            sh([PACKFS, "index", "-q", "--strip-inner-extension", "-o", self.index(), self.outer])
        elif self.name == "packfs-flat":
            shards = sorted(os.path.join(self.ds, "shards", s)
                            for s in os.listdir(os.path.join(self.ds, "shards"))
                            if s.endswith(".tar"))
            sh([PACKFS, "index", "-q", "-o", self.index(), *shards])
        else:
            index_dir = os.path.join(self.work, "ratarmount-index")
            shutil.rmtree(index_dir, ignore_errors=True)
            os.makedirs(index_dir)
            self.wait_mounted(subprocess.Popen(self.mount_cmd(), stdout=subprocess.DEVNULL,
                                               stderr=subprocess.PIPE, text=True), t0)
            first = time.perf_counter() - t0
            self.stop()
            return first
        return time.perf_counter() - t0

    def index(self):
        return os.path.join(self.work, f"{self.name}.packfs-index")

    def mount_cmd(self):
        if self.name.startswith("packfs"):
            return [PACKFS, "mount", self.index(), self.mnt]
        return [self.ratarmount, "--recursive", "--strip-recursive-tar-extension",
                "--index-folders", os.path.join(self.work, "ratarmount-index"),
                self.outer, self.mnt]

    def mount(self):
        os.makedirs(self.mnt, exist_ok=True)
        peers.drop_caches()
        t0 = time.perf_counter()
        proc = subprocess.Popen(self.mount_cmd(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        self.wait_mounted(proc, t0)
        return time.perf_counter() - t0

    def wait_mounted(self, proc, t0):
        os.makedirs(self.mnt, exist_ok=True)
        while True:
            if peers.is_mounted(self.mnt):
                try:
                    os.stat(os.path.join(self.mnt, "train"))
                    return
                except OSError:
                    pass
            if proc.poll() not in (None, 0):
                raise RuntimeError(f"{self.name} failed to mount: {proc.stderr.read().strip()}")
            if time.perf_counter() - t0 > 1800:
                raise RuntimeError(f"{self.name} did not mount within 30 min")
            time.sleep(0.005)

    def stop(self):
        if not peers.is_mounted(self.mnt):
            return
        if self.name.startswith("packfs"):
            sh([PACKFS, "umount", self.mnt])
        else:
            subprocess.run(["fusermount3", "-u", self.mnt], capture_output=True)
        for _ in range(500):
            if not peers.is_mounted(self.mnt):
                return
            time.sleep(0.01)


def check_bytes(cfg, ds, files):
    """200 of the files read through the mount equal the tree's."""
    for rel in random.Random(3).sample(files, min(200, len(files))):
        with open(os.path.join(cfg.mnt, rel), "rb") as a, \
                open(os.path.join(ds, "tree", rel), "rb") as b:
            if a.read() != b.read():
                raise RuntimeError(f"{cfg.name}: {rel} differs from the tree")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="imagenet-5k")
    ap.add_argument("--readers", default="1,8")
    ap.add_argument("--configs", default="packfs-flat,packfs-nested,ratarmount")
    ap.add_argument("--ratarmount", default=shutil.which("ratarmount") or "ratarmount")
    ap.add_argument("--work", default="/tmp/packfs-bench")
    ap.add_argument("--deadline", type=float, default=600)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("nested.py needs root: it drops the page cache")
    ds, meta = peers.ensure_dataset(args.dataset, args.work)
    work = os.path.join(args.work, f"{args.dataset}-nested")
    os.makedirs(work, exist_ok=True)
    outer = tar_of_tars(ds, work)
    listing = os.path.join(work, "order.list")
    files = peers.write_reading_order(ds, listing)
    results = {"dataset": args.dataset, "meta": meta, "configs": {}}
    for name in args.configs.split(","):
        cfg = Config(name, ds, work, outer, args.ratarmount)
        r = {"first_s": cfg.first(), "mount_s": cfg.mount()}
        try:
            check_bytes(cfg, ds, files)
            peers.drop_caches()
            r["scan"] = peers.run_workload("scan", 1, cfg.mnt, listing, args.deadline)
            for n in [int(x) for x in args.readers.split(",")]:
                peers.drop_caches()
                r[f"read-{n}"] = peers.run_workload("read", n, cfg.mnt, listing, args.deadline)
        finally:
            cfg.stop()
        results["configs"][name] = r
        print(f"{name:14} first {r['first_s']:.2f} s, mount {r['mount_s']:.3f} s, "
              + ", ".join(f"{k} {v.get('files_per_s') or 0:,.0f} files/s"
                          for k, v in r.items() if isinstance(v, dict)), flush=True)
    report(results)
    out = os.path.join(HERE, "out", f"nested-{args.dataset}-{time.strftime('%Y%m%dT%H%M%S')}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nJSON: {out}")


def report(results):
    cfgs = results["configs"]
    base = cfgs.get("packfs-flat", {})
    passes = [k for k in next(iter(cfgs.values())) if k not in ("first_s", "mount_s")]
    print(f"\n| {results['dataset']} | " + " | ".join(cfgs) + " |")
    print("|---|" + "---:|" * len(cfgs))
    print("| first use (index or first mount), s | "
          + " | ".join(f"{c['first_s']:.2f}" for c in cfgs.values()) + " |")
    print("| mount, s | " + " | ".join(f"{c['mount_s']:.3f}" for c in cfgs.values()) + " |")
    for p in passes:
        cells = []
        for c in cfgs.values():
            rate = (c.get(p) or {}).get("files_per_s")
            ref = (base.get(p) or {}).get("files_per_s")
            cells.append("-" if not rate else
                         f"{rate:,.0f}" + (f" ({rate / ref:.2f}x)" if ref and c is not base else ""))
        print(f"| {p}, files/s | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
