//! The same file system through fuser 0.18 (what packfs's request loop runs on): the floor of
//! the classic transport as packfs uses it, fuser's own request handling included.

use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, IoctlFlags, KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData,
    ReplyEntry, ReplyIoctl, ReplyOpen, Request, Session, SessionACL,
};

use crate::floor::{DATA_INO, DATA_SIZE};

struct Floor;

const TTL: Duration = Duration::ZERO;

fn attr(ino: u64) -> FileAttr {
    let dir = ino == 1;
    FileAttr {
        ino: INodeNo(ino),
        size: if dir { 4096 } else { DATA_SIZE },
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: if dir {
            FileType::Directory
        } else {
            FileType::RegularFile
        },
        perm: if dir { 0o755 } else { 0o644 },
        nlink: if dir { 2 } else { 1 },
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

thread_local! {
    static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Filesystem for Floor {
    /// As the in-house floor and packfs: lookups in one directory run in parallel.
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent.0 == 1 && name == "data" {
            reply.entry(&TTL, &attr(DATA_INO), Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match ino.0 {
            1 | DATA_INO => reply.attr(&TTL, &attr(ino.0)),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let n = DATA_SIZE.saturating_sub(offset).min(size as u64) as usize;
        BUF.with_borrow_mut(|buf| {
            buf.resize(n, 0);
            // Made here, as in the in-house floor.
            buf.fill(0x5a);
            reply.data(buf);
        });
    }

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
}

/// Mounts and serves until unmounted.
pub fn serve(mnt: &Path, threads: usize, ready: impl FnOnce()) -> io::Result<()> {
    let mut config = Config::default();
    config.mount_options = vec![MountOption::CUSTOM("subtype=fuseloop".into())];
    config.acl = SessionACL::All;
    config.n_threads = Some(threads.max(1));
    let session = Session::new(Floor, mnt, &config)?;
    ready();
    session.run()
}
