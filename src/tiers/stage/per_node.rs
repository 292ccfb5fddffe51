//! A stage directory made by packfs (`--stage-in BASE`): one per node, user and dataset, so
//! every rank of a node that asks the same gets the same directory (and so one mount, one
//! copy), and nobody has to invent a name another user could have taken first. It goes with the
//! mount unless kept (`--keep-stage`).

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::Stage;

/// `BASE/packfs-UID/NAME-DIGEST`: NAME is the first source's file name (for people), DIGEST
/// names the sources themselves (as given, made absolute by the caller).
pub fn dir_for(base: &Path, sources: &[String], uid: u32) -> PathBuf {
    let mut hash = Sha256::new();
    for source in sources {
        hash.update(source.as_bytes());
        hash.update([0]);
    }
    let digest: String = hash.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let name: String = sources
        .first()
        .and_then(|s| Path::new(s).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(48)
        .collect();
    base.join(format!("packfs-{uid}"))
        .join(format!("{}-{digest}", name.trim_start_matches('.')))
}

/// Removes the staged copy, its state and the directory, while the stage's lock is still held
/// (the lock file last): a mount of the same directory started meanwhile is refused by the lock
/// until the files are gone, and then makes a new directory. Files still open (the staged
/// images) free their space when the daemon exits.
pub fn discard(stage: &Stage) -> std::io::Result<u64> {
    remove_locked(&stage.opts.dir)
}

/// The stage directory a daemon that was killed left (its mount's stats file names it), removed
/// as its daemon would have: only a directory `dir_for` makes (a `packfs-UID` of this user's
/// above it), and only once its lock is ours (no other mount uses it).
pub fn discard_orphan(dir: &Path) -> std::io::Result<u64> {
    let me = format!("packfs-{}", nix::unistd::geteuid().as_raw());
    let made_here = dir
        .parent()
        .and_then(|p| p.file_name())
        .is_some_and(|n| n.to_str() == Some(me.as_str()));
    if !made_here || !dir.is_absolute() {
        return Err(std::io::Error::other(format!(
            "{} is not a directory --stage-in makes for this user",
            dir.display()
        )));
    }
    let _lock = super::DirLock::take(dir, "packfs umount, removing it").map_err(|e| match e {
        super::LockError::Io { error, .. } => error,
        busy => std::io::Error::other(busy.to_string()),
    })?;
    remove_locked(dir)
}

/// Everything in `dir` but its lock, then the lock file, then `dir`: its lock must be held.
fn remove_locked(dir: &Path) -> std::io::Result<u64> {
    let mut removed = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name() == "packfs.lock" {
            continue;
        }
        // file_type does not follow links: a link is removed, never what it points to.
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(entry.path())?;
        } else {
            removed += entry.metadata().map_or(0, |m| m.len());
            std::fs::remove_file(entry.path())?;
        }
    }
    std::fs::remove_file(dir.join("packfs.lock"))?;
    std::fs::remove_dir(dir)?;
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rank of a node computes the same directory from the same sources; other sources or
    /// another user get another.
    #[test]
    fn one_directory_per_user_and_sources() {
        let base = Path::new("/dev/shm");
        let a = dir_for(base, &["/d/train.packfs-index".into()], 1000);
        assert_eq!(a, dir_for(base, &["/d/train.packfs-index".into()], 1000));
        assert!(a.starts_with("/dev/shm/packfs-1000"), "{a:?}");
        let name = a.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("train.packfs-index-"), "{name}");
        assert_ne!(a, dir_for(base, &["/e/train.packfs-index".into()], 1000));
        assert_ne!(a, dir_for(base, &["/d/train.packfs-index".into()], 1001));
        let many = dir_for(base, &["/d/a.tar".into(), "/d/b.tar".into()], 1000);
        assert_ne!(many, dir_for(base, &["/d/a.tar".into()], 1000));
        // A name made of anything lands in one component.
        let odd = dir_for(base, &["s3://b/../x y/..".into()], 0);
        assert_eq!(odd.parent().unwrap(), Path::new("/dev/shm/packfs-0"));
    }
}
