"""A read-only fsspec filesystem over an in-process ``packfs.Engine``, registered as
``packfs`` (the wheel's ``fsspec.specs`` entry point; importing this module registers it too):

    import fsspec
    fs = fsspec.filesystem("packfs", source="/gpfs/datasets/imagenet/train.packfs-index")
    fs.ls("train")
    with fsspec.open("packfs://train/n01440764/x.JPEG::s3://bucket/train.packfs-index") as f:
        data = f.read()

In a chained URL, the part after ``::`` is the dataset (its index, an image, or a glob of
them: a local path, ``s3://`` or ``http(s)://``), which packfs opens with its own readers (one
engine per dataset and options, shared by every instance fsspec makes for them). Keyword
arguments other than ``source`` are ``packfs.Engine``'s.
"""

from __future__ import annotations

import os

from fsspec import register_implementation
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

from .engine import Engine

__all__ = ["PackfsFileSystem"]

_TYPES = {"f": "file", "d": "directory", "l": "link"}


class PackfsFileSystem(AbstractFileSystem):
    """A dataset's files by path (relative to its root), read through packfs's engine."""

    protocol = "packfs"
    root_marker = ""

    def __init__(self, fo=None, *, source=None, target_protocol=None, target_options=None,
                 engine=None, **engine_options):
        super().__init__(fo=fo, source=source, target_protocol=target_protocol,
                         target_options=target_options, **engine_options)
        if engine is not None:
            self.engine = engine
            return
        dataset = source if source is not None else fo
        if not dataset:
            raise ValueError(
                "packfs: which dataset? Give source=... (an index, images or their URL), or "
                "chain it: packfs://PATH::s3://bucket/train.packfs-index"
            )
        if isinstance(dataset, str) and target_protocol not in (None, "file", "local") \
                and "://" not in dataset:
            dataset = f"{target_protocol}://{dataset}"
        if target_options and "endpoint_url" in (target_options.get("client_kwargs") or {}):
            engine_options.setdefault("endpoint_url", target_options["client_kwargs"]["endpoint_url"])
        self.engine = Engine(dataset, **engine_options)

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = os.fsdecode(path).split("::", 1)[0]
        if path.startswith("packfs://"):
            path = path[len("packfs://"):]
        return path.strip("/")

    @staticmethod
    def _get_kwargs_from_urls(path):
        return {}

    def _info(self, path, name):
        st = self.engine.stat(path, follow_symlinks=False)
        kind = {0o040000: "d", 0o100000: "f", 0o120000: "l"}[st.st_mode & 0o170000]
        info = {"name": name, "size": st.st_size, "type": _TYPES[kind],
                "mode": st.st_mode, "mtime": st.st_mtime, "ino": st.st_ino}
        if kind == "l":
            info["destination"] = self.engine.readlink(path)
            try:
                target = self.engine.stat(path)
                info["size"] = target.st_size
                info["type"] = "directory" if target.st_mode & 0o040000 else "file"
            except OSError:
                pass
        return info

    def info(self, path, **kwargs):
        path = self._strip_protocol(path)
        return self._info(path, path)

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        if not self.engine.isdir(path):
            # fsspec's ls of a file lists the file itself.
            return [self.info(path)] if detail else [path]
        names = [f"{path}/{n}" if path else n for n in self.engine.listdir(path)]
        if not detail:
            return names
        return [self._info(n, n) for n in names]

    def cat_file(self, path, start=None, end=None, **kwargs):
        path = self._strip_protocol(path)
        size = None
        if (start is not None and start < 0) or (end is not None and end < 0):
            size = self.engine.stat(path).st_size
        start = 0 if start is None else (max(size + start, 0) if start < 0 else start)
        if end is None:
            return self.engine.read(path, start)
        if end < 0:
            end = size + end
        return self.engine.read(path, start, max(end - start, 0))

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None,
              **kwargs):
        if mode != "rb":
            raise PermissionError(f"packfs: {path} is read-only (mode {mode!r})")
        return PackfsFile(self, path, mode, block_size=block_size or "default",
                          cache_options=cache_options, **kwargs)

    def ukey(self, path):
        info = self.info(path)
        return f"{info['ino']}-{info['size']}-{info['mtime']}"

    def _readonly(self, *args, **kwargs):
        raise PermissionError("packfs: the dataset is read-only")

    mkdir = makedirs = rm = rm_file = _rm = rmdir = mv = cp_file = put_file = pipe_file = touch = _readonly


class PackfsFile(AbstractBufferedFile):
    """A file of the dataset; its ranges are read through the engine."""

    def _fetch_range(self, start, end):
        return self.fs.engine.read(self.path, start, max(end - start, 0))


register_implementation("packfs", PackfsFileSystem, clobber=True)
