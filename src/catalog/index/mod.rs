//! The persisted index: a merged catalog written once (`packfs index`) and mapped at mount.
//!
//! Opening one checks the header, the image table and the chunk checksums' own checksum, and maps
//! the rest: the cost does not depend on the number of files. See `format` for the layout.

mod format;

use std::io::{BufWriter, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use xxhash_rust::xxh3::Xxh3;

use super::store::{Chunks, Mapped, Part, Store};
use super::{Catalog, CatalogError, Entry, ImageInfo, ROOT};
use crate::source::{ImageLocation, Stores};
use format::{CHUNK_SIZE, HASHED_HEADER, HEADER_LEN, Header, ImageRecord, InnerRecord};

pub use format::{MAGIC, VERSION};

const _: () = assert!(
    cfg!(target_endian = "little"),
    "the index maps little-endian records as they are"
);

/// Why an index cannot be written or used.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// A file operation failed; `what` says which, e.g. "cannot open index".
    #[error("{what} {}: {error}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
    /// Not an index this packfs reads; `reason` is a sentence about the file.
    #[error("index {}: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
    #[error("index {} is damaged: {what}; rebuild it with `packfs index`", path.display())]
    Damaged { path: PathBuf, what: &'static str },
    #[error(
        "index {}: image {} is missing: it is not at {}; if the images moved, pass \
         --images-dir DIR (the directory that holds them now), or rebuild the index with \
         `packfs index`",
        index.display(),
        relative.display(),
        places
    )]
    MissingImage {
        index: PathBuf,
        relative: PathBuf,
        /// Where it was looked for, each place once.
        places: String,
    },
    #[error("cannot write an index from a damaged one: {0}")]
    DamagedCatalog(#[from] CatalogError),
    #[error("cannot index more than 4 billion images")]
    TooManyImages,
    #[error(
        "refusing to replace {}: it is {what}, not a packfs index; choose another path (e.g. \
         DATASET.packfs-index), or pass --force to replace it",
        path.display()
    )]
    WouldReplace { path: PathBuf, what: String },
}

/// Checks that writing an index to `dest` loses nothing: it must not exist, or be an index
/// (rebuilt in place) or, with `force`, anything. `packfs index -o shard-000001.tar` once
/// replaced a tar shard.
pub fn check_replaceable(dest: &Path, force: bool) -> Result<(), IndexError> {
    let Ok(meta) = std::fs::symlink_metadata(dest) else {
        return Ok(());
    };
    // An empty file holds nothing to lose.
    if force || (meta.is_file() && (meta.len() == 0 || file_is_index(dest))) {
        return Ok(());
    }
    let what = if meta.is_dir() {
        "a directory".to_string()
    } else if meta.is_symlink() {
        "a symbolic link".to_string()
    } else if !meta.is_file() {
        "not a regular file".to_string()
    } else {
        let format = crate::source::read_at::open_regular(dest)
            .and_then(|f| crate::archive::Registry::standard().detect(&f, meta.len()));
        match format {
            // What no format claims would be scanned as tar.
            Ok(f) if f.what != crate::archive::registry::TAR.what => f.what.to_string(),
            _ => format!("a file of {} bytes (a tar image?)", meta.len()),
        }
    };
    Err(IndexError::WouldReplace {
        path: dest.to_path_buf(),
        what,
    })
}

fn io_error(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> IndexError {
    let path = path.to_path_buf();
    move |error| IndexError::Io { what, path, error }
}

/// What `write` produced.
#[derive(Clone, Copy, Debug)]
pub struct Written {
    pub bytes: u64,
    pub entries: u64,
}

/// True if `path` (a file, or an object in `stores`) starts with the index magic (false for
/// anything unreadable).
pub fn is_index(path: &Path, stores: &Stores) -> bool {
    let mut magic = [0u8; 8];
    ImageLocation::new(path)
        .reader(stores)
        .and_then(|r| r.read_exact_at(&mut magic, 0))
        .is_ok_and(|_| &magic == MAGIC)
}

/// `is_index` of a local file.
fn file_is_index(path: &Path) -> bool {
    let mut magic = [0u8; 8];
    crate::source::read_at::open_regular(path)
        .and_then(|f| std::os::unix::fs::FileExt::read_exact_at(&f, &mut magic, 0))
        .is_ok_and(|_| &magic == MAGIC)
}

/// Writes `catalog` to `dest` atomically (a temporary file renamed into place, synced to disk
/// first), image paths recorded relative to `dest`'s directory as well as absolute.
pub fn write(catalog: &Catalog, dest: &Path) -> Result<Written, IndexError> {
    write_synced(catalog, dest, true)
}

/// `write`, synced to disk before the rename only if `sync` (a sync on a busy file system may
/// wait for other files' data: `packfs pack` syncs the index when it syncs the shards).
pub fn write_synced(catalog: &Catalog, dest: &Path, sync: bool) -> Result<Written, IndexError> {
    let dest = std::path::absolute(dest).map_err(io_error("bad path", dest))?;
    let dir = dest.parent().unwrap_or(Path::new("/"));
    let (entries, names) = catalog.tables()?;
    // SAFETY: Entry is plain integers without padding (asserted in entry.rs).
    let entry_bytes = unsafe {
        std::slice::from_raw_parts(
            entries.as_ptr() as *const u8,
            std::mem::size_of_val(entries),
        )
    };

    let mut images = Vec::new();
    for (i, image) in catalog.images().iter().enumerate() {
        let (relative, absolute, within) = match &image.location {
            // An object's URL is its own name wherever the index goes.
            ImageLocation::Object(url) => (url.clone(), url.clone(), None),
            ImageLocation::File(path) => (format::relative_to(path, dir), path.clone(), None),
            ImageLocation::Within(w) => {
                let outer = image.within.filter(|&o| (o as usize) < i).ok_or_else(|| {
                    IndexError::Invalid {
                        path: dest.clone(),
                        reason: format!("{} has no outer image before it", w.member.display()),
                    }
                })?;
                let inner = InnerRecord {
                    outer,
                    base: w.base,
                    len: w.len,
                };
                (w.member.clone(), PathBuf::new(), Some(inner))
            }
        };
        ImageRecord {
            relative,
            absolute,
            fingerprint: image.fingerprint,
            stream: image.stream,
            within,
        }
        .encode(&mut images);
    }
    let names_len: u64 = names.iter().map(Part::len).sum();
    let mut header = Header::layout(
        entries.len() as u64,
        names_len,
        images.len() as u64,
        u32::try_from(catalog.images().len()).map_err(|_| IndexError::TooManyImages)?,
    );
    header.file_count = catalog.file_count();
    header.file_bytes = catalog.file_bytes();
    header.skipped = catalog.skipped();

    let tmp = tempfile::Builder::new()
        .prefix(".packfs-index-")
        .tempfile_in(dir)
        .map_err(io_error("cannot create a file in", dir))?;
    // One pass: the body is written and its chunks hashed as it goes (the checkpoint tables of
    // a big .tar.gz are gigabytes, copied from their spill files, never held); the header,
    // which holds the hash of the chunk table, goes in last.
    let written = (|| -> std::io::Result<Vec<u8>> {
        let mut out = BufWriter::with_capacity(1 << 20, tmp.as_file());
        out.write_all(&[0u8; HEADER_LEN])?;
        let mut body = ChunkHasher::new(out);
        body.write_all(entry_bytes)?;
        for part in &names {
            match part {
                Part::Bytes(bytes) => body.write_all(bytes)?,
                Part::File(file, len) => copy_file(file, *len, &mut body)?,
            }
        }
        // The chunks cover the padding after the names too: every byte of the file is checked.
        let padding = header.chunks_off - header.names_off - header.names_len;
        body.write_all(&[0u8; 8][..padding as usize])?;
        let (mut out, chunk_table) = body.finish();
        out.write_all(&chunk_table)?;
        out.write_all(&images)?;
        out.flush()?;
        Ok(chunk_table)
    })();
    let chunk_table = written.map_err(io_error("cannot write", &dest))?;
    debug_assert_eq!(chunk_table.len() as u64, header.chunk_count * 8);
    let mut meta = Xxh3::new();
    meta.update(&header.encode()[..HASHED_HEADER]);
    meta.update(&chunk_table);
    meta.update(&images);
    header.meta_hash = meta.digest();
    {
        use std::os::unix::fs::FileExt;
        tmp.as_file()
            .write_all_at(&header.encode(), 0)
            .map_err(io_error("cannot write", &dest))?;
    }
    let file = tmp.as_file();
    // Readable by everybody who can read the images (a temporary file starts as 0600).
    file.set_permissions(std::fs::Permissions::from_mode(0o644))
        .map_err(io_error("cannot write", &dest))?;
    if sync {
        file.sync_all().map_err(io_error("cannot write", &dest))?;
    }
    tmp.persist(&dest)
        .map_err(|e| io_error("cannot create", &dest)(e.error))?;
    Ok(Written {
        bytes: header.file_len(),
        entries: header.entry_count,
    })
}

/// A writer that passes bytes on and hashes them in `CHUNK_SIZE` chunks (xxh3-64 each, the
/// index's chunk table).
struct ChunkHasher<W: Write> {
    out: W,
    hasher: Xxh3,
    in_chunk: usize,
    table: Vec<u8>,
}

impl<W: Write> ChunkHasher<W> {
    fn new(out: W) -> Self {
        ChunkHasher {
            out,
            hasher: Xxh3::new(),
            in_chunk: 0,
            table: Vec::new(),
        }
    }

    /// The writer, and the chunk table (the last chunk may be short).
    fn finish(mut self) -> (W, Vec<u8>) {
        if self.in_chunk > 0 {
            self.table
                .extend_from_slice(&self.hasher.digest().to_le_bytes());
        }
        (self.out, self.table)
    }
}

impl<W: Write> Write for ChunkHasher<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let take = buf.len().min(CHUNK_SIZE - self.in_chunk);
        let n = self.out.write(&buf[..take])?;
        self.hasher.update(&buf[..n]);
        self.in_chunk += n;
        if self.in_chunk == CHUNK_SIZE {
            self.table
                .extend_from_slice(&self.hasher.digest().to_le_bytes());
            self.hasher.reset();
            self.in_chunk = 0;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// Copies the first `len` bytes of `file` to `out` with positioned reads through one buffer
/// (not through a mapping, which would count every byte in the process's memory).
fn copy_file(file: &std::fs::File, len: u64, out: &mut impl Write) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    while at < len {
        let n = ((len - at) as usize).min(buf.len());
        file.read_exact_at(&mut buf[..n], at)?;
        out.write_all(&buf[..n])?;
        at += n as u64;
    }
    Ok(())
}

/// Maps an index and checks everything whose size does not grow with the number of files; the
/// images are resolved (relative to the index first) but not opened. An index kept in an
/// object store is read from `stores`.
pub fn open(path: &Path, stores: &Stores) -> Result<Catalog, IndexError> {
    open_with(path, None, stores)
}

/// As `open`, looking for the images in `images_dir` first (by file name) when given: for
/// images that moved since the index was written.
pub fn open_with(
    path: &Path,
    images_dir: Option<&Path>,
    stores: &Stores,
) -> Result<Catalog, IndexError> {
    if ImageLocation::new(path).is_object() {
        return open_remote(path, stores);
    }
    let path = std::path::absolute(path).map_err(io_error("bad path", path))?;
    let file = crate::source::read_at::open_regular(&path)
        .map_err(io_error("cannot open index", &path))?;
    let len = file
        .metadata()
        .map_err(io_error("cannot stat index", &path))?
        .len();
    if len < HEADER_LEN as u64 {
        let mut head = Vec::new();
        use std::io::Read;
        (&file)
            .take(HEADER_LEN as u64)
            .read_to_end(&mut head)
            .map_err(io_error("cannot read index", &path))?;
        let reason = Header::decode(&head, len).err().unwrap_or_default();
        return Err(IndexError::Invalid { path, reason });
    }
    // SAFETY: the mapping is read-only. Index files are replaced by rename, never rewritten in
    // place; a file truncated under a running daemon would fault (documented).
    let map = unsafe { Mmap::map(&file) }.map_err(io_error("cannot map index", &path))?;
    let locate_beside = |r: &ImageRecord| locate(&path, r, images_dir);
    from_map(map, &path, Some(file), locate_beside)
}

/// An index held in memory, its images taken as recorded (absolute paths, not looked for): for
/// fuzzing and for tests that craft indexes. Checked exactly as a file is.
#[doc(hidden)]
pub fn open_bytes(bytes: &[u8]) -> Result<Catalog, IndexError> {
    let path = PathBuf::from("(in memory)");
    let map = map_filled(bytes.len(), &path, |buf| {
        buf.copy_from_slice(bytes);
        Ok(())
    })?;
    from_map(map, &path, None, |r| Ok(r.absolute.clone()))
}

/// Largest index read from a store whole (a 2 M-file index is ~150 MB).
const MAX_REMOTE_INDEX: u64 = 4 << 30;

/// An index kept in an object store (`s3://bucket/train.packfs-index`), read whole into memory.
/// Its images are taken as recorded: URLs, or absolute paths on this node.
fn open_remote(url: &Path, stores: &Stores) -> Result<Catalog, IndexError> {
    let object = crate::source::remote::RemoteObject::open(stores, url)
        .map_err(io_error("cannot read index", url))?;
    if object.size() > MAX_REMOTE_INDEX {
        let error = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{} is {} bytes, more than an index may be ({MAX_REMOTE_INDEX})",
                url.display(),
                object.size()
            ),
        );
        return Err(io_error("cannot read index", url)(error));
    }
    // Read straight into the mapping: no second copy of an index of up to 4 GiB.
    let map = map_filled(object.size() as usize, url, |buf| object.read_into(buf))?;
    from_map(map, url, None, |r| {
        if ImageLocation::new(&r.absolute).may_exist() {
            return Ok(r.absolute.clone());
        }
        Err(IndexError::MissingImage {
            index: url.to_path_buf(),
            relative: r.relative.clone(),
            places: format!("at {} (where it was indexed)", r.absolute.display()),
        })
    })
}

/// `len` bytes written by `fill` into a read-only anonymous mapping, checked for a whole header.
fn map_filled(
    len: usize,
    path: &Path,
    fill: impl FnOnce(&mut [u8]) -> std::io::Result<()>,
) -> Result<Mmap, IndexError> {
    let path = path.to_path_buf();
    let mut anon =
        memmap2::MmapMut::map_anon(len.max(1)).map_err(io_error("cannot map index", &path))?;
    fill(&mut anon[..len]).map_err(io_error("cannot read index", &path))?;
    let map = anon
        .make_read_only()
        .map_err(io_error("cannot map index", &path))?;
    if len < HEADER_LEN {
        let reason = Header::decode(&map[..len], len as u64)
            .err()
            .unwrap_or_default();
        return Err(IndexError::Invalid { path, reason });
    }
    Ok(map)
}

/// Recomputes an index's checksums after its bytes were changed: what anyone can do, since they
/// are plain xxh3, so tests and fuzzers use it to craft indexes that pass them. False if the
/// header's sections do not fit `bytes`.
#[doc(hidden)]
pub fn reseal(bytes: &mut [u8]) -> bool {
    let Ok(header) = Header::decode(&bytes[..HEADER_LEN.min(bytes.len())], bytes.len() as u64)
    else {
        return false;
    };
    let (start, table) = (header.entries_off as usize, header.chunks_off as usize);
    for c in 0..header.chunk_count as usize {
        let from = start + c * CHUNK_SIZE;
        let hash = xxhash_rust::xxh3::xxh3_64(&bytes[from..table.min(from + CHUNK_SIZE)]);
        bytes[table + c * 8..table + c * 8 + 8].copy_from_slice(&hash.to_le_bytes());
    }
    let mut meta = Xxh3::new();
    meta.update(&bytes[..HASHED_HEADER]);
    meta.update(&bytes[table..]);
    let digest = meta.digest();
    bytes[HASHED_HEADER..HASHED_HEADER + 8].copy_from_slice(&digest.to_le_bytes());
    true
}

/// The checks and the catalog of an index mapped at `map`; `locate` finds each image.
fn from_map(
    map: Mmap,
    path: &Path,
    file: Option<std::fs::File>,
    locate: impl Fn(&ImageRecord) -> Result<PathBuf, IndexError>,
) -> Result<Catalog, IndexError> {
    let invalid = |reason: String| IndexError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    let damaged = |what| IndexError::Damaged {
        path: path.to_path_buf(),
        what,
    };
    let header = Header::decode(&map[..HEADER_LEN], map.len() as u64).map_err(invalid)?;

    let (chunks_off, images_off) = (header.chunks_off as usize, header.images_off as usize);
    let mut meta = Xxh3::new();
    meta.update(&map[..HASHED_HEADER]);
    meta.update(&map[chunks_off..]);
    if meta.digest() != header.meta_hash {
        return Err(damaged(
            "its header, chunk table or image table fails its checksum",
        ));
    }
    let records = ImageRecord::decode_all(&map[images_off..], header.image_count)
        .ok_or_else(|| invalid("the image table is malformed".into()))?;
    let mut images: Vec<ImageInfo> = Vec::with_capacity(records.len());
    for r in records {
        // The index keeps names; they are read back as locations here, once. An inner archive's
        // outer image comes before it.
        let (location, within) = match r.within {
            None => (ImageLocation::new(&locate(&r)?), None),
            Some(inner) => {
                let outer = images.get(inner.outer as usize).ok_or_else(|| {
                    invalid(format!(
                        "image {} lies within image {}, which does not come before it",
                        images.len(),
                        inner.outer
                    ))
                })?;
                let location = ImageLocation::within(
                    outer.location.clone(),
                    r.relative.clone(),
                    inner.base,
                    inner.len,
                );
                (location, Some(inner.outer))
            }
        };
        images.push(ImageInfo {
            location,
            fingerprint: r.fingerprint,
            stream: r.stream,
            within,
        });
    }

    let entries = header.entries_off as usize..header.names_off as usize;
    let names = header.names_off as usize..(header.names_off + header.names_len) as usize;
    let chunks = Chunks::new(entries.start, chunks_off, CHUNK_SIZE);
    let catalog = Catalog {
        store: Store::Mapped(Mapped {
            map,
            path: path.to_path_buf(),
            entries,
            names,
            chunks,
            file,
        }),
        images,
        file_count: header.file_count,
        file_bytes: header.file_bytes,
        skipped: header.skipped,
    };
    let root_ok = catalog
        .entry(ROOT)
        .map(Entry::is_dir)
        .map_err(|e| invalid(e.to_string()))?;
    if !root_ok {
        return Err(damaged("its first entry is not a directory"));
    }
    Ok(catalog)
}

/// An image's current path: beside the index as recorded, else where it was when indexed.
fn locate(
    index: &Path,
    record: &ImageRecord,
    images_dir: Option<&Path>,
) -> Result<PathBuf, IndexError> {
    if ImageLocation::new(&record.absolute).is_object() {
        return Ok(record.absolute.clone());
    }
    if let Some(dir) = images_dir {
        let moved = dir.join(record.relative.file_name().unwrap_or_default());
        if moved.exists() {
            return Ok(moved);
        }
    }
    let dir = index.parent().unwrap_or(Path::new("/"));
    let beside = dir.join(&record.relative);
    if beside.exists() {
        return Ok(beside);
    }
    if record.absolute.exists() {
        return Ok(record.absolute.clone());
    }
    Err(IndexError::MissingImage {
        index: index.to_path_buf(),
        relative: record.relative.clone(),
        places: missing_places(&beside, &record.absolute, images_dir),
    })
}

/// Where a missing image was looked for, each place once.
fn missing_places(beside: &Path, absolute: &Path, images_dir: Option<&Path>) -> String {
    let mut places = Vec::new();
    if let Some(dir) = images_dir {
        places.push(format!("in {} (--images-dir)", dir.display()));
    }
    places.push(format!("at {} (relative to the index)", beside.display()));
    if absolute != beside {
        places.push(format!("at {} (where it was indexed)", absolute.display()));
    }
    places.join(", nor ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use xxhash_rust::xxh3::xxh3_64;

    #[test]
    fn chunks_are_hashed_across_writes() {
        let whole: Vec<u8> = (0..CHUNK_SIZE * 2 + 100).map(|i| (i % 251) as u8).collect();
        let mut hasher = ChunkHasher::new(Vec::new());
        for piece in [
            &whole[..70],
            &whole[70..71],
            &whole[71..CHUNK_SIZE + 9],
            &whole[CHUNK_SIZE + 9..],
        ] {
            hasher.write_all(piece).unwrap();
        }
        let (out, table) = hasher.finish();
        assert_eq!(out, whole);
        let want: Vec<u8> = whole
            .chunks(CHUNK_SIZE)
            .flat_map(|c| xxh3_64(c).to_le_bytes())
            .collect();
        assert_eq!(table, want);
    }
}
