"""A real shared file system as bench/pfs.py's storage, in place of the simulator: MooseFS,
GlusterFS or CephFS started by bench/sharedfs.sh (servers in a network namespace, FUSE client on
the host), the dataset copied onto it, the servers' own operation counters read before and after
each pass.

The counters come in the simulator's shape ({"ops": {kind: count}, "read_bytes": n}) so pfs.py's
tables serve all. The bytes are what the client process received (its rchar), which the data
servers sent. What counts as a metadata operation:
  - MooseFS: its master's counts for the mount (statfs, getattr, lookup, readdir, open, ...;
    bench/sharedfs.sh keeps them across the master's hourly resets). Its `read` is the client
    asking where a chunk's data lies, counted as reads, not metadata.
  - GlusterFS: there is no metadata server; the brick counts every operation, and all but READ
    and WRITE (lookup, stat, fstat, open, flush, release, getxattr, ...) are metadata (`meta`).
  - CephFS: the MDS's client requests (lookup, getattr, open, readdir, ...); reads go to the OSD
    and are not counted by it.
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


class SharedFs:
    """The dataset (tree, tar shards, squashfs image) on an instance of `kind` of its own; the
    same interface as pfs.py's Pfs (path, counters, stop, index)."""

    def __init__(self, kind, ds, work, packfs, instance=250, keep=False):
        name = os.path.basename(ds)
        self.kind = kind
        self.dir = os.path.join(work, f"{kind}-{name}")
        self.mnt = os.path.join(self.dir, "mnt")
        self.index = self.path(f"{name}.packfs-index")
        self.keep = keep
        # An instance a run kept (`keep`), still mounted with the whole dataset, is used again.
        if not (os.path.ismount(self.mnt) and os.path.exists(self.path(".complete"))):
            sharedfs("up", kind, self.dir, str(instance))
            print(f"copying {name} onto {kind} ({self.mnt})", flush=True)
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
        """The servers' operations since the instance came up, and the bytes the client
        received."""
        ops = json.loads(sharedfs("ops", self.kind, self.dir))
        with open(f"/proc/{self.client}/io") as f:
            io = dict(line.split(": ") for line in f.read().splitlines())
        out = {"ops": {k: ops.get(k, 0) for k in KINDS}, "read_bytes": int(io["rchar"]),
               "all_ops": ops}
        if self.kind != "moosefs":
            # Every operation the servers count but reads and writes is metadata.
            out["meta"] = ops["total"]
        return out

    def stop(self):
        if self.keep:
            return
        sharedfs("down", self.kind, self.dir)
        shutil.rmtree(self.dir, ignore_errors=True)


CLIENTS = ("mfsmount", "glusterfs", "/usr/sbin/glusterfs", "ceph-fuse")


def client_pid(mnt):
    """The FUSE client process serving `mnt` (each names its mount point in its command line)."""
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if cmd.split(" ")[0] in CLIENTS and mnt in cmd:
            return int(pid)
    raise RuntimeError(f"no FUSE client process serves {mnt}")
