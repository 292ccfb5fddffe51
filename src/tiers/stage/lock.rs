//! One stage directory, one user: an exclusive `flock` on `DIR/packfs.lock`, held for the life of
//! the mount or `packfs stage` run. The lock file names its holder for the refusal message; the
//! kernel drops the lock when the holder dies, so a killed daemon never blocks the next one.

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

pub struct DirLock {
    _file: Flock<File>,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "stage directory {dir} is in use by another packfs process ({holder}); \
         give each mount its own --stage directory, or wait for that one to finish"
    )]
    Busy { dir: String, holder: String },
    #[error("cannot lock stage directory {dir}: {error}")]
    Io { dir: String, error: io::Error },
}

impl DirLock {
    /// Takes the lock without waiting; `holder` says who we are (pid and purpose).
    pub fn take(dir: &Path, holder: &str) -> Result<DirLock, LockError> {
        let io_err = |error| LockError::Io {
            dir: dir.display().to_string(),
            error,
        };
        let file = crate::util::safe_file::open_owned(&dir.join("packfs.lock")).map_err(io_err)?;
        let mut file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(locked) => locked,
            Err((_, errno)) if errno != Errno::EWOULDBLOCK => return Err(io_err(errno.into())),
            Err((mut file, _)) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                let holder = match text.trim() {
                    "" => "holder unknown".to_string(),
                    t => t.to_string(),
                };
                return Err(LockError::Busy {
                    dir: dir.display().to_string(),
                    holder,
                });
            }
        };
        let _ = file.set_len(0);
        let _ = file.rewind();
        let _ = file.write_all(holder.as_bytes());
        Ok(DirLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_first_ones_name() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::take(dir.path(), "pid 1: mount at /mnt/a").unwrap();
        let refused = DirLock::take(dir.path(), "pid 2").err().unwrap();
        let msg = refused.to_string();
        assert!(msg.contains("pid 1: mount at /mnt/a"), "{msg}");
        assert!(msg.contains("in use"), "{msg}");
        drop(first);
        DirLock::take(dir.path(), "pid 2").unwrap();
    }
}
