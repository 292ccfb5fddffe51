//! Mounting: FUSE options, the session threads, and a handle to wait for the end of the session.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError};
use fuser::{Config, MountOption, Session, SessionACL};

use std::os::fd::AsFd;

use tracing::warn;

use super::dispatch::{Dispatch, Observer};
use super::reads::Reads;
use super::ring::{self, Rings};
use super::{Core, Owner, PackFs};

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

/// A mounted file system whose session runs on background threads.
pub struct Mounted {
    mountpoint: PathBuf,
    /// The transport in use (after any fallback).
    transport: Transport,
    ended: Receiver<io::Result<()>>,
    thread: Option<JoinHandle<()>>,
}

/// Mounts the file system `core` answers at `mountpoint`. Returns once the kernel handshake is
/// done, so the mount answers requests as soon as this returns.
/// Every request is recorded in `observer`.
pub fn mount(
    core: Arc<Core>,
    mountpoint: &Path,
    opts: &FsOptions,
    observer: Arc<Observer>,
) -> io::Result<Mounted> {
    let uring = opts.transport == Transport::Uring
        && match ring::unavailable() {
            None => true,
            Some(why) => {
                warn!("--transport uring: {why}; serving with the classic loop");
                false
            }
        };
    let (inited, init_done) = crossbeam_channel::bounded(1);
    let dispatch = Arc::new(Dispatch::new(core, observer));
    let reads = Arc::new(Reads::start(
        opts.request_threads(),
        opts.io_threads,
        dispatch.clone(),
    )?);
    let fs = PackFs::new(
        dispatch.clone(),
        opts,
        reads.clone(),
        uring.then_some(inited),
    )?;
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::RO,
        MountOption::NoSuid,
        MountOption::NoDev,
        MountOption::NoAtime,
        MountOption::DefaultPermissions,
        MountOption::FSName(opts.fsname.replace(',', "_")),
        // As a kernel option, not fuser's `Subtype`: that one reaches only fusermount3, so a
        // root mount (made with mount(2) directly) showed as plain `fuse`.
        MountOption::CUSTOM(format!("subtype={SUBTYPE}")),
    ];
    config.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(opts.request_threads());
    let session = Session::new(fs, mountpoint, &config)?;
    // The rings' own descriptor of the connection: fuser closes its own when its loop ends,
    // and a number the rings still used could by then name another file.
    let ring_fd = match uring {
        true => Some(session.as_fd().try_clone_to_owned()?),
        false => None,
    };
    let (tx, ended) = crossbeam_channel::bounded(1);
    let (rings_tx, rings_rx) = crossbeam_channel::bounded::<Option<Rings>>(1);
    let thread = std::thread::Builder::new()
        .name("packfs-session".into())
        .spawn(move || {
            let result = session.run();
            // The queues end with the connection; join them before saying the session ended.
            if let Ok(Some(rings)) = rings_rx.recv() {
                rings.join();
            }
            let _ = tx.send(result);
        })?;
    let rings = ring_fd.and_then(|fd| start_rings(fd, &init_done, dispatch, reads));
    let transport = match rings {
        Some(_) => Transport::Uring,
        None => Transport::Classic,
    };
    let _ = rings_tx.send(rings);
    Ok(Mounted {
        mountpoint: mountpoint.to_path_buf(),
        transport,
        ended,
        thread: Some(thread),
    })
}

/// Starts the rings once INIT is answered, if the kernel agreed to them; logs why not otherwise
/// (the classic loop then serves everything).
fn start_rings(
    fd: std::os::fd::OwnedFd,
    init_done: &Receiver<bool>,
    dispatch: Arc<Dispatch>,
    reads: Arc<Reads>,
) -> Option<Rings> {
    match init_done.recv_timeout(Duration::from_secs(10)) {
        Ok(true) => {}
        Ok(false) => {
            warn!(
                "--transport uring: the kernel did not offer FUSE over io_uring at INIT; serving with the classic loop"
            );
            return None;
        }
        Err(_) => {
            warn!(
                "--transport uring: no INIT from the kernel in 10 s; serving with the classic loop"
            );
            return None;
        }
    }
    match Rings::start(fd, dispatch, reads) {
        Ok(rings) => Some(rings),
        Err(e) => {
            warn!(
                "--transport uring: the kernel refused the rings ({e}); serving with the classic loop"
            );
            None
        }
    }
}

impl Mounted {
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// Waits for the session to end (after an unmount), at most `timeout`. `None` if it has not.
    pub fn wait(&mut self, timeout: Option<Duration>) -> Option<io::Result<()>> {
        let result = match timeout {
            Some(t) => match self.ended.recv_timeout(t) {
                Ok(r) => r,
                Err(RecvTimeoutError::Timeout) => return None,
                Err(RecvTimeoutError::Disconnected) => Err(io::Error::other("session thread died")),
            },
            None => self
                .ended
                .recv()
                .unwrap_or_else(|_| Err(io::Error::other("session thread died"))),
        };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        Some(result)
    }

    /// The channel that yields the session's end, for `select!`.
    pub fn ended(&self) -> &Receiver<io::Result<()>> {
        &self.ended
    }
}
