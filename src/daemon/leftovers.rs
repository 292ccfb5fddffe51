//! What an ended mount leaves on the node, removed: the daemon's own log in the runtime
//! directory (when nothing in it is worth keeping), the files `packfs.mount` keeps beside the
//! users file of a mount the processes of a node share, and old logs of mounts that ended
//! without a word (a daemon killed with SIGKILL). A node runs thousands of mounts between
//! reboots: each used to leave three files for good.

use std::fs::File;
use std::path::Path;
use std::time::{Duration, SystemTime};

use nix::fcntl::{Flock, FlockArg};
use tracing::info;

/// A log of an ended mount is kept this long, for whoever looks into why it ended.
const LOG_KEPT: Duration = Duration::from_secs(7 * 24 * 3600);

/// A live daemon rewrites its stats file every second: one untouched this long is not live.
const STATS_FRESH: Duration = Duration::from_secs(60);

/// The log a daemon wrote to the runtime directory (no --log-file, no syslog), removed at a
/// clean end unless it holds a warning or an error (then it stays for `LOG_KEPT`).
pub fn remove_quiet_log(log: &Path) {
    let Ok(text) = std::fs::read(log) else {
        return;
    };
    let said = |level: &[u8]| text.windows(level.len()).any(|w| w == level);
    if !said(b" WARN ") && !said(b" ERROR ") {
        let _ = std::fs::remove_file(log);
    }
}

/// Removes the logs in `dir` (the runtime directory) of mounts that ended over `LOG_KEPT` ago:
/// no stats file beside them is being rewritten.
pub fn prune_old_logs(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let now = SystemTime::now();
    let age = |path: &Path| {
        let modified = std::fs::symlink_metadata(path)
            .and_then(|m| m.modified())
            .ok()?;
        now.duration_since(modified).ok()
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        let is_log = path.extension().is_some_and(|e| e == "log")
            && entry.file_type().is_ok_and(|t| t.is_file());
        if !is_log || age(&path).is_none_or(|a| a < LOG_KEPT) {
            continue;
        }
        let live = age(&path.with_extension("json")).is_some_and(|a| a < STATS_FRESH);
        if !live && std::fs::remove_file(&path).is_ok() {
            removed += 1;
        }
    }
    if removed > 0 {
        info!(
            "removed {removed} log(s) of mounts that ended over {} days ago from {}",
            LOG_KEPT.as_secs() / 86_400,
            dir.display()
        );
    }
}

/// The users file `STEM.users` of a mount that ended, and the files beside it that
/// `packfs.mount` keeps (`STEM.lock`, the marker `STEM.json`, listings `STEM.ls-*`), removed
/// when no process holds either lock: a process attaching or leaving right now holds them,
/// and then it is the one that cleans up. The lock files go last, while held (a process that
/// opened one before checks, once it has the lock, that it is still the file at that path).
pub fn leave_place(users: &Path) {
    let Some(stem) = users
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(".users"))
    else {
        return;
    };
    let dir = users.parent().unwrap_or(Path::new("."));
    let lock_path = dir.join(format!("{stem}.lock"));
    let Some(_lock) = lock_now(&lock_path) else {
        return;
    };
    let Some(_users) = lock_now(users) else {
        return;
    };
    let _ = std::fs::remove_file(dir.join(format!("{stem}.json")));
    let listings = format!("{stem}.ls-");
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&listings) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    let _ = std::fs::remove_file(users);
    let _ = std::fs::remove_file(&lock_path);
}

/// An exclusive lock on an existing file of this user's, if nobody holds one.
fn lock_now(path: &Path) -> Option<Flock<File>> {
    use crate::util::safe_file;
    let file = safe_file::no_follow().read(true).open(path).ok()?;
    safe_file::check_owned(&file, path).ok()?;
    Flock::lock(file, FlockArg::LockExclusiveNonblock).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_nobody_holds_goes_and_one_held_stays() {
        let dir = tempfile::tempdir().unwrap();
        let names = [
            "m.users",
            "m.lock",
            "m.json",
            "m.ls-1.jsonl",
            "m.ls-1.jsonl.lock",
        ];
        for n in names {
            std::fs::write(dir.path().join(n), b"").unwrap();
        }
        std::fs::write(dir.path().join("other.json"), b"").unwrap();
        let held = File::open(dir.path().join("m.users")).unwrap();
        let held = Flock::lock(held, FlockArg::LockSharedNonblock).unwrap();
        leave_place(&dir.path().join("m.users"));
        for n in names {
            assert!(dir.path().join(n).exists(), "{n} removed while held");
        }
        drop(held);
        leave_place(&dir.path().join("m.users"));
        for n in names {
            assert!(!dir.path().join(n).exists(), "{n} left");
        }
        assert!(dir.path().join("other.json").exists());
    }

    #[test]
    fn a_log_with_a_warning_stays_and_a_quiet_one_goes() {
        let dir = tempfile::tempdir().unwrap();
        let quiet = dir.path().join("q.log");
        let warned = dir.path().join("w.log");
        std::fs::write(&quiet, "2026-01-01T00:00:00Z  INFO mounted\n").unwrap();
        std::fs::write(&warned, "2026-01-01T00:00:00Z  WARN member skipped\n").unwrap();
        remove_quiet_log(&quiet);
        remove_quiet_log(&warned);
        assert!(!quiet.exists() && warned.exists());
    }
}
