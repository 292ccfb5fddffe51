//! Bad input gets a clear error naming the shard and the byte offset; odd members are skipped
//! with a warning; writes fail with EROFS; a shard cut under the daemon fails its reads with the reason.

mod common;

use std::fs;
use std::io::{ErrorKind, Read};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// A GNU tar of the given (name, contents) members; returns its path.
fn make_tar(dir: &Path, name: &str, members: &[(&str, Vec<u8>)]) -> PathBuf {
    let path = dir.join(name);
    let mut b = tar::Builder::new(fs::File::create(&path).unwrap());
    for (member, data) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(1_700_000_000);
        b.append_data(&mut h, member, data.as_slice()).unwrap();
    }
    b.into_inner().unwrap();
    path
}

/// Mounting `images` fails; returns the error output, and checks nothing was left mounted.
fn mount_fails(images: &[&Path], mnt: &Path) -> String {
    let out = mount_cmd(images, mnt, &[], None);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "mount succeeded unexpectedly:\n{stderr}"
    );
    assert!(!is_mounted(mnt), "left a mount behind");
    // The reason once: no second line about the daemon's exit after it.
    assert!(
        !stderr.contains("exited before"),
        "a second error line after the reason:\n{stderr}"
    );
    stderr
}

/// A mount that cannot start says why in one line, naming the image or the mountpoint as given
/// on the command line's terms (absolute).
#[test]
fn a_failed_mount_says_why_once() {
    let dir = tempfile::tempdir().unwrap();
    let shard = make_tar(dir.path(), "s.tar", &[("a.txt", b"a".to_vec())]);
    let missing = dir.path().join("missing.tar");
    fs::create_dir(dir.path().join("mnt")).unwrap();
    let stderr = mount_fails(&[&missing], &dir.path().join("mnt"));
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].contains("missing.tar"), "{stderr}");
    // Found before the fork: no daemon started, so none left its log behind.
    let abs = std::path::absolute(dir.path().join("mnt")).unwrap();
    let log = packfs::daemon::stats::log_path(&abs);
    assert!(
        !log.exists(),
        "a daemon ran and logged to {}",
        log.display()
    );
    let stderr = mount_fails(&[&shard], &dir.path().join("no/such/mnt"));
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].contains("does not exist"), "{stderr}");
}

#[test]
fn bad_shards_are_rejected_with_shard_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let good = make_tar(dir.path(), "good.tar", &[("a.txt", bytes(1, 1000))]);

    let missing = dir.path().join("missing.tar");
    let err = mount_fails(&[&good, &missing], &mnt);
    assert!(
        err.contains("missing.tar") && err.contains("No such file"),
        "{err}"
    );

    let junk = dir.path().join("junk.tar");
    fs::write(&junk, bytes(2, 4096)).unwrap();
    let err = mount_fails(&[&junk], &mnt);
    assert!(
        err.contains("junk.tar: at byte offset 0: not a tar archive"),
        "{err}"
    );

    // A member whose data runs past the end of the file.
    let truncated = make_tar(
        dir.path(),
        "truncated.tar",
        &[("a.txt", bytes(3, 1000)), ("big.bin", bytes(4, 100_000))],
    );
    truncate(&truncated, 50_000);
    let err = mount_fails(&[&good, &truncated], &mnt);
    assert!(
        err.contains("truncated.tar: at byte offset 1536: member runs past the end"),
        "{err}"
    );

    // A flipped byte in the second header (at 512 + 1024) costs that member only, as in GNU
    // tar (tests/damaged_tar.rs).
    let corrupt = make_tar(
        dir.path(),
        "corrupt.tar",
        &[("a.txt", bytes(5, 1000)), ("b.txt", bytes(6, 10))],
    );
    let mut raw = fs::read(&corrupt).unwrap();
    raw[1536 + 3] ^= 0x20;
    fs::write(&corrupt, raw).unwrap();
    {
        let m = Mount::new(&[&corrupt], &mnt, &[]);
        assert_eq!(fs::read(m.dir.join("a.txt")).unwrap(), bytes(5, 1000));
        assert!(!m.dir.join("b.txt").exists());
    }

    let err = mount_fails(&[&good], &dir.path().join("no-such-dir"));
    assert!(err.contains("no-such-dir does not exist"), "{err}");

    // The mountpoint is still usable after all these failures.
    let m = Mount::new(&[&good], &mnt, &[]);
    assert_eq!(fs::read(m.dir.join("a.txt")).unwrap(), bytes(1, 1000));
    // Another dataset over a live mount is refused (the same one is reused: tests/lifecycle.rs).
    let out = mount_cmd(&[&corrupt], &mnt, &[], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("is already a mount point"),
        "{err}"
    );
    assert_eq!(fs::read(m.dir.join("a.txt")).unwrap(), bytes(1, 1000));
}

#[test]
fn same_path_in_two_shards() {
    let dir = tempfile::tempdir().unwrap();
    let a = make_tar(dir.path(), "a.tar", &[("x/same.txt", b"first".to_vec())]);
    let b = make_tar(dir.path(), "b.tar", &[("x/same.txt", b"second".to_vec())]);
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let err = mount_fails(&[&a, &b], &mnt);
    assert!(
        err.contains("\"x/same.txt\" is in two images")
            && err.contains("a.tar")
            && err.contains("b.tar"),
        "{err}"
    );
    let m = Mount::new(&[&a, &b], &mnt, &["--duplicates", "last-wins"]);
    assert_eq!(fs::read(m.dir.join("x/same.txt")).unwrap(), b"second");
}

const ODD_MEMBERS: &str = r#"
import io, sys, tarfile
def add(t, name, data=b"", kind=tarfile.REGTYPE):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = len(data)
    info.mode = 0o644
    t.addfile(info, io.BytesIO(data) if data else None)
with tarfile.open(sys.argv[1], "w", format=tarfile.GNU_FORMAT) as t:
    add(t, "../evil.txt", b"evil")
    add(t, "/abs/file.txt", b"abs")
    add(t, "./dot/file.txt", b"dot")
    add(t, "a//b.txt", b"empty component")
    add(t, "dev/null0", kind=tarfile.CHRTYPE)
    add(t, "fifo0", kind=tarfile.FIFOTYPE)
    add(t, "ok/keep.txt", b"keep")
"#;

#[test]
fn odd_members_are_skipped_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join("odd.tar");
    run(Command::new("python3").arg("-c").arg(ODD_MEMBERS).arg(&odd));
    // A GNU sparse member in a second shard.
    let sparse_dir = dir.path().join("sparse");
    fs::create_dir(&sparse_dir).unwrap();
    let f = fs::File::create(sparse_dir.join("holes.bin")).unwrap();
    f.set_len(4 << 20).unwrap();
    let sparse = dir.path().join("sparse.tar");
    run(Command::new("tar")
        .args(["--format=gnu", "--sparse", "-cf"])
        .arg(&sparse)
        .arg("-C")
        .arg(&sparse_dir)
        .arg("holes.bin"));

    let m = Mount::new(&[&odd, &sparse], &dir.path().join("mnt"), &[]);
    for (name, why) in [
        ("../evil.txt", "'..' component"),
        ("a//b.txt", "empty component"),
        ("dev/null0", "device nodes"),
        ("fifo0", "FIFOs"),
    ] {
        let line = m
            .stderr
            .lines()
            .find(|l| l.contains(&format!("skipping member \"{name}\"")))
            .unwrap_or_else(|| panic!("no warning for {name}:\n{}", m.stderr));
        assert!(line.contains(why) && line.contains("offset="), "{line}");
        assert!(
            line.contains("odd.tar") || line.contains("sparse.tar"),
            "{line}"
        );
    }
    assert_eq!(fs::read(m.dir.join("abs/file.txt")).unwrap(), b"abs");
    assert_eq!(fs::read(m.dir.join("dot/file.txt")).unwrap(), b"dot");
    assert_eq!(fs::read(m.dir.join("ok/keep.txt")).unwrap(), b"keep");
    // The sparse member is served (all of it a hole: zeros).
    assert_eq!(
        fs::read(m.dir.join("holes.bin")).unwrap(),
        vec![0u8; 4 << 20]
    );
    let mut top: Vec<String> = fs::read_dir(&m.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    top.sort();
    assert_eq!(top, ["abs", "dot", "holes.bin", "ok"]);
    assert!(!dir.path().join("evil.txt").exists());
}

#[test]
fn missing_paths_and_writes() {
    let dir = tempfile::tempdir().unwrap();
    let shard = make_tar(dir.path(), "s.tar", &[("d/a.txt", b"a".to_vec())]);
    let m = Mount::new(&[&shard], &dir.path().join("mnt"), &[]);
    let p = |rel: &str| m.dir.join(rel);
    assert_eq!(
        fs::metadata(p("nope")).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(
        fs::metadata(p("d/nope.txt")).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(
        fs::read(p("d/a.txt/x")).unwrap_err().raw_os_error(),
        Some(libc::ENOTDIR)
    );
    let erofs =
        |r: std::io::Result<()>| assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EROFS));
    erofs(fs::File::create(p("new.txt")).map(drop));
    erofs(fs::File::options().write(true).open(p("d/a.txt")).map(drop));
    erofs(
        fs::File::options()
            .append(true)
            .open(p("d/a.txt"))
            .map(drop),
    );
    erofs(fs::create_dir(p("newdir")));
    erofs(fs::remove_file(p("d/a.txt")));
    erofs(fs::rename(p("d/a.txt"), p("d/b.txt")));
    erofs(fs::set_permissions(
        p("d/a.txt"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    ));
    erofs(std::os::unix::fs::symlink("x", p("link")));
    // The mount is read-only, nosuid and nodev.
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let abs = packfs::daemon::mounts::absolute(&m.dir).unwrap();
    let line = mounts
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(abs.to_str().unwrap()))
        .expect("mount listed");
    let opts = line.split(' ').nth(5).unwrap();
    for o in ["ro", "nosuid", "nodev"] {
        assert!(opts.split(',').any(|x| x == o), "{o} missing in {opts}");
    }
}

/// A shard truncated under the running daemon: the read that meets the cut fails with EIO and is
/// logged with shard, offset and file; the failed read shows the shard was rewritten, so its
/// other files fail too rather than serve bytes the catalog no longer describes. (That an I/O
/// error of the source fails only its own read is tested with injected faults in model.rs.)
#[test]
fn truncated_shard_fails_its_reads_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let shard = make_tar(
        dir.path(),
        "s.tar",
        &[
            ("a.txt", bytes(1, 5000)),
            ("b.txt", bytes(2, 7000)),
            ("tail.bin", bytes(3, 300_000)),
        ],
    );
    let log = dir.path().join("daemon.log");
    let log_arg = log.to_str().unwrap().to_string();
    let m = Mount::new(
        &[&shard],
        &dir.path().join("mnt"),
        &["--log-file", &log_arg],
    );
    // Cut the last member's data out from under the running daemon.
    let len = fs::metadata(&shard).unwrap().len();
    truncate(&shard, len - 200_000);
    let mut f = fs::File::open(m.dir.join("tail.bin")).unwrap();
    let mut buf = Vec::new();
    let err = f.read_to_end(&mut buf).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    for name in ["a.txt", "b.txt"] {
        let err = fs::read(m.dir.join(name)).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{name}: {err}");
    }
    assert!(m.daemon_alive());
    let logged = fs::read_to_string(&log).unwrap();
    let line = logged
        .lines()
        .find(|l| l.contains("read failed"))
        .unwrap_or_else(|| panic!("no read error logged:\n{logged}"));
    assert!(
        line.contains("s.tar") && line.contains("offset=") && line.contains("tail.bin"),
        "{line}"
    );
    assert!(
        logged.contains("was rewritten while mounted") && logged.contains("size was"),
        "{logged}"
    );
}

/// Many members skipped for one reason make a few named warnings and one summary, not a line
/// each.
#[test]
fn many_skipped_members_are_summarized() {
    let dir = tempfile::tempdir().unwrap();
    let shard = dir.path().join("fifos.tar");
    run(Command::new("python3")
        .arg("-c")
        .arg(
            "import io, sys, tarfile\n\
             with tarfile.open(sys.argv[1], 'w', format=tarfile.GNU_FORMAT) as t:\n\
             \x20   for i in range(200):\n\
             \x20       info = tarfile.TarInfo(f'pipes/p{i:03d}'); info.type = tarfile.FIFOTYPE\n\
             \x20       t.addfile(info)\n\
             \x20   info = tarfile.TarInfo('kept.txt'); info.size = 4\n\
             \x20   t.addfile(info, io.BytesIO(b'kept'))\n",
        )
        .arg(&shard));
    let out = packfs().arg("ls").arg(&shard).output().unwrap();
    assert_ok(&out);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "kept.txt\n");
    let log = String::from_utf8_lossy(&out.stderr);
    let named = log
        .lines()
        .filter(|l| l.contains("skipping member"))
        .count();
    assert_eq!(named, 5, "{log}");
    let summary = log
        .lines()
        .find(|l| l.contains("skipped 200 members in all: FIFOs are not served"))
        .unwrap_or_else(|| panic!("no summary:\n{log}"));
    assert!(summary.contains("fifos.tar"), "{summary}");
    assert!(log.lines().count() < 10, "{log}");
}

/// A name that holds a newline cannot forge a line: `ls -0` separates names with NULs, and on a
/// terminal the name is quoted as GNU ls quotes it.
#[test]
fn names_with_control_characters_list_safely() {
    let dir = tempfile::tempdir().unwrap();
    let shard = dir.path().join("names.tar");
    run(Command::new("python3")
        .arg("-c")
        .arg(
            "import io, sys, tarfile\n\
             with tarfile.open(sys.argv[1], 'w', format=tarfile.PAX_FORMAT) as t:\n\
             \x20   for name in ('ok.txt', 'line\\nforged.txt', 'esc\\x1b[2J'):\n\
             \x20       info = tarfile.TarInfo(name); info.size = 1\n\
             \x20       t.addfile(info, io.BytesIO(b'1'))\n",
        )
        .arg(&shard));
    let out = packfs().arg("ls").arg("-0").arg(&shard).output().unwrap();
    assert_ok(&out);
    let names: Vec<&[u8]> = out.stdout.split(|&b| b == 0).collect();
    assert_eq!(
        names,
        [&b"esc\x1b[2J"[..], b"line\nforged.txt", b"ok.txt", b""],
        "{:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    // On a terminal (script(1) gives the command one): quoted, one line per name.
    let cmd = format!(
        "{} ls {} 2>/dev/null",
        env!("CARGO_BIN_EXE_packfs"),
        shard.display()
    );
    let shown = run(Command::new("script").args(["-qec", &cmd, "/dev/null"]));
    let lines: Vec<&str> = shown.lines().map(|l| l.trim_end_matches('\r')).collect();
    assert_eq!(
        lines,
        ["'esc'$'\\033''[2J'", "'line'$'\\n''forged.txt'", "ok.txt"],
        "{shown:?}"
    );
}

/// A compressed tar is refused with the name of its compression and the command that unpacks it
/// (not as "a bad tar header").
#[test]
fn compressed_tars_are_refused_with_the_command_that_unpacks_them() {
    let dir = tempfile::tempdir().unwrap();
    let shard = make_tar(dir.path(), "s.tar", &[("a.txt", bytes(1, 1000))]);
    // gzip, zstd, xz and bzip2 are served (tests/compressed.rs, tests/zstd.rs,
    // tests/xz_bzip2.rs); the others are refused.
    for (tool, name) in [
        ("gzip", "gz"),
        ("zstd", "zst"),
        ("xz", "xz"),
        ("bzip2", "bz2"),
    ] {
        let packed = dir.path().join(format!("s.tar.{name}"));
        let out = Command::new(tool).arg("-c").arg(&shard).output().unwrap();
        fs::write(&packed, &out.stdout).unwrap();
        assert!(
            run(packfs().arg("ls").arg(&packed)).contains("a.txt"),
            "{name}"
        );
    }
    // lz4 has no random access: refused with the command that unpacks it.
    let name = "lz4";
    let packed = dir.path().join(format!("s.tar.{name}"));
    let out = Command::new("lz4")
        .args(["-q", "-c"])
        .arg(&shard)
        .output()
        .unwrap();
    assert_ok(&out);
    fs::write(&packed, &out.stdout).unwrap();
    let out = packfs().arg("ls").arg(&packed).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{name}: {err}");
    assert!(
        err.contains(&format!(
            "{}: at byte offset 0: a {name}-compressed file",
            packed.display()
        )) && err.contains("decompress it once"),
        "{name}: {err}"
    );
}

/// A FIFO or a directory given as an image (a glob that matched one) is refused at once, named
/// for what it is; opening a FIFO used to wait for a writer forever.
#[test]
fn images_that_are_not_regular_files_are_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("shard-000.tar");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let subdir = dir.path().join("shard-001.tar");
    fs::create_dir(&subdir).unwrap();
    let good = make_tar(dir.path(), "good.tar", &[("a.txt", bytes(1, 100))]);
    for (bad, what) in [(&fifo, "a FIFO"), (&subdir, "a directory")] {
        for args in [
            vec!["ls"],
            vec!["verify"],
            vec!["index", "-o", "/nonexistent/x.packfs-index"],
        ] {
            let mut child = packfs()
                .args(&args[..1])
                .arg(&good)
                .arg(bad)
                .args(&args[1..])
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let status = wait_or_kill(
                &mut child,
                &format!("packfs {args:?} on {what}"),
                std::time::Duration::from_secs(20),
            );
            let mut err = String::new();
            child.stderr.unwrap().read_to_string(&mut err).unwrap();
            assert!(!status.success(), "{args:?} {what}: {err}");
            assert!(
                err.contains(&format!("{what}, not a regular file"))
                    && err.contains(&*bad.to_string_lossy()),
                "{args:?} {what}: {err}"
            );
        }
        let mnt = dir.path().join("mnt");
        fs::create_dir_all(&mnt).unwrap();
        let err = mount_fails(&[&good, bad], &mnt);
        assert!(
            err.contains(&format!("{what}, not a regular file")),
            "{err}"
        );
    }
}

/// A flood of identical failures makes a few lines, not one per request: 16 readers of a shard
/// cut under the daemon fail thousands of reads; the log names the first few per window and
/// counts the rest in one line, and the counters keep every failure.
#[test]
fn a_flood_of_failures_is_logged_a_few_times_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let members: Vec<(String, Vec<u8>)> = (0..40)
        .map(|i| (format!("f{i:02}.bin"), bytes(i, 4000)))
        .collect();
    let refs: Vec<(&str, Vec<u8>)> = members
        .iter()
        .map(|(n, d)| (n.as_str(), d.clone()))
        .collect();
    let shard = make_tar(dir.path(), "s.tar", &refs);
    let log = dir.path().join("daemon.log");
    let log_arg = log.to_str().unwrap().to_string();
    let m = Mount::new(
        &[&shard],
        &dir.path().join("mnt"),
        &["--log-file", &log_arg],
    );
    truncate(&shard, 1024);
    let failures = std::sync::atomic::AtomicU64::new(0);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(3);
    std::thread::scope(|s| {
        for t in 0..16 {
            let (dir, failures) = (&m.dir, &failures);
            s.spawn(move || {
                let mut i = t;
                while std::time::Instant::now() < until {
                    let name = format!("f{:02}.bin", i % 40);
                    if fs::read(dir.join(name)).is_err() {
                        failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    i += 7;
                }
            });
        }
    });
    let failures = failures.into_inner();
    assert!(failures > 200, "only {failures} reads failed");
    // The counters keep every failure (the stats file is rewritten every second).
    let started = std::time::Instant::now();
    loop {
        let counters = run(packfs().args(["status", "--json"]).arg(&m.dir));
        let counters: serde_json::Value = serde_json::from_str(&counters).unwrap();
        let errors = counters[0]["counters"]["errors"].as_u64().unwrap();
        if errors >= failures {
            break;
        }
        assert!(
            started.elapsed().as_secs() < 10,
            "{errors} errors counted, {failures} reads failed"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    drop(m);
    let logged = fs::read_to_string(&log).unwrap();
    let named = logged.lines().filter(|l| l.contains("read failed")).count();
    let head: String = logged.lines().take(30).collect::<Vec<_>>().join("\n");
    let summaries: Vec<&str> = logged
        .lines()
        .filter(|l| l.contains("more failed requests"))
        .collect();
    // One 10 s window, perhaps two: the first few named in each.
    assert!((1..=10).contains(&named), "{named} named:\n{head}");
    assert!(!summaries.is_empty() && summaries.len() <= 2, "{logged}");
    assert!(summaries[0].contains("s.tar"), "{}", summaries[0]);
    assert!(logged.lines().count() < 60, "{head}");
}

/// A 0-byte image is refused as GNU tar refuses it (a failed download, not an empty dataset); a
/// valid archive that holds nothing mounts, with a warning that names it.
#[test]
fn an_empty_image_is_refused_and_an_archive_of_nothing_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let zero = dir.path().join("zero.tar");
    fs::write(&zero, b"").unwrap();
    let tar = Command::new("tar").arg("-tf").arg(&zero).output().unwrap();
    assert!(!tar.status.success(), "GNU tar refuses it too");
    fs::create_dir(dir.path().join("mnt")).unwrap();
    let stderr = mount_fails(&[&zero], &dir.path().join("mnt"));
    assert!(
        stderr.contains("zero.tar: at byte offset 0: the image is empty (0 bytes)"),
        "{stderr}"
    );
    // An archive of nothing: GNU tar's end-of-archive blocks alone (`tar -cf x -T /dev/null`).
    let nothing = dir.path().join("nothing.tar");
    run(Command::new("tar")
        .arg("-cf")
        .arg(&nothing)
        .args(["-T", "/dev/null"]));
    let out = mount_cmd(&[&nothing], &dir.path().join("mnt"), &[], None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let _unmount = UnmountOnDrop(dir.path().join("mnt"));
    assert!(
        stderr.contains("nothing.tar: the archive holds no files"),
        "{stderr}"
    );
}

/// A member whose name is 10 000 bytes (Python's tarfile writes it in a PAX header) is skipped
/// with a warning that shows the start of its name and its length, not the whole of it.
#[test]
fn a_ten_thousand_byte_name_is_warned_of_in_a_line_of_its_own_size() {
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("long.tar");
    sh(
        "python3 -c \"import io, tarfile\nwith tarfile.open('long.tar', 'w', format=tarfile.PAX_FORMAT) as t:\n  \
         for name, data in [('d/' + 'n' * 10000, b'x'), ('d/ok.txt', b'ok')]:\n    \
         i = tarfile.TarInfo(name); i.size = len(data); t.addfile(i, io.BytesIO(data))\"",
        dir.path(),
    );
    let out = packfs().arg("ls").arg(&tar).output().unwrap();
    assert_ok(&out);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("(10002 bytes)"), "{said}");
    assert!(said.len() < 2_000, "{} bytes of warnings", said.len());
    assert!(String::from_utf8_lossy(&out.stdout).contains("d/ok.txt"));
}
