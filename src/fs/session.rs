//! Mounting: FUSE options, the session threads, and a handle to wait for the end of the session.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError};
use fuser::{Config, MountOption, Session, SessionACL};

use std::os::fd::AsFd;

use tracing::{debug, warn};

use super::dispatch::{Dispatch, Observer};
use super::options::{FsOptions, SUBTYPE, Transport};
use super::reads::Reads;
use super::ring::{self, Rings};
use super::splice::{self, Splicer};
use super::{Core, PackFs};

/// A mounted file system whose session runs on background threads.
pub struct Mounted {
    mountpoint: PathBuf,
    /// The transport in use (after any fallback).
    transport: Transport,
    max_read: Option<u32>,
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
    // Splicing needs READs a pipe carries whole; a mount that never splices keeps 1 MiB ones.
    let may_splice = !uring && core.may_splice();
    if !uring && !may_splice {
        debug!("no image's bytes can be spliced (compressed, staged, or not on a local disk)");
    }
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
    let splice_limit = may_splice.then(splice::reply_limit).flatten();
    let max_read = splice_limit.filter(|&l| l < splice::LARGEST_READ);
    if let Some(limit) = max_read {
        // READs a pipe can carry whole (`splice`).
        config
            .mount_options
            .push(MountOption::CUSTOM(format!("max_read={limit}")));
    }
    let splicer = fs.splicer_slot();
    let session = Session::new(fs, mountpoint, &config)?;
    if splice_limit.is_some() {
        let _ = splicer.set(Arc::new(Splicer::new(session.as_fd())?));
    }
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
        max_read,
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

    /// The largest READ the kernel was asked to send, if capped (`splice`).
    pub fn max_read(&self) -> Option<u32> {
        self.max_read
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
