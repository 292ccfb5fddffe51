//! What the simulated file system was asked: every operation by kind, and the bytes read.
//! Written as JSON to the stats file a few times a second, so a benchmark diffs two snapshots.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Operations that are RPCs to the file system's servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rpc {
    Lookup,
    Getattr,
    Open,
    Release,
    Opendir,
    Readdir,
    Releasedir,
    Readlink,
    Statfs,
    Read,
}

impl Rpc {
    pub const ALL: [Rpc; 10] = [
        Rpc::Lookup,
        Rpc::Getattr,
        Rpc::Open,
        Rpc::Release,
        Rpc::Opendir,
        Rpc::Readdir,
        Rpc::Releasedir,
        Rpc::Readlink,
        Rpc::Statfs,
        Rpc::Read,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Rpc::Lookup => "lookup",
            Rpc::Getattr => "getattr",
            Rpc::Open => "open",
            Rpc::Release => "release",
            Rpc::Opendir => "opendir",
            Rpc::Readdir => "readdir",
            Rpc::Releasedir => "releasedir",
            Rpc::Readlink => "readlink",
            Rpc::Statfs => "statfs",
            Rpc::Read => "read",
        }
    }
}

/// Requests a real client answers itself, without asking a server: counted apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Local {
    /// `isatty()` from Python's open(): TCGETS.
    Ioctl,
    /// A read at or past the end of the file (the client knows the size).
    ReadAtEnd,
    /// The tail of one read the kernel split only because the caller's buffer is not page
    /// aligned (FUSE direct I/O sends at most 256 pages per request): part of the RPC before it.
    SplitTail,
}

#[derive(Default)]
pub struct Stats {
    rpcs: [AtomicU64; Rpc::ALL.len()],
    local: [AtomicU64; 3],
    read_bytes: AtomicU64,
    errors: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
}

impl Stats {
    pub fn rpc(&self, rpc: Rpc) {
        self.rpcs[rpc as usize].fetch_add(1, Relaxed);
    }

    pub fn local(&self, what: Local) {
        self.local[what as usize].fetch_add(1, Relaxed);
    }

    pub fn read_bytes(&self, n: u64) {
        self.read_bytes.fetch_add(n, Relaxed);
    }

    pub fn error(&self) {
        self.errors.fetch_add(1, Relaxed);
    }

    /// An RPC is now waiting for its simulated completion.
    pub fn started(&self) {
        let now = self.in_flight.fetch_add(1, Relaxed) + 1;
        self.max_in_flight.fetch_max(now, Relaxed);
    }

    pub fn finished(&self) {
        self.in_flight.fetch_sub(1, Relaxed);
    }

    pub fn to_json(&self, profile: &serde_json::Value) -> serde_json::Value {
        let mut ops = serde_json::Map::new();
        let mut meta = 0;
        for rpc in Rpc::ALL {
            let n = self.rpcs[rpc as usize].load(Relaxed);
            if rpc != Rpc::Read {
                meta += n;
            }
            ops.insert(rpc.name().into(), n.into());
        }
        serde_json::json!({
            "ops": ops,
            "metadata_ops": meta,
            "data_ops": self.rpcs[Rpc::Read as usize].load(Relaxed),
            "read_bytes": self.read_bytes.load(Relaxed),
            "errors": self.errors.load(Relaxed),
            "local": {
                "ioctl": self.local[Local::Ioctl as usize].load(Relaxed),
                "read_at_end": self.local[Local::ReadAtEnd as usize].load(Relaxed),
                "split_tail": self.local[Local::SplitTail as usize].load(Relaxed),
            },
            "max_in_flight": self.max_in_flight.load(Relaxed),
            "profile": profile,
        })
    }

    /// Replaces `path` atomically (written beside it, then renamed).
    pub fn write(&self, path: &Path, profile: &serde_json::Value) -> std::io::Result<()> {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(&self.to_json(profile))?)?;
        std::fs::rename(tmp, path)
    }
}
