//! Positioned reads from an image, whatever holds it: a local or parallel-filesystem file today,
//! an object store later, a fault-injecting wrapper in tests. The archive decoders and the tiers
//! read through this trait only.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Whether a read may wait for a device or the network. A FUSE ring's queue thread reads with
/// `Never`, so that data already in memory is answered at once and a slow read never holds up
/// the other requests of its CPU; the read pool retries what would have waited with `May`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    May,
    Never,
}

/// The error of a read that would have waited (`Wait::Never`).
/// A bare kind, no message: made on every read the rings try first and must hand to the pool,
/// so it must not allocate.
pub fn would_block() -> io::Error {
    io::ErrorKind::WouldBlock.into()
}

pub trait ReadAt: Send + Sync {
    /// Reads up to `buf.len()` bytes at `offset`. Fewer bytes than asked are not an error (a
    /// backing store may answer short); 0 means `offset` is at or past the end.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;

    /// As `read_at`, but only from what is at hand (memory, the page cache): a read that would
    /// wait fails with `would_block()`. The default says every read would wait, so a store that
    /// does not say otherwise is never read by a thread that must not block.
    fn read_at_now(&self, _buf: &mut [u8], _offset: u64) -> io::Result<usize> {
        Err(would_block())
    }

    /// `read_at` or `read_at_now`, as `wait` says.
    fn read_with(&self, buf: &mut [u8], offset: u64, wait: Wait) -> io::Result<usize> {
        match wait {
            Wait::May => self.read_at(buf, offset),
            Wait::Never => self.read_at_now(buf, offset),
        }
    }

    /// Fills `buf` from `offset`, retrying short and interrupted reads. Running out of data is an
    /// `UnexpectedEof` error: callers ask only for bytes the catalog promised.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_exact_with(buf, offset, Wait::May)
    }

    /// `read_exact_at`, waiting or not as `wait` says.
    fn read_exact_with(&self, mut buf: &mut [u8], mut offset: u64, wait: Wait) -> io::Result<()> {
        while !buf.is_empty() {
            match self.read_with(buf, offset, wait) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("the image ends before offset {offset}"),
                    ));
                }
                Ok(n) => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Reads as many bytes as the image has at `offset`, up to `buf.len()`: short only at its end
    /// (retrying short and interrupted reads). For streams whose compressed length is not known.
    fn read_up_to(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut got = 0;
        while got < buf.len() {
            match self.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(got)
    }

    /// Hints that `len` bytes at `offset` will be read soon; the default does nothing.
    fn will_need(&self, _offset: u64, _len: u64) {}

    /// Stops trusting whatever gives the image's bytes besides its own source (another node of
    /// the job), once bytes read through it failed the index's checksum: true if there was such
    /// a giver, so that a read again now comes from the source. The default has none.
    fn distrust(&self) -> bool {
        false
    }

    /// The descriptor of a plain file whose bytes at an offset are the image's at that offset,
    /// for replies spliced from it (`tiers::FileRange`); `None` for anything else (memory, stores,
    /// wrappers that change or count what is read).
    fn file_descriptor(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    /// What the store says of the object now (size and modification time), to notice it being
    /// rewritten under a mount; `None` when it cannot tell (memory, test wrappers).
    fn current(&self) -> Option<io::Result<Stamp>> {
        None
    }
}

/// A `Read + Seek` view of `len` bytes readable through a `ReadAt`, for parsers that want a stream
/// (zip's): each holds its own position, so several can read one image.
pub struct Cursor<'a> {
    data: &'a dyn ReadAt,
    len: u64,
    pos: u64,
}

impl<'a> Cursor<'a> {
    pub fn new(data: &'a dyn ReadAt, len: u64) -> Cursor<'a> {
        Cursor { data, len, pos: 0 }
    }
}

impl io::Read for Cursor<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let room = self.len.saturating_sub(self.pos).min(buf.len() as u64) as usize;
        if room == 0 {
            return Ok(0);
        }
        let n = self.data.read_at(&mut buf[..room], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl io::Seek for Cursor<'_> {
    fn seek(&mut self, to: io::SeekFrom) -> io::Result<u64> {
        let target = match to {
            io::SeekFrom::Start(n) => Some(n),
            io::SeekFrom::End(d) => self.len.checked_add_signed(d),
            io::SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = target.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "seek before the start of the image",
            )
        })?;
        Ok(self.pos)
    }
}

/// `len` bytes at `base` of another image, read as an image of their own: an archive stored as
/// a member of another (a class's tar inside ImageNet's tar). Reads past `len` end there.
pub struct Window<R: ?Sized> {
    outer: std::sync::Arc<R>,
    base: u64,
    len: u64,
}

impl<R: ReadAt + ?Sized> Window<R> {
    pub fn new(outer: std::sync::Arc<R>, base: u64, len: u64) -> Window<R> {
        Window { outer, base, len }
    }

    /// The part of `buf` inside the window at `offset`, and where it lies in the outer image.
    fn clip(&self, buf_len: usize, offset: u64) -> (usize, u64) {
        let room = self.len.saturating_sub(offset).min(buf_len as u64) as usize;
        (room, self.base.saturating_add(offset))
    }
}

impl<R: ReadAt + ?Sized> ReadAt for Window<R> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let (room, at) = self.clip(buf.len(), offset);
        if room == 0 {
            return Ok(0);
        }
        self.outer.read_at(&mut buf[..room], at)
    }

    fn read_at_now(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let (room, at) = self.clip(buf.len(), offset);
        if room == 0 {
            return Ok(0);
        }
        self.outer.read_at_now(&mut buf[..room], at)
    }

    fn will_need(&self, offset: u64, len: u64) {
        let (room, at) = self.clip(len.min(usize::MAX as u64) as usize, offset);
        self.outer.will_need(at, room as u64);
    }

    fn current(&self) -> Option<io::Result<Stamp>> {
        self.outer.current()
    }
}

/// An image's size and modification time as its store reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub size: u64,
    pub mtime: i64,
    pub mtime_nsec: u32,
}

impl Stamp {
    /// Whether the time of `now` is this one's: the same, or the same second without its
    /// nanoseconds, as a file system that keeps whole seconds (MooseFS) gives a copy that kept
    /// its time (`cp -p`, `rsync -t`) of an image indexed elsewhere; `touch -d` cannot give it
    /// more there.
    pub fn same_time(&self, now: &Stamp) -> bool {
        self.mtime == now.mtime && (self.mtime_nsec == now.mtime_nsec || now.mtime_nsec == 0)
    }

    /// Whether `now` is this stamp again (`same_time`, and the same size).
    pub fn matches(&self, now: &Stamp) -> bool {
        self.size == now.size && self.same_time(now)
    }
}

/// Opens an image (or index) for reading, refusing anything but a regular file. The open does not
/// block: a plain `open` of a FIFO waits for a writer forever (a glob that matched one hung
/// `packfs ls` and mounts), so the file is opened non-blocking and checked before any read.
pub fn open_regular(path: &std::path::Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    if kind.is_file() {
        return Ok(file);
    }
    use std::os::unix::fs::FileTypeExt;
    let what = if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "a device"
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{what}, not a regular file: give tar, zip or squashfs image files or an index"),
    ))
}

/// Whether the file behind `fd` is on a local disk or in memory (ext4, XFS, btrfs, F2FS, ZFS,
/// bcachefs, tmpfs, an overlay of them), where splicing from it reads its page cache as `pread`
/// does. On a parallel or network file system it is not spliced: from a FUSE client (the
/// simulated PFS) a 300 kB sample spliced cost 2.6 reads of the file system instead of one.
pub fn on_local_disk(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    use std::os::fd::AsRawFd;
    const LOCAL: [i64; 8] = [
        0xEF53,     // ext2/3/4
        0x58465342, // XFS
        0x9123683E, // btrfs
        0xF2F52010, // F2FS
        0x2FC12FC1, // ZFS
        0xCA451A4E, // bcachefs
        0x01021994, // tmpfs
        0x794C7630, // overlayfs
    ];
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: fstatfs writes a `statfs` into memory sized for one; `fd` is open (borrowed).
    if unsafe { libc::fstatfs(fd.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: fstatfs succeeded and filled it.
    // f_type is a `long` on glibc, narrower elsewhere.
    #[allow(clippy::unnecessary_cast)]
    let kind = unsafe { st.assume_init() }.f_type as i64;
    LOCAL.contains(&kind)
}

impl ReadAt for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(self, buf, offset)
    }

    fn read_at_now(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        read_nowait(self, buf, offset)
    }

    /// fstat of the open descriptor: a file rewritten in place shows its new size and mtime; one
    /// replaced by rename does not (this descriptor still reads the old, consistent bytes).
    fn current(&self) -> Option<io::Result<Stamp>> {
        use std::os::unix::fs::MetadataExt;
        Some(self.metadata().map(|m| Stamp {
            size: m.len(),
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec() as u32,
        }))
    }

    fn file_descriptor(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(std::os::fd::AsFd::as_fd(self))
    }

    fn will_need(&self, offset: u64, len: u64) {
        use std::os::fd::AsRawFd;
        // SAFETY: plain syscall on a descriptor this File owns; a failure only loses the hint.
        unsafe {
            libc::posix_fadvise(
                self.as_raw_fd(),
                offset as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_WILLNEED,
            )
        };
    }
}

impl ReadAt for [u8] {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let Ok(start) = usize::try_from(offset) else {
            return Ok(0);
        };
        let Some(rest) = self.get(start..) else {
            return Ok(0);
        };
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        Ok(n)
    }

    fn read_at_now(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.read_at(buf, offset)
    }
}

impl ReadAt for Vec<u8> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.as_slice().read_at(buf, offset)
    }

    fn read_at_now(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.as_slice().read_at(buf, offset)
    }
}

/// preadv2 with RWF_NOWAIT: only what the page cache holds. EAGAIN (not cached) and EOPNOTSUPP (a
/// file system that cannot tell, as some parallel file systems) both mean "would wait", and so
/// does ENOSYS (a kernel before 4.6). Made as a raw system call: glibc has `preadv2` only since
/// 2.26, and the wheel links against 2.17 (manylinux2014).
fn read_nowait(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: one iovec over `buf`, which outlives the call, on a descriptor this File owns. The
    // kernel takes the offset as two words, low then high; on 64-bit the low one holds it all.
    let n = unsafe {
        libc::syscall(
            libc::SYS_preadv2,
            file.as_raw_fd(),
            &iov as *const libc::iovec,
            1,
            offset as libc::c_long,
            0 as libc::c_long,
            libc::RWF_NOWAIT,
        )
    };
    if n >= 0 {
        return Ok(n as usize);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN | libc::EOPNOTSUPP | libc::ENOSYS) => Err(would_block()),
        _ => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers at most 3 bytes per call, and fails every other call with EINTR.
    struct Stingy(Vec<u8>, std::sync::atomic::AtomicU32);

    impl ReadAt for Stingy {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
            if self
                .1
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                .is_multiple_of(2)
            {
                return Err(io::ErrorKind::Interrupted.into());
            }
            let n = buf.len().min(3);
            self.0.read_at(&mut buf[..n], offset)
        }
    }

    #[test]
    fn a_cursor_reads_and_seeks_within_its_length_only() {
        use std::io::{Read, Seek, SeekFrom};
        let data: Vec<u8> = (0..100).collect();
        let mut cursor = Cursor::new(&data, 60);
        let mut buf = [0u8; 8];
        assert_eq!(cursor.seek(SeekFrom::End(-4)).unwrap(), 56);
        assert_eq!(cursor.read(&mut buf).unwrap(), 4, "the view ends at 60");
        assert_eq!(&buf[..4], &data[56..60]);
        assert_eq!(cursor.read(&mut buf).unwrap(), 0);
        assert_eq!(cursor.seek(SeekFrom::Current(-10)).unwrap(), 50);
        cursor.read_exact(&mut buf).unwrap();
        assert_eq!(&buf[..], &data[50..58]);
        assert!(cursor.seek(SeekFrom::Current(-100)).is_err());
    }

    #[test]
    fn exact_reads_retry_short_and_interrupted_reads() {
        let data: Vec<u8> = (0..100).collect();
        let stingy = Stingy(data.clone(), Default::default());
        let mut buf = [0u8; 40];
        stingy.read_exact_at(&mut buf, 50).unwrap();
        assert_eq!(&buf[..], &data[50..90]);
        let err = stingy.read_exact_at(&mut buf, 80).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(data.read_at(&mut buf, 1 << 40).unwrap(), 0);
    }

    #[test]
    fn reads_that_refuse_to_wait_get_cached_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"in the page cache").unwrap();
        let file = File::open(&path).unwrap();
        let mut buf = [0u8; 6];
        ReadAt::read_exact_with(&file, &mut buf, 3, Wait::Never).unwrap();
        assert_eq!(&buf, b"the pa");
    }

    /// A store that says nothing of reads at hand is never read by a thread that must not wait.
    #[test]
    fn a_store_that_cannot_read_at_once_would_block_by_default() {
        struct Slow;
        impl ReadAt for Slow {
            fn read_at(&self, buf: &mut [u8], _offset: u64) -> io::Result<usize> {
                buf.fill(7);
                Ok(buf.len())
            }
        }
        let mut buf = [0u8; 4];
        let err = Slow.read_exact_with(&mut buf, 0, Wait::Never).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        Slow.read_exact_with(&mut buf, 0, Wait::May).unwrap();
        assert_eq!(buf, [7; 4]);
    }
}
