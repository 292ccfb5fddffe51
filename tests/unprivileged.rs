//! Ordinary users: mounting through fusermount3 as HPC users do (no root), and reading a mount
//! that a root prologue made for them. The first needs fusermount3 and /dev/fuse mode 0666 (the
//! fuse3 package's default; `.ci/run` sets both).

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, chown};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::*;

const NOBODY: u32 = 65534;

/// A copy of the binary, a shard holding `train/c/1.jpg` (`len` bytes of seed `seed`) and an
/// empty mountpoint of `nobody`'s, all where `nobody` can reach them.
fn nobodys_dataset(seed: u64, len: usize) -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.path().join("packfs");
    fs::copy(env!("CARGO_BIN_EXE_packfs"), &bin).unwrap();
    let src = dir.path().join("src");
    write_file(&src.join("train/c/1.jpg"), &bytes(seed, len), 0o644);
    let shard = dir.path().join("s.tar");
    tar_members(&src, &shard, &["train"]);
    fs::set_permissions(&shard, fs::Permissions::from_mode(0o644)).unwrap();
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    chown(&mnt, Some(NOBODY), Some(NOBODY)).unwrap();
    (dir, bin, shard, mnt)
}

fn as_nobody(packfs: &Path, args: &[&str]) -> Output {
    as_user(NOBODY, packfs, args)
}

/// What an ordinary user's mount needs, prepared as the fuse3 package would: `fusermount3`, and
/// /dev/fuse with mode 0666 (its udev rule; fresh machines and containers often have 0600, which
/// the tests, running as root, change). False, with a SKIPPED line, if it cannot be had.
fn user_mounts_possible() -> bool {
    let found = ["/usr/bin/fusermount3", "/bin/fusermount3"]
        .iter()
        .any(|p| Path::new(p).exists());
    if !found {
        skip(
            "fusermount3",
            "fusermount3 is not installed (package fuse3; `bash .ci/run` installs it), so \
             ordinary users cannot mount here",
        );
        return false;
    }
    let mode = fs::metadata("/dev/fuse")
        .expect("/dev/fuse")
        .permissions()
        .mode()
        & 0o7777;
    if mode & 0o006 == 0o006 {
        return true;
    }
    if nix::unistd::geteuid().is_root()
        && fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(0o666)).is_ok()
    {
        eprintln!(
            "/dev/fuse had mode {mode:04o}; set to 0666 as the fuse3 package's udev rule does"
        );
        return true;
    }
    skip(
        "user-mounts",
        &format!(
            "/dev/fuse has mode {mode:04o}, so ordinary users cannot mount (as root: chmod 0666 \
             /dev/fuse, as the fuse3 package's udev rule does)"
        ),
    );
    false
}

#[test]
fn ordinary_user_mounts_reads_and_unmounts() {
    if !user_mounts_possible() {
        return;
    }
    let (dir, bin, shard, mnt) = nobodys_dataset(1, 50_000);
    let _cleanup = UnmountOnDrop(mnt.clone());
    let (shard_s, mnt_s) = (shard.to_str().unwrap(), mnt.to_str().unwrap());
    let pid_file = dir.path().join("run");
    fs::create_dir(&pid_file).unwrap();
    chown(&pid_file, Some(NOBODY), Some(NOBODY)).unwrap();
    let log = pid_file.join("mount.log");
    let pid_file = pid_file.join("pid");

    let out = as_nobody(
        &bin,
        &[
            "mount",
            "--pid-file",
            pid_file.to_str().unwrap(),
            "--log-file",
            log.to_str().unwrap(),
            shard_s,
            mnt_s,
        ],
    );
    assert_ok(&out);
    // Only root may raise the kernel's readahead: the user is told, in one readable line.
    let logged = fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains(
            "kernel readahead stays at 128 KiB (raising it to 1024 KiB needs root): samples over \
             that size take one request per 128 KiB"
        ),
        "{logged}"
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
    assert_ok(&out);
    assert_eq!(out.stdout, bytes(1, 50_000));

    // Mounts say what they are: type fuse.packfs, the dataset as source.
    assert!(
        line.contains(&format!(" - fuse.packfs {shard_s} ")),
        "{line}"
    );

    // The daemon dies; the user cleans the stale mount (and the stats file the daemon left) and
    // mounts again.
    // Named by the mount point and the mount's device (one per daemon).
    let device = packfs::daemon::mounts::packfs_device(&mnt).expect("mounted");
    let stats = Path::new("/tmp/packfs-65534").join(format!(
        "mnt.{:016x}.{}.json",
        xxhash_rust::xxh3::xxh3_64(mnt_s.as_bytes()),
        device.replace(':', "-")
    ));
    let start = std::time::Instant::now();
    while !stats.exists() && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(stats.exists(), "{} missing", stats.display());
    let pid: i32 = read_pid(&pid_file);
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    std::thread::sleep(Duration::from_millis(200));
    let out = as_nobody(&bin, &["mount", shard_s, mnt_s]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("stale mount whose daemon died"), "{err}");
    let out = as_nobody(&bin, &["umount", mnt_s]);
    assert_ok(&out);
    assert!(!is_mounted(&mnt));
    assert!(!stats.exists(), "{} left behind", stats.display());
    let out = as_nobody(&bin, &["mount", shard_s, mnt_s]);
    assert_ok(&out);
    let out = as_nobody(&bin, &["umount", mnt_s]);
    assert_ok(&out);
    assert!(!is_mounted(&mnt));
}

/// A root prologue mounts for the job's user: `--allow-other` lets the user in, `--uid/--gid` make
/// the user the owner, so the archive's owner bits (a 0600 file) apply to that user and no other.
/// In a container that forbids privilege gain (no_new_privs), the setuid fusermount3 runs
/// without root and says only "mount failed: Operation not permitted": the mount says why and
/// what to do, before trying.
#[test]
fn a_user_who_may_not_gain_privileges_is_told_why_the_mount_fails() {
    if !user_mounts_possible() {
        return;
    }
    let (_dir, bin, shard, mnt) = nobodys_dataset(2, 1000);
    let _cleanup = UnmountOnDrop(mnt.clone());
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--no-new-privs",
            "--",
        ])
        .arg(&bin)
        .args(["mount", shard.to_str().unwrap(), mnt.to_str().unwrap()])
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("may not gain privileges") && err.contains("no-new-privileges"),
        "{err}"
    );
    assert!(!is_mounted(&mnt));
}

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

    // The job's user sees the mount made for them in `packfs status`, with its counters (they
    // were told "no packfs mounts of this user"); another user does not.
    let bin = dir.path().join("packfs");
    fs::copy(env!("CARGO_BIN_EXE_packfs"), &bin).unwrap();
    let listed = |uid: u32| -> serde_json::Value {
        // Exit 1 when any mount it lists is stale: another test's, killed on purpose.
        let out = as_user(uid, &bin, &["status", "--json"]);
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)))
    };
    let mine = listed(NOBODY);
    let ours: Vec<&serde_json::Value> = mine
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["mountpoint"] == m.dir.to_str().unwrap())
        .collect();
    assert_eq!(ours.len(), 1, "{mine}");
    assert_eq!(ours[0]["state"], "live", "{mine}");
    assert_eq!(ours[0]["counters"]["served_uid"], NOBODY, "{mine}");
    let theirs = listed(other);
    assert!(
        !theirs.to_string().contains(m.dir.to_str().unwrap()),
        "{theirs}"
    );
}

/// Without XDG_RUNTIME_DIR a user's stats go to /tmp/packfs-UID. If another user made that
/// directory first (to read or redirect what the daemon writes), the mount is refused with the
/// reason; it used to be accepted.
#[test]
fn default_runtime_dir_made_by_another_user_is_refused() {
    if !user_mounts_possible() {
        return;
    }
    // A user with a passwd entry (fusermount3 needs a name) that no other test uses: lp.
    let uid = 7;
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.path().join("packfs");
    fs::copy(env!("CARGO_BIN_EXE_packfs"), &bin).unwrap();
    let src = dir.path().join("src");
    write_file(&src.join("a.txt"), b"a\n", 0o644);
    let shard = dir.path().join("s.tar");
    tar_members(&src, &shard, &["a.txt"]);
    fs::set_permissions(&shard, fs::Permissions::from_mode(0o644)).unwrap();
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    chown(&mnt, Some(uid), Some(uid)).unwrap();
    let _cleanup = UnmountOnDrop(mnt.clone());
    let squatted = Path::new("/tmp").join(format!("packfs-{uid}"));
    let _ = fs::remove_dir_all(&squatted);
    fs::create_dir(&squatted).unwrap();
    fs::set_permissions(&squatted, fs::Permissions::from_mode(0o777)).unwrap();
    let args = [shard.to_str().unwrap(), mnt.to_str().unwrap()];
    let out = as_user(uid, &bin, &["mount", args[0], args[1]]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(!is_mounted(&mnt));
    assert!(
        err.contains(&format!("{} is not safe", squatted.display()))
            && err.contains("belongs to uid 0")
            && err.contains("set XDG_RUNTIME_DIR to a private directory of your own"),
        "{err}"
    );
    // The way out the message gives works: a private runtime directory of their own.
    let runtime = dir.path().join("run-7");
    fs::create_dir(&runtime).unwrap();
    chown(&runtime, Some(uid), Some(uid)).unwrap();
    fs::set_permissions(&runtime, fs::Permissions::from_mode(0o700)).unwrap();
    let as_user_with_runtime = |args: &[&str]| {
        Command::new("setpriv")
            .arg(format!("--reuid={uid}"))
            .arg(format!("--regid={uid}"))
            .args(["--clear-groups", "--"])
            .arg(&bin)
            .args(args)
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("XDG_RUNTIME_DIR", &runtime)
            .output()
            .unwrap()
    };
    assert_ok(&as_user_with_runtime(&["mount", args[0], args[1]]));
    assert!(runtime.join("packfs").is_dir());
    assert_ok(&as_user_with_runtime(&["umount", args[1]]));
    // Their own directory, private, is used.
    fs::remove_dir(&squatted).unwrap();
    assert_ok(&as_user(uid, &bin, &["mount", args[0], args[1]]));
    assert_ok(&as_user(uid, &bin, &["umount", args[1]]));
    let meta = fs::metadata(&squatted).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (uid, 0o700));
    fs::remove_dir_all(&squatted).unwrap();
}

/// A rootless container's view (`unshare -Urm` as an ordinary user, as Apptainer's `--userns`
/// and rootless Podman do): uid 0 inside is `nobody` outside, the kernel allows the FUSE mount
/// itself (no fusermount3, whose setuid bit means nothing there). It failed: packfs took itself
/// for root and wanted /run/packfs, which belongs to the real root.
#[test]
fn a_user_namespace_mounts_reads_and_unmounts() {
    if !user_mounts_possible() {
        return;
    }
    let probe = as_user(NOBODY, "unshare", &["-Urm", "true"]);
    if !probe.status.success() {
        skip(
            "userns",
            &format!(
                "this kernel does not let an ordinary user make a user namespace ({}): \
                 kernel.unprivileged_userns_clone or an AppArmor rule forbids it",
                String::from_utf8_lossy(&probe.stderr).trim()
            ),
        );
        return;
    }
    let (_dir, bin, shard, mnt) = nobodys_dataset(3, 70_000);
    let script = format!(
        "set -e; {bin} mount {shard} {mnt}; wc -c < {mnt}/train/c/1.jpg; {bin} status {mnt}; \
         {bin} umount {mnt}; echo unmounted",
        bin = bin.display(),
        shard = shard.display(),
        mnt = mnt.display()
    );
    let out = as_user(NOBODY, "unshare", &["-Urm", "sh", "-c", &script]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.lines().any(|l| l.trim() == "70000"), "{stdout}");
    assert!(
        stdout.contains("live") && stdout.ends_with("unmounted\n"),
        "{stdout}"
    );
    // The mount lived in the namespace only.
    assert!(!is_mounted(&mnt));
}
