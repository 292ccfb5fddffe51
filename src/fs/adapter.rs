//! `fuser::Filesystem` over the core: decode each request, ask `Core`, encode the reply. Errors
//! go through `failed`, which logs what is worth logging and takes the errno from `Error::errno`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Sender;

use fuser::{
    Errno, FileHandle, Filesystem, Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig,
    LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEntry,
    ReplyIoctl, ReplyOpen, ReplyStatfs, Request,
};
use tracing::{debug, error, info};

use super::attr::{TTL, file_attr, file_type};
use super::core::{Core, DirEntry, Listing};
use super::error::{Error, guarded};
use super::reads::{ReadJob, ReadReply, Reads};
use super::requests::{Op, Requests};
use super::trace::Trace;
use super::{FsOptions, ReaddirPlus};

/// Asynchronous reads (readahead) the kernel keeps in flight. Above the number of reads that may
/// be stuck in a slow region at once: at 64, 80 reads stalled in one region held every slot and
/// reads elsewhere waited for them (tests/isolation.rs); the read pool grows to serve them.
const MAX_BACKGROUND: u16 = 256;

pub struct PackFs {
    core: Arc<Core>,
    reads: Reads,
    readdirplus: ReaddirPlus,
    observer: Arc<Observer>,
    /// With `--transport uring`: told at INIT whether the kernel agreed to the rings.
    uring: Option<Sender<bool>>,
}

/// Where every answered request is recorded: the counters always, the trace with `--trace`.
#[derive(Default)]
pub struct Observer {
    pub requests: Arc<Requests>,
    pub trace: Option<Trace>,
}

impl Observer {
    /// Records a request that started at `started` and replied `result` (bytes, or an errno).
    #[allow(clippy::too_many_arguments)]
    pub fn done(
        &self,
        op: Op,
        ino: u64,
        name: Option<&[u8]>,
        offset: u64,
        size: u32,
        started: Instant,
        result: Result<u32, Errno>,
    ) {
        let failed = result.is_err_and(|e| super::requests::counts_as_error(e.code()));
        let bytes = *result.as_ref().unwrap_or(&0) as u64;
        self.requests.record(op, started, bytes, failed);
        if let Some(trace) = &self.trace {
            let result = result.map_err(|e| e.code());
            trace.record(op, ino, name, offset, size, started, result);
        }
    }
}

impl PackFs {
    pub fn new(
        core: Arc<Core>,
        opts: &FsOptions,
        observer: Arc<Observer>,
        uring: Option<Sender<bool>>,
    ) -> std::io::Result<Self> {
        let reads = Reads::start(
            opts.request_threads(),
            opts.io_threads,
            core.clone(),
            observer.clone(),
        )?;
        Ok(PackFs {
            core,
            reads,
            readdirplus: opts.readdirplus,
            observer,
            uring,
        })
    }

    /// One listing for READDIR and READDIRPLUS.
    fn list(&self, ino: INodeNo, offset: u64, with_attrs: bool, mut reply: impl DirReply) {
        let started = Instant::now();
        let listed = guarded(
            || format!("listing of inode {}", ino.0),
            || self.core.list(ino.0, offset, with_attrs, &mut reply),
        );
        let op = if with_attrs {
            Op::Readdirplus
        } else {
            Op::Readdir
        };
        let result = match listed {
            Ok(()) => {
                reply.ok();
                Ok(0)
            }
            Err(e) => {
                let errno = failed(e);
                reply.error(errno);
                Err(errno)
            }
        };
        self.observer
            .done(op, ino.0, None, offset, 0, started, result);
    }

    /// Records a request with no offset or size.
    fn done(
        &self,
        op: Op,
        ino: INodeNo,
        name: Option<&[u8]>,
        started: Instant,
        result: Result<u32, Errno>,
    ) {
        self.observer.done(op, ino.0, name, 0, 0, started, result);
    }
}

/// The errno of a failed request, logged when the failure is the data's rather than the caller's.
pub(super) fn failed(err: Error) -> Errno {
    if err.is_worth_logging() && super::error_log::global().admit(&err.log_key(), Instant::now()) {
        match &err {
            Error::Io {
                image,
                offset,
                path,
                file_offset,
                len,
                error,
            } => error!(
                image = %image.display(),
                offset,
                file_offset,
                len,
                path = %String::from_utf8_lossy(path),
                "read failed, returning EIO: {error}"
            ),
            other => error!("request failed, returning EIO: {other}"),
        }
    } else {
        debug!("request failed: {err}");
    }
    Errno::from_i32(err.errno())
}

/// Any reply that can fail with an errno.
trait ErrorReply {
    fn error(self, errno: Errno);
}

macro_rules! error_reply {
    ($($t:ty),*) => {$(
        impl ErrorReply for $t {
            fn error(self, errno: Errno) {
                <$t>::error(self, errno)
            }
        }
    )*};
}
error_reply!(ReplyEntry, ReplyAttr, ReplyData);

/// Fails `reply` with `errno`, and returns it for the observer.
fn reply_error(reply: impl ErrorReply, errno: Errno) -> Result<u32, Errno> {
    reply.error(errno);
    Err(errno)
}

/// A FUSE directory reply: a `Listing` that is finished with `ok` or `error`.
trait DirReply: Listing {
    fn ok(self);
    fn error(self, errno: Errno);
}

impl Listing for ReplyDirectory {
    fn add(&mut self, e: DirEntry) -> bool {
        let name = OsStr::from_bytes(e.name);
        ReplyDirectory::add(self, INodeNo(e.ino), e.next, file_type(e.kind), name)
    }
}

impl DirReply for ReplyDirectory {
    fn ok(self) {
        ReplyDirectory::ok(self)
    }
    fn error(self, errno: Errno) {
        ReplyDirectory::error(self, errno)
    }
}

impl Listing for ReplyDirectoryPlus {
    fn add(&mut self, e: DirEntry) -> bool {
        let attr = file_attr(&e.attr.expect("a listing with attributes"));
        let name = OsStr::from_bytes(e.name);
        ReplyDirectoryPlus::add(
            self,
            INodeNo(e.ino),
            e.next,
            name,
            &TTL,
            &attr,
            Generation(0),
        )
    }
}

impl DirReply for ReplyDirectoryPlus {
    fn ok(self) {
        ReplyDirectoryPlus::ok(self)
    }
    fn error(self, errno: Errno) {
        ReplyDirectoryPlus::error(self, errno)
    }
}

impl Filesystem for PackFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let mut flags = vec![
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_CACHE_SYMLINKS,
        ];
        match self.readdirplus {
            ReaddirPlus::Never => {}
            ReaddirPlus::Auto => flags.extend([
                InitFlags::FUSE_DO_READDIRPLUS,
                InitFlags::FUSE_READDIRPLUS_AUTO,
            ]),
            ReaddirPlus::Always => flags.push(InitFlags::FUSE_DO_READDIRPLUS),
        }
        // One flag at a time: `add_capabilities` adds nothing if any bit is unsupported.
        for flag in flags {
            if config.add_capabilities(flag).is_err() {
                info!("kernel does not offer {flag:?}");
            }
        }
        let _ = config.set_max_background(MAX_BACKGROUND);
        let _ = config.set_congestion_threshold(MAX_BACKGROUND * 3 / 4);
        if let Some(agreed) = self.uring.take() {
            let offered = config
                .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
                .is_ok();
            if offered {
                // Every ring entry's payload buffer is `max_write` long: 1 MiB, not fuser's 16.
                let _ = config.set_max_write(super::ring::MAX_PAYLOAD);
            }
            let _ = agreed.send(offered);
        }
        Ok(())
    }

    fn destroy(&mut self) {
        self.reads.shutdown();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let started = Instant::now();
        let found = guarded(
            || format!("lookup of {name:?} in inode {}", parent.0),
            || self.core.lookup(parent.0, name.as_bytes()),
        );
        let result = match found {
            Ok(attr) => {
                reply.entry(&TTL, &file_attr(&attr), Generation(0));
                Ok(0)
            }
            Err(e) => reply_error(reply, failed(e)),
        };
        self.done(Op::Lookup, parent, Some(name.as_bytes()), started, result);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let started = Instant::now();
        let result = match guarded(
            || format!("getattr of inode {}", ino.0),
            || self.core.getattr(ino.0),
        ) {
            Ok(attr) => {
                reply.attr(&TTL, &file_attr(&attr));
                Ok(0)
            }
            Err(e) => reply_error(reply, failed(e)),
        };
        self.done(Op::Getattr, ino, None, started, result);
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let started = Instant::now();
        let result = match guarded(
            || format!("readlink of inode {}", ino.0),
            || self.core.readlink(ino.0),
        ) {
            Ok(target) => {
                let len = target.len() as u32;
                reply.data(target);
                Ok(len)
            }
            Err(e) => reply_error(reply, failed(e)),
        };
        self.done(Op::Readlink, ino, None, started, result);
    }

    /// ENOSYS makes the kernel stop sending OPEN and RELEASE for good and keep every file's pages
    /// cached across opens (FOPEN_KEEP_CACHE): one round trip less per sample.
    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let started = Instant::now();
        reply.error(Errno::ENOSYS);
        self.done(Op::Open, ino, None, started, Err(Errno::ENOSYS));
    }

    /// As for `open`: no OPENDIR/RELEASEDIR, and listings cached by the kernel (FOPEN_CACHE_DIR).
    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let started = Instant::now();
        reply.error(Errno::ENOSYS);
        self.done(Op::Opendir, ino, None, started, Err(Errno::ENOSYS));
    }

    /// Nothing to flush in a read-only file system: ENOSYS makes the kernel stop sending FLUSH
    /// at every close (and fuser's default would log a warning for it).
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: fuser::ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.reads.submit(ReadJob {
            ino: ino.0,
            offset,
            size,
            reply: ReadReply::Fuse(reply),
            started: Instant::now(),
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        self.list(ino, offset, false, reply);
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        self.list(ino, offset, true, reply);
    }

    /// Python's `open()` asks every file `isatty()` (TCGETS), which FUSE forwards on every open and
    /// does not stop asking after a refusal: answer at once, without fuser's default warning.
    fn ioctl(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        let started = Instant::now();
        reply.error(Errno::ENOTTY);
        self.done(Op::Ioctl, ino, None, started, Err(Errno::ENOTTY));
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        let started = Instant::now();
        use super::attr::{NAME_MAX, STATFS_BSIZE};
        let (blocks, files) = super::attr::statfs_figures(self.core.usage());
        debug!(blocks, files, "statfs");
        reply.statfs(blocks, 0, 0, files, 0, STATFS_BSIZE, NAME_MAX, STATFS_BSIZE);
        self.done(Op::Statfs, ino, None, started, Ok(0));
    }
}
