//! The index file layout, version 7. Versions 1 to 6 are read too: version 6 is version 7 without
//! inner archives (image records of archives stored as members of another image, whose members
//! the tree holds in their place); version 5 is version 6 without
//! zstd-compressed images (whose checkpoint tables are of the frames kind, which a packfs that
//! reads only up to version 5 would take for deflate restart points); version 4 is version 5
//! without compressed images (`.tar.gz`, whose image records carry a checkpoint table) and checkpointed zip
//! members; version 3 is version 4 without zip entries that carry their CRC-32 and sparse files, version 2 is version 3 without squashfs entries, version 1
//! is version 2 without deflated (zip) entries. All integers are little-endian. (A packfs that
//! reads only up to version 3 refuses a version 4 index: it would take the new encodings for
//! stored bytes.)
//!
//! ```text
//! header    128 bytes (below)
//! entries   entry_count records of 48 bytes (catalog::Entry as it is in memory)
//! names     names_len bytes: entry names, symlink targets, squashfs block maps and zip records
//! (zero padding to a multiple of 8)
//! chunks    chunk_count xxh3-64 checksums of the 64 KiB chunks of [entries, chunks)
//! images    image_count variable-size records (ImageRecord)
//! ```
//!
//! The header ends with one xxh3-64 over the header's first 120 bytes, the chunk table and the
//! image records: those are checked at open (their size grows with the number of images and
//! chunks, not of files); each data chunk is checked on first use.

use std::path::{Path, PathBuf};

use crate::source::Fingerprint;
use crate::util::le::{put32, put64, u32_at, u64_at};

pub const MAGIC: &[u8; 8] = crate::archive::INDEX_MAGIC;
pub const VERSION: u32 = 7;
/// The oldest version this packfs still reads.
pub const OLDEST_VERSION: u32 = 1;
pub const HEADER_LEN: usize = 128;
pub const CHUNK_SIZE: usize = 64 * 1024;
pub const ENTRY_SIZE: usize = std::mem::size_of::<crate::catalog::Entry>();
/// Where the checksum sits in the header; it covers the bytes before it.
pub const HASHED_HEADER: usize = 120;

/// The fixed header, decoded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub version: u32,
    pub entry_count: u64,
    pub file_count: u64,
    pub file_bytes: u64,
    pub entries_off: u64,
    pub names_off: u64,
    pub names_len: u64,
    pub chunks_off: u64,
    pub chunk_count: u64,
    pub images_off: u64,
    pub images_len: u64,
    pub image_count: u32,
    /// Members the scan that wrote the index left out (bytes 108..116; zero in indexes written
    /// before they were kept, which readers of those versions ignore).
    pub skipped: crate::catalog::Skipped,
    pub meta_hash: u64,
}

impl Header {
    /// Lays out the sections for the given table sizes.
    pub fn layout(entry_count: u64, names_len: u64, images_len: u64, image_count: u32) -> Header {
        let entries_off = HEADER_LEN as u64;
        let names_off = entries_off + entry_count * ENTRY_SIZE as u64;
        let body_end = names_off + names_len;
        let chunks_off = body_end.next_multiple_of(8);
        let chunk_count = (chunks_off - entries_off).div_ceil(CHUNK_SIZE as u64);
        Header {
            version: VERSION,
            entry_count,
            entries_off,
            names_off,
            names_len,
            chunks_off,
            chunk_count,
            images_off: chunks_off + chunk_count * 8,
            images_len,
            image_count,
            ..Header::default()
        }
    }

    pub fn file_len(&self) -> u64 {
        self.images_off.saturating_add(self.images_len)
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[..8].copy_from_slice(MAGIC);
        put32(&mut b, 8, self.version);
        put32(&mut b, 12, HEADER_LEN as u32);
        put32(&mut b, 16, ENTRY_SIZE as u32);
        put32(&mut b, 20, CHUNK_SIZE as u32);
        for (at, v) in [
            (24, self.entry_count),
            (32, self.file_count),
            (40, self.file_bytes),
            (48, self.entries_off),
            (56, self.names_off),
            (64, self.names_len),
            (72, self.chunks_off),
            (80, self.chunk_count),
            (88, self.images_off),
            (96, self.images_len),
        ] {
            put64(&mut b, at, v);
        }
        put32(&mut b, 104, self.image_count);
        let at_most_u32 = |n: u64| n.min(u32::MAX as u64) as u32;
        put32(&mut b, 108, at_most_u32(self.skipped.members));
        put32(&mut b, 112, at_most_u32(self.skipped.damaged_headers));
        put64(&mut b, HASHED_HEADER, self.meta_hash);
        b
    }

    /// Decodes and checks a header against the file length. The errors are sentences about the
    /// file, without its name.
    pub fn decode(b: &[u8], file_len: u64) -> Result<Header, String> {
        if b.len() < 8 || &b[..8] != MAGIC {
            return Err("not a packfs index (no PACKFSIX magic at the start)".into());
        }
        if b.len() < 12 {
            return Err(format!("truncated: {} bytes", b.len()));
        }
        let version = u32_at(b, 8);
        if !(OLDEST_VERSION..=VERSION).contains(&version) {
            return Err(format!(
                "index format version {version}, this packfs reads versions {OLDEST_VERSION} to \
                 {VERSION}; rebuild the index with this packfs (`packfs index`)"
            ));
        }
        if b.len() < HEADER_LEN {
            return Err(format!(
                "truncated: {} bytes, the header alone has {HEADER_LEN}",
                b.len()
            ));
        }
        let fixed = [
            (12, HEADER_LEN as u32, "header size"),
            (16, ENTRY_SIZE as u32, "entry size"),
            (20, CHUNK_SIZE as u32, "chunk size"),
        ];
        for (at, want, what) in fixed {
            if u32_at(b, at) != want {
                return Err(format!("{what} is {}, expected {want}", u32_at(b, at)));
            }
        }
        let h = Header {
            version,
            entry_count: u64_at(b, 24),
            file_count: u64_at(b, 32),
            file_bytes: u64_at(b, 40),
            entries_off: u64_at(b, 48),
            names_off: u64_at(b, 56),
            names_len: u64_at(b, 64),
            chunks_off: u64_at(b, 72),
            chunk_count: u64_at(b, 80),
            images_off: u64_at(b, 88),
            images_len: u64_at(b, 96),
            image_count: u32_at(b, 104),
            skipped: crate::catalog::Skipped {
                members: u32_at(b, 108) as u64,
                damaged_headers: u32_at(b, 112) as u64,
            },
            meta_hash: u64_at(b, HASHED_HEADER),
        };
        // The layout is a function of the sizes: anything else is damage.
        let expected = Header::layout(
            h.entry_count.min(u32::MAX as u64),
            h.names_len.min(1 << 48),
            h.images_len.min(1 << 40),
            h.image_count,
        );
        let same_layout = (
            h.entries_off,
            h.names_off,
            h.chunks_off,
            h.chunk_count,
            h.images_off,
        ) == (
            expected.entries_off,
            expected.names_off,
            expected.chunks_off,
            expected.chunk_count,
            expected.images_off,
        );
        if h.entry_count == 0 || h.entry_count > u32::MAX as u64 || !same_layout {
            return Err("the header is damaged (its section table is inconsistent)".into());
        }
        if h.file_len() != file_len {
            return Err(format!(
                "the file has {file_len} bytes but its header describes {} (truncated or \
                 appended to?)",
                h.file_len()
            ));
        }
        Ok(h)
    }
}

/// One image as recorded in the index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRecord {
    /// Relative to the index file's directory, so a dataset folder can move as a whole.
    pub relative: PathBuf,
    /// Absolute path at index time, tried when the relative one does not exist.
    pub absolute: PathBuf,
    pub fingerprint: Fingerprint,
    /// Arena offset of a compressed image's checkpoint table (`ImageInfo::stream`).
    pub stream: Option<u64>,
    /// For an inner archive (version 7): where it lies in its outer image. Its `relative` is its
    /// member's path in that image, its `absolute` empty; its fingerprint is the outer image's.
    pub within: Option<InnerRecord>,
}

/// Where an inner archive lies: the outer image's number (lower than its own), and its bytes'
/// offset and length there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InnerRecord {
    pub outer: u32,
    pub base: u64,
    pub len: u64,
}

/// Bytes of an `InnerRecord`: the outer image's number, 4 bytes of padding, base and length.
const INNER_LEN: usize = 24;

/// Record tags. Images of every format have the same record (the format is found from the
/// image's bytes), so it has kept its first value, which once meant tar; a compressed image's
/// record (version 5) carries the offset of its checkpoint table after the paths' lengths.
const FORMAT_TAR: u32 = 1;
const COMPRESSED: u32 = 2;
/// An inner archive's record (version 7): an `InnerRecord` after the checkpoint table's offset,
/// if any.
const INNER: u32 = 3;
const INNER_COMPRESSED: u32 = 4;

impl ImageRecord {
    pub fn encode(&self, out: &mut Vec<u8>) {
        use std::os::unix::ffi::OsStrExt;
        let (rel, abs) = (
            self.relative.as_os_str().as_bytes(),
            self.absolute.as_os_str().as_bytes(),
        );
        let fp = &self.fingerprint;
        out.extend_from_slice(&fp.size.to_le_bytes());
        out.extend_from_slice(&fp.mtime.to_le_bytes());
        out.extend_from_slice(&fp.mtime_nsec.to_le_bytes());
        let tag = match (self.stream, self.within) {
            (None, None) => FORMAT_TAR,
            (Some(_), None) => COMPRESSED,
            (None, Some(_)) => INNER,
            (Some(_), Some(_)) => INNER_COMPRESSED,
        };
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&fp.head.to_le_bytes());
        out.extend_from_slice(&fp.tail.to_le_bytes());
        out.extend_from_slice(&(rel.len() as u32).to_le_bytes());
        out.extend_from_slice(&(abs.len() as u32).to_le_bytes());
        if let Some(table) = self.stream {
            out.extend_from_slice(&table.to_le_bytes());
        }
        if let Some(inner) = self.within {
            out.extend_from_slice(&inner.outer.to_le_bytes());
            out.extend_from_slice(&[0; 4]);
            out.extend_from_slice(&inner.base.to_le_bytes());
            out.extend_from_slice(&inner.len.to_le_bytes());
        }
        out.extend_from_slice(rel);
        out.extend_from_slice(abs);
        out.resize(out.len().next_multiple_of(8), 0);
    }

    /// Decodes `count` records; `None` if they do not fit the bytes exactly.
    pub fn decode_all(mut b: &[u8], count: u32) -> Option<Vec<ImageRecord>> {
        use std::os::unix::ffi::OsStrExt;
        const FIXED: usize = 48;
        // `count` is untrusted: reserve no more records than the bytes can hold.
        let mut out = Vec::with_capacity((count as usize).min(b.len() / FIXED));
        for _ in 0..count {
            if b.len() < FIXED {
                return None;
            }
            let tag = u32_at(b, 20);
            let (mut fixed, stream) = match tag {
                FORMAT_TAR | INNER => (FIXED, None),
                COMPRESSED | INNER_COMPRESSED if b.len() >= FIXED + 8 => {
                    (FIXED + 8, Some(u64_at(b, FIXED)))
                }
                _ => return None,
            };
            let mut within = None;
            if matches!(tag, INNER | INNER_COMPRESSED) {
                if b.len() < fixed + INNER_LEN {
                    return None;
                }
                within = Some(InnerRecord {
                    outer: u32_at(b, fixed),
                    base: u64_at(b, fixed + 8),
                    len: u64_at(b, fixed + 16),
                });
                fixed += INNER_LEN;
            }
            let (rel_len, abs_len) = (u32_at(b, 40) as usize, u32_at(b, 44) as usize);
            let len = (fixed + rel_len).checked_add(abs_len)?.next_multiple_of(8);
            if b.len() < len {
                return None;
            }
            let path = |from: usize, n: usize| {
                PathBuf::from(std::ffi::OsStr::from_bytes(&b[from..from + n]))
            };
            out.push(ImageRecord {
                fingerprint: Fingerprint {
                    size: u64_at(b, 0),
                    mtime: u64_at(b, 8) as i64,
                    mtime_nsec: u32_at(b, 16),
                    head: u64_at(b, 24),
                    tail: u64_at(b, 32),
                },
                relative: path(fixed, rel_len),
                absolute: path(fixed + rel_len, abs_len),
                stream,
                within,
            });
            b = &b[len..];
        }
        b.is_empty().then_some(out)
    }
}

/// `target` relative to directory `base`, both absolute and lexically normal.
pub fn relative_to(target: &Path, base: &Path) -> PathBuf {
    let t: Vec<_> = target.components().collect();
    let b: Vec<_> = base.components().collect();
    let common = t.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut out = PathBuf::new();
    for _ in common..b.len() {
        out.push("..");
    }
    for c in &t[common..] {
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_layout_checks() {
        let mut h = Header::layout(1000, 12_345, 200, 3);
        h.file_count = 990;
        h.meta_hash = 42;
        let bytes = h.encode();
        assert_eq!(Header::decode(&bytes, h.file_len()), Ok(h.clone()));
        assert!(
            Header::decode(&bytes, h.file_len() - 1)
                .unwrap_err()
                .contains("truncated")
        );
        let mut other = bytes;
        other[8] = 8;
        assert!(
            Header::decode(&other, h.file_len())
                .unwrap_err()
                .contains("version 8")
        );
        let mut damaged = bytes;
        damaged[57] ^= 1;
        assert!(
            Header::decode(&damaged, h.file_len())
                .unwrap_err()
                .contains("damaged")
        );
        assert!(
            Header::decode(b"hello", 5)
                .unwrap_err()
                .contains("not a packfs index")
        );
    }

    #[test]
    fn image_records_round_trip() {
        let rec = |r: &str, a: &str| ImageRecord {
            relative: r.into(),
            absolute: a.into(),
            fingerprint: Fingerprint {
                size: 10,
                mtime: -5,
                mtime_nsec: 7,
                head: 1,
                tail: 2,
            },
            stream: None,
            within: None,
        };
        let mut gz = rec("c.tar.gz", "/d/c.tar.gz");
        gz.stream = Some(12345);
        let inner = InnerRecord {
            outer: 0,
            base: 1536,
            len: 10240,
        };
        let mut class = rec("n01440764.tar", "");
        class.within = Some(inner);
        let mut inner_gz = rec("x/y.tar.gz", "");
        inner_gz.stream = Some(99);
        inner_gz.within = Some(inner);
        let recs = vec![
            rec("a.tar", "/d/a.tar"),
            rec("../x/b.tar", "/x/b.tar"),
            gz,
            class,
            inner_gz,
        ];
        let mut buf = Vec::new();
        recs.iter().for_each(|r| r.encode(&mut buf));
        assert_eq!(ImageRecord::decode_all(&buf, 5), Some(recs));
        assert_eq!(ImageRecord::decode_all(&buf[..buf.len() - 8], 5), None);
        assert_eq!(ImageRecord::decode_all(&buf, 1), None);
    }

    #[test]
    fn relative_paths() {
        let rel = |t: &str, b: &str| relative_to(Path::new(t), Path::new(b));
        assert_eq!(rel("/d/s/a.tar", "/d/s"), PathBuf::from("a.tar"));
        assert_eq!(rel("/d/s/a.tar", "/d/idx"), PathBuf::from("../s/a.tar"));
        assert_eq!(rel("/x/a.tar", "/"), PathBuf::from("x/a.tar"));
    }
}
