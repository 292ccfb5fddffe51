//! From image arguments to a catalog: expand the patterns, then map one index or scan the images
//! in parallel and merge them.

pub mod checksums;
pub mod classes;
pub mod expand;
mod meter;
pub mod nested;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use tracing::{info, warn};

use crate::archive::{self, ArchiveError, ScannedImage};
use crate::catalog::index::{self, IndexError};
use crate::catalog::{self, BuildError, Catalog, DuplicatePolicy, ImageInfo};
use crate::source::{ArgError, ImageLocation, Stores};
use crate::tiers::{OpenedImages, SourceError};
use expand::{ExpandError, expand_images};

/// Images are scanned this many at a time: scanning waits on I/O latency more than on the CPU.
const SCAN_THREADS: usize = 8;

/// How often a scan's progress inside its images is told.
const SCAN_TICK: std::time::Duration = std::time::Duration::from_millis(250);

#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error("no images given")]
    NoImages,
    #[error(transparent)]
    BadLocation(#[from] ArgError),
    #[error(transparent)]
    Expand(#[from] ExpandError),
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("cannot arrange the tree by class: {0}")]
    Layout(String),
    #[error(
        "{} is an index: a layout is applied when the images are scanned, so give --layout to \
         `packfs index` (the index then holds it), or mount the images themselves",
        index.display()
    )]
    LayoutOfIndex { index: PathBuf },
    #[error(
        "{} is an index: archives inside images are opened (or not) when the images are \
         scanned, so give --inner-archives, --inner-depth and --strip-inner-extension to \
         `packfs index` (the index then holds the tree they make), or mount the images themselves",
        index.display()
    )]
    NestingOfIndex { index: PathBuf },
    #[error(
        "{} is an index already: `packfs index` scans images into one, so give the images it \
         was made from (`packfs ls --json` on it names them), or mount the index as it is",
        index.display()
    )]
    IndexOfIndex { index: PathBuf },
}

/// How the images' members make one tree.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Merge {
    pub duplicates: DuplicatePolicy,
    /// `None`: as stored; else samples moved under a directory named by their class.
    pub classes: Option<classes::ClassSource>,
    /// Where the images of an index are now, if they moved since it was written.
    pub images_dir: Option<std::path::PathBuf>,
    /// Which archives inside the images are served as directories.
    pub nesting: nested::Nesting,
    /// Record the CRC-32 of every stored member (one read of the data), so that reads are
    /// checked against it (`packfs index --checksums`).
    pub checksums: bool,
    /// Whether --inner-archives, --inner-depth or --strip-inner-extension were given: with an
    /// index they are refused whatever their value (the index holds the tree they made).
    pub nesting_given: bool,
}

impl From<DuplicatePolicy> for Merge {
    fn from(duplicates: DuplicatePolicy) -> Merge {
        Merge {
            duplicates,
            classes: None,
            images_dir: None,
            nesting: nested::Nesting::default(),
            checksums: false,
            nesting_given: false,
        }
    }
}

/// Scanning progress, for a progress bar: images done of the total, members found so far.
#[derive(Clone, Copy, Debug, Default)]
pub struct ScanProgress {
    pub images_done: u64,
    pub images: u64,
    pub members: u64,
    /// With checksums, once the images are scanned: bytes of their members read so far, of
    /// `bytes_to_check`.
    pub bytes_checked: u64,
    pub bytes_to_check: u64,
    /// While scanning: bytes of the images their scans have come through, of `image_bytes`
    /// (the images opened so far).
    pub scanned_bytes: u64,
    pub image_bytes: u64,
}

/// Told about the scan as it goes.
pub type OnScan<'a> = &'a (dyn Fn(ScanProgress) + Sync);

/// For callers that show nothing.
pub fn quiet(_: ScanProgress) {}

/// Expands `patterns` into image locations (files made absolute, so a daemon may change
/// directory): what the user named is parsed here, once.
pub fn image_locations(
    patterns: &[String],
    stores: &Stores,
) -> Result<Vec<ImageLocation>, DatasetError> {
    let paths = expand_images(patterns, stores)?;
    if paths.is_empty() {
        return Err(DatasetError::NoImages);
    }
    paths
        .into_iter()
        .map(|p| ImageLocation::from_arg(&p).map_err(DatasetError::BadLocation))
        .collect()
}

/// Checks that every local image of `sources` opens as a regular file (objects by URL are the
/// daemon's to reach): `packfs mount` runs it before it forks, so a wrong path fails at once, in
/// the launching process, with the path as given.
pub fn check_local_images(sources: &[String], stores: &Stores) -> Result<(), DatasetError> {
    for location in image_locations(sources, stores)? {
        if let ImageLocation::File(file) = location {
            crate::source::read_at::open_regular(&file).map_err(|e| ArchiveError::io(&file, e))?;
        }
    }
    Ok(())
}

/// Opens the image at `location` (a file, or an object by URL) and scans it.
pub fn scan_image(location: &ImageLocation, stores: &Stores) -> Result<ScannedImage, ArchiveError> {
    let (data, fingerprint) = location
        .open_for_scan(stores)
        .map_err(|e| ArchiveError::io(location.name(), e))?;
    archive::scan(location, &*data, fingerprint)
}

/// `scan_image`, and the archives inside the image as `nesting` says, read through the same
/// reader: the image first, each inner archive after the image that holds it (`within`
/// positions in the returned list).
fn scan_nested(
    location: &ImageLocation,
    nesting: &nested::Nesting,
    room: &nested::Room,
    stores: &Stores,
    meter: (&meter::ScanMeter, usize),
) -> Result<Vec<ScannedImage>, ArchiveError> {
    let (data, fingerprint) = location
        .open_for_scan(stores)
        .map_err(|e| ArchiveError::io(location.name(), e))?;
    let data = meter.0.watch(meter.1, fingerprint.size, data);
    let outer = archive::scan(location, &*data, fingerprint)?;
    Ok(nested::expand(outer, data, nesting, room))
}

/// The one index among `images`, if they are exactly one index file.
fn the_index<'a>(images: &'a [ImageLocation], stores: &Stores) -> Option<&'a Path> {
    match images {
        [one] if index::is_index(one.name(), stores) => Some(one.name()),
        _ => None,
    }
}

/// The catalog of `sources`: one index file, mapped; or images, scanned and merged (an index
/// among images fails the scan with a message saying so).
pub fn open(
    sources: &[String],
    merge: &Merge,
    stores: &Stores,
    on_scan: OnScan,
) -> Result<Catalog, DatasetError> {
    let paths = image_locations(sources, stores)?;
    if let Some(path) = the_index(&paths, stores) {
        if merge.classes.is_some() {
            return Err(DatasetError::LayoutOfIndex {
                index: path.to_path_buf(),
            });
        }
        if merge.nesting_given || !merge.nesting.is_default_tree() {
            return Err(DatasetError::NestingOfIndex {
                index: path.to_path_buf(),
            });
        }
        let started = std::time::Instant::now();
        let catalog = index::open_with(path, merge.images_dir.as_deref(), stores)?;
        info!(
            entries = catalog.len(),
            files = catalog.file_count(),
            images = catalog.images().len(),
            "index {} opened in {:.3} s",
            path.display(),
            started.elapsed().as_secs_f64()
        );
        return Ok(catalog);
    }
    load_paths(&paths, merge, stores, on_scan)
}

/// Scans all images (several at once) and merges them into one catalog.
pub fn load(
    patterns: &[String],
    merge: &Merge,
    stores: &Stores,
    on_scan: OnScan,
) -> Result<Catalog, DatasetError> {
    let paths = image_locations(patterns, stores)?;
    if let Some(index) = the_index(&paths, stores) {
        return Err(DatasetError::IndexOfIndex {
            index: index.to_path_buf(),
        });
    }
    load_paths(&paths, merge, stores, on_scan)
}

/// The images of `patterns` opened for reading without a catalog (for staging): as one index
/// recorded them (fingerprints checked; looked for in `images_dir` first), or as found.
pub fn open_images(
    patterns: &[String],
    images_dir: Option<&std::path::Path>,
    stores: &Stores,
) -> Result<(OpenedImages, Vec<ImageInfo>), DatasetError> {
    let paths = image_locations(patterns, stores)?;
    if let Some(path) = the_index(&paths, stores) {
        let infos = index::open_with(path, images_dir, stores)?
            .images()
            .to_vec();
        return Ok((OpenedImages::open(&infos, stores)?, infos));
    }
    Ok(OpenedImages::open_as_is(&paths, stores)?)
}

fn load_paths(
    paths: &[ImageLocation],
    merge: &Merge,
    stores: &Stores,
    on_scan: OnScan,
) -> Result<Catalog, DatasetError> {
    let started = std::time::Instant::now();
    let mut scanned = scan_all(paths, &merge.nesting, stores, on_scan)?;
    if merge.checksums {
        let members = scanned.iter().map(|s| s.members.len() as u64).sum();
        let images = paths.len() as u64;
        checksums::record(&mut scanned, stores, &|done, total| {
            on_scan(ScanProgress {
                images_done: images,
                images,
                members,
                bytes_checked: done.min(total),
                bytes_to_check: total,
                ..ScanProgress::default()
            })
        })?;
    }
    let scan_secs = started.elapsed().as_secs_f64();
    let mut catalog = build_settling_clashes(&mut scanned, merge.duplicates)?;
    if let Some(source) = &merge.classes {
        classes::arrange(&catalog, &mut scanned, source, stores)?;
        catalog = build_settling_clashes(&mut scanned, merge.duplicates)?;
    }
    let members: usize = scanned.iter().map(|s| s.members.len()).sum();
    let skipped: u64 = scanned.iter().map(|s| s.skipped).sum();
    if skipped > 0 {
        warn!("{skipped} member(s) skipped; see the warnings above");
    }
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

/// Builds the catalog; an image in which a name is both a file and a directory is settled as
/// extraction settles it (`ScannedImage::drop_clashes`) and the build runs again.
pub fn build_settling_clashes(
    scanned: &mut [ScannedImage],
    policy: DuplicatePolicy,
) -> Result<Catalog, BuildError> {
    let mut settled = vec![false; scanned.len()];
    loop {
        match catalog::build(scanned, policy) {
            Err(BuildError::ClashInImage { image, .. }) if !settled[image] => {
                scanned[image].drop_clashes();
                settled[image] = true;
            }
            other => return other,
        }
    }
}

/// An image's scan: the image and the archives inside it, or why it failed.
type ScannedGroup = Result<Vec<ScannedImage>, ArchiveError>;

/// Scans images in parallel, and the archives inside them as `nesting` says; results keep the
/// order of `paths` (each image followed by the archives inside it), and the first failing image
/// (in that order) is the error reported. `on_scan` hears of each image in turn, counts rising.
pub fn scan_all(
    paths: &[ImageLocation],
    nesting: &nested::Nesting,
    stores: &Stores,
    on_scan: OnScan,
) -> Result<Vec<ScannedImage>, ArchiveError> {
    let room = nested::Room::for_nesting(nesting);
    // Counted and told under one lock: counted apart, a later count could be told first, and
    // the last thing a log said would be "1 of 2 images" after a scan of both.
    let told = Mutex::new(ScanProgress {
        images: paths.len() as u64,
        ..ScanProgress::default()
    });
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<ScannedGroup>>> =
        paths.iter().map(|_| Mutex::new(None)).collect();
    let threads = SCAN_THREADS.min(paths.len()).max(1);
    let meter = meter::ScanMeter::new(paths.len());
    let tell = |told: &mut ScanProgress| {
        (told.scanned_bytes, told.image_bytes) = meter.bytes();
        on_scan(*told);
    };
    let finished = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(path) = paths.get(i) else { break };
                    let result = scan_nested(path, nesting, &room, stores, (&meter, i));
                    meter.done(i);
                    let found = result.as_ref().map_or(0, |group| {
                        group.iter().map(|image| image.members.len() as u64).sum()
                    });
                    {
                        let mut told = told.lock().unwrap_or_else(|p| p.into_inner());
                        told.images_done += 1;
                        told.members += found;
                        tell(&mut told);
                    }
                    *results[i].lock().expect("not poisoned") = Some(result);
                }
                finished.fetch_add(1, Ordering::Relaxed);
            });
        }
        // Between images, the bytes inside one: told every quarter second.
        scope.spawn(|| {
            let mut since = std::time::Instant::now();
            while finished.load(Ordering::Relaxed) < threads {
                std::thread::sleep(std::time::Duration::from_millis(50));
                if since.elapsed() >= SCAN_TICK {
                    tell(&mut told.lock().unwrap_or_else(|p| p.into_inner()));
                    since = std::time::Instant::now();
                }
            }
        });
    });
    let mut groups = Vec::with_capacity(paths.len());
    for slot in results {
        groups.push(
            slot.into_inner()
                .expect("not poisoned")
                .expect("every image scanned")?,
        );
    }
    // One image (with the archives inside it, ImageNet as downloaded): its list is the list.
    // Else one list of the exact size: grown by doubling while the groups were still held, a
    // tar of 100 000 inner tars held its images three times over at the peak.
    if groups.len() == 1 {
        return Ok(groups.pop().expect("one group"));
    }
    warn_of_merged_inner_archives(&groups);
    let mut all = Vec::with_capacity(groups.iter().map(Vec::len).sum());
    for group in groups {
        // Positions in the group become positions in the whole list.
        let start = all.len();
        for mut image in group {
            image.within = image.within.map(|w| w + start);
            all.push(image);
        }
    }
    Ok(all)
}

/// Archives inside two images served as one directory (`n01440764.tar` in each, or with
/// --strip-inner-extension) merge there, as the images' own directories do: said once, with the
/// first such pair, so a class spread over two images is no surprise.
fn warn_of_merged_inner_archives(groups: &[Vec<ScannedImage>]) {
    let mut first_of: std::collections::HashMap<&[u8], &Path> = std::collections::HashMap::new();
    let mut merged = 0u64;
    let mut example = None;
    for group in groups {
        for inner in group.iter().filter(|image| image.within == Some(0)) {
            let Some(dir) = nested::served_dir(inner) else {
                continue;
            };
            let outer = group[0].path.as_path();
            match first_of.entry(dir) {
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(outer);
                }
                std::collections::hash_map::Entry::Occupied(o) if *o.get() != outer => {
                    merged += 1;
                    example.get_or_insert((dir, *o.get(), outer));
                }
                _ => {}
            }
        }
    }
    if let Some((dir, one, other)) = example {
        warn!(
            "{merged} archive(s) inside images are served as a directory that an archive inside \
             another image is served as too, and their members merge there (a name in both is \
             a duplicate, as --duplicates says): e.g. {:?} from {} and from {}",
            String::from_utf8_lossy(dir),
            one.display(),
            other.display()
        );
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A log shows the last line it was told: told out of order, it said "1 of 2 images" after a
    /// scan of both. The pause in the callback widens the gap a count told apart could slip into.
    #[test]
    fn scan_progress_is_told_in_order() {
        let paths: Vec<ImageLocation> = (0..64)
            .map(|i| ImageLocation::File(format!("/nonexistent/packfs-{i}.tar").into()))
            .collect();
        let heard = Mutex::new(Vec::new());
        let on_scan = |p: ScanProgress| {
            std::thread::sleep(std::time::Duration::from_micros(200));
            heard.lock().unwrap().push(p.images_done);
        };
        let stores = Stores::default();
        assert!(scan_all(&paths, &nested::Nesting::default(), &stores, &on_scan).is_err());
        let heard = heard.into_inner().unwrap();
        assert_eq!(heard, (1..=64).collect::<Vec<u64>>());
    }
}
