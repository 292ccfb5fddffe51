//! `fuser::Filesystem` over the core: decode each request, ask `Core`, encode the reply. Errors
//! go through `failed`, which logs what is worth logging and takes the errno from `Error::errno`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use fuser::{
    Errno, FileHandle, Filesystem, Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig,
    LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEntry,
    ReplyIoctl, ReplyOpen, ReplyStatfs, Request,
};
use tracing::{debug, error, info};

use super::attr::{TTL, file_attr, file_type};
use super::core::{Core, DirEntry, Listing};
use super::error::{Error, guarded};
use super::reads::{ReadJob, Reads};
use super::{FsOptions, ReaddirPlus};

/// Asynchronous reads (readahead) the kernel keeps in flight. Above the number of reads that may
/// be stuck in a slow region at once: at 64, 80 reads stalled in one region held every slot and
/// reads elsewhere waited for them (tests/isolation.rs); the read pool grows to serve them.
const MAX_BACKGROUND: u16 = 256;

pub struct PackFs {
    core: Arc<Core>,
    reads: Reads,
    readdirplus: ReaddirPlus,
}

impl PackFs {
    pub fn new(core: Arc<Core>, opts: &FsOptions) -> std::io::Result<Self> {
        let reads = Reads::start(opts.request_threads(), opts.io_threads, core.clone())?;
        Ok(PackFs {
            core,
            reads,
            readdirplus: opts.readdirplus,
        })
    }

    /// One listing for READDIR and READDIRPLUS.
    fn list(&self, ino: INodeNo, offset: u64, with_attrs: bool, mut reply: impl DirReply) {
        let listed = guarded(
            || format!("listing of inode {}", ino.0),
            || self.core.list(ino.0, offset, with_attrs, &mut reply),
        );
        match listed {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(failed(e)),
        }
    }
}

/// The errno of a failed request, logged when the failure is the data's rather than the caller's.
pub(super) fn failed(err: Error) -> Errno {
    if err.is_worth_logging() {
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
        Ok(())
    }

    fn destroy(&mut self) {
        self.reads.shutdown();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = guarded(
            || format!("lookup of {name:?} in inode {}", parent.0),
            || self.core.lookup(parent.0, name.as_bytes()),
        );
        match found {
            Ok(attr) => reply.entry(&TTL, &file_attr(&attr), Generation(0)),
            Err(e) => reply.error(failed(e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match guarded(
            || format!("getattr of inode {}", ino.0),
            || self.core.getattr(ino.0),
        ) {
            Ok(attr) => reply.attr(&TTL, &file_attr(&attr)),
            Err(e) => reply.error(failed(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match guarded(
            || format!("readlink of inode {}", ino.0),
            || self.core.readlink(ino.0),
        ) {
            Ok(target) => reply.data(target),
            Err(e) => reply.error(failed(e)),
        }
    }

    /// ENOSYS makes the kernel stop sending OPEN and RELEASE for good and keep every file's pages
    /// cached across opens (FOPEN_KEEP_CACHE): one round trip less per sample.
    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.error(Errno::ENOSYS);
    }

    /// As for `open`: no OPENDIR/RELEASEDIR, and listings cached by the kernel (FOPEN_CACHE_DIR).
    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
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
            reply,
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
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        const BSIZE: u32 = 4096;
        let usage = self.core.usage();
        let blocks = usage.bytes.div_ceil(BSIZE as u64);
        debug!(blocks, files = usage.entries, "statfs");
        reply.statfs(blocks, 0, 0, usage.entries, 0, BSIZE, 255, BSIZE);
    }
}
