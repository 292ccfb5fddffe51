//! Helpers for the integration tests: they mount real FUSE file systems with the `packfs` binary
//! and read them with ordinary tools.
#![allow(dead_code)]

pub mod pfssim;
pub mod remote;
pub mod servers;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub fn packfs() -> Command {
    Command::new(env!("CARGO_BIN_EXE_packfs"))
}

/// Runs a shell script in `dir`; panics with its output unless it succeeds.
pub fn sh(script: &str, dir: &Path) {
    run(Command::new("sh").arg("-c").arg(script).current_dir(dir));
}

/// The number before `word` in a `packfs ls --extents` line ("... in 12 frames from ...").
pub fn count_before(line: &str, word: &str) -> usize {
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == word).unwrap();
    words[at - 1].parse().unwrap()
}

/// Runs a command, panics with its output unless it succeeds, returns stdout.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn is_mounted(path: &Path) -> bool {
    let abs = packfs::daemon::mounts::absolute(path).unwrap();
    packfs::daemon::mounts::find(&abs).unwrap().is_some()
}

/// A background `packfs mount`; unmounts and waits for the daemon on drop.
pub struct Mount {
    pub dir: PathBuf,
    pub pid: i32,
    pub stderr: String,
}

impl Mount {
    /// Mounts `images` at `dir` (created if missing) with `extra` options; panics on failure.
    pub fn new(images: &[&Path], dir: &Path, extra: &[&str]) -> Mount {
        fs::create_dir_all(dir).unwrap();
        let pid_file = dir.with_extension("pid");
        let out = mount_cmd(images, dir, extra, Some(&pid_file));
        assert!(
            out.status.success(),
            "mount failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let pid = read_pid(&pid_file);
        Mount {
            dir: dir.to_path_buf(),
            pid,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    pub fn daemon_alive(&self) -> bool {
        Path::new(&format!("/proc/{}", self.pid)).exists() && !is_zombie(self.pid)
    }

    pub fn wait_daemon_exit(&self, timeout: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if !self.daemon_alive() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

fn is_zombie(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(true)
}

impl Drop for Mount {
    fn drop(&mut self) {
        if is_mounted(&self.dir) {
            let _ = packfs().arg("umount").arg("--lazy").arg(&self.dir).output();
        }
        self.wait_daemon_exit(Duration::from_secs(10));
    }
}

/// Unmounts `dir` (lazily, as root) when dropped if something is still mounted there: a test that
/// mounts by hand and fails half-way must not leave a (stale) mount on the node for later tests.
pub struct UnmountOnDrop(pub PathBuf);

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            let _ = packfs().arg("umount").arg("--lazy").arg(&self.0).output();
        }
    }
}

/// Runs `packfs mount` in the background mode and returns its output (the mount may have failed).
pub fn mount_cmd(images: &[&Path], dir: &Path, extra: &[&str], pid_file: Option<&Path>) -> Output {
    let mut cmd = packfs();
    cmd.arg("mount").args(extra).args(images).arg(dir);
    if let Some(p) = pid_file {
        cmd.arg("--pid-file").arg(p);
    }
    cmd.output().expect("run packfs mount")
}

/// Packs `members` (paths relative to `src`) into `shard` with GNU tar.
pub fn tar_members<S: AsRef<std::ffi::OsStr>>(src: &Path, shard: &Path, members: &[S]) {
    run(Command::new("tar")
        .arg("-cf")
        .arg(shard)
        .arg("-C")
        .arg(src)
        .args(members));
}

/// Asserts that a command run with `output()` succeeded, showing its stderr otherwise.
pub fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "{}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Cuts `path` to `len` bytes (a shard damaged under a running daemon).
pub fn truncate(path: &Path, len: u64) {
    fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

/// The process id a `--pid-file` holds.
pub fn read_pid(path: &Path) -> i32 {
    fs::read_to_string(path).unwrap().trim().parse().unwrap()
}

/// `packfs verify --data INDEX`: reads every file through packfs's readers.
pub fn verify_data(index: &Path) -> Command {
    let mut cmd = packfs();
    cmd.arg("verify").arg("--data").arg(index);
    cmd
}

/// A deterministic xorshift generator for tests that pick offsets, sizes and choices.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// A deterministic pseudo-random byte stream (xorshift), so tests need no data files.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

pub fn write_file(path: &Path, data: &[u8], mode: u32) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, data).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// Flips the bits `mask` of the byte at `at` of `path`, keeping its size and mtime: damage that
/// an index's fingerprint cannot see unless it falls at either end.
pub fn damage_in_place(path: &Path, at: u64, mask: u8) {
    use std::os::unix::fs::FileExt;
    let f = fs::File::options()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mtime = f.metadata().unwrap().modified().unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ mask], at).unwrap();
    f.set_modified(mtime).unwrap();
}

pub fn set_mtime(path: &Path, secs: u64) {
    let f = fs::File::options().write(true).open(path).unwrap();
    f.set_modified(UNIX_EPOCH + Duration::from_secs(secs))
        .unwrap();
}

/// The name of the subtree whose paths exceed 255 bytes: ustar cannot store them.
pub const VERY_LONG_DIR: &str = "verylong_only_non_ustar";

/// A tree with everything a dataset may hold: names with spaces and UTF-8, paths over 200 bytes,
/// empty files, files of several MiB, odd modes and mtimes, symlinks (relative, absolute,
/// dangling), a hard link, and a directory of `many` entries.
pub fn build_tree(root: &Path, many: usize) {
    let files: [(&str, Vec<u8>, u32); 5] = [
        ("train/cls_a/img 001.jpg", bytes(1, 3000), 0o644),
        ("train/cls_a/img 002.jpg", bytes(2, 5000), 0o600),
        ("train/cls_ü/ñame_日本.jpg", bytes(3, 1234), 0o644),
        (
            "train/cls_ü/script.sh",
            b"#!/bin/sh\necho hi\n".to_vec(),
            0o755,
        ),
        ("train/readonly.txt", b"read only\n".to_vec(), 0o444),
    ];
    for (path, data, mode) in &files {
        write_file(&root.join(path), data, *mode);
    }
    write_file(&root.join("empty.bin"), b"", 0o644);
    write_file(
        &root.join("big/blob.bin"),
        &bytes(4, 5 * 1024 * 1024 + 123),
        0o644,
    );
    write_file(&root.join("big/odd.bin"), &bytes(5, 1024 * 1024 + 1), 0o644);
    set_mtime(&root.join("train/cls_a/img 002.jpg"), 1_000_000_000);
    // A path of about 240 bytes that ustar can still split into prefix and name.
    let mut deep = root.join("deep");
    for i in 0..4 {
        deep = deep.join(format!("level{i}_{}", "x".repeat(34)));
    }
    write_file(
        &deep.join("sample_with_a_long_name_00001.jpg"),
        &bytes(6, 777),
        0o644,
    );
    // A path of over 300 bytes with a component of over 100 bytes: GNU and PAX only.
    let mut very = root.join(VERY_LONG_DIR);
    for i in 0..3 {
        very = very.join(format!("component{i}_{}", "y".repeat(110)));
    }
    write_file(&very.join("file.jpg"), &bytes(7, 99), 0o644);
    symlink("cls_a/img 001.jpg", root.join("train/latest")).unwrap();
    symlink("/etc/hostname", root.join("abs_link")).unwrap();
    symlink("nowhere/at/all", root.join("dangling")).unwrap();
    fs::hard_link(
        root.join("train/cls_a/img 001.jpg"),
        root.join("train/cls_a/hard.jpg"),
    )
    .unwrap();
    let many_dir = root.join("many");
    fs::create_dir_all(&many_dir).unwrap();
    for i in 0..many {
        fs::write(many_dir.join(format!("{i:05}.txt")), format!("{i}\n")).unwrap();
    }
    fs::set_permissions(root.join("big"), fs::Permissions::from_mode(0o750)).unwrap();
}

/// `diff -r` finds no difference, and sizes, modes, mtimes and symlink targets match.
pub fn assert_same_tree(src: &Path, mnt: &Path, exclude: &[&str]) {
    let mut diff = Command::new("diff");
    diff.arg("-r").arg("--no-dereference");
    for x in exclude {
        diff.arg("-x").arg(x);
    }
    run(diff.arg(src).arg(mnt));
    let mut compared = 0;
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for entry in fs::read_dir(src.join(&rel)).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name();
            if exclude.iter().any(|x| name == *x) {
                continue;
            }
            let rel = rel.join(&name);
            let a = fs::symlink_metadata(src.join(&rel)).unwrap();
            let b = fs::symlink_metadata(mnt.join(&rel))
                .unwrap_or_else(|e| panic!("{}: {e}", rel.display()));
            assert_eq!(a.file_type(), b.file_type(), "type of {}", rel.display());
            if a.file_type().is_symlink() {
                assert_eq!(
                    fs::read_link(src.join(&rel)).unwrap(),
                    fs::read_link(mnt.join(&rel)).unwrap(),
                    "target of {}",
                    rel.display()
                );
            } else {
                assert_eq!(
                    a.mode() & 0o7777,
                    b.mode() & 0o7777,
                    "mode of {}",
                    rel.display()
                );
                assert_eq!(a.mtime(), b.mtime(), "mtime of {}", rel.display());
            }
            if a.is_file() {
                assert_eq!(a.len(), b.len(), "size of {}", rel.display());
            }
            if a.is_dir() {
                stack.push(rel);
            }
            compared += 1;
        }
    }
    assert!(compared > 0, "nothing compared under {}", src.display());
}

/// Keeps `dir` for the rest of the test process and removes it when the process exits (normally,
/// as the test harness does after failures too): for data shared by the tests of one file, which
/// a static would otherwise leak, since statics are never dropped.
pub fn removed_at_exit(dir: tempfile::TempDir) -> PathBuf {
    static DIRS: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    extern "C" fn remove_all() {
        if let Ok(dirs) = DIRS.lock() {
            for dir in dirs.iter() {
                let _ = fs::remove_dir_all(dir);
            }
        }
    }
    let path = dir.keep();
    let mut dirs = DIRS.lock().unwrap();
    if dirs.is_empty() {
        // SAFETY: registers a plain function that only touches a static; libc calls it once at
        // exit, after the tests.
        assert_eq!(unsafe { libc::atexit(remove_all) }, 0);
    }
    dirs.push(path.clone());
    path
}

pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Waits for `child`; kills it and panics if it still runs after `limit` (a hang is a failure).
pub fn wait_or_kill(
    child: &mut std::process::Child,
    what: &str,
    limit: Duration,
) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if started.elapsed() > limit {
            child.kill().unwrap();
            panic!("{what} still runs after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A Python interpreter that can import `module`: $PACKFS_TEST_PYTHON, the venv `.ci/run` makes
/// (target/test-venv), or python3. `None` (with a message naming the package) if none can.
pub fn python_with(module: &str, package: &str) -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-venv/bin/python");
    let candidates = std::env::var_os("PACKFS_TEST_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain([venv, PathBuf::from("python3")]);
    for python in candidates {
        let ok = Command::new(&python)
            .args(["-c", &format!("import {module}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return Some(python);
        }
    }
    skip(
        &format!("python:{module}"),
        &format!(
            "the Python package `{package}` is not installed (bash .ci/run installs it into \
             target/test-venv: python3 -m venv target/test-venv && target/test-venv/bin/pip \
             install {package})"
        ),
    );
    None
}

/// Whether a missing `requirement` must fail the test: unless `PACKFS_ALLOW_SKIP`
/// (comma-separated requirements, or `all`) names it, it must. A skipped test reads `ok` in
/// `cargo test`'s summary (its output is captured), so skipping silently would pass unseen.
pub fn required(requirement: &str) -> bool {
    !std::env::var("PACKFS_ALLOW_SKIP")
        .unwrap_or_default()
        .split(',')
        .any(|r| r.trim() == requirement || r.trim() == "all")
}

/// A test (or a part of one) that cannot run here: fails, saying what is missing and how to
/// get it, unless `PACKFS_ALLOW_SKIP` names `requirement`; then it says SKIPPED and lets the
/// caller return.
pub fn skip(requirement: &str, why: &str) {
    assert!(
        !required(requirement),
        "{why}. Install what is missing (`bash .ci/run` installs everything the tests need), or \
         let this test pass without it: PACKFS_ALLOW_SKIP={requirement} cargo test (a \
         comma-separated list, or all)"
    );
    eprintln!("SKIPPED ({requirement}): {why}");
}

/// Runs a Python script with `args`; panics with its output unless it succeeds; returns stdout.
pub fn python(interpreter: &Path, script: &str, args: &[&std::ffi::OsStr]) -> String {
    run(Command::new(interpreter).arg("-c").arg(script).args(args))
}

/// The file-system options of a mount made in the test process: the default, with the transport
/// `PACKFS_TRANSPORT` names (as `packfs mount` reads it), so the uring pass of CI covers these
/// mounts too.
pub fn fs_options() -> packfs::fs::FsOptions {
    packfs::fs::FsOptions {
        transport: match std::env::var("PACKFS_TRANSPORT").as_deref() {
            Ok("uring") => packfs::fs::Transport::Uring,
            _ => packfs::fs::Transport::Classic,
        },
        ..Default::default()
    }
}

/// A small dataset most tests mount: `files` (path under `src/`, bytes) written under
/// `dir/src` (with whatever else is already there), tarred as `dir/<stem>.tar` (every top-level
/// entry of `src`, in name order) and indexed as `dir/<stem>.packfs-index`.
pub struct IndexedTar {
    pub src: PathBuf,
    pub tar: PathBuf,
    pub index: PathBuf,
}

pub fn indexed_tar(dir: &Path, stem: &str, files: &[(String, Vec<u8>)]) -> IndexedTar {
    let (src, tar) = tar_of(dir, stem, files);
    let index = dir.join(format!("{stem}.packfs-index"));
    run(packfs().arg("index").arg(&tar).arg("-o").arg(&index));
    IndexedTar { src, tar, index }
}

/// As `indexed_tar`, without the index: (`dir/src`, `dir/<stem>.tar`).
pub fn tar_of(dir: &Path, stem: &str, files: &[(String, Vec<u8>)]) -> (PathBuf, PathBuf) {
    let src = dir.join("src");
    for (name, data) in files {
        write_file(&src.join(name), data, 0o644);
    }
    let mut top: Vec<String> = fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    top.sort();
    let tar = dir.join(format!("{stem}.tar"));
    tar_members(&src, &tar, &top);
    (src, tar)
}

/// Runs `program` with `args` as user and group `uid` (no supplementary groups, a plain PATH):
/// how the tests play another user of the node.
pub fn as_user(uid: u32, program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Output {
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

/// Lines of text that compress well (4 MiB decoded is a few hundred KiB of deflate or zstd, in
/// many blocks), varied enough that no two checkpoints or frames look alike.
pub fn text(seed: u64, len: usize) -> Vec<u8> {
    let words = bytes(seed, len / 8 + 16);
    let mut out = Vec::with_capacity(len + 64);
    let mut i = 0;
    while out.len() < len {
        let w = words[i % words.len()];
        out.extend_from_slice(format!("line {i:08} sample_{:03} class {}\n", w, w % 17).as_bytes());
        i += 1;
    }
    out.truncate(len);
    out
}

/// The mount's counters once the daemon has rewritten them after this call (every second).
pub fn counters(mnt: &Path) -> serde_json::Value {
    let read = || -> serde_json::Value {
        let out = run(packfs().args(["status", "--json"]).arg(mnt));
        let all: serde_json::Value = serde_json::from_str(&out).unwrap();
        all[0]["counters"].clone()
    };
    let before = read()["uptime_s"].as_f64().unwrap_or(0.0);
    let start = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = read();
        if now["uptime_s"].as_f64().unwrap_or(0.0) > before + 0.5
            || start.elapsed() > Duration::from_secs(5)
        {
            return now;
        }
    }
}
