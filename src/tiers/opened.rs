//! The images opened (`OpenedImages`), once, and read with positioned reads through `ReadAt`.
//!
//! Files are read with `pread` rather than mmap: the images live on parallel filesystems, where
//! page faults turn into synchronous 4 KiB round trips and a truncated file raises SIGBUS instead
//! of an error (the one mapping, a member's CRC check in the page cache, is populated first
//! and guarded: `source::mapped`). Anything else that implements `ReadAt` (a fault-injecting wrapper in tests, later
//! an object store) can stand in for a file.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub use super::source_stats::SourceStats;
use crate::catalog::ImageInfo;
use crate::source::fingerprint::stamp_differences;
use crate::source::read_at::{ReadAt, Stamp, Wait, on_local_disk};
use crate::source::{ImageLocation, Stores};

/// One image: where it is, how to read it, and its size as fingerprinted.
pub struct OpenedImage {
    pub path: PathBuf,
    pub data: Arc<dyn ReadAt>,
    pub size: u64,
}

pub struct OpenedImages {
    images: Vec<OpenedImage>,
    /// For an archive stored as a member of another image: the outermost image around it and
    /// where it starts there (`catalog::outermost`, once at open). Reads of it are reads of that
    /// image (`resolve`), so they are cached, staged and watched as its.
    within: Vec<Option<(u32, u64)>>,
    /// Images that are plain files on a local disk, to splice reads from (`on_local_disk`).
    spliceable: Vec<bool>,
    /// Each image's stamp when opened, and whether it has been seen changed since.
    stamps: Vec<Option<Stamp>>,
    changed: Vec<AtomicBool>,
    /// Images read from since their last check (`check_next_read`): only a read of the source
    /// can serve bytes a rewrite made wrong, so only those are worth a metadata request.
    read_since_check: Vec<AtomicBool>,
    reads: AtomicU64,
    bytes: AtomicU64,
    stage_reads: AtomicU64,
    stage_bytes: AtomicU64,
    checks: AtomicU64,
    checked_bytes: AtomicU64,
}

impl std::fmt::Debug for OpenedImages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenedImages")
            .field("images", &self.images.len())
            .finish()
    }
}

/// Why the images cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("cannot open image {}: {error}", path.display())]
    Open { path: PathBuf, error: io::Error },
    #[error(
        "image {} changed since it was indexed: {what}{}",
        path.display(),
        same_bytes.map_or("", SameBytes::says)
    )]
    Changed {
        path: PathBuf,
        what: String,
        /// Set when size and both ends are unchanged: what probably happened.
        same_bytes: Option<SameBytes>,
    },
}

/// An image whose size and hashed ends are as indexed, while its time (or ETag) is not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SameBytes {
    /// An object uploaded again with the same bytes.
    Reuploaded,
    /// A file copied without its times (cp without -p, rsync without -t); the time it had when
    /// indexed, in seconds and nanoseconds.
    Copied { mtime: i64, mtime_nsec: u32 },
}

impl SameBytes {
    fn says(self) -> &'static str {
        match self {
            SameBytes::Reuploaded => {
                "; size and both ends are unchanged: the object was probably uploaded again with \
                 the same bytes, and the index must be rebuilt to serve it"
            }
            SameBytes::Copied { .. } => {
                "; size and both ends are unchanged: the image was probably copied without its \
                 times"
            }
        }
    }
}

/// Images are opened and fingerprinted this many at a time (latency-bound on a parallel FS).
const OPEN_THREADS: usize = 8;

impl OpenedImages {
    /// Opens every image once, read-only, and checks that each still has the fingerprint the
    /// catalog recorded: the catalog's offsets are only valid for those bytes.
    pub fn open(images: &[ImageInfo], stores: &Stores) -> Result<OpenedImages, SourceError> {
        OpenedImages::open_as(images, stores, false)
    }

    /// Opens every image as `open` does, but an image that cannot be opened, or changed since
    /// it was indexed, does not fail the whole: its reads fail, saying why, and the others
    /// serve. For a process that opens a dataset another one already serves (a forked or
    /// spawned DataLoader worker), so that an image changed under the job costs that image's
    /// files in the worker, as it does in the first process (which finds it rewritten).
    /// A catalog that lists an inner archive before its outer image still fails the whole (the
    /// index refuses such a list already).
    pub fn open_each(images: &[ImageInfo], stores: &Stores) -> Result<OpenedImages, SourceError> {
        OpenedImages::open_as(images, stores, true)
    }

    fn open_as(
        images: &[ImageInfo],
        stores: &Stores,
        each_alone: bool,
    ) -> Result<OpenedImages, SourceError> {
        let outer = |i: &ImageInfo| inner_window(i).is_none();
        // Each image opened (none for an inner archive), and whether it is unusable.
        let opened = open_parallel(images, |i| {
            match outer(i).then(|| open_checked(i, stores)).transpose() {
                Err(why) if each_alone => {
                    let data = Arc::new(Unusable(why.to_string()));
                    let size = i.fingerprint.size;
                    Ok((Some(image(i.path().to_path_buf(), data, size)), true))
                }
                opened => opened.map(|o| (o, false)),
            }
        })?;
        let (opened, unusable): (Vec<_>, Vec<bool>) = opened.into_iter().unzip();
        // An inner archive is a window of its outer image, opened above (it comes first).
        let mut all: Vec<OpenedImage> = Vec::with_capacity(images.len());
        let mut within = Vec::with_capacity(images.len());
        for (info, opened) in images.iter().zip(opened) {
            match (opened, inner_window(info)) {
                (Some(image), _) => {
                    all.push(image);
                    within.push(None);
                }
                (None, Some((outer, base, len))) => {
                    let outer_data =
                        all.get(outer as usize)
                            .map(|o| o.data.clone())
                            .ok_or_else(|| SourceError::Open {
                                path: info.path().to_path_buf(),
                                error: io::Error::other("its outer image does not come before it"),
                            })?;
                    all.push(image(
                        info.path().to_path_buf(),
                        Arc::new(crate::source::read_at::Window::new(outer_data, base, len)),
                        len,
                    ));
                    let (outermost, at) = crate::catalog::outermost(images, outer, base);
                    within.push(Some((outermost, at)));
                }
                (None, None) => unreachable!("only inner archives are left unopened"),
            }
        }
        // Each fingerprint was just checked against a fresh stat: no second stat per image. An
        // inner archive is never checked itself: its outer image is; nor is an unusable one,
        // whose reads fail already.
        let stamps = images
            .iter()
            .zip(&unusable)
            .map(|(i, unusable)| (outer(i) && !unusable).then(|| i.fingerprint.stamp()))
            .collect();
        let mut opened = OpenedImages::with_stamps(all, stamps);
        opened.within = within;
        Ok(opened)
    }

    /// Where `offset` of `image` lies in the image that holds its bytes: itself, or for an inner
    /// archive the outermost image around it.
    pub fn resolve(&self, image: u32, offset: u64) -> (u32, u64) {
        match self.within.get(image as usize) {
            Some(Some((outermost, base))) => (*outermost, offset.saturating_add(*base)),
            _ => (image, offset),
        }
    }

    /// Opens images that no catalog describes, and returns their fingerprints as found.
    pub fn open_as_is(
        locations: &[ImageLocation],
        stores: &Stores,
    ) -> Result<(OpenedImages, Vec<ImageInfo>), SourceError> {
        let opened = open_parallel(locations, |location| {
            let path = location.name().to_path_buf();
            let open_error = |error| SourceError::Open {
                path: path.clone(),
                error,
            };
            let (data, fingerprint) = location.open(stores).map_err(open_error)?;
            let info = ImageInfo {
                location: location.clone(),
                fingerprint,
                stream: None,
                within: None,
            };
            Ok((image(path.clone(), data, fingerprint.size), info))
        })?;
        let (images, infos): (Vec<_>, Vec<ImageInfo>) = opened.into_iter().unzip();
        let stamps = infos.iter().map(|i| Some(i.fingerprint.stamp())).collect();
        Ok((OpenedImages::with_stamps(images, stamps), infos))
    }

    /// A source over images held by any `ReadAt` (tests, other stores), stamped as they are now.
    pub fn new(images: Vec<OpenedImage>) -> OpenedImages {
        let stamps = images
            .iter()
            .map(|i| i.data.current().and_then(Result::ok))
            .collect();
        OpenedImages::with_stamps(images, stamps)
    }

    /// A source whose images had these stamps when opened (checked for changes from then on).
    fn with_stamps(images: Vec<OpenedImage>, stamps: Vec<Option<Stamp>>) -> OpenedImages {
        let spliceable = images
            .iter()
            .map(|i| i.data.file_descriptor().is_some_and(on_local_disk))
            .collect();
        let changed = images.iter().map(|_| AtomicBool::new(false)).collect();
        let read_since_check = images.iter().map(|_| AtomicBool::new(false)).collect();
        OpenedImages {
            within: vec![None; images.len()],
            spliceable,
            images,
            stamps,
            changed,
            read_since_check,
            reads: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            stage_reads: AtomicU64::new(0),
            stage_bytes: AtomicU64::new(0),
            checks: AtomicU64::new(0),
            checked_bytes: AtomicU64::new(0),
        }
    }

    /// The same images, each read through what `wrap` makes of it (e.g. a fault injector).
    pub fn wrapped(self, wrap: impl Fn(u32, Arc<dyn ReadAt>) -> Arc<dyn ReadAt>) -> OpenedImages {
        let images = self
            .images
            .into_iter()
            .enumerate()
            .map(|(i, img)| OpenedImage {
                data: wrap(i as u32, img.data),
                ..img
            })
            .collect();
        let mut wrapped = OpenedImages::with_stamps(images, self.stamps);
        wrapped.within = self.within;
        wrapped
    }

    /// The same images, the outer ones `serve` gives a reader for (another node's) read through
    /// it: never spliced from their files, since the reader has no file behind it.
    pub fn served_by(
        self,
        serve: impl Fn(u32, &Arc<dyn ReadAt>) -> Option<Arc<dyn ReadAt>>,
    ) -> OpenedImages {
        let within = self.within.clone();
        self.wrapped(|i, data| {
            let outer = within[i as usize].is_none();
            outer.then(|| serve(i, &data)).flatten().unwrap_or(data)
        })
    }

    pub fn image_count(&self) -> usize {
        self.images.len()
    }

    /// Size of an image as fingerprinted when opened (0 for an unknown image).
    pub fn image_size(&self, image: u32) -> u64 {
        self.images.get(image as usize).map_or(0, |i| i.size)
    }

    /// The image's path, for messages (`#N` for a number no image has).
    pub fn image_path(&self, image: u32) -> PathBuf {
        self.images
            .get(image as usize)
            .map_or_else(|| PathBuf::from(format!("#{image}")), |i| i.path.clone())
    }

    /// Fills `buf` from `offset` of `image`. A short file (an image truncated after it was scanned)
    /// is an `UnexpectedEof` error rather than a short read: the catalog promised these bytes.
    pub fn read_exact_at(
        &self,
        image: u32,
        offset: u64,
        buf: &mut [u8],
        wait: Wait,
    ) -> io::Result<()> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.read_checked(image, offset, buf, wait)?;
        self.bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// The same read for the stager, counted apart from the mount's reads.
    pub fn read_for_stage(&self, image: u32, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.stage_reads.fetch_add(1, Ordering::Relaxed);
        self.read_checked(image, offset, buf, Wait::May)?;
        self.stage_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// A read of an image not known to have changed; a failed read checks at once whether the
    /// image changed (a rewrite that shortened it fails reads before the next periodic check).
    /// A read that would have waited failed for no fault of the image: no check (it was a stat
    /// to the parallel file system for every read a ring handed to its pool).
    fn read_checked(&self, image: u32, offset: u64, buf: &mut [u8], wait: Wait) -> io::Result<()> {
        if self.has_changed(image) {
            return Err(self.changed_error(image));
        }
        let read = self.data(image)?.read_exact_with(buf, offset, wait);
        let waited = read
            .as_ref()
            .is_err_and(|e| e.kind() == io::ErrorKind::WouldBlock);
        let failed = read.is_err() && !waited;
        match self.read_since_check.get(image as usize) {
            // Loaded first: the flag's cache line is written once per check, not once per read.
            Some(flag) if !waited && !flag.load(Ordering::Relaxed) => {
                flag.store(true, Ordering::Relaxed)
            }
            _ => {}
        }
        if failed && self.check(image) {
            return Err(self.changed_error(image));
        }
        read
    }

    /// The plain file behind `image`, to splice a read from (`tiers::FileRange`): none for an
    /// image seen changed (its reads fail), or one that is not a plain file on a local disk.
    pub fn file_descriptor(&self, image: u32) -> Option<std::os::fd::BorrowedFd<'_>> {
        if self.has_changed(image) || !self.spliceable.get(image as usize).copied()? {
            return None;
        }
        self.data(image).ok()?.file_descriptor()
    }

    /// Counts a read of `len` bytes of `image` that was spliced rather than read through
    /// `read_exact_at`, as that read would have been counted.
    pub fn count_spliced(&self, image: u32, len: u64) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(len, Ordering::Relaxed);
        if let Some(flag) = self.read_since_check.get(image as usize)
            && !flag.load(Ordering::Relaxed)
        {
            flag.store(true, Ordering::Relaxed);
        }
    }

    /// Counts `len` bytes of `image` checked in place (`SourceStats::checked_bytes`).
    pub fn count_checked(&self, image: u32, len: u64) {
        self.checked_bytes.fetch_add(len, Ordering::Relaxed);
        if let Some(flag) = self.read_since_check.get(image as usize) {
            flag.store(true, Ordering::Relaxed);
        }
    }

    fn has_changed(&self, image: u32) -> bool {
        self.changed
            .get(image as usize)
            .is_some_and(|c| c.load(Ordering::Relaxed))
    }

    fn changed_error(&self, image: u32) -> io::Error {
        io::Error::other(format!(
            "image {} was rewritten while mounted; its files fail until it is remounted",
            self.image_path(image).display()
        ))
    }

    /// Checks the next image after `*cursor`, in turn, that was read from since its last check
    /// (one fstat, or a HEAD for an object), and moves the cursor to it; false when no image was
    /// read from. So the checks cost at most one request per call, however many images there
    /// are, and an idle mount, or one served from its stage, asks the storage nothing.
    pub fn check_next_read(&self, cursor: &mut usize) -> bool {
        let n = self.read_since_check.len();
        for step in 1..=n {
            let i = cursor.wrapping_add(step) % n;
            let read = &self.read_since_check[i];
            if read.load(Ordering::Relaxed) && read.swap(false, Ordering::Relaxed) {
                *cursor = i;
                self.check(i as u32);
                return true;
            }
        }
        false
    }

    /// Whether image `image` has changed since it was opened (its size and mtime, or an
    /// object's ETag, against those it had then); logs the change the first time. Called when a
    /// read of it failed or its bytes failed a checksum, and in turn by the watcher.
    pub fn check(&self, image: u32) -> bool {
        let i = self.resolve(image, 0).0 as usize;
        let (Some(Some(was)), Some(flag)) = (self.stamps.get(i), self.changed.get(i)) else {
            return false;
        };
        if flag.load(Ordering::Relaxed) {
            return true;
        }
        self.checks.fetch_add(1, Ordering::Relaxed);
        let Some(Ok(now)) = self.images[i].data.current() else {
            return false;
        };
        if was.matches(&now) {
            return false;
        }
        if !flag.swap(true, Ordering::SeqCst) {
            let what = stamp_differences(*was, now);
            tracing::error!(
                "image {} was rewritten while mounted ({}): its files now fail with EIO rather \
                 than serve bytes the catalog does not describe; unmount, rebuild the index if \
                 one describes it (`packfs index`), and mount again",
                self.images[i].path.display(),
                what.join(", ")
            );
        }
        true
    }

    /// Stops reading `image` from anything but its source (`ReadAt::distrust`): true if its
    /// bytes came from elsewhere (another node of the job) and a read again comes from the
    /// source.
    pub fn distrust(&self, image: u32) -> bool {
        let (image, _) = self.resolve(image, 0);
        self.data(image).is_ok_and(|data| data.distrust())
    }

    /// Hints that `len` bytes at `offset` of `image` will be read soon (the kernel reads ahead).
    pub fn will_need(&self, image: u32, offset: u64, len: u64) {
        let (image, offset) = self.resolve(image, offset);
        if let Ok(data) = self.data(image) {
            data.will_need(offset, len);
        }
    }

    fn data(&self, image: u32) -> io::Result<&dyn ReadAt> {
        self.images
            .get(image as usize)
            .map(|i| &*i.data)
            .ok_or_else(|| io::Error::other(format!("no image #{image}")))
    }

    pub fn stats(&self) -> SourceStats {
        SourceStats {
            // An archive inside an image is a window of it, not an open of its own.
            opens: self.within.iter().filter(|w| w.is_none()).count() as u64,
            reads: self.reads.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            stage_reads: self.stage_reads.load(Ordering::Relaxed),
            stage_bytes: self.stage_bytes.load(Ordering::Relaxed),
            checks: self.checks.load(Ordering::Relaxed),
            checked_bytes: self.checked_bytes.load(Ordering::Relaxed),
        }
    }
}

/// An image that could not be opened as indexed (`open_each`): every read fails with why.
struct Unusable(String);

impl ReadAt for Unusable {
    fn read_at(&self, _buf: &mut [u8], _offset: u64) -> io::Result<usize> {
        Err(io::Error::other(self.0.clone()))
    }

    fn read_at_now(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.read_at(buf, offset)
    }
}

fn image(path: PathBuf, data: Arc<dyn ReadAt>, size: u64) -> OpenedImage {
    OpenedImage { path, data, size }
}

/// `open` applied to every item, `OPEN_THREADS` at a time; results keep the items' order.
fn open_parallel<I: Sync, T: Send>(
    items: &[I],
    open: impl Fn(&I) -> Result<T, SourceError> + Sync,
) -> Result<Vec<T>, SourceError> {
    let per_thread = items.len().div_ceil(OPEN_THREADS).max(1);
    let open = &open;
    let opened: Vec<Result<T, SourceError>> = std::thread::scope(|scope| {
        let workers: Vec<_> = items
            .chunks(per_thread)
            .map(|part| scope.spawn(move || part.iter().map(open).collect::<Vec<_>>()))
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("open thread panicked"))
            .collect()
    });
    opened.into_iter().collect()
}

/// An inner archive's outer image, and its bytes' offset and length there.
fn inner_window(info: &ImageInfo) -> Option<(u32, u64, u64)> {
    match &info.location {
        crate::source::ImageLocation::Within(w) => Some((info.within?, w.base, w.len)),
        _ => None,
    }
}

fn open_checked(info: &ImageInfo, stores: &Stores) -> Result<OpenedImage, SourceError> {
    let path = info.path().to_path_buf();
    let (data, now) = match info.location.open(stores) {
        Ok(v) => v,
        Err(error) => return Err(SourceError::Open { path, error }),
    };
    let was = &info.fingerprint;
    match was.differences(&now) {
        None => Ok(image(path, data, now.size)),
        Some(what) => {
            let same = (was.size, was.head, was.tail) == (now.size, now.head, now.tail);
            let same_bytes = same.then(|| match info.location.is_object() {
                true => SameBytes::Reuploaded,
                false => SameBytes::Copied {
                    mtime: was.mtime,
                    mtime_nsec: was.mtime_nsec,
                },
            });
            Err(SourceError::Changed {
                path,
                what,
                same_bytes,
            })
        }
    }
}

#[cfg(test)]
#[path = "opened_tests.rs"]
mod tests;
