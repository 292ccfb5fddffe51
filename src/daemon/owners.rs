//! Ties a mount to the processes it serves, so that it ends with its job however the job ends
//! (`scancel`, a time limit, torchrun stopping the ranks, `kill -9`):
//! - `--owner PID`: the mount lives while that process does. It is watched through a pidfd, so a
//!   later process that reuses the number does not keep the mount.
//! - `--users FILE`: the mount lives while some process holds a shared `flock` on FILE: every
//!   process that mounted or attached to it (`packfs.mount` in each rank of a job). The kernel
//!   drops a process's lock when it dies, whatever kills it.
//!
//! When they are gone the daemon stops as on SIGTERM: it detaches the mount and exits.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::info;

/// How often the users' lock is tried.
const USERS_POLL: Duration = Duration::from_millis(250);

/// Whose life a mount serves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owners {
    pub pid: Option<i32>,
    pub users: Option<PathBuf>,
}

/// The opened handles, taken before mounting, so that a mount whose owner is already gone fails
/// instead of appearing and vanishing.
pub struct Watched {
    pidfd: Option<(i32, OwnedFd)>,
    users: Option<(PathBuf, File)>,
}

#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    #[error(
        "--owner {pid}: no such process is running (give the pid of the job's process, e.g. $$ in its script)"
    )]
    NoProcess { pid: i32 },
    #[error("--owner {pid}: cannot watch it: {error}")]
    Pidfd { pid: i32, error: std::io::Error },
    #[error("--users {}: {error}", path.display())]
    Users {
        path: PathBuf,
        error: std::io::Error,
    },
}

impl Owners {
    pub fn is_empty(&self) -> bool {
        self.pid.is_none() && self.users.is_none()
    }

    pub fn open(&self) -> Result<Watched, OwnerError> {
        let pidfd = self
            .pid
            .map(|pid| pidfd_open(pid).map(|fd| (pid, fd)))
            .transpose()?;
        let users = match &self.users {
            Some(path) => Some((
                path.clone(),
                crate::util::safe_file::open_owned(path).map_err(|error| OwnerError::Users {
                    path: path.clone(),
                    error,
                })?,
            )),
            None => None,
        };
        Ok(Watched { pidfd, users })
    }
}

fn pidfd_open(pid: i32) -> Result<OwnedFd, OwnerError> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        let error = std::io::Error::last_os_error();
        return Err(match error.raw_os_error() {
            Some(libc::ESRCH) => OwnerError::NoProcess { pid },
            _ => OwnerError::Pidfd { pid, error },
        });
    }
    // SAFETY: the descriptor was just returned to us and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

impl Watched {
    /// Watches in a thread; when every owner is gone, `gone` runs once (with why).
    pub fn watch(self, mountpoint: &Path, gone: impl FnOnce(String) + Send + 'static) {
        let mountpoint = mountpoint.to_path_buf();
        let spawned = std::thread::Builder::new()
            .name("packfs-owners".into())
            .spawn(move || {
                let why = self.wait();
                info!("{why}: unmounting {}", mountpoint.display());
                gone(why);
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot watch the mount's owners: {e}; it stays until unmounted");
        }
    }

    /// Returns when the owner has exited or nobody holds the users' lock.
    fn wait(self) -> String {
        loop {
            if let Some((pid, fd)) = &self.pidfd
                && exited(fd, if self.users.is_some() { 0 } else { 1000 })
            {
                return format!("its owner, pid {pid}, has exited");
            }
            if let Some((path, file)) = &self.users {
                // Held from here on (the daemon exits holding it): a process that attaches now
                // waits for its shared lock until this mount is gone, then mounts anew.
                if try_lock_exclusive(file) {
                    return format!("no process holds {} any more", path.display());
                }
                std::thread::sleep(USERS_POLL);
            }
        }
    }
}

/// Whether the process behind the pidfd has exited, waiting up to `ms`.
fn exited(fd: &OwnedFd, ms: i32) -> bool {
    let mut poll = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut poll, 1, ms) };
    n > 0 && poll.revents & libc::POLLIN != 0
}

fn try_lock_exclusive(file: &File) -> bool {
    // SAFETY: flock on a descriptor this File owns.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pid_that_is_not_running_is_refused() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        let owners = Owners {
            pid: Some(pid),
            users: None,
        };
        assert!(matches!(
            owners.open(),
            Err(OwnerError::NoProcess { pid: p }) if p == pid
        ));
    }

    #[test]
    fn the_watch_ends_when_the_owner_exits_and_when_the_last_user_lets_go() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.3")
            .spawn()
            .unwrap();
        let owners = Owners {
            pid: Some(child.id() as i32),
            users: None,
        };
        let watched = owners.open().unwrap();
        let started = std::time::Instant::now();
        let why = watched.wait();
        assert!(why.contains("has exited"), "{why}");
        assert!(started.elapsed() >= Duration::from_millis(250));
        child.wait().unwrap();

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("users");
        let user = File::create(&path).unwrap();
        // SAFETY: flock on a descriptor this File owns.
        assert_eq!(unsafe { libc::flock(user.as_raw_fd(), libc::LOCK_SH) }, 0);
        let owners = Owners {
            pid: None,
            users: Some(path),
        };
        let watched = owners.open().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(watched.wait()).unwrap());
        assert!(
            rx.recv_timeout(Duration::from_millis(800)).is_err(),
            "a user holds it"
        );
        drop(user);
        let why = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(why.contains("no process holds"), "{why}");
    }
}
