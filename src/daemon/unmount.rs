//! Unmounting, also of a stale mount whose daemon died ("Transport endpoint is not connected").

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::mount::{MntFlags, umount2};
use tracing::warn;

use super::mounts;

/// How an unmount went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unmounted {
    /// Gone at once.
    Now,
    /// Detached while files were open: the daemon serves those until they close.
    Detached,
}

#[derive(Debug, thiserror::Error)]
pub enum UnmountError {
    #[error("cannot resolve {}: {error}", path.display())]
    Resolve { path: PathBuf, error: io::Error },
    #[error("cannot read /proc/self/mountinfo: {0}")]
    Mountinfo(io::Error),
    #[error("{} is not a mount point", .0.display())]
    NotMounted(PathBuf),
    #[error("{} does not exist (nothing is mounted there)", .0.display())]
    Missing(PathBuf),
    #[error(
        "{} is a {fstype} mount of {from}, not a packfs mount; leaving it alone (--force \
         unmounts any FUSE mount)",
        path.display()
    )]
    NotPackfs {
        path: PathBuf,
        fstype: String,
        from: String,
    },
    #[error(
        "{} is a packfs mount of user {owner}: only its owner or root can unmount it",
        path.display()
    )]
    NotOwner { path: PathBuf, owner: String },
    #[error("cannot unmount {}: {error}", path.display())]
    Unmount { path: PathBuf, error: Errno },
    #[error("cannot detach {}: {error}", path.display())]
    Detach { path: PathBuf, error: Errno },
    #[error("unmounting as a non-root user needs fusermount3 (package fuse3)")]
    NoFusermount,
    #[error("cannot run {helper}: {error}")]
    Helper {
        helper: &'static str,
        error: io::Error,
    },
    #[error("{helper} -uz {} failed: {stderr}", path.display())]
    HelperFailed {
        helper: &'static str,
        path: PathBuf,
        stderr: String,
    },
}

/// Unmounts the packfs mount at `path` (any FUSE mount with `any_fuse`). A busy mount is detached
/// (lazily unmounted) rather than left behind; `lazy` detaches without trying a plain unmount
/// first. Other mounts are refused. The stats file and hints socket a daemon that died left are
/// removed.
pub fn unmount(path: &Path, lazy: bool, any_fuse: bool) -> Result<Unmounted, UnmountError> {
    let (abs, device) = checked_mount(path, any_fuse)?;
    let daemon = super::stats::daemon_pid(&abs, &device);
    let done = if nix::unistd::geteuid().is_root() {
        unmount_as_root(&abs, lazy)
    } else {
        unmount_with_fusermount(&abs, lazy)
    }?;
    // Unmounted, the daemon still ends its work (the stage's state written, its lock
    // released): a mount of the same stage right after would find it held. A detached mount's
    // daemon ends only once its open files close: not waited for.
    if let (Unmounted::Now, Some(pid)) = (done, daemon) {
        wait_for_exit(pid, &abs, &device);
    }
    let orphaned = super::stats::remove_if_orphaned(&abs, &device);
    super::hints::remove_if_orphaned(&abs, &device);
    // A killed daemon's --stage-in copy (in /dev/shm: RAM) would stay until the dataset is
    // mounted on the node again.
    if let Some(counters) = orphaned.filter(|c| c.about.stage_goes)
        && let Some(stage) = counters.stage
    {
        let dir = Path::new(&stage.dir);
        match crate::tiers::stage::per_node::discard_orphan(dir) {
            Ok(_) => tracing::info!(
                "removed the stage directory {} of its killed daemon",
                stage.dir
            ),
            Err(e) => tracing::warn!(
                "the stage directory {} of the killed daemon stays: {e}",
                stage.dir
            ),
        }
    }
    Ok(done)
}

/// How long `unmount` waits for the daemon to end at most, and when it says it waits.
const EXIT_PATIENCE: Duration = Duration::from_secs(60);
const EXIT_SAID: Duration = Duration::from_secs(2);

/// Waits until process `pid` (the daemon of `mountpoint`, on `device`) has ended, saying so if
/// it takes long. A daemon whose mount was copied into other mount namespaces while it was
/// mounted (a container, `unshare -m`) goes on serving the copies after the unmount here, for as
/// long as they last: once it has had `EXIT_SAID` to finish, it is told to stop (SIGTERM) and
/// the user is told who held it, so an unmount ends the daemon's service everywhere.
fn wait_for_exit(pid: i64, mountpoint: &Path, device: &str) {
    let started = Instant::now();
    let mut said = false;
    let mut stopped = false;
    while super::stats::alive(pid) {
        let waited = started.elapsed();
        if waited >= EXIT_SAID && !stopped {
            stopped = true;
            let copies = mounts::copies_elsewhere(device);
            if !copies.is_empty() {
                stop_serving_copies(pid, mountpoint, &copies);
                continue;
            }
        }
        if waited >= EXIT_PATIENCE {
            warn!(
                "the daemon of {} (pid {pid}) still runs {}s after its unmount; its stage may \
                 stay locked until it ends. If a copy of the mount lives on in a mount namespace \
                 this user cannot look into (another user's container), `kill {pid}` ends it",
                mountpoint.display(),
                waited.as_secs()
            );
            return;
        }
        if waited >= EXIT_SAID && !said {
            eprintln!(
                "packfs: waiting for the daemon of {} (pid {pid}) to finish (it writes its \
                 stage's state and releases it)",
                mountpoint.display()
            );
            said = true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Tells the daemon `pid` to stop (it unmounts what it can and ends; the copies then fail
/// with "Transport endpoint is not connected"), saying which processes held copies.
fn stop_serving_copies(pid: i64, mountpoint: &Path, copies: &[(i32, PathBuf)]) {
    let held: Vec<String> = copies
        .iter()
        .take(8)
        .map(|(p, at)| format!("pid {p} at {}", at.display()))
        .collect();
    eprintln!(
        "packfs: the daemon of {} (pid {pid}) still served copies of the mount in {} other mount \
         namespace(s) ({}{}: a container or `unshare -m` started while it was mounted); stopping \
         it, so those copies end too",
        mountpoint.display(),
        copies.len(),
        held.join(", "),
        if copies.len() > 8 { ", ..." } else { "" }
    );
    // SAFETY: a plain signal to a process of this user's (or root's) that `alive` just saw.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
}

/// Unmounts the packfs mount at `path` only if nothing uses it (no open file, no working
/// directory under it): false if it is busy. For `--idle-timeout`.
pub fn unmount_if_unused(path: &Path) -> Result<bool, UnmountError> {
    let (abs, _) = checked_mount(path, false)?;
    if nix::unistd::geteuid().is_root() {
        return match umount2(&abs, MntFlags::empty()) {
            Ok(()) => Ok(true),
            Err(Errno::EBUSY) => Ok(false),
            Err(error) => Err(UnmountError::Unmount { path: abs, error }),
        };
    }
    let (helper, program) = fusermount()?;
    let out = Command::new(program)
        .arg("-u")
        .arg(&abs)
        .output()
        .map_err(|error| UnmountError::Helper { helper, error })?;
    Ok(out.status.success())
}

/// The absolute path of `path` if it is a packfs mount (any FUSE mount with `any_fuse`) that
/// this user may unmount, and its device.
fn checked_mount(path: &Path, any_fuse: bool) -> Result<(PathBuf, String), UnmountError> {
    let abs = mounts::absolute(path).map_err(|error| UnmountError::Resolve {
        path: path.to_path_buf(),
        error,
    })?;
    let Some(entry) = mounts::find(&abs).map_err(UnmountError::Mountinfo)? else {
        // A typo in the path reads better as what it is than as "not a mount point".
        if std::fs::symlink_metadata(&abs).is_err_and(|e| e.kind() == io::ErrorKind::NotFound) {
            return Err(UnmountError::Missing(abs));
        }
        return Err(UnmountError::NotMounted(abs));
    };
    let ours = entry.fstype == format!("fuse.{}", crate::fs::SUBTYPE)
        // What root mounts of packfs 0.1 showed.
        || (entry.fstype == "fuse" && entry.source == "packfs");
    let fuse = entry.fstype == "fuse" || entry.fstype.starts_with("fuse.");
    if !(ours || any_fuse && fuse) {
        return Err(UnmountError::NotPackfs {
            path: abs,
            fstype: entry.fstype,
            from: entry.source,
        });
    }
    let me = nix::unistd::geteuid();
    if let Some(owner) = entry.fuse_owner()
        && !me.is_root()
        && owner != me.as_raw()
    {
        return Err(UnmountError::NotOwner {
            path: abs,
            owner: user_name(owner),
        });
    }
    Ok((abs, entry.device))
}

/// `name (uid N)`, or `uid N` for a uid without a name.
pub fn user_name(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(user)) => format!("{} (uid {uid})", user.name),
        _ => format!("uid {uid}"),
    }
}

fn unmount_as_root(path: &Path, lazy: bool) -> Result<Unmounted, UnmountError> {
    if !lazy {
        match umount2(path, MntFlags::empty()) {
            Ok(()) => return Ok(Unmounted::Now),
            Err(Errno::EBUSY) => {
                warn!("{} is busy; detaching it lazily", path.display());
            }
            Err(error) => {
                return Err(UnmountError::Unmount {
                    path: path.to_path_buf(),
                    error,
                });
            }
        }
    }
    umount2(path, MntFlags::MNT_DETACH).map_err(|error| UnmountError::Detach {
        path: path.to_path_buf(),
        error,
    })?;
    Ok(Unmounted::Detached)
}

fn unmount_with_fusermount(path: &Path, lazy: bool) -> Result<Unmounted, UnmountError> {
    let (helper, program) = fusermount()?;
    let failed_to_run = |error| UnmountError::Helper { helper, error };
    let run = |lazy: bool| {
        let mut cmd = Command::new(&program);
        cmd.arg(if lazy { "-uz" } else { "-u" }).arg(path);
        cmd.output()
    };
    if !lazy {
        let out = run(false).map_err(failed_to_run)?;
        if out.status.success() {
            return Ok(Unmounted::Now);
        }
        warn!(
            "{helper} -u {}: {}; detaching it lazily",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let out = run(true).map_err(failed_to_run)?;
    if !out.status.success() {
        return Err(UnmountError::HelperFailed {
            helper,
            path: path.to_path_buf(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(Unmounted::Detached)
}

/// The FUSE unmount helper of this machine: its name (for messages) and where it is.
fn fusermount() -> Result<(&'static str, PathBuf), UnmountError> {
    ["fusermount3", "fusermount"]
        .into_iter()
        .find_map(|name| find_program(name).map(|path| (name, path)))
        .ok_or(UnmountError::NoFusermount)
}

/// Where programs are looked for when PATH is unset or empty: mount(8) runs the helper of an
/// fstab `user` entry with an empty environment, and slurmd runs prologs without PATH.
pub const STANDARD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The first `program` in PATH, then in the standard directories (so a PATH without /usr/bin
/// still finds the setuid fusermount3 there).
pub(crate) fn find_program(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(std::env::split_paths(STANDARD_PATH))
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

pub(crate) fn which(program: &str) -> bool {
    find_program(program).is_some()
}
