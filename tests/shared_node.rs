//! A second user on the node tries to break in through what packfs writes and reads back: a stage
//! directory made in their name, files planted in a stage, a symlink on the way to it, a log file
//! made before the mount, a pid file a new mount wrote before the old daemon exited. Each attack
//! is played as uid 65534 with setpriv; packfs refuses, naming the owner and the fix, and never
//! serves, writes or truncates the other user's files.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

const ATTACKER: u32 = 65534;

/// A world-readable shard (`d/a.bin`, `d/b.bin`) in a directory other users can reach, and a
/// sticky, world-writable `shared` directory beside it, as /tmp and /dev/shm are.
struct Node {
    _dir: tempfile::TempDir,
    root: PathBuf,
    shard: PathBuf,
    shared: PathBuf,
}

fn node() -> Node {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
    let files = vec![
        ("d/a.bin".to_string(), bytes(1, 70_000)),
        ("d/b.bin".to_string(), bytes(2, 70_000)),
    ];
    let (_, shard) = tar_of(&root, "s", &files);
    fs::set_permissions(&shard, fs::Permissions::from_mode(0o644)).unwrap();
    let shared = root.join("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
    Node {
        _dir: dir,
        root,
        shard,
        shared,
    }
}

fn attacker(program: &str, args: &[&str]) {
    let out = as_user(ATTACKER, program, args);
    assert_ok(&out);
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A mount as this user (root) that must fail: its stderr.
fn refused_mount(n: &Node, extra: &[&str]) -> String {
    let mnt = n.root.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let _guard = UnmountOnDrop(mnt.clone());
    let out = mount_cmd(&[&n.shard], &mnt, extra, None);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "the mount was not refused:\n{err}");
    assert!(!is_mounted(&mnt));
    err
}

/// The attack of the issue: as the other user, `packfs stage` into a directory of theirs, then
/// swap in the staged copy of a changed shard. Root's mount with `--stage` there is refused,
/// naming the owner; nothing of theirs is read.
#[test]
fn a_stage_directory_of_another_user_is_refused() {
    let n = node();
    let theirs = n.shared.join("theirs");
    let evil = n.shared.join("evil.tar");
    attacker("mkdir", &["-m", "0755", s(&theirs)]);
    attacker("cp", &[s(&n.shard), s(&evil)]);
    // A copy the other user can run wherever the build is (CI clones into root's home).
    let bin = n.root.join("packfs");
    fs::copy(env!("CARGO_BIN_EXE_packfs"), &bin).unwrap();
    attacker(s(&bin), &["stage", "--to", s(&theirs), s(&n.shard)]);
    assert_eq!(fs::metadata(&theirs).unwrap().uid(), ATTACKER);
    for stage in [theirs.clone(), theirs.join("inner")] {
        let err = refused_mount(&n, &["--stage", s(&stage)]);
        assert!(
            err.contains(&format!("uid {ATTACKER}")) && err.contains("--stage"),
            "the refusal does not name the owner:\n{err}"
        );
        assert!(err.contains("mktemp -d"), "no fix given:\n{err}");
    }
    assert!(!theirs.join("inner").exists());
    // `packfs stage` itself refuses too (the same check).
    let out = packfs()
        .args(["stage", "--to", s(&theirs), s(&n.shard)])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("uid {ATTACKER}")), "{err}");
}

/// Files planted in a stage directory of root's (by another user, or left writable by others)
/// are never opened as staged bytes or their progress: the mount is refused, naming the file,
/// its owner or mode, and the fix; their content is untouched.
#[test]
fn planted_stage_files_are_refused() {
    let n = node();
    let stage = n.root.join("stage");
    run(packfs().args(["stage", "--to", s(&stage), s(&n.shard)]));
    let data = fs::read_dir(&stage)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "data"))
        .expect("a staged data file");
    let state = data.with_extension("state");
    for planted in [&data, &state] {
        // Made 0666 by the other user, under the name packfs uses.
        let before = fs::read(planted).unwrap();
        std::os::unix::fs::chown(planted, Some(ATTACKER), Some(ATTACKER)).unwrap();
        fs::set_permissions(planted, fs::Permissions::from_mode(0o666)).unwrap();
        let err = refused_mount(&n, &["--stage", s(&stage)]);
        assert!(
            err.contains(&format!("uid {ATTACKER}")) && err.contains(s(planted)),
            "{err}"
        );
        assert_eq!(fs::read(planted).unwrap(), before, "{}", planted.display());
        // root's own file, but writable by others: refused as well.
        std::os::unix::fs::chown(planted, Some(0), Some(0)).unwrap();
        let err = refused_mount(&n, &["--stage", s(&stage)]);
        assert!(
            err.contains("others can write") && err.contains("mode 0666"),
            "{err}"
        );
        fs::set_permissions(planted, fs::Permissions::from_mode(0o600)).unwrap();
    }
    // Mended, the stage serves again.
    let m = Mount::new(&[&n.shard], &n.root.join("mnt"), &["--stage", s(&stage)]);
    assert_eq!(fs::read(m.dir.join("d/a.bin")).unwrap(), bytes(1, 70_000));
}

/// A stage directory that is a symlink, or reached through another user's symlink or directory,
/// is refused: whoever owns the link could point it at a directory of theirs.
#[test]
fn a_symlinked_stage_directory_is_refused() {
    let n = node();
    let theirs = n.shared.join("theirs");
    attacker("mkdir", &["-m", "0777", s(&theirs)]);
    // The stage itself a link (to a directory of root's).
    let mine = n.root.join("mine");
    fs::create_dir(&mine).unwrap();
    let link = n.shared.join("stage-link");
    symlink(&mine, &link).unwrap();
    let err = refused_mount(&n, &["--stage", s(&link)]);
    assert!(err.contains("not a directory (a symlink?)"), "{err}");
    // A link of theirs on the way, to a directory of root's.
    let their_link = n.shared.join("job");
    attacker("ln", &["-s", s(&mine), s(&their_link)]);
    let err = refused_mount(&n, &["--stage", s(&their_link.join("stage"))]);
    assert!(
        err.contains(&format!("{} belongs to uid {ATTACKER}", s(&their_link))),
        "{err}"
    );
    // A directory of root's that others can write in (not sticky) on the way.
    let open = n.root.join("open");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
    let err = refused_mount(&n, &["--stage", s(&open.join("stage"))]);
    assert!(
        err.contains("mode 0777") && err.contains("not sticky"),
        "{err}"
    );
    assert!(fs::read_dir(&mine).unwrap().next().is_none());
    assert!(!open.join("stage").exists());
    // Inside a sticky directory, a new stage of root's own is fine.
    let fresh = n.shared.join("fresh");
    let m = Mount::new(&[&n.shard], &n.root.join("mnt"), &["--stage", s(&fresh)]);
    assert_eq!(fs::read(m.dir.join("d/b.bin")).unwrap(), bytes(2, 70_000));
    let meta = fs::symlink_metadata(&fresh).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o700));
}

/// A log file another user made before the mount (0666, to read what the daemon logs) is refused,
/// not appended to; so is a trace file of theirs (not truncated).
#[test]
fn a_log_or_trace_file_of_another_user_is_refused() {
    let n = node();
    let log = n.shared.join("packfs.log");
    attacker(
        "sh",
        &["-c", &format!("umask 0; echo theirs > {}", s(&log))],
    );
    let err = refused_mount(&n, &["--log-file", s(&log)]);
    assert!(
        err.contains(&format!("uid {ATTACKER}")) && err.contains(s(&log)),
        "{err}"
    );
    assert_eq!(fs::read_to_string(&log).unwrap(), "theirs\n");
    let trace = n.shared.join("trace.json");
    attacker(
        "sh",
        &["-c", &format!("umask 0; echo theirs > {}", s(&trace))],
    );
    let err = refused_mount(&n, &["--trace", s(&trace)]);
    assert!(err.contains(&format!("uid {ATTACKER}")), "{err}");
    assert_eq!(fs::read_to_string(&trace).unwrap(), "theirs\n");
}

/// `packfs umount` returns before the old daemon exits; a new mount that reuses the pid file
/// writes its pid there meanwhile, and the old daemon's exit leaves it alone.
#[test]
fn an_old_daemon_leaves_the_pid_file_of_a_new_mount() {
    let n = node();
    let pid_file = n.root.join("packfs.pid");
    let (a, b) = (n.root.join("a"), n.root.join("b"));
    fs::create_dir(&a).unwrap();
    fs::create_dir(&b).unwrap();
    let _guards = (UnmountOnDrop(a.clone()), UnmountOnDrop(b.clone()));
    // The old daemon holds a file open, so its exit waits for the lazy unmount to let go.
    assert_ok(&mount_cmd(&[&n.shard], &a, &[], Some(&pid_file)));
    let old = read_pid(&pid_file);
    let held = fs::File::open(a.join("d/a.bin")).unwrap();
    run(packfs().arg("umount").arg("--lazy").arg(&a));
    assert_ok(&mount_cmd(&[&n.shard], &b, &[], Some(&pid_file)));
    let new = read_pid(&pid_file);
    assert_ne!(old, new);
    drop(held);
    let start = Instant::now();
    while Path::new(&format!("/proc/{old}")).exists() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !Path::new(&format!("/proc/{old}/stat")).exists(),
        "old daemon still runs"
    );
    assert_eq!(
        read_pid(&pid_file),
        new,
        "the old daemon removed the new pid file"
    );
    run(packfs().arg("umount").arg(&b));
}
