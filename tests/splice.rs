//! READ replies spliced from the image file into /dev/fuse (`fs::splice`): the bytes are the
//! archived ones at every offset, the counters say they were spliced, the kernel is asked for
//! READs a pipe can carry, and `PACKFS_SPLICE=0` copies every reply as before.

mod common;

use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use common::*;

/// Files around and above the kernel's largest READ (1 MiB), with a small one, in a GNU tar:
/// their bytes start 512 bytes after a header, never on a page boundary of the tar.
fn dataset(dir: &Path) -> (Vec<(String, Vec<u8>)>, PathBuf) {
    let files: Vec<(String, Vec<u8>)> = [
        ("big/a.bin", 5 * 1024 * 1024 + 3),
        ("big/b.bin", 1024 * 1024 + 1),
        ("big/c.bin", 3 * 1024 * 1024 + 517),
        ("small/d.txt", 100),
    ]
    .iter()
    .enumerate()
    .map(|(i, &(name, len))| (name.to_string(), bytes(40 + i as u64, len)))
    .collect();
    let (_, tar) = tar_of(dir, "large", &files);
    (files, tar)
}

/// Reads every file whole in 1 MiB reads (last file first: never a walk in archive order, which
/// goes by chunks), then ranges at odd offsets after dropping the mount's cached pages, checking
/// every byte.
fn read_and_check(mnt: &Path, files: &[(String, Vec<u8>)]) {
    read_whole_files(mnt, files);
    for (name, data) in files {
        let file = File::open(mnt.join(name)).unwrap();
        // Clean pages of a read-only file: dropped, the next reads ask the daemon again.
        use std::os::fd::AsRawFd;
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        for (at, len) in [
            (12_345u64, 777usize),
            (4097, 1 << 20),
            (0, 3),
            (1_048_575, 70_000),
        ] {
            let end = (at as usize + len).min(data.len());
            let start = (at as usize).min(end);
            let mut buf = vec![0u8; len];
            let n = file.read_at(&mut buf, at).unwrap();
            assert_eq!(n, end - start, "{name} at {at}");
            assert!(
                buf[..n] == data[start..end],
                "{name}: {len} bytes at {at} differ"
            );
        }
    }
}

/// Whether a pipe of this process can hold 2 MiB: a 1 MiB READ at any offset with its header.
fn pipes_hold_a_whole_read() -> bool {
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let ok = unsafe { libc::fcntl(fds[1], libc::F_SETPIPE_SZ, 2 << 20) } > 0;
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    ok
}

/// The options of the mount at `mnt`, as /proc/mounts has them.
fn mount_options(mnt: &Path) -> String {
    let mounts = fs::read_to_string("/proc/mounts").unwrap();
    let mnt = mnt.to_str().unwrap();
    mounts
        .lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .find(|f| f.get(1) == Some(&mnt))
        .map(|f| f[3].to_string())
        .unwrap_or_else(|| panic!("{mnt} is not in /proc/mounts"))
}

#[test]
fn large_files_are_spliced_byte_for_byte_at_any_offset() {
    let dir = tempfile::tempdir().unwrap();
    let (files, tar) = dataset(dir.path());
    let mnt = dir.path().join("mnt");
    let m = Mount::new(&[&tar], &mnt, &[]);
    let options = mount_options(&m.dir);
    // A pipe that cannot carry a whole 1 MiB READ at any offset: the kernel is asked for READs
    // of 254 pages, which it can. And the readahead is a multiple of that (one READ, not two).
    if pipes_hold_a_whole_read() {
        assert!(!options.contains("max_read="), "{options}");
    } else {
        assert!(options.contains("max_read=1040384"), "{options}");
        let readahead = fs::read_to_string(format!(
            "/sys/class/bdi/{}/read_ahead_kb",
            run(std::process::Command::new("mountpoint")
                .arg("-d")
                .arg(&m.dir))
            .trim()
        ))
        .unwrap();
        assert_eq!(readahead.trim(), "1016", "readahead of the mount");
    }
    read_and_check(&m.dir, &files);
    let served = &counters(&m.dir)["served"];
    let spliced = served["spliced_bytes"].as_u64().unwrap();
    let source = served["source_bytes"].as_u64().unwrap();
    // Every large file was read whole from the source at least once, in READs spliced whole.
    let large: u64 = files[..3].iter().map(|(_, d)| d.len() as u64).sum();
    assert!(
        spliced >= large,
        "{spliced} bytes spliced of {large}: {served}"
    );
    assert!(
        spliced <= source,
        "spliced {spliced} > from the images {source}"
    );
}

#[test]
fn packfs_splice_0_copies_every_reply() {
    let dir = tempfile::tempdir().unwrap();
    let (files, tar) = dataset(dir.path());
    let mnt = dir.path().join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let _unmount = UnmountOnDrop(mnt.clone());
    assert_ok(
        &packfs()
            .env("PACKFS_SPLICE", "0")
            .arg("mount")
            .arg(&tar)
            .arg(&mnt)
            .output()
            .unwrap(),
    );
    assert!(!mount_options(&mnt).contains("max_read="));
    read_and_check(&mnt, &files);
    let served = &counters(&mnt)["served"];
    assert_eq!(served["spliced_bytes"].as_u64(), Some(0), "{served}");
    let large: u64 = files[..3].iter().map(|(_, d)| d.len() as u64).sum();
    assert!(
        served["source_bytes"].as_u64().unwrap() >= large,
        "{served}"
    );
}

/// A mount none of whose reads can be spliced keeps the kernel's 1 MiB READs: a 1 MiB sample
/// split in two READs (254 pages, then 2) only cost requests and memory, 66-88 MiB against
/// 54-60 for 32 readers staging from mount time (tests/memory.rs, whose bound CI saw crossed).
/// Members of a compressed image are decoded, never spliced; staged chunks are read from the
/// stage.
#[test]
fn mounts_that_cannot_splice_keep_1_mib_reads() {
    let dir = tempfile::tempdir().unwrap();
    let (files, tar) = dataset(dir.path());
    let tgz = dir.path().join("large.tar.gz");
    sh(
        &format!("gzip -c {} > {}", tar.display(), tgz.display()),
        dir.path(),
    );
    let stage = dir.path().join("stage");
    let stage_arg = stage.to_str().unwrap();
    for (image, extra, what) in [
        (&tgz, &[][..], "a .tar.gz"),
        (&tar, &["--stage", stage_arg][..], "a staged tar"),
    ] {
        let mnt = dir.path().join("mnt");
        let m = Mount::new(&[image], &mnt, extra);
        let options = mount_options(&m.dir);
        assert!(!options.contains("max_read="), "{what}: {options}");
        read_and_check(&m.dir, &files);
        let served = &counters(&m.dir)["served"];
        assert_eq!(
            served["spliced_bytes"].as_u64(),
            Some(0),
            "{what}: {served}"
        );
    }
}

/// `packfs pack`'s shards record a CRC-32 per member, and a member is checked before its first
/// reply. The check reads it in the image's page cache (a mapping), and every reply splices:
/// the first READ of a file and small files too. Reads issued on the images are the READ bytes,
/// not twice them (the check read the member whole into a buffer first, then again). A
/// damaged member still fails, whole or in part.
#[test]
fn members_with_a_crc_record_are_checked_in_place_and_every_reply_spliced() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let files: Vec<(String, Vec<u8>)> = [
        ("train/a/big.npz", 4 * 1024 * 1024 + 3),
        ("train/a/1.jpg", 110_000),
        ("train/b/2.jpg", 97_001),
        ("train/b/3.jpg", 120_517),
        ("train/b/tiny.txt", 100),
    ]
    .iter()
    .enumerate()
    .map(|(i, &(name, len))| (name.to_string(), bytes(70 + i as u64, len)))
    .collect();
    for (name, data) in &files {
        write_file(&src.join(name), data, 0o644);
    }
    let out = dir.path().join("packed");
    run(packfs().arg("pack").arg(&src).arg("-o").arg(&out));
    let index = out.join("src.packfs-index");
    assert!(
        index.exists(),
        "{:?}",
        fs::read_dir(&out).unwrap().collect::<Vec<_>>()
    );
    let files: Vec<(String, Vec<u8>)> = files
        .into_iter()
        .map(|(name, data)| (format!("src/{name}"), data))
        .collect();

    let m = Mount::new(&[&index], &dir.path().join("mnt"), &[]);
    let read: u64 = files.iter().map(|(_, d)| d.len() as u64).sum();
    read_whole_files(&m.dir, &files);
    let c = counters(&m.dir);
    let (served, source) = (&c["served"], &c["source"]);
    let spliced = served["spliced_bytes"].as_u64().unwrap();
    assert_eq!(
        spliced,
        served["source_bytes"].as_u64().unwrap(),
        "every byte from the images spliced, first READs and small files too: {served}"
    );
    assert_eq!(spliced, read, "{served}");
    assert_eq!(source["checked_bytes"].as_u64(), Some(read), "{source}");
    let issued = source["bytes"].as_u64().unwrap();
    assert!(
        issued as f64 <= 1.01 * read as f64,
        "{issued} bytes read from the images for {read} bytes of READs: {source}"
    );
    drop(m);

    // One byte of the big member and of a small one damaged (mtime kept, away from the ends the
    // fingerprint hashes): each fails with EIO, read whole or from its middle, and the others
    // still read.
    let shard = fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "tar"))
        .unwrap();
    let raw = fs::read(&shard).unwrap();
    let mtime = fs::metadata(&shard).unwrap().modified().unwrap();
    let image = File::options().write(true).open(&shard).unwrap();
    for (name, data) in [&files[0], &files[2]] {
        let at = raw.windows(64).position(|w| w == &data[..64]).unwrap() + data.len() / 2;
        assert!(at > 64 << 10 && at < raw.len() - (64 << 10), "{name}");
        image.write_all_at(&[raw[at] ^ 0x5a], at as u64).unwrap();
    }
    image.set_modified(mtime).unwrap();
    drop(image);
    let m = Mount::new(&[&index], &dir.path().join("mnt2"), &[]);
    let big = File::open(m.dir.join(&files[0].0)).unwrap();
    let mut buf = vec![0u8; 4096];
    let err = big.read_at(&mut buf, 3 << 20).unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(libc::EIO),
        "part of the big one: {err}"
    );
    for (name, _) in [&files[0], &files[2]] {
        let err = fs::read(m.dir.join(name)).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{name}: {err}");
    }
    for (name, data) in [&files[1], &files[3], &files[4]] {
        assert!(fs::read(m.dir.join(name)).unwrap() == *data, "{name}");
    }
}

/// Reads every file whole, in 1 MiB reads, checking its bytes: last first (a walk in archive
/// order goes by chunks).
fn read_whole_files(mnt: &Path, files: &[(String, Vec<u8>)]) {
    for (name, data) in files.iter().rev() {
        let file = File::open(mnt.join(name)).unwrap();
        let mut got = Vec::with_capacity(data.len());
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = file.read_at(&mut buf, got.len() as u64).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        assert!(
            got == *data,
            "{name}: the bytes differ from the packed ones"
        );
    }
}
