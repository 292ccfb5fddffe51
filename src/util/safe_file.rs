//! Files packfs writes, created so that another user of the node cannot redirect them: never
//! through a symlink (O_NOFOLLOW, or a new file made with O_EXCL and renamed over the old name),
//! and default directories only if they are the user's own and nobody else can write them (the
//! check ssh makes of ~/.ssh and systemd of runtime directories). What the daemon writes (stats,
//! metrics, logs, traces, pid files, staged copies) is readable by its owner only: it names
//! datasets, paths and counters another user of the node has no business reading.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Mode of the files packfs creates for itself: its owner's alone.
pub const PRIVATE: u32 = 0o600;

/// Open options that refuse a symlink in the last component (ELOOP), do not leak the descriptor
/// into children, and create a file readable by its owner only.
pub fn no_follow() -> OpenOptions {
    let mut opts = OpenOptions::new();
    opts.custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(PRIVATE);
    opts
}

/// Replaces `path` with `bytes` atomically: a new file with a random name is created beside it
/// (O_EXCL, so never through a symlink someone planted), written, given `mode` and renamed over
/// `path` (which replaces a symlink there, not its target).
pub fn replace(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    replace_for(path, bytes, mode, None)
}

/// `replace`, with the new file given group `gid` (when set) before it takes the name, so a
/// reader in that group (node_exporter, say) can read a file mode 0640 gives it.
pub fn replace_for(path: &Path, bytes: &[u8], mode: u32, gid: Option<u32>) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.", name.as_deref().unwrap_or("packfs")))
        .suffix(".tmp")
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    if let Some(gid) = gid {
        std::os::unix::fs::fchown(tmp.as_file(), None, Some(gid))?;
    }
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Why a default directory cannot be trusted.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    #[error("cannot create {}: {error}", dir.display())]
    Create {
        dir: std::path::PathBuf,
        error: io::Error,
    },
    #[error("{} is not safe to write in: {why}; {fix}", dir.display())]
    Unsafe {
        dir: std::path::PathBuf,
        why: String,
        /// What the user can do: remove it, if it is theirs; otherwise another path.
        fix: String,
    },
}

/// Makes `dir` with `mode` (its parent must exist) or checks the one there: a real directory (not
/// a symlink), owned by this user, writable by nobody else.
pub fn private_dir(dir: &Path, mode: u32) -> Result<(), DirError> {
    let created = std::fs::DirBuilder::new().mode(mode).create(dir);
    match created {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(error) => {
            return Err(DirError::Create {
                dir: dir.to_path_buf(),
                error,
            });
        }
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|error| DirError::Create {
        dir: dir.to_path_buf(),
        error,
    })?;
    let me = nix::unistd::geteuid().as_raw();
    // Another user's, in a shared directory such as /tmp or /dev/shm (sticky): this user cannot
    // remove it, so the message must not tell them to.
    let fix = match meta.uid() == me {
        true => "remove it (or give another path) and retry".to_string(),
        false => format!(
            "it is not yours to remove: give another path (or ask {} or the node's admin to \
             remove it)",
            owner_name(meta.uid())
        ),
    };
    let unsafe_because = |why: String| DirError::Unsafe {
        dir: dir.to_path_buf(),
        why,
        fix: fix.clone(),
    };
    if !meta.file_type().is_dir() {
        return Err(unsafe_because("it is not a directory (a symlink?)".into()));
    }
    match foreign(&meta, &[me]) {
        Some(Foreign::Owner(uid)) => Err(unsafe_because(format!(
            "it belongs to {}, not to this user ({})",
            owner_name(uid),
            owner_name(me)
        ))),
        Some(Foreign::Writable(mode)) => Err(unsafe_because(format!(
            "others can write in it (mode {mode:04o})"
        ))),
        None => Ok(()),
    }
}

/// Why another user could change a file or directory packfs reads back.
pub enum Foreign {
    /// It belongs to this uid, none of the owners allowed.
    Owner(u32),
    /// Group or others can write it (its mode).
    Writable(u32),
}

/// The one rule for what packfs reads back (stage, log, trace, stats): owned by one of `owners`
/// and writable by nobody else; otherwise why not.
pub fn foreign(meta: &std::fs::Metadata, owners: &[u32]) -> Option<Foreign> {
    if !owners.contains(&meta.uid()) {
        Some(Foreign::Owner(meta.uid()))
    } else if meta.mode() & 0o022 != 0 {
        Some(Foreign::Writable(meta.mode() & 0o7777))
    } else {
        None
    }
}

/// Makes `dir` and its missing parents (each with `mode`), or checks the ones there, for a
/// directory whose files packfs reads back (a stage): every directory on the way to it, as
/// written and after symlinks, belongs to root or this user and nobody else can move what is in
/// it (not writable by others, or sticky like /tmp and /dev/shm); a symlink on the way belongs
/// to root or this user; `dir` itself passes `private_dir`. Another user who owns a directory
/// on the way could swap `dir` for a directory of their own between two runs.
pub fn private_dir_all(dir: &Path, mode: u32) -> Result<(), DirError> {
    let abs = std::path::absolute(dir).map_err(|error| DirError::Create {
        dir: dir.to_path_buf(),
        error,
    })?;
    let unsafe_because = |why: String| DirError::Unsafe {
        dir: dir.to_path_buf(),
        why,
        fix: "give a path under directories only root and you can change".into(),
    };
    let parent = abs.parent().unwrap_or(Path::new("/"));
    let trusted = trusted_owners();
    // As written: each existing prefix (symlinks not followed).
    for prefix in parent.ancestors().collect::<Vec<_>>().into_iter().rev() {
        match std::fs::symlink_metadata(prefix) {
            Ok(meta) => {
                if let Some(why) = unsafe_ancestor(&meta, &trusted) {
                    return Err(unsafe_because(format!("{} {why}", prefix.display())));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => break,
            Err(error) => {
                return Err(DirError::Create {
                    dir: prefix.to_path_buf(),
                    error,
                });
            }
        }
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(parent)
        .map_err(|error| DirError::Create {
            dir: parent.to_path_buf(),
            error,
        })?;
    // Where the symlinks lead.
    let real = std::fs::canonicalize(parent).map_err(|error| DirError::Create {
        dir: parent.to_path_buf(),
        error,
    })?;
    for ancestor in real.ancestors() {
        let meta = std::fs::symlink_metadata(ancestor).map_err(|error| DirError::Create {
            dir: ancestor.to_path_buf(),
            error,
        })?;
        if let Some(why) = unsafe_ancestor(&meta, &trusted) {
            return Err(unsafe_because(format!("{} {why}", ancestor.display())));
        }
    }
    private_dir(dir, mode)
}

/// Why a directory (or symlink) on the way to a private directory lets another user redirect
/// it, if it does.
fn unsafe_ancestor(meta: &std::fs::Metadata, trusted: &[u32]) -> Option<String> {
    match foreign(meta, trusted)? {
        Foreign::Owner(uid) => Some(format!(
            "belongs to {}, who could replace what is in it",
            owner_name(uid)
        )),
        // A sticky directory (/tmp, /dev/shm) lets others add entries, not replace ours; a
        // symlink's own mode means nothing.
        Foreign::Writable(mode) if meta.file_type().is_dir() && mode & 0o1000 == 0 => {
            Some(format!(
                "can be written by others (mode {mode:04o}) and is not sticky, so they could \
                 replace what is in it"
            ))
        }
        Foreign::Writable(_) => None,
    }
}

/// Root and this user. In a user namespace, the real root's files show as the overflow uid
/// (65534), which is taken for root's there.
fn trusted_owners() -> Vec<u32> {
    let mut owners = vec![0, nix::unistd::geteuid().as_raw()];
    if crate::util::userns::in_user_namespace() {
        owners.push(overflow_uid());
    }
    owners
}

fn overflow_uid() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/overflowuid")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(65534)
}

/// "uid 1000 (alice)", or just the uid where it has no name.
pub fn owner_name(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(user)) => format!("uid {uid} ({})", user.name),
        _ => format!("uid {uid}"),
    }
}

/// Refuses an opened file that another user owns or can write: packfs reads back what it wrote
/// there (staged bytes, their checksums, a log it appends to), and another user's file could
/// hold anything, or let them read what packfs puts in it.
pub fn check_owned(file: &File, path: &Path) -> io::Result<()> {
    let meta = file.metadata()?;
    let me = nix::unistd::geteuid().as_raw();
    let why = match foreign(&meta, &[me]) {
        None => return Ok(()),
        Some(Foreign::Owner(uid)) => format!(
            "{} belongs to {}, not to this user ({}): packfs does not use a file another \
             user owns; remove it, or give a path of your own",
            path.display(),
            owner_name(uid),
            owner_name(me)
        ),
        Some(Foreign::Writable(mode)) => format!(
            "others can write to {} (mode {mode:04o}): packfs does not use a file another user \
             can change; remove it (or `chmod go-w` it if its content is yours) and retry",
            path.display()
        ),
    };
    Err(io::Error::new(io::ErrorKind::PermissionDenied, why))
}

/// Opens (creating if needed, owner only) a file packfs keeps reading and writing, never through
/// a symlink, and only if it is this user's own and nobody else can write it.
pub fn open_owned(path: &Path) -> io::Result<File> {
    let file = no_follow()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(explain_symlink)?;
    check_owned(&file, path)?;
    Ok(file)
}

/// Opens `path` for appending, creating it (owner only) if needed, never through a symlink, and
/// only if it is this user's own and nobody else can write it.
pub fn append(path: &Path) -> io::Result<File> {
    let file = no_follow()
        .create(true)
        .append(true)
        .open(path)
        .map_err(explain_symlink)?;
    check_owned(&file, path)?;
    Ok(file)
}

/// Creates `path` (or empties the file there, if it is this user's own and nobody else can
/// write it) for writing, never through a symlink.
pub fn create_truncate(path: &Path, mode: u32) -> io::Result<File> {
    let file = no_follow()
        .create(true)
        .write(true)
        .truncate(false)
        .mode(mode)
        .open(path)
        .map_err(explain_symlink)?;
    check_owned(&file, path)?;
    file.set_len(0)?;
    Ok(file)
}

fn explain_symlink(e: io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(libc::ELOOP) => io::Error::new(
            e.kind(),
            "it is a symbolic link, and packfs does not write through one (whoever can \
                 change the link could point it anywhere): give the file's own path",
        ),
        _ => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replace_never_writes_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("victim");
        std::fs::write(&target, b"precious").unwrap();
        let planted = dir.path().join("stats.json");
        std::os::unix::fs::symlink(&target, &planted).unwrap();
        replace(&planted, b"{}", 0o644).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"precious");
        assert_eq!(std::fs::read(&planted).unwrap(), b"{}");
        assert!(!std::fs::symlink_metadata(&planted).unwrap().is_symlink());
    }

    #[test]
    fn private_dirs_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let mine = dir.path().join("mine");
        private_dir(&mine, 0o700).unwrap();
        assert_eq!(std::fs::metadata(&mine).unwrap().mode() & 0o777, 0o700);
        private_dir(&mine, 0o700).unwrap();
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = private_dir(&mine, 0o700).unwrap_err().to_string();
        assert!(err.contains("others can write in it (mode 0777)"), "{err}");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path(), &link).unwrap();
        let err = private_dir(&link, 0o700).unwrap_err().to_string();
        assert!(err.contains("not a directory"), "{err}");
        // Another user's: not theirs to remove (it was said to remove it, which a user cannot
        // in /tmp or /dev/shm).
        let squatted = dir.path().join("packfs-1000");
        std::fs::create_dir(&squatted).unwrap();
        std::os::unix::fs::lchown(&squatted, Some(65_534), Some(65_534)).unwrap();
        let err = private_dir(&squatted, 0o700).unwrap_err().to_string();
        assert!(
            err.contains("not yours to remove") && !err.contains("remove it (or"),
            "{err}"
        );
        let err = no_follow().read(true).open(&link).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP));
        let log = dir.path().join("log");
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), &log).unwrap();
        let err = append(&log).unwrap_err().to_string();
        assert!(err.contains("symbolic link"), "{err}");
        assert!(!dir.path().join("elsewhere").exists());
    }
}
