"""packfs.Hints and packfs.torch's samplers telling a real mount what comes next: the order
goes to the mount's socket and the daemon counts it (its status), paths not on the mount are
named back, and a sampler over data that is not on a packfs mount iterates as before."""

import os
import subprocess
import time
import warnings

import pytest

import packfs


@pytest.fixture
def shard(tmp_path):
    src = tmp_path / "src"
    paths = []
    for cls in range(3):
        (src / f"c{cls}").mkdir(parents=True)
        for i in range(10):
            rel = f"c{cls}/{i:02d}.bin"
            (src / rel).write_bytes(os.urandom(2000 + 300 * i))
            paths.append(rel)
    tar = tmp_path / "d.tar"
    subprocess.run(["tar", "-cf", tar, "-C", src, "c0", "c1", "c2"], check=True)
    return src, tar, paths


def lookahead(mount, wanted):
    """The mount's hint counters once they satisfy ``wanted`` (rewritten every second)."""
    deadline = time.monotonic() + 10
    while True:
        counters = mount.status()["counters"].get("lookahead") or {}
        if wanted(counters) or time.monotonic() > deadline:
            return counters
        time.sleep(0.2)


def test_hints_reach_the_mount_and_unknown_paths_are_named(shard):
    src, tar, paths = shard
    with packfs.mount(tar) as m:
        assert packfs.mount_point_of(m.path / "c1") == m.path
        assert packfs.mount_point_of(src) is None
        hints = packfs.Hints(m.path / "c0", stream="train")
        order = [m.path / p for p in reversed(paths)] + ["c9/none.bin"]
        answer = hints.send(order, rank=2, epoch=5)
        assert answer["samples"] == 30 and answer["unknown"] == 1
        assert answer["first_unknown"] == "c9/none.bin"
        for p in reversed(paths):
            assert (m.path / p).read_bytes() == (src / p).read_bytes()
        got = lookahead(m, lambda c: c.get("first_reads") == 30)
        assert got["lists"] == 1 and got["epoch"] == 5 and got["first_reads"] == 30
        hints.end(rank=2)
        assert lookahead(m, lambda c: c["active_lists"] == 0)["active_lists"] == 0
        hints.close()


def test_hints_refuse_a_path_that_is_not_on_a_packfs_mount(tmp_path):
    with pytest.raises(packfs.MountError, match="not on a packfs mount"):
        packfs.Hints(tmp_path)


torch = pytest.importorskip("torch")


def test_a_hinted_sampler_iterates_as_the_wrapped_one_and_tells_the_mount(shard):
    from packfs.torch import HintedSampler

    src, tar, paths = shard
    with packfs.mount(tar) as m:
        files = [str(m.path / p) for p in paths]
        wrapped = torch.utils.data.RandomSampler(files, generator=torch.Generator().manual_seed(3))
        plain = list(torch.utils.data.RandomSampler(files, generator=torch.Generator().manual_seed(3)))
        sampler = HintedSampler(wrapped, paths=files, stream="val")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            order = list(sampler)
        assert order == plain and len(sampler) == 30
        for i in order:
            assert open(files[i], "rb").read() == (src / paths[i]).read_bytes()
        got = lookahead(m, lambda c: c.get("first_reads") == 30)
        assert got["samples"] == 30 and got["unknown_paths"] == 0 and got["first_reads"] == 30
        # A second epoch is a second list, which replaces the first.
        list(sampler)
        got = lookahead(m, lambda c: c.get("lists") == 2)
        assert got["lists"] == 2 and got["active_lists"] == 1


def test_a_hinted_sampler_over_files_not_on_a_mount_only_iterates(shard):
    from packfs.torch import HintedSampler

    src, _, paths = shard
    files = [str(src / p) for p in paths]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sampler = HintedSampler(torch.utils.data.SequentialSampler(files), paths=files)
        assert list(sampler) == list(range(30))


def test_the_shard_ordered_sampler_sends_its_order(shard):
    from packfs.torch import ShardOrderedSampler

    _, tar, paths = shard
    with packfs.mount(tar) as m:
        files = [str(m.path / p) for p in paths]
        sampler = ShardOrderedSampler(files, m, num_replicas=2, rank=1, run_length=4)
        order = list(sampler)
        got = lookahead(m, lambda c: c.get("lists") == 1)
        assert got["samples"] == len(order) == 15
        off = ShardOrderedSampler(files, m, num_replicas=2, rank=1, hints=False)
        list(off)
        time.sleep(1.5)
        assert lookahead(m, lambda c: True)["lists"] == 1
