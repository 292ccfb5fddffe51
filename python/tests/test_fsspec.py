"""packfs's fsspec filesystem: fsspec's own abstract ``get`` tests over a dataset packed from
their scenarios (the tests that apply to a read-only filesystem), and open, cat_file with ranges,
ls, info, find, glob, exists, isdir and chained URLs on the data GNU tar wrote, byte for byte."""

import os
import subprocess

import pytest

fsspec = pytest.importorskip("fsspec")
from fsspec.implementations.local import LocalFileSystem  # noqa: E402
from fsspec.tests.abstract import AbstractFixtures  # noqa: E402
from fsspec.tests.abstract.get import AbstractGetTests  # noqa: E402

import packfs  # noqa: E402
from packfs.fsspec import PackfsFileSystem  # noqa: E402

SCENARIOS = {
    "bulk": "_bulk_operations_scenario_0",
    "glob": "_glob_edge_cases_files",
    "prefix": "_dir_and_file_with_same_name_prefix",
    "hashed": "_10_files_with_hashed_names",
}


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    """fsspec's four scenarios, each built by fsspec's own code on the local disk under a
    directory of its name, packed by GNU tar into one dataset."""
    base = tmp_path_factory.mktemp("fsspec")
    # Below one directory, the tests' `fs_path`: fsspec finds a copy's destination from the
    # source's parent, which an entry at the root of a filesystem without a root marker (as
    # fsspec's own tar:// and zip://) does not have.
    tree = base / "tree" / "root"
    local = LocalFileSystem(auto_mkdir=True)
    for name, build in SCENARIOS.items():
        getattr(AbstractFixtures, build)(None, local, os.path.join, str(tree / name))
    # What test_get_directory_recursive makes with mkdir and touch.
    (tree / "src").mkdir()
    (tree / "src" / "file").touch()
    tar = base / "scenarios.tar"
    subprocess.run(["tar", "-C", tree.parent, "-cf", tar, "root"], check=True)
    return tar


class _Packed(PackfsFileSystem):
    """The filesystem, where the tests' mkdir and touch find what they would make packed in the
    dataset already (and check that it is)."""

    def mkdir(self, path, create_parents=True, **kwargs):
        assert self.isdir(path), path

    def touch(self, path, truncate=True, **kwargs):
        assert self.isfile(path) and self.size(path) == 0, path


class TestPackfsGet(AbstractFixtures, AbstractGetTests):
    """fsspec's abstract get tests; the scenarios are in the dataset already (the filesystem
    cannot write them) and nothing is removed after each test."""

    @pytest.fixture
    def fs(self, scenarios):
        return _Packed(source=str(scenarios))

    @pytest.fixture
    def fs_path(self):
        return "root"

    @pytest.fixture
    def fs_bulk_operations_scenario_0(self, fs):
        return "root/bulk/source"

    @pytest.fixture
    def fs_glob_edge_cases_files(self, fs):
        return "root/glob/source"

    @pytest.fixture
    def fs_dir_and_file_with_same_name_prefix(self, fs):
        return "root/prefix/source"

    @pytest.fixture
    def fs_10_files_with_hashed_names(self, fs):
        return "root/hashed/source"


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    base = tmp_path_factory.mktemp("shard")
    src = base / "src"
    files = {}
    for c in range(3):
        for i in range(5):
            path = f"train/c{c}/{i:02}.JPEG"
            files[path] = os.urandom(1000 * (i + 1) + c)
            (src / path).parent.mkdir(parents=True, exist_ok=True)
            (src / path).write_bytes(files[path])
    tar = base / "shard.tar"
    subprocess.run(["tar", "-C", src, "-cf", tar, "train"], check=True)
    return tar, files


def test_reads_listings_and_globs_are_the_datasets(shard):
    tar, files = shard
    fs = fsspec.filesystem("packfs", source=str(tar))
    assert fs.ls("train", detail=False) == ["train/c0", "train/c1", "train/c2"]
    assert [i["type"] for i in fs.ls("train")] == ["directory"] * 3
    assert sorted(fs.find("train")) == sorted(files)
    assert fs.glob("train/c1/*.JPEG") == sorted(p for p in files if p.startswith("train/c1/"))
    assert fs.glob("**/03.JPEG") == [f"train/c{c}/03.JPEG" for c in range(3)]
    assert fs.exists("train/c0/00.JPEG") and not fs.exists("train/c9")
    assert fs.isdir("train/c0") and not fs.isdir("train/c0/00.JPEG")
    info = fs.info("train/c2/04.JPEG")
    assert info["type"] == "file" and info["size"] == len(files["train/c2/04.JPEG"])
    data = files["train/c2/04.JPEG"]
    assert fs.cat_file("train/c2/04.JPEG") == data
    assert fs.cat_file("train/c2/04.JPEG", start=10, end=100) == data[10:100]
    assert fs.cat_file("train/c2/04.JPEG", start=-50) == data[-50:]
    assert fs.cat_file("train/c2/04.JPEG", start=5, end=-5) == data[5:-5]
    assert fs.cat(sorted(files)) == {p: files[p] for p in sorted(files)}
    with fs.open("train/c0/01.JPEG", block_size=256) as f:
        f.seek(100)
        assert f.read(700) == files["train/c0/01.JPEG"][100:800]
    with pytest.raises(FileNotFoundError):
        fs.cat_file("train/none")
    with pytest.raises(PermissionError):
        fs.open("train/new", "wb")
    with pytest.raises(PermissionError):
        fs.rm("train/c0/00.JPEG")
    # One engine per dataset and options: fsspec hands the same instance out again.
    assert fsspec.filesystem("packfs", source=str(tar)) is fs


def test_a_chained_url_opens_the_dataset_it_names(shard):
    tar, files = shard
    with fsspec.open(f"packfs://train/c1/02.JPEG::file://{tar}", "rb") as f:
        assert f.read() == files["train/c1/02.JPEG"]
    assert fsspec.open(f"packfs://train/c1/03.JPEG::{tar}").open().read() == \
        files["train/c1/03.JPEG"]
    with pytest.raises(ValueError, match="which dataset"):
        fsspec.filesystem("packfs", skip_instance_cache=True)
