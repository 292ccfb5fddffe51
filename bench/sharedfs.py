"""A real shared file system as bench/pfs.py's storage, in place of the simulator: MooseFS started
by bench/sharedfs.sh (servers in a network namespace, FUSE client on the host), the dataset copied
onto it, the metadata server's own operation counters read before and after each pass.

The counters come in the simulator's shape ({"ops": {kind: count}, "read_bytes": n}) so pfs.py's
tables serve both (bench/sharedfs.sh keeps the counts across the master's hourly resets).
MooseFS's master counts, per mount: statfs, getattr, setattr, lookup, mkdir,
rmdir, symlink, readlink, mknod, unlink, rename, link, readdir, open, read, write. Its `read` is
the client asking where a chunk's data lies (the master's share of a read, not one per read
syscall); the bytes are what the client process received (its rchar), which the chunkserver sent.
"""
import json, os, shutil, subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "sharedfs.sh")
# The simulator's kinds that pfs.py sums as metadata, and its reads, all present.
KINDS = ("lookup", "getattr", "open", "release", "opendir", "readdir", "releasedir", "readlink",
         "statfs", "read")


def sharedfs(*args):
    out = subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"sharedfs.sh {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


class MooseFs:
    """The dataset (tree, tar shards, squashfs image) on a MooseFS instance of its own; the same
    interface as pfs.py's Pfs (path, counters, stop, index)."""

    def __init__(self, ds, work, packfs, instance=250, keep=False):
        name = os.path.basename(ds)
        self.dir = os.path.join(work, f"moosefs-{name}")
        self.mnt = os.path.join(self.dir, "mnt")
        self.index = self.path(f"{name}.packfs-index")
        self.keep = keep
        # An instance a run kept (`keep`), still mounted with the whole dataset, is used again.
        if not (os.path.ismount(self.mnt) and os.path.exists(self.path(".complete"))):
            sharedfs("up", "moosefs", self.dir, str(instance))
            print(f"copying {name} onto MooseFS ({self.mnt})", flush=True)
            shutil.copytree(os.path.join(ds, "tree"), self.path("tree"))
            os.makedirs(self.path("shards"))
            for s in sorted(os.listdir(os.path.join(ds, "shards"))):
                if s.endswith(".tar"):
                    shutil.copy(os.path.join(ds, "shards", s), self.path("shards"))
            shutil.copy(os.path.join(ds, "image.sqfs"), self.mnt)
            shards = sorted(self.path("shards", s) for s in os.listdir(self.path("shards")))
            subprocess.run([packfs, "index", "-q", "-o", self.index, *shards], check=True)
            open(self.path(".complete"), "w").close()
        self.client = client_pid(self.mnt)

    def path(self, *p):
        return os.path.join(self.mnt, *p)

    def counters(self):
        """The master's operations since the instance came up, and the bytes the client
        received."""
        ops = json.loads(sharedfs("ops", "moosefs", self.dir))
        with open(f"/proc/{self.client}/io") as f:
            io = dict(line.split(": ") for line in f.read().splitlines())
        return {"ops": {k: ops.get(k, 0) for k in KINDS}, "read_bytes": int(io["rchar"]),
                "all_ops": ops}

    def stop(self):
        if self.keep:
            return
        sharedfs("down", "moosefs", self.dir)
        shutil.rmtree(self.dir, ignore_errors=True)


def client_pid(mnt):
    """The mfsmount process serving `mnt` (it names its mount point in its command line)."""
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if cmd.startswith("mfsmount") and mnt in cmd:
            return int(pid)
    raise RuntimeError(f"no mfsmount process serves {mnt}")
