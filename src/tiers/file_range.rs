//! A read's bytes as a range of an image file, for a transport that can move them to the kernel
//! without copying them through the daemon (the classic loop splices them into /dev/fuse).
//! Measured on files of 8-512 MB read cold in 1 MiB requests, the daemon's copies were most of
//! its CPU: the pread into its buffer (28%), pinning that buffer to write it (12%) and the
//! kernel's copy of the reply (31%); splicing leaves only the last (docs/benchmarks/large.md).
//! Only a read the tiers would send straight to the source becomes one: bytes a stage, the RAM
//! tier or the lookahead hold are read where they are.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use super::waits::Waiting;

/// Where a range moved to the kernel is counted, as a read of the source (`Images`): its
/// reader waits on storage while it moves (`begin`), and its bytes count once moved.
pub trait CountSpliced: Sync {
    fn begin(&self, reader: u32) -> Waiting<'_>;
    fn count_spliced(&self, image: u32, len: usize);
    /// Counts `len` bytes of `image` read through a mapping to check them (`crc32_around`).
    fn count_checked(&self, image: u32, len: u64);
}

/// Members up to this size are checked from a copy rather than a mapping: a mapping's setup and
/// teardown cost more than the copy (on 60 KB samples, 8-9% more daemon CPU a file mapped than
/// copied; docs/benchmarks/cold-path.md).
const COPY_TO_CHECK: u64 = 256 << 10;

thread_local! {
    /// A thread's buffer for reading stored bytes to check them (here, and `FileReader`'s
    /// checks through the tiers): one per thread, not one per kind of check.
    pub(super) static CHECK_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

pub struct FileRange<'a> {
    images: &'a dyn CountSpliced,
    /// The reading process, whose wait it is.
    reader: u32,
    image: u32,
    file: BorrowedFd<'a>,
    offset: u64,
    len: usize,
}

impl<'a> FileRange<'a> {
    pub(super) fn new(
        images: &'a dyn CountSpliced,
        reader: u32,
        image: u32,
        file: BorrowedFd<'a>,
        offset: u64,
        len: usize,
    ) -> FileRange<'a> {
        FileRange {
            images,
            reader,
            image,
            file,
            offset,
            len,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The image it is a range of.
    pub fn image(&self) -> u32 {
        self.image
    }

    /// Where the range starts in its file (its pages decide how many pipe slots it takes).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The CRC-32 of the `len` bytes of the file that start `back` bytes before this range (the
    /// whole stored member it is part of), computed in the file's page cache without a copy
    /// (`source::mapped`), where the reply is spliced from next; `None` when no mapping can be
    /// made (the caller reads the member instead).
    pub fn crc32_around(
        &self,
        back: u64,
        len: u64,
        arrival: crate::source::mapped::Arrival,
    ) -> Option<io::Result<u32>> {
        let start = self.offset.checked_sub(back)?;
        let _waiting = self.images.begin(self.reader);
        // Read, not mapped: small members (one copy is cheaper than a mapping), and every
        // member in a process packfs is a guest in (a training process: no signal handler of
        // ours can be relied on there).
        let crc = match len <= COPY_TO_CHECK || !crate::source::mapped::mapped_checks() {
            true => Some(self.crc32_read(start, len)),
            false => crate::source::mapped::crc32(self.file, start, len, arrival),
        }?;
        if crc.is_ok() {
            self.images.count_checked(self.image, len);
        }
        Some(crc)
    }

    /// The CRC-32 of `len` bytes at `start` of the file, read with `pread` into a buffer of
    /// this thread, `COPY_TO_CHECK` bytes at a time: a file that shrank is an error, never a
    /// signal.
    fn crc32_read(&self, start: u64, len: u64) -> io::Result<u32> {
        CHECK_BUF.with_borrow_mut(|buf| {
            let mut hasher = crc32fast::Hasher::new();
            let mut done = 0;
            while done < len {
                let n = (len - done).min(COPY_TO_CHECK) as usize;
                buf.resize(n, 0);
                pread_exact(self.file, buf, start + done)?;
                hasher.update(buf);
                done += n as u64;
            }
            Ok(hasher.finalize())
        })
    }

    /// Reads the range into `dst` (as long as the range) straight from its file, counted as a
    /// read of the source: the in-process engine's read into a caller's buffer, with no copy
    /// on the way. A file that ends early is an error.
    pub fn read_into(&self, dst: &mut [u8]) -> io::Result<()> {
        let _waiting = self.images.begin(self.reader);
        pread_exact(self.file, &mut dst[..self.len], self.offset)?;
        self.images.count_spliced(self.image, self.len);
        Ok(())
    }

    /// Moves the range into the pipe whose write end is `pipe` (without copying: the pipe holds
    /// the file's page-cache pages), counted as a read of the source. The pipe must have room
    /// for all of it: a full pipe is an error (`WouldBlock`), as is a file that ends early.
    /// After an error the pipe may hold part of the range.
    pub fn splice_into(&self, pipe: BorrowedFd<'_>) -> io::Result<()> {
        let _waiting = self.images.begin(self.reader);
        let mut at = i64::try_from(self.offset).map_err(io::Error::other)?;
        let mut left = self.len;
        while left > 0 {
            // SAFETY: both descriptors are open for the call (borrowed); `at` outlives it.
            let n = unsafe {
                libc::splice(
                    self.file.as_raw_fd(),
                    &mut at,
                    pipe.as_raw_fd(),
                    std::ptr::null_mut(),
                    left,
                    libc::SPLICE_F_NONBLOCK,
                )
            };
            match n {
                n if n < 0 => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
                0 => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("the image ends before offset {at}"),
                    ));
                }
                n => left -= n as usize,
            }
        }
        self.images.count_spliced(self.image, self.len);
        Ok(())
    }
}

/// Fills `dst` from `offset` of `file`; a file that ends early is an error.
fn pread_exact(file: BorrowedFd<'_>, dst: &mut [u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < dst.len() {
        let at = offset + done as u64;
        match nix::sys::uio::pread(file, &mut dst[done..], at as i64) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the image ends before offset {at}"),
                ));
            }
            Ok(n) => done += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
