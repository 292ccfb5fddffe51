//! The one error type of the file system's answers, and the one place that turns it into an
//! errno.

use std::io;
use std::path::PathBuf;

use super::requests::Op;
use crate::catalog::CatalogError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no such file or directory")]
    NotFound,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("not a symlink")]
    NotSymlink,
    #[error("not a regular file")]
    NotFile,
    /// The catalog cannot answer truthfully: a damaged index chunk (logged where it was found) or
    /// a record that does not make sense.
    #[error("{0}")]
    Damaged(CatalogError),
    /// Reading a file's bytes failed.
    #[error(
        "{}: cannot read {:?} ({len} bytes at its offset {file_offset}) at image offset {offset}: {error}",
        image.display(),
        String::from_utf8_lossy(path)
    )]
    Io {
        image: PathBuf,
        /// Where in the image it failed.
        offset: u64,
        /// The file's path in the tree.
        path: Vec<u8>,
        file_offset: u64,
        len: usize,
        error: io::Error,
    },
    /// A read asked not to wait (`Wait::Never`) needs storage: the transport hands
    /// it to the read pool. Built without an allocation (no path, no image name): it is the
    /// common case of the rings' first try.
    #[error("the read would wait for storage")]
    WouldWait,
    /// The mount is stopping: its read pool is gone, and a read handed to it cannot be answered.
    #[error("the mount is stopping")]
    Stopping,
    /// An in-process walk of a path (`python::paths`; the kernel walks a mount's) met more
    /// symlinks than Linux follows.
    #[error("too many levels of symbolic links")]
    Loop,
    /// An in-process walk met a symlink to an absolute path: outside the dataset, which a walk
    /// in the process cannot follow.
    #[error("a symlink to {:?}, outside the dataset", String::from_utf8_lossy(.0))]
    LinkOutside(Vec<u8>),
    /// Answering panicked: a bug, or an input no check foresaw. The request fails alone.
    #[error("{request} panicked: {message}")]
    Panicked { request: String, message: String },
}

/// Runs the answer to one request; a panic in it becomes `Error::Panicked` (EIO, logged) instead
/// of unwinding into fuser, which would end the session and leave every job with ENOTCONN.
pub fn guarded<T>(
    request: impl FnOnce() -> String,
    answer: impl FnOnce() -> Result<T, Error>,
) -> Result<T, Error> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(answer)).unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".into());
        Err(Error::Panicked {
            request: request(),
            message,
        })
    })
}

impl Error {
    /// The errno of a request that fails rather than answer wrongly (and of a dataset that
    /// cannot be opened, in the process, when no system call's errno says more).
    pub const FAILED: i32 = libc::EIO;

    /// The errno the kernel passes on to the caller.
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotFound => libc::ENOENT,
            Error::NotDir => libc::ENOTDIR,
            Error::IsDir => libc::EISDIR,
            Error::Loop => libc::ELOOP,
            Error::LinkOutside(_) => libc::ENOENT,
            Error::NotSymlink | Error::NotFile => libc::EINVAL,
            Error::WouldWait => libc::EAGAIN,
            // A request fails rather than answer wrongly.
            Error::Damaged(_) | Error::Io { .. } | Error::Panicked { .. } | Error::Stopping => {
                Error::FAILED
            }
        }
    }

    /// What a flood of such failures is counted under (`error_log`): the image, or the kind.
    pub fn log_key(&self) -> String {
        match self {
            Error::Io { image, .. } => format!("image {}", image.display()),
            Error::Panicked { .. } => "requests that panicked".into(),
            _ => "requests the catalog cannot answer".into(),
        }
    }

    /// Whether the daemon's log should say so: failures of the data, not of the caller's request
    /// (a damaged index chunk is logged once where it is found).
    pub fn is_worth_logging(&self) -> bool {
        matches!(
            self,
            Error::Io { .. } | Error::Damaged(CatalogError::Invalid(_)) | Error::Panicked { .. }
        )
    }
}

impl From<CatalogError> for Error {
    fn from(e: CatalogError) -> Self {
        match e {
            CatalogError::NotFound => Error::NotFound,
            other => Error::Damaged(other),
        }
    }
}

/// Requests packfs answers with an errno alone, on every transport.
#[derive(Clone, Copy, Debug)]
pub enum Refused {
    Open,
    Opendir,
    Flush,
    Ioctl,
    /// An operation a read-only mount of archives does not implement (writes, xattrs, locks...).
    Unsupported,
}

impl Refused {
    /// The errno, and the operation the refusal is counted under (none: not counted).
    pub fn answer(self) -> (i32, Option<Op>) {
        match self {
            // ENOSYS makes the kernel stop sending OPEN and RELEASE for good and keep every
            // file's pages cached across opens (FOPEN_KEEP_CACHE): one round trip less per sample.
            Refused::Open => (libc::ENOSYS, Some(Op::Open)),
            // As for OPEN: no OPENDIR/RELEASEDIR, and listings cached by the kernel
            // (FOPEN_CACHE_DIR).
            Refused::Opendir => (libc::ENOSYS, Some(Op::Opendir)),
            // Nothing to flush in a read-only file system: ENOSYS makes the kernel stop sending
            // FLUSH at every close.
            Refused::Flush => (libc::ENOSYS, None),
            // Python's `open()` asks every file `isatty()` (TCGETS), which FUSE forwards on every
            // open and keeps forwarding after a refusal: answered at once.
            Refused::Ioctl => (libc::ENOTTY, Some(Op::Ioctl)),
            Refused::Unsupported => (libc::ENOSYS, None),
        }
    }
}

/// Whether a reply with `errno` counts as an error in the counters: "no such file" is an answer,
/// and the refusals above are on purpose.
pub fn counts_as_error(errno: i32) -> bool {
    ![libc::ENOENT, libc::ENOSYS, libc::ENOTTY].contains(&errno)
}
