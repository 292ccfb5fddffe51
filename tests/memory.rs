//! Memory follows `--cache-size`, never what an archive declares: a zip whose one member
//! inflates far beyond the zip's own size, and a `.tar.gz`, scanned by `ls` and `index` and
//! served by a daemon under a 16 MiB cache, with their peak RSS read from the kernel. Checkpoints
//! every 64 KiB make the tables large (a 32 KiB window per checkpoint: 128 MiB for 256 MiB
//! decoded), as a 40 GiB member makes them with the default spacing; the tables go to disk.
//! (docs/benchmarks.md has the figures for 40 GiB and 100 GiB, from bench/memory/run.sh.)

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::*;

const MAKE_IMAGES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/memory/make_images.py");

/// Checkpoint spacing for these tests: 16 checkpoints, 512 KiB of windows, per decoded MiB.
const SPACING: &str = "64K";
/// Decoded bytes of each image: 128 MiB of checkpoint tables.
const DECODED: &str = "256M";
/// The most a command may hold at once while it scans such an image (its tables alone, held in
/// memory, would be 128 MiB, and they were held three to four times over).
const SCAN_BOUND_KIB: u64 = 96 << 10;
/// A daemon's budget: the 16 MiB cache plus 64 MiB.
const DAEMON_BOUND_KIB: u64 = (16 + 64) << 10;

fn make(kind: &str, out: &Path, decoded: &str) {
    run(Command::new("python3")
        .arg(MAKE_IMAGES)
        .arg(kind)
        .arg(out)
        .arg(decoded));
}

fn packfs_spaced() -> Command {
    let mut cmd = packfs();
    cmd.env("PACKFS_CHECKPOINT_SPACING", SPACING);
    cmd
}

/// Reads a pipe to its end on a thread of its own.
fn drain(mut pipe: impl std::io::Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        pipe.read_to_end(&mut v).unwrap();
        v
    })
}

/// Runs `cmd` to its end; its output and its peak resident set in KiB (the kernel's
/// `ru_maxrss` of that child).
// The child is reaped by wait4 below, which std's Child does not offer (it would not give the
// child's rusage).
#[allow(clippy::zombie_processes)]
fn peak_rss(cmd: &mut Command) -> (Output, u64) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let out = drain(child.stdout.take().unwrap());
    let err = drain(child.stderr.take().unwrap());
    let mut status = 0;
    // SAFETY: a zeroed rusage is valid; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our child `pid` with valid out-pointers.
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(waited, pid);
    let output = Output {
        status: std::os::unix::process::ExitStatusExt::from_raw(status),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    };
    (output, usage.ru_maxrss as u64)
}

/// A field of /proc/PID/status, in KiB.
fn status_kib(pid: i32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = text.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// `ls` and `index` of `image` stay under the scan bound; daemons mounted from the image and from
/// the index stay within the cache plus 64 MiB while reading the whole member.
fn bounded(image: &Path, file: &str, dir: &Path) {
    let (out, rss) = peak_rss(packfs_spaced().arg("ls").arg(image));
    assert_ok(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains(file));
    assert!(rss < SCAN_BOUND_KIB, "ls of {}: {rss} KiB", image.display());

    let index = dir.join("big.packfs-index");
    let (out, rss) = peak_rss(
        packfs_spaced()
            .arg("index")
            .arg(image)
            .arg("-o")
            .arg(&index),
    );
    assert_ok(&out);
    assert!(
        rss < SCAN_BOUND_KIB,
        "index of {}: {rss} KiB",
        image.display()
    );
    // The tables are in the index: 128 MiB of windows.
    assert!(std::fs::metadata(&index).unwrap().len() > 128 << 20);

    for (what, source) in [("image", image.to_path_buf()), ("index", index.clone())] {
        let mnt = dir.join(format!("mnt-{what}"));
        let m = Mount::new(&[&source], &mnt, &["--cache-size", "16M"]);
        // Every byte, so every checkpoint's window is used once.
        let mut f = std::fs::File::open(mnt.join(file)).unwrap();
        let mut buf = vec![0u8; 4 << 20];
        let mut read = 0u64;
        loop {
            let n = std::io::Read::read(&mut f, &mut buf).unwrap();
            if n == 0 {
                break;
            }
            assert!(buf[..n].iter().all(|&b| b == 0));
            read += n as u64;
        }
        assert_eq!(read, 256 << 20);
        let (rss, peak) = (status_kib(m.pid, "VmRSS:"), status_kib(m.pid, "VmHWM:"));
        let (anon, file) = (status_kib(m.pid, "RssAnon:"), status_kib(m.pid, "RssFile:"));
        assert!(
            peak < DAEMON_BOUND_KIB,
            "daemon mounted from the {what}: {rss} KiB now ({anon} anonymous, {file} of files), \
             {peak} KiB at most"
        );
        drop(f);
        drop(m);
    }
}

#[test]
fn a_zip_member_declaring_far_more_than_the_zip_holds() {
    let dir = tempfile::tempdir().unwrap();
    let zip = dir.path().join("big.zip");
    make("zip", &zip, DECODED);
    assert!(std::fs::metadata(&zip).unwrap().len() < 1 << 20);
    bounded(&zip, "zeros.bin", dir.path());
}

/// The scans' budget with the default cache: 64 MiB plus 64 MiB.
const DEFAULT_SCAN_BUDGET_KIB: u64 = (64 + 64) << 10;

/// A `.tar.bz2` of zeros written by `bzip2 -9`: 400 MiB in 8 KB, each block decoding to 46 MB,
/// which bzip2 does not declare. The scan decoded 64 blocks at once (9 here: 600 MB; a 2.5 KB
/// file of 3 GiB took 4.25 GB); now `ls` and `index` hold about two.
#[test]
fn a_bzip2_of_zeros_scans_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    sh(
        "truncate -s 400M zeros.bin && tar cf - zeros.bin | bzip2 -9 > zeros.tar.bz2 && \
         rm zeros.bin",
        dir.path(),
    );
    let image = dir.path().join("zeros.tar.bz2");
    assert!(std::fs::metadata(&image).unwrap().len() < 64 << 10);
    let (out, rss) = peak_rss(packfs().arg("ls").arg(&image));
    assert_ok(&out);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "zeros.bin\n");
    assert!(rss < DEFAULT_SCAN_BUDGET_KIB, "ls: {rss} KiB");
    let index = dir.path().join("zeros.packfs-index");
    let (out, rss) = peak_rss(packfs().arg("index").arg(&image).arg("-o").arg(&index));
    assert_ok(&out);
    assert!(rss < DEFAULT_SCAN_BUDGET_KIB, "index: {rss} KiB");
}

/// Squashfs images whose inode table holds 160 MiB of metadata blocks (of zeros, a few hundred
/// KB on disk) before the two inodes the image lists, with gzip, xz and zstd metadata. Reading
/// the tables whole (as backhand did) held them all; read on demand, a scan, a mount and a read
/// hold a few blocks. unsquashfs lists the same file.
#[test]
fn squashfs_tables_are_read_on_demand() {
    let dir = tempfile::tempdir().unwrap();
    for comp in ["gzip", "xz", "zstd"] {
        let image = dir.path().join(format!("{comp}.sqfs"));
        make(&format!("sqfs-{comp}"), &image, "160M");
        assert!(std::fs::metadata(&image).unwrap().len() < 12 << 20);
        let listed = run(Command::new("unsquashfs").arg("-l").arg(&image));
        assert!(listed.contains("squashfs-root/a.txt"), "{listed}");
        for verb in ["ls", "index"] {
            let mut cmd = packfs();
            cmd.arg(verb).arg(&image);
            if verb == "index" {
                cmd.arg("-o")
                    .arg(dir.path().join(format!("{comp}.packfs-index")));
            }
            let (out, rss) = peak_rss(&mut cmd);
            assert_ok(&out);
            assert!(rss < DEFAULT_SCAN_BUDGET_KIB, "{verb} of {comp}: {rss} KiB");
        }
        let mnt = dir.path().join(format!("mnt-{comp}"));
        let m = Mount::new(&[&image], &mnt, &["--cache-size", "16M"]);
        assert_eq!(std::fs::read(mnt.join("a.txt")).unwrap(), b"hello\n");
        let peak = status_kib(m.pid, "VmHWM:");
        assert!(
            peak < DAEMON_BOUND_KIB,
            "daemon of {comp}: {peak} KiB at most"
        );
    }
}

/// An xz file whose 8 MiB index claims 4 Mi blocks that the file has no room for: refused before
/// they are held (it took 334 MB), naming the index's offset.
#[test]
fn an_xz_index_of_millions_of_blocks_is_refused_before_it_is_held() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("index.tar.xz");
    make("xzindex", &image, "8M");
    let (out, rss) = peak_rss(packfs().arg("ls").arg(&image));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("at byte offset 12") && err.contains("more than the 0 the stream has room"),
        "{err}"
    );
    assert!(rss < 48 << 10, "ls: {rss} KiB");
}

#[test]
fn a_tar_gz_of_many_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let tgz: PathBuf = dir.path().join("big.tar.gz");
    make("targz", &tgz, DECODED);
    bounded(&tgz, "zeros-000.bin", dir.path());
}
