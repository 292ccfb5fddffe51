"""Samplers and a loader for PyTorch that know where a mount's bytes are (docs/training.md).

- ``ShareSampler``: a drop-in for ``DistributedSampler`` with *partial local shuffling*: every rank
  reads a fraction ``1 - q`` of its samples from the images its node staged with
  ``--stage-share K/N``, and a fresh random ``q`` from the other nodes' shares each epoch.
- ``ShardOrderedSampler``: for cold epochs without staging: images in random order, each read in
  runs of consecutive members, so the parallel file system sees long sequential reads.
- ``HintedSampler``: wraps any sampler (``DistributedSampler``, ``RandomSampler``) and tells the
  mount each epoch's order, so it fetches the samples ahead of the workers (docs/training.md,
  "Hints"). ``ShareSampler`` and ``ShardOrderedSampler`` do that themselves (``hints=True``).
- ``pil_loader``: torchvision's default loader without Python's per-open ``isatty`` round trip.

Both samplers take any map-style dataset whose items are files of the mount: torchvision's
ImageFolder or DatasetFolder (``.samples``), or a sequence of paths. Only this module imports torch.
"""

from __future__ import annotations

import io
import itertools
import math
import os
import warnings

import torch
import torch.distributed as dist
from torch.utils.data import Sampler

from typing import Any, Dict, Iterator, Optional, Union

from . import Catalog, Engine, Hints, Mount, MountError, PathLike, mount_point_of, open_bytes

__all__ = ["HintedSampler", "ShareSampler", "ShardOrderedSampler", "pil_loader"]


def pil_loader(path: PathLike):
    """An RGB ``PIL.Image`` of the file at ``path``, as torchvision's default loader returns,
    read with one ``read`` and no ``isatty`` question (3x the files/s of ``open(path, "rb")``
    on a warm packfs mount: docs/training.md). Pass it as ``ImageFolder(root, loader=pil_loader)``."""
    from PIL import Image

    with Image.open(io.BytesIO(open_bytes(path))) as image:
        return image.convert("RGB")


def _warn_if_one_class(dataset, samples):
    """``ImageFolder(m.path)`` where ``ImageFolder(m.path / "train")`` was meant finds one class,
    ``train``, and trains on it without a word: said here, where the dataset is first seen."""
    classes = getattr(dataset, "classes", None)
    root = getattr(dataset, "root", None)
    if not classes or len(classes) != 1 or root is None or not samples:
        return
    only = os.path.join(os.fspath(root), classes[0])
    first = [s[0] if isinstance(s, (tuple, list)) else s for s in samples[:1000]]
    if all(os.path.dirname(os.fspath(p)) != only for p in first):
        warnings.warn(
            f"the dataset at {root} has one class, {classes[0]!r}, and its samples are in "
            f"subdirectories of it: the classes are one level down, e.g. ImageFolder({only!r})",
            stacklevel=3,
        )


def _paths(dataset):
    """The file behind each index of ``dataset``."""
    samples = getattr(dataset, "samples", None)
    if samples is None:
        samples = getattr(dataset, "imgs", None)
    if samples is not None:
        _warn_if_one_class(dataset, samples)
        return [s[0] if isinstance(s, (tuple, list)) else s for s in samples]
    if isinstance(dataset, (list, tuple)) and all(
        isinstance(p, (str, bytes, os.PathLike)) for p in dataset
    ):
        return list(dataset)
    raise TypeError(
        "the sampler needs to know each sample's file: give a torchvision ImageFolder or "
        "DatasetFolder (it has .samples) or a list of paths on the mount"
    )


def _locate(paths, catalog, root):
    """Per dataset index, the catalog's File for its path; a path that is not a file of the
    catalog is an error naming it (the sampler would otherwise place it on no node)."""
    by_path = {os.fsdecode(f.path): f for f in catalog.files}
    prefix = os.fsdecode(os.path.abspath(root)).rstrip("/") + "/" if root is not None else None
    located = []
    for path in paths:
        text = os.fsdecode(path)
        if prefix is not None and text.startswith(prefix):
            text = text[len(prefix) :]
        elif os.path.isabs(text):
            raise ValueError(
                f"{text} is not under the mount's root {root}: the sampler places only files of "
                "the mount (give root=, the mountpoint, or the Mount itself)"
            )
        found = by_path.get(text.lstrip("/"))
        if found is None:
            raise ValueError(
                f"{text} is not a file of the catalog: build the dataset over the same mount "
                "(or index) the catalog was made from"
            )
        located.append(found)
    return located


def _world(num_replicas, rank):
    """DistributedSampler's defaults: the process group's size and rank; without a process
    group, the launcher's (torchrun's RANK and WORLD_SIZE), else one process (rank 0 of 1), as
    a script run on its own is."""
    if num_replicas is None or rank is None:
        if not (dist.is_available() and dist.is_initialized()):
            world, mine = os.environ.get("WORLD_SIZE", ""), os.environ.get("RANK", "")
            if world.isdigit() and int(world) > 1 and not mine.isdigit():
                raise RuntimeError(
                    f"WORLD_SIZE is {world} but neither torch.distributed nor RANK says which "
                    "rank this is: call torch.distributed.init_process_group() first, or give "
                    "num_replicas and rank"
                )
            launched = world.isdigit() and mine.isdigit()
            if num_replicas is None:
                num_replicas = int(world) if launched else 1
            if rank is None:
                rank = int(mine) if launched else 0
        num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
        rank = dist.get_rank() if rank is None else rank
    if not 0 <= rank < num_replicas:
        raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
    return num_replicas, rank


def _ranks_per_node(given, num_replicas):
    """Ranks sharing one node (and so one stage share): the argument, else torchrun's
    LOCAL_WORLD_SIZE, else Slurm's SLURM_NTASKS_PER_NODE, else 1 (and 1 for a lone process,
    whatever the job around it says)."""
    if given is None and num_replicas == 1:
        given = 1
    if given is None:
        for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
            value = os.environ.get(name, "").split("(")[0]
            if value.isdigit() and int(value) > 0:
                given = int(value)
                break
        else:
            given = 1
    if given < 1 or num_replicas % given:
        raise ValueError(
            f"ranks_per_node={given} does not divide the {num_replicas} ranks: every node must "
            "run the same number of ranks (ranks node*ranks_per_node ... are one node, as torchrun "
            "and Slurm's block distribution number them)"
        )
    return given


class _Hinter:
    """Sends each epoch's order of sample paths to the packfs mount they are on (``Hints``), so
    its daemon fetches them ahead of the DataLoader's workers. A dataset that is not on a packfs
    mount, or a mount that takes no hints, is said once and read as before."""

    def __init__(self, where, stream):
        self.hints = None
        if where is None:
            return
        if isinstance(where, Engine):
            # The dataset is read in this process: its engine's lookahead takes the orders.
            self.hints = where.hints(stream) if where.hint_stats() is not None else None
            return
        try:
            if mount_point_of(where) is None:
                return
            self.hints = Hints(where, stream=stream)
        except (MountError, OSError) as e:
            warnings.warn(f"packfs: no hints for this sampler: {e}", stacklevel=4)

    def send(self, paths, rank, epoch):
        if self.hints is None:
            return
        try:
            answer = self.hints.send(paths, rank=rank, epoch=epoch)
        except MountError as e:
            if getattr(e, "no_room", False):
                # The daemon had no memory for this epoch's order: read without hints, try again
                # with the next epoch's.
                warnings.warn(f"packfs: this epoch's order was not taken: {e}", stacklevel=4)
                return
            warnings.warn(f"packfs: hints stop: {e}", stacklevel=4)
            self.hints = None
            return
        if answer.get("unknown"):
            warnings.warn(
                f"packfs: {answer['unknown']} of the sampler's paths are not files of the mount at "
                f"{self.hints.mountpoint} (the first: {answer.get('first_unknown')}): those are read "
                "without hints",
                stacklevel=4,
            )


def _rank_of(sampler):
    """The rank a sampler serves: its own, else torch.distributed's, else torchrun's RANK."""
    rank = getattr(sampler, "rank", None)
    if isinstance(rank, int):
        return rank
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    value = os.environ.get("RANK", "0")
    return int(value) if value.isdigit() else 0


class HintedSampler(Sampler):
    """Wraps any sampler (``DistributedSampler``, ``RandomSampler``, your own) and tells the
    packfs mount the dataset's files are on the order of each epoch's samples when the
    DataLoader asks for it, so the mount fetches them ahead of the workers: a cold epoch in
    random order runs at the store's bandwidth instead of one round trip per sample
    (docs/training.md, "Hints"). Iterates exactly as the wrapped sampler; ``set_epoch``,
    ``state_dict`` and every other attribute are the wrapped sampler's.

    ``dataset`` gives each index's file (ImageFolder and DatasetFolder have ``.samples``), or
    ``paths`` does. ``stream`` names the list (give the training and the validation loader
    different names). A dataset read in the process (``packfs.datasets.ImageFolder``) tells its
    ``packfs.Engine`` instead of a mount. On a dataset not on packfs it only iterates."""

    def __init__(
        self,
        sampler: Any,
        dataset: Any = None,
        *,
        paths: Optional[Any] = None,
        stream: str = "default",
    ) -> None:
        self.sampler = sampler
        self._paths = list(paths) if paths is not None else _paths(dataset)
        # A dataset read through packfs.Engine (packfs.datasets) tells its engine; one on a
        # mount, the mount its files are on.
        engine = getattr(dataset, "engine", None)
        where = engine if isinstance(engine, Engine) else (self._paths[0] if self._paths else None)
        self._hinter = _Hinter(where, stream)
        self._iterations = 0

    def __iter__(self) -> Iterator[int]:
        order = [int(i) for i in self.sampler]
        epoch = getattr(self.sampler, "epoch", self._iterations)
        self._iterations += 1
        self._hinter.send([self._paths[i] for i in order], _rank_of(self.sampler), epoch)
        return iter(order)

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __getattr__(self, name):
        if name in ("sampler", "_paths", "_hinter", "_iterations"):
            raise AttributeError(name)
        return getattr(self.sampler, name)


def _catalog_and_root(catalog, root, shares):
    if isinstance(catalog, Mount):
        return Catalog(catalog, shares=shares), catalog.path if root is None else root
    if not isinstance(catalog, Catalog):
        raise TypeError("catalog must be a packfs.Catalog or a packfs.Mount")
    return catalog, root


class _EpochSampler(Sampler):
    """What both samplers share with DistributedSampler: rank and world, the per-rank count
    (padding by repetition, or dropping the tail with drop_last), set_epoch."""

    def __init__(self, total, num_replicas, rank, shuffle, seed, drop_last):
        self.num_replicas, self.rank = _world(num_replicas, rank)
        self.shuffle, self.seed, self.drop_last, self.epoch = shuffle, seed, drop_last, 0
        self.total = total
        self._sizes(self.num_replicas)
        # Indices yielded by the current iteration; what the next one skips, or yields instead,
        # after load_state_dict.
        self._yielded, self._resume = 0, None
        # Each index's path relative to the mount, and where hints go (`_hint_with`).
        self._hint_paths, self._hinter = None, None

    def _hint_with(self, located, root, hints, stream):
        """Hints for this sampler's orders, when ``hints`` and the dataset is on a mount."""
        if hints and root is not None:
            self._hint_paths = [os.fsdecode(f.path) for f in located]
            self._hinter = _Hinter(root, stream)

    def _sizes(self, num_replicas):
        if self.drop_last:
            self.num_samples = self.total // num_replicas
        else:
            self.num_samples = math.ceil(self.total / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """As DistributedSampler's: call it before each epoch so each epoch has its own order."""
        self.epoch = epoch

    def state_dict(self) -> Dict[str, Any]:
        """Where this rank is: the epoch and the indices its current iteration has yielded, with
        what fixes the order (seed, dataset size, world). ``load_state_dict`` resumes from there;
        torchdata's ``StatefulDataLoader`` calls both for a mid-epoch resume."""
        return {
            "epoch": self.epoch,
            "yielded": self._yielded,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "total": self.total,
            "num_replicas": self.num_replicas,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resumes from ``state_dict``: sets the epoch, and the next iteration yields what was left
        of it. On the same number of ranks, exactly the indices this rank had not yielded; on
        another number, see ``_resume_on``. The iteration after that is a whole epoch again."""
        for key in ("seed", "shuffle", "drop_last", "total"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"the state was saved with {key}={state[key]!r}, this sampler has "
                    f"{key}={getattr(self, key)!r}: the order it resumes would not be the one "
                    f"it left"
                )
        yielded = int(state["yielded"])
        if not 0 <= yielded <= math.ceil(self.total / int(state["num_replicas"])):
            raise ValueError(f"yielded={yielded} is not a position in an epoch")
        self.epoch = int(state["epoch"])
        if int(state["num_replicas"]) == self.num_replicas:
            self._resume = yielded
        else:
            self._resume = self._resume_on(int(state["num_replicas"]), yielded)

    def _resume_on(self, num_replicas, yielded):
        raise ValueError(
            f"{type(self).__name__} resumes mid-epoch only on the number of ranks it was saved "
            f"with ({num_replicas}, now {self.num_replicas}): its order follows the nodes' "
            f"shares. Resume on {num_replicas} ranks, or from the start of epoch "
            f"{self.epoch + 1} (set_epoch)"
        )

    def _indices_of(self, num_replicas, rank):
        """The indices rank ``rank`` of a world of ``num_replicas`` had this epoch."""
        saved = self.num_replicas, self.rank, self.num_samples, self.total_size
        try:
            self.num_replicas, self.rank = num_replicas, rank
            self._sizes(num_replicas)
            return self.indices()
        finally:
            self.num_replicas, self.rank, self.num_samples, self.total_size = saved

    def _generator(self):
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return g

    def _order(self, n, g):
        return torch.randperm(n, generator=g) if self.shuffle else torch.arange(n)

    def __iter__(self) -> Iterator[int]:
        resume, self._resume = self._resume, None
        if resume is None:
            order, self._yielded = self.indices(), 0
        elif isinstance(resume, int):
            order, self._yielded = self.indices()[resume:], resume
        else:
            order, self._yielded = resume, 0
        order = order.tolist()
        if self._hinter is not None:
            self._hinter.send([self._hint_paths[i] for i in order], self.rank, self.epoch)
        return self._counted(order)

    def _counted(self, order):
        for i in order:
            self._yielded += 1
            yield i


def _trim(cells, counts, excess):
    """Takes ``excess`` units off ``cells``: in proportion first, the rest off the largest."""
    if excess <= 0:
        return
    held = sum(counts[j][k] for j, k in cells)
    for j, k in cells:
        cut = counts[j][k] * excess // held
        counts[j][k] -= cut
        excess -= cut
    while excess > 0:
        j, k = max(cells, key=lambda c: counts[c[0]][c[1]])
        counts[j][k] -= 1
        excess -= 1


def _transfer_counts(give, need):
    """How many samples node j hands node k this epoch (an N x N list of lists), given what each
    node gives away (``give[j]``) and what each still needs (``need[k]``), with equal sums.

    Nobody receives its own samples (they would not be remote reads) unless no other way exists
    (one node, or one node giving more than all the others need). The split is as even as the
    counts allow (proportional, then scaled to the exact sums), so every node's remote reads
    come from all other shares rather than from one neighbour."""
    n = len(give)
    total = sum(give)
    if total != sum(need):
        raise ValueError(f"given {sum(give)} != needed {sum(need)}")
    g = torch.tensor(give, dtype=torch.float64)
    d = torch.tensor(need, dtype=torch.float64)
    x = torch.zeros((n, n), dtype=torch.float64)
    if total and n > 1:
        # Proportional start, then alternate scaling of rows and columns to their sums
        # (iterative proportional fitting); the zero diagonal stays zero.
        x = g[:, None] * d[None, :]
        x.fill_diagonal_(0)
        for _ in range(50):
            rows = x.sum(1)
            x *= torch.where(rows > 0, g / rows.clamp(min=1e-300), torch.zeros_like(g))[:, None]
            cols = x.sum(0)
            x *= torch.where(cols > 0, d / cols.clamp(min=1e-300), torch.zeros_like(d))[None, :]
    counts = x.floor().long().tolist()
    # Where no spread avoids the diagonal the fit overshoots some sums: trim to at most each.
    for j in range(n):
        _trim([(j, k) for k in range(n)], counts, sum(counts[j]) - give[j])
    for k in range(n):
        _trim([(j, k) for j in range(n)], counts, sum(counts[j][k] for j in range(n)) - need[k])
    short_rows = [give[j] - sum(counts[j]) for j in range(n)]
    short_cols = [need[k] - sum(counts[j][k] for j in range(n)) for k in range(n)]
    # Rounding (or an infeasible spread) leaves a few units: place them on other nodes first.
    for j in range(n):
        for k in range(n):
            if short_rows[j] == 0:
                break
            if k != j and short_cols[k] > 0:
                moved = min(short_rows[j], short_cols[k])
                counts[j][k] += moved
                short_rows[j] -= moved
                short_cols[k] -= moved
    for j in range(n):
        while short_rows[j] > 0 and short_cols[j] > 0:
            # Only j's own column is short: take a unit a->b (a, b != j) and route it a->j, j->b.
            swap = next(
                ((a, b) for a in range(n) if a != j for b in range(n) if b not in (a, j) and counts[a][b]),
                None,
            )
            if swap is None:
                counts[j][j] += 1  # no other way: j reads one of its own
            else:
                a, b = swap
                counts[a][b] -= 1
                counts[a][j] += 1
                counts[j][b] += 1
            short_rows[j] -= 1
            short_cols[j] -= 1
    return counts


class ShareSampler(_EpochSampler):
    """``DistributedSampler`` that reads where the data is: partial local shuffling over the
    shares ``--stage-share K/N`` stages (one share per node, ``N`` nodes).

    Each epoch, every node keeps a random ``1 - q`` of its per-node count from its own share and
    takes the rest from the other shares (a fresh random choice each epoch, spread over all of
    them); its ranks split the node's samples. ``q=0`` reads only the node's share (local
    shuffling), ``q=1`` only the others'. Every sample is read once per epoch across all ranks
    and every rank gets the same count, with DistributedSampler's padding or ``drop_last``.
    The other shares come from the parallel file system, or, with mounts made with ``--peers``
    (``packfs.mount(..., peers=..., peer_secret=...)``), from the nodes that staged them: then
    ``q=1``, a global shuffle, reads nothing from the file system once staging is done.

    ``catalog`` is a ``packfs.Mount`` (then ``root`` is its path), or a ``packfs.Catalog`` made
    with ``shares=N`` and ``root`` the mountpoint the dataset's paths start with. Ranks
    ``node*ranks_per_node ... (node+1)*ranks_per_node - 1`` form node ``node``, which must be
    the node mounted with ``--stage-share node/N``; ``ranks_per_node`` defaults to torchrun's
    LOCAL_WORLD_SIZE or Slurm's SLURM_NTASKS_PER_NODE.

    When shares are uneven (the image count is not a multiple of N, or images differ in size),
    a node whose share holds fewer samples than ``1 - q`` of its count reads the difference from
    other shares, and a larger share lends its surplus: counts stay equal, the local fraction
    of the smaller node drops (``local_fraction()`` tells).

    With ``hints`` (the default) each epoch's order is sent to the mount under ``root``, which
    fetches the samples ahead of the readers (``HintedSampler``); ``stream`` names the list.
    """

    def __init__(
        self,
        dataset: Any,
        catalog: Union[Mount, Catalog],
        root: Optional[PathLike] = None,
        *,
        q: float = 0.1,
        num_replicas: Optional[int] = None,
        rank: Optional[int] = None,
        ranks_per_node: Optional[int] = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        world_size: Optional[int] = None,
        hints: bool = True,
        stream: str = "default",
    ) -> None:
        paths = _paths(dataset)
        super().__init__(len(paths), num_replicas or world_size, rank, shuffle, seed, drop_last)
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q={q} is not a fraction in [0, 1]")
        self.q = q
        self.ranks_per_node = _ranks_per_node(ranks_per_node, self.num_replicas)
        self.nodes = self.num_replicas // self.ranks_per_node
        self.node = self.rank // self.ranks_per_node
        catalog, root = _catalog_and_root(catalog, root, self.nodes)
        if catalog.image_shares is None or catalog.shares != self.nodes:
            raise ValueError(
                f"the catalog was made with shares={catalog.shares}, but the job has {self.nodes} "
                f"nodes ({self.num_replicas} ranks, {self.ranks_per_node} per node): make it "
                f"with packfs.Catalog(..., shares={self.nodes})"
            )
        located = _locate(paths, catalog, root)
        self._hint_with(located, root, hints, stream)
        shares = torch.tensor([catalog.image_shares[f.image] for f in located], dtype=torch.long)
        # Samples of each share, in dataset order.
        self._local = [torch.nonzero(shares == k).flatten() for k in range(self.nodes)]
        self._per_node = self.num_samples * self.ranks_per_node

    def _keep(self):
        # One node: there are no other shares to read from.
        q = self.q if self.nodes > 1 else 0.0
        target = round((1.0 - q) * self._per_node)
        return [min(len(s), target) for s in self._local]

    def local_fraction(self) -> float:
        """The fraction of this node's samples that come from its share, every epoch (only which
        samples changes); each of its ranks is within one sample of it."""
        return self._keep()[self.node] / self._per_node if self._per_node else 1.0

    def indices(self):
        """This rank's sample indices for the current epoch (a LongTensor)."""
        g = self._generator()
        keep = self._keep()
        kept, pool, source = [], [], []
        for k, samples in enumerate(self._local):
            mine = samples[self._order(len(samples), g)]
            kept.append(mine[: keep[k]])
            pool.append(mine[keep[k] :])
            source.append(torch.full((len(mine) - keep[k],), k, dtype=torch.long))
        pool, source = torch.cat(pool), torch.cat(source)
        surplus = len(pool) - (self.nodes * self._per_node - sum(keep))
        if surplus > 0:
            # drop_last: the tail left out this epoch is a random part of the pool.
            chosen = torch.sort(self._order(len(pool), g)[: len(pool) - surplus]).values
            pool, source = pool[chosen], source[chosen]
        elif surplus < 0:
            # Padding, as DistributedSampler does: repeat samples (from the pool, else from all).
            base, base_source = (pool, source) if len(pool) else (
                torch.cat(kept),
                torch.cat([torch.full((len(s),), k, dtype=torch.long) for k, s in enumerate(kept)]),
            )
            repeat = torch.arange(-surplus) % len(base)
            pool, source = torch.cat([pool, base[repeat]]), torch.cat([source, base_source[repeat]])
        # Pool grouped by source node, each group in random order.
        grouped = torch.argsort(source, stable=True)
        pool, source = pool[grouped], source[grouped]
        give = torch.bincount(source, minlength=self.nodes).tolist()
        need = [self._per_node - k for k in keep]
        counts = _transfer_counts(give, need)
        starts = [0, *itertools.accumulate(give)]
        received = []
        for j in range(self.nodes):
            begin = starts[j] + sum(counts[j][: self.node])
            received.append(pool[begin : begin + counts[j][self.node]])
        # Dealt round-robin from local-then-remote, so each of the node's ranks gets the node's
        # local fraction give or take one sample; then each rank's own order is shuffled.
        node_samples = torch.cat([kept[self.node], *received])
        mine = node_samples[self.rank % self.ranks_per_node :: self.ranks_per_node]
        return mine[self._order(len(mine), g)]


class ShardOrderedSampler(_EpochSampler):
    """``DistributedSampler`` for cold epochs read from the parallel file system: images in a
    random order, each read in runs of ``run_length`` consecutive members (archive order), the
    runs of an image in random order, then mixed across neighbouring images by a shuffle buffer
    of ``buffer`` runs (as WebDataset shuffles shards and keeps a buffer). Each rank reads its
    own contiguous stretch of that order, so the PFS sees long sequential reads rather than one
    request per sample at a random place.

    Shards packed in path order hold one class after another: pack with ``packfs pack
    --shuffle`` so a run mixes classes. Counts, padding and ``drop_last`` are as
    DistributedSampler's; ``hints`` and ``stream`` as ``ShareSampler``'s."""

    def __init__(
        self,
        dataset: Any,
        catalog: Union[Mount, Catalog],
        root: Optional[PathLike] = None,
        *,
        run_length: int = 32,
        buffer: int = 16,
        num_replicas: Optional[int] = None,
        rank: Optional[int] = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        world_size: Optional[int] = None,
        hints: bool = True,
        stream: str = "default",
    ) -> None:
        paths = _paths(dataset)
        super().__init__(len(paths), num_replicas or world_size, rank, shuffle, seed, drop_last)
        if run_length < 1 or buffer < 1:
            raise ValueError("run_length and buffer are counts of at least 1")
        self.run_length, self.buffer = run_length, buffer
        catalog, root = _catalog_and_root(catalog, root, None)
        located = _locate(paths, catalog, root)
        self._hint_with(located, root, hints, stream)
        image = torch.tensor([f.image for f in located], dtype=torch.long)
        offset = torch.tensor([f.offset for f in located], dtype=torch.long)
        # Each image's samples in archive order: by offset, then (stable) by image.
        by_place = torch.argsort(offset, stable=True)
        by_place = by_place[torch.argsort(image[by_place], stable=True)]
        _, sizes = torch.unique_consecutive(image[by_place], return_counts=True)
        self._images = [
            list(torch.split(members, run_length))
            for members in torch.split(by_place, sizes.tolist())
        ]

    def _resume_on(self, num_replicas, yielded):
        """On another number of ranks: what the saved world's ranks had not yet read (each had
        yielded ``yielded``, as DDP's batches in step make them), in their order, split into
        this world's equal parts (padded by repetition, or cut with ``drop_last``); each sample
        left is read once across the new ranks."""
        left = torch.cat(
            [self._indices_of(num_replicas, r)[yielded:] for r in range(num_replicas)]
        )
        if len(left) == 0:
            return left
        if self.drop_last:
            per_rank = len(left) // self.num_replicas
        else:
            per_rank = math.ceil(len(left) / self.num_replicas)
            left = left[torch.arange(per_rank * self.num_replicas) % len(left)]
        return left[self.rank * per_rank : (self.rank + 1) * per_rank]

    def indices(self):
        """This rank's sample indices for the current epoch (a LongTensor)."""
        g = self._generator()
        runs = []
        for i in self._order(len(self._images), g).tolist():
            image_runs = self._images[i]
            runs += [image_runs[r] for r in self._order(len(image_runs), g).tolist()]
        if not runs:
            return torch.zeros(0, dtype=torch.long)
        stream = torch.cat(runs)
        run_id = torch.repeat_interleave(
            torch.arange(len(runs)), torch.tensor([len(r) for r in runs])
        )
        if self.total_size > len(stream):
            repeat = torch.arange(self.total_size) % len(stream)
            stream, run_id = stream[repeat], run_id[repeat] + len(runs) * (
                torch.arange(self.total_size) // len(stream)
            )
        mine = slice(self.rank * self.num_samples, (self.rank + 1) * self.num_samples)
        stream, run_id = stream[mine], run_id[mine]
        if not self.shuffle:
            return stream
        # Back into runs (a run cut by the rank boundary stays cut), then the shuffle buffer.
        cuts = torch.nonzero(run_id[1:] != run_id[:-1]).flatten() + 1
        pieces = torch.tensor_split(stream, cuts)
        out, held = [], []
        for piece in pieces:
            held.append(piece)
            if len(held) == self.buffer:
                out.append(held.pop(int(torch.randint(len(held), (1,), generator=g))))
        while held:
            out.append(held.pop(int(torch.randint(len(held), (1,), generator=g))))
        return torch.cat(out)
