"""The processes of a job share one mount per node and take it with them: every rank calls
``packfs.mount`` with the same arguments (as torchrun and srun start them), one mount results,
every rank reads it, and nothing stays mounted once they are gone, however they end."""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import packfs

RANK = textwrap.dedent(
    """
    import json, os, sys, time
    import packfs
    shards, mnt, stage, marker = sys.argv[1:5]
    with packfs.mount(shards.split(","), mnt, stage=stage, cache_size="16M") as m:
        daemon = m.status()["counters"]["pid"]
        files = sorted(p for p in m.path.rglob("*") if p.is_file())
        sizes = {str(p.relative_to(m.path)): len(p.read_bytes()) for p in files}
        print(json.dumps({"daemon": daemon, "attached": m.attached, "sizes": sizes}), flush=True)
        if marker != "-":
            open(marker + "." + os.environ["LOCAL_RANK"], "w").close()
            # Every rank is in before any leaves, so they all share the one mount.
            while len([f for f in os.listdir(os.path.dirname(marker))
                       if f.startswith(os.path.basename(marker) + ".")]) < int(os.environ["LOCAL_WORLD_SIZE"]):
                time.sleep(0.05)
        if len(sys.argv) > 5:
            print("ready", flush=True)
            time.sleep(600)
    """
)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    base = tmp_path_factory.mktemp("shards")
    out = []
    for k in range(2):
        src = base / f"src{k}"
        (src / f"class{k}").mkdir(parents=True)
        for i in range(5):
            (src / f"class{k}" / f"{i}.bin").write_bytes(bytes([k * 16 + i]) * (1000 + 37 * i))
        shard = base / f"shard-{k}.tar"
        subprocess.run(["tar", "-cf", shard, "-C", src, f"class{k}"], check=True)
        out.append(str(shard))
    return ",".join(out)


def mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mounts") as mounts:
        return any(line.split()[1] == path for line in mounts)


def gone_within(path, seconds):
    deadline = time.monotonic() + seconds
    while mounted(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def run_ranks(n, shards, tmp_path):
    mnt, stage = tmp_path / "mnt", tmp_path / "stage"
    mnt.mkdir()
    marker = tmp_path / "in"
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, shards, str(mnt), str(stage), str(marker)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(n)},
        )
        for r in range(n)
    ]
    said = []
    for rank in ranks:
        out, err = rank.communicate(timeout=120)
        assert rank.returncode == 0, err.decode()
        said.append(__import__("json").loads(out))
    return mnt, said


@pytest.mark.parametrize("n", [2, 4])
def test_ranks_on_one_node_share_one_mount_and_leave_none(n, shards, tmp_path):
    mnt, said = run_ranks(n, shards, tmp_path)
    assert len({s["daemon"] for s in said}) == 1, said
    assert sorted(s["attached"] for s in said) == [False] + [True] * (n - 1)
    assert all(s["sizes"] == said[0]["sizes"] for s in said)
    assert len(said[0]["sizes"]) == 10
    assert gone_within(mnt, 5), "the last rank to leave unmounts"


def test_another_dataset_at_the_same_mountpoint_is_refused(shards, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    first, second = shards.split(",")
    with packfs.mount(first, mnt):
        with pytest.raises(packfs.MountError, match="already mounted"):
            packfs.mount(second, mnt)
        with packfs.mount(first, mnt) as again:
            assert again.attached
        assert mounted(mnt), "the first holder still uses it"
    assert not mounted(mnt)


def start_holder(shards, mnt, tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", RANK, shards, str(mnt), str(tmp_path / "stage"), "-", "hold"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"},
    )
    assert holder.stdout.readline(), holder.stderr.read().decode()
    assert holder.stdout.readline() == b"ready\n"
    assert mounted(mnt)
    return holder


def test_kill_9_of_the_only_user_leaves_no_mount(shards, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    holder = start_holder(shards, mnt, tmp_path)
    holder.kill()
    holder.wait()
    assert gone_within(mnt, 5), "the daemon unmounts when its last user dies"


def test_sigterm_runs_the_with_blocks_cleanup(shards, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    holder = start_holder(shards, mnt, tmp_path)
    holder.send_signal(signal.SIGTERM)
    assert holder.wait(timeout=30) == 128 + signal.SIGTERM
    # The block's own unmount, not the daemon's watch: gone at once.
    assert gone_within(mnt, 2)


def test_ctrl_c_while_a_large_tar_gz_is_scanned_leaves_no_mount(tmp_path):
    big = tmp_path / "big.tar.gz"
    subprocess.run(
        f"truncate -s 1G {tmp_path}/zeros && tar -C {tmp_path} -cf - zeros | gzip -1 > {big}"
        f" && rm {tmp_path}/zeros",
        shell=True,
        check=True,
    )
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    # Ctrl-C raises KeyboardInterrupt, as in a Python at a terminal: a test run started in the
    # background (`cmd &`, nohup) hands its children SIGINT ignored, and Python then keeps it so.
    script = (
        "import packfs, signal, sys\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "packfs.mount(sys.argv[1], sys.argv[2])\n"
        "print('mounted')"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(big), str(mnt)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    # As soon as the daemon runs (it scans for a second or more), while nothing is mounted yet.
    deadline = time.monotonic() + 30
    while not daemons_of(mnt):
        assert child.poll() is None and time.monotonic() < deadline, "no daemon started"
        time.sleep(0.005)
    assert not mounted(mnt), "the scan ended too soon for this test"
    child.send_signal(signal.SIGINT)
    # The scan is cancelled: no mount appears at all (before, the mount was waited for, made and
    # then unmounted).
    seen_mounted = False
    deadline = time.monotonic() + 60
    while child.poll() is None and time.monotonic() < deadline:
        seen_mounted = seen_mounted or mounted(mnt)
        time.sleep(0.005)
    out, err = child.communicate(timeout=5)
    assert not seen_mounted, (out, err.decode())
    assert b"KeyboardInterrupt" in err, err.decode()
    assert out == b""
    assert not mounted(mnt)
    time.sleep(2)
    assert not mounted(mnt), "no mount appears once the scan is over"
    assert daemons_of(mnt) == []


def daemons_of(mnt):
    return [
        pid
        for pid in os.listdir("/proc")
        if pid.isdigit() and str(mnt).encode() in _cmdline(pid) and b"--daemon-child" in _cmdline(pid)
    ]


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


LISTER = textwrap.dedent(
    """
    import sys
    import packfs
    shards, mnt = sys.argv[1:3]
    with packfs.mount(shards.split(","), mnt, cache_size="16M") as m:
        print(sorted(f.path for f in packfs.Catalog(m)), flush=True)
    """
)


def test_the_ranks_of_a_node_list_the_catalog_once(shards, tmp_path, monkeypatch):
    """Every rank that builds a Catalog of the shared mount reads the node's one listing: the
    binary lists the catalog once, not once per rank."""
    calls = tmp_path / "calls"
    wrapper = tmp_path / "packfs"
    wrapper.write_text(f'#!/bin/sh\necho "$1" >> {calls}\nexec {packfs.binary()} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PACKFS_BIN", str(wrapper))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with packfs.mount(shards.split(","), mnt, cache_size="16M") as m:
        first = sorted(f.path for f in packfs.Catalog(m))
        assert len(first) == 10
        again = sorted(f.path for f in packfs.Catalog(m))
        other = subprocess.run(
            [sys.executable, "-c", LISTER, shards, str(mnt)],
            capture_output=True, text=True, timeout=120, check=True,
        )
        assert other.stdout.strip() == repr(first)
        assert again == first
        # Another view (shares) is a listing of its own.
        assert len(packfs.Catalog(m, shares=2).image_shares) == 2
        kept = list(m._place.base.parent.glob(m._place.base.name + ".ls-*.jsonl"))
        assert len(kept) == 2, kept
    listed = calls.read_text().split()
    assert listed.count("ls") == 2, listed
    assert not list(m._place.base.parent.glob(m._place.base.name + ".ls-*")), "left behind"


ATTACK = textwrap.dedent(
    """
    import os, subprocess, sys, time
    import packfs
    victim, attacker, mnt, conf, hold = sys.argv[1:6]
    # This mount namespace only: non-root users may mount with --allow-other here.
    subprocess.run(["mount", "--bind", conf, "/etc/fuse.conf"], check=True)
    # The victim's job mounts and is killed with kill -9: its daemon unmounts, the marker stays.
    job = subprocess.Popen([sys.executable, "-c", hold, victim, mnt], stdout=subprocess.PIPE)
    assert job.stdout.readline() == b"ready\\n"
    job.kill(); job.wait()
    deadline = time.monotonic() + 10
    while os.path.ismount(mnt):
        assert time.monotonic() < deadline, "the killed job's daemon did not unmount"
        time.sleep(0.05)
    # Another user takes the directory (theirs now, as if they had replaced it through a parent
    # they may write) and mounts their own tar there.
    os.chown(mnt, 7, 7)
    os.chmod(mnt, 0o777)
    subprocess.run(["setpriv", "--reuid=7", "--regid=7", "--clear-groups", "--",
                    packfs.binary(), "mount", "--allow-other", attacker, mnt], check=True)
    try:
        with packfs.mount(victim, mnt) as m:
            print("ATTACHED" if m.attached else "MOUNTED", sorted(os.listdir(mnt)))
    except packfs.MountError as e:
        print("REFUSED", e)
    finally:
        subprocess.run([packfs.binary(), "umount", "--lazy", mnt])
    """
)

HOLD = textwrap.dedent(
    """
    import sys, time
    import packfs
    with packfs.mount(sys.argv[1], sys.argv[2]):
        print("ready", flush=True)
        time.sleep(600)
    """
)


def _world_dir(tmp_path, name, owner, mode):
    """A directory another user (uid ``owner``) can reach: under /tmp, not pytest's 0700 one."""
    import tempfile
    base = tempfile.mkdtemp(prefix="packfs-attack-")
    os.chmod(base, 0o755)
    path = os.path.join(base, name)
    os.mkdir(path)
    os.chown(path, owner, owner)
    os.chmod(path, mode)
    return base, path


def _tar_for(base, name, content, owner):
    src = os.path.join(base, name + "-src")
    os.mkdir(src)
    with open(os.path.join(src, "data.txt"), "w") as f:
        f.write(content)
    tar = os.path.join(base, name + ".tar")
    subprocess.run(["tar", "-cf", tar, "-C", src, "data.txt"], check=True)
    os.chown(tar, owner, owner)
    return tar


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: another user and a mount namespace")
def test_a_stale_marker_never_attaches_to_another_users_mount(tmp_path):
    """kill -9 of a job leaves its marker; another user mounts their own tar at the same
    directory; the victim's next packfs.mount there used to report "attached" and read the
    planted bytes. It must refuse, naming the other user."""
    import shutil
    base, mnt = _world_dir(tmp_path, "mnt", 0, 0o755)
    try:
        victim = _tar_for(base, "victim", "the real data\n", 0)
        attacker = _tar_for(base, "attacker", "planted\n", 7)
        conf = os.path.join(base, "fuse.conf")
        with open(conf, "w") as f:
            f.write("user_allow_other\n")
        done = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", ATTACK,
             victim, attacker, mnt, conf, HOLD],
            capture_output=True, timeout=120,
        )
        out = done.stdout.decode()
        assert done.returncode == 0, (out, done.stderr.decode())
        assert out.startswith("REFUSED"), out
        assert "uid 7" in out and "not a packfs mount of this user's" in out, out
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make another user's directory")
def test_a_mountpoint_another_user_owns_or_may_write_is_refused(shards, tmp_path):
    import shutil
    for owner, mode in [(7, 0o755), (0, 0o777)]:
        base, mnt = _world_dir(tmp_path, "mnt", owner, mode)
        try:
            with pytest.raises(packfs.MountError, match=f"belongs to uid {owner} with mode {mode:o}"):
                packfs.mount(shards.split(",")[0], mnt)
            assert not mounted(mnt)
        finally:
            shutil.rmtree(base, ignore_errors=True)


def test_a_mountpoint_given_through_a_symlink_is_left_unmounted(shards, tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to("real")
    with packfs.mount(shards.split(",")[0], link) as m:
        assert m.path == real
        assert mounted(real)
    assert not mounted(real), "unmount() found the mount at the link's target"
    assert link.is_symlink() and real.is_dir()


NODE_RANK = textwrap.dedent(
    """
    import json, os, sys, time
    import packfs
    shards, base, marker, hold = sys.argv[1:5]
    m = packfs.mount(shards.split(","), stage=packfs.NodeStage(base), cache_size="16M")
    counters = m.status()["counters"]
    sizes = sorted(len(p.read_bytes()) for p in m.path.rglob("*") if p.is_file())
    print(json.dumps({"path": str(m.path), "daemon": counters["pid"],
                      "stage": counters["stage"]["dir"], "sizes": sizes}), flush=True)
    open(marker + "." + os.environ["LOCAL_RANK"], "w").close()
    while len([f for f in os.listdir(os.path.dirname(marker))
               if f.startswith(os.path.basename(marker) + ".")]) < int(os.environ["LOCAL_WORLD_SIZE"]):
        time.sleep(0.05)
    if hold == "hold":
        print("ready", flush=True)
        time.sleep(600)
    m.unmount()
    """
)


def start_node_ranks(n, shards, tmp_path, hold):
    base = tmp_path / "shm"
    base.mkdir()
    return base, [
        subprocess.Popen(
            [sys.executable, "-c", NODE_RANK, shards, str(base), str(tmp_path / "in"), hold],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(n)},
        )
        for r in range(n)
    ]


def place_files(path):
    place = packfs._Place(path, packfs._runtime_dir())
    return [p for p in place.base.parent.glob(place.base.name + ".*")]


def nothing_left_within(path, stage, seconds):
    deadline = time.monotonic() + seconds
    while True:
        left = [str(p) for p in [path, stage, *place_files(path)] if os.path.lexists(p)]
        if not left and not mounted(path):
            return []
        if time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def test_ranks_asking_for_a_node_stage_share_one_mount_one_copy_and_leave_nothing(shards, tmp_path):
    base, ranks = start_node_ranks(2, shards, tmp_path, "leave")
    said = []
    for rank in ranks:
        out, err = rank.communicate(timeout=120)
        assert rank.returncode == 0, err.decode()
        said.append(__import__("json").loads(out))
    assert len({s["daemon"] for s in said}) == 1, said
    assert len({s["path"] for s in said}) == 1, said
    assert said[0]["sizes"] == said[1]["sizes"] and len(said[0]["sizes"]) == 10
    stage = said[0]["stage"]
    assert os.path.dirname(stage) == str(base / f"packfs-{os.geteuid()}"), stage
    assert nothing_left_within(said[0]["path"], stage, 10) == []
    # The per-user directory stays (empty, private): other datasets' stages live there too.
    assert os.listdir(base / f"packfs-{os.geteuid()}") == []


def test_kill_9_of_every_rank_leaves_nothing_on_the_node(shards, tmp_path):
    base, ranks = start_node_ranks(2, shards, tmp_path, "hold")
    said = []
    for rank in ranks:
        said.append(__import__("json").loads(rank.stdout.readline()))
        assert rank.stdout.readline() == b"ready\n", rank.stderr.read().decode()
    path, stage = said[0]["path"], said[0]["stage"]
    assert os.path.isdir(stage) and place_files(path)
    for rank in ranks:
        rank.kill()
        rank.wait()
    # The daemon sees its users gone: it unmounts, removes the staged copy, the marker, the
    # locks, the users file and the mountpoint it was given to remove.
    assert nothing_left_within(path, stage, 15) == []


def test_ranks_asking_for_other_options_are_warned(shards, tmp_path):
    first = shards.split(",")[0]
    with packfs.mount(first, cache_size="16M") as one:
        with pytest.warns(RuntimeWarning, match=r"--cache-size 16M; here: --cache-size 32M"):
            two = packfs.mount(first, cache_size="32M")
        assert two.path != one.path
        two.unmount()
        with packfs.mount(first, cache_size="16M") as same:
            assert same.attached


def test_a_long_scan_is_told_to_logging_as_it_goes(tmp_path, monkeypatch, caplog):
    # One compressed image: before, nothing was said until the mount was ready.
    big = tmp_path / "big.tar.gz"
    subprocess.run(
        f"truncate -s 512M {tmp_path}/zeros && tar -C {tmp_path} -cf - zeros | gzip -1 > {big}"
        f" && rm {tmp_path}/zeros",
        shell=True,
        check=True,
    )
    monkeypatch.setenv("PACKFS_PROGRESS_EVERY", "0")
    caplog.set_level("INFO", logger="packfs")
    with packfs.mount(big) as m:
        assert (m.path / "zeros").stat().st_size == 512 << 20
    lines = [r.getMessage() for r in caplog.records if r.name == "packfs"]
    assert any(re.match(r"scanning: .* of .* read \(\d+%\), 0 of 1 images", line)
               for line in lines), lines
