//! The classic transport: `fuser::Filesystem` on /dev/fuse. Each request is decoded and handed
//! to `Dispatch` with fuser's reply, which the traits below encode; guards, errnos and recording
//! are the dispatcher's. READ goes to `Reads` (inline, or the pool when request threads are busy).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use crossbeam_channel::Sender;

use fuser::{
    Errno, FileHandle, Filesystem, Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig,
    LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyIoctl, ReplyOpen, ReplyStatfs, Request,
};
use tracing::info;

use super::attr::{NAME_MAX, STATFS_BSIZE, TTL, file_attr, file_type};
use super::core::{Attr, DirEntry, Listing};
use super::dispatch::{
    AttrReply, DataReply, DirReply, Dispatch, EntryReply, ReadCall, Reply, StatfsReply,
};
use super::error::Refused;
use super::options::{FsOptions, ReaddirPlus};
use super::reads::{ReadJob, Reads};
use super::splice::{Spliced, Splicer};
use crate::tiers::FileRange;

/// Asynchronous reads (readahead) the kernel keeps in flight. Above the number of reads that may
/// be stuck in a slow region at once: at 64, 80 reads stalled in one region held every slot and
/// reads elsewhere waited for them (tests/isolation.rs); the read pool grows to serve them.
const MAX_BACKGROUND: u16 = 256;

pub struct PackFs {
    dispatch: Arc<Dispatch>,
    reads: Arc<Reads>,
    readdirplus: ReaddirPlus,
    /// With `--transport uring`: told at INIT whether the kernel agreed to the rings.
    uring: Option<Sender<bool>>,
    /// Set once the session is open (`session::mount`): READ replies spliced through it.
    splicer: Arc<OnceLock<Arc<Splicer>>>,
}

impl PackFs {
    pub fn new(
        dispatch: Arc<Dispatch>,
        opts: &FsOptions,
        reads: Arc<Reads>,
        uring: Option<Sender<bool>>,
    ) -> std::io::Result<Self> {
        Ok(PackFs {
            dispatch,
            reads,
            readdirplus: opts.readdirplus,
            uring,
            splicer: Arc::default(),
        })
    }

    /// Where the session's splicer goes once the session is open.
    pub fn splicer_slot(&self) -> Arc<OnceLock<Arc<Splicer>>> {
        self.splicer.clone()
    }
}

macro_rules! error_reply {
    ($($t:ty),*) => {$(
        impl Reply for $t {
            fn error(self, errno: i32) {
                <$t>::error(self, Errno::from_i32(errno))
            }
        }
    )*};
}
error_reply!(
    ReplyEntry,
    ReplyAttr,
    ReplyData,
    ReplyStatfs,
    ReplyDirectory,
    ReplyDirectoryPlus,
    ReplyOpen,
    ReplyIoctl,
    ReplyEmpty
);

impl EntryReply for ReplyEntry {
    fn entry(self, attr: &Attr) {
        ReplyEntry::entry(self, &TTL, &file_attr(attr), Generation(0))
    }
}

impl AttrReply for ReplyAttr {
    fn attr(self, attr: &Attr) {
        ReplyAttr::attr(self, &TTL, &file_attr(attr))
    }
}

impl DataReply for ReplyData {
    fn data(self, bytes: &[u8]) {
        ReplyData::data(self, bytes)
    }
}

/// A READ's reply, which may be spliced (`splice`) when the session has a `Splicer`.
pub struct ClassicRead {
    reply: ReplyData,
    unique: u64,
    splicer: Option<Arc<Splicer>>,
}

impl Reply for ClassicRead {
    fn error(self, errno: i32) {
        Reply::error(self.reply, errno)
    }
}

impl DataReply for ClassicRead {
    fn data(self, bytes: &[u8]) {
        self.reply.data(bytes)
    }

    fn can_splice(&self) -> bool {
        self.splicer.is_some()
    }

    fn splice(self, range: &FileRange<'_>) -> Result<(), Self> {
        let Some(splicer) = &self.splicer else {
            return Err(self);
        };
        match splicer.reply(self.unique, range) {
            Spliced::Sent | Spliced::Gone => {
                // Answered: fuser's reply must not answer again (dropped unsent, it would send
                // EIO for this request). Forgetting it leaks only a count on fuser's shared
                // handle of /dev/fuse, which lives as long as the session anyway.
                std::mem::forget(self.reply);
                Ok(())
            }
            Spliced::NotSent => Err(self),
        }
    }
}

impl StatfsReply for ReplyStatfs {
    fn statfs(self, blocks: u64, files: u64) {
        ReplyStatfs::statfs(
            self,
            blocks,
            0,
            0,
            files,
            0,
            STATFS_BSIZE,
            NAME_MAX,
            STATFS_BSIZE,
        )
    }
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
        self.dispatch
            .lookup(parent.0, name.as_bytes(), started, reply);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.dispatch.getattr(ino.0, Instant::now(), reply);
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.dispatch.readlink(ino.0, Instant::now(), reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.dispatch
            .refuse(Refused::Open, ino.0, Instant::now(), reply);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.dispatch
            .refuse(Refused::Opendir, ino.0, Instant::now(), reply);
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.dispatch
            .refuse(Refused::Flush, ino.0, Instant::now(), reply);
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let call = ReadCall {
            ino: ino.0,
            offset,
            size,
            started: Instant::now(),
            reader: req.pid(),
        };
        let reply = ClassicRead {
            reply,
            unique: req.unique().0,
            splicer: self.splicer.get().cloned(),
        };
        self.reads.submit(ReadJob { call, reply });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        self.dispatch
            .list(ino.0, offset, false, Instant::now(), reply);
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        self.dispatch
            .list(ino.0, offset, true, Instant::now(), reply);
    }

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
        self.dispatch
            .refuse(Refused::Ioctl, ino.0, Instant::now(), reply);
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        self.dispatch.statfs(ino.0, Instant::now(), reply);
    }
}
