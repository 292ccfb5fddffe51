"""The engine as a guest in someone else's training process: no library's signal handler can
make it kill the process (an image truncated while a member is checked is an OSError naming
the image), and an image changed under a forked DataLoader worker fails that image's reads
only, as in the parent."""

import hashlib
import os
import subprocess
import sys
import zipfile

import pytest

import packfs

HERE = os.path.dirname(os.path.abspath(__file__))

# Each trial: a fresh copy of a zip with one large stored member (its CRC-32 checked before the
# first read serves it), an engine over it, and a thread that truncates the copy to a third a
# random moment after the read starts. faulthandler (which takes SIGBUS over and, after dumping
# the stack, lets the signal kill the process) is enabled after the first read, once packfs had
# a chance to install a handler of its own. A trial either reads every byte or gets an OSError
# naming the image; the process must never die.
TRUNCATIONS = r"""
import faulthandler, os, random, sys, threading, time
import packfs
image, member, trials, workers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
original = open(image, "rb").read()
rng = random.Random(11)

def trial(work, delay):
    with open(work, "wb") as f:
        f.write(original)
    with packfs.Engine(work, cache_size="16M") as engine:
        def cut():
            time.sleep(delay)
            os.truncate(work, len(original) // 3)
        t = threading.Thread(target=cut)
        t.start()
        try:
            data = engine.read(member)
            outcome = "read" if len(data) == 24 << 20 else "short"
        except OSError as e:
            outcome = "oserror" if work in str(e) else f"unnamed: {e}"
        t.join()
        return outcome

work = image + ".work"
with open(work, "wb") as f:
    f.write(original)
with packfs.Engine(work) as engine:
    engine.read(member)
faulthandler.enable()
outcomes = []
if workers == 0:
    for k in range(trials):
        outcomes.append(trial(work, rng.uniform(0, 0.03)))
else:
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Trials(Dataset):
        def __len__(self):
            return trials

        def __getitem__(self, k):
            return trial(f"{image}.{k}", random.Random(k).uniform(0, 0.03))

    loader = DataLoader(Trials(), batch_size=1, num_workers=workers,
                        multiprocessing_context="fork")
    outcomes = [o for batch in loader for o in batch]
print(" ".join(outcomes))
"""


@pytest.fixture(scope="module")
def big_zip(tmp_path_factory):
    """A zip (Info-ZIP, stored) with one 24 MiB member: checked through its CRC-32 in place."""
    base = tmp_path_factory.mktemp("guest")
    data = os.urandom(24 << 20)
    (base / "src").mkdir()
    (base / "src" / "big.bin").write_bytes(data)
    image = base / "big.zip"
    subprocess.run(["zip", "-0", "-q", image, "big.bin"], cwd=base / "src", check=True)
    return image


@pytest.mark.parametrize("workers", [0, 2])
def test_truncations_during_checks_never_kill_the_process(big_zip, workers):
    if workers:
        pytest.importorskip("torch")
    trials = 50
    run = subprocess.run(
        [sys.executable, "-c", TRUNCATIONS, str(big_zip), "big.bin", str(trials), str(workers)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, f"the process died ({run.returncode}): {run.stderr[-2000:]}"
    outcomes = run.stdout.split()
    assert len(outcomes) == trials, run.stdout
    assert set(outcomes) <= {"read", "oserror"}, run.stdout
    # The truncations did land during reads: some trials failed, each with an OSError naming
    # the image.
    assert outcomes.count("oserror") > 0, run.stdout
    print(f"{trials} truncations, workers={workers}: {outcomes.count('read')} read whole, "
          f"{outcomes.count('oserror')} OSErrors naming the image, 0 deaths")


@pytest.fixture
def four_shards(tmp_path):
    """Four GNU tars of 10 files each and their index; the files' SHA-256 by path, and each
    file's shard."""
    files, shard_of, shards = {}, {}, []
    for s in range(4):
        src = tmp_path / f"src{s}"
        for n in range(10):
            path = f"s{s}/f{n}.bin"
            data = os.urandom(1000 + 997 * n)
            (src / f"s{s}").mkdir(parents=True, exist_ok=True)
            (src / path).write_bytes(data)
            files[path] = hashlib.sha256(data).hexdigest()
            shard_of[path] = s
        tar = tmp_path / f"shard-{s}.tar"
        subprocess.run(["tar", "-C", src, "--format=gnu", "-cf", tar, f"s{s}"], check=True)
        shards.append(tar)
    index = tmp_path / "data.packfs-index"
    subprocess.run([os.environ["PACKFS_BIN"], "index", "-q", "-o", index, *shards], check=True)
    return shards, index, files, shard_of


class Outcomes:
    """Each file's SHA-256, or the OSError reading it gave (module level: spawned workers
    unpickle it)."""

    def __init__(self, engine, paths):
        self.engine, self.paths = engine, paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        try:
            return ("ok", hashlib.sha256(self.engine.read(self.paths[i])).hexdigest())
        except OSError as e:
            return ("error", str(e))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_touched_image_costs_a_worker_that_image_only(four_shards, context):
    """Forked workers reopen over the parent's catalog, spawned ones open the index again:
    either way the touched image (its time no longer the index's) fails its own files, and
    the other three serve every byte."""
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    shards, index, files, shard_of = four_shards
    paths = sorted(files)
    with packfs.Engine(index) as engine:
        assert engine.read(paths[0])
        # One of the four images touched after the engine opened it.
        later = os.stat(shards[2]).st_mtime + 10
        os.utime(shards[2], (later, later))
        loader = DataLoader(Outcomes(engine, paths), batch_size=None, num_workers=2,
                            multiprocessing_context=context)
        got = dict(zip(paths, loader))
    for path in paths:
        kind, value = got[path]
        if shard_of[path] == 2:
            # That image's files fail, each saying which image and why.
            assert kind == "error" and "shard-2.tar" in value and "changed" in value, (path, value)
        else:
            assert (kind, value) == ("ok", files[path]), (path, value)
    print(f"{context} workers: {sum(k == 'ok' for k, _ in got.values())} files read, "
          f"{sum(k == 'error' for k, _ in got.values())} of the touched image failed")
