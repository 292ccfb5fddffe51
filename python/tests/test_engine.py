"""packfs.Engine: the engine in this process, without a mount. Every byte of archives written by
GNU tar (plain and gzip) against GNU tar's own extraction; ranges, reads into bytearrays, numpy
arrays and tensors; the mount's errors as OSErrors; 32 threads at once; forked and spawned
DataLoader workers; a process where /dev/fuse does not exist, as an unprivileged user."""

import errno
import hashlib
import inspect
import multiprocessing
import os
import random
import stat
import subprocess
import sys
import threading

import pytest

import packfs
from packfs.engine import _ENGINE_OPTIONS

HERE = os.path.dirname(os.path.abspath(__file__))


def _tree(root):
    """Files of many sizes (empty, one byte, a block edge, several MiB), nested directories, a
    symlink to a file and one to a directory, a name that is not ASCII."""
    rng = random.Random(7)
    sizes = [0, 1, 511, 512, 513, 4096, 65537, 1 << 20, 3 * (1 << 20) + 17]
    files = {}
    for i, size in enumerate(sizes):
        files[f"train/c{i % 3}/s{i:02}.bin"] = rng.randbytes(size)
    for i in range(40):
        files[f"train/c{i % 3}/many/{i:03}.jpg"] = rng.randbytes(rng.randrange(1, 30_000))
    files["train/ünï/name with space.txt"] = b"hello\n"
    for path, data in files.items():
        os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
        with open(os.path.join(root, path), "wb") as f:
            f.write(data)
    os.symlink("c0/s00.bin", os.path.join(root, "train", "link-to-file"))
    os.symlink("c1", os.path.join(root, "train", "link-to-dir"))
    return files


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """The tree, a GNU tar of it, its gzip, and GNU tar's extraction of the tar."""
    base = tmp_path_factory.mktemp("engine")
    src = base / "src"
    files = _tree(src)
    tar = base / "d.tar"
    subprocess.run(["tar", "-C", src, "--format=gnu", "-cf", tar, "train"], check=True)
    subprocess.run(["gzip", "-k", tar], check=True)
    out = base / "extracted"
    out.mkdir()
    subprocess.run(["tar", "-C", out, "-xf", tar], check=True)
    return {"files": files, "tar": tar, "tgz": base / "d.tar.gz", "extracted": out, "base": base}


def _walk_native(root):
    """(relative path, kind, bytes or link target) of everything below root, as os sees it."""
    seen = {}
    for top, dirs, names in os.walk(root):
        for name in dirs + names:
            path = os.path.join(top, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                seen[rel] = ("l", os.readlink(path))
            elif os.path.isdir(path):
                seen[rel] = ("d", None)
            else:
                with open(path, "rb") as f:
                    seen[rel] = ("f", f.read())
    return seen


def _walk_engine(engine, top=""):
    seen = {}
    for name, kind in engine.scandir(top):
        rel = f"{top}/{name}" if top else name
        if kind == "l":
            seen[rel] = ("l", engine.readlink(rel))
        elif kind == "d":
            seen[rel] = ("d", None)
            seen.update(_walk_engine(engine, rel))
        else:
            seen[rel] = ("f", engine.read(rel))
    return seen


@pytest.mark.parametrize("image", ["tar", "tgz"])
def test_every_byte_and_entry_is_gnu_tars_extraction(dataset, image):
    with packfs.Engine(dataset[image]) as engine:
        assert _walk_engine(engine) == _walk_native(dataset["extracted"])
        assert len(engine) == len(dataset["files"])
        st = engine.stat("train/c1/s01.bin")
        native = os.stat(dataset["extracted"] / "train/c1/s01.bin")
        assert stat.S_ISREG(st.st_mode) and st.st_size == 1
        assert stat.S_IMODE(st.st_mode) == stat.S_IMODE(native.st_mode)
        assert int(st.st_mtime) == int(native.st_mtime)
        assert stat.S_ISDIR(engine.stat("train/link-to-dir").st_mode)
        assert stat.S_ISLNK(engine.stat("train/link-to-dir", follow_symlinks=False).st_mode)
        assert engine.listdir("train/link-to-dir") == engine.listdir("train/c1")
        assert engine.read("train/link-to-file") == dataset["files"]["train/c0/s00.bin"]
        assert engine.read("/train/c0/../c1/./s01.bin") == dataset["files"]["train/c1/s01.bin"]


@pytest.mark.parametrize("image", ["tar", "tgz"])
def test_ranges_many_files_and_reads_into_buffers(dataset, image):
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    big = "train/c2/s08.bin"
    data = dataset["files"][big]
    rng = random.Random(3)
    with packfs.Engine(dataset[image]) as engine:
        for _ in range(50):
            offset = rng.randrange(0, len(data) + 10)
            size = rng.randrange(0, 300_000)
            assert engine.read(big, offset, size) == data[offset:offset + size]
        assert engine.read(big, len(data) + 5) == b""
        paths = sorted(dataset["files"])
        assert engine.read_many(paths) == [dataset["files"][p] for p in paths]

        into = bytearray(len(data) + 100)
        assert engine.readinto(big, into) == len(data)
        assert bytes(into[: len(data)]) == data
        array = np.zeros(1000, dtype=np.uint8)
        assert engine.readinto(big, array, offset=12345) == 1000
        assert array.tobytes() == data[12345:13345]
        wide = np.zeros((10, 25), dtype=np.float32)
        assert engine.readinto(big, wide, offset=7) == 1000
        assert wide.tobytes() == data[7:1007]
        tensor = torch.zeros(4096, dtype=torch.uint8)
        assert engine.readinto(big, tensor, offset=len(data) - 100) == 100
        assert tensor[:100].numpy().tobytes() == data[-100:]
        with pytest.raises(TypeError):
            engine.readinto(big, b"read-only")
        with pytest.raises(ValueError):
            engine.readinto(big, np.zeros((10, 10), dtype=np.uint8)[:, ::2])

        with engine.open(big) as f:
            f.seek(1000)
            assert f.read(10) == data[1000:1010]
            f.seek(-5, os.SEEK_END)
            assert f.read() == data[-5:]
        with engine.open("train/ünï/name with space.txt", "r") as f:
            assert f.read() == "hello\n"


def test_errors_are_oserrors_with_the_mounts_messages(dataset):
    with packfs.Engine(dataset["tar"]) as engine:
        with pytest.raises(FileNotFoundError) as e:
            engine.read("train/none")
        assert e.value.errno == errno.ENOENT and e.value.filename == "train/none"
        with pytest.raises(IsADirectoryError):
            engine.read("train/c0")
        with pytest.raises(NotADirectoryError):
            engine.listdir("train/c0/s00.bin")
        with pytest.raises(NotADirectoryError):
            engine.stat("train/c0/s00.bin/x")
        assert not engine.exists("train/none") and engine.exists("train")
        assert engine.isdir("train/c0") and not engine.isfile("train/c0")
        with pytest.raises(PermissionError):
            engine.open("train/c0/s00.bin", "wb")
    with pytest.raises(OSError) as e:
        packfs.Engine(dataset["base"] / "missing.tar")
    assert "missing.tar" in str(e.value)
    with pytest.raises(TypeError):
        packfs.Engine(dataset["tar"], allow_other=True)
    with packfs.Engine(dataset["tar"]) as engine:
        engine.sources.append("https://user:secret@example.org/x.tar")
        assert "secret" not in repr(engine) and "example.org/x.tar" in repr(engine)


def test_damaged_image_fails_reads_with_the_image_and_offset(dataset, tmp_path):
    """A member whose bytes are gone (the tar cut after the scan) fails with EIO naming the image
    and the offset, not with short or wrong bytes; the other members still read."""
    tar = tmp_path / "cut.tar"
    tar.write_bytes(dataset["tar"].read_bytes())
    with packfs.Engine(tar, cache_size=0) as engine:
        size = tar.stat().st_size
        with open(tar, "r+b") as f:
            f.truncate(size // 2)
        failed = 0
        for path in sorted(dataset["files"]):
            try:
                assert engine.read(path) == dataset["files"][path]
            except OSError as e:
                failed += 1
                assert str(tar) in str(e) and "offset" in str(e), e
        assert 0 < failed < len(dataset["files"])


def test_what_the_engine_skips_is_said_on_stderr(tmp_path):
    """Never silently less: a member GNU tar would not extract where it says (a `..` name) is
    skipped with the mount's warning, on the process's stderr; the others are served."""
    import io
    import tarfile

    tar = tmp_path / "evil.tar"
    with tarfile.open(tar, "w") as t:
        for name in ["../evil.txt", "ok.txt"]:
            info = tarfile.TarInfo(name)
            info.size = 2
            t.addfile(info, io.BytesIO(b"ok"))
    code = "import packfs, sys; e = packfs.Engine(sys.argv[1]); print(e.listdir(''))"
    done = subprocess.run([sys.executable, "-c", code, str(tar)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['ok.txt']"
    assert "skipping member" in done.stderr and "../evil.txt" in done.stderr, done.stderr


def test_every_option_is_one_of_mounts():
    mount = inspect.signature(packfs.mount).parameters
    engine = inspect.signature(packfs.Engine).parameters
    assert set(_ENGINE_OPTIONS) <= set(mount)
    assert set(_ENGINE_OPTIONS) == {n for n, p in engine.items() if p.kind is p.KEYWORD_ONLY}
    assert all(engine[n].default == mount[n].default for n in _ENGINE_OPTIONS)
    with pytest.raises(TypeError, match="allow_other"):
        packfs.Engine("x.tar", allow_other=True)


def test_thirty_two_threads_read_at_once(dataset):
    paths = sorted(dataset["files"]) * 4
    with packfs.Engine(dataset["tgz"], cache_size="8M") as engine:
        errors = []

        def reader(seed):
            rng = random.Random(seed)
            for path in rng.sample(paths, len(paths)):
                if engine.read(path) != dataset["files"][path]:
                    errors.append(path)

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []


def _digest_all(engine, paths):
    return [hashlib.sha256(engine.read(p)).hexdigest() for p in paths]


def test_a_forked_child_reopens_and_reads_while_the_parent_keeps_reading(dataset):
    """The child of a process whose threads were reading (and holding the engine's locks) reads
    every byte, with an engine of its own; the parent's stays usable."""
    paths = sorted(dataset["files"])
    want = [hashlib.sha256(dataset["files"][p]).hexdigest() for p in paths]
    with packfs.Engine(dataset["tgz"], cache_size="4M") as engine:
        stop = threading.Event()

        def busy():
            while not stop.is_set():
                _digest_all(engine, paths[:5])

        threads = [threading.Thread(target=busy) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            for _ in range(3):
                read, write = os.pipe()
                pid = os.fork()
                if pid == 0:
                    os.close(read)
                    ok = _digest_all(engine, paths) == want and not engine._engine.opened_here()
                    os.write(write, b"1" if ok else b"0")
                    os._exit(0)
                os.close(write)
                got = os.read(read, 1)
                os.close(read)
                _, status = os.waitpid(pid, 0)
                assert status == 0 and got == b"1"
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert _digest_all(engine, paths) == want and engine._engine.opened_here()


class Digests:
    """A map-style dataset of the files' SHA-256 (module level: spawned workers unpickle it)."""

    def __init__(self, engine, paths):
        self.engine, self.paths = engine, paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        return hashlib.sha256(self.engine.read(self.paths[i])).hexdigest()


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_read_every_sample(dataset, context):
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    paths = sorted(dataset["files"])
    with packfs.Engine(dataset["tar"]) as engine:
        loader = DataLoader(Digests(engine, paths), batch_size=4, num_workers=2,
                            multiprocessing_context=context)
        got = [h for batch in loader for h in batch]
    assert got == [hashlib.sha256(dataset["files"][p]).hexdigest() for p in paths]


NO_FUSE = r"""
import hashlib, json, os, sys, subprocess
import packfs
assert not os.path.exists("/dev/fuse"), "the device is there"
tar, files, binary = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
mnt = os.path.join(os.environ["HOME"], "mnt")
os.makedirs(mnt, exist_ok=True)
mount = subprocess.run([binary, "mount", tar, mnt], capture_output=True, text=True)
assert mount.returncode != 0, "a mount worked without /dev/fuse"
with packfs.Engine(tar) as engine:
    got = {p: hashlib.sha256(engine.read(p)).hexdigest() for p in files}
assert got == files, "bytes differ"
print("served", len(got), "files as uid", os.getuid(), "; mount said:", mount.stderr.strip()[-80:])
"""


@pytest.fixture
def shared_dir():
    """A directory every user may read (pytest's own are its user's only)."""
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="packfs-nofuse-")
    os.chmod(path, 0o755)
    yield __import__("pathlib").Path(path)
    shutil.rmtree(path)


def test_an_unprivileged_process_without_dev_fuse_reads_every_byte(dataset, shared_dir):
    """A mount namespace where /dev is a fresh tmpfs without the FUSE device, entered as nobody
    with the system's Python (the module is one for every CPython since 3.9): `packfs mount`
    fails there, the engine serves every byte."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make the namespace (the test then drops to nobody)")
    shared = shared_dir
    python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
    tar = shared / "d.tar"
    tar.write_bytes(dataset["tar"].read_bytes())
    os.chmod(tar, 0o644)
    home = shared / "home"
    home.mkdir()
    os.chown(home, 65534, 65534)
    want = {p: hashlib.sha256(d).hexdigest() for p, d in dataset["files"].items()}
    import json
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        "PACKFS_NATIVE": os.environ.get("PACKFS_NATIVE", ""),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    inner = ("mount -t tmpfs -o mode=755 none /dev && "
             "exec setpriv --reuid=65534 --regid=65534 --clear-groups -- \"$@\"")
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", inner, "sh",
         python, "-c", NO_FUSE, str(tar), json.dumps(want), packfs.binary()],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"served {len(want)} files as uid 65534" in done.stdout, done.stdout


def test_a_samplers_order_goes_to_the_lookahead_in_the_process(dataset):
    """Hints without a socket: the list is taken (unknown paths counted), samples are fetched
    ahead of four reader threads that follow it, every byte is right; a second epoch's list
    replaces the first; an engine without a lookahead says it takes none."""
    paths = sorted(p for p in dataset["files"] if dataset["files"][p])
    random.Random(1).shuffle(paths)
    with packfs.Engine(dataset["tar"], cache_size="16M") as engine:
        answer = engine.hint(paths + ["train/none"], epoch=1)
        assert answer["samples"] == len(paths) and answer["unknown"] == 1
        assert answer["first_unknown"] == "train/none"
        order = iter(paths)
        lock = threading.Lock()
        wrong = []

        def reader():
            while True:
                with lock:
                    path = next(order, None)
                if path is None:
                    return
                if engine.read(path) != dataset["files"][path]:
                    wrong.append(path)

        threads = [threading.Thread(target=reader) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert wrong == []
        stats = engine.hint_stats()
        assert stats["lists"] == 1 and stats["samples"] == len(paths)
        assert stats["unknown_paths"] == 1
        assert stats["first_reads"] == len(paths), stats
        assert stats["fetched"] > 0, stats
        engine.hint(paths[:10], epoch=2)
        assert engine.hint_stats()["active_lists"] == 1
        engine.end_hints()
        assert engine.hint_stats()["active_lists"] == 0
    with packfs.Engine(dataset["tar"], lookahead=0) as engine:
        assert engine.hint_stats() is None
        with pytest.raises(ValueError, match="no hints"):
            engine.hint(paths)


def test_imagenet_as_downloaded_opens_with_the_mounts_options(tmp_path):
    """A tar of class tars (ILSVRC2012_img_train.tar's shape) with strip_inner_extension: the
    classes are directories of the engine's tree, as on a mount with the same option."""
    src = tmp_path / "src"
    files = {}
    for c in ("n01", "n02"):
        (src / c).mkdir(parents=True)
        for i in range(3):
            data = os.urandom(1000 + i)
            (src / c / f"{c}_{i}.JPEG").write_bytes(data)
            files[f"{c}/{c}_{i}.JPEG"] = data
        subprocess.run(["tar", "-C", src / c, "-cf", tmp_path / f"{c}.tar", "."], check=True)
    outer = tmp_path / "train.tar"
    subprocess.run(["tar", "-C", tmp_path, "-cf", outer, "n01.tar", "n02.tar"], check=True)
    with packfs.Engine(outer, strip_inner_extension=True) as engine:
        assert engine.listdir("") == ["n01", "n02"]
        assert {p: engine.read(p) for p in files} == files
    with packfs.Engine(outer, inner_archives="none") as engine:
        assert engine.listdir("") == ["n01.tar", "n02.tar"]
    with pytest.raises(ValueError, match="possible values"):
        packfs.Engine(outer, inner_archives="off")
    with pytest.raises(ValueError) as e:
        packfs.Engine(outer, inner_archives="https://user:secret@example.org/x")
    assert "secret" not in str(e.value) and "example.org" in str(e.value)


def test_exists_isdir_and_walk_answer_as_os_path_for_symlink_loops(tmp_path):
    """A symlink loop, a link to itself and a path through a file: False from exists, isdir and
    isfile, as os.path answers on GNU tar's extraction (they raised ELOOP), and walk lists the
    loops as files, as os.walk does."""
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "file").write_bytes(b"x")
    os.symlink("b", src / "d" / "a")
    os.symlink("a", src / "d" / "b")
    os.symlink("self", src / "d" / "self")
    tar = tmp_path / "loops.tar"
    subprocess.run(["tar", "-C", src, "--format=gnu", "-cf", tar, "d"], check=True)
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(["tar", "-C", out, "-xf", tar], check=True)
    with packfs.Engine(tar) as engine:
        for path in ["d/a", "d/b", "d/self", "d/a/x", "d/file/x", "d/missing"]:
            native = str(out / path)
            got = (engine.exists(path), engine.isdir(path), engine.isfile(path))
            want = (os.path.exists(native), os.path.isdir(native), os.path.isfile(native))
            assert got == want == (False, False, False), path
        walked = [(top, sorted(dirs), sorted(files)) for top, dirs, files in engine.walk("d")]
    native = [(os.path.relpath(top, out), sorted(dirs), sorted(files))
              for top, dirs, files in os.walk(out / "d")]
    assert walked == native == [("d", [], ["a", "b", "file", "self"])]
