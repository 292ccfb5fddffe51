"""The engine in this process: a dataset's files read by path with no mount, no daemon and no
/dev/fuse (pods and containers without FUSE, thread-based loaders, fsspec).

    import packfs
    with packfs.Engine("/gpfs/datasets/imagenet/train.packfs-index", cache_size="1G") as ds:
        names = ds.listdir("train")
        data = ds.read("train/n01440764/n01440764_10026.JPEG")

It opens from the same arguments as ``packfs.mount`` (an index, images, globs, ``s3://`` and
``http(s)://`` URLs; ``layout``, inner archives, ``cache_size``, ``stage``, ...) and answers with
the engine the mount serves from (the native module ``packfs._native``, built with the binary).
Paths are relative to the dataset's root, as below a mountpoint. Errors are ``OSError``s by
errno, with the mount's messages: ``FileNotFoundError``, ``IsADirectoryError``, and for a read
that fails, the image and the offset in it. Reads release the GIL; an engine may be shared by
any number of threads, and by forked DataLoader workers (each reopens what it reads with, over
the same catalog). It pickles as its arguments: a spawned worker opens it again.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import inspect
import io
import os
import re
import stat as _stat
from typing import Iterator, List, Optional, Sequence, Tuple

from . import PathLike, Sources, _options, _sources

__all__ = ["Engine", "native"]

_native_module = None


def native():
    """The native module: the one installed with the package (the wheel's), else the library
    that ``$PACKFS_NATIVE`` names (a build tree's ``target/debug/libpackfs.so``)."""
    global _native_module
    if _native_module is not None:
        return _native_module
    try:
        from . import _native as module
    except ImportError:
        path = os.environ.get("PACKFS_NATIVE")
        if not path:
            raise ImportError(
                "packfs's native module is not installed: install packfs from its wheel "
                "(pip install packfs, or pip install . in a clone), or point PACKFS_NATIVE at "
                "a built libpackfs.so"
            ) from None
        loader = importlib.machinery.ExtensionFileLoader("packfs._native", path)
        spec = importlib.util.spec_from_loader("packfs._native", loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    _native_module = module
    return module


def _key(path) -> bytes:
    """A path of the dataset as the catalog names it: bytes, relative to the root."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    return os.fsencode(path).lstrip(b"/")


_KINDS = {"f": _stat.S_IFREG, "d": _stat.S_IFDIR, "l": _stat.S_IFLNK}


def _stat_result(answer) -> os.stat_result:
    kind, size, perm, mtime, mtime_nsec, ino = answer
    mode = _KINDS[kind] | perm
    when = mtime + mtime_nsec / 1e9
    return os.stat_result(
        (mode, ino, 0, 1, os.getuid(), os.getgid(), size, when, when, when)
    )


class Engine:
    """A dataset open in this process. ``source`` and the keyword arguments are
    ``packfs.mount``'s (those that concern the data, not a mount: ``cache_size``, ``stage``,
    ``layout``, ``endpoint_url``, ...). Use it as a context manager, or call ``close()``."""

    def __init__(self, source: Sources, *, _reopened: bool = False, **options) -> None:
        unknown = sorted(set(options) - set(_ENGINE_OPTIONS))
        if unknown:
            raise TypeError(
                f"packfs.Engine() takes no {', '.join(unknown)}: of packfs.mount's options it "
                f"takes those that concern the data ({', '.join(_ENGINE_OPTIONS)})"
            )
        self.sources = _sources(source)
        self._options = options
        args = [os.fsencode(a) for a in _options(options)]
        # Relative paths as this process sees them, whatever directory the engine reads from.
        images = [s if "://" in s else os.path.abspath(s) for s in self.sources]
        args += [b"--"] + [os.fsencode(s) for s in images]
        # A spawned worker's copy of an engine (`_reopen`): an image changed since the first
        # process opened it fails its own files only, as it does there.
        self._engine = native().Engine(args, f"pid {os.getpid()} (packfs.Engine)", _reopened)

    def __reduce__(self):
        # Pickled as its arguments (a spawned DataLoader worker opens the dataset again).
        return (_reopen, (self.sources, self._options))

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __len__(self) -> int:
        """The number of files in the dataset."""
        return len(self._engine)

    def __repr__(self) -> str:
        # A URL's user and key stay out of what a log or a traceback prints.
        shown = [re.sub(r"://[^/@]*@", "://", s) for s in self.sources]
        return f"packfs.Engine({shown!r})"

    def close(self) -> None:
        """Stops the background work (staging, the watcher of images); reads still answer."""
        self._engine.close()

    def stat(self, path: PathLike, *, follow_symlinks: bool = True) -> os.stat_result:
        """``os.stat`` of a path of the dataset (owned by this process's user, as on a mount)."""
        return _stat_result(self._engine.stat(_key(path), follow_symlinks))

    # As os.path's: False for any path that cannot be stat'ed (missing, a symlink loop, a
    # component that is a file, a name with a NUL).
    def exists(self, path: PathLike) -> bool:
        try:
            self._engine.stat(_key(path), True)
        except (OSError, ValueError):
            return False
        return True

    def isdir(self, path: PathLike) -> bool:
        try:
            return self._engine.stat(_key(path), True)[0] == "d"
        except (OSError, ValueError):
            return False

    def isfile(self, path: PathLike) -> bool:
        try:
            return self._engine.stat(_key(path), True)[0] == "f"
        except (OSError, ValueError):
            return False

    def listdir(self, path: PathLike = "") -> List[str]:
        """The names in a directory, in name order (``os.listdir``'s)."""
        return [os.fsdecode(name) for name, _ in self._engine.listdir(_key(path))]

    def scandir(self, path: PathLike = "") -> List[Tuple[str, str]]:
        """(name, kind) of each entry of a directory: kind is ``"f"``, ``"d"`` or ``"l"``."""
        return [(os.fsdecode(name), kind) for name, kind in self._engine.listdir(_key(path))]

    def walk(self, top: PathLike = "", followlinks: bool = False
             ) -> Iterator[Tuple[str, List[str], List[str]]]:
        """``os.walk`` over the dataset, top down, names sorted: symlinks to directories are
        listed with the directories, and entered only with ``followlinks``, as ``os.walk``."""
        top = os.fsdecode(_key(top))
        dirs, files, links = [], [], set()
        for name, kind in self.scandir(top):
            path = f"{top}/{name}" if top else name
            if kind == "l" and self.isdir(path):
                links.add(name)
            (dirs if kind == "d" or name in links else files).append(name)
        yield top, dirs, files
        for name in dirs:
            if followlinks or name not in links:
                yield from self.walk(f"{top}/{name}" if top else name, followlinks)

    def readlink(self, path: PathLike) -> str:
        return os.fsdecode(self._engine.readlink(_key(path)))

    def read(self, path: PathLike, offset: int = 0, size: int = -1) -> bytes:
        """``size`` bytes of a file from ``offset`` (to its end when negative; fewer at its
        end)."""
        if offset < 0:
            raise ValueError("offset must not be negative")
        return self._engine.read(_key(path), offset, size)

    def read_many(self, paths: Sequence[PathLike]) -> List[bytes]:
        """Whole files, in order: one call into the engine for many samples."""
        return self._engine.read_many([_key(p) for p in paths])

    def readinto(self, path: PathLike, buffer, offset: int = 0) -> int:
        """Reads a file from ``offset`` into ``buffer`` (a bytearray, a writable memoryview, a
        C-contiguous numpy array, or a CPU torch tensor) without an extra copy; returns the
        bytes read, at most the buffer's size."""
        if offset < 0:
            raise ValueError("offset must not be negative")
        view = _writable_bytes(buffer)
        if view.nbytes == 0:
            return 0
        # The buffer's address, from a ctypes array over it: it pins the buffer for the call.
        pinned = (ctypes.c_char * view.nbytes).from_buffer(view)
        try:
            return self._engine.read_into(_key(path), ctypes.addressof(pinned), view.nbytes, offset)
        finally:
            del pinned
            view.release()

    def hint(self, paths: Sequence[PathLike], *, rank: int = 0, epoch: int = 0,
             stream: str = "default") -> dict:
        """Tells the engine the order in which ``rank`` reads ``paths`` this epoch, so it fetches
        them ahead of the readers (the lookahead a mount's hints socket feeds, here without a
        socket); it replaces the rank's previous list of the stream. Answers as a mount's
        hints socket does (``samples``, ``unknown``, ``first_unknown``, ``truncated``); a list
        the memory budget has no room for raises ``MountError`` with ``no_room`` set."""
        from . import MountError

        try:
            samples, unknown, first, truncated = self._engine.hint(
                [_key(p) for p in paths], stream, rank, epoch)
        except MemoryError as e:
            error = MountError(str(e))
            error.no_room = True
            raise error from None
        answer = {"ok": True, "samples": samples, "unknown": unknown}
        if first is not None:
            answer["first_unknown"] = first
        if truncated:
            answer["truncated"] = True
        return answer

    def end_hints(self, *, rank: int = 0, stream: str = "default") -> None:
        """Drops the list of ``rank`` of ``stream`` (its sampler is through)."""
        self._engine.end_hints(stream, rank)

    def hint_stats(self) -> Optional[dict]:
        """The lookahead's counters (``packfs status``'s ``lookahead``), or None without one."""
        import json

        stats = self._engine.hint_stats()
        return None if stats is None else json.loads(stats)

    def hints(self, stream: str = "default") -> "_EngineHints":
        """What a sampler sends its orders to: ``packfs.Hints``'s interface, for this engine."""
        return _EngineHints(self, stream)

    def open(self, path: PathLike, mode: str = "rb", buffering: int = -1):
        """A read-only file object over a file of the dataset (``"rb"``; ``"r"`` decodes it as
        text with ``io.TextIOWrapper``)."""
        if mode not in ("r", "rb", "rt"):
            raise PermissionError(f"{os.fsdecode(_key(path))}: the dataset is read-only (mode {mode!r})")
        raw = _RawFile(self, _key(path))
        size = io.DEFAULT_BUFFER_SIZE if buffering in (-1, 0, 1) else buffering
        f = io.BufferedReader(raw, buffer_size=max(size, 1))
        return f if mode == "rb" else io.TextIOWrapper(f)


class _EngineHints:
    """``packfs.Hints`` for an engine in this process: the samplers' interface, no socket."""

    def __init__(self, engine: Engine, stream: str) -> None:
        self.engine, self.stream = engine, stream
        self.mountpoint = repr(engine)

    def send(self, paths, *, rank: int = 0, epoch: int = 0) -> dict:
        return self.engine.hint(paths, rank=rank, epoch=epoch, stream=self.stream)

    def end(self, *, rank: int = 0) -> None:
        self.engine.end_hints(rank=rank, stream=self.stream)

    def close(self) -> None:
        pass


def _reopen(sources, options):
    return Engine(sources, _reopened=True, **options)


def _writable_bytes(buffer) -> memoryview:
    """A flat writable byte view of ``buffer``; a torch tensor through its numpy view."""
    if hasattr(buffer, "numpy") and hasattr(buffer, "is_contiguous"):
        if not buffer.is_contiguous() or buffer.device.type != "cpu":
            raise ValueError("a tensor to read into must be on the CPU and contiguous")
        buffer = buffer.numpy()
    view = memoryview(buffer)
    if view.readonly:
        view.release()
        raise TypeError("the buffer to read into is read-only")
    if not view.c_contiguous:
        view.release()
        raise ValueError("the buffer to read into must be C-contiguous")
    flat = view.cast("B")
    view.release()
    return flat


class _RawFile(io.RawIOBase):
    """One file of an engine as a raw stream: each read is a read of the engine at the position."""

    def __init__(self, engine: Engine, key: bytes) -> None:
        self._engine, self._key = engine, key
        st = engine.stat(key)
        if _stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(21, "is a directory", os.fsdecode(key))
        self._size, self._pos = st.st_size, 0
        self.name = os.fsdecode(key)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self._engine.readinto(self._key, b, self._pos) if self._pos < self._size else 0
        self._pos += n
        return n

    def readall(self) -> bytes:
        data = self._engine.read(self._key, self._pos)
        self._pos += len(data)
        return data

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise OSError(22, "negative seek position")
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos


#: The keyword arguments of ``Engine``: ``packfs.mount``'s that concern the data, with their
#: types and defaults (python/tests/test_engine.py checks they are all ``mount``'s).
_ENGINE_OPTIONS = [
    "cache_size", "stage", "stage_mode", "stage_share", "stage_budget", "stage_rate",
    "chunk_size", "ram_chunks", "lookahead", "lookahead_depth", "io_threads", "endpoint_url",
    "duplicates", "layout", "class_field", "images_dir", "inner_archives", "inner_depth",
    "strip_inner_extension", "inner_max", "save_index",
]


def _signature():
    """``Engine(source, *, <those of mount's options>)``, for help() and editors."""
    from . import mount

    params = inspect.signature(mount).parameters
    return inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
         params["source"]] + [params[name] for name in _ENGINE_OPTIONS]
    )


Engine.__init__.__signature__ = _signature()
