"""packfs.mount and packfs.Catalog against real mounts of real tar shards (run as root, with
PACKFS_BIN naming the binary under test: `cargo test --test python` sets both up)."""

import glob
import os
import subprocess
import tempfile

import pytest

import packfs


def mounted(path):
    with open("/proc/self/mounts", "rb") as f:
        return any(line.split()[1] == os.fsencode(path) for line in f)


@pytest.fixture
def tree(tmp_path):
    """A tree with two classes, one name that is not UTF-8, and a tar shard per class."""
    src = tmp_path / "src"
    for cls, n in (("cat", 3), ("dog", 2)):
        (src / cls).mkdir(parents=True)
        for i in range(n):
            (src / cls / f"{i}.bin").write_bytes(os.urandom(1000 + 777 * i))
    odd = os.path.join(os.fsencode(src / "dog"), b"caf\xe9.bin")
    with open(odd, "wb") as f:
        f.write(b"latin-1 name")
    shards = []
    for cls in ("cat", "dog"):
        shard = tmp_path / f"{cls}.tar"
        subprocess.run(["tar", "-cf", shard, "-C", src, cls], check=True)
        shards.append(shard)
    return src, shards


def test_a_mount_serves_the_tree_and_goes_with_the_block(tree):
    src, shards = tree
    with packfs.mount(shards, cache_size="16M") as m:
        assert mounted(m.path)
        assert (m.path / "cat" / "2.bin").read_bytes() == (src / "cat" / "2.bin").read_bytes()
        assert packfs.open_bytes(m.path / "cat" / "0.bin") == (src / "cat" / "0.bin").read_bytes()
        record = m.status()
        assert record["state"] == "live"
        assert record["counters"]["files"] == 6
        assert record["counters"]["ram"]["budget"] == 16 << 20
        path = m.path
    assert not mounted(path)
    assert not path.exists(), "the private mountpoint is removed"


def test_an_exception_or_ctrl_c_inside_the_block_still_unmounts(tree, tmp_path):
    _, shards = tree
    for raised in (ValueError, KeyboardInterrupt):
        target = tmp_path / f"mnt-{raised.__name__}"
        target.mkdir()
        with pytest.raises(raised):
            with packfs.mount(shards[0], target):
                assert mounted(target)
                raise raised("stop")
        assert not mounted(target)
        assert target.is_dir(), "a mountpoint the caller gave is left in place"


def test_a_file_open_at_the_end_is_detached_not_left_mounted(tree):
    _, shards = tree
    with packfs.mount(shards[0]) as m:
        held = open(m.path / "cat" / "1.bin", "rb")
        path = m.path
    try:
        assert not mounted(path)
        assert len(held.read()) == 1777
    finally:
        held.close()


def test_a_failed_mount_raises_with_the_binarys_message(tmp_path):
    bad = tmp_path / "broken.packfs-index"
    bad.write_bytes(b"PACKFSIX" + b"\0" * 64)
    empty = tmp_path / "empty"
    empty.mkdir()
    direct = subprocess.run([packfs.binary(), "mount", bad, empty], capture_output=True)
    assert direct.returncode != 0
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "packfs-*")))
    with pytest.raises(packfs.MountError) as caught:
        packfs.mount(bad)
    said = direct.stderr.decode().splitlines()[0]
    assert said in str(caught.value)
    assert caught.value.returncode == direct.returncode
    # The private mountpoint made for it is gone again.
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "packfs-*"))) == before


def test_the_catalog_lists_every_file_with_its_image_and_share(tree):
    src, shards = tree
    catalog = packfs.Catalog(shards, shares=2)
    assert [os.fsencode(p) for p in catalog.images] == [os.fsencode(os.path.abspath(s)) for s in shards]
    assert catalog.image_shares == [0, 1]
    by_path = {f.path: f for f in catalog}
    assert len(catalog) == 6
    odd = by_path[b"dog/caf\xe9.bin"]
    assert odd.size == len(b"latin-1 name") and odd.image == 1
    with open(shards[1], "rb") as f:
        f.seek(odd.offset)
        assert f.read(odd.size) == b"latin-1 name"
    assert by_path["cat/1.bin"].size == 1777
    with packfs.mount(shards) as m:
        assert [f.path for f in packfs.Catalog(m)] == [f.path for f in catalog]


def test_mount_names_every_option_of_packfs_mount_and_refuses_others(tree):
    """``mount``'s keyword-only parameters are ``packfs mount``'s options, every one (the help
    is the binary's own list); a misspelt option is a TypeError in Python, before any command
    runs, and typed checkers see the signature (py.typed)."""
    import inspect
    import re

    help_text = subprocess.run(
        [packfs.binary(), "mount", "--help"], capture_output=True, check=True
    ).stdout.decode()
    flags = set(re.findall(r"^\s+(?:-\w, )?--([a-z0-9-]+)", help_text, re.M))
    # The daemon's own business, not a Python caller's: staying in the foreground would never
    # return, and packfs.mount passes --users and --remove-mountpoint itself.
    flags -= {"help", "foreground", "users", "remove-mountpoint"}
    params = inspect.signature(packfs.mount).parameters
    keyword_only = {
        name.replace("_", "-")
        for name, p in params.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    assert keyword_only == flags
    assert all(p.annotation is not inspect.Parameter.empty for p in params.values())
    assert os.path.exists(os.path.join(os.path.dirname(packfs.__file__), "py.typed"))
    _, shards = tree
    with pytest.raises(TypeError, match="cache_sise"):
        packfs.mount(shards[0], cache_sise="16M")


def test_boolean_and_counted_options_become_the_flags_the_binary_takes():
    assert packfs._options({"ram_chunks": False, "verbose": 2, "allow_other": True}) == [
        "--ram-chunks",
        "false",
        "--verbose",
        "--verbose",
        "--allow-other",
    ]
    assert packfs._options({"ram_chunks": None, "verbose": 0, "allow_other": False}) == []
