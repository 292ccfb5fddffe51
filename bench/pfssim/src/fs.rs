//! The passthrough file system: every request is answered from the backing directory at once,
//! and the reply is held back until the simulated RPC would have completed.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirEntryExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    IoctlFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen, ReplyStatfs, Request,
};

use crate::delay::Delay;
use crate::model::Model;
use crate::stats::{Local, Rpc, Stats};

/// Whether the client keeps file data in its page cache across opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DataCache {
    /// Every read is an RPC (direct I/O): the dataset is larger than what the client can cache,
    /// as for ImageNet on a node shared by jobs.
    None,
    /// The page cache keeps file data across opens (FOPEN_KEEP_CACHE): a dataset that fits.
    Keep,
}

pub struct Options {
    pub data_cache: DataCache,
    /// How long the kernel keeps names and attributes before asking again.
    pub ttl: Duration,
}

/// A directory's entries, read at OPENDIR: (inode, type, name).
type Listing = Vec<(u64, FileType, OsString)>;

pub struct PfsSim {
    root: PathBuf,
    opts: Options,
    model: Arc<Model>,
    delay: Delay,
    stats: Arc<Stats>,
    /// FUSE inode -> backing path. Inodes are the backing ones (one file system), root is 1.
    paths: RwLock<HashMap<u64, PathBuf>>,
    files: Mutex<HashMap<u64, Arc<File>>>,
    /// Per open file and calling thread: where its last read ended if the kernel cut it at its
    /// page limit (`split_tail`).
    cut_at: Mutex<HashMap<(u64, u32), u64>>,
    dirs: Mutex<HashMap<u64, Arc<Listing>>>,
    next_handle: AtomicU64,
}

impl PfsSim {
    pub fn new(root: PathBuf, opts: Options, model: Arc<Model>, stats: Arc<Stats>) -> PfsSim {
        let mut paths = HashMap::new();
        paths.insert(1, root.clone());
        PfsSim {
            root,
            opts,
            model,
            delay: Delay::start(),
            stats,
            paths: RwLock::new(paths),
            files: Mutex::new(HashMap::new()),
            cut_at: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
        }
    }

    fn path(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        self.paths
            .read()
            .unwrap()
            .get(&ino.0)
            .cloned()
            .ok_or(Errno::ESTALE)
    }

    /// The FUSE inode of a backing file: its own number, except the root (1) and a backing
    /// inode 1 that is not the root (moved out of the way).
    fn ino_of(&self, path: &Path, meta: &std::fs::Metadata) -> u64 {
        if path == self.root {
            1
        } else if meta.ino() == 1 {
            1 << 63
        } else {
            meta.ino()
        }
    }

    fn attr(&self, ino: u64, m: &std::fs::Metadata) -> FileAttr {
        let time = |s: i64, ns: i64| {
            if s >= 0 {
                UNIX_EPOCH + Duration::new(s as u64, ns as u32)
            } else {
                UNIX_EPOCH
            }
        };
        FileAttr {
            ino: INodeNo(ino),
            size: m.size(),
            blocks: m.blocks(),
            atime: time(m.atime(), m.atime_nsec()),
            mtime: time(m.mtime(), m.mtime_nsec()),
            ctime: time(m.ctime(), m.ctime_nsec()),
            crtime: SystemTime::UNIX_EPOCH,
            kind: kind(m.file_type()),
            perm: (m.mode() & 0o7777) as u16,
            nlink: m.nlink() as u32,
            uid: m.uid(),
            gid: m.gid(),
            rdev: m.rdev() as u32,
            blksize: 4096,
            flags: 0,
        }
    }

    /// Whether this read is the tail of the one before it on `fh`, cut by the kernel only because
    /// the caller's buffer starts inside a page: a 1 MiB read into a buffer from malloc spans 257
    /// pages, and FUSE direct I/O sends at most 256 per request. A parallel file system client
    /// moves the whole extent in one RPC (Lustre: `max_pages_per_rpc` 256, 1 MiB RPCs), so the
    /// tail costs none. Also records where a read so cut ends.
    fn split_tail(&self, fh: u64, pid: u32, offset: u64, len: u64) -> bool {
        const RPC: u64 = 1 << 20;
        const PAGE: u64 = 4096;
        let mut cut_at = self.cut_at.lock().unwrap();
        let tail = cut_at.remove(&(fh, pid)) == Some(offset)
            && (offset - 1) / RPC == (offset + len - 1) / RPC;
        if !tail && len > RPC - PAGE && !(offset + len).is_multiple_of(RPC) {
            cut_at.insert((fh, pid), offset + len);
        }
        tail
    }

    /// Sends `reply` when a metadata RPC asked now would complete.
    fn after_meta(&self, rpc: Rpc, reply: impl FnOnce() + Send + 'static) {
        self.stats.rpc(rpc);
        self.stats.started();
        let stats = self.stats.clone();
        self.delay
            .at(self.model.meta_done(Instant::now()), move || {
                reply();
                stats.finished();
            });
    }

    fn lstat(&self, path: &Path) -> Result<(u64, FileAttr), Errno> {
        let meta = std::fs::symlink_metadata(path).map_err(Errno::from)?;
        let ino = self.ino_of(path, &meta);
        Ok((ino, self.attr(ino, &meta)))
    }

    fn failed(&self, e: Errno) -> Errno {
        if e != Errno::ENOENT {
            self.stats.error();
        }
        e
    }
}

/// Up to `size` bytes at `offset`, into a buffer that is not cleared first: clearing it took 6%
/// of the simulator's CPU at zero latency. (Mapping each file instead cost more than it saved:
/// a mapping per small file, its page faults and its unmapping.)
fn read_at(file: &File, offset: u64, size: usize) -> std::io::Result<Vec<u8>> {
    use std::os::fd::AsRawFd;
    let mut buf = Vec::<u8>::with_capacity(size);
    // SAFETY: pread writes at most `size` bytes into the buffer's capacity, and the length is
    // set to what it wrote.
    let n = unsafe {
        libc::pread(
            file.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            size,
            offset.min(i64::MAX as u64) as libc::off_t,
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    unsafe { buf.set_len(n as usize) };
    Ok(buf)
}

fn kind(t: std::fs::FileType) -> FileType {
    FileType::from_std(t).unwrap_or(FileType::RegularFile)
}

impl Filesystem for PfsSim {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Concurrent lookups in one directory, as a parallel file system allows; mmap of files
        // opened for direct I/O (packfs maps its index).
        for flag in [
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP,
        ] {
            let _ = config.add_capabilities(flag);
        }
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        Ok(())
    }

    fn destroy(&mut self) {
        self.delay.close();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = self.path(parent).and_then(|dir| {
            let path = dir.join(name);
            let (ino, attr) = self.lstat(&path)?;
            self.paths.write().unwrap().entry(ino).or_insert(path);
            Ok(attr)
        });
        let ttl = self.opts.ttl;
        let found = found.map_err(|e| self.failed(e));
        self.after_meta(Rpc::Lookup, move || match found {
            Ok(attr) => reply.entry(&ttl, &attr, Generation(0)),
            Err(e) => reply.error(e),
        });
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let found = self.path(ino).and_then(|p| self.lstat(&p)).map(|(_, a)| a);
        let found = found.map_err(|e| self.failed(e));
        let ttl = self.opts.ttl;
        self.after_meta(Rpc::Getattr, move || match found {
            Ok(attr) => reply.attr(&ttl, &attr),
            Err(e) => reply.error(e),
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let found = self
            .path(ino)
            .and_then(|p| std::fs::read_link(p).map_err(Errno::from));
        let found = found.map_err(|e| self.failed(e));
        self.after_meta(Rpc::Readlink, move || match found {
            Ok(target) => reply.data(target.as_os_str().as_bytes()),
            Err(e) => reply.error(e),
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let opened = if flags.acc_mode() != OpenAccMode::O_RDONLY {
            Err(Errno::EROFS)
        } else {
            self.path(ino)
                .and_then(|p| File::open(p).map_err(Errno::from))
        };
        let opened = opened.map(|file| {
            let fh = self.next_handle.fetch_add(1, Relaxed);
            self.files.lock().unwrap().insert(fh, Arc::new(file));
            fh
        });
        let opened = opened.map_err(|e| self.failed(e));
        let flags = match self.opts.data_cache {
            DataCache::None => FopenFlags::FOPEN_DIRECT_IO,
            DataCache::Keep => FopenFlags::FOPEN_KEEP_CACHE,
        };
        self.after_meta(Rpc::Open, move || match opened {
            Ok(fh) => reply.opened(FileHandle(fh), flags),
            Err(e) => reply.error(e),
        });
    }

    fn read(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(file) = self.files.lock().unwrap().get(&fh.0).cloned() else {
            reply.error(self.failed(Errno::EBADF));
            return;
        };
        let buf = match read_at(&file, offset, size as usize) {
            Ok(buf) => buf,
            Err(e) => {
                reply.error(self.failed(e.into()));
                return;
            }
        };
        if buf.is_empty() {
            self.stats.local(Local::ReadAtEnd);
            reply.data(&[]);
            return;
        }
        if self.split_tail(fh.0, req.pid(), offset, buf.len() as u64) {
            self.stats.local(Local::SplitTail);
            self.stats.read_bytes(buf.len() as u64);
            reply.data(&buf);
            return;
        }
        self.stats.rpc(Rpc::Read);
        self.stats.read_bytes(buf.len() as u64);
        self.stats.started();
        let stats = self.stats.clone();
        self.delay.at(
            self.model.read_done(Instant::now(), buf.len() as u64),
            move || {
                reply.data(&buf);
                stats.finished();
            },
        );
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing written, nothing to flush; ENOSYS stops the kernel from asking at every close.
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.files.lock().unwrap().remove(&fh.0);
        self.cut_at.lock().unwrap().retain(|&(f, _), _| f != fh.0);
        self.after_meta(Rpc::Release, move || reply.ok());
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let listed = self.path(ino).and_then(|dir| {
            let mut entries = vec![(ino.0, FileType::Directory, OsString::from("."))];
            entries.push((1, FileType::Directory, OsString::from("..")));
            for e in std::fs::read_dir(&dir).map_err(Errno::from)? {
                let e = e.map_err(Errno::from)?;
                let t = e.file_type().map_err(Errno::from)?;
                let ino = if e.ino() == 1 { 1 << 63 } else { e.ino() };
                entries.push((ino, kind(t), e.file_name()));
            }
            let fh = self.next_handle.fetch_add(1, Relaxed);
            self.dirs.lock().unwrap().insert(fh, Arc::new(entries));
            Ok(fh)
        });
        let listed = listed.map_err(|e| self.failed(e));
        self.after_meta(Rpc::Opendir, move || match listed {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let Some(entries) = self.dirs.lock().unwrap().get(&fh.0).cloned() else {
            reply.error(self.failed(Errno::EBADF));
            return;
        };
        // Each READDIR is one RPC for one page of names, as a parallel file system client asks.
        self.after_meta(Rpc::Readdir, move || {
            for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
                if reply.add(INodeNo(*ino), i as u64 + 1, *kind, name) {
                    break;
                }
            }
            reply.ok();
        });
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.dirs.lock().unwrap().remove(&fh.0);
        self.after_meta(Rpc::Releasedir, move || reply.ok());
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let st = nix_statvfs(&self.root);
        self.after_meta(Rpc::Statfs, move || match st {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                255,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(e),
        });
    }

    /// isatty() from Python's open(): a real client answers it without a server.
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
        self.stats.local(Local::Ioctl);
        reply.error(Errno::ENOTTY);
    }
}

fn nix_statvfs(path: &Path) -> Result<libc::statvfs, Errno> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string and `st` a valid out pointer for the call's duration.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(st)
}
