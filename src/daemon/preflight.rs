//! Checks before mounting, so that a prologue fails at once with the reason and the remedy.

use std::path::{Path, PathBuf};

use tracing::warn;

use super::{MountError, mounts, unmount};

/// Checks that `path` can take a new mount (an empty directory, or any with `nonempty`), and
/// returns it absolute.
pub fn check_mountpoint(path: &Path, nonempty: bool) -> Result<PathBuf, MountError> {
    let unusable = |error| MountError::Mountpoint {
        path: path.to_path_buf(),
        error,
    };
    let abs = mounts::absolute(path).map_err(unusable)?;
    match std::fs::metadata(&abs) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Err(MountError::NotADirectory(abs)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(MountError::NoMountpoint(abs));
        }
        Err(e) if e.raw_os_error().is_some_and(means_disconnected) => {
            return Err(MountError::Stale(abs));
        }
        Err(error) => return Err(MountError::Mountpoint { path: abs, error }),
    }
    if let Some(m) = mounts::find(&abs).map_err(unusable)? {
        if m.fstype.starts_with("fuse") && is_dead(&abs) {
            return Err(MountError::Stale(abs));
        }
        return Err(MountError::AlreadyMounted {
            path: abs,
            fstype: m.fstype,
            from: m.source,
        });
    }
    if !nonempty {
        let mut listing = std::fs::read_dir(&abs).map_err(unusable)?;
        if listing.next().is_some() {
            return Err(MountError::NotEmpty(abs));
        }
    }
    Ok(abs)
}

/// Whether the FUSE mount at `path` has lost its daemon. The kernel answers stat, and even
/// listings, from its caches after the daemon died; statfs always asks the daemon.
pub fn is_dead(path: &Path) -> bool {
    nix::sys::statfs::statfs(path).is_err_and(|e| means_disconnected(e as i32))
}

/// Whether a FUSE request's errno says the daemon is gone: ENOTCONN once the connection is
/// down; ECONNABORTED, or ECANCELED from the ring transport's queues, for a request that was
/// pending while it went down. Over io_uring the kernel tears the connection down after the
/// daemon's exit, in the background: statfs right after a `kill -9` met ECANCELED 18 times and
/// ECONNABORTED 12 times in 30, and a check seeing one took the dead mount for a live one.
pub fn means_disconnected(errno: i32) -> bool {
    [libc::ENOTCONN, libc::ECONNABORTED, libc::ECANCELED].contains(&errno)
}

/// Checks that this process can mount a FUSE file system at all. Root opens /dev/fuse itself;
/// other users go through the setuid helper fusermount3, which opens it for them.
pub fn check_fuse_available() -> Result<(), MountError> {
    const DEV: &str = "/dev/fuse";
    if !Path::new(DEV).exists() {
        return Err(MountError::NoFuseDevice);
    }
    if nix::unistd::geteuid().is_root() {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(DEV)
            .map_err(MountError::FuseDevice)?;
        // Root in a container without CAP_SYS_ADMIN cannot mount(2); fuser then tries
        // fusermount3, which container images seldom have, and its absence read as "No such
        // file or directory".
        if !has_cap_sys_admin() && !has_fusermount() {
            return Err(MountError::MountRefused {
                at: String::new(),
                why: "this process lacks CAP_SYS_ADMIN, which mounting needs",
            });
        }
    } else if !has_fusermount() {
        return Err(MountError::NoFusermount);
    } else if let Some((helper, why)) = fusermount_cannot_gain_root() {
        return Err(MountError::FusermountNotSetuid {
            helper: helper.display().to_string(),
            why,
        });
    } else if nix::unistd::access(
        DEV,
        nix::unistd::AccessFlags::R_OK | nix::unistd::AccessFlags::W_OK,
    )
    .is_err()
    {
        // Neither fuser nor fusermount3 can mount for an ordinary user then.
        return Err(MountError::FuseDeviceMode);
    }
    Ok(())
}

fn has_fusermount() -> bool {
    unmount::which("fusermount3") || unmount::which("fusermount")
}

/// Why the fusermount3 that would mount for this (non-root) user cannot act as root, if it
/// cannot: not setuid root, or this process may not gain privileges (no_new_privs, which
/// containers set). Either way it fails with a bare "Operation not permitted".
fn fusermount_cannot_gain_root() -> Option<(std::path::PathBuf, &'static str)> {
    use std::os::unix::fs::MetadataExt;
    let helper =
        unmount::find_program("fusermount3").or_else(|| unmount::find_program("fusermount"))?;
    let meta = std::fs::metadata(&helper).ok()?;
    if meta.uid() != 0 || meta.mode() & 0o4000 == 0 {
        return Some((helper, "it is not setuid root"));
    }
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let no_new_privs = status
        .lines()
        .find_map(|l| l.strip_prefix("NoNewPrivs:"))
        .is_some_and(|v| v.trim() == "1");
    no_new_privs.then_some((
        helper,
        "this process may not gain privileges (no_new_privs is set, as containers often set it)",
    ))
}

/// Whether this process holds CAP_SYS_ADMIN (in its user namespace): the `CapEff` mask of
/// /proc/self/status. Unreadable counts as held, so the mount itself decides.
fn has_cap_sys_admin() -> bool {
    const CAP_SYS_ADMIN: u32 = 21;
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return true;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_none_or(|caps| caps & (1 << CAP_SYS_ADMIN) != 0)
}

/// A failed mount, explained where fuser's fallback to fusermount3 hid the kernel's refusal
/// behind "not found".
pub fn mount_failed(path: &Path, error: std::io::Error) -> MountError {
    if error.kind() == std::io::ErrorKind::NotFound && !has_fusermount() {
        return MountError::MountRefused {
            at: format!(" at {}", path.display()),
            why: "the kernel refused the mount (no CAP_SYS_ADMIN, or a security profile such \
                  as Docker's default AppArmor profile forbids mount)",
        };
    }
    MountError::Mount {
        path: path.to_path_buf(),
        error,
    }
}

/// Every image stays open for the life of the mount, and datasets come in thousands of shards:
/// lift the soft limit on open files to the hard one.
pub fn raise_open_file_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        warn!("cannot raise the open-file limit from {soft} to {hard}: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_aborted_request_means_the_daemon_is_gone() {
        for errno in [libc::ENOTCONN, libc::ECONNABORTED, libc::ECANCELED] {
            assert!(means_disconnected(errno), "{errno}");
        }
        assert!(!means_disconnected(libc::EIO) && !means_disconnected(libc::EINTR));
    }
}
