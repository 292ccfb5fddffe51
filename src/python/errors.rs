//! The module's errors as Python's: `OSError(errno, message, path)`, which Python turns into
//! `FileNotFoundError`, `IsADirectoryError` and the like by errno; the message is the mount's
//! (a read that fails names the image and the offset in it).

use pyo3::PyErr;
use pyo3::exceptions::PyOSError;

use crate::engine::EngineError;

/// Why an answer failed, and the path asked for.
#[derive(Debug)]
pub struct FsError {
    errno: i32,
    message: String,
    path: Option<Vec<u8>>,
}

impl FsError {
    /// The same error, about `path` (unless it names one already).
    pub fn at(mut self, path: &[u8]) -> FsError {
        self.path.get_or_insert_with(|| path.to_vec());
        self
    }
}

impl From<crate::fs::Error> for FsError {
    /// The errno the mount would answer with, and its message.
    fn from(e: crate::fs::Error) -> FsError {
        FsError {
            errno: e.errno(),
            message: e.to_string(),
            path: None,
        }
    }
}

impl From<crate::catalog::CatalogError> for FsError {
    fn from(e: crate::catalog::CatalogError) -> FsError {
        crate::fs::Error::from(e).into()
    }
}

impl From<EngineError> for FsError {
    /// A dataset that cannot be opened: the message `packfs mount` prints, with the errno of
    /// the system call that failed under it when there is one (ENOENT for a missing image).
    fn from(e: EngineError) -> FsError {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        let mut errno = None;
        while let Some(c) = cause {
            errno = errno.or_else(|| c.downcast_ref::<std::io::Error>()?.raw_os_error());
            cause = c.source();
        }
        FsError {
            errno: errno.unwrap_or(crate::fs::Error::FAILED),
            message: crate::util::redact::urls(&e.to_string()).into_owned(),
            path: None,
        }
    }
}

pub fn to_py(e: FsError) -> PyErr {
    match e.path {
        Some(path) => PyOSError::new_err((
            e.errno,
            e.message,
            String::from_utf8_lossy(&path).into_owned(),
        )),
        None => PyOSError::new_err((e.errno, e.message)),
    }
}
