//! The catalog: the merged, immutable namespace of all images of a mount.
//!
//! Entries are fixed-size records in one table plus one arena of names; each directory's children
//! are contiguous and sorted by name, so a lookup is a binary search and a listing is a slice. An
//! entry's index is its identity (inode = index + 1). Nothing is mutated after `build`, so every
//! FUSE thread reads it through a shared reference without locks.

mod build;
mod check;
mod entry;
pub mod index;
mod store;

use std::path::Path;

pub use build::{BuildError, DuplicatePolicy, build};
pub use check::Problem;
pub use entry::{Entry, Kind};
pub use store::CatalogError;
use store::Store;

use crate::archive::Encoding;
use crate::archive::placement::{Placement, read_checkpoints};
use crate::source::{Fingerprint, ImageLocation};

/// An image (shard) the catalog refers to by position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageInfo {
    /// Where it is: a file, or an object (parsed once, when given or read from an index).
    pub location: ImageLocation,
    /// As recorded when the image was scanned; checked again when the image is opened.
    pub fingerprint: Fingerprint,
    /// For a compressed image (a `.tar.gz`), where the checkpoint table of its decoded stream
    /// starts in the names arena: member offsets are in that stream.
    pub stream: Option<u64>,
    /// For an archive stored as a member of another image (`ImageLocation::Within`): that
    /// image's number, lower than this one's. Its bytes are read, cached and staged as the outer
    /// image's.
    pub within: Option<u32>,
}

/// Whether some of `images` is an object in a store: the one answer to "is this remote".
pub fn any_object(images: &[ImageInfo]) -> bool {
    images.iter().any(|i| i.location.is_object())
}

/// Where `offset` of image `image` of `images` lies in the file or object that holds its bytes:
/// itself, or for an archive inside another image, the outermost image around it. The one walk
/// of the chain, for `ls --json` and for the tiers' reads.
pub fn outermost(images: &[ImageInfo], mut image: u32, mut offset: u64) -> (u32, u64) {
    while let Some(info) = images.get(image as usize) {
        let (Some(outer), crate::source::ImageLocation::Within(w)) = (info.within, &info.location)
        else {
            break;
        };
        // Outer images come first (checked when an index is read): this ends.
        if outer >= image {
            break;
        }
        (image, offset) = (outer, offset.saturating_add(w.base));
    }
    (image, offset)
}

impl ImageInfo {
    /// Its name (the file's path, or the object's URL), for messages and the index.
    pub fn path(&self) -> &Path {
        self.location.name()
    }
}

/// Index of an entry in the catalog; the root is 0.
pub type EntryId = u32;

pub const ROOT: EntryId = 0;

pub struct Catalog {
    store: Store,
    images: Vec<ImageInfo>,
    file_count: u64,
    file_bytes: u64,
    skipped: Skipped,
}

/// Members the scan left out with a warning (kept in the index, shown by `packfs status`): the
/// mount serves less than the images hold, and says so.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    pub members: u64,
    /// Of those, tar members whose header failed its checksum.
    pub damaged_headers: u64,
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog")
            .field("entries", &self.len())
            .field("images", &self.images.len())
            .field("file_count", &self.file_count)
            .finish()
    }
}

impl Catalog {
    pub fn len(&self) -> usize {
        self.store.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() <= 1
    }

    pub fn images(&self) -> &[ImageInfo] {
        &self.images
    }

    /// Whether some image is an object in a store (every request a round trip).
    pub fn has_objects(&self) -> bool {
        any_object(&self.images)
    }

    /// Where `offset` of image `image` lies in the file or object that holds its bytes: itself,
    /// or for an archive inside another image, the outermost image around it.
    pub fn outermost(&self, image: u32, offset: u64) -> (u32, u64) {
        outermost(&self.images, image, offset)
    }

    /// The index file this catalog is mapped from, if any.
    pub fn index_path(&self) -> Option<&std::path::Path> {
        match &self.store {
            Store::Mapped(m) => Some(&m.path),
            Store::Owned { .. } => None,
        }
    }

    /// Number of regular files.
    pub fn file_count(&self) -> u64 {
        self.file_count
    }

    pub fn skipped(&self) -> Skipped {
        self.skipped
    }

    /// Regular files whose reads are checked against a checksum the catalog holds: a CRC-32 of
    /// the whole file (zip members, `packfs pack`'s shards, `packfs index --checksums`) or of
    /// each decoded interval (members of compressed images, large deflated zip members). The
    /// others are served as their image holds them now (docs/semantics.md). One walk of the
    /// entries: for status and listings, not for the read path.
    pub fn checksummed_files(&self) -> u64 {
        (0..self.len() as EntryId)
            .filter_map(|id| self.entry(id).ok())
            .filter(|e| e.kind() == Kind::File)
            .filter(|e| {
                let compressed = self
                    .images
                    .get(e.image as usize)
                    .is_some_and(|i| i.stream.is_some());
                compressed
                    || matches!(
                        e.encoding(),
                        Ok(Encoding::StoredCrc | Encoding::ZipDeflated | Encoding::Checkpointed)
                    )
            })
            .count() as u64
    }

    /// Sum of the sizes of all regular files.
    pub fn file_bytes(&self) -> u64 {
        self.file_bytes
    }

    pub fn entry(&self, id: EntryId) -> Result<&Entry, CatalogError> {
        self.store.entry(id)
    }

    pub fn name(&self, entry: &Entry) -> Result<&[u8], CatalogError> {
        self.store
            .names(entry.name_offset(), entry.name_len as usize)
    }

    pub fn symlink_target(&self, entry: &Entry) -> Result<&[u8], CatalogError> {
        debug_assert_eq!(entry.kind(), Kind::Symlink);
        self.store.names(entry.offset, entry.size as usize)
    }

    /// Where a file's bytes are (`archive::placement`), as recorded: the format reads its own record,
    /// checked against the file's size and its image's.
    pub fn placement(&self, entry: &Entry) -> Result<Placement<'_>, CatalogError> {
        debug_assert_eq!(entry.kind(), Kind::File);
        let image = self.images.get(entry.image as usize).ok_or_else(|| {
            CatalogError::Invalid(format!(
                "the catalog places a file in image #{}, but it has {} images (the index is \
                 damaged or crafted)",
                entry.image,
                self.images.len()
            ))
        })?;
        // A record the catalog does not hold is damage, not a missing file: EIO and a log line
        // naming the image and the offset, never ENOENT.
        let invalid = |why: String| {
            CatalogError::Invalid(format!(
                "in image {}: the file's record at offset {} {why} (the index is damaged or \
                 crafted)",
                image.path().display(),
                entry.offset
            ))
        };
        let not_in_arena = |offset: u64, len: u64| {
            invalid(format!(
                "is not in the catalog ({len} bytes at {offset} of its arena)"
            ))
        };
        let record = |offset, len| match self.store.names(offset, len) {
            Err(CatalogError::NotFound) => Err(not_in_arena(offset, len as u64)),
            other => other,
        };
        let whole = |offset, len| match self.store.record(offset, len) {
            Err(CatalogError::NotFound) => Err(not_in_arena(offset, len)),
            other => other,
        };
        let encoding = entry
            .encoding()
            .map_err(|code| invalid(format!("has encoding code {code}, which no format uses")))?;
        let placement = Placement::read(encoding, entry.offset, record, whole)?;
        let placement = match image.stream {
            None => placement,
            Some(table) => placement.in_stream(read_checkpoints(table, record, whole)?)?,
        };
        // Checked on every use: the read planner's arithmetic relies on it, and a crafted index
        // could otherwise make it overflow or point outside the image.
        placement
            .check_extent(entry.size, image.fingerprint.size)
            .map_err(|what| {
                CatalogError::Invalid(format!("in image {}: {what}", image.path().display()))
            })?;
        Ok(placement)
    }

    /// The ids of a directory's children, in name order (empty for a non-directory).
    pub fn children(&self, dir: &Entry) -> std::ops::Range<EntryId> {
        if !dir.is_dir() {
            return 0..0;
        }
        // Clamped to the table: a crafted size must not make a listing count to 2^32.
        let len = EntryId::try_from(self.len()).unwrap_or(EntryId::MAX);
        let first = EntryId::try_from(dir.offset)
            .unwrap_or(EntryId::MAX)
            .min(len);
        first
            ..first
                .saturating_add(EntryId::try_from(dir.size).unwrap_or(EntryId::MAX))
                .min(len)
    }

    /// Child `id` of directory `dir`, if it names `dir` as its parent. Every step down the tree
    /// goes through here: each entry has one parent, so a crafted index whose directories list
    /// an ancestor (or themselves) still reads as a tree, never as a cycle.
    pub fn child(&self, dir: EntryId, id: EntryId) -> Result<&Entry, CatalogError> {
        let e = self.entry(id)?;
        if e.parent != dir || id == dir {
            return Err(CatalogError::Invalid(format!(
                "entry {id} is listed in directory {dir} but names {} as its parent (the index \
                 is damaged or crafted)",
                e.parent
            )));
        }
        Ok(e)
    }

    /// Finds `name` in directory `parent`: a binary search over its sorted children.
    pub fn lookup(&self, parent: EntryId, name: &[u8]) -> Result<EntryId, CatalogError> {
        let dir = self.entry(parent)?;
        let (mut lo, mut hi) = (self.children(dir).start, self.children(dir).end);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.name(self.entry(mid)?)?.cmp(name) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return self.child(parent, mid).map(|_| mid),
            }
        }
        Err(CatalogError::NotFound)
    }

    /// Resolves a relative path (`a/b/c`, no symlinks followed).
    pub fn resolve(&self, path: &[u8]) -> Result<EntryId, CatalogError> {
        path.split(|&b| b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
            .try_fold(ROOT, |dir, comp| self.lookup(dir, comp))
    }

    /// The regular file at `path` (relative to the root), if that is what it names: the entry a
    /// sampler's path stands for (the hints socket's, and the Python module's).
    pub fn resolve_file(&self, path: &[u8]) -> Option<EntryId> {
        let id = self.resolve(path).ok()?;
        (self.entry(id).ok()?.kind() == Kind::File).then_some(id)
    }

    /// The full path of an entry, for messages and listings (`?` for a part that cannot be read).
    pub fn path_of(&self, mut id: EntryId) -> Vec<u8> {
        let mut parts = Vec::new();
        while id != ROOT && parts.len() < 4096 {
            let Ok(e) = self.entry(id) else { break };
            parts.push(self.name(e).unwrap_or(b"?"));
            id = e.parent;
        }
        let mut out = Vec::new();
        for part in parts.iter().rev() {
            if !out.is_empty() {
                out.push(b'/');
            }
            out.extend_from_slice(part);
        }
        out
    }

    /// Every entry id below `dir`, depth first in name order (for listings and tests). A
    /// directory's listing ends at the first child that does not name it as parent (`check`
    /// reports it), as a FUSE listing does: so the walk ends, and in time linear in the number
    /// of entries, whatever the index says.
    pub fn walk(&self, dir: EntryId) -> impl Iterator<Item = EntryId> + '_ {
        let mut stack = vec![dir];
        let mut children = Vec::new();
        std::iter::from_fn(move || {
            let id = stack.pop()?;
            if let Ok(e) = self.entry(id) {
                children.clear();
                children.extend(self.children(e).take_while(|&c| self.child(id, c).is_ok()));
                stack.extend(children.iter().rev());
            }
            Some(id)
        })
        .skip(1)
    }
}

impl Catalog {
    /// The tables, fully verified, for writing them to an index (the names arena in pieces).
    pub(crate) fn tables(&self) -> Result<(&[Entry], Vec<store::Part<'_>>), CatalogError> {
        self.store.tables()
    }

    /// Checks every chunk of a mapped index; the number of damaged chunks (0 for a scanned catalog).
    pub fn verify_all(&self) -> usize {
        self.store.verify_all()
    }
}
