//! Where the catalog's tables live: in memory after a scan, or in a mapped index file.
//!
//! A mapped index is not read at mount: its entries and names are cut into chunks with one recorded
//! checksum each, and a chunk is checked the first time anything in it is used (a bit per chunk
//! remembers it). So mounting costs the same for any number of files, and a damaged index can only
//! turn a request into an error, never into a wrong answer.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::Mmap;
use tracing::error;
use xxhash_rust::xxh3::xxh3_64;

use super::entry::Entry;
use crate::archive::inflate::Located;
use crate::util::le;

const ENTRY_SIZE: usize = std::mem::size_of::<Entry>();

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    #[error("no such entry")]
    NotFound,
    #[error(
        "index {}: the chunk at byte offset {offset} fails its checksum (the index file is \
         damaged; rebuild it with `packfs index`)",
        index.display()
    )]
    Damaged { index: PathBuf, offset: u64 },
    /// A record that reads but does not make sense (never in a catalog packfs built itself).
    #[error("{0}")]
    Invalid(String),
}

impl From<crate::archive::plan::PlanError> for CatalogError {
    fn from(e: crate::archive::plan::PlanError) -> Self {
        CatalogError::Invalid(e.why)
    }
}

pub(super) enum Store {
    /// A catalog built from scanned images: entries and names in memory, then the images'
    /// checkpoint tables mapped from their spill files (`tail`), so that a table of gigabytes
    /// takes no memory until reads touch it.
    Owned {
        entries: Vec<Entry>,
        names: Vec<u8>,
        tail: Vec<Segment>,
    },
    Mapped(Mapped),
}

/// A file of checkpoint tables that continues the names arena of an in-memory catalog: arena
/// offsets `start..start + map.len()`. The file is kept to copy it into an index without going
/// through the mapping (which would count it all in the process's memory).
pub(super) struct Segment {
    pub start: u64,
    pub map: Mmap,
    pub file: std::fs::File,
}

/// The names arena in pieces, for writing an index.
pub(crate) enum Part<'a> {
    Bytes(&'a [u8]),
    /// The first `len` bytes of a file.
    File(&'a std::fs::File, u64),
}

impl Part<'_> {
    pub fn len(&self) -> u64 {
        match self {
            Part::Bytes(b) => b.len() as u64,
            Part::File(_, len) => *len,
        }
    }
}

/// An index file's tables, in place in the mapping. Byte ranges are offsets into the mapping and
/// have been checked against its length; `entries.start` is a multiple of 8.
pub(super) struct Mapped {
    pub map: Mmap,
    pub path: PathBuf,
    pub entries: Range<usize>,
    pub names: Range<usize>,
    pub chunks: Chunks,
    /// The index file `map` maps, when it maps one (not memory filled with it): its pages can
    /// then be let go, and checkpoint windows are read from it with pread.
    pub file: Option<std::fs::File>,
}

/// Per-chunk checksums over a byte range of the mapping (the entries and names, up to the table of
/// checksums that follows them), with the state of the lazy verification.
pub(super) struct Chunks {
    pub start: usize,
    pub end: usize,
    pub size: usize,
    /// Offset of the table of xxh3 checksums (u64, little-endian), one per chunk.
    pub table: usize,
    pub verified: Box<[AtomicU64]>,
    pub reported: Box<[AtomicU64]>,
}

impl Chunks {
    pub fn new(start: usize, table: usize, size: usize) -> Chunks {
        let end = table;
        let count = (end - start).div_ceil(size);
        let words = || (0..count.div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        Chunks {
            start,
            end,
            size,
            table,
            verified: words(),
            reported: words(),
        }
    }

    pub fn count(&self) -> usize {
        (self.end - self.start).div_ceil(self.size)
    }

    /// Checks every chunk touching bytes `range` of `map`.
    fn check(&self, map: &[u8], path: &Path, range: Range<usize>) -> Result<(), CatalogError> {
        let first = (range.start - self.start) / self.size;
        let last = (range.end.max(range.start + 1) - 1 - self.start) / self.size;
        (first..=last).try_for_each(|chunk| self.ensure(map, path, chunk))
    }

    /// Checks one chunk unless it was checked before.
    fn ensure(&self, map: &[u8], path: &Path, chunk: usize) -> Result<(), CatalogError> {
        let (word, bit) = (chunk / 64, 1u64 << (chunk % 64));
        if self.verified[word].load(Ordering::Relaxed) & bit != 0 {
            return Ok(());
        }
        self.check_chunk(map, path, chunk)
    }

    /// Hashes one chunk and compares it with its recorded checksum; remembers a success, and logs
    /// a failure once.
    fn check_chunk(&self, map: &[u8], path: &Path, chunk: usize) -> Result<(), CatalogError> {
        let (word, bit) = (chunk / 64, 1u64 << (chunk % 64));
        let start = self.start + chunk * self.size;
        let end = (start + self.size).min(self.end);
        let at = self.table + chunk * 8;
        let recorded = le::u64_at(map, at);
        if xxh3_64(&map[start..end]) == recorded {
            self.verified[word].fetch_or(bit, Ordering::Relaxed);
            return Ok(());
        }
        let err = CatalogError::Damaged {
            index: path.to_path_buf(),
            offset: start as u64,
        };
        if self.reported[word].fetch_or(bit, Ordering::Relaxed) & bit == 0 {
            error!("{err}; requests that need it fail with EIO");
        }
        Err(err)
    }
}

impl Store {
    pub fn len(&self) -> usize {
        match self {
            Store::Owned { entries, .. } => entries.len(),
            Store::Mapped(m) => m.entries.len() / ENTRY_SIZE,
        }
    }

    pub fn entry(&self, id: u32) -> Result<&Entry, CatalogError> {
        match self {
            Store::Owned { entries, .. } => entries.get(id as usize).ok_or(CatalogError::NotFound),
            Store::Mapped(m) => {
                if id as usize >= m.entries.len() / ENTRY_SIZE {
                    return Err(CatalogError::NotFound);
                }
                let start = m.entries.start + id as usize * ENTRY_SIZE;
                m.chunks.check(&m.map, &m.path, start..start + ENTRY_SIZE)?;
                // SAFETY: `start` is in bounds (checked above), 8-aligned (the mapping is page
                // aligned, `entries.start` and ENTRY_SIZE are multiples of 8), and Entry is plain
                // integers without padding, so any bytes are a valid Entry.
                Ok(unsafe { &*(m.map.as_ptr().add(start) as *const Entry) })
            }
        }
    }

    /// `len` bytes at `offset` in the names arena; `NotFound` if out of range (never for a
    /// consistent catalog).
    pub fn names(&self, offset: u64, len: usize) -> Result<&[u8], CatalogError> {
        let offset = usize::try_from(offset).map_err(|_| CatalogError::NotFound)?;
        let end = offset.checked_add(len).ok_or(CatalogError::NotFound)?;
        match self {
            Store::Owned { names, tail, .. } => {
                if end <= names.len() {
                    return Ok(&names[offset..end]);
                }
                let (seg, from) = segment(tail, offset as u64, len as u64)?;
                Ok(&seg.map[from as usize..from as usize + len])
            }
            Store::Mapped(m) => {
                if end > m.names.len() {
                    return Err(CatalogError::NotFound);
                }
                let range = m.names.start + offset..m.names.start + end;
                m.chunks.check(&m.map, &m.path, range.clone())?;
                Ok(&m.map[range])
            }
        }
    }

    /// Where `len` bytes at `offset` in the names arena are, without checking them against the
    /// index's checksums: a checkpoint table's record, whose windows are read with pread from
    /// the file that holds them (never through the mapping: see `inflate::Located`), and checked
    /// by their use (`placement::read_checkpoints`).
    pub fn record(&self, offset: u64, len: u64) -> Result<Located<'_>, CatalogError> {
        let end = offset.checked_add(len).ok_or(CatalogError::NotFound)?;
        match self {
            Store::Mapped(m) => {
                if end > m.names.len() as u64 {
                    return Err(CatalogError::NotFound);
                }
                let at = m.names.start as u64 + offset;
                Ok(match &m.file {
                    Some(file) => Located::File { file, at, len },
                    None => Located::Bytes(&m.map[at as usize..(at + len) as usize]),
                })
            }
            Store::Owned { names, tail, .. } => {
                if end <= names.len() as u64 {
                    return Ok(Located::Bytes(&names[offset as usize..end as usize]));
                }
                let (seg, at) = segment(tail, offset, len)?;
                Ok(Located::File {
                    file: &seg.file,
                    at,
                    len,
                })
            }
        }
    }

    /// The whole tables, every chunk verified, the names arena in pieces: for writing an index.
    pub fn tables(&self) -> Result<(&[Entry], Vec<Part<'_>>), CatalogError> {
        match self {
            Store::Owned {
                entries,
                names,
                tail,
            } => {
                let mut parts = vec![Part::Bytes(names)];
                parts.extend(tail.iter().map(|s| Part::File(&s.file, s.map.len() as u64)));
                Ok((entries, parts))
            }
            Store::Mapped(m) => {
                for chunk in 0..m.chunks.count() {
                    m.chunks.ensure(&m.map, &m.path, chunk)?;
                }
                // SAFETY: as in `entry`, for the whole checked range.
                let entries = unsafe {
                    std::slice::from_raw_parts(
                        m.map.as_ptr().add(m.entries.start) as *const Entry,
                        m.entries.len() / ENTRY_SIZE,
                    )
                };
                Ok((entries, vec![Part::Bytes(&m.map[m.names.clone()])]))
            }
        }
    }

    /// Checks every chunk of a mapped index once, in the background after a mount, so damage is
    /// logged early and the file is in the page cache; returns the number of damaged chunks.
    /// The pages this pass went through are let go from the daemon's own memory behind it (they
    /// stay in the page cache, and a request that needs one maps it again): the index of a big
    /// `.tar.gz` is gigabytes of checkpoint tables, which would otherwise all count in the
    /// daemon's RSS.
    pub fn verify_all(&self) -> usize {
        match self {
            Store::Owned { .. } => 0,
            Store::Mapped(m) => {
                // Only a map of the file can let its pages go (an anonymous one would lose them).
                // SAFETY: sysconf only reads a system constant.
                let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
                    n if n > 0 && m.file.is_some() => Some(n as usize),
                    _ => None,
                };
                let mut released = 0;
                (0..m.chunks.count())
                    .filter(|&c| {
                        let damaged = m.chunks.ensure(&m.map, &m.path, c).is_err();
                        if let Some(page) = page {
                            // Up to the last whole page behind this chunk's end: a page the next
                            // chunk shares goes with that one.
                            let end = (m.chunks.start + (c + 1) * m.chunks.size).min(m.chunks.end);
                            let to = end / page * page;
                            release(&m.map, released..to);
                            released = released.max(to);
                        }
                        damaged
                    })
                    .count()
            }
        }
    }
}

/// The segment of `tail` that holds `len` bytes at arena offset `offset`, and where they start
/// in it; `NotFound` if no one segment holds them all.
fn segment(tail: &[Segment], offset: u64, len: u64) -> Result<(&Segment, u64), CatalogError> {
    let i = tail.partition_point(|s| s.start <= offset);
    let seg = i.checked_sub(1).map(|i| &tail[i]);
    seg.filter(|s| {
        offset
            .checked_add(len)
            .is_some_and(|end| end <= s.start + s.map.len() as u64)
    })
    .map(|s| (s, offset - s.start))
    .ok_or(CatalogError::NotFound)
}

/// Drops the pages `range` (page-aligned) from this process's mapping of a file; a later access
/// reads them again from the page cache (or the file).
fn release(map: &Mmap, range: Range<usize>) {
    let (from, to) = (range.start, range.end);
    if from < to {
        // SAFETY: `map` is a read-only shared mapping of a file that is never written while
        // mapped (indexes are replaced by rename): after MADV_DONTNEED the pages read back the
        // same bytes from the file. (Only for file-backed maps: an anonymous one would read
        // zeros, and callers check.)
        let _ = unsafe {
            map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, from, to - from)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(start: u64, bytes: &[u8]) -> Segment {
        use std::io::Write;
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(bytes).unwrap();
        // SAFETY: a private temporary file, not written again.
        let map = unsafe { Mmap::map(&file) }.unwrap();
        Segment { start, map, file }
    }

    #[test]
    fn tables_are_found_in_their_segment_and_nowhere_else() {
        let store = Store::Owned {
            entries: Vec::new(),
            names: b"names".to_vec(),
            tail: vec![seg(5, b"first"), seg(10, b"second")],
        };
        assert_eq!(store.names(1, 3).unwrap(), b"ame");
        assert_eq!(store.names(6, 3).unwrap(), b"irs");
        assert_eq!(store.names(10, 6).unwrap(), b"second");
        let Located::File { at, len, .. } = store.record(11, 4).unwrap() else {
            panic!("a table in a segment is read from its file")
        };
        assert_eq!((at, len), (1, 4));
        // Across two segments, past the end, or an offset and length that overflow: none.
        for (offset, len) in [(8, 4), (14, 3), (u64::MAX - 1, 4)] {
            assert_eq!(
                store.record(offset, len).err(),
                Some(CatalogError::NotFound)
            );
        }
        assert_eq!(
            segment(&[seg(5, b"x")], u64::MAX - 1, 4).err(),
            Some(CatalogError::NotFound)
        );
    }
}
