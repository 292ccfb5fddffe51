#!/usr/bin/env python3
"""One benchmark workload against one mounted tree; prints one JSON line.

    workloads.py WORKLOAD ROOT [--list FILE] [--readers N] [--deadline SECONDS] [--split contiguous]

WORKLOAD is one of:
  walk     os.walk of ROOT, counting files (names only)
  stat     os.walk plus a stat of every file (what find -ls and du do)
  scan     ImageFolder construction: torchvision.datasets.ImageFolder(ROOT/train) when torchvision
           imports, else the same scan by hand (sorted class folders, sorted walk of each)
  read     every file of --list (paths relative to ROOT, in the order given), opened, read whole and
           closed, split over --readers processes (dealt in turn, or --split contiguous slices)
  With --hints the order is sent to the packfs mount first (packfs.Hints; the loader wraps its
  sampler in packfs.torch.HintedSampler), within the timed pass.
  loader   a DataLoader epoch (PIL decode, resize to 64x64) with --readers workers over the first
           5 000 files of --list; needs torch and torchvision
A pass stops at --deadline; the result then says complete=false and gives the rate so far.
"""
import argparse, json, os, sys, time
from multiprocessing import Pool

EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def walk(root, deadline, with_stat):
    files = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            if with_stat:
                os.stat(os.path.join(dirpath, name))
            files += 1
        if time.perf_counter() > deadline:
            return files, 0, False
    return files, 0, True


def scan(root, deadline):
    train = os.path.join(root, "train")
    try:
        from torchvision.datasets import ImageFolder
        return len(ImageFolder(train).samples), 0, True
    except ImportError:
        pass
    classes = sorted(e.name for e in os.scandir(train) if e.is_dir())
    samples = 0
    for c in classes:
        for _, _, names in sorted(os.walk(os.path.join(train, c), followlinks=True)):
            samples += sum(1 for n in sorted(names) if n.lower().endswith(EXTENSIONS))
        if time.perf_counter() > deadline:
            return samples, 0, False
    return samples, 0, True


def read_slice(job):
    paths, deadline = job
    files = total = 0
    for p in paths:
        with open(p, "rb") as f:
            total += len(f.read())
        files += 1
        if time.perf_counter() > deadline:
            return files, total, False
    return files, total, True


def send_hints(paths):
    """Tells the packfs mount the order the files are read in (what packfs.torch's samplers
    do); timed with the pass."""
    import packfs

    packfs.Hints(paths[0]).send(paths)


def read(paths, readers, deadline, split="interleave", hints=False):
    if hints and paths:
        if split == "contiguous":
            # Each reader walks its own slice: the list is sent as the readers' order in time,
            # one slice after another would not be it; send each slice as a rank of its own.
            n = len(paths)
            import packfs

            h = packfs.Hints(paths[0])
            for i in range(readers):
                h.send(paths[i * n // readers:(i + 1) * n // readers], rank=i)
        else:
            send_hints(paths)
    if split == "contiguous":
        # Each reader its own run of the list (a DataLoader worker given a contiguous slice, the
        # shard-ordered sampler): in archive order, each walks its part of the shards in order.
        n = len(paths)
        slices = [(paths[i * n // readers:(i + 1) * n // readers], deadline) for i in range(readers)]
    else:
        slices = [(paths[i::readers], deadline) for i in range(readers)]
    if readers == 1:
        results = [read_slice(slices[0])]
    else:
        with Pool(readers) as pool:
            results = pool.map(read_slice, slices)
    return (sum(r[0] for r in results), sum(r[1] for r in results), all(r[2] for r in results))


def loader(paths, workers, deadline, hints=False):
    from PIL import Image
    from torch.utils.data import DataLoader, Dataset, SequentialSampler
    from torchvision import transforms

    class Files(Dataset):
        def __init__(self, paths):
            self.paths = paths
            self.t = transforms.Compose([transforms.Resize((64, 64)), transforms.ToTensor()])

        def __len__(self):
            return len(self.paths)

        def __getitem__(self, i):
            with open(self.paths[i], "rb") as f:
                return self.t(Image.open(f).convert("RGB"))

    files = 0
    dataset = Files(paths[:5000])
    sampler = SequentialSampler(dataset)
    if hints:
        import packfs.torch

        sampler = packfs.torch.HintedSampler(sampler, paths=dataset.paths)
    for batch in DataLoader(dataset, batch_size=64, num_workers=workers, sampler=sampler):
        files += len(batch)
        if time.perf_counter() > deadline:
            return files, 0, False
    return files, 0, True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workload", choices=["walk", "stat", "scan", "read", "loader"])
    ap.add_argument("root")
    ap.add_argument("--list")
    ap.add_argument("--readers", type=int, default=1)
    ap.add_argument("--deadline", type=float, default=60)
    ap.add_argument("--split", choices=["interleave", "contiguous"], default="interleave",
                    help="read: the list dealt to the readers in turn, or in contiguous slices")
    ap.add_argument("--hints", action="store_true",
                    help="send the reading order to the packfs mount first (packfs.Hints)")
    args = ap.parse_args()
    paths = []
    if args.list:
        with open(args.list) as f:
            paths = [os.path.join(args.root, line.rstrip("\n")) for line in f]
    if args.workload in ("scan", "loader"):
        # Imported before the clock starts: importing torch takes seconds, the pass does not.
        try:
            import torchvision.datasets  # noqa: F401
            from torch.utils.data import DataLoader  # noqa: F401
        except ImportError:
            pass
    start = time.perf_counter()
    deadline = start + args.deadline
    if args.workload in ("walk", "stat"):
        files, nbytes, complete = walk(args.root, deadline, args.workload == "stat")
    elif args.workload == "scan":
        files, nbytes, complete = scan(args.root, deadline)
    elif args.workload == "read":
        files, nbytes, complete = read(paths, args.readers, deadline, args.split, args.hints)
    else:
        files, nbytes, complete = loader(paths, args.readers, deadline, args.hints)
    seconds = time.perf_counter() - start
    print(json.dumps({"files": files, "bytes": nbytes, "seconds": round(seconds, 4),
                      "complete": complete}))


if __name__ == "__main__":
    sys.exit(main())
