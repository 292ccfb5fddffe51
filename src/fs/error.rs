//! The one error type of the file system's answers, and the one place that turns it into an
//! errno.

use std::io;
use std::path::PathBuf;

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
}

impl Error {
    /// The errno the kernel passes on to the caller.
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotFound => libc::ENOENT,
            Error::NotDir => libc::ENOTDIR,
            Error::IsDir => libc::EISDIR,
            Error::NotSymlink | Error::NotFile => libc::EINVAL,
            // A request fails rather than answer wrongly.
            Error::Damaged(_) | Error::Io { .. } => libc::EIO,
        }
    }

    /// Whether the daemon's log should say so: failures of the data, not of the caller's request
    /// (a damaged index chunk is logged once where it is found).
    pub fn is_worth_logging(&self) -> bool {
        matches!(
            self,
            Error::Io { .. } | Error::Damaged(CatalogError::Invalid(_))
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
