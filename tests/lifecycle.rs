//! Mount lifecycle as a Slurm prologue and epilog use it: readiness, signals, stale mounts.

mod common;

use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn shard(dir: &Path) -> std::path::PathBuf {
    let files = [
        ("train/a/1.jpg".to_string(), bytes(1, 20_000)),
        ("train/b/2.jpg".to_string(), bytes(2, 30_000)),
    ];
    tar_of(dir, "s", &files).1
}

fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn killed_daemon_leaves_a_stale_mount_that_umount_cleans() {
    let dir = tempfile::tempdir().unwrap();
    let shard = shard(dir.path());
    let mnt_dir = dir.path().join("mnt");
    let m = Mount::new(&[&shard], &mnt_dir, &[]);
    assert_eq!(
        fs::read(mnt_dir.join("train/a/1.jpg")).unwrap(),
        bytes(1, 20_000)
    );
    run(Command::new("kill").arg("-9").arg(m.pid.to_string()));
    assert!(m.wait_daemon_exit(Duration::from_secs(5)));
    // Requests caught while the daemon's threads are still exiting end with ECONNABORTED; after
    // that every request on the dead mount fails with ENOTCONN.
    let stale = wait_until(Duration::from_secs(5), || {
        fs::read_dir(&mnt_dir).is_err_and(|e| e.raw_os_error() == Some(libc::ENOTCONN))
    });
    assert!(
        stale,
        "the mount does not report ENOTCONN after the daemon died"
    );

    // A new mount on the stale one is refused with the remedy.
    let out = mount_cmd(&[&shard], &mnt_dir, &[], None);
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && msg.contains("stale mount"),
        "{msg}"
    );

    run(packfs().arg("umount").arg(&mnt_dir));
    assert!(!is_mounted(&mnt_dir));
    assert_eq!(
        fs::read_dir(&mnt_dir).unwrap().count(),
        0,
        "mountpoint not clean"
    );
    drop(m);

    let again = Mount::new(&[&shard], &mnt_dir, &[]);
    assert_eq!(
        fs::read(again.dir.join("train/b/2.jpg")).unwrap(),
        bytes(2, 30_000)
    );
}

#[test]
fn sigterm_unmounts_the_background_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let shard = shard(dir.path());
    let m = Mount::new(&[&shard], &dir.path().join("mnt"), &[]);
    let pid_file = m.dir.with_extension("pid");
    assert!(pid_file.exists());
    run(Command::new("kill").arg("-TERM").arg(m.pid.to_string()));
    assert!(
        m.wait_daemon_exit(Duration::from_secs(10)),
        "daemon still running"
    );
    assert!(!is_mounted(&m.dir));
    assert!(!pid_file.exists(), "pid file left behind");
}

#[test]
fn foreground_mount_exits_zero_on_sigint() {
    let dir = tempfile::tempdir().unwrap();
    let shard = shard(dir.path());
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let mut child = packfs()
        .arg("mount")
        .arg("--foreground")
        .arg(&shard)
        .arg(&mnt)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || is_mounted(&mnt)),
        "never mounted"
    );
    assert_eq!(
        fs::read(mnt.join("train/a/1.jpg")).unwrap(),
        bytes(1, 20_000)
    );
    run(Command::new("kill").arg("-INT").arg(child.id().to_string()));
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(status.success(), "{status}: {stderr}");
    assert!(!is_mounted(&mnt));
}

/// Ctrl-C while `packfs mount` waits for a daemon still scanning a large `.tar.gz`: the daemon
/// is stopped, nothing is mounted (then or later), and the command exits as Ctrl-C would. The
/// daemon runs in its own session, so before it kept scanning and mounted a second later.
#[test]
fn ctrl_c_during_a_scan_cancels_the_mount() {
    let dir = tempfile::tempdir().unwrap();
    sh(
        "truncate -s 1G zeros.bin && tar cf - zeros.bin | gzip -1 > big.tar.gz && rm zeros.bin",
        dir.path(),
    );
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let child = packfs()
        .arg("mount")
        .arg(dir.path().join("big.tar.gz"))
        .arg(&mnt)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    assert!(!is_mounted(&mnt), "the scan ended too soon for this test");
    run(Command::new("kill").arg("-INT").arg(child.id().to_string()));
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("mount cancelled (interrupted)"), "{stderr}");
    // Nothing mounts later, and no daemon for this mountpoint is left.
    std::thread::sleep(Duration::from_secs(2));
    assert!(!is_mounted(&mnt));
    let mnt_s = mnt.to_str().unwrap();
    let daemons = fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| fs::read(e.path().join("cmdline")).ok())
        .filter(|c| {
            let c = String::from_utf8_lossy(c);
            c.contains("--daemon-child") && c.contains(mnt_s)
        })
        .count();
    assert_eq!(daemons, 0);
}

#[test]
fn busy_mount_is_detached_and_open_files_keep_working() {
    let dir = tempfile::tempdir().unwrap();
    let shard = shard(dir.path());
    let m = Mount::new(&[&shard], &dir.path().join("mnt"), &[]);
    let mut open = fs::File::open(m.dir.join("train/b/2.jpg")).unwrap();
    let out = packfs().arg("umount").arg(&m.dir).output().unwrap();
    assert_ok(&out);
    assert!(String::from_utf8_lossy(&out.stderr).contains("detached"));
    assert!(!is_mounted(&m.dir), "still in the mount table");
    // The open file still reads through the detached mount, then the daemon goes away.
    let mut data = Vec::new();
    open.read_to_end(&mut data).unwrap();
    assert_eq!(data, bytes(2, 30_000));
    assert!(m.daemon_alive());
    drop(open);
    assert!(
        m.wait_daemon_exit(Duration::from_secs(10)),
        "daemon outlived its last open file"
    );
}

#[test]
fn umount_refuses_what_packfs_did_not_mount() {
    let dir = tempfile::tempdir().unwrap();
    let out = packfs().arg("umount").arg(dir.path()).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a mount point"));
    // A path that does not exist says so (it said "is not a mount point").
    let missing = dir.path().join("nosuchdir");
    let out = packfs().arg("umount").arg(&missing).output().unwrap();
    assert!(!out.status.success());
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(msg.contains("nosuchdir does not exist"), "{msg}");
    let out = packfs().arg("umount").arg("/proc").output().unwrap();
    assert!(!out.status.success());
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(msg.contains("not a packfs mount"), "{msg}");
    assert!(Path::new("/proc/self").exists());
}

#[test]
fn ls_and_cat_read_images_without_mounting() {
    let dir = tempfile::tempdir().unwrap();
    let shard = shard(dir.path());
    let listing = run(packfs().arg("ls").arg(&shard));
    assert_eq!(
        listing.lines().collect::<Vec<_>>(),
        [
            "train",
            "train/a",
            "train/a/1.jpg",
            "train/b",
            "train/b/2.jpg"
        ]
    );
    let out = packfs()
        .arg("cat")
        .arg(&shard)
        .arg("train/b/2.jpg")
        .output()
        .unwrap();
    assert_ok(&out);
    assert_eq!(out.stdout, bytes(2, 30_000));
    let out = packfs()
        .arg("cat")
        .arg(&shard)
        .arg("train/none.jpg")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("train/none.jpg: no such file"));
}

/// Every shard stays open while mounted; a job's soft open-file limit must not cap the shard count.
#[test]
fn more_shards_than_the_soft_open_file_limit() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..100 {
        let mut b =
            tar::Builder::new(fs::File::create(dir.path().join(format!("s-{i:03}.tar"))).unwrap());
        let data = format!("{i}\n");
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, format!("class_{i:03}/sample.txt"), data.as_bytes())
            .unwrap();
        b.into_inner().unwrap();
    }
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let pid_file = dir.path().join("pid");
    let out = Command::new("sh")
        .arg("-c")
        .arg("ulimit -Sn 40 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_packfs"))
        .arg("mount")
        .arg("--pid-file")
        .arg(&pid_file)
        .arg(dir.path().join("s-{000..099}.tar"))
        .arg(&mnt)
        .output()
        .unwrap();
    assert_ok(&out);
    let m = Mount {
        dir: mnt.clone(),
        pid: read_pid(&pid_file),
        stderr: String::new(),
    };
    assert_eq!(fs::read_dir(&m.dir).unwrap().count(), 100);
    assert_eq!(
        fs::read_to_string(m.dir.join("class_077/sample.txt")).unwrap(),
        "77\n"
    );
}

/// `--owner PID`: the mount ends with the process it serves, even one killed with SIGKILL (a
/// job's script cancelled), and a pid that is not running is refused before anything is mounted.
#[test]
fn a_mount_ends_with_its_owner_however_it_exits() {
    let dir = tempfile::tempdir().unwrap();
    let shard = shard(dir.path());
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let mut owner = Command::new("sleep").arg("600").spawn().unwrap();
    let out = mount_owned_by(owner.id(), &shard, &mnt);
    assert_ok(&out);
    assert!(is_mounted(&mnt));
    owner.kill().unwrap();
    owner.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while is_mounted(&mnt) {
        assert!(
            Instant::now() < deadline,
            "still mounted 5 s after its owner died"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let out = mount_owned_by(owner.id(), &shard, &mnt);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("no such process is running"), "{stderr}");
    assert!(!is_mounted(&mnt));
}

fn mount_owned_by(owner: u32, shard: &Path, mnt: &Path) -> std::process::Output {
    packfs()
        .args(["mount", "--owner", &owner.to_string()])
        .arg(shard)
        .arg(mnt)
        .output()
        .unwrap()
}

/// The same dataset mounted again at the same place (a prologue run twice) keeps the live
/// mount instead of failing "already a mount point"; another dataset there is still refused.
#[test]
fn mounting_the_same_dataset_again_reuses_the_mount() {
    let dir = tempfile::tempdir().unwrap();
    let shard = shard(dir.path());
    let m = Mount::new(&[&shard], &dir.path().join("mnt"), &[]);
    let again = packfs()
        .arg("mount")
        .arg(&shard)
        .arg(&m.dir)
        .output()
        .unwrap();
    assert_ok(&again);
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(
        said.contains("already serves") && said.contains("using it"),
        "{said}"
    );
    assert!(is_mounted(&m.dir));
    let other = dir.path().join("other.tar");
    fs::copy(&shard, &other).unwrap();
    let refused = packfs()
        .arg("mount")
        .arg(&other)
        .arg(&m.dir)
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("already a mount point"));
}

/// A mountpoint given through a symlink is mounted at its target, and `packfs status LINK` and
/// `packfs umount LINK` find it there (umount said "not a mount point" and left it mounted).
#[test]
fn a_mountpoint_given_through_a_symlink_is_found_by_status_and_umount() {
    let dir = tempfile::tempdir().unwrap();
    let tar = shard(dir.path());
    let real = dir.path().join("real");
    fs::create_dir(&real).unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink("real", &link).unwrap();
    let out = mount_cmd(&[&tar], &link, &[], None);
    assert_ok(&out);
    let _guard = UnmountOnDrop(real.clone());
    assert!(is_mounted(&real), "mounted at the link's target");
    let status = packfs().arg("status").arg(&link).output().unwrap();
    assert_ok(&status);
    assert!(
        String::from_utf8_lossy(&status.stdout).contains(&*real.to_string_lossy()),
        "{status:?}"
    );
    let out = packfs().arg("umount").arg(&link).output().unwrap();
    assert_ok(&out);
    assert!(!is_mounted(&real), "unmounted through the link");
    assert!(link.is_symlink() && real.is_dir(), "both left as they were");
}

/// Processes seeing the mount at `mnt` as a copy in a mount namespace of their own: `unshare -m`
/// started while it is mounted, as a container would be. Killed when dropped.
struct Copy(std::process::Child);

impl Copy {
    fn of(mnt: &Path) -> Copy {
        let child = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sleep", "120"])
            .spawn()
            .unwrap();
        let copy = Copy(child);
        let info = format!("/proc/{}/mountinfo", copy.0.id());
        let start = std::time::Instant::now();
        while !std::fs::read_to_string(&info)
            .is_ok_and(|t| t.contains(mnt.to_str().unwrap()) && t.contains("fuse.packfs"))
        {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no copy in {info}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        copy
    }
}

impl Drop for Copy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A daemon whose mount lives on as a copy in another mount namespace (detached here by a plain
/// `umount -l`) keeps serving the copy, and the next mount at the same place has runtime files
/// of its own: `packfs status` answers from the new daemon in 8 of 8 polls, and hints reach it
/// (they went to the old daemon, whose socket had the same name, while the sender was told ok).
/// `packfs umount` then ends the old daemon's service too, saying who held it.
#[test]
fn a_daemon_serving_a_copy_elsewhere_shares_nothing_with_the_next_mount() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let names: Vec<String> = (0..20).map(|i| format!("f{i:02}.bin")).collect();
    for (i, n) in names.iter().enumerate() {
        write_file(&src.join(n), &bytes(i as u64, 5_000 + i * 100), 0o644);
    }
    let shard = dir.path().join("s.tar");
    tar_members(&src, &shard, &names);
    let mnt = dir.path().join("mnt");
    let old = Mount::new(&[&shard], &mnt, &[]);
    let abs = packfs::daemon::mounts::absolute(&mnt).unwrap();
    let old_device = packfs::daemon::mounts::packfs_device(&abs).unwrap();
    let copy = Copy::of(&mnt);
    // Detached here without packfs: the daemon serves on, for the copy.
    assert!(
        Command::new("umount")
            .arg("-l")
            .arg(&mnt)
            .status()
            .unwrap()
            .success()
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(old.daemon_alive(), "the old daemon serves the copy");
    let new = Mount::new(&[&shard], &mnt, &[]);
    // Each daemon's runtime files are its own: named by its mount's device.
    let new_device = packfs::daemon::mounts::packfs_device(&abs).unwrap();
    assert_ne!(old_device, new_device);
    let (old_stats, new_stats) = (
        packfs::daemon::stats::default_path(&abs, &old_device),
        packfs::daemon::stats::default_path(&abs, &new_device),
    );
    assert_ne!(old_stats, new_stats);
    let status: serde_json::Value =
        serde_json::from_str(&run(packfs().args(["status", "--json"]).arg(&mnt))).unwrap();
    assert_eq!(
        status[0]["stats_file"],
        new_stats.to_str().unwrap(),
        "{status}"
    );
    assert_eq!(
        status[0]["hints"],
        packfs::daemon::hints::socket_path(&abs, &new_device)
            .to_str()
            .unwrap(),
        "{status}"
    );
    assert_ne!(
        packfs::daemon::hints::socket_path(&abs, &old_device),
        packfs::daemon::hints::socket_path(&abs, &new_device)
    );
    for _ in 0..8 {
        let out = run(packfs().args(["status", "--json"]).arg(&mnt));
        let all: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(all[0]["counters"]["pid"], new.pid, "{out}");
        std::thread::sleep(Duration::from_millis(150));
    }
    // Hints go to the new daemon's socket, and its lists count them.
    let c = counters(&mnt);
    let socket = c["hints"].as_str().unwrap().to_string();
    let mut stream = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    let line = serde_json::json!({"stream": "train", "rank": 0, "epoch": 1, "paths": names});
    std::io::Write::write_all(&mut stream, format!("{line}\n").as_bytes()).unwrap();
    let mut answer = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stream), &mut answer).unwrap();
    assert!(answer.contains("\"ok\":true"), "{answer}");
    let c = counters(&mnt);
    assert_eq!(c["pid"], new.pid);
    assert!(c["lookahead"]["samples"].as_u64().unwrap() >= 20, "{c}");
    // The new mount unmounted by packfs, and a copy made of it too: the unmount ends its
    // daemon's service of the copy, says who held it, and takes less than the 60 s it waited.
    let second = Copy::of(&mnt);
    let started = std::time::Instant::now();
    let out = packfs().arg("umount").arg(&mnt).output().unwrap();
    assert_ok(&out);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("still served copies") && said.contains(&format!("pid {}", second.0.id())),
        "{said}"
    );
    assert!(new.wait_daemon_exit(Duration::from_secs(10)), "{said}");
    assert!(started.elapsed() < Duration::from_secs(20));
    drop(second);
    drop(copy);
    assert!(old.wait_daemon_exit(Duration::from_secs(10)));
}
