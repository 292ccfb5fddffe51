//! The FUSE-over-io_uring transport (`--transport uring`): the same tree as the classic loop,
//! answered through the rings, and the mount says so; with the kernel's `enable_uring` off, the
//! classic loop serves and the log says why. The rest of the suite runs over the rings in CI's
//! uring pass (PACKFS_TRANSPORT=uring, see .ci/run).

mod common;

use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;

const PARAMETER: &str = "/sys/module/fuse/parameters/enable_uring";

/// The tests here set a kernel-wide parameter: one at a time.
static PARAMETER_LOCK: Mutex<()> = Mutex::new(());

/// The parameter set to a value for the test's duration, and restored after it.
struct Parameter {
    old: String,
}

impl Parameter {
    /// `None` where it cannot be set: a kernel without FUSE over io_uring, or not root.
    fn set(value: &str) -> Option<Parameter> {
        let old = fs::read_to_string(PARAMETER).ok()?;
        fs::write(PARAMETER, value).ok()?;
        Some(Parameter {
            old: old.trim().to_string(),
        })
    }
}

impl Drop for Parameter {
    fn drop(&mut self) {
        let _ = fs::write(PARAMETER, &self.old);
    }
}

/// One test's setting of the parameter (held for its duration) and its files: a source tree, its
/// shard, a mountpoint and a stats file.
struct Trial {
    // Fields drop in order: the parameter is restored while the lock is still held (the other
    // way round, the next test could save this test's value as the one to restore).
    _param: Parameter,
    _one: std::sync::MutexGuard<'static, ()>,
    dir: tempfile::TempDir,
    src: PathBuf,
    shard: PathBuf,
    mnt: PathBuf,
    stats: PathBuf,
}

impl Trial {
    /// `None`, after saying SKIPPED, where the parameter cannot be set.
    fn start(parameter: &str) -> Option<Trial> {
        let one = PARAMETER_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let Some(param) = Parameter::set(parameter) else {
            skip(
                "uring",
                &format!("{PARAMETER} cannot be set here (no FUSE over io_uring, or not root)"),
            );
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let (src, shard) = shard(dir.path());
        Some(Trial {
            _param: param,
            _one: one,
            mnt: dir.path().join("mnt"),
            stats: dir.path().join("stats.json"),
            dir,
            src,
            shard,
        })
    }
}

/// A varied tree (nested directories, symlinks, empty and large files) in a GNU tar shard.
fn shard(dir: &Path) -> (PathBuf, PathBuf) {
    let src = dir.join("src");
    build_tree(&src, 40);
    write_file(&src.join("big/large.bin"), &bytes(9, 3 << 20), 0o644);
    let shard = dir.join("s.tar");
    run(Command::new("tar")
        .arg("cf")
        .arg(&shard)
        .arg("-C")
        .arg(&src)
        .arg("."));
    (src, shard)
}

/// The mount's counters once `ready` holds for them (written every second).
fn counters_when(stats: &Path, ready: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(text) = fs::read_to_string(stats)
            && let Ok(v) = serde_json::from_str::<serde_json::Value>(&text)
            && ready(&v)
        {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "counters never matched: {:?}",
            fs::read_to_string(stats)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn uring_serves_the_same_tree_through_the_rings() {
    let Some(t) = Trial::start("Y") else { return };
    let (src, shard, mnt, stats) = (
        t.src.clone(),
        t.shard.clone(),
        t.mnt.clone(),
        t.stats.clone(),
    );
    let stats_arg = stats.to_str().unwrap();
    let m = Mount::new(
        &[&shard],
        &mnt,
        &[
            "--transport",
            "uring",
            "--readdirplus",
            "always",
            "--stats-file",
            stats_arg,
        ],
    );
    // Names, modes, times, link targets and bytes, as GNU tar wrote them.
    assert_same_tree(&src, &mnt, &[]);
    // Listings with attributes, and a missing name.
    let listing = run(Command::new("ls").arg("-lR").arg(&mnt));
    assert!(listing.contains("large.bin"), "{listing}");
    let missing = fs::metadata(mnt.join("no/such/file")).unwrap_err();
    assert_eq!(missing.kind(), std::io::ErrorKind::NotFound);
    // Reads the kernel cannot answer from its cache: O_DIRECT, unaligned to any chunk.
    let mut direct = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(mnt.join("big/large.bin"))
        .unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let n = std::io::Read::read(&mut direct, &mut buf).unwrap();
    assert_eq!(&buf[..n], &bytes(9, 3 << 20)[..n]);
    // Python's open() asks isatty (an ioctl) of every file: answered through the rings too.
    let text = python(
        Path::new("python3"),
        "import sys\nprint(open(sys.argv[1], 'rb').read()[:4].hex())",
        &[mnt.join("big/large.bin").as_os_str()],
    );
    let head: String = bytes(9, 4).iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(text.trim(), head);
    let status = run(packfs().arg("status").arg(&mnt));
    assert!(status.contains("FUSE over io_uring"), "{status}");
    let c = counters_when(&stats, |c| c["ring_requests"].as_u64() > Some(0));
    assert_eq!(c["transport"], "uring", "{c}");
    assert_eq!(c["errors"], 0, "{c}");
    // One read pool for both transports: the rings hand their waiting reads to the classic
    // loop's (16 workers by default, no stall here to grow it), not to a second one of their own.
    let workers = fs::read_dir(format!("/proc/{}/task", m.pid))
        .unwrap()
        .filter_map(|t| fs::read_to_string(t.unwrap().path().join("comm")).ok())
        .filter(|name| name.starts_with("packfs-read-"))
        .count();
    assert_eq!(workers, 16, "read workers in the daemon");
    drop(m);
    assert!(!is_mounted(&mnt), "the mount ends with the rings");
}

#[test]
fn uring_falls_back_to_the_classic_loop_and_says_why() {
    let Some(t) = Trial::start("N") else { return };
    let (src, shard, mnt, stats) = (
        t.src.clone(),
        t.shard.clone(),
        t.mnt.clone(),
        t.stats.clone(),
    );
    let log = t.dir.path().join("mount.log");
    let _m = Mount::new(
        &[&shard],
        &mnt,
        &[
            "--transport",
            "uring",
            "--stats-file",
            stats.to_str().unwrap(),
            "--log-file",
            log.to_str().unwrap(),
        ],
    );
    assert_same_tree(&src, &mnt, &[]);
    let logged = fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("enable_uring is N") && logged.contains("serving with the classic loop"),
        "{logged}"
    );
    let c = counters_when(&stats, |c| {
        c["requests"]["lookup"]["count"].as_u64() > Some(0)
    });
    assert_eq!(c["transport"], "classic", "{c}");
    assert_eq!(c["ring_requests"], 0, "{c}");
    let status = run(packfs().arg("status").arg(&mnt));
    assert!(!status.contains("io_uring"), "{status}");
}
