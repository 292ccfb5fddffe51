//! From image arguments to a catalog: expand the patterns, scan the images in parallel, merge.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
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

/// The catalog of `sources`: one index file, mapped; or images, scanned and merged (an index
/// among images fails the scan with a message saying so).
pub fn open(sources: &[String], policy: DuplicatePolicy) -> anyhow::Result<Catalog> {
    let paths = image_paths(sources)?;
    match paths.as_slice() {
        [index] if catalog::index::is_index(index) => {
            let started = std::time::Instant::now();
            let catalog = catalog::index::open(index)?;
            info!(
                entries = catalog.len(),
                files = catalog.file_count(),
                images = catalog.images().len(),
                "index {} opened in {:.3} s",
                index.display(),
                started.elapsed().as_secs_f64()
            );
            Ok(catalog)
        }
        _ => load_paths(&paths, policy),
    }
}

/// Scans all images (several at once) and merges them into one catalog.
pub fn load(patterns: &[String], policy: DuplicatePolicy) -> anyhow::Result<Catalog> {
    load_paths(&image_paths(patterns)?, policy)
}

fn load_paths(paths: &[PathBuf], policy: DuplicatePolicy) -> anyhow::Result<Catalog> {
    let started = std::time::Instant::now();
    let bar = progress_bar(paths);
    let scanned = scan_all(paths, &bar)?;
    bar.finish_and_clear();
    let scan_secs = started.elapsed().as_secs_f64();
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
        "images scanned in {scan_secs:.3} s, catalog built in {:.3} s",
        started.elapsed().as_secs_f64() - scan_secs
    );
    Ok(catalog)
}

/// A bar over the images, drawn only when stderr is a terminal (it costs no I/O of its own).
fn progress_bar(paths: &[PathBuf]) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(
        Some(paths.len() as u64),
        ProgressDrawTarget::stderr_with_hz(4),
    );
    if let Ok(style) =
        ProgressStyle::with_template("scanning {bar:30} {pos}/{len} images, {msg}, eta {eta}")
    {
        bar.set_style(style);
    }
    bar
}

/// Scans images in parallel; results keep the order of `paths`, and the first failing image (in
/// that order) is the error reported.
pub fn scan_all(paths: &[PathBuf], bar: &ProgressBar) -> Result<Vec<ScannedImage>, ArchiveError> {
    let members = std::sync::atomic::AtomicU64::new(0);
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
                    if let Ok(image) = &result {
                        let n = members.fetch_add(image.members.len() as u64, Ordering::Relaxed);
                        bar.set_message(format!("{} members", n + image.members.len() as u64));
                    }
                    bar.inc(1);
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

/// Paths for a message or a command line: all of them when few, else the first and the last.
pub fn show_paths<'a>(paths: impl ExactSizeIterator<Item = &'a std::path::Path>) -> String {
    let n = paths.len();
    let shown: Vec<String> = paths.map(|p| p.display().to_string()).collect();
    if n <= 4 {
        shown.join(" ")
    } else {
        format!("{} ... {} ({n} images)", shown[0], shown[n - 1])
    }
}
