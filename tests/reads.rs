//! Reads through the mount return the archived bytes: at any offset and size, concurrently, past
//! the end, across FUSE request boundaries; from Python the way ImageFolder and DataLoader read.

mod common;

use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

/// Files of varied sizes (empty to several MiB) in class folders, packed into `shards` GNU tars.
fn dataset(root: &Path, shards: usize) -> (Vec<(PathBuf, Vec<u8>)>, Vec<PathBuf>) {
    let src = root.join("src");
    let mut files = Vec::new();
    for i in 0..240u64 {
        let size = match i % 8 {
            0 => 0,
            1 => 1,
            2 => 4095,
            3 => 131_072,
            4 => 1_048_577,
            5 => 3 * 1024 * 1024 + 17,
            _ => 100 + (i as usize * 997) % 60_000,
        };
        let rel = PathBuf::from(format!("train/class_{:02}/sample_{i:04}.jpg", i % 12));
        let data = bytes(i + 100, size);
        write_file(&src.join(&rel), &data, 0o644);
        files.push((rel, data));
    }
    let mut shard_paths = Vec::new();
    for k in 0..shards {
        let shard = root.join(format!("shard-{k}.tar"));
        let members: Vec<&PathBuf> = files
            .iter()
            .enumerate()
            .filter(|(i, _)| i % shards == k)
            .map(|(_, (rel, _))| rel)
            .collect();
        run(Command::new("tar")
            .arg("--format=gnu")
            .arg("-cf")
            .arg(&shard)
            .arg("-C")
            .arg(&src)
            .args(members));
        shard_paths.push(shard);
    }
    (files, shard_paths)
}

#[test]
fn sixteen_threads_read_random_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let (files, shards) = dataset(dir.path(), 4);
    let shard_refs: Vec<&Path> = shards.iter().map(|p| p.as_path()).collect();
    let mnt = Mount::new(&shard_refs, &dir.path().join("mnt"), &["--threads", "4"]);
    std::thread::scope(|s| {
        for t in 0..16u64 {
            let (files, mnt) = (&files, &mnt.dir);
            s.spawn(move || {
                let mut rng = bytes(t + 1, 300 * 12);
                let mut next = || {
                    let v = u32::from_le_bytes(rng[..4].try_into().unwrap());
                    rng.drain(..4);
                    v as usize
                };
                for _ in 0..300 {
                    let (rel, data) = &files[next() % files.len()];
                    let offset = next() % (data.len() + 10);
                    let len = 1 + next() % (2 * 1024 * 1024);
                    let f = File::open(mnt.join(rel)).unwrap();
                    let mut buf = vec![0u8; len];
                    let mut got = 0;
                    // pread may return less than asked; loop until end of file or full buffer.
                    while got < len {
                        let n = f.read_at(&mut buf[got..], (offset + got) as u64).unwrap();
                        if n == 0 {
                            break;
                        }
                        got += n;
                    }
                    let want = &data[offset.min(data.len())..(offset + len).min(data.len())];
                    assert_eq!(&buf[..got], want, "{} at {offset}+{len}", rel.display());
                }
            });
        }
    });
    // Whole files, read sequentially, match too.
    for (rel, data) in &files {
        assert_eq!(
            &std::fs::read(mnt.dir.join(rel)).unwrap(),
            data,
            "{}",
            rel.display()
        );
    }
}

const IMAGEFOLDER_SCAN: &str = r#"
import os, sys, hashlib
from multiprocessing import Pool

def scan(root):
    # What torchvision.datasets.ImageFolder does: sorted class folders, then a walk of each.
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    samples = []
    for index, c in enumerate(classes):
        for dirpath, _, names in sorted(os.walk(os.path.join(root, c), followlinks=True)):
            for name in sorted(names):
                if name.lower().endswith((".jpg", ".jpeg", ".png")):
                    samples.append((os.path.relpath(os.path.join(dirpath, name), root), index))
    return classes, samples

def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()

mounted, original = sys.argv[1], sys.argv[2]
mc, ms = scan(mounted)
oc, os_ = scan(original)
assert mc == oc, (mc, oc)
assert ms == os_, "sample lists differ"
assert len(ms) > 0
# DataLoader-style: 8 worker processes read the samples in a shuffled order.
order = [os.path.join(mounted, rel) for rel, _ in ms][::-1]
with Pool(8) as pool:
    got = pool.map(digest, order, chunksize=4)
want = [digest(os.path.join(original, rel)) for rel, _ in ms][::-1]
assert got == want, "contents differ"
print(f"{len(mc)} classes, {len(ms)} samples verified")
"#;

#[test]
fn python_imagefolder_scan_and_parallel_reads() {
    let dir = tempfile::tempdir().unwrap();
    let (_, shards) = dataset(dir.path(), 3);
    let shard_refs: Vec<&Path> = shards.iter().map(|p| p.as_path()).collect();
    let mnt = Mount::new(&shard_refs, &dir.path().join("mnt"), &[]);
    let out = run(Command::new("python3")
        .arg("-c")
        .arg(IMAGEFOLDER_SCAN)
        .arg(mnt.dir.join("train"))
        .arg(dir.path().join("src/train")));
    assert_eq!(out.trim(), "12 classes, 240 samples verified");
}

/// Reads stuck on a slow backing filesystem must not hold up lookups. The slow filesystem here is
/// another packfs mount whose daemon is stopped with SIGSTOP: reads of the upper mount hang in
/// `pread` until SIGCONT. With two request threads, one stuck read is served inline and the next
/// one is handed to the I/O pool, so a request thread stays free for lookups.
#[test]
fn slow_read_does_not_stall_lookups() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    write_file(&src.join("big.bin"), &bytes(9, 4 << 20), 0o644);
    write_file(&src.join("big2.bin"), &bytes(10, 4 << 20), 0o644);
    for i in 0..50 {
        write_file(&src.join(format!("meta/f{i}.txt")), b"x", 0o644);
    }
    let inner_dir = dir.path().join("inner");
    fs::create_dir(&inner_dir).unwrap();
    tar_members(&src, &inner_dir.join("inner.tar"), &["."]);
    let outer = dir.path().join("outer.tar");
    tar_members(&inner_dir, &outer, &["inner.tar"]);

    // The lower mount serves inner.tar as the file it is (by default it would be a directory).
    let lower = Mount::new(
        &[&outer],
        &dir.path().join("lower"),
        &["--inner-archives", "none"],
    );
    let upper = Mount::new(
        &[&lower.dir.join("inner.tar")],
        &dir.path().join("upper"),
        &["--threads", "2"],
    );
    // Signals are sent with kill(2): spawning a process while a FUSE read is pending in this
    // process can block in fork, which would turn a failure into a hang.
    let signal = |sig| assert_eq!(unsafe { libc::kill(lower.pid, sig) }, 0);
    // The upper's startup read parts of inner.tar through the lower mount, and the kernel may
    // keep those pages (and what its readahead fetched around them): a read they cover would not
    // reach the stopped daemon. Dropping them after the stop makes every read below ask it.
    let inner = File::open(lower.dir.join("inner.tar")).unwrap();
    signal(libc::SIGSTOP);
    let cached = drop_cached_pages(&inner);
    let (tx, rx) = std::sync::mpsc::channel();
    let readers: Vec<_> = ["big.bin", "big2.bin"]
        .into_iter()
        .map(|name| {
            let (path, tx) = (upper.dir.join(name), tx.clone());
            std::thread::spawn(move || {
                let f = File::open(path).unwrap();
                let mut buf = vec![0u8; 65536];
                let n = f.read_at(&mut buf, 3 << 20).unwrap();
                tx.send((name, n)).unwrap();
                buf.truncate(n);
                buf
            })
        })
        .collect();
    // The reads are stuck behind the stopped daemon...
    let early = rx.recv_timeout(Duration::from_millis(500));
    if early.is_ok() {
        // Let the other read finish, so the mounts can go.
        signal(libc::SIGCONT);
    }
    assert!(
        early.is_err(),
        "read did not block: {early:?} (file, bytes) answered with the lower daemon stopped \
         ({cached} pages of the lower image were still cached after the drop)"
    );
    // ...and lookups of names never seen before still answer.
    let (ltx, lrx) = std::sync::mpsc::channel();
    let meta = upper.dir.join("meta");
    std::thread::spawn(move || {
        let found = (0..50)
            .filter(|i| meta.join(format!("f{i}.txt")).exists())
            .count();
        ltx.send(found).unwrap();
    });
    let found = lrx.recv_timeout(Duration::from_secs(20));
    signal(libc::SIGCONT);
    assert_eq!(found, Ok(50), "lookups stalled behind a slow read");
    for (reader, seed) in readers.into_iter().zip([9, 10]) {
        let data = reader.join().unwrap();
        assert_eq!(data, bytes(seed, 4 << 20)[3 << 20..(3 << 20) + 65536]);
    }
    drop(upper);
    drop(inner);
}

/// Drops the kernel's cached pages of `file` (clean pages: no request reaches its file system)
/// and returns how many are still cached afterwards, counted with mincore(2).
fn drop_cached_pages(file: &File) -> usize {
    use std::os::fd::AsRawFd;
    let (fd, len) = (file.as_raw_fd(), file.metadata().unwrap().len() as usize);
    assert_eq!(
        unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED) },
        0
    );
    // Mapping a file reads nothing; mincore only looks at the page cache.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    let mut vec = vec![0u8; len.div_ceil(4096)];
    let r = unsafe { libc::mincore(map, len, vec.as_mut_ptr()) };
    unsafe { libc::munmap(map, len) };
    assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
    vec.iter().filter(|&&v| v & 1 != 0).count()
}

/// File data stays in the kernel's page cache across opens (the images never change): after a
/// first read, the shard is cut short under the running daemon, and new opens still read the data.
#[test]
fn data_stays_cached_across_opens() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    write_file(&src.join("a/cached.bin"), &bytes(21, 300_000), 0o644);
    write_file(&src.join("a/uncached.bin"), &bytes(22, 300_000), 0o644);
    let shard = dir.path().join("s.tar");
    tar_members(&src, &shard, &["a"]);
    // Without RAM chunks, which would hold the neighbour too.
    let m = Mount::new(
        &[&shard],
        &dir.path().join("mnt"),
        &["--ram-chunks", "false"],
    );
    assert_eq!(
        fs::read(m.dir.join("a/cached.bin")).unwrap(),
        bytes(21, 300_000)
    );
    truncate(&shard, 0);
    for _ in 0..3 {
        assert_eq!(
            fs::read(m.dir.join("a/cached.bin")).unwrap(),
            bytes(21, 300_000)
        );
    }
    // The file never read before does hit the (now empty) shard.
    let err = fs::read(m.dir.join("a/uncached.bin")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
}
