//! The kernel's mount table, read from /proc/self/mountinfo.
//!
//! Paths are made absolute without touching the mount root itself: a stale FUSE mount answers every
//! stat with ENOTCONN, and `packfs umount` must still find it.
//!
//! Parsed here rather than with a crate: the only maintained parser (procfs) brings a dozen
//! dependencies for these 30 lines, and what matters here (never stat-ing the mount root) is ours.

use std::io;
use std::path::{Component, Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    /// The mounted file system's device, `major:minor`: for FUSE, one per connection, so one
    /// per daemon (a copy of the mount in another namespace has its daemon's).
    pub device: String,
    pub mount_point: PathBuf,
    pub fstype: String,
    pub source: String,
    /// The file system's own options (for FUSE: `user_id=`, the mounting user).
    pub options: String,
}

impl MountEntry {
    /// The user who mounted a FUSE file system (`user_id=` of its options).
    pub fn fuse_owner(&self) -> Option<u32> {
        self.options
            .split(',')
            .find_map(|o| o.strip_prefix("user_id="))
            .and_then(|v| v.parse().ok())
    }

    pub fn is_packfs(&self) -> bool {
        self.fstype == format!("fuse.{}", crate::fs::SUBTYPE)
    }
}

/// Every packfs mount in this mount namespace, in mount order.
pub fn packfs_mounts() -> io::Result<Vec<MountEntry>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(parse_mountinfo(&text)
        .into_iter()
        .filter(MountEntry::is_packfs)
        .collect())
}

/// Parses mountinfo text: `id parent major:minor root mount_point options [optional...] - fstype source super`.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let device = left.split(' ').nth(2)?.to_string();
            let mount_point = left.split(' ').nth(4)?;
            let mut right = right.split(' ');
            Some(MountEntry {
                device,
                mount_point: PathBuf::from(unescape(mount_point)),
                fstype: right.next()?.to_string(),
                source: unescape(right.next().unwrap_or("")),
                options: right.next().unwrap_or("").to_string(),
            })
        })
        .collect()
}

/// mountinfo writes space, tab, newline and backslash as `\ooo` octal escapes.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 4 <= bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
            && let Ok(v) = u8::from_str_radix(&field[i + 1..i + 4], 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The topmost mount at exactly `path` (absolute, as returned by [`absolute`]).
pub fn find(path: &Path) -> io::Result<Option<MountEntry>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(parse_mountinfo(&text)
        .into_iter()
        .rev()
        .find(|m| m.mount_point == path))
}

/// The device of the packfs mount on top at `path` (absolute), as this namespace sees it.
pub fn packfs_device(path: &Path) -> Option<String> {
    find(path)
        .ok()
        .flatten()
        .filter(MountEntry::is_packfs)
        .map(|m| m.device)
}

/// Processes, one per mount namespace other than this process's, that see a packfs mount of
/// `device` (a copy of it, made by `unshare -m` or a container started while it was mounted),
/// with where they see it. Namespaces of processes this user may not look into are not seen.
pub fn copies_elsewhere(device: &str) -> Vec<(i32, PathBuf)> {
    let ours = std::fs::read_link("/proc/self/ns/mnt").ok();
    let mut seen = std::collections::HashSet::new();
    let mut found = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(ns) = std::fs::read_link(entry.path().join("ns/mnt")) else {
            continue;
        };
        if Some(&ns) == ours.as_ref() || !seen.insert(ns) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(entry.path().join("mountinfo")) else {
            continue;
        };
        if let Some(m) = parse_mountinfo(&text)
            .into_iter()
            .find(|m| m.is_packfs() && m.device == device)
        {
            found.push((pid, m.mount_point));
        }
    }
    found
}

/// Makes `path` absolute and resolves symlinks in its parent; its last component is resolved
/// only when it is a symlink itself (by reading the link, never by a stat through it: the
/// mountpoint of a dead FUSE daemon answers every stat with ENOTCONN). A mountpoint given
/// through a link is mounted at the link's target, so `umount LINK` and `status LINK` must find
/// the target too.
pub fn absolute(path: &Path) -> io::Result<PathBuf> {
    let mut path = path.to_path_buf();
    // As many links as the kernel follows in one path.
    for _ in 0..40 {
        let abs = absolute_lexical(&path)?;
        match std::fs::symlink_metadata(&abs) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let target = std::fs::read_link(&abs)?;
                path = match abs.parent() {
                    Some(parent) => parent.join(target),
                    None => target,
                };
            }
            _ => return Ok(abs),
        }
    }
    Err(io::Error::from_raw_os_error(libc::ELOOP))
}

/// `path` absolute, `.` and `..` taken lexically, symlinks resolved in its parent only.
fn absolute_lexical(path: &Path) -> io::Result<PathBuf> {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    };
    let mut lexical = PathBuf::from("/");
    for comp in joined.components() {
        match comp {
            Component::Normal(c) => lexical.push(c),
            Component::ParentDir => {
                lexical.pop();
            }
            _ => {}
        }
    }
    match (lexical.parent(), lexical.file_name()) {
        (Some(parent), Some(name)) => Ok(parent
            .canonicalize()
            .unwrap_or_else(|_| parent.to_path_buf())
            .join(name)),
        _ => Ok(lexical),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mountinfo_lines() {
        let text = "36 35 98:0 / /mnt1 rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n\
                    90 36 0:55 / /tmp/with\\040space ro,nosuid,nodev - fuse.packfs packfs ro,user_id=0\n";
        let mounts = parse_mountinfo(text);
        assert_eq!(mounts.len(), 2);
        assert_eq!(mounts[0].fstype, "ext3");
        assert_eq!(mounts[1].mount_point, PathBuf::from("/tmp/with space"));
        assert_eq!(mounts[1].fstype, "fuse.packfs");
        assert_eq!(mounts[1].source, "packfs");
        assert_eq!(mounts[1].fuse_owner(), Some(0));
        assert_eq!(
            (mounts[0].device.as_str(), mounts[1].device.as_str()),
            ("98:0", "0:55")
        );
        assert!(mounts[1].is_packfs());
        assert_eq!(mounts[0].fuse_owner(), None);
    }

    #[test]
    fn absolute_is_lexical_in_the_last_component() {
        let abs = absolute(Path::new("/proc/self/../self/./mountinfo")).unwrap();
        assert!(abs.ends_with("mountinfo"));
        assert!(abs.is_absolute());
        assert!(!abs.to_string_lossy().contains(".."));
    }

    /// A mountpoint given through a link (or a chain of them, relative or not) is its target:
    /// mounted there, then `packfs umount LINK` said "not a mount point" and left it mounted.
    #[test]
    fn a_link_in_the_last_component_is_followed() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().canonicalize().unwrap().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink("real", dir.path().join("one")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("one"), dir.path().join("two")).unwrap();
        assert_eq!(absolute(&dir.path().join("two")).unwrap(), real);
        std::os::unix::fs::symlink("loop", dir.path().join("loop")).unwrap();
        assert!(absolute(&dir.path().join("loop")).is_err());
    }
}
