//! `packfs status`: the packfs mounts of this node (the caller's, or everyone's for root), each
//! with the counters its daemon writes every second, or why it has none (a stale mount whose
//! daemon died, with the command that cleans it).

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::mounts::{self, MountEntry};
use super::stats::{self, Counters};

/// Whether a mount answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MountState {
    /// Its daemon runs and writes its counters.
    Live,
    /// Its daemon is gone: every access fails until it is unmounted.
    Stale,
    /// No counters found, and it does not look dead (another user's, or an old packfs).
    Unknown,
}

/// One mount as `packfs status` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct MountStatus {
    pub mountpoint: PathBuf,
    /// The source column of the mount table: the index or first image.
    pub source: String,
    /// The user who mounted it.
    pub owner_uid: Option<u32>,
    pub state: MountState,
    /// What is wrong, and what to do, when not live.
    pub problem: Option<String>,
    pub stats_file: Option<PathBuf>,
    /// The stats file's contents (docs/metrics.md), when live.
    pub counters: Option<Counters>,
    /// How long ago the daemon wrote them (it rewrites them every second).
    pub counters_age_s: Option<f64>,
    /// The socket samplers send hints to, found even where the counters are not readable (a
    /// mount root made for a job's user: the socket is that user's).
    pub hints: Option<PathBuf>,
}

/// The mounts to show: those at `wanted` (all packfs mounts the caller may see if empty: root
/// sees everyone's, a user their own). A wanted path that is not a packfs mount is an error.
pub fn list(wanted: &[PathBuf]) -> std::io::Result<Vec<MountStatus>> {
    let all = mounts::packfs_mounts()?;
    let me = nix::unistd::getuid();
    if wanted.is_empty() {
        // A user's own, and root's made for them (a prolog's --uid), whose counters say so.
        let made_for_me = |s: &MountStatus| {
            s.counters
                .as_ref()
                .is_some_and(|c| c.about.served_uid == Some(me.as_raw()))
        };
        return Ok(all
            .iter()
            .filter_map(|m| match m.fuse_owner() {
                _ if me.is_root() => Some(status_of(m)),
                Some(owner) if owner == me.as_raw() => Some(status_of(m)),
                Some(0) => Some(status_of(m)).filter(made_for_me),
                _ => None,
            })
            .collect());
    }
    wanted
        .iter()
        .map(|path| {
            let abs = mounts::absolute(path)?;
            all.iter()
                .rev()
                .find(|m| m.mount_point == abs)
                .map(status_of)
                .ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!(
                            "{} is not a packfs mount (`packfs status` lists them all)",
                            abs.display()
                        ),
                    )
                })
        })
        .collect()
}

fn status_of(m: &MountEntry) -> MountStatus {
    let mut status = MountStatus {
        mountpoint: m.mount_point.clone(),
        source: m.source.clone(),
        owner_uid: m.fuse_owner(),
        state: MountState::Live,
        problem: None,
        stats_file: None,
        counters: None,
        counters_age_s: None,
        hints: None,
    };
    let stale = format!(
        "its daemon is gone, so every access fails (\"Transport endpoint is not connected\"); \
         clean it with `packfs umount {}`",
        m.mount_point.display()
    );
    // The stats file first: a live daemon's mount is not touched (a statfs of a mount whose
    // daemon is stuck would hang the status command).
    let owner = m.fuse_owner().unwrap_or(0);
    let candidates = stats::candidate_paths(&m.mount_point, &m.device, owner);
    status.hints = candidates
        .iter()
        .map(|p| super::hints::socket_beside(p))
        .find(|s| {
            use std::os::unix::fs::FileTypeExt;
            std::fs::symlink_metadata(s).is_ok_and(|m| m.file_type().is_socket())
        });
    let found = candidates
        .iter()
        .find_map(|p| read_counters(p, owner).map(|c| (p.clone(), c)));
    if let Some((path, counters)) = found {
        let pid = counters.pid as i64;
        status.stats_file = Some(path);
        if pid > 0 && stats::alive(pid) {
            status.counters_age_s = status.stats_file.as_deref().and_then(age_of);
            status.counters = Some(counters);
            return status;
        }
    }
    if super::preflight::is_dead(&m.mount_point) || status.stats_file.is_some() {
        status.state = MountState::Stale;
        status.problem = Some(stale);
        return status;
    }
    status.state = MountState::Unknown;
    status.problem = Some(format!(
        "no counters found for it (looked in {}): its daemon may be another user's (root sees \
         all), or from a packfs before 0.2",
        candidates
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    status
}

/// Seconds since `path` was last written, to a tenth.
fn age_of(path: &Path) -> Option<f64> {
    let written = std::fs::metadata(path).ok()?.modified().ok()?;
    let age = written.elapsed().unwrap_or_default().as_secs_f64();
    Some((age * 10.0).round() / 10.0)
}

/// The counters in a stats file, if it is the mount owner's (or root's) and nobody else can
/// write it: another user could make `/tmp/packfs-UID` before its user, to show root made-up
/// counters for that user's mount.
fn read_counters(path: &Path, owner: u32) -> Option<Counters> {
    use std::os::unix::fs::MetadataExt;
    let mut file = crate::util::safe_file::no_follow()
        .read(true)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    if crate::util::safe_file::foreign(&meta, &[owner, 0]).is_some() {
        tracing::warn!(
            "ignoring stats file {}: it belongs to {} (mode {:04o}), not to the mount's owner",
            path.display(),
            crate::util::safe_file::owner_name(meta.uid()),
            meta.mode() & 0o7777
        );
        return None;
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut file, &mut text).ok()?;
    serde_json::from_str(&text).ok()
}

#[cfg(test)]
mod tests {
    use super::read_counters;
    use std::os::unix::fs::PermissionsExt;

    /// Counters are read only from a file of the mount's owner (or root's) that nobody else can
    /// write, never through a symlink.
    #[test]
    fn stats_files_of_other_users_are_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mnt.json");
        std::fs::write(&path, br#"{"pid": 42}"#).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let me = nix::unistd::geteuid().as_raw();
        assert!(read_counters(&path, me).is_some());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(read_counters(&path, me).is_none());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(read_counters(&link, me).is_none());
        if me == 0 {
            // Made by another user: not the mount owner's (uid 1000 here) nor root's.
            std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
            assert!(read_counters(&path, 1000).is_none());
            assert!(read_counters(&path, 65534).is_some());
        }
    }
}
