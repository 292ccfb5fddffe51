//! Unmounting, also of a stale mount whose daemon died ("Transport endpoint is not connected").

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};
use nix::errno::Errno;
use nix::mount::{MntFlags, umount2};
use tracing::warn;

use super::mounts;

/// How an unmount went.
#[derive(Debug, PartialEq, Eq)]
pub enum Unmounted {
    /// Gone at once.
    Now,
    /// Detached while files were open: the daemon serves those until they close.
    Detached,
}

/// Unmounts the FUSE mount at `path`. A busy mount is detached (lazily unmounted) rather than left
/// behind; `lazy` detaches without trying a plain unmount first. Refuses to touch non-FUSE mounts.
pub fn unmount(path: &Path, lazy: bool) -> anyhow::Result<Unmounted> {
    let abs =
        mounts::absolute(path).with_context(|| format!("cannot resolve {}", path.display()))?;
    let Some(entry) = mounts::find(&abs).context("cannot read /proc/self/mountinfo")? else {
        bail!("{} is not a mount point", abs.display());
    };
    if !entry.fstype.starts_with("fuse") {
        bail!(
            "{} is a {} mount of {}, not a packfs mount; leaving it alone",
            abs.display(),
            entry.fstype,
            entry.source
        );
    }
    if nix::unistd::geteuid().is_root() {
        unmount_as_root(&abs, lazy)
    } else {
        unmount_with_fusermount(&abs, lazy)
    }
}

fn unmount_as_root(path: &Path, lazy: bool) -> anyhow::Result<Unmounted> {
    if !lazy {
        match umount2(path, MntFlags::empty()) {
            Ok(()) => return Ok(Unmounted::Now),
            Err(Errno::EBUSY) => {
                warn!("{} is busy; detaching it lazily", path.display());
            }
            Err(e) => bail!("cannot unmount {}: {e}", path.display()),
        }
    }
    umount2(path, MntFlags::MNT_DETACH)
        .with_context(|| format!("cannot detach {}", path.display()))?;
    Ok(Unmounted::Detached)
}

fn unmount_with_fusermount(path: &Path, lazy: bool) -> anyhow::Result<Unmounted> {
    let helper = ["fusermount3", "fusermount"]
        .into_iter()
        .find(|h| which(h))
        .context("unmounting as a non-root user needs fusermount3 (package fuse3)")?;
    let run = |lazy: bool| {
        let mut cmd = Command::new(helper);
        cmd.arg(if lazy { "-uz" } else { "-u" }).arg(path);
        cmd.output()
    };
    if !lazy {
        let out = run(false).with_context(|| format!("cannot run {helper}"))?;
        if out.status.success() {
            return Ok(Unmounted::Now);
        }
        warn!(
            "{helper} -u {}: {}; detaching it lazily",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let out = run(true).with_context(|| format!("cannot run {helper}"))?;
    if !out.status.success() {
        bail!(
            "{helper} -uz {} failed: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(Unmounted::Detached)
}

pub(crate) fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}
