//! READ replies spliced into /dev/fuse: the reply's header is written into a pipe, the bytes are
//! spliced from the image file behind it (`tiers::FileRange`: the pipe holds the image's
//! page-cache pages), and the pipe is spliced into the FUSE device, where the kernel copies the
//! bytes once, into the mount's page cache. The daemon neither reads the bytes into a buffer nor
//! pins that buffer to write it: on files of 8-512 MB read cold, those were 40% of its CPU
//! (docs/benchmarks/large.md).
//!
//! The kernel takes a spliced reply only whole, so the pipe must hold the header and one slot
//! per page the bytes touch: 258 for a 1 MiB read at an unaligned offset. A pipe holds at most
//! `/proc/sys/fs/pipe-max-size` (1 MiB, 256 slots, by default) unless its owner has
//! CAP_SYS_RESOURCE, which root in a container often lacks; so the mount asks the kernel for
//! READs no larger than a pipe can carry at any offset (`reply_limit`: 254 pages, the mount
//! option `max_read`), which costs 1% more requests than 1 MiB ones. `PACKFS_SPLICE=0` turns
//! splicing off.

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use tracing::{debug, info};

use crate::tiers::FileRange;

const PAGE: u64 = 4096;
/// What a pipe is asked to hold: a 1 MiB reply (the largest READ the kernel sends) at any
/// offset, with its header.
const PIPE_BYTES: usize = 2 << 20;
/// `struct fuse_out_header`: len, error, unique.
const HEADER: usize = 16;

/// Where spliced replies go: a descriptor of the session's /dev/fuse (a duplicate of fuser's: the
/// same open file, so the kernel finds each request this one answers).
pub struct Splicer {
    device: OwnedFd,
}

/// How a spliced reply ended.
pub enum Spliced {
    /// The kernel took the reply.
    Sent,
    /// The kernel no longer waits for it (the reader was interrupted): nothing more to send.
    Gone,
    /// Nothing was sent: reply the usual way.
    NotSent,
}

/// A thread's pipe, made on its first spliced reply.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// Buffers (pages) the pipe holds at most.
    slots: u64,
}

thread_local! {
    static PIPE: RefCell<Option<Pipe>> = const { RefCell::new(None) };
}

/// Said once: the pipes of this user are too small for the largest replies.
static SMALL_PIPE_SAID: AtomicBool = AtomicBool::new(false);

/// The largest READ (bytes, whole pages) a pipe of this process can carry as one reply at any
/// offset of its image, if it is worth splicing at all (128 KiB or more); `None` when splicing
/// is off (`PACKFS_SPLICE=0`) or pipes cannot be made.
pub fn reply_limit() -> Option<u32> {
    if std::env::var_os("PACKFS_SPLICE").is_some_and(|v| v == "0") {
        info!("PACKFS_SPLICE=0: READ replies are copied, not spliced");
        return None;
    }
    let pipe = Pipe::new()
        .map_err(|e| info!("READ replies are copied, not spliced: no pipe ({e})"))
        .ok()?;
    // One slot for the header, one for a partial page at each end.
    let pages = pipe.slots.saturating_sub(2);
    (pages >= 32).then(|| (pages.min(MAX_READ_PAGES) * PAGE) as u32)
}

/// The largest READ the kernel sends (FUSE's `max_pages`), in pages and bytes.
const MAX_READ_PAGES: u64 = 256;
pub const LARGEST_READ: u32 = (MAX_READ_PAGES * PAGE) as u32;

impl Splicer {
    /// A splicer for the session on `device`.
    pub fn new(device: BorrowedFd<'_>) -> io::Result<Splicer> {
        Ok(Splicer {
            device: device.try_clone_to_owned()?,
        })
    }

    /// Replies to request `unique` with the bytes of `range`.
    pub fn reply(&self, unique: u64, range: &FileRange<'_>) -> Spliced {
        PIPE.with_borrow_mut(|pipe| {
            if pipe.is_none() {
                *pipe = Pipe::new()
                    .map_err(|e| debug!("no pipe to splice: {e}"))
                    .ok();
            }
            let Some(p) = pipe.as_ref() else {
                return Spliced::NotSent;
            };
            let pages = (range.offset() % PAGE + range.len() as u64).div_ceil(PAGE);
            if 1 + pages > p.slots {
                if !SMALL_PIPE_SAID.swap(true, Ordering::Relaxed) {
                    info!(
                        pipe_bytes = p.slots * PAGE,
                        "a read larger than a pipe holds is copied rather than spliced"
                    );
                }
                return Spliced::NotSent;
            }
            let outcome = p.send(&self.device, unique, range);
            if !matches!(outcome, Ok(Spliced::Sent | Spliced::Gone)) {
                // The pipe may hold part of this reply: a new one for the next.
                *pipe = None;
            }
            outcome.unwrap_or_else(|e| {
                debug!("splicing a reply failed, copying it instead: {e}");
                Spliced::NotSent
            })
        })
    }
}

impl Pipe {
    fn new() -> io::Result<Pipe> {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded: both are new descriptors owned by nobody else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        for bytes in [PIPE_BYTES, PIPE_BYTES / 2] {
            // SAFETY: fcntl on a descriptor owned here; a refusal leaves the pipe as it was.
            if unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, bytes as libc::c_int) }
                > 0
            {
                break;
            }
        }
        // SAFETY: as above.
        let bytes = unsafe { libc::fcntl(write.as_raw_fd(), libc::F_GETPIPE_SZ) };
        if bytes <= 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Pipe {
            read,
            write,
            slots: bytes as u64 / PAGE,
        })
    }

    fn send(&self, device: &OwnedFd, unique: u64, range: &FileRange<'_>) -> io::Result<Spliced> {
        let total = HEADER + range.len();
        let len = u32::try_from(total).map_err(io::Error::other)?;
        let mut header = [0u8; HEADER];
        header[..4].copy_from_slice(&len.to_ne_bytes());
        header[8..].copy_from_slice(&unique.to_ne_bytes());
        // SAFETY: writes from a live buffer to a descriptor owned here.
        let wrote = unsafe { libc::write(self.write.as_raw_fd(), header.as_ptr().cast(), HEADER) };
        if wrote != HEADER as isize {
            return Err(short("header", wrote));
        }
        range.splice_into(self.write.as_fd())?;
        // SAFETY: both descriptors are open; no offsets (a pipe and a device).
        let moved = unsafe {
            libc::splice(
                self.read.as_raw_fd(),
                std::ptr::null_mut(),
                device.as_raw_fd(),
                std::ptr::null_mut(),
                total,
                0,
            )
        };
        match moved {
            n if n == total as isize => Ok(Spliced::Sent),
            // The request is no longer waiting (interrupted): the reply has nowhere to go.
            // (ENOENT: no request with this id.)
            n if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::NotFound => {
                Ok(Spliced::Gone)
            }
            n => Err(short("reply", n)),
        }
    }
}

fn short(what: &str, n: isize) -> io::Error {
    match n {
        n if n < 0 => io::Error::last_os_error(),
        n => io::Error::other(format!("{what}: {n} bytes moved")),
    }
}
