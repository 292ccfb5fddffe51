"""packfs.torch over real mounts: the loader gives torchvision's images, the share sampler's local
reads are the ones --stage-share staged (the binary's rule, not a copy of it), and a 2-process
gloo DDP run over two staged mounts trains through whole epochs with equal counts."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
Image = pytest.importorskip("PIL.Image")

import packfs  # noqa: E402
from packfs.torch import ShareSampler, pil_loader  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Four classes of 16x16 images (JPEG, PNG, one greyscale, one palette) dealt over four tar
    shards written by GNU tar."""
    base = tmp_path_factory.mktemp("images")
    src = base / "src"
    rng = torch.Generator().manual_seed(5)
    names = []
    for c in range(4):
        (src / f"class{c}").mkdir(parents=True)
        for i in range(12):
            pixels = (torch.rand((16, 16, 3), generator=rng) * 64 + 60 * c).to(torch.uint8).numpy()
            image = Image.fromarray(pixels)
            if i == 0:
                image = image.convert("L")
            elif i == 1:
                image = image.convert("P")
            name = f"class{c}/{i:02d}." + ("png" if i % 3 == 1 else "jpg")
            image.save(src / name)
            names.append(name)
    out = []
    for k in range(4):
        shard = base / f"shard-{k}.tar"
        subprocess.run(["tar", "-cf", shard, "-C", src, *names[k::4]], check=True)
        out.append(str(shard))
    return src, out


def wait_for(what, probe, seconds=20):
    deadline = time.monotonic() + seconds
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {seconds} s for {what}")
        time.sleep(0.1)


def test_pil_loader_gives_torchvisions_images(shards):
    src, images = shards
    with packfs.mount(images) as m:
        ours = torchvision.datasets.ImageFolder(m.path, loader=pil_loader)
        theirs = torchvision.datasets.ImageFolder(src)
        assert len(ours) == len(theirs) == 48
        for (a, la), (b, lb) in zip(ours, theirs):
            assert la == lb and a.mode == b.mode == "RGB" and a.size == b.size
            assert a.tobytes() == b.tobytes()


def test_the_in_process_image_folder_is_torchvisions_over_the_mount(shards):
    """packfs.datasets.ImageFolder, no mount: the classes, class_to_idx, samples (in order) and
    images of torchvision's ImageFolder over a mount of the same shards; DataLoader workers
    (forked) give the same batches."""
    from packfs.datasets import ImageFolder

    _, images = shards
    transform = torchvision.transforms.ToTensor()
    with packfs.mount(images) as m:
        theirs = torchvision.datasets.ImageFolder(m.path, transform=transform)
        ours = ImageFolder(images, transform=transform)
        assert ours.classes == theirs.classes and ours.class_to_idx == theirs.class_to_idx
        assert ours.samples == [(os.path.relpath(p, m.path), t) for p, t in theirs.samples]
        assert ours.targets == theirs.targets and len(ours) == 48
        for i in range(len(ours)):
            (a, la), (b, lb) = ours[i], theirs[i]
            assert la == lb and torch.equal(a, b)
        batches = [
            [x for x in torch.utils.data.DataLoader(d, batch_size=8, num_workers=2)]
            for d in (ours, theirs)
        ]
        for (xa, ya), (xb, yb) in zip(*batches):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_a_hinted_sampler_tells_the_in_process_engine_its_order(shards):
    """HintedSampler over packfs.datasets.ImageFolder: each epoch's order goes to the dataset's
    engine (no mount, no socket), and the loader reads every sample."""
    from packfs.datasets import ImageFolder
    from packfs.torch import HintedSampler

    _, images = shards
    ours = ImageFolder(images, transform=torchvision.transforms.ToTensor(), cache_size="16M")
    sampler = HintedSampler(torch.utils.data.RandomSampler(ours), ours)
    for epoch in range(2):
        seen = sum(len(y) for _, y in torch.utils.data.DataLoader(ours, batch_size=8, sampler=sampler))
        assert seen == 48
    stats = ours.engine.hint_stats()
    assert stats["lists"] == 2 and stats["samples"] == 96 and stats["unknown_paths"] == 0, stats
    assert stats["first_reads"] == 96, stats


def test_a_nodes_local_reads_are_its_staged_share(shards, tmp_path):
    _, images = shards
    for node in range(2):
        stage = tmp_path / f"stage{node}"
        with packfs.mount(images, stage=stage, stage_share=(node, 2)) as m:
            wait_for("staging", lambda: m.status()["counters"]["stage"]["status"] == "complete")
            dataset = torchvision.datasets.ImageFolder(m.path)
            sizes = [os.path.getsize(p) for p, _ in dataset.samples]

            def read(q):
                before = m.status()["counters"]["served"]
                wanted = 0
                for rank in (2 * node, 2 * node + 1):
                    sampler = ShareSampler(dataset, m, q=q, num_replicas=4, rank=rank, ranks_per_node=2)
                    for i in sampler:
                        wanted += len(packfs.open_bytes(dataset.samples[i][0]))
                        assert len(packfs.open_bytes(dataset.samples[i][0])) == sizes[i]

                def settled():
                    now = m.status()["counters"]["served"]
                    tiers = ("ram_bytes", "staged_bytes", "source_bytes", "ahead_bytes")
                    got = {k: now[k] - before[k] for k in tiers}
                    return got if sum(got.values()) >= wanted else None

                return wait_for("the counters", settled)

            local = read(0.0)
            assert local["source_bytes"] == 0, local
            assert local["staged_bytes"] > 0, local
            assert local["ahead_bytes"] == 0, "staged samples are not fetched ahead"
            remote = read(1.0)
            # The other shares come from the images: read there, or fetched ahead on the
            # sampler's hints.
            assert remote["source_bytes"] + remote["ahead_bytes"] > 0, remote
            assert remote["staged_bytes"] == 0, remote


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("q", [0.0, 0.5])
# Two nodes played on one: their mounts differ by design, which on a real node is warned of.
@pytest.mark.filterwarnings("ignore:.*is mounted on this node already")
def test_two_ranks_train_with_ddp_over_two_staged_mounts(shards, tmp_path, q):
    _, images = shards
    port = free_port()
    with packfs.mount(images, stage=tmp_path / "s0", stage_share=(0, 2)) as m0, packfs.mount(
        images, stage=tmp_path / "s1", stage_share=(1, 2)
    ) as m1:
        ranks = []
        for rank, m in enumerate((m0, m1)):
            env = dict(
                os.environ,
                RANK=str(rank),
                WORLD_SIZE="2",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                NODE_MOUNT=str(m.path),
                SHARDS=":".join(images),
                Q=str(q),
            )
            ranks.append(
                subprocess.Popen(
                    [sys.executable, os.path.join(HERE, "ddp_worker.py")],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
            )
        results = []
        for p in ranks:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err.decode()
            results.append(json.loads(out))
    assert [r["rank"] for r in results] == [0, 1]
    for epoch in range(3):
        seen = [r["epochs"][epoch]["samples"] for r in results]
        assert len(seen[0]) == len(seen[1]) == 24, "equal counts, or DDP hangs"
        assert sorted(seen[0] + seen[1]) == list(range(48))
        for r in results:
            assert r["epochs"][epoch]["loss"] > 0
    assert [r["local"] for r in results] == [1 - q, 1 - q]
    assert results[0]["epochs"][0]["samples"] != results[0]["epochs"][1]["samples"]


def test_the_one_class_mistake_is_said(shards, tmp_path):
    """ImageFolder(m.path) where m.path / "train" was meant: one class, "train", said by the
    sampler that first sees the dataset; the right root draws no warning."""
    import warnings

    from packfs.torch import ShardOrderedSampler

    src, _ = shards
    tar = tmp_path / "train.tar"
    subprocess.run(
        ["tar", "-cf", tar, "--transform", "s,^,train/,", "-C", src, "class0", "class1"],
        check=True,
    )
    with packfs.mount(tar) as m:
        wrong = torchvision.datasets.ImageFolder(m.path, loader=pil_loader)
        assert wrong.classes == ["train"]
        with pytest.warns(UserWarning, match="one class, 'train'.*one level down"):
            ShardOrderedSampler(wrong, m, num_replicas=1, rank=0)
        right = torchvision.datasets.ImageFolder(m.path / "train", loader=pil_loader)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ShardOrderedSampler(right, m, num_replicas=1, rank=0)


def test_the_guides_torchrun_block_runs_on_two_nodes(shards, tmp_path):
    """docs/training.md's torchrun script, as written but for its paths, under two torchrun
    "nodes" of 2 ranks each on this machine: one mount per node (one rank mounts, the other
    attaches), each node staging its share, nothing left mounted; stopped after its first step
    (MAX_STEPS=1) and started again, it reads exactly what was left of the epoch, then a whole
    epoch."""
    src, _ = shards
    doc = open(os.path.join(HERE, "..", "..", "docs", "training.md")).read()
    start = doc.index("```python\n# train.py, started on each node")
    block = doc[start + len("```python\n") : doc.index("```\n", start + 10)]
    images = []
    for k in range(4):
        shard = tmp_path / f"train-{k}.tar"
        names = sorted(str(p.relative_to(src)) for p in src.rglob("*.*"))[k::4]
        subprocess.run(
            ["tar", "-cf", shard, "--transform", "s,^,train/,", "-C", src, *names], check=True
        )
        images.append(str(shard))
    index = tmp_path / "train.packfs-index"
    subprocess.run(
        [packfs.binary(), "index", *images, "-o", index], check=True, capture_output=True
    )
    # Two nodes played on one machine: each its own "/dev/shm".
    scripts = []
    for node in range(2):
        (tmp_path / f"shm{node}").mkdir()
        scripts.append(tmp_path / f"train{node}.py")
        scripts[-1].write_text(
            block.replace("/gpfs/datasets/imagenet/train.packfs-index", str(index))
            .replace('"/dev/shm"', repr(str(tmp_path / f"shm{node}")))
            .replace("num_workers=8", "num_workers=1")
        )

    def run(**env):
        port = free_port()
        nodes = [
            subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                 "--nproc-per-node", "2", "--node-rank", str(node), "--master-addr",
                 "127.0.0.1", "--master-port", str(port), str(scripts[node])],
                env=dict(os.environ, SLURM_JOB_ID=f"test-node{node}", OMP_NUM_THREADS="1",
                         CHECKPOINTS=str(tmp_path / "checkpoints"), **env),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for node in range(2)
        ]
        lines = []
        for p in nodes:
            out, err = p.communicate(timeout=600)
            assert p.returncode == 0, err.decode()[-3000:]
            lines += [line for line in out.decode().splitlines() if line.startswith("node ")]
        # node N rank R epoch E: S samples, mount PATH mounted|attached
        said = [line.replace(",", "").replace(":", "").split() for line in lines]
        for epoch in {s[5] for s in said}:
            for node in ("0", "1"):
                mine = [s for s in said if s[5] == epoch and s[1] == node]
                assert len({s[9] for s in mine}) == 1, "one mount per node"
                assert sorted(s[10] for s in mine) == ["attached", "mounted"]
        paths = {s[9] for s in said}
        assert len(paths) == 2, "each node its own mount"
        for path in paths:
            assert not os.path.ismount(path)
        return {(s[3], s[5]): int(s[6]) for s in said}

    # 48 samples, 4 ranks: 12 a rank and epoch, batches of 8.
    first = run(MAX_STEPS="1")
    assert first == {(r, "0"): 8 for r in "0123"}, first
    second = run()
    assert second == {**{(r, "0"): 4 for r in "0123"}, **{(r, "1"): 12 for r in "0123"}}, second
    # Each node's staged copy went with its mount.
    for node in range(2):
        assert [p.name for p in (tmp_path / f"shm{node}").rglob("*")] == [
            f"packfs-{os.geteuid()}"], "a staged copy was left"


def _runs_readme_block(shards, tmp_path, tail):
    """README's Python block, as written but for its paths, followed by ``tail`` (lines of the
    ``with`` block), as the script of a torchrun job of two ranks on this node."""
    src, _ = shards
    readme = open(os.path.join(HERE, "..", "..", "README.md")).read()
    start = readme.index("  ```python\n  import packfs, torchvision")
    block = readme[start + len("  ```python\n") : readme.index("  ```\n", start + 10)]
    shard = tmp_path / "train.tar"
    subprocess.run(["tar", "-cf", shard, "--transform", "s,^,train/,", "-C", src, "."],
                   check=True)
    index = tmp_path / "train.packfs-index"
    subprocess.run([packfs.binary(), "index", shard, "-o", index], check=True,
                   capture_output=True)
    base = tmp_path / "shm"
    base.mkdir()
    script = tmp_path / "readme.py"
    script.write_text(
        textwrap.dedent(block)
        .replace("/gpfs/datasets/imagenet/train.packfs-index", str(index))
        .replace('"/dev/shm"', repr(str(base)))
        + textwrap.indent(textwrap.dedent(tail), "    ")
    )
    job = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(script)],
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    return job, base


def test_the_readme_block_under_torchrun_is_one_mount_one_copy_and_leaves_nothing(
        shards, tmp_path):
    """README's block as written, two torchrun ranks on one node with a NodeStage: one mount,
    one staged copy; SIGKILL of one rank (torchrun then stops the other) leaves nothing on the
    node: no mount, no staged copy, no mountpoint, no lock, users, marker or listing file."""
    job, base = _runs_readme_block(shards, tmp_path, """
        import json, os, time
        stage = m.status()["counters"]["stage"]["dir"]
        print(json.dumps({"pid": os.getpid(), "path": str(m.path), "attached": m.attached,
                          "stage": stage, "samples": len(sampler)}), flush=True)
        time.sleep(600)
    """)
    try:
        said = [json.loads(job.stdout.readline()) for _ in range(2)]
    except ValueError:
        job.kill()
        raise AssertionError(job.communicate()[1].decode()[-3000:]) from None
    path, stage = said[0]["path"], said[0]["stage"]
    assert {s["path"] for s in said} == {path}, said
    assert sorted(s["attached"] for s in said) == [False, True], said
    assert sum(s["samples"] for s in said) == 48, said
    with open("/proc/self/mounts") as mounts:
        assert sum(line.split()[1] == path for line in mounts) == 1, "one mount"
    mine = base / f"packfs-{os.geteuid()}"
    assert [p.name for p in mine.iterdir()] == [os.path.basename(stage)], "one staged copy"
    place = packfs._Place(path, packfs._runtime_dir())
    assert place.users.exists() and place.marker.exists()

    os.kill(said[1]["pid"], signal.SIGKILL)
    job.communicate(timeout=120)

    def nothing_left():
        left = [p for p in [path, stage, place.lock, place.users, place.marker]
                if os.path.lexists(p)]
        left += list(place.base.parent.glob(place.base.name + ".ls-*"))
        return not left and not os.path.ismount(path)

    wait_for("nothing left on the node", nothing_left, seconds=30)
    assert list(mine.iterdir()) == []
