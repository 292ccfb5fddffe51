//! Hostile input and careless use: crafted indexes, planted symlinks, other file systems'
//! mounts, non-empty mountpoints, an index written over a shard. None may kill the daemon, write
//! through a symlink or lose data.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A shard with `d/{a,b,c}.bin` and an empty directory `e`, and its index.
fn dataset(dir: &Path) -> (PathBuf, PathBuf) {
    fs::create_dir_all(dir.join("src/e")).unwrap();
    let files: Vec<_> = ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(i, name)| (format!("d/{name}.bin"), bytes(i as u64, 5000)))
        .collect();
    let made = indexed_tar(dir, "s", &files);
    (made.tar, made.index)
}

/// The entry records of an index: (byte offset of each 48-byte record, its name).
fn entries(index: &[u8]) -> Vec<(usize, Vec<u8>)> {
    let at = |i: usize| u64::from_le_bytes(index[i..i + 8].try_into().unwrap()) as usize;
    let (first, count, names) = (at(48), at(24), at(56));
    (0..count)
        .map(|i| {
            let e = first + i * 48;
            let name_off = u32::from_le_bytes(index[e + 36..e + 40].try_into().unwrap()) as usize;
            let len = u16::from_le_bytes(index[e + 44..e + 46].try_into().unwrap()) as usize;
            (e, index[names + name_off..names + name_off + len].to_vec())
        })
        .collect()
}

fn record_of(index: &[u8], name: &str) -> usize {
    entries(index)
        .into_iter()
        .find(|(_, n)| n == name.as_bytes())
        .unwrap_or_else(|| panic!("no entry {name}"))
        .0
}

fn put(index: &mut [u8], at: usize, bytes: &[u8]) {
    index[at..at + bytes.len()].copy_from_slice(bytes);
}

/// Runs `cmd`, killing it if it runs for more than 20 s; returns (success, stdout, stderr).
fn run_bounded(cmd: &mut Command) -> (bool, String, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out_pipe = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::Read;
        let mut text = Vec::new();
        let _ = out_pipe.take(1 << 20).read_to_end(&mut text);
        text
    });
    let status = wait_or_kill(&mut child, &format!("{cmd:?}"), Duration::from_secs(20));
    let out = String::from_utf8_lossy(&reader.join().unwrap()).into_owned();
    let mut err = String::new();
    use std::io::Read;
    child.stderr.unwrap().read_to_string(&mut err).unwrap();
    (status.success(), out, err)
}

/// An index whose checksums were fixed after its records were changed (they are plain xxh3, so
/// anyone can): an out-of-range image number, a deflated file claiming 1 TiB, a directory that
/// lists itself. `verify` finds all three, `ls` ends, and the mount answers EIO for exactly those
/// while serving the rest; the daemon survives. (Each used to panic the read path, abort on a
/// 1 TiB allocation, or list forever.)
#[test]
fn crafted_index_never_kills_the_mount() {
    let dir = tempfile::tempdir().unwrap();
    let (_shard, index) = dataset(dir.path());
    let mut bytes_ = fs::read(&index).unwrap();
    let a = record_of(&bytes_, "a.bin");
    put(&mut bytes_, a + 40, &7u32.to_le_bytes()); // image #7 of 1
    let b = record_of(&bytes_, "b.bin");
    put(&mut bytes_, b, &(1u64 << 40).to_le_bytes()); // size 1 TiB
    let mode = u32::from_le_bytes(bytes_[b + 28..b + 32].try_into().unwrap());
    put(
        &mut bytes_,
        b + 28,
        &((mode & 0xffff) | 1 << 16).to_le_bytes(),
    ); // raw deflate
    let e = record_of(&bytes_, "e");
    let d_id = (record_of(&bytes_, "d") - record_of(&bytes_, "")) as u64 / 48;
    put(&mut bytes_, e, &2u64.to_le_bytes()); // e lists two entries...
    put(&mut bytes_, e + 8, &d_id.to_le_bytes()); // ...starting at d: d and e itself
    assert!(packfs::catalog::index::reseal(&mut bytes_));
    let crafted = dir.path().join("crafted.packfs-index");
    fs::write(&crafted, &bytes_).unwrap();

    let (ok, _, err) = run_bounded(packfs().arg("verify").arg(&crafted));
    assert!(!ok, "verify passed a crafted index");
    for what in [
        "image #7",
        "more than packfs inflates at once",
        "include itself",
    ] {
        assert!(
            err.contains(what),
            "verify does not report {what:?}:\n{err}"
        );
    }
    let (ok, listing, err) = run_bounded(packfs().arg("ls").arg(&crafted));
    assert!(ok, "{err}");
    assert_eq!(listing.lines().count(), 5, "{listing}");

    let log = dir.path().join("daemon.log");
    let m = Mount::new(
        &[&crafted],
        &dir.path().join("mnt"),
        &["--log-file", log.to_str().unwrap()],
    );
    for name in ["a", "b"] {
        // Not fs::read: it would reserve the 1 TiB that stat claims, in this process.
        let mut file = fs::File::open(m.dir.join(format!("d/{name}.bin"))).unwrap();
        let err = std::io::Read::read(&mut file, &mut [0u8; 4096]).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{name}: {err}");
    }
    assert_eq!(fs::read(m.dir.join("d/c.bin")).unwrap(), bytes(2, 5000));
    let (ok, listing, _) = run_bounded(Command::new("find").arg(&m.dir));
    assert!(listing.lines().count() < 20, "{ok} {listing}");
    assert!(m.daemon_alive(), "the daemon died");
    assert_eq!(fs::read(m.dir.join("d/c.bin")).unwrap(), bytes(2, 5000));
    drop(m);
    let log = fs::read_to_string(&log).unwrap();
    assert!(log.contains("image #7"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

/// A request that panics fails alone with EIO; the mount keeps serving (tested without a
/// kernel: the adapter's guard is the same function).
#[test]
fn a_panicking_request_fails_alone() {
    use packfs::fs::error::{Error, guarded};
    let answer: Result<u32, Error> = guarded(|| "read of inode 9".into(), || panic!("boom"));
    let err = answer.unwrap_err();
    assert_eq!(err.errno(), libc::EIO);
    assert_eq!(err.to_string(), "read of inode 9 panicked: boom");
    assert_eq!(guarded(String::new, || Ok::<_, Error>(3)).unwrap(), 3);
}

/// A second user who can write the directory of `--stats-file`/`--pid-file` plants symlinks to a
/// file of root's: the daemon replaces the links, never the target.
#[test]
fn stats_and_pid_files_never_follow_planted_symlinks() {
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let (shard, _) = dataset(dir.path());
    let shared = dir.path().join("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).unwrap();
    let victim = dir.path().join("victim");
    fs::write(&victim, b"root's precious file\n").unwrap();
    let stats = shared.join("stats.json");
    let pid = shared.join("packfs.pid");
    for (link, also_tmp) in [(&stats, true), (&pid, false)] {
        let mut links = vec![link.clone()];
        if also_tmp {
            // What the daemon used to write before renaming.
            links.push(link.with_extension("json.tmp"));
        }
        for l in links {
            let out = Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                .arg("ln")
                .arg("-s")
                .arg(&victim)
                .arg(&l)
                .output()
                .unwrap();
            assert_ok(&out);
        }
    }
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let out = packfs()
        .arg("mount")
        .arg("--stats-file")
        .arg(&stats)
        .arg("--pid-file")
        .arg(&pid)
        .arg(&shard)
        .arg(&mnt)
        .output()
        .unwrap();
    assert_ok(&out);
    std::thread::sleep(Duration::from_millis(1500));
    let daemon = read_pid(&pid);
    assert!(fs::read_to_string(&stats).unwrap().contains("\"pid\""));
    run(packfs().arg("umount").arg(&mnt));
    let start = Instant::now();
    while Path::new(&format!("/proc/{daemon}")).exists() && start.elapsed().as_secs() < 10 {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(fs::read(&victim).unwrap(), b"root's precious file\n");
}

/// `umount` touches only packfs mounts (a squashfuse mount is left alone unless --force);
/// `--if-mounted` succeeds on a directory with nothing mounted, for Slurm epilogs.
#[test]
fn umount_leaves_other_file_systems_alone() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    write_file(&src.join("x.txt"), b"x\n", 0o644);
    let image = dir.path().join("x.sqfs");
    assert_ok(
        &Command::new("mksquashfs")
            .arg(&src)
            .arg(&image)
            .args(["-quiet", "-noappend"])
            .output()
            .unwrap(),
    );
    let other = dir.path().join("other");
    fs::create_dir(&other).unwrap();
    assert_ok(
        &Command::new("squashfuse")
            .arg(&image)
            .arg(&other)
            .output()
            .unwrap(),
    );
    let out = packfs().arg("umount").arg(&other).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("not a packfs mount") && err.contains("--force"),
        "{err}"
    );
    assert!(is_mounted(&other));
    run(packfs().arg("umount").arg("--force").arg(&other));
    assert!(!is_mounted(&other));

    let out = packfs().arg("umount").arg(&other).output().unwrap();
    assert!(!out.status.success());
    run(packfs().arg("umount").arg("--if-mounted").arg(&other));
    run(packfs()
        .arg("umount")
        .arg("--if-mounted")
        .arg(dir.path().join("never-made")));
}

/// Mounting over files would hide them: refused unless --nonempty.
#[test]
fn nonempty_mountpoints_are_refused_unless_asked() {
    let dir = tempfile::tempdir().unwrap();
    let (shard, _) = dataset(dir.path());
    let mnt = dir.path().join("mnt");
    write_file(&mnt.join("notes.txt"), b"mine\n", 0o644);
    let out = mount_cmd(&[&shard], &mnt, &[], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("is not empty") && err.contains("--nonempty"),
        "{err}"
    );
    assert!(!is_mounted(&mnt));
    let m = Mount::new(&[&shard], &mnt, &["--nonempty"]);
    assert_eq!(fs::read(m.dir.join("d/c.bin")).unwrap(), bytes(2, 5000));
    drop(m);
    assert_eq!(fs::read(mnt.join("notes.txt")).unwrap(), b"mine\n");
}

/// `index -o` over a file that is not an index (a shard, by a slip of the shell) is refused;
/// --force replaces it; an existing index is rebuilt in place.
#[test]
fn index_output_never_replaces_a_shard() {
    let dir = tempfile::tempdir().unwrap();
    let (shard, index) = dataset(dir.path());
    let other = dir.path().join("s2.tar");
    fs::copy(&shard, &other).unwrap();
    let before = fs::read(&other).unwrap();
    let out = packfs()
        .args(["index", "-o"])
        .arg(&other)
        .arg(&shard)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("refusing to replace") && err.contains("not a packfs index"),
        "{err}"
    );
    assert_eq!(fs::read(&other).unwrap(), before);
    run(packfs().args(["index", "-o"]).arg(&index).arg(&shard));
    run(packfs()
        .args(["index", "--force", "-o"])
        .arg(&other)
        .arg(&shard));
    assert!(packfs::catalog::index::is_index(
        &other,
        &packfs::source::Stores::default()
    ));
}

/// A dead daemon whose root listing the kernel still has cached: a new mount there names the
/// stale mount and its remedy (it used to say "already a mount point"). Several rounds: over
/// io_uring the kernel ends the connection in the background after the daemon's exit, and a
/// check in that moment once took the dead mount for a live one.
#[test]
fn dead_mount_with_cached_listing_is_reported_stale() {
    let dir = tempfile::tempdir().unwrap();
    let (shard, _) = dataset(dir.path());
    let mnt = dir.path().join("mnt");
    for round in 0..8 {
        let m = Mount::new(&[&shard], &mnt, &[]);
        assert_eq!(fs::read_dir(&mnt).unwrap().count(), 2);
        assert_eq!(unsafe { libc::kill(m.pid, libc::SIGKILL) }, 0);
        assert!(m.wait_daemon_exit(Duration::from_secs(5)));
        let out = mount_cmd(&[&shard], &mnt, &[], None);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("stale mount whose daemon died"),
            "round {round}: {err}"
        );
        run(packfs().arg("umount").arg(&mnt));
    }
}

/// `packfs ls | head -1` ends quietly, as coreutils do, instead of "Broken pipe".
#[test]
fn listing_into_a_closed_pipe_ends_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    for i in 0..20_000 {
        write_file(&src.join(format!("many/{i:05}")), b"", 0o644);
    }
    let shard = dir.path().join("many.tar");
    tar_members(&src, &shard, &["many"]);
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "{} ls {} | head -1",
            env!("CARGO_BIN_EXE_packfs"),
            shard.display()
        ))
        .output()
        .unwrap();
    assert_ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("Broken pipe") && err.is_empty(), "{err}");
}

/// A shard overwritten in place while mounted (`cat other.tar > shard.tar`): within a few
/// seconds its unread files fail with EIO, none serves the new bytes, and the log says what
/// changed. It used to serve the other shard's bytes under the old names, silently.
#[test]
fn shard_rewritten_in_place_fails_instead_of_serving_other_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let make = |name: &str, seed: u64, len: usize| {
        let src = dir.path().join(format!("src-{name}"));
        for i in 0..100 {
            write_file(
                &src.join(format!("f/{i:03}.bin")),
                &bytes(seed + i, len),
                0o644,
            );
        }
        let shard = dir.path().join(format!("{name}.tar"));
        tar_members(&src, &shard, &["f"]);
        shard
    };
    let shard = make("a", 0, 5000);
    let other = make("b", 1000, 6000);
    let log = dir.path().join("daemon.log");
    let m = Mount::new(
        &[&shard],
        &dir.path().join("mnt"),
        &["--log-file", log.to_str().unwrap()],
    );
    assert_eq!(fs::read(m.dir.join("f/000.bin")).unwrap(), bytes(0, 5000));
    // In place: same inode, new bytes, new size and mtime.
    let mut out = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&shard)
        .unwrap();
    std::io::copy(&mut fs::File::open(&other).unwrap(), &mut out).unwrap();
    drop(out);
    std::thread::sleep(Duration::from_secs(3));
    let (mut failed, mut right) = (0, 0);
    for i in 1..100u64 {
        match fs::read(m.dir.join(format!("f/{i:03}.bin"))) {
            Ok(data) => {
                assert_eq!(data, bytes(i, 5000), "f/{i:03}.bin served other bytes");
                right += 1;
            }
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
                failed += 1;
            }
        }
    }
    assert_eq!((failed, right), (99, 0));
    assert!(m.daemon_alive());
    drop(m);
    let log = fs::read_to_string(&log).unwrap();
    assert!(
        log.contains("was rewritten while mounted")
            && log.contains("size was")
            && log.contains(&*shard.to_string_lossy()),
        "{log}"
    );
}

/// The image watcher's requests follow the reads, not the images: an idle mount of 6 indexed
/// shards asks the file system nothing; reading one file of each costs one check per shard, at
/// most one a second, and then nothing again. (It checked every image every 2 s: an idle mount
/// of 8 shards sent a MooseFS master 4 requests a second.)
#[test]
fn the_image_watcher_checks_only_images_read_from_and_nothing_when_idle() {
    let dir = tempfile::tempdir().unwrap();
    let mut shards = Vec::new();
    for k in 0..6u64 {
        let files: Vec<(String, Vec<u8>)> = (0..5)
            .map(|i| (format!("s{k}/{i}.bin"), bytes(k * 10 + i, 3000)))
            .collect();
        let sub = dir.path().join(format!("shard{k}"));
        let (_, tar) = tar_of(&sub, &format!("shard{k}"), &files);
        shards.push(tar);
    }
    // An index: no scan reads the shards when the mount starts.
    let index = dir.path().join("all.packfs-index");
    let mut cmd = packfs();
    cmd.arg("index").arg("-o").arg(&index);
    cmd.args(&shards);
    run(&mut cmd);
    let stats = dir.path().join("stats.json");
    let m = Mount::new(
        &[&index],
        &dir.path().join("mnt"),
        &["--stats-file", stats.to_str().unwrap()],
    );
    let checks = || {
        // The stats file is written every second: read the latest, a second after the fact.
        std::thread::sleep(Duration::from_millis(1200));
        let parsed: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(&stats).unwrap()).unwrap();
        parsed["source"]["checks"].as_u64().unwrap()
    };
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(checks(), 0, "an idle mount checked its images");
    let started = Instant::now();
    for k in 0..6u64 {
        let data = fs::read(m.dir.join(format!("s{k}/0.bin"))).unwrap();
        assert_eq!(data, bytes(k * 10, 3000));
    }
    std::thread::sleep(Duration::from_secs(6));
    let after_reads = checks();
    let seconds = started.elapsed().as_secs();
    assert_eq!(after_reads, 6, "one check per shard read ({seconds} s)");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(checks(), 6, "checks went on after the reads stopped");
}

/// A crafted entry whose encoding does not fit its image (a record the catalog does not hold,
/// an encoding code no format uses) fails its reads with EIO and a log line naming the image
/// and the offset, not ENOENT in silence; the other files are served.
#[test]
fn a_crafted_encoding_fails_with_eio_and_says_where() {
    let dir = tempfile::tempdir().unwrap();
    let (_shard, index) = dataset(dir.path());
    let mut bytes_ = fs::read(&index).unwrap();
    let set_code = |bytes_: &mut Vec<u8>, at: usize, code: u32| {
        let mode = u32::from_le_bytes(bytes_[at + 28..at + 32].try_into().unwrap());
        put(
            bytes_,
            at + 28,
            &((mode & 0xffff) | code << 16).to_le_bytes(),
        );
    };
    // a.bin: a zip member's CRC record, at its tar data offset: far past the names arena.
    let a = record_of(&bytes_, "a.bin");
    let a_offset = u64::from_le_bytes(bytes_[a + 8..a + 16].try_into().unwrap());
    set_code(&mut bytes_, a, 3);
    // b.bin: an encoding code no format has.
    let b = record_of(&bytes_, "b.bin");
    set_code(&mut bytes_, b, 9);
    assert!(packfs::catalog::index::reseal(&mut bytes_));
    let crafted = dir.path().join("crafted.packfs-index");
    fs::write(&crafted, &bytes_).unwrap();

    let log = dir.path().join("daemon.log");
    let m = Mount::new(
        &[&crafted],
        &dir.path().join("mnt"),
        &["--log-file", log.to_str().unwrap()],
    );
    for name in ["a", "b"] {
        let err = fs::read(m.dir.join(format!("d/{name}.bin"))).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{name}: {err}");
    }
    assert_eq!(fs::read(m.dir.join("d/c.bin")).unwrap(), bytes(2, 5000));
    drop(m);
    let log = fs::read_to_string(&log).unwrap();
    let line = |what: &str| {
        log.lines()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no line with {what:?}:\n{log}"))
            .to_string()
    };
    let a_line = line("is not in the catalog");
    assert!(
        a_line.contains("s.tar") && a_line.contains(&format!("offset {a_offset}")),
        "{a_line}"
    );
    assert!(line("encoding code 9").contains("s.tar"));
    let (ok, _, err) = run_bounded(packfs().arg("verify").arg(&crafted));
    assert!(!ok && err.contains("encoding code 9"), "{err}");
}
