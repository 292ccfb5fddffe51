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

import base64
import gc
import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sysconfig
import tempfile
import threading
from pathlib import Path

__all__ = ["Catalog", "File", "Mount", "MountError", "binary", "mount", "open_bytes", "status"]

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


def binary():
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
        if value is None or value is False:
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


class Mount:
    """A mounted dataset; a context manager that unmounts on leaving the block, whatever ends
    it (an exception, KeyboardInterrupt). ``path`` is the mount's root."""

    def __init__(self, source, path, own_dir):
        self.source = source
        self.path = Path(path)
        self._own_dir = own_dir
        self._mounted = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.unmount()
        return False

    def __repr__(self):
        state = "mounted" if self._mounted else "unmounted"
        return f"<packfs.Mount {self.path} ({state})>"

    def status(self):
        """This mount's ``packfs status --json`` record: state, stats file, counters."""
        for record in status(self.path):
            if Path(record["mountpoint"]) == self.path:
                return record
        raise MountError(f"packfs status knows no mount at {self.path}")

    def unmount(self):
        """Unmounts (detaching lazily if a file is still open, so no mount is left behind) and
        removes the private mountpoint this object made. Calling it again does nothing."""
        if not self._mounted:
            return
        # A second Ctrl-C must not leave the mount half torn down.
        in_main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if in_main else None
        try:
            done = _run(["umount", str(self.path)], check=False)
            if done.returncode != 0:
                _run(["umount", "--lazy", str(self.path)])
            self._mounted = False
            if self._own_dir:
                os.rmdir(self.path)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)


def mount(source, mountpoint=None, **options):
    """Mounts ``source`` (an index, an image, or a list of images or URLs) at ``mountpoint``, or
    at a private temporary directory when none is given, and returns once the mount answers.

    Keyword arguments are ``packfs mount``'s options (``cache_size="1G"``, ``stage="/dev/shm/x"``,
    ``stage_share=(rank, world)``, ``allow_other=True``, ...). Raises MountError with the
    binary's message if the mount fails. Use it as a context manager, or call ``unmount()``.
    """
    sources = _sources(source)
    own_dir = mountpoint is None
    path = Path(tempfile.mkdtemp(prefix="packfs-")) if own_dir else Path(mountpoint)
    args = ["mount", *_options(options), *sources, str(path)]
    try:
        child = subprocess.Popen([binary(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except BaseException:
        if own_dir:
            os.rmdir(path)
        raise
    try:
        _, err = child.communicate()
    except BaseException:
        # Interrupted while mounting: let the command finish (it returns when the mount is
        # ready or failed), then leave nothing mounted behind.
        _, err = child.communicate()
        if child.returncode == 0:
            Mount(sources, path, own_dir).unmount()
        elif own_dir:
            os.rmdir(path)
        raise
    if child.returncode != 0:
        if own_dir:
            os.rmdir(path)
        message = err.decode(errors="replace").strip()
        raise MountError(message or f"packfs mount failed ({child.returncode})", child.returncode)
    return Mount(sources, path, own_dir)


def status(mountpoint=None):
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


class Catalog:
    """Every file of a dataset, from ``packfs ls --json`` (docs/configuration.md): an index, an
    image or a list of them, or a Mount. With ``shares=N``, ``image_shares[i]`` is the share
    (0..N-1) image ``i`` belongs to when N nodes stage with ``--stage-share K/N``.

    ``files`` holds File records in the mount's order (depth first, names sorted); a file's
    ``path`` is relative to the mount's root."""

    def __init__(self, source, shares=None):
        if isinstance(source, Mount):
            source = source.source
        args = ["ls", "--json"] + (["--shares", str(shares)] if shares else []) + _sources(source)
        listing = _run(args).stdout
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

    def __len__(self):
        return len(self.files)

    def __iter__(self):
        return iter(self.files)


def open_bytes(path):
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

