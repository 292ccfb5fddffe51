//! CRC-32 of every stored member, for an index that checks reads as pack's does (`packfs index
//! --checksums`). A tar records no checksum of its members' data, so an image rewritten in place
//! (same size, or its mtime restored) would be served as the new bytes until the watcher's turn,
//! or forever; with a CRC-32 in the index, the mount checks each whole-file read against it and
//! answers EIO on a mismatch (`Encoding::StoredCrc`, as zip members and pack's shards have).
//!
//! One sequential read of each image's data, members in offset order, the archives inside an
//! image read with it (their members' bytes lie in the outermost image).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::archive::placement::crc_record;
use crate::archive::{ArchiveError, Encoding, MemberKind, ScannedImage};
use crate::source::{ImageLocation, Stores};

/// Bytes read at a time (one buffer per thread).
const BLOCK: usize = 1 << 20;
/// Images read at once: like the scan, the reads wait on the storage more than on the CPU.
const THREADS: usize = 8;

/// Told how many bytes have been read of how many, as the reading goes.
pub type OnBytes<'a> = &'a (dyn Fn(u64, u64) + Sync);

/// Whether a member's data is stored as it is in a plain image, where a CRC-32 can be recorded.
fn wants_crc(image: &ScannedImage, kind: MemberKind, encoding: Encoding) -> bool {
    kind == MemberKind::File && encoding == Encoding::Stored && image.stream.is_none()
}

/// One member to checksum: its bytes' place in the outermost image, and where it is listed.
struct Job {
    at: u64,
    size: u64,
    image: usize,
    member: usize,
}

impl Job {
    /// Whether `other` is the same bytes (a hard link to this member, or this to it).
    fn same_bytes(&self, other: &Job) -> bool {
        (self.at, self.size) == (other.at, other.size)
    }
}

/// Records the CRC-32 of every stored file of `scanned` (the images of one scan, each inner
/// archive after the image that holds it): each becomes `Encoding::StoredCrc`.
pub fn record(
    scanned: &mut [ScannedImage],
    stores: &Stores,
    on_bytes: OnBytes,
) -> Result<(), ArchiveError> {
    // Where each image's bytes start in its outermost image, and which one that is.
    let mut root = vec![0usize; scanned.len()];
    let mut base = vec![0u64; scanned.len()];
    for i in 0..scanned.len() {
        root[i] = i;
        if let (Some(outer), ImageLocation::Within(w)) = (scanned[i].within, &scanned[i].location)
            && outer < i
        {
            root[i] = root[outer];
            base[i] = base[outer].saturating_add(w.base);
        }
    }
    let mut groups: Vec<Vec<Job>> = (0..scanned.len()).map(|_| Vec::new()).collect();
    for (i, image) in scanned.iter().enumerate() {
        for (j, m) in image.members.iter().enumerate() {
            if wants_crc(image, m.kind, m.encoding) {
                groups[root[i]].push(Job {
                    at: base[i].saturating_add(m.data_offset),
                    size: m.size,
                    image: i,
                    member: j,
                });
            }
        }
    }
    // In offset order; the members of one place (hard links to one file) are read once.
    let mut total = 0u64;
    for jobs in &mut groups {
        jobs.sort_unstable_by_key(|j| (j.at, j.size));
        for (k, job) in jobs.iter().enumerate() {
            if k == 0 || !jobs[k - 1].same_bytes(job) {
                total = total.saturating_add(job.size);
            }
        }
    }
    let read = AtomicU64::new(0);
    let next = AtomicUsize::new(0);
    let found: Mutex<Vec<(usize, usize, u32)>> = Mutex::new(Vec::new());
    let failed: Mutex<Option<ArchiveError>> = Mutex::new(None);
    // Read by the threads; the CRC-32s are written into `scanned` once they are done.
    let images: &[ScannedImage] = scanned;
    std::thread::scope(|scope| {
        for _ in 0..THREADS.min(groups.len()).max(1) {
            scope.spawn(|| {
                let mut buf = vec![0u8; BLOCK];
                loop {
                    let g = next.fetch_add(1, Ordering::Relaxed);
                    let Some(jobs) = groups.get(g) else { break };
                    if jobs.is_empty() || failed.lock().expect("not poisoned").is_some() {
                        continue;
                    }
                    let location = &images[g].location;
                    match crcs_of(location, stores, jobs, &mut buf, &|n| {
                        on_bytes(read.fetch_add(n, Ordering::Relaxed) + n, total)
                    }) {
                        Ok(crcs) => found.lock().expect("not poisoned").extend(crcs),
                        Err(e) => {
                            failed.lock().expect("not poisoned").get_or_insert(e);
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = failed.into_inner().expect("not poisoned") {
        return Err(e);
    }
    for (i, j, crc) in found.into_inner().expect("not poisoned") {
        let image = &mut scanned[i];
        let record = crc_record(image.members[j].data_offset, crc);
        let link = image.push_string(&record);
        let m = &mut image.members[j];
        m.link = link;
        m.encoding = Encoding::StoredCrc;
    }
    Ok(())
}

/// The CRC-32 of each of `jobs` (members of the image at `location`, in offset order), each
/// place read once: a hard link's member gets the CRC-32 of the one before it at that place
/// (a tar of 20 000 links to one file was read 20 000 times: 585 s, against 0.08 s without).
fn crcs_of(
    location: &ImageLocation,
    stores: &Stores,
    jobs: &[Job],
    buf: &mut [u8],
    progress: &dyn Fn(u64),
) -> Result<Vec<(usize, usize, u32)>, ArchiveError> {
    let (data, _) = location
        .open_for_scan(stores)
        .map_err(|e| ArchiveError::io(location.name(), e))?;
    // The bytes in `buf`: `held` of them, from offset `from` of the image.
    let (mut from, mut held) = (0u64, 0usize);
    let mut crcs: Vec<(usize, usize, u32)> = Vec::with_capacity(jobs.len());
    for (k, job) in jobs.iter().enumerate() {
        if let (Some(before), Some(last)) = (k.checked_sub(1).map(|b| &jobs[b]), crcs.last())
            && before.same_bytes(job)
        {
            crcs.push((job.image, job.member, last.2));
            continue;
        }
        let mut hasher = crc32fast::Hasher::new();
        let end = job.at.saturating_add(job.size);
        let mut pos = job.at;
        while pos < end {
            if !(from <= pos && pos < from + held as u64) {
                from = pos;
                held = data
                    .read_up_to(buf, pos)
                    .map_err(|e| ArchiveError::io(location.name(), e))?;
                if held == 0 {
                    return Err(ArchiveError::malformed(
                        location.name(),
                        pos,
                        format!(
                            "the image ends inside a member ({} bytes at offset {}); it changed \
                             since it was scanned: index it again",
                            job.size, job.at
                        ),
                    ));
                }
                progress(held as u64);
            }
            let start = (pos - from) as usize;
            let stop = (end - from).min(held as u64) as usize;
            hasher.update(&buf[start..stop]);
            pos = from + stop as u64;
        }
        crcs.push((job.image, job.member, hasher.finalize()));
    }
    Ok(crcs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tar of one 3 MiB file and 50 hard links to it: one read of its bytes, one CRC-32 for
    /// all 51 members.
    #[test]
    fn hard_links_to_one_file_are_read_once() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir(&src).unwrap();
        let data: Vec<u8> = (0..3u32 << 20).map(|i| (i * 31 % 251) as u8).collect();
        std::fs::write(src.join("f"), &data).unwrap();
        for k in 0..50 {
            std::fs::hard_link(src.join("f"), src.join(format!("l{k:02}"))).unwrap();
        }
        let tar = dir.path().join("links.tar");
        let made = std::process::Command::new("tar")
            .arg("-C")
            .arg(&src)
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .status()
            .unwrap();
        assert!(made.success());
        let stores = Stores::default();
        let location = ImageLocation::from_arg(&tar).unwrap();
        let mut scanned = vec![crate::dataset::scan_image(&location, &stores).unwrap()];
        let files = scanned[0]
            .members
            .iter()
            .filter(|m| m.kind == MemberKind::File)
            .count();
        assert_eq!(files, 51);
        let (read, said_total) = (AtomicU64::new(0), AtomicU64::new(0));
        record(&mut scanned, &stores, &|done, total| {
            read.store(done, Ordering::Relaxed);
            said_total.store(total, Ordering::Relaxed);
        })
        .unwrap();
        let bytes = read.load(Ordering::Relaxed);
        assert!(
            bytes <= data.len() as u64 + BLOCK as u64,
            "{bytes} bytes read"
        );
        assert_eq!(said_total.load(Ordering::Relaxed), data.len() as u64);
        let crc = crc_record(0, crc32fast::hash(&data));
        let checked = scanned[0]
            .members
            .iter()
            .filter(|m| m.encoding == Encoding::StoredCrc)
            .count();
        assert_eq!(checked, 51);
        // Every member's record names the same CRC-32 (its place aside).
        let image = &scanned[0];
        for m in image.members.iter().filter(|m| m.kind == MemberKind::File) {
            let record = &image.strings[m.link.start..m.link.start + m.link.len];
            assert_eq!(record[8..], crc[8..]);
        }
    }
}
