//! What every scan target does with its input: put it in a memory file, scan it with one
//! format's scanner, and, when the scan succeeds, check what packfs promises of any catalog it
//! builds: the structure passes `check_structure`, and every file reads through the tiers
//! without a panic (errors are fine: the input is garbage).

#![allow(dead_code)] // each target uses part of it

use std::fs::File;
use std::io::Write;
use std::os::fd::FromRawFd;
use std::path::PathBuf;
use std::sync::Arc;

use packfs::archive::{ArchiveError, ScannedImage};
use packfs::catalog::{DuplicatePolicy, Kind, ROOT, index};
use packfs::source::Fingerprint;
use packfs::source::read_at::ReadAt;
use packfs::tiers::{self, OpenedImage, OpenedImages, TierOptions};

/// Bytes read of each file: its head and its tail (a tiny input can describe a huge sparse file).
const READ_HEAD: u64 = 256 * 1024;
const READ_TAIL: u64 = 64 * 1024;

/// A memory-backed regular file holding `bytes`.
pub fn memory_file(bytes: &[u8]) -> File {
    // SAFETY: plain syscall with a valid C string; the descriptor is owned by the File below.
    let fd = unsafe { libc::memfd_create(c"packfs-fuzz".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create failed");
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let mut file = unsafe { File::from_raw_fd(fd) };
    file.write_all(bytes).expect("write to a memory file");
    file
}

/// Scans `bytes` with `scan`; a catalog built from what it found must be consistent and every
/// file readable without a panic.
pub fn run(bytes: &[u8], scan: fn(&dyn ReadAt, &mut ScannedImage) -> Result<(), ArchiveError>) {
    let file = memory_file(bytes);
    let fingerprint = Fingerprint::of(&file).expect("fingerprint of a memory file");
    let path = PathBuf::from("fuzz-image");
    let mut image = ScannedImage::new(
        packfs::source::ImageLocation::File(path.clone()),
        fingerprint,
    );
    if scan(&file, &mut image).is_err() {
        return;
    }
    // Every header read is served, merged or warned about: never a silent loss.
    if let Some(what) = image.unaccounted() {
        panic!("{what}");
    }
    let mut scanned = vec![image];
    let Ok(catalog) =
        packfs::dataset::build_settling_clashes(&mut scanned, DuplicatePolicy::LastWins)
    else {
        return;
    };
    // Settling clashes leaves members out only with a warning, too.
    if let Some(what) = scanned[0].unaccounted() {
        panic!("{what}");
    }
    let problems = catalog.check_structure();
    assert!(
        problems.is_empty(),
        "a scanned catalog is inconsistent: {problems:?}"
    );
    let data: Arc<dyn ReadAt> = Arc::new(file);
    let source = OpenedImages::new(vec![OpenedImage {
        path,
        data,
        size: fingerprint.size,
    }]);
    let files = tiers::assemble(Arc::new(source), &catalog, &TierOptions::direct(16 << 20))
        .expect("tiers without staging");
    let mut buf = Vec::new();
    for id in catalog.walk(ROOT) {
        let Ok(e) = catalog.entry(id) else { continue };
        if e.kind() != Kind::File {
            continue;
        }
        let member = tiers::Member::of(&catalog, id).expect("a scanned file's placement");
        let req = tiers::ReadRequest::waiting();
        let tail = e.size.saturating_sub(READ_TAIL).max(READ_HEAD.min(e.size));
        for (from, to) in [(0, READ_HEAD.min(e.size)), (tail, e.size)] {
            let mut at = from;
            while at < to {
                let len = (to - at).min(128 * 1024) as usize;
                if files.read(&req, member, at, len, &mut buf).is_err() {
                    break;
                }
                at += len as u64;
            }
        }
    }
}

/// Images are served from memory, at most this big whatever the index claims.
const IMAGE_CAP: u64 = 1 << 20;
/// Entries visited per input, so a huge claimed tree cannot stall the fuzzer.
const VISITS: usize = 2000;

/// The bytes every image of a fuzzed index holds (the same for all: made once).
fn pattern() -> &'static Arc<Vec<u8>> {
    static PATTERN: std::sync::OnceLock<Arc<Vec<u8>>> = std::sync::OnceLock::new();
    PATTERN.get_or_init(|| Arc::new((0..IMAGE_CAP).map(|i| (i * 31 % 251) as u8).collect()))
}

/// Opens `bytes` as an index after fixing its checksums, and does what a mount does with it.
pub fn run_index(bytes: &[u8]) {
    let mut bytes = bytes.to_vec();
    index::reseal(&mut bytes);
    let Ok(catalog) = index::open_bytes(&bytes) else {
        return;
    };
    let _ = catalog.check_structure();
    let images = catalog
        .images()
        .iter()
        .map(|info| {
            let data: Arc<dyn ReadAt> = pattern().clone();
            OpenedImage {
                path: info.path().to_path_buf(),
                data,
                size: info.fingerprint.size,
            }
        })
        .collect();
    let Ok(files) = tiers::assemble(
        Arc::new(OpenedImages::new(images)),
        &catalog,
        &TierOptions::direct(16 << 20),
    ) else {
        return;
    };
    let mut buf = Vec::new();
    for id in catalog.walk(ROOT).take(VISITS) {
        let Ok(e) = catalog.entry(id) else { continue };
        let _ = catalog.path_of(id);
        if let Ok(name) = catalog.name(e) {
            let _ = catalog.lookup(e.parent, name);
        }
        match e.kind() {
            Kind::Symlink => {
                let _ = catalog.symlink_target(e);
            }
            Kind::Dir => {}
            Kind::File => {
                let Ok(placement) = catalog.placement(e) else {
                    continue;
                };
                let _ = placement.to_string();
                let member = tiers::Member {
                    entry: id,
                    image: e.image,
                    placement,
                    size: e.size,
                };
                let req = tiers::ReadRequest::waiting();
                for at in [0, e.size / 2, e.size.saturating_sub(5000)] {
                    let len = (e.size - at.min(e.size)).min(64 * 1024) as usize;
                    let _ = files.read(&req, member, at, len, &mut buf);
                }
            }
        }
    }
}
