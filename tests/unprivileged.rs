//! Ordinary users: mounting through fusermount3 as HPC users do (no root), and reading a mount
//! that a root prologue made for them. The first needs fusermount3 and /dev/fuse mode 0666 (the
//! fuse3 package's default; `.ci/run` sets both).

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, chown};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::*;

const NOBODY: u32 = 65534;

/// Runs `program` as user `uid` (group `uid` too).
fn as_user(uid: u32, program: &Path, args: &[&str]) -> Output {
    Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .args(["--clear-groups", "--"])
        .arg(program)
        .args(args)
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .output()
        .expect("run setpriv")
}

fn as_nobody(packfs: &Path, args: &[&str]) -> Output {
    as_user(NOBODY, packfs, args)
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
    assert_ok(&out);
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
    assert_ok(&out);
    assert_eq!(out.stdout, bytes(1, 50_000));

    // The daemon dies; the user cleans the stale mount and mounts again.
    let pid: i32 = read_pid(&pid_file);
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    std::thread::sleep(Duration::from_millis(200));
    let out = as_nobody(&bin, &["umount", mnt_s]);
    assert_ok(&out);
    assert!(!is_mounted(&mnt));
    let out = as_nobody(&bin, &["mount", shard_s, mnt_s]);
    assert_ok(&out);
    let out = as_nobody(&bin, &["umount", mnt_s]);
    assert_ok(&out);
    assert!(!is_mounted(&mnt));
}

/// A root prologue mounts for the job's user: `--allow-other` lets the user in, `--uid/--gid` make
/// the user the owner, so the archive's owner bits (a 0600 file) apply to that user and no other.
#[test]
fn root_mounts_for_a_job_user() {
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let src = dir.path().join("src");
    write_file(&src.join("data/private.bin"), &bytes(2, 1000), 0o600);
    write_file(&src.join("data/public.bin"), &bytes(3, 1000), 0o644);
    let shard = dir.path().join("s.tar");
    tar_members(&src, &shard, &["data"]);
    let uid = NOBODY.to_string();
    let m = Mount::new(
        &[&shard],
        &dir.path().join("mnt"),
        &["--allow-other", "--uid", &uid, "--gid", &uid],
    );
    let private = m.dir.join("data/private.bin");
    let public = m.dir.join("data/public.bin");
    let meta = fs::metadata(&private).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (NOBODY, NOBODY));
    let cat = Path::new("cat");
    let out = as_user(NOBODY, cat, &[private.to_str().unwrap()]);
    assert_ok(&out);
    assert_eq!(out.stdout, bytes(2, 1000));
    // Another user reads what the archive lets others read, and nothing else.
    let other = NOBODY - 1;
    assert_ok(&as_user(other, cat, &[public.to_str().unwrap()]));
    let denied = as_user(other, cat, &[private.to_str().unwrap()]);
    assert!(!denied.status.success());
    assert!(String::from_utf8_lossy(&denied.stderr).contains("Permission denied"));
}
