//! An ordinary user mounts, reads and unmounts through fusermount3, as HPC users do (no root).
//! Needs fusermount3 and /dev/fuse mode 0666 (the fuse3 package's default; `.ci/run` sets both).

mod common;

use std::fs;
use std::os::unix::fs::{PermissionsExt, chown};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::*;

const NOBODY: u32 = 65534;

/// Runs the packfs binary as user `nobody`.
fn as_nobody(packfs: &Path, args: &[&str]) -> Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(packfs)
        .args(args)
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .output()
        .expect("run setpriv")
}

#[test]
fn ordinary_user_mounts_reads_and_unmounts() {
    let mode = fs::metadata("/dev/fuse")
        .expect("/dev/fuse")
        .permissions()
        .mode();
    assert!(
        mode & 0o006 == 0o006,
        "/dev/fuse has mode {mode:o}: ordinary users cannot mount (bash .ci/run sets 0666)"
    );
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    // The binary and the data must be reachable by `nobody`.
    let bin = dir.path().join("packfs");
    fs::copy(env!("CARGO_BIN_EXE_packfs"), &bin).unwrap();
    let src = dir.path().join("src");
    write_file(&src.join("train/c/1.jpg"), &bytes(1, 50_000), 0o644);
    let shard = dir.path().join("s.tar");
    tar_members(&src, &shard, &["train"]);
    fs::set_permissions(&shard, fs::Permissions::from_mode(0o644)).unwrap();
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    chown(&mnt, Some(NOBODY), Some(NOBODY)).unwrap();
    let (shard_s, mnt_s) = (shard.to_str().unwrap(), mnt.to_str().unwrap());
    let pid_file = dir.path().join("run");
    fs::create_dir(&pid_file).unwrap();
    chown(&pid_file, Some(NOBODY), Some(NOBODY)).unwrap();
    let pid_file = pid_file.join("pid");

    let out = as_nobody(
        &bin,
        &[
            "mount",
            "--pid-file",
            pid_file.to_str().unwrap(),
            shard_s,
            mnt_s,
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(mnt_s))
        .map(str::to_string)
        .expect("mounted");
    assert!(line.contains("user_id=65534"), "{line}");
    // Without --allow-other, FUSE admits only the mounting user's processes: read as nobody.
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            "cat",
        ])
        .arg(mnt.join("train/c/1.jpg"))
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout, bytes(1, 50_000));

    // The daemon dies; the user cleans the stale mount and mounts again.
    let pid: i32 = fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    std::thread::sleep(Duration::from_millis(200));
    let out = as_nobody(&bin, &["umount", mnt_s]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!is_mounted(&mnt));
    let out = as_nobody(&bin, &["mount", shard_s, mnt_s]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = as_nobody(&bin, &["umount", mnt_s]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!is_mounted(&mnt));
}
