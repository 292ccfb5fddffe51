"""Properties of packfs.torch's samplers over random catalogs (hypothesis): every sample once per
epoch across all ranks (up to DistributedSampler's padding or drop_last), equal counts on every
rank, fixed by (seed, epoch), new each epoch, the local fraction 1 - q on balanced shares.

The catalogs here are made in memory with arbitrary image-to-share assignments (a superset of
the binary's rule, which test_torch_mount.py checks against real staging)."""

import collections

import pytest

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402

import packfs  # noqa: E402
from packfs.torch import ShardOrderedSampler, ShareSampler  # noqa: E402
from packfs.torch import _transfer_counts as transfer_counts  # noqa: E402  (internal, tested here)


def catalog(sizes, shares, nodes):
    """A Catalog of images holding ``sizes[i]`` files each, image i in share ``shares[i]``."""
    c = object.__new__(packfs.Catalog)
    c.images = [f"shard-{i}.tar" for i in range(len(sizes))]
    c.image_sizes = [0] * len(sizes)
    c.shares = nodes
    c.image_shares = list(shares)
    c.files = []
    for image, n in enumerate(sizes):
        c.files += [packfs.File(f"img{image}/f{k}", 100, image, 512 * (k + 1)) for k in range(n)]
    return c


def run_epoch(make, world, epoch):
    per_rank = []
    for rank in range(world):
        sampler = make(rank)
        sampler.set_epoch(epoch)
        per_rank.append(list(sampler))
        assert len(per_rank[-1]) == len(sampler)
    return per_rank


def check_once(per_rank, total, world, drop_last):
    counts = {len(r) for r in per_rank}
    assert len(counts) == 1, f"ranks got different counts {counts}: DDP would hang"
    each = counts.pop()
    assert each == (total // world if drop_last else -(-total // world))
    seen = collections.Counter(i for r in per_rank for i in r)
    assert all(0 <= i < total for i in seen)
    if drop_last:
        assert max(seen.values(), default=1) == 1, "a sample twice"
        assert len(seen) == each * world
    else:
        assert len(seen) == total, "a sample was left out"
        assert sum(seen.values()) - total == each * world - total, "padding beyond the rule"


layouts = st.integers(1, 4).flatmap(
    lambda nodes: st.tuples(
        st.just(nodes),
        st.integers(1, 3),  # ranks per node
        st.lists(st.integers(0, 40), min_size=1, max_size=12),  # files per image
        st.floats(0, 1),
        st.booleans(),
        st.integers(0, 2**31),
    )
)


@settings(max_examples=150, deadline=None)
@given(layouts)
def test_share_sampler_reads_every_sample_once_with_equal_counts(layout):
    nodes, rpn, sizes, q, drop_last, seed = layout
    shares = [i % nodes for i in range(len(sizes))]
    cat = catalog(sizes, shares, nodes)
    paths = [f.path for f in cat.files]
    world = nodes * rpn

    def make(rank):
        return ShareSampler(
            paths, cat, q=q, num_replicas=world, rank=rank, ranks_per_node=rpn,
            seed=seed, drop_last=drop_last,
        )

    for epoch in (0, 1):
        check_once(run_epoch(make, world, epoch), len(paths), world, drop_last)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(2, 6),
    st.integers(1, 4),
    st.sampled_from([0.0, 0.1, 0.3, 0.5, 1.0]),
    st.integers(0, 2**31),
)
def test_on_balanced_shares_each_rank_reads_one_minus_q_locally(nodes, rpn, q, seed):
    # Two images of 240 files per node: every share the same size, no padding (480 is a
    # multiple of every rank count per node drawn here).
    sizes = [240] * (2 * nodes)
    shares = [i % nodes for i in range(len(sizes))]
    cat = catalog(sizes, shares, nodes)
    paths = [f.path for f in cat.files]
    world = nodes * rpn
    file_share = [cat.image_shares[f.image] for f in cat.files]
    samplers = [
        ShareSampler(paths, cat, q=q, num_replicas=world, rank=r, ranks_per_node=rpn, seed=seed)
        for r in range(world)
    ]
    remote_sources = collections.Counter()
    for r, s in enumerate(samplers):
        node = r // rpn
        local = sum(1 for i in s if file_share[i] == node)
        # Round-robin dealing: within one sample; padding repeats may also land at home.
        assert abs(local - s.local_fraction() * len(s)) <= 1 + (s.total_size - s.total)
        remote_sources.update(file_share[i] for i in s if file_share[i] != node)
    # The node as a whole (its ranks together) is within 1% of 1 - q.
    for node in range(nodes):
        idx = [i for r in range(node * rpn, (node + 1) * rpn) for i in samplers[r]]
        local = sum(1 for i in idx if file_share[i] == node) / len(idx)
        assert abs(local - (1 - q)) <= 0.01
    if q >= 0.3:
        # The remote reads come from every other share, not from one neighbour.
        assert len(remote_sources) == nodes


def test_uneven_shares_keep_counts_equal_and_say_the_local_fraction():
    # Five images over four nodes: share 0 holds two images, so it lends its surplus.
    sizes = [100] * 5
    cat = catalog(sizes, [i % 4 for i in range(5)], 4)
    paths = [f.path for f in cat.files]
    per_rank = run_epoch(
        lambda r: ShareSampler(paths, cat, q=0.1, num_replicas=4, rank=r, ranks_per_node=1), 4, 3
    )
    check_once(per_rank, 500, 4, False)
    fractions = [
        ShareSampler(paths, cat, q=0.1, num_replicas=4, rank=r, ranks_per_node=1).local_fraction()
        for r in range(4)
    ]
    # 125 samples per node: node 0 keeps 112 (0.9 x 125, rounded) of its 200, the others have
    # only 100 each and read the other 25 from share 0.
    assert fractions == [112 / 125, 100 / 125, 100 / 125, 100 / 125]


def test_order_is_fixed_by_seed_and_epoch_and_changes_with_the_epoch():
    cat = catalog([50] * 8, [i % 2 for i in range(8)], 2)
    paths = [f.path for f in cat.files]
    for make in (
        lambda seed: ShareSampler(paths, cat, q=0.2, num_replicas=4, rank=1, ranks_per_node=2, seed=seed),
        lambda seed: ShardOrderedSampler(paths, cat, run_length=8, num_replicas=4, rank=1, seed=seed),
    ):
        a, b = make(7), make(7)
        a.set_epoch(3)
        b.set_epoch(3)
        assert list(a) == list(b)
        b.set_epoch(4)
        assert list(a) != list(b)
        assert list(make(8)) != list(make(7))


def test_q_zero_reads_only_the_share_and_a_fresh_part_is_exchanged_each_epoch():
    cat = catalog([100] * 8, [i % 4 for i in range(8)], 4)
    paths = [f.path for f in cat.files]
    s = ShareSampler(paths, cat, q=0.0, num_replicas=4, rank=2, ranks_per_node=1)
    assert {cat.files[i].image % 4 for i in s} == {2}
    s = ShareSampler(paths, cat, q=0.25, num_replicas=4, rank=2, ranks_per_node=1)
    remote = []
    for epoch in range(2):
        s.set_epoch(epoch)
        remote.append({i for i in s if cat.files[i].image % 4 != 2})
    assert len(remote[0]) == len(remote[1]) == 50
    assert remote[0] != remote[1]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=8), st.data())
def test_transfer_counts_meet_both_sums_and_avoid_the_diagonal(give, data):
    total = sum(give)
    n = len(give)
    cuts = sorted(data.draw(st.lists(st.integers(0, total), min_size=n - 1, max_size=n - 1)))
    need = [b - a for a, b in zip([0] + cuts, cuts + [total])]
    x = transfer_counts(give, need)
    assert all(v >= 0 for row in x for v in row)
    assert [sum(row) for row in x] == give
    assert [sum(x[j][k] for j in range(n)) for k in range(n)] == need
    # Hall's condition: a node can avoid its own samples iff the others can take what it gives
    # and give what it needs.
    if all(give[k] + need[k] <= total for k in range(n)):
        assert all(x[k][k] == 0 for k in range(n)), (give, need, x)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 60), min_size=1, max_size=10),
    st.integers(1, 5),
    st.integers(1, 16),
    st.integers(1, 8),
    st.booleans(),
    st.integers(0, 2**31),
)
def test_shard_ordered_reads_every_sample_once_in_long_runs(sizes, world, run, buffer, drop_last, seed):
    cat = catalog(sizes, [0] * len(sizes), 1)
    paths = [f.path for f in cat.files]

    def make(rank):
        return ShardOrderedSampler(
            paths, cat, run_length=run, buffer=buffer, num_replicas=world, rank=rank,
            seed=seed, drop_last=drop_last,
        )

    per_rank = run_epoch(make, world, 1)
    check_once(per_rank, len(paths), world, drop_last)
    place = [(f.image, f.offset) for f in cat.files]
    for order in per_rank:
        # A jump is a step to anything but the next member of the same image. Runs are cut at
        # run_length, at an image's end and at the rank's edges (padding wraps once more).
        jumps = sum(
            1
            for a, b in zip(order, order[1:])
            if not (place[a][0] == place[b][0] and place[b][1] == place[a][1] + 512)
        )
        runs_in_images = sum(-(-n // run) for n in sizes)
        assert jumps <= min(len(order), 2 * runs_in_images + 2)
        if sizes == [max(sizes)] * len(sizes) and run > 1 and len(order) >= 4 * run:
            assert jumps <= len(order) / run + len(sizes) + 2


def test_a_sampler_refuses_what_it_cannot_place():
    cat = catalog([3], [0], 1)
    with pytest.raises(ValueError, match="not a file of the catalog"):
        ShareSampler(["img0/f0", "elsewhere"], cat, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="not under the mount's root"):
        ShareSampler(["/data/img0/f0"], cat, "/mnt", num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="shares=2"):
        ShareSampler(["img0/f0"], cat, num_replicas=2, rank=0, ranks_per_node=1)
    with pytest.raises(ValueError, match="does not divide"):
        ShareSampler(["img0/f0"], cat, num_replicas=3, rank=0, ranks_per_node=2)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("WORLD_SIZE", "2")
        env.delenv("RANK", raising=False)
        with pytest.raises(RuntimeError, match="WORLD_SIZE is 2 but neither torch.distributed"):
            ShareSampler(["img0/f0"], cat)
    with pytest.raises(TypeError, match="samples"):
        ShareSampler(object(), cat, num_replicas=1, rank=0)


def test_outside_ddp_a_sampler_is_one_process_reading_everything(monkeypatch):
    # README's snippet run as `python train.py`: no process group, no launcher (a Slurm
    # allocation's task count says nothing about this one process).
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "4")
    cat = catalog([5, 7], [0, 0], 1)
    paths = [f.path for f in cat.files]
    for sampler in (ShareSampler(paths, cat, q=0.2),
                    ShardOrderedSampler(paths, cat, run_length=2, buffer=2)):
        assert (sampler.num_replicas, sampler.rank) == (1, 0)
        assert sorted(sampler) == list(range(12))
    # Under torchrun before init_process_group: the launcher's rank and world.
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    sampler = ShareSampler(paths, cat, q=0.2)
    assert (sampler.num_replicas, sampler.rank, sampler.ranks_per_node) == (2, 1, 2)


def test_with_one_share_every_sample_is_local():
    # One node has no other share to read from: q does not apply (local_fraction said 0.90).
    cat = catalog([50, 70], [0, 0], 1)
    paths = [f.path for f in cat.files]
    s = ShareSampler(paths, cat, q=0.1, num_replicas=2, rank=0, ranks_per_node=2)
    assert s.local_fraction() == 1.0
    both = sorted(i for r in range(2) for i in ShareSampler(
        paths, cat, q=0.1, num_replicas=2, rank=r, ranks_per_node=2))
    assert both == list(range(120))


def samplers_of(kind, paths, cat, world, **kw):
    if kind == "share":
        return [ShareSampler(paths, cat, q=0.3, num_replicas=world, rank=r, ranks_per_node=1, **kw)
                for r in range(world)]
    return [ShardOrderedSampler(paths, cat, run_length=4, buffer=3, num_replicas=world, rank=r,
                                **kw) for r in range(world)]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["share", "ordered"]), st.integers(0, 40), st.integers(0, 5),
       st.booleans(), st.integers(0, 2**31))
def test_a_sampler_resumed_mid_epoch_yields_exactly_the_indices_left(kind, step, epoch, drop_last,
                                                                      seed):
    cat = catalog([30, 25, 17, 40], [0, 1, 0, 1], 2)
    paths = [f.path for f in cat.files]
    for rank, s in enumerate(samplers_of(kind, paths, cat, 2, seed=seed, drop_last=drop_last)):
        s.set_epoch(epoch)
        whole = list(s)
        it = iter(s)
        seen = [next(it) for _ in range(min(step, len(whole)))]
        state = s.state_dict()
        fresh = samplers_of(kind, paths, cat, 2, seed=seed, drop_last=drop_last)[rank]
        fresh.load_state_dict(state)
        assert fresh.epoch == epoch
        assert seen + list(fresh) == whole
        # The next iteration is a whole epoch again.
        fresh.set_epoch(epoch + 1)
        s.set_epoch(epoch + 1)
        assert list(fresh) == list(s)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(0, 30), st.integers(0, 2**31))
def test_shard_ordered_resumes_on_another_number_of_ranks(old_world, new_world, step, seed):
    cat = catalog([30, 25, 17, 40], [0, 0, 0, 0], 1)
    paths = [f.path for f in cat.files]
    old = samplers_of("ordered", paths, cat, old_world, seed=seed)
    states, read = [], []
    for s in old:
        s.set_epoch(2)
        it = iter(s)
        read += [next(it) for _ in range(min(step, len(s)))]
        states.append(s.state_dict())
    new = samplers_of("ordered", paths, cat, new_world, seed=seed)
    rest = []
    for r, s in enumerate(new):
        s.load_state_dict(states[r % old_world])
        rest.append(list(s))
    # Equal parts, and every sample not yet read is read (padding repeats only what is left).
    assert len({len(part) for part in rest}) <= 1
    left = collections.Counter(i for s in old for i in s.indices().tolist()) - collections.Counter(read)
    assert set(i for part in rest for i in part) == set(left)
    assert sum(len(part) for part in rest) - sum(left.values()) < new_world


def test_share_sampler_refuses_another_number_of_ranks_mid_epoch():
    cat = catalog([30, 25], [0, 1], 2)
    paths = [f.path for f in cat.files]
    state = samplers_of("share", paths, cat, 2)[0].state_dict()
    cat4 = catalog([30, 25, 10, 10], [0, 1, 2, 3], 4)
    other = ShareSampler([f.path for f in cat4.files], cat4, num_replicas=4, rank=0,
                         ranks_per_node=1)
    with pytest.raises(ValueError, match="total"):
        other.load_state_dict(state)
    same_total = ShareSampler(paths, catalog([30, 25], [0, 0], 1), num_replicas=1, rank=0,
                              ranks_per_node=1)
    with pytest.raises(ValueError, match="resumes mid-epoch only on the number of ranks"):
        same_total.load_state_dict(state)


@pytest.mark.parametrize("workers", [0, 2])
def test_statefuldataloader_resumes_mid_epoch(workers):
    # torchdata's StatefulDataLoader saves and loads the sampler with the loader.
    from torchdata.stateful_dataloader import StatefulDataLoader

    cat = catalog([30, 25, 17, 40], [0, 1, 0, 1], 2)
    paths = [f.path for f in cat.files]

    def loader():
        s = ShardOrderedSampler(paths, cat, run_length=4, num_replicas=2, rank=1, seed=7)
        s.set_epoch(3)
        return StatefulDataLoader(list(range(len(paths))), batch_size=4, sampler=s,
                                  num_workers=workers)

    whole = [i for batch in loader() for i in batch.tolist()]
    first = loader()
    it = iter(first)
    seen = [i for _ in range(5) for i in next(it).tolist()]
    state = first.state_dict()
    second = loader()
    second.load_state_dict(state)
    assert seen + [i for batch in second for i in batch.tolist()] == whole
