//! `fuser::Filesystem` over the catalog. Every answer but READ comes straight from the immutable
//! catalog; READ goes to the worker pool. This is also the one place that picks errnos.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use fuser::{
    Errno, FileHandle, Filesystem, Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig,
    LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEntry,
    ReplyIoctl, ReplyOpen, ReplyStatfs, Request,
};
use tracing::{debug, info};

use super::attr::{Owner, TTL, attr_of, file_type, id_of, ino_of};
use super::reads::{ReadJob, Reads};
use super::{FsOptions, ReaddirPlus};
use crate::catalog::{Catalog, CatalogError, Entry, EntryId, Kind};
use crate::tiers::FileReader;

/// Bounds on asynchronous reads (readahead) the kernel keeps in flight.
const MAX_BACKGROUND: u16 = 64;

/// One line of a listing: id, entry and name.
type Slot<'a> = (EntryId, &'a Entry, &'a [u8]);

pub struct PackFs {
    catalog: Arc<Catalog>,
    reads: Reads,
    owner: Owner,
    readdirplus: ReaddirPlus,
}

impl PackFs {
    pub fn new(
        catalog: Arc<Catalog>,
        files: Arc<FileReader>,
        opts: &FsOptions,
    ) -> std::io::Result<Self> {
        let reads = Reads::start(
            opts.request_threads(),
            opts.io_threads,
            catalog.clone(),
            files,
        )?;
        let owner = Owner {
            uid: opts.uid.unwrap_or_else(|| nix::unistd::geteuid().as_raw()),
            gid: opts.gid.unwrap_or_else(|| nix::unistd::getegid().as_raw()),
        };
        Ok(PackFs {
            catalog,
            reads,
            owner,
            readdirplus: opts.readdirplus,
        })
    }

    fn entry(&self, ino: INodeNo) -> Result<(EntryId, &Entry), CatalogError> {
        let id = id_of(ino).ok_or(CatalogError::NotFound)?;
        Ok((id, self.catalog.entry(id)?))
    }

    /// The entry and name at `slot` of a listing: "." is 0, ".." is 1, child `i` is `2 + i`. The
    /// readdir offset handed to the kernel for a slot is `slot + 1`, where the next call resumes.
    fn dir_slot<'a>(
        &'a self,
        dir_id: EntryId,
        dir: &'a Entry,
        slot: u64,
    ) -> Result<Option<Slot<'a>>, CatalogError> {
        let (id, name) = match slot {
            0 => (dir_id, b".".as_slice()),
            1 => (dir.parent, b"..".as_slice()),
            _ => {
                let Some(child) = self.catalog.children(dir).nth((slot - 2) as usize) else {
                    return Ok(None);
                };
                (child, self.catalog.name(self.catalog.entry(child)?)?)
            }
        };
        Ok(Some((id, self.catalog.entry(id)?, name)))
    }
}

/// The one mapping from catalog errors to errnos: a damaged index chunk (logged where it was
/// found) fails the request rather than answering wrongly.
fn errno(err: CatalogError) -> Errno {
    match err {
        CatalogError::NotFound => Errno::ENOENT,
        CatalogError::Damaged { .. } => Errno::EIO,
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
        let found = self.entry(parent).and_then(|(parent_id, dir)| {
            if !dir.is_dir() {
                return Ok(None);
            }
            let id = self.catalog.lookup(parent_id, name.as_bytes())?;
            Ok(Some((id, self.catalog.entry(id)?)))
        });
        match found {
            Ok(Some((id, e))) => reply.entry(&TTL, &attr_of(id, e, self.owner), Generation(0)),
            Ok(None) => reply.error(Errno::ENOTDIR),
            Err(err) => reply.error(errno(err)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.entry(ino) {
            Ok((id, e)) => reply.attr(&TTL, &attr_of(id, e, self.owner)),
            Err(err) => reply.error(errno(err)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.entry(ino) {
            Ok((_, e)) if e.kind() == Kind::Symlink => match self.catalog.symlink_target(e) {
                Ok(target) => reply.data(target),
                Err(err) => reply.error(errno(err)),
            },
            Ok(_) => reply.error(Errno::EINVAL),
            Err(err) => reply.error(errno(err)),
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
        let (id, e) = match self.entry(ino) {
            Ok(found) => found,
            Err(err) => return reply.error(errno(err)),
        };
        match e.kind() {
            Kind::File => {}
            Kind::Dir => return reply.error(Errno::EISDIR),
            Kind::Symlink => return reply.error(Errno::EINVAL),
        }
        if offset >= e.size || size == 0 {
            return reply.data(&[]);
        }
        let len = (e.size - offset).min(size as u64) as usize;
        self.reads.submit(ReadJob {
            id,
            offset,
            len,
            reply,
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let (dir_id, dir) = match self.entry(ino) {
            Ok(found) => found,
            Err(err) => return reply.error(errno(err)),
        };
        if !dir.is_dir() {
            return reply.error(Errno::ENOTDIR);
        }
        let mut slot = offset;
        loop {
            match self.dir_slot(dir_id, dir, slot) {
                Ok(Some((id, e, name))) => {
                    if reply.add(ino_of(id), slot + 1, file_type(e), OsStr::from_bytes(name)) {
                        break;
                    }
                }
                Ok(None) => break,
                // What was added so far is good; the next call starts at the damaged slot.
                Err(err) if slot == offset => return reply.error(errno(err)),
                Err(_) => break,
            }
            slot += 1;
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let (dir_id, dir) = match self.entry(ino) {
            Ok(found) => found,
            Err(err) => return reply.error(errno(err)),
        };
        if !dir.is_dir() {
            return reply.error(Errno::ENOTDIR);
        }
        let mut slot = offset;
        loop {
            match self.dir_slot(dir_id, dir, slot) {
                Ok(Some((id, e, name))) => {
                    let attr = attr_of(id, e, self.owner);
                    let name = OsStr::from_bytes(name);
                    if reply.add(ino_of(id), slot + 1, name, &TTL, &attr, Generation(0)) {
                        break;
                    }
                }
                Ok(None) => break,
                Err(err) if slot == offset => return reply.error(errno(err)),
                Err(_) => break,
            }
            slot += 1;
        }
        reply.ok();
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
        let blocks = self.catalog.file_bytes().div_ceil(BSIZE as u64);
        let files = self.catalog.len() as u64;
        debug!(blocks, files, "statfs");
        reply.statfs(blocks, 0, 0, files, 0, BSIZE, 255, BSIZE);
    }
}
