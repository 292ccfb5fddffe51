//! Executing a read plan: each piece of a file's byte range comes from where the format's planner
//! says (`archive::placement`), fetched through the image tiers. Stored bytes are read into the
//! caller's buffer; decoded units are decoded once into the RAM tier and copied out of it, or
//! shared without a copy when one unit covers the whole read.

use std::io;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::chunks::Fetch;
use super::file_range::{CHECK_BUF, FileRange};
use super::images::Images;
use super::ram_cache::{Decoded, Room};
use super::request::{ReadRequest, Tiers};
use crate::archive::placement::{Placement, check_crc};
use crate::archive::plan::{Piece, Unit, WholeCrc};
use crate::catalog::{Catalog, CatalogError};
use crate::source::mapped::Arrival;
use crate::source::read_at::{ReadAt, Wait};

/// A failed read: the image offset it failed at (for the log) and why.
#[derive(Debug)]
pub struct ReadError {
    pub image_offset: u64,
    pub error: io::Error,
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "at image offset {}: {}", self.image_offset, self.error)
    }
}

fn failed(image_offset: u64) -> impl FnOnce(io::Error) -> ReadError {
    move |error| ReadError {
        image_offset,
        error,
    }
}

/// The bytes of a read: a slice of a decoded unit, or the caller's buffer.
pub enum Served<'b> {
    Shared(Decoded, Range<usize>),
    Buffer(&'b [u8]),
}

impl Served<'_> {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Served::Shared(block, range) => &block[range.clone()],
            Served::Buffer(b) => b,
        }
    }
}

/// What hears of reads: (reader, catalog entry) -> whether a sampler listed that file.
pub type ReadNotes = Box<dyn Fn(u32, u32) -> bool + Send + Sync>;

pub struct FileReader {
    images: Arc<Images>,
    /// Hears which reader reads which file (the lookahead, once a sampler may talk to the
    /// mount), and says whether a sampler listed it.
    hints: std::sync::OnceLock<ReadNotes>,
    /// Stored files checked against their CRC-32 so far, and those that failed: a bit per
    /// catalog entry each (250 KB for a million files).
    checked: Bits,
    failed: Bits,
    /// Files read at least once: only those can be in the kernel's page cache of the mount.
    served: Bits,
    /// Where the last member checked in place ended, per image (by image number modulo its
    /// length): a check that starts right after it reads through the file's readahead.
    check_ends: Box<[AtomicU64]>,
}

/// Images whose last check's end is remembered (`FileReader::check_ends`).
const CHECK_ENDS: usize = 64;
/// A check that starts this close after the last one's end is sequential (a tar's headers lie
/// between two members; a zip's local headers and names).
const CHECK_SEQUENTIAL: u64 = 64 << 10;

/// A fixed set of bits, set without locks.
struct Bits(Box<[AtomicU64]>);

impl Bits {
    fn new(n: usize) -> Bits {
        Bits((0..n.div_ceil(64)).map(|_| AtomicU64::new(0)).collect())
    }

    fn get(&self, i: u32) -> bool {
        let (word, bit) = (i as usize / 64, 1u64 << (i % 64));
        self.0
            .get(word)
            .is_some_and(|w| w.load(Ordering::Acquire) & bit != 0)
    }

    fn set(&self, i: u32) {
        let (word, bit) = (i as usize / 64, 1u64 << (i % 64));
        if let Some(w) = self.0.get(word) {
            // Release: whoever sees `checked` set also sees `failed` set before it.
            w.fetch_or(bit, Ordering::Release);
        }
    }
}

/// Stored files up to this size are checked whole before their first partial read; larger ones
/// only when one read covers them (checking would read the whole file for a part of it).
const CHECK_LIMIT: u64 = 256 << 20;

/// Bytes read at a time while checking a stored file.
const CHECK_PIECE: u64 = 1 << 20;

fn bad_crc(at: u64, why: &str) -> ReadError {
    ReadError {
        image_offset: at,
        error: io::Error::new(io::ErrorKind::InvalidData, why.to_string()),
    }
}

/// A file to read: its catalog entry, and where and how its `size` bytes lie (`placement` in
/// `image`).
#[derive(Clone, Copy, Debug)]
pub struct Member<'a> {
    pub entry: u32,
    pub image: u32,
    pub placement: Placement<'a>,
    pub size: u64,
}

impl<'a> Member<'a> {
    /// The file with catalog entry `id`.
    pub fn of(catalog: &'a Catalog, id: u32) -> Result<Member<'a>, CatalogError> {
        let e = catalog.entry(id)?;
        Ok(Member {
            entry: id,
            image: e.image,
            placement: catalog.placement(e)?,
            size: e.size,
        })
    }
}

/// One image seen through the tiers, exactly as asked, for one request: what a unit decodes
/// from. The decoders know only `ReadAt`; the request rides along here.
struct ImageBytes<'a> {
    images: &'a Images,
    image: u32,
    req: &'a ReadRequest,
}

impl ReadAt for ImageBytes<'_> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let size = self.images.image_size(self.image);
        let n = (size.saturating_sub(offset)).min(buf.len() as u64) as usize;
        self.images
            .read_exact_at(self.req, self.image, offset, &mut buf[..n], Fetch::Exact)?;
        Ok(n)
    }
}

impl FileReader {
    /// A reader for the files of a catalog of `entries` entries.
    pub fn new(images: Arc<Images>, entries: usize) -> FileReader {
        FileReader {
            images,
            hints: std::sync::OnceLock::new(),
            checked: Bits::new(entries),
            failed: Bits::new(entries),
            served: Bits::new(entries),
            check_ends: (0..CHECK_ENDS).map(|_| AtomicU64::new(u64::MAX)).collect(),
        }
    }

    pub fn images(&self) -> &Images {
        &self.images
    }

    /// Whether catalog entry `file` was read since the lookahead started (so its pages may be in
    /// the kernel's cache of the mount).
    pub fn was_read(&self, file: u32) -> bool {
        self.served.get(file)
    }

    /// Tells `notes` of every read from now on.
    pub fn hear_reads(&self, notes: ReadNotes) {
        let _ = self.hints.set(notes);
    }

    /// Decodes the units of `file` that are not in the RAM cache into it (a sampler said it
    /// comes next); never waits for room.
    pub fn decode_ahead(&self, file: Member<'_>) -> io::Result<()> {
        let req = ReadRequest::waiting();
        for piece in file.placement.plan(file.size, 0, file.size as usize) {
            let piece = piece.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.why))?;
            if let Piece::Decoded { unit, .. } = piece {
                match self.load_unit(&req, file.image, unit, Room::IfFree) {
                    Ok(_) => {}
                    // No room now: its reader decodes it.
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Reads `len` bytes at `offset` of `file` (the range lies inside it), for `req`: which tiers
    /// served it is in `req.tiers()` after.
    pub fn read<'b>(
        &self,
        req: &ReadRequest,
        file: Member<'_>,
        offset: u64,
        len: usize,
        buf: &'b mut Vec<u8>,
    ) -> Result<Served<'b>, ReadError> {
        let Member {
            entry: file,
            image,
            placement,
            size,
        } = file;
        self.note_read(req, file, size);
        // Bytes of `buf` that hold this read. The buffer keeps its length between reads and is
        // only overwritten: clearing it first (resize with zeros) was 10% of the daemon's CPU
        // in an epoch on the simulated parallel file system (docs/benchmarks.md).
        let mut filled = 0;
        for piece in placement.plan(size, offset, len) {
            let piece = piece.map_err(|e| ReadError {
                image_offset: e.at,
                error: io::Error::new(io::ErrorKind::InvalidData, e.why),
            })?;
            match piece {
                Piece::Decoded { unit, from, len: n } => {
                    let block = self.decode(req, image, unit)?;
                    if block.get(from..from + n).is_none() {
                        return Err(ReadError {
                            image_offset: unit.at,
                            error: io::Error::new(
                                io::ErrorKind::InvalidData,
                                format!(
                                    "the plan wants bytes {from}..{} of a unit of {} bytes",
                                    from + n,
                                    block.len()
                                ),
                            ),
                        });
                    }
                    // The whole read inside one decoded unit: no copy.
                    if filled == 0 && n == len {
                        return Ok(Served::Shared(block, from..from + n));
                    }
                    room(buf, filled, n).copy_from_slice(&block[from..from + n]);
                    filled += n;
                }
                Piece::Zeros(n) => {
                    room(buf, filled, n).fill(0);
                    filled += n;
                }
                Piece::Stored { at, len: n, crc } => {
                    let whole = crc.filter(|c| c.at == at && c.len == n as u64);
                    if let Some(member) = crc.filter(|_| whole.is_none()) {
                        self.check_whole(req, file, image, member)?;
                    }
                    self.images
                        .read_exact_at(req, image, at, room(buf, filled, n), Fetch::Chunks)
                        .map_err(failed(at))?;
                    if let Some(member) = whole {
                        let bytes = room(buf, filled, n);
                        let mut outcome = check_crc(bytes, Some(member.crc));
                        if outcome.is_err() && self.again_from_source(image, at, bytes)? {
                            outcome = check_crc(bytes, Some(member.crc));
                        }
                        self.settle(file, image, member, outcome)?;
                    }
                    filled += n;
                }
            }
        }
        Ok(Served::Buffer(&buf[..filled]))
    }

    /// Tells the lookahead of a read of catalog entry `file`, and remembers it was served.
    fn note_read(&self, req: &ReadRequest, file: u32, size: u64) {
        // Noted already by the splice path that declined it (`file_range`): once per read.
        if req.file() == Some(file) {
            return;
        }
        req.set_file(file, size);
        if let Some(hints) = self.hints.get() {
            if hints(req.reader(), file) {
                req.set_listed();
            }
            if !self.served.get(file) {
                self.served.set(file);
            }
        }
    }

    /// The read of `len` bytes at `offset` of `file` as a range of an image file, when its
    /// bytes lie stored in one piece and would be read straight from the source
    /// (`Images::file_range`); `None` when `read` must serve it.
    ///
    /// A stored member with a CRC-32 not yet checked is checked here first, in the image's page
    /// cache (`FileRange::crc32_around`: a mapping, or one copy for a small member): its pages
    /// come into the page cache once, are checked there, and this reply and the ones after it splice them. A mismatch, or a file
    /// that cannot be mapped, goes to `read`, which reads the member to check it and reports
    /// what it finds.
    pub fn file_range(
        &self,
        req: &ReadRequest,
        file: Member<'_>,
        offset: u64,
        len: usize,
    ) -> Option<FileRange<'_>> {
        let mut pieces = file.placement.plan(file.size, offset, len);
        let (Some(Ok(Piece::Stored { at, len: n, crc })), None) = (pieces.next(), pieces.next())
        else {
            return None;
        };
        if n != len {
            return None;
        }
        // Whether the member must be checked before this reply: not yet checked, and either
        // small enough to check whole for a part of it, or read whole now.
        let mut check = None;
        if let Some(member) = crc {
            let whole = member.at == at && member.len == n as u64;
            match self.checked.get(file.entry) {
                true if self.failed.get(file.entry) => return None,
                true => {}
                false if whole || member.len <= CHECK_LIMIT => check = Some(member),
                // A part of a file too large to check for it (`check_whole`).
                false => {}
            }
        }
        let range = self.images.file_range(req, file.image, at, n, || {
            self.note_read(req, file.entry, file.size)
        })?;
        if let Some(member) = check {
            let back = at.checked_sub(member.at)?;
            let end = &self.check_ends[file.image as usize % CHECK_ENDS];
            let last = end.swap(member.at + member.len, Ordering::Relaxed);
            let arrival = match member.at.checked_sub(last) {
                Some(gap) if gap <= CHECK_SEQUENTIAL => Arrival::Sequential,
                _ => Arrival::Whole,
            };
            match range.crc32_around(back, member.len, arrival)? {
                Ok(got) if got == member.crc => self.checked.set(file.entry),
                _ => return None,
            }
        }
        Some(range)
    }

    /// Checks a stored file against its CRC-32 before a read serves part of it: once per daemon
    /// lifetime, reading it in bounded pieces (no more memory than one piece). Files larger than
    /// `CHECK_LIMIT` are checked only when a read covers them whole.
    fn check_whole(
        &self,
        req: &ReadRequest,
        file: u32,
        image: u32,
        member: WholeCrc,
    ) -> Result<(), ReadError> {
        if member.len > CHECK_LIMIT {
            return Ok(());
        }
        if self.checked.get(file) {
            return match self.failed.get(file) {
                false => Ok(()),
                true => Err(bad_crc(
                    member.at,
                    "bad CRC-32 (found earlier): the member is damaged",
                )),
            };
        }
        let mut got = crc_in_pieces(member, |at, piece| {
            self.images
                .read_exact_at(req, image, at, piece, Fetch::Exact)
        })?;
        // Bytes another node gave: from the image's own source again.
        if got != member.crc && self.images.source().distrust(image) {
            got = crc_in_pieces(member, |at, piece| {
                self.images
                    .source()
                    .read_exact_at(image, at, piece, Wait::May)
            })?;
        }
        let outcome = if got == member.crc {
            Ok(())
        } else {
            Err(format!(
                "bad CRC-32: the archive records {:08x}, the bytes have {got:08x} (the member is \
                 damaged)",
                member.crc
            ))
        };
        self.settle(file, image, member, outcome)
    }

    /// Reads `buf` at `at` of `image` again from its own source when its bytes came from another
    /// node of the job (which is not asked again): a peer's bytes that fail the index's CRC-32
    /// cost a read of the source, never the reader an error. False when they came from the
    /// source already.
    fn again_from_source(&self, image: u32, at: u64, buf: &mut [u8]) -> Result<bool, ReadError> {
        if !self.images.source().distrust(image) {
            return Ok(false);
        }
        self.images
            .source()
            .read_exact_at(image, at, buf, Wait::May)
            .map_err(failed(at))?;
        Ok(true)
    }

    /// Remembers the outcome of a check, and turns a failed one into this read's error. A
    /// failed one also checks the image at once: a rewrite under the mount shows here first
    /// (the watcher checks the images in turn), and from then on every file of it fails.
    fn settle(
        &self,
        file: u32,
        image: u32,
        member: WholeCrc,
        outcome: Result<(), String>,
    ) -> Result<(), ReadError> {
        if outcome.is_err() {
            self.failed.set(file);
            self.images.source().check(image);
        }
        self.checked.set(file);
        outcome.map_err(|why| bad_crc(member.at, &why))
    }

    /// `unit` of `image` from the RAM cache, or decoded into it through the tiers (with `room`
    /// for its memory); whether this call decoded it. For readers and the lookahead alike.
    fn load_unit(
        &self,
        req: &ReadRequest,
        image: u32,
        unit: Unit,
        room: Room,
    ) -> io::Result<(Decoded, bool)> {
        let images = &*self.images;
        images
            .ram()
            .fetch(image, unit.key(), unit.memory(), room, || {
                unit.decode(&ImageBytes { images, image, req })
            })
    }

    /// A unit's decoded bytes, decoded once per cache lifetime.
    /// A reader that finds the unit being decoded by another thread (the lookahead, another
    /// reader) waits for it: a wait on storage, counted (its own decode counts its own reads).
    fn decode(&self, req: &ReadRequest, image: u32, unit: Unit) -> Result<Decoded, ReadError> {
        let room = Room::for_read(req.wait());
        let held = self.images.ram().contains(image, unit.key());
        let began = std::time::Instant::now();
        let (block, loaded) = self
            .load_unit(req, image, unit, room)
            .map_err(failed(unit.at))?;
        if !loaded {
            req.served_by(Tiers::RAM);
            if !held {
                self.images.waits().add_after(began.elapsed(), req.reader());
            }
        }
        Ok(block)
    }
}

/// The CRC-32 of `member`, its bytes read by `read` `CHECK_PIECE` at a time into this thread's
/// buffer (no more memory than one piece).
fn crc_in_pieces(
    member: WholeCrc,
    mut read: impl FnMut(u64, &mut [u8]) -> io::Result<()>,
) -> Result<u32, ReadError> {
    let mut hasher = crc32fast::Hasher::new();
    CHECK_BUF.with_borrow_mut(|piece| {
        let mut done = 0;
        while done < member.len {
            let n = (member.len - done).min(CHECK_PIECE) as usize;
            piece.resize(n, 0);
            let at = member.at + done;
            read(at, piece).map_err(failed(at))?;
            hasher.update(piece);
            done += n as u64;
        }
        Ok(hasher.finalize())
    })
}

/// `n` bytes of `buf` from `at`, to be overwritten: the buffer grows (with zeros) only past what
/// earlier reads already initialized.
fn room(buf: &mut Vec<u8>, at: usize, n: usize) -> &mut [u8] {
    if buf.len() < at + n {
        buf.resize(at + n, 0);
    }
    &mut buf[at..at + n]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::placement::Placement;
    use crate::source::read_at::on_local_disk;
    use crate::tiers::{OpenedImage, OpenedImages};
    use std::sync::atomic::AtomicUsize;

    /// A reader of one image holding `data` (through `file` if given), and how many reads it
    /// heard of.
    fn reader(data: Arc<dyn ReadAt>, size: u64) -> (FileReader, Arc<AtomicUsize>) {
        reader_by(data, size, false)
    }

    /// `reader`, every image read in whole chunks if `chunks`.
    fn reader_by(data: Arc<dyn ReadAt>, size: u64, chunks: bool) -> (FileReader, Arc<AtomicUsize>) {
        let source = Arc::new(OpenedImages::new(vec![OpenedImage {
            path: "image.tar".into(),
            data,
            size,
        }]));
        let images = Arc::new(Images::new(source, 16 << 20, 1 << 20, chunks, None));
        let files = FileReader::new(images, 1);
        let heard = Arc::new(AtomicUsize::new(0));
        let count = heard.clone();
        files.hear_reads(Box::new(move |_, _| {
            count.fetch_add(1, Ordering::Relaxed);
            false
        }));
        (files, heard)
    }

    fn member(size: u64) -> Member<'static> {
        Member {
            entry: 0,
            image: 0,
            placement: Placement::Stored { at: 512, crc: None },
            size,
        }
    }

    /// Asking whether a read can be spliced tells nobody of the read unless it will be: on an
    /// image that is not a plain file on a local disk (memory here, a parallel file system or a
    /// store in use), `read` then notes it, and a second note moved the lookahead's heads and
    /// the walk detector twice per read.
    #[test]
    fn a_read_that_cannot_be_spliced_is_not_noted_by_asking() {
        let (files, heard) = reader(Arc::new(vec![7u8; 4096]), 4096);
        let req = ReadRequest::new(1, Wait::May);
        assert!(files.file_range(&req, member(1000), 0, 1000).is_none());
        assert_eq!(heard.load(Ordering::Relaxed), 0);

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("image.tar");
        std::fs::write(&path, vec![7u8; 4096]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let local = on_local_disk(std::os::fd::AsFd::as_fd(&file));
        let (files, heard) = reader(Arc::new(file), 4096);
        let range = files.file_range(&req, member(1000), 0, 1000);
        assert_eq!(
            range.is_some(),
            local,
            "a plain file on a local disk is spliced"
        );
        assert_eq!(heard.load(Ordering::Relaxed), usize::from(local));
    }

    /// A read the splice path declines (its image goes by chunks) is noted and located once:
    /// the read that followed noted it again and planned it again, so the lookahead's heads and
    /// the walk detector heard of every such read twice.
    #[test]
    fn a_read_declined_for_splicing_is_noted_and_located_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("image.tar");
        let bytes: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let (files, heard) = reader_by(Arc::new(file), 4096, true);
        let req = ReadRequest::new(1, Wait::May);
        assert!(files.file_range(&req, member(1000), 0, 1000).is_none());
        let mut buf = Vec::new();
        let served = files.read(&req, member(1000), 0, 1000, &mut buf).unwrap();
        assert_eq!(served.bytes(), &bytes[512..1512]);
        assert_eq!(heard.load(Ordering::Relaxed), 1, "noted once");
    }
}
