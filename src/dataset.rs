//! From image arguments to a catalog: expand the patterns, scan the images in parallel, merge.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context;
use tracing::{info, warn};

use crate::archive::{self, ArchiveError, ScannedImage};
use crate::catalog::{self, Catalog, DuplicatePolicy};
use crate::expand::expand_images;

/// Images are scanned this many at a time: scanning waits on I/O latency more than on the CPU.
const SCAN_THREADS: usize = 8;

/// Expands `patterns` into image paths (absolute, so a daemon may change directory).
pub fn image_paths(patterns: &[String]) -> anyhow::Result<Vec<PathBuf>> {
    let paths = expand_images(patterns)?;
    if paths.is_empty() {
        anyhow::bail!("no images given");
    }
    paths
        .into_iter()
        .map(|p| std::path::absolute(&p).with_context(|| format!("bad path {}", p.display())))
        .collect()
}

/// Scans all images (several at once) and merges them into one catalog.
pub fn load(patterns: &[String], policy: DuplicatePolicy) -> anyhow::Result<Catalog> {
    let paths = image_paths(patterns)?;
    let started = std::time::Instant::now();
    let scanned = scan_all(&paths)?;
    let members: usize = scanned.iter().map(|s| s.members.len()).sum();
    let skipped: u64 = scanned.iter().map(|s| s.skipped).sum();
    if skipped > 0 {
        warn!("{skipped} member(s) skipped; see the warnings above");
    }
    let catalog = catalog::build(&scanned, policy)?;
    info!(
        images = paths.len(),
        members,
        entries = catalog.len(),
        files = catalog.file_count(),
        bytes = catalog.file_bytes(),
        "catalog built in {:.3} s",
        started.elapsed().as_secs_f64()
    );
    Ok(catalog)
}

/// Scans images in parallel; results keep the order of `paths`, and the first failing image (in
/// that order) is the error reported.
pub fn scan_all(paths: &[PathBuf]) -> Result<Vec<ScannedImage>, ArchiveError> {
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<Result<ScannedImage, ArchiveError>>>> =
        paths.iter().map(|_| Mutex::new(None)).collect();
    let threads = SCAN_THREADS.min(paths.len()).max(1);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(path) = paths.get(i) else { break };
                    let result = archive::scan(path);
                    *results[i].lock().expect("not poisoned") = Some(result);
                }
            });
        }
    });
    results
        .into_iter()
        .map(|slot| {
            slot.into_inner()
                .expect("not poisoned")
                .expect("every image scanned")
        })
        .collect()
}
