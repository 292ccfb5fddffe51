//! Archive formats: scan an image into members (path, kind, attributes, data extent), and plan the
//! reads of a member's bytes (`placement`), decoding them with the shared codecs (`codec`).
//!
//! A format knows nothing of FUSE or caching. A malformed image is an `ArchiveError` that names the
//! image and the byte offset; a member that cannot be served (device node, sparse file, unsafe name)
//! is skipped with a warning so that one odd member never takes a whole dataset down.

mod clashes;
pub mod codec;
pub mod format;
pub mod framed;
pub mod inflate;
pub mod name;
pub mod placement;
pub mod plan;
pub mod registry;
pub mod sparse_map;
pub mod spill;
pub mod squashfs;
pub mod tar;
pub mod zip;

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use tracing::warn;

use crate::source::read_at::ReadAt;
use crate::source::{Fingerprint, ImageLocation};

pub use format::{INDEX_MAGIC, ImageFormat, Probe};
pub use placement::Placement;
pub use plan::Encoding;
pub use registry::Registry;

/// What a member is, after format-specific types are folded away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberKind {
    File,
    Dir,
    Symlink,
    /// A hard link whose target could not be resolved yet; scanners resolve them before returning.
    HardLink,
}

/// A byte range inside `ScannedImage::strings`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    pub start: usize,
    pub len: usize,
}

/// One member of an image. Names live in the image's string arena, so a scan of a million members
/// makes no per-member heap allocation.
#[derive(Clone, Copy, Debug)]
pub struct Member {
    /// Sanitized path (no leading `/` or `./`, no `..`), empty for the root directory itself.
    pub path: Span,
    /// Symlink target as stored (never followed), hard-link target path, or for a squashfs file
    /// its encoded block map. For a `Checkpointed` member: its checkpoint table, a span of the
    /// image's `tables` (not of `strings`).
    pub link: Span,
    pub kind: MemberKind,
    /// Permission bits (`0o7777` at most).
    pub mode: u32,
    pub mtime: i64,
    pub mtime_nsec: u32,
    /// File size in bytes.
    pub size: u64,
    /// Absolute offset of the member's data in the image (of its first block for squashfs).
    pub data_offset: u64,
    pub encoding: Encoding,
    /// Offset of the member's (first) header, for messages.
    pub header_offset: u64,
}

/// The result of scanning one image.
#[derive(Debug)]
pub struct ScannedImage {
    /// Its name, for messages (`location`'s).
    pub path: PathBuf,
    pub location: ImageLocation,
    /// Image size in bytes at scan time.
    pub size: u64,
    /// Taken before the scan, so a later check catches a change made during it too.
    pub fingerprint: Fingerprint,
    pub members: Vec<Member>,
    pub strings: Vec<u8>,
    /// Headers (tar), central directory entries (zip) or inodes (squashfs) the scan read. Each
    /// one is served (`members`), merged into the member it describes (`merged`), or left out
    /// with a warning (`skipped`): `unaccounted` checks that none went missing silently.
    pub headers: u64,
    /// Headers that only describe another (tar extension records, PAX global headers).
    pub merged: u64,
    /// Members left out with a warning.
    pub skipped: u64,
    /// Of those, members whose header failed its checksum (the scan went on at the next header).
    pub damaged_headers: u64,
    /// How many members were left out for each reason, for the summary after the scan.
    skips: BTreeMap<String, u64>,
    /// Set once `drop_clashes` has put the members in extraction order's terms: the catalog
    /// build then trusts that no name is both a file and a directory.
    pub clashes_settled: bool,
    /// For a compressed image (a `.tar.gz`): the checkpoint table of its decoded stream
    /// (`inflate::table`), in which the members' offsets lie, in `tables`.
    pub stream: Option<spill::TableRef>,
    /// The checkpoint tables of the image's deflate streams, on disk (`spill`).
    pub tables: Option<spill::TableFile>,
    /// For an archive stored as a member of another (`ImageLocation::Within`): the outer
    /// image's position in the list of scanned images, which comes before it.
    pub within: Option<usize>,
}

/// Warnings named one by one per image and reason; the rest are counted in one summary line, so
/// 200 000 device nodes make a handful of lines, not 200 000.
const NAMED_SKIPS: u64 = 5;

impl ScannedImage {
    /// An empty scan of the image at `path`, fingerprinted as `fingerprint`.
    pub fn new(location: ImageLocation, fingerprint: Fingerprint) -> ScannedImage {
        ScannedImage {
            path: location.name().to_path_buf(),
            location,
            size: fingerprint.size,
            fingerprint,
            members: Vec::new(),
            strings: Vec::new(),
            headers: 0,
            merged: 0,
            skipped: 0,
            damaged_headers: 0,
            skips: BTreeMap::new(),
            clashes_settled: false,
            stream: None,
            tables: None,
            within: None,
        }
    }

    /// The image's table file, made on first use.
    pub(crate) fn tables(&mut self) -> io::Result<&mut spill::TableFile> {
        if self.tables.is_none() {
            self.tables = Some(spill::TableFile::new()?);
        }
        Ok(self.tables.as_mut().expect("made above"))
    }

    /// Leaves out the member `name` whose header is at `offset`, with a warning (the first few
    /// per reason) naming the image, the offset and why.
    pub(crate) fn skip(&mut self, offset: u64, name: &[u8], why: &str) {
        self.skipped += 1;
        let count = match self.skips.get_mut(why) {
            Some(n) => n,
            None => self.skips.entry(why.to_string()).or_default(),
        };
        *count += 1;
        if *count <= NAMED_SKIPS {
            warn!(
                image = %self.path.display(),
                offset,
                "skipping member {}: {why}",
                name::shown(name)
            );
        }
    }

    /// Gives back what the member and string lists reserved beyond their length: kept for the
    /// whole scan of a dataset with 100 000 archives inside its images, the slack cost more than
    /// their members.
    pub fn shrink_to_fit(&mut self) {
        self.members.shrink_to_fit();
        self.strings.shrink_to_fit();
    }

    /// Headers the scan read but neither served, merged nor warned about: a scanner bug (a
    /// member lost without a word), described; `None` when every header is accounted for.
    pub fn unaccounted(&self) -> Option<String> {
        let accounted = self.members.len() as u64 + self.merged + self.skipped;
        (accounted != self.headers).then(|| {
            format!(
                "{}: the scan read {} headers but accounts for {accounted} ({} members served, \
                 {} merged into the member they describe, {} skipped with a warning)",
                self.path.display(),
                self.headers,
                self.members.len(),
                self.merged,
                self.skipped
            )
        })
    }

    /// One line per reason that left out more members than were named.
    fn summarize_skips(&self) {
        for (why, &n) in &self.skips {
            if n > NAMED_SKIPS {
                warn!(
                    image = %self.path.display(),
                    "skipped {n} members in all: {why} (the first {NAMED_SKIPS} are named above)"
                );
            }
        }
    }

    pub fn bytes(&self, span: Span) -> &[u8] {
        &self.strings[span.start..span.start + span.len]
    }

    pub fn path_of(&self, member: &Member) -> &[u8] {
        self.bytes(member.path)
    }

    pub fn link_of(&self, member: &Member) -> &[u8] {
        self.bytes(member.link)
    }

    pub(crate) fn push_string(&mut self, bytes: &[u8]) -> Span {
        let start = self.strings.len();
        self.strings.extend_from_slice(bytes);
        Span {
            start,
            len: bytes.len(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("cannot read {}: {error}", image.display())]
    Io { image: PathBuf, error: io::Error },
    #[error(
        "{} is an index file, not an image: give an index alone, not among images (a glob that \
         also matches the index?)",
        image.display()
    )]
    IsIndex { image: PathBuf },
    #[error("{}: at byte offset {offset}: {reason}", image.display())]
    Malformed {
        image: PathBuf,
        offset: u64,
        reason: String,
    },
}

impl ArchiveError {
    pub(crate) fn malformed(image: &Path, offset: u64, reason: impl Into<String>) -> Self {
        ArchiveError::Malformed {
            image: image.to_path_buf(),
            offset,
            reason: reason.into(),
        }
    }

    pub(crate) fn io(image: &Path, source: io::Error) -> Self {
        ArchiveError::Io {
            image: image.to_path_buf(),
            error: source,
        }
    }
}

/// Scans the image at `location`, whose bytes `file` reads and whose fingerprint is
/// `fingerprint`, detecting its format from its content.
pub fn scan(
    location: &ImageLocation,
    file: &dyn ReadAt,
    fingerprint: Fingerprint,
) -> Result<ScannedImage, ArchiveError> {
    scan_with(Registry::standard(), location, file, fingerprint)
}

/// `scan`, with the formats of `registry`.
pub fn scan_with(
    registry: &Registry,
    location: &ImageLocation,
    file: &dyn ReadAt,
    fingerprint: Fingerprint,
) -> Result<ScannedImage, ArchiveError> {
    let mut image = ScannedImage::new(location.clone(), fingerprint);
    let path = location.name();
    if image.size == 0 {
        // As GNU tar ("This does not look like a tar archive"): a 0-byte file is most often a
        // download or copy that failed, not an empty dataset.
        return Err(ArchiveError::malformed(
            path,
            0,
            "the image is empty (0 bytes), not an archive; a download or copy that failed? Fetch \
             or copy it again",
        ));
    }
    let format = registry
        .detect(file, image.size)
        .map_err(|e| ArchiveError::io(path, e))?;
    (format.scan)(file, &mut image)?;
    image.summarize_skips();
    if image.members.is_empty() {
        tracing::warn!(
            "{}: the archive holds no files ({} bytes, nothing served from it); a truncated or \
             wrong image?",
            path.display(),
            image.size
        );
    }
    if let Some(what) = image.unaccounted() {
        // Never silently less: a member lost here is a packfs bug, said out loud (the tests
        // and fuzz targets fail on it).
        debug_assert!(false, "{what}");
        tracing::error!("{what}; this is a packfs bug, please report it");
    }
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_lost_in_silence_is_described() {
        let location = ImageLocation::File("s.tar".into());
        let mut image = ScannedImage::new(location, Fingerprint::default());
        assert_eq!(image.unaccounted(), None);
        image.headers = 4;
        image.merged = 1;
        image.skip(0, b"dev", "device nodes are not served");
        assert_eq!(
            image.unaccounted().as_deref(),
            Some(
                "s.tar: the scan read 4 headers but accounts for 2 (0 members served, 1 merged \
                 into the member they describe, 1 skipped with a warning)"
            )
        );
    }
}
