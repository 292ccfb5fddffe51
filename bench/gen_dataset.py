#!/usr/bin/env python3
"""Deterministic ImageNet-like ImageFolder datasets for the benchmarks.

    gen_dataset.py OUT --files N --classes C --profile imagenet|tiny --shards K [--seed S]

Writes, under OUT:
  tree/train/<class>/<class>_<i>.JPEG   the plain tree (real, decodable JPEGs)
  shards/train-000000.tar ...           K tar shards: samples shuffled, balanced by bytes
  image.sqfs                            one squashfs image of tree/ (mksquashfs, gzip)
  all.tar                               one tar of the whole tree (for archivemount)
  meta.json                             what was generated, and the tool versions used

File sizes are lognormal around the profile's median (~110 KB "imagenet", ~3 KB "tiny"). The
contents come from a pool of generated JPEGs; each file takes the largest pool image that fits its
target size and is padded after the end-of-image marker (decoders ignore trailing bytes), so sizes
follow the distribution and every file decodes.
"""
import argparse, heapq, io, json, math, os, random, shutil, subprocess, sys, tarfile, time

PROFILES = {
    # median bytes, lognormal sigma, pool image edge range (pixels)
    "imagenet": (110_000, 0.6, (96, 900)),
    "tiny": (3_000, 0.5, (16, 160)),
}


def jpeg_pool(rng, edge_range, count=64):
    from PIL import Image, ImageDraw, ImageFilter

    pool = []
    lo, hi = edge_range
    for k in range(count):
        # Edges spread log-uniformly so pool sizes cover the distribution.
        edge = int(lo * (hi / lo) ** (k / (count - 1)))
        w, h = edge, max(8, int(edge * rng.uniform(0.6, 1.0)))
        base = Image.linear_gradient("L").resize((w, h)).convert("RGB")
        noise = Image.effect_noise((w, h), rng.uniform(20, 90)).convert("RGB")
        img = Image.blend(base, noise, rng.uniform(0.3, 0.8))
        draw = ImageDraw.Draw(img)
        for _ in range(6):
            x0, y0 = rng.randrange(w), rng.randrange(h)
            draw.ellipse([x0, y0, x0 + w // 4, y0 + h // 4],
                         fill=tuple(rng.randrange(256) for _ in range(3)))
        img = img.filter(ImageFilter.SMOOTH)
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=rng.choice([75, 85, 90, 95]))
        pool.append(buf.getvalue())
    pool.sort(key=len)
    return pool


def sample_bytes(rng, pool, median, sigma):
    target = int(median * math.exp(rng.gauss(0, sigma)))
    # The largest pool image not above the target, padded up to it.
    fit = pool[0]
    for data in pool:
        if len(data) <= target:
            fit = data
        else:
            break
    pad = max(0, target - len(fit))
    return fit + rng.randbytes(pad)


def tool_version(cmd):
    try:
        out = subprocess.run(cmd, capture_output=True, text=True)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except (OSError, IndexError):
        return "missing"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--files", type=int, required=True)
    ap.add_argument("--classes", type=int, required=True)
    ap.add_argument("--profile", choices=PROFILES, required=True)
    ap.add_argument("--shards", type=int, required=True)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    median, sigma, edges = PROFILES[args.profile]
    rng = random.Random(args.seed)
    out = os.path.abspath(args.out)
    if os.path.exists(out):
        shutil.rmtree(out)
    tree = os.path.join(out, "tree")
    t0 = time.time()

    pool = jpeg_pool(rng, edges)
    samples = []  # (relative path, size)
    for c in range(args.classes):
        os.makedirs(os.path.join(tree, "train", f"n{c:08d}"))
    for i in range(args.files):
        cls = f"n{i % args.classes:08d}"
        rel = f"train/{cls}/{cls}_{i}.JPEG"
        data = sample_bytes(rng, pool, median, sigma)
        with open(os.path.join(tree, rel), "wb") as f:
            f.write(data)
        samples.append((rel, len(data)))
    total = sum(s for _, s in samples)
    print(f"tree: {len(samples)} files, {total / 1e6:.1f} MB in {time.time() - t0:.1f} s", flush=True)

    # Shards: a seeded shuffle, each sample to the shard with the fewest bytes so far.
    order = list(range(len(samples)))
    random.Random(args.seed + 1).shuffle(order)
    heap = [(0, k) for k in range(args.shards)]
    members = [[] for _ in range(args.shards)]
    for i in order:
        size, k = heapq.heappop(heap)
        members[k].append(samples[i][0])
        heapq.heappush(heap, (size + samples[i][1], k))
    os.makedirs(os.path.join(out, "shards"))
    for k, names in enumerate(members):
        with tarfile.open(os.path.join(out, "shards", f"train-{k:06d}.tar"), "w",
                          format=tarfile.GNU_FORMAT) as t:
            for rel in names:
                t.add(os.path.join(tree, rel), arcname=rel, recursive=False)
    print(f"shards: {args.shards} in {time.time() - t0:.1f} s", flush=True)

    subprocess.run(["tar", "-cf", os.path.join(out, "all.tar"), "-C", tree, "train"], check=True)
    if shutil.which("mksquashfs"):
        subprocess.run(["mksquashfs", tree, os.path.join(out, "image.sqfs"), "-noappend",
                        "-comp", "gzip", "-quiet", "-no-progress"], check=True,
                       stdout=subprocess.DEVNULL)
    else:
        print("mksquashfs missing: no squashfs image", file=sys.stderr)
    meta = {
        "files": len(samples), "bytes": total, "classes": args.classes, "profile": args.profile,
        "shards": args.shards, "seed": args.seed, "median_bytes": sorted(s for _, s in samples)[len(samples) // 2],
        "mksquashfs": tool_version(["mksquashfs", "-version"]),
        "generated_s": round(time.time() - t0, 1),
    }
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
