//! How to mount: the options of a mount's file system (threads, transport, ownership, listings),
//! apart from the session that mounts, so the transports and the session both read them without
//! reading each other.

use super::core::Owner;

/// Whether directory listings carry attributes (FUSE READDIRPLUS).
///
/// Measured on 2 million files: with attributes, the kernel creates an inode for every listed
/// entry (about 5 µs each), so `find` or `os.walk` take 7x longer than without, while a following
/// stat of every file costs nothing more; without them, each first stat or open of a file costs
/// one LOOKUP round trip instead. See docs/benchmarks.md.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReaddirPlus {
    /// Names only: fastest for find, os.walk and ImageFolder scans; each file's first stat or
    /// open asks the daemon once.
    #[default]
    Never,
    /// The kernel's heuristic: attributes at least for the first part of every listing.
    Auto,
    /// Always attributes: fastest for stat-heavy walks (ls -l, du, rsync).
    Always,
}

/// How requests travel between the kernel and packfs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// read(2) and write(2) on /dev/fuse by `threads` request threads.
    #[default]
    Classic,
    /// FUSE over io_uring (Linux 6.14+, fuse's `enable_uring` = Y): per-CPU rings, no system
    /// call per request. Falls back to `Classic`, with a log line, where the kernel lacks it.
    Uring,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Classic => "classic",
            Transport::Uring => "uring",
        }
    }
}

/// The file system type's suffix: /proc/mounts shows `fuse.packfs`, and `packfs umount` touches
/// only mounts of that type.
pub const SUBTYPE: &str = "packfs";

/// FUSE request threads by default.
pub const DEFAULT_THREADS: usize = 4;
/// Read workers by default.
pub const DEFAULT_IO_THREADS: usize = 16;

#[derive(Clone, Debug)]
pub struct FsOptions {
    /// Threads reading FUSE requests; all but one of them may also serve reads inline.
    pub threads: usize,
    /// Threads serving the reads that would otherwise occupy the last free request thread.
    pub io_threads: usize,
    /// Let users other than the mounting one read the tree.
    pub allow_other: bool,
    /// Shown as the source in /proc/mounts: the dataset (index or images).
    pub fsname: String,
    /// Owner and group shown for every entry; the mounting user's by default.
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub readdirplus: ReaddirPlus,
    pub transport: Transport,
}

impl Default for FsOptions {
    fn default() -> Self {
        FsOptions {
            threads: DEFAULT_THREADS,
            io_threads: DEFAULT_IO_THREADS,
            allow_other: false,
            fsname: "packfs".into(),
            uid: None,
            gid: None,
            readdirplus: ReaddirPlus::default(),
            transport: Transport::default(),
        }
    }
}

impl FsOptions {
    /// FUSE request threads actually started (at least one); the inline-read limit derives from it.
    pub fn request_threads(&self) -> usize {
        self.threads.max(1)
    }

    /// The owner shown for every entry: `uid`/`gid`, else this process's user.
    pub fn owner(&self) -> Owner {
        Owner {
            uid: self.uid.unwrap_or_else(|| nix::unistd::geteuid().as_raw()),
            gid: self.gid.unwrap_or_else(|| nix::unistd::getegid().as_raw()),
        }
    }
}
