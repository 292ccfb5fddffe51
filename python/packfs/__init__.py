"""packfs from Python: mount a dataset's shards for the length of a ``with`` block, and read
the catalog (every file with its size, image and offset) without mounting.

    import packfs
    with packfs.mount("/gpfs/datasets/imagenet/train.packfs-index", cache_size="1G") as m:
        dataset = torchvision.datasets.ImageFolder(m.path / "train")
        ...

This is a thin layer over the ``packfs`` command (installed by the same wheel): every rule
(what a mount is, which node stages which share) stays in the binary, which this package asks.
Importing it needs nothing but the standard library.
"""

from __future__ import annotations

import base64
import fcntl
import gc
import hashlib
import importlib.metadata
import inspect
import json
import logging
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sysconfig
import threading
import time
import warnings
from pathlib import Path
from typing import Iterator, Optional, Sequence, Tuple, Union

PathLike = Union[str, "os.PathLike[str]"]
#: An image, an index or a URL, or a list of them.
Sources = Union[PathLike, bytes, Sequence[Union[PathLike, bytes]]]
#: A size as ``packfs mount`` takes it: bytes, or text with K, M, G suffixes (``"1G"``).
Size = Union[int, str]

__all__ = [
    "Catalog",
    "Engine",
    "File",
    "Hints",
    "Mount",
    "MountError",
    "NodeStage",
    "binary",
    "mount",
    "mount_point_of",
    "open_bytes",
    "status",
]

try:
    # The wheel's version, which is the binary's (both come from Cargo.toml).
    __version__ = importlib.metadata.version("packfs")
except importlib.metadata.PackageNotFoundError:
    # Imported from a source tree that was not installed.
    __version__ = "0+source"


class MountError(RuntimeError):
    """``packfs mount`` (or ``umount``) failed; the message is the binary's own."""

    def __init__(self, message, returncode=None):
        super().__init__(message)
        self.returncode = returncode


class NodeStage:
    """A stage directory packfs makes: ``stage=packfs.NodeStage("/dev/shm")`` (or the node's
    NVMe) is ``--stage-in BASE``, one private directory per node, user and dataset under
    ``base`` (``BASE/packfs-UID/NAME-HASH``), the same for every rank that asks, removed when
    the mount ends unless ``keep=True``."""

    def __init__(self, base: PathLike = "/dev/shm", keep: bool = False) -> None:
        self.base = os.path.abspath(os.fspath(base))
        self.keep = keep

    def flags(self):
        return ["--stage-in", self.base] + (["--keep-stage"] if self.keep else [])

    def __repr__(self):
        return f"NodeStage({self.base!r}, keep={self.keep})"


def binary() -> str:
    """The ``packfs`` command to run: ``$PACKFS_BIN``, else the one installed beside this
    Python (the wheel's), else the first on PATH."""
    explicit = os.environ.get("PACKFS_BIN")
    if explicit:
        return explicit
    beside = Path(sysconfig.get_path("scripts")) / "packfs"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("packfs")
    if found:
        return found
    raise MountError(
        "the packfs command is not installed: `pip install .` in a clone of packfs installs it "
        "with this package (packfs is not on PyPI yet), or set PACKFS_BIN to one you built"
    )


def _run(args, check=True):
    done = subprocess.run([binary(), *args], capture_output=True)
    if check and done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip()
        raise MountError(message or f"packfs {args[0]} failed ({done.returncode})", done.returncode)
    return done


def _options(options):
    """Keyword arguments as ``packfs mount`` flags: ``cache_size="1G"`` is ``--cache-size 1G``,
    ``allow_other=True`` is ``--allow-other``, ``stage_share=(0, 4)`` is ``--stage-share 0/4``;
    None and False are left out."""
    args = []
    for key, value in options.items():
        if key == "ram_chunks" and value is not None:
            args += ["--ram-chunks", "true" if value else "false"]
            continue
        if key == "verbose":
            args += ["--verbose"] * int(value)
            continue
        if value is None or value is False:
            continue
        if key == "stage" and isinstance(value, NodeStage):
            args += value.flags()
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif key == "stage_share" and not isinstance(value, str):
            rank, world = value
            args += [flag, f"{rank}/{world}"]
        else:
            args += [flag, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
    return args


def _sources(source):
    if isinstance(source, (str, bytes, os.PathLike)):
        return [os.fsdecode(source)]
    return [os.fsdecode(s) for s in source]


def _runtime_dir():
    """The directory of this user's mount locks: the binary's own (``/run/packfs`` for root,
    else ``$XDG_RUNTIME_DIR/packfs``, else ``/tmp/packfs-UID``), made private if missing and
    refused if it is not this user's own or others may write it."""
    uid = os.geteuid()
    if uid == 0:
        path, mode = Path("/run/packfs"), 0o755
    elif os.environ.get("XDG_RUNTIME_DIR"):
        path, mode = Path(os.environ["XDG_RUNTIME_DIR"]) / "packfs", 0o700
    else:
        path, mode = Path(f"/tmp/packfs-{uid}"), 0o700
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o022:
        raise MountError(
            f"{path} is not a private directory of this user (owner uid {st.st_uid}, mode "
            f"{stat.S_IMODE(st.st_mode):o}); remove it, or set XDG_RUNTIME_DIR to a directory "
            "of your own"
        )
    return path


def _open_private(path, flags=os.O_RDWR | os.O_CREAT):
    """A file of this user's that others cannot write, never reached through a symlink."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022 or not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise MountError(f"{path} belongs to uid {st.st_uid} or others may write it; remove it")
    return fd


def _lock_file(path, kind, timeout, what):
    """``path`` opened (a private file) and locked: the file still at ``path`` once locked, as
    the last process to leave a mount (or its daemon) removes these files while it holds them."""
    while True:
        fd = _open_private(path)
        try:
            _lock(fd, kind, timeout, what)
            if os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino:
                return fd
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def _lock(fd, kind, timeout, what):
    """flock with a timeout (a lock held by a process that hangs must not hang every rank)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise MountError(f"waited {timeout:.0f} s for {what}") from None
            time.sleep(0.05)


def _digest(*parts):
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogateescape")).hexdigest()[:16]


class _Place:
    """The files that let the processes of a node share one mount at ``path``: ``.lock`` (held
    while one process mounts, attaches or leaves), ``.users`` (each process using the mount holds
    a shared lock on it; the daemon, started with ``--users``, unmounts when none is left, however
    they ended) and ``.json`` (what is mounted there: sources and options)."""

    def __init__(self, path, runtime_dir, base=None):
        base = base or runtime_dir / f"mount-{_digest(os.path.realpath(path))}"
        self.base = base
        self.lock, self.users, self.marker = (
            Path(f"{base}.lock"),
            Path(f"{base}.users"),
            Path(f"{base}.json"),
        )

    def listing(self, shares):
        """Where the processes of the node keep this mount's ``packfs ls --json``: named by
        what is mounted and when (the marker's text and time), so a later mount at the same
        place never reads an earlier one's."""
        st = os.lstat(self.marker)
        key = _digest(self.marker.read_text(), str(st.st_mtime_ns), str(shares or 0))
        return Path(f"{self.base}.ls-{key}.jsonl")

    def forget_listings(self):
        for old in self.base.parent.glob(f"{self.base.name}.ls-*"):
            _remove(old)

    def forget(self):
        """Everything this place keeps, the lock files last (their holder calls it)."""
        _remove(self.marker)
        self.forget_listings()
        _remove(self.users)
        _remove(self.lock)


def _try_lock(path):
    """``path`` locked exclusively now, or None (held, gone, or not a private file)."""
    try:
        fd = _open_private(path, os.O_RDWR)
    except (OSError, MountError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except OSError:
        os.close(fd)
        return None


def _prune_places(runtime_dir):
    """What mounts that ended without their last process leaving left in the runtime directory
    (the daemon killed too, the node's last packfs.mount killed mid-way): places nobody holds,
    and the empty mountpoints made for them."""
    for users in runtime_dir.glob("mount-*.users"):
        place = _Place(None, runtime_dir, base=Path(str(users)[: -len(".users")]))
        held = [fd for fd in (_try_lock(place.lock), _try_lock(users)) if fd is not None]
        try:
            if len(held) == 2:
                place.forget()
        finally:
            for fd in held:
                os.close(fd)
    for made in runtime_dir.glob("mnt-*"):
        place = _Place(made, runtime_dir)
        if os.path.ismount(made) or place.users.exists():
            continue
        held = _try_lock(place.lock)
        if held is None:
            continue
        try:
            if not os.path.ismount(made) and not place.users.exists():
                _rmdir_quietly(made)
                _remove(place.lock)
        finally:
            os.close(held)


def _warn_of_other_options(runtime_dir, wanted, path):
    """Another live mount of the same sources on this node, with other options: every set of
    options is its own mount (and its own staged copy), which ranks meant to share one never
    want. Said once per mount, naming the difference."""
    mine = _option_pairs(wanted["options"])
    for marker in runtime_dir.glob("mount-*.json"):
        try:
            there = json.loads(marker.read_text())
        except (OSError, ValueError):
            continue
        other = there.get("path")
        if there.get("sources") != wanted["sources"] or not other or Path(other) == path:
            continue
        if not os.path.ismount(other):
            continue
        theirs = _option_pairs(there.get("options") or [])
        differ = sorted(set(mine) ^ set(theirs))
        if not differ:
            continue
        here = " ".join(f"{k} {v}".strip() for k, v in differ if (k, v) in mine) or "none"
        there_ = " ".join(f"{k} {v}".strip() for k, v in differ if (k, v) in theirs) or "none"
        warnings.warn(
            f"{wanted['sources'][0]} is mounted on this node already, at {other}, with other "
            f"options ({there_}; here: {here}): this is a second mount, with its own cache and "
            "staged copy. Give every rank of the node the same options (a stage from "
            "packfs.NodeStage is the same for all), or unmount the other one",
            RuntimeWarning,
            stacklevel=3,
        )
        return


def _option_pairs(flags):
    """``["--cache-size", "1G", "--allow-other"]`` as ``{("--cache-size", "1G"), ...}``."""
    pairs, i = [], 0
    while i < len(flags):
        value = flags[i + 1] if i + 1 < len(flags) and not flags[i + 1].startswith("--") else ""
        pairs.append((flags[i], value))
        i += 2 if value else 1
    return pairs


class Mount:
    """A mounted dataset; a context manager that leaves it on leaving the block, whatever ends
    it (an exception, KeyboardInterrupt, SIGTERM). ``path`` is the mount's root; ``attached``
    says this process found the mount made by another process of the node and uses it too. The
    last process to leave unmounts (or the daemon does, when the last one dies)."""

    def __init__(self, source, path, own_dir, users_fd=None, place=None, attached=False):
        self.source = source
        self.path = Path(path)
        self.attached = attached
        self._own_dir = own_dir
        self._users_fd = users_fd
        self._place = place
        self._mounted = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.unmount()
        return False

    def __repr__(self):
        state = "mounted" if self._mounted else "unmounted"
        return f"<packfs.Mount {self.path} ({state})>"

    def __del__(self):
        # A Mount dropped without unmount(): our share of it goes (the daemon unmounts when no
        # process is left), never the mount of the other processes.
        fd = getattr(self, "_users_fd", None)
        if fd is not None:
            os.close(fd)

    def status(self) -> dict:
        """This mount's ``packfs status --json`` record: state, stats file, counters."""
        for record in status(self.path):
            if Path(record["mountpoint"]) == self.path:
                return record
        raise MountError(f"packfs status knows no mount at {self.path}")

    def unmount(self) -> None:
        """Leaves the mount: the last process using it unmounts (detaching lazily if a file is
        still open, so no mount is left behind) and removes the mountpoint packfs made; the
        others only let go of it. Calling it again does nothing."""
        if not self._mounted:
            return
        # A second Ctrl-C must not leave the mount half torn down.
        in_main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if in_main else None
        setup = None
        try:
            if self._place is not None:
                setup = _lock_file(self._place.lock, fcntl.LOCK_EX, 60,
                                   f"{self._place.lock} (another process mounting)")
            last = True
            if self._users_fd is not None:
                try:
                    fcntl.flock(self._users_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    last = False
            if last:
                done = _run(["umount", str(self.path)], check=False)
                if done.returncode != 0 and os.path.ismount(self.path):
                    _run(["umount", "--lazy", str(self.path)])
                if self._place is not None:
                    self._place.forget()
                if self._own_dir:
                    _rmdir_quietly(self.path)
            self._mounted = False
            if self._users_fd is not None:
                os.close(self._users_fd)
                self._users_fd = None
        finally:
            if setup is not None:
                os.close(setup)
            if previous is not None:
                signal.signal(signal.SIGINT, previous)


def _remove(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _rmdir_quietly(path):
    try:
        os.rmdir(path)
    except OSError:
        pass


def _terminate(signum, frame):
    """SIGTERM (scancel, a time limit, torchrun stopping the ranks) as an exception, so that
    ``with`` blocks and ``finally`` run: the process then exits 143, as the signal would."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise SystemExit(128 + signal.SIGTERM)


def _cleanup_on_sigterm():
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _terminate)


def mount(
    source: Sources,
    mountpoint: Optional[PathLike] = None,
    timeout: float = 600,
    *,
    cache_size: Optional[Size] = None,
    stage: Union[PathLike, NodeStage, None] = None,
    stage_in: Optional[PathLike] = None,
    keep_stage: bool = False,
    peers: Optional[str] = None,
    peer_secret: Optional[PathLike] = None,
    peer_listen: Optional[str] = None,
    stage_mode: Optional[str] = None,
    stage_share: Union[Tuple[int, int], str, None] = None,
    stage_budget: Optional[Size] = None,
    stage_rate: Optional[Size] = None,
    chunk_size: Optional[Size] = None,
    ram_chunks: Optional[bool] = None,
    lookahead: Optional[Size] = None,
    lookahead_depth: Optional[int] = None,
    readahead: Optional[Size] = None,
    threads: Optional[int] = None,
    io_threads: Optional[int] = None,
    transport: Optional[str] = None,
    readdirplus: Optional[str] = None,
    allow_other: bool = False,
    uid: Optional[int] = None,
    gid: Optional[int] = None,
    nonempty: bool = False,
    endpoint_url: Optional[str] = None,
    duplicates: Optional[str] = None,
    layout: Optional[str] = None,
    class_field: Optional[str] = None,
    images_dir: Optional[PathLike] = None,
    inner_archives: Optional[str] = None,
    inner_depth: Optional[int] = None,
    strip_inner_extension: bool = False,
    inner_max: Optional[int] = None,
    save_index: Optional[PathLike] = None,
    stats_file: Optional[PathLike] = None,
    metrics_group: Union[str, int, None] = None,
    log_file: Optional[PathLike] = None,
    trace: Optional[PathLike] = None,
    trace_limit: Optional[Size] = None,
    idle_timeout: Optional[str] = None,
    owner: Optional[int] = None,
    pid_file: Optional[PathLike] = None,
    quiet: bool = False,
    verbose: int = 0,
) -> Mount:
    """Mounts ``source`` (an index, an image, or a list of images or URLs) at ``mountpoint`` and
    returns once the mount answers. Any number of processes of a node may call it with the same
    arguments (every rank of a torchrun or srun job): the first mounts, the others wait for it
    (up to ``timeout`` seconds) and attach to the same mount; the last to leave unmounts, and if
    they all die (``kill -9``, a cancelled job), the daemon unmounts on its own. Without
    ``mountpoint``, the mount goes to a directory of this user's named by the source and options
    (the same for every process that asks for the same), removed with the mount.

    The keyword arguments are ``packfs mount``'s options, by the same names with ``_`` for ``-``
    (``cache_size="1G"``, ``stage_share=(node, nodes)``, ``allow_other=True``, ...;
    docs/configuration.md): a misspelt one is a TypeError here, not a failure of the command.
    ``stage=packfs.NodeStage("/dev/shm")`` stages to one private directory per node, user and
    dataset that packfs makes, the same for every rank (so one mount and one copy per node), and
    removes with the mount; ``stage="/path"`` is a directory of yours, kept. Ranks of one node
    that ask for other options than a live mount of the same sources get a RuntimeWarning naming
    the difference (each set of options is a mount of its own). Raises MountError with the
    binary's message if the mount fails, or if another dataset or other options are mounted at
    ``mountpoint``. Use it as a context manager, or call ``unmount()``. Also makes SIGTERM end
    the process through its ``with`` blocks and ``finally`` clauses (exit status 143), where no
    other handler is set.
    """
    given = locals()
    options = {name: given[name] for name in _MOUNT_OPTIONS}
    sources = _sources(source)
    flags = _options(options)
    wanted = {"sources": [os.path.abspath(s) if "://" not in s else s for s in sources],
              "options": flags}
    own_dir = mountpoint is None
    runtime_dir = _runtime_dir()
    if own_dir:
        path = runtime_dir / f"mnt-{_digest(json.dumps(wanted, sort_keys=True))}"
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    else:
        # Resolved once: a mountpoint given through a link is mounted at its target, where
        # unmount() and the other ranks must find it.
        path = Path(os.path.realpath(mountpoint))
    place = _Place(path, runtime_dir)
    _cleanup_on_sigterm()
    setup = _lock_file(place.lock, fcntl.LOCK_EX, timeout, f"another process mounting at {path}")
    users = None
    try:
        # Refused only while a daemon whose users all left holds it, until it has unmounted.
        users = _lock_file(place.users, fcntl.LOCK_SH, timeout, f"the mount at {path} to end")
        if os.path.ismount(path):
            attached = _attach(path, place, wanted)
            if attached is not None:
                mounted = Mount(sources, path, own_dir, users, place, attached=True)
                users = None
                return mounted
        if not own_dir:
            _check_mountpoint(path)
        _prune_places(runtime_dir)
        _warn_of_other_options(runtime_dir, wanted, path)
        _mount_here(sources, flags + (["--remove-mountpoint"] if own_dir else []), path, place)
        try:
            place.forget_listings()
            _write_marker(place.marker, {**wanted, "path": str(path), "daemon": _daemon_at(path)})
        except BaseException:
            Mount(sources, path, own_dir, None, None).unmount()
            raise
        mounted = Mount(sources, path, own_dir, users, place)
        users = None
        return mounted
    except BaseException:
        if own_dir and not os.path.ismount(path):
            _rmdir_quietly(path)
        raise
    finally:
        if users is not None:
            os.close(users)
        os.close(setup)


#: ``mount``'s keyword-only parameters: the options of ``packfs mount``
#: (python/tests/test_mount_and_catalog.py checks them against ``packfs mount --help``).
_MOUNT_OPTIONS = [
    name
    for name, p in inspect.signature(mount).parameters.items()
    if p.kind is inspect.Parameter.KEYWORD_ONLY
]


def _attach(path, place, wanted):
    """The mount at ``path``, if it is the one ``wanted`` and this user's daemon that this
    module started made it; raises if it is another. The marker alone proves nothing: one left
    by a job killed with ``kill -9`` outlives its mount, and another user may have mounted their
    own dataset at the same directory since."""
    found = _mounted_at(path)
    me = os.geteuid()
    if found is None:
        return None
    if found["fstype"] != "fuse.packfs" or found["owner"] != me:
        raise MountError(
            f"{path} is a {found['fstype']} mount of uid {found['owner']}, not a packfs mount of "
            f"this user's (uid {me}): refusing to read it as the dataset; pick another "
            "mountpoint (a directory of your own), or ask its owner to unmount it"
        )
    try:
        there = json.loads(place.marker.read_text())
    except (OSError, ValueError):
        there = None
    daemon = (there or {}).get("daemon") or {}
    now = _daemon_at(path, quiet=True)
    if not daemon or now != daemon:
        raise MountError(
            f"{path} is a packfs mount of this user's that this module did not make (its daemon "
            f"{now or 'is unknown'}; recorded: {daemon or 'none'}): unmount it (packfs umount "
            f"{path}) or pick another mountpoint"
        )
    if {k: there.get(k) for k in wanted} == wanted:
        return True
    what = f"{there['sources']} with {there['options'] or 'no options'}"
    raise MountError(
        f"{path} is already mounted, from {what}, not {wanted['sources']} with "
        f"{wanted['options'] or 'no options'}: unmount it (packfs umount {path}) or pick another "
        "mountpoint"
    )


def _mounted_at(path):
    """The last mount at ``path`` in this mount namespace: its type, its FUSE owner (the
    ``user_id=`` the kernel records for the user who mounted it) and its device, or None."""
    target = os.fspath(path)
    found = None
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, after = left.split(), right.split()
            if len(fields) < 5 or len(after) < 3 or _unescape_mountinfo(fields[4]) != target:
                continue
            owners = [o[8:] for o in after[2].split(",") if o.startswith("user_id=")]
            found = {"fstype": after[0], "owner": int(owners[0]) if owners else None,
                     "dev": fields[2]}
    return found


def _start_time(pid):
    """A process's start time (clock ticks since boot): with its pid, it names the process
    however often pids are reused."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _daemon_at(path, quiet=False):
    """Which daemon serves the mount at ``path``: its pid and start time, and the mount's
    device, as the marker records them; None (or MountError unless ``quiet``) when no live
    packfs daemon of this user answers for it."""
    found = _mounted_at(path)
    pid = None
    for record in status(path):
        if Path(record["mountpoint"]) == Path(path):
            pid = (record.get("counters") or {}).get("pid")
    start = _start_time(pid) if pid else None
    if found is None or start is None:
        if quiet:
            return None
        raise MountError(f"packfs mounted {path}, but its daemon does not answer for it")
    return {"pid": pid, "start": start, "dev": found["dev"]}


def _write_marker(marker, record):
    fd = _open_private(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(record))


def _check_mountpoint(path):
    """A mountpoint another user owns, or that others may write, is refused: its owner could
    put their own mount there for this user to read as the dataset (root's too)."""
    try:
        st = os.stat(path)
    except OSError:
        return  # packfs mount says what is wrong with it
    me = os.geteuid()
    if st.st_uid not in (me, 0) or st.st_mode & 0o022:
        raise MountError(
            f"{path} belongs to uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}: a "
            f"mountpoint must be a directory of this user's (uid {me}) or root's that others "
            f"cannot write; make one (mkdir -m 0755 DIR) or pass no mountpoint"
        )


#: The binary's progress lines while a mount scans its images (every PACKFS_PROGRESS_EVERY
#: seconds, 30 by default), as INFO records of this logger.
_log = logging.getLogger("packfs")


def _mount_here(sources, flags, path, place):
    args = ["mount", "--users", str(place.users), *flags, *sources, str(path)]
    child = subprocess.Popen([binary(), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    said = []
    try:
        # Line by line as they come: a scan of one large image takes minutes.
        for line in child.stderr:
            text = line.decode(errors="replace").rstrip("\n")
            if text.startswith(("packfs: scanning", "packfs: checksums")):
                _log.info("%s", text[len("packfs: "):])
            else:
                said.append(text)
        child.wait()
        err = "\n".join(said).encode()
    except BaseException:
        # Interrupted while mounting (Ctrl-C, SIGTERM): the command stops the daemon, scanning
        # or mounted, and leaves nothing mounted.
        child.send_signal(signal.SIGINT)
        _, err = child.communicate()
        if child.returncode == 0:
            Mount(sources, path, False).unmount()
        raise
    if child.returncode != 0:
        message = err.decode(errors="replace").strip()
        raise MountError(message or f"packfs mount failed ({child.returncode})", child.returncode)


def status(mountpoint: Optional[PathLike] = None) -> list:
    """``packfs status --json``: a list of records (mountpoint, state, stats file, counters),
    for every mount of this user, or for ``mountpoint``."""
    args = ["status", "--json"] + ([os.fspath(mountpoint)] if mountpoint is not None else [])
    done = _run(args, check=False)
    try:
        return json.loads(done.stdout or b"[]")
    except ValueError as e:
        raise MountError(f"packfs status printed no JSON: {e}") from None


class File:
    """One file of a catalog: its path (str, or bytes where the name is not UTF-8), size, image
    number and offset in that image."""

    __slots__ = ("path", "size", "image", "offset")

    def __init__(self, path, size, image, offset):
        self.path, self.size, self.image, self.offset = path, size, image, offset

    def __repr__(self):
        return f"File({self.path!r}, size={self.size}, image={self.image}, offset={self.offset})"


def _name(row, key):
    exact = row.get(key + "_b64")
    return base64.b64decode(exact) if exact is not None else row[key]


def _listing_of(mount, shares, args):
    """``packfs ls --json``'s output. For a mount the processes of a node share, it is listed
    once per node: the first process lists it into the runtime directory (under a lock, the file
    this user's, written whole and renamed), and the other ranks read that copy, rather than each
    rank reading the whole catalog again."""
    place = getattr(mount, "_place", None)
    if place is None:
        return _run(args).stdout
    try:
        path = place.listing(shares)
    except FileNotFoundError:
        return _run(args).stdout
    lock = _open_private(Path(f"{path}.lock"))
    try:
        _lock(lock, fcntl.LOCK_EX, 3600, f"another process listing {mount.path}")
        kept = _read_private(path)
        if kept is not None:
            return kept
        listing = _run(args).stdout
        part = path.with_name(f"{path.name}.{os.getpid()}.part")
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(listing)
        os.replace(part, path)
        return listing
    finally:
        os.close(lock)


def _read_private(path):
    """The bytes of a file of this user's that others cannot write, never through a symlink;
    None if there is none."""
    try:
        fd = _open_private(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read()


class Catalog:
    """Every file of a dataset, from ``packfs ls --json`` (docs/configuration.md): an index, an
    image or a list of them, or a Mount. With ``shares=N``, ``image_shares[i]`` is the share
    (0..N-1) image ``i`` belongs to when N nodes stage with ``--stage-share K/N``.

    ``files`` holds File records in the mount's order (depth first, names sorted); a file's
    ``path`` is relative to the mount's root. Of a Mount shared by the processes of a node
    (``packfs.mount``), the catalog is listed once per node, not once per rank."""

    def __init__(self, source: Union[Sources, "Mount"], shares: Optional[int] = None) -> None:
        mount = source if isinstance(source, Mount) else None
        if mount is not None:
            source = mount.source
        args = ["ls", "--json"] + (["--shares", str(shares)] if shares else []) + _sources(source)
        listing = _listing_of(mount, shares, args)
        # A million rows make ten million small objects: the cyclic garbage collector, which
        # would walk them all again and again while they are made (1.8 s of 4 for ImageNet's
        # 1.28 M files), has nothing to collect here. One parse of the whole listing as an array
        # is twice as fast as a parse per line (JSON strings hold no raw newline).
        collecting = gc.isenabled()
        gc.disable()
        try:
            rows = json.loads(b"[" + listing.rstrip(b"\n").replace(b"\n", b",") + b"]")
            del listing
            head = rows[0]
            if head.get("packfs_ls") != 1:
                raise MountError(f"packfs ls --json speaks version {head.get('packfs_ls')}, not 1")
            n = head["images"]
            self.shares = shares or None
            self.images = [_name(r, "path") for r in rows[1 : 1 + n]]
            self.image_sizes = [r["size"] for r in rows[1 : 1 + n]]
            self.image_shares = [r["share"] for r in rows[1 : 1 + n]] if shares else None
            self.files = [
                File(_name(r, "path"), r["size"], r["image"], r["offset"])
                for r in rows[1 + n :]
                if r["kind"] == "file"
            ]
            del rows
        finally:
            if collecting:
                gc.enable()

    def __len__(self) -> int:
        return len(self.files)

    def __iter__(self) -> Iterator[File]:
        return iter(self.files)


def open_bytes(path: PathLike) -> bytes:
    """The whole content of the file at ``path``, read with one large buffer and none of
    ``open()``'s text-mode questions (Python's default ``open`` asks the kernel whether the file
    is a terminal, a round trip to the daemon per file on a FUSE mount)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        chunks = []
        while True:
            chunk = os.read(fd, max(size, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)



def _unescape_mountinfo(field):
    """A path as /proc/self/mountinfo writes it (space, tab, newline and backslash as octal)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_point_of(path: PathLike) -> Optional[Path]:
    """The mount point of the packfs mount that holds ``path``, or None when it is not on one."""
    real = os.path.realpath(os.fspath(path))
    best = None
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            if len(fields) < 5 or not right:
                continue
            point = _unescape_mountinfo(fields[4])
            inside = real == point or real.startswith(point.rstrip("/") + "/")
            if inside and (best is None or len(point) >= len(best[0])):
                best = (point, right.split()[0])
    if best is not None and best[1] == "fuse.packfs":
        return Path(best[0])
    return None


class Hints:
    """Tells a packfs mount which samples will be read next, in order, so that its daemon
    fetches them ahead of the readers (docs/training.md, "Hints"). ``packfs.torch``'s samplers
    use it; call it yourself from any loader::

        hints = packfs.Hints("/mnt/imagenet")
        hints.send(paths_in_the_order_they_will_be_read, rank=rank, epoch=epoch)

    ``path`` is any path on the mount; ``stream`` names the list (a job with a training and a
    validation loader sends two streams). A list replaces the previous one of its stream and
    rank. The daemon's socket takes one JSON object per line (its format is in docs/training.md,
    for loaders that are not Python)."""

    #: How long ``send`` waits for the daemon's answer.
    timeout = 120.0

    def __init__(self, path: PathLike, stream: str = "default") -> None:
        point = mount_point_of(path)
        if point is None:
            raise MountError(f"{os.fspath(path)} is not on a packfs mount: hints go to a mount")
        self.mountpoint, self.stream = point, stream
        self.socket_path = None
        for record in status(point):
            if Path(record.get("mountpoint", "")) == point:
                counters = record.get("counters") or {}
                self.socket_path = record.get("hints") or counters.get("hints")
        if not self.socket_path:
            raise MountError(
                f"the packfs mount at {point} takes no hints: it was mounted with --lookahead 0 or "
                "no RAM cache, or by an older packfs (`packfs status` says)"
            )
        self._sock = None
        self._replies = None
        self._lock = threading.Lock()
        self._dirs = {}

    def _relative(self, path):
        """``path`` relative to the mount point, from the real path of its directory (cached:
        a dataset's paths share a few thousand directories); as it is when not on the mount
        (the daemon counts it unknown)."""
        text = os.fsdecode(path)
        if not os.path.isabs(text):
            return text
        head, tail = os.path.split(text)
        if head not in self._dirs:
            real = os.path.realpath(head)
            point = os.fspath(self.mountpoint).rstrip("/")
            if real == point:
                self._dirs[head] = ""
            elif real.startswith(point + "/"):
                self._dirs[head] = real[len(point) + 1 :]
            else:
                self._dirs[head] = None
        rel = self._dirs[head]
        if rel is None:
            return text
        return f"{rel}/{tail}" if rel else tail

    def _exchange(self, message):
        line = (json.dumps(message, ensure_ascii=False) + "\n").encode("utf-8", "surrogatepass")
        with self._lock:
            for attempt in (0, 1):
                try:
                    if self._sock is None:
                        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                        sock.settimeout(self.timeout)
                        sock.connect(self.socket_path)
                        self._sock, self._replies = sock, sock.makefile("rb")
                    self._sock.sendall(line)
                    answer = self._replies.readline()
                    if not answer:
                        raise ConnectionError("the daemon closed the connection")
                    return json.loads(answer)
                except (OSError, ValueError) as e:
                    self.close()
                    if attempt:
                        raise MountError(f"cannot send hints to {self.socket_path}: {e}") from None

    def send(self, paths, *, rank: int = 0, epoch: int = 0) -> dict:
        """Sends the paths (on the mount, absolute or relative to its root) in the order they
        will be read; returns the daemon's answer (``samples``, ``unknown``, ...)."""
        rel = [self._relative(p) for p in paths]
        answer = self._exchange(
            {"stream": self.stream, "rank": int(rank), "epoch": int(epoch), "paths": rel}
        )
        if not answer.get("ok"):
            refused = MountError(f"the packfs daemon refused the hints: {answer.get('error')}")
            # For want of memory: this list only; the next may fit.
            refused.no_room = bool(answer.get("no_room"))
            raise refused
        return answer

    def end(self, *, rank: int = 0) -> None:
        """Says the list of ``rank`` is done with (the daemon also drops a list a minute after
        its last read)."""
        self._exchange({"stream": self.stream, "rank": int(rank), "end": True})

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._replies.close()
                self._sock.close()
            finally:
                self._sock = self._replies = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __getstate__(self):
        # DataLoader workers get a copy without the connection (each opens its own if it sends).
        state = self.__dict__.copy()
        state.update(_sock=None, _replies=None, _lock=None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()


# The engine in this process (no mount): imports nothing until used.
from .engine import Engine  # noqa: E402
