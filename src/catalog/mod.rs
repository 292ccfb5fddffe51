//! The catalog: the merged, immutable namespace of all images of a mount.
//!
//! Entries are fixed-size records in one table plus one arena of names; each directory's children
//! are contiguous and sorted by name, so a lookup is a binary search and a listing is a slice. An
//! entry's index is its identity (inode = index + 1). Nothing is mutated after `build`, so every
//! FUSE thread reads it through a shared reference without locks.

mod build;
mod entry;

use std::path::PathBuf;

pub use build::{BuildError, DuplicatePolicy, build};
pub use entry::{Entry, Kind};

/// An image (shard) the catalog refers to by position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageInfo {
    pub path: PathBuf,
    pub size: u64,
}

/// Index of an entry in the catalog; the root is 0.
pub type EntryId = u32;

pub const ROOT: EntryId = 0;

#[derive(Debug)]
pub struct Catalog {
    entries: Vec<Entry>,
    names: Vec<u8>,
    images: Vec<ImageInfo>,
    file_count: u64,
    file_bytes: u64,
}

impl Catalog {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.len() <= 1
    }

    pub fn images(&self) -> &[ImageInfo] {
        &self.images
    }

    /// Number of regular files.
    pub fn file_count(&self) -> u64 {
        self.file_count
    }

    /// Sum of the sizes of all regular files.
    pub fn file_bytes(&self) -> u64 {
        self.file_bytes
    }

    pub fn entry(&self, id: EntryId) -> Option<&Entry> {
        self.entries.get(id as usize)
    }

    pub fn name(&self, entry: &Entry) -> &[u8] {
        let start = entry.name_off as usize;
        &self.names[start..start + entry.name_len as usize]
    }

    pub fn symlink_target(&self, entry: &Entry) -> &[u8] {
        debug_assert_eq!(entry.kind(), Kind::Symlink);
        let start = entry.offset as usize;
        &self.names[start..start + entry.size as usize]
    }

    /// The ids of a directory's children, in name order (empty for a non-directory).
    pub fn children(&self, dir: &Entry) -> std::ops::Range<EntryId> {
        if !dir.is_dir() {
            return 0..0;
        }
        let first = dir.offset as EntryId;
        first..first + dir.size as EntryId
    }

    /// Finds `name` in directory `parent`: a binary search over its sorted children.
    pub fn lookup(&self, parent: EntryId, name: &[u8]) -> Option<EntryId> {
        let dir = self.entry(parent)?;
        let range = self.children(dir);
        let kids = &self.entries[range.start as usize..range.end as usize];
        kids.binary_search_by(|e| self.name(e).cmp(name))
            .ok()
            .map(|i| range.start + i as EntryId)
    }

    /// Resolves a relative path (`a/b/c`, no symlinks followed).
    pub fn resolve(&self, path: &[u8]) -> Option<EntryId> {
        path.split(|&b| b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
            .try_fold(ROOT, |dir, comp| self.lookup(dir, comp))
    }

    /// The full path of an entry, for messages and listings.
    pub fn path_of(&self, mut id: EntryId) -> Vec<u8> {
        let mut parts = Vec::new();
        while id != ROOT {
            let Some(e) = self.entry(id) else { break };
            parts.push(self.name(e));
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

    /// Every entry id below `dir`, depth first in name order (for listings and tests).
    pub fn walk(&self, dir: EntryId) -> impl Iterator<Item = EntryId> + '_ {
        let mut stack = vec![dir];
        std::iter::from_fn(move || {
            let id = stack.pop()?;
            if let Some(e) = self.entry(id) {
                stack.extend(self.children(e).rev());
            }
            Some(id)
        })
        .skip(1)
    }
}
