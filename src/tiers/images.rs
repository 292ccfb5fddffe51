//! Image bytes from the best tier that holds them: the staged local copy (complete and checked
//! chunks), then the RAM cache of source chunks, then the source itself.
//!
//! Stored bytes go through the RAM tier in aligned chunks: one source request fetches the whole
//! chunk, neighbouring small files come with it, and threads missing the same chunk wait for one
//! fetch. Compressed bytes are read exactly (their decoded form is what the RAM tier keeps).

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::OpenedImages;
use super::budget::MemoryBudget;
use super::budget::Permit;
use super::chunks::{Chunks, Fetch, Plan};
use super::file_range::{CountSpliced, FileRange};
use super::located::At;
pub use super::located::Class;
use super::ram_cache::{CHUNK_TAG, Held, RamCache, RamStats};
use super::request::{Asker, ReadRequest, Tiers};
use super::stage::Stage;
use super::waits::{Waiting, Waits};
use super::window::{Found, Window};
use crate::source::read_at::Wait;

/// Bytes delivered to readers by each tier (page-cache misses of the mount).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct TierStats {
    pub ram_bytes: u64,
    /// Source chunks fetched ahead of sequential readers.
    pub read_ahead_chunks: u64,
    /// Readers found walking an image in order across files (switched to chunks), and the
    /// bytes they read that way.
    pub streams: u64,
    pub streamed_bytes: u64,
    pub staged_bytes: u64,
    pub source_bytes: u64,
    /// Of `source_bytes`, those spliced into the kernel from the image file, without a copy in
    /// the daemon (`FileRange`).
    pub spliced_bytes: u64,
    /// Bytes served from the lookahead's window (fetched ahead on a sampler's word).
    pub ahead_bytes: u64,
    /// Time readers spent waiting on storage (`waits`): their own reads of the source, and
    /// chunks, units and window extents other threads had in flight (nanoseconds, summed over
    /// readers: four readers waiting at once count four times).
    pub storage_wait_ns: u64,
    /// Time during which some reader waited on storage (nanoseconds of wall-clock time).
    pub storage_stall_ns: u64,
}

pub struct Images {
    source: Arc<OpenedImages>,
    ram: Arc<RamCache>,
    /// Whole chunks, and when to fetch them.
    chunks: Chunks,
    stage: Option<Arc<Stage>>,
    /// What the lookahead fetched for readers to come (empty without hints).
    window: Arc<Window>,
    ram_bytes: AtomicU64,
    staged_bytes: AtomicU64,
    source_bytes: AtomicU64,
    ahead_bytes: AtomicU64,
    spliced_bytes: AtomicU64,
    /// Readers' waits on storage.
    waits: Waits,
}

impl Images {
    /// `ram_budget` bytes for the RAM tier (0: none); source chunks of `chunk_size` bytes kept in it
    /// for every image when `every_image` (`chunks::policy::choose`).
    pub fn new(
        source: Arc<OpenedImages>,
        ram_budget: u64,
        chunk_size: u64,
        every_image: bool,
        stage: Option<Arc<Stage>>,
    ) -> Images {
        if let Some(stage) = &stage {
            assert_eq!(
                stage.chunk_size(),
                chunk_size,
                "one chunk size for all tiers"
            );
        }
        // One memory budget for everything the tiers hold: the cache's values (chunks pinned
        // for their readers included), the units and chunks readers hold and the stager's runs
        // (a stage is opened with it: `tiers::assemble`).
        let memory = (stage.as_ref().and_then(|s| s.memory().cloned()))
            .unwrap_or_else(|| MemoryBudget::for_cache(ram_budget));
        let ram = RamCache::with_memory(ram_budget, memory);
        let chunks = Chunks::new(
            source.clone(),
            ram.clone(),
            chunk_size,
            every_image,
            stage.clone(),
        );
        Images {
            source,
            ram,
            chunks,
            stage,
            window: Arc::default(),
            ram_bytes: AtomicU64::new(0),
            staged_bytes: AtomicU64::new(0),
            source_bytes: AtomicU64::new(0),
            ahead_bytes: AtomicU64::new(0),
            spliced_bytes: AtomicU64::new(0),
            waits: Waits::default(),
        }
    }

    pub fn window(&self) -> &Arc<Window> {
        &self.window
    }

    pub(super) fn chunks(&self) -> &Chunks {
        &self.chunks
    }

    /// How the lookahead fetches `len` stored bytes at `offset` of `image` (`locate`): not at
    /// all when they are staged, in the RAM cache or in the window, by the chunk room when reads
    /// of the image go by chunks, else exactly.
    pub fn ahead_class(&self, image: u32, offset: u64, len: u64) -> Class {
        let found = self.locate(Asker::Lookahead, image, offset, len, Fetch::Chunks);
        let (image, start) = (found.image, found.offset);
        match found.at {
            At::Resident | At::Window => Class::Resident,
            At::Chunks(plan) if plan.chunked => {
                let size = self.chunks.chunk_size();
                let last = (start + len.max(1) - 1) / size;
                Class::Chunks {
                    image,
                    first: start / size,
                    last,
                }
            }
            At::Chunks(_) | At::Source { .. } => Class::Exact { image, start, len },
        }
    }

    /// `len` bytes at `offset` of `image` (the outermost image) from the source, held under
    /// `permit`, for the lookahead's window.
    pub fn fetch_exact(
        &self,
        image: u32,
        offset: u64,
        len: u64,
        permit: Permit,
    ) -> io::Result<Held> {
        let mut bytes = vec![0u8; len as usize];
        self.source
            .read_exact_at(image, offset, &mut bytes, Wait::May)?;
        Ok(Held::under(bytes, permit))
    }

    /// Fetches chunk `i` of `image` ahead of its readers (the lookahead's word).
    pub fn fetch_chunk_ahead(&self, image: u32, i: u64) {
        self.chunks.fetch_ahead(image, i);
    }

    pub fn source(&self) -> &OpenedImages {
        &self.source
    }

    pub fn ram(&self) -> &RamCache {
        &self.ram
    }

    pub fn ram_stats(&self) -> RamStats {
        self.ram.stats()
    }

    pub fn stage(&self) -> Option<&Arc<Stage>> {
        self.stage.as_ref()
    }

    pub fn image_size(&self, image: u32) -> u64 {
        self.source.image_size(image)
    }

    pub fn stats(&self) -> TierStats {
        let (streams, streamed_bytes) = self.chunks.streams();
        TierStats {
            read_ahead_chunks: self.chunks.fetched_ahead(),
            streams,
            streamed_bytes,
            ram_bytes: self.ram_bytes.load(Ordering::Relaxed),
            staged_bytes: self.staged_bytes.load(Ordering::Relaxed),
            source_bytes: self.source_bytes.load(Ordering::Relaxed),
            ahead_bytes: self.ahead_bytes.load(Ordering::Relaxed),
            spliced_bytes: self.spliced_bytes.load(Ordering::Relaxed),
            storage_wait_ns: self.waits.sum_ns(),
            storage_stall_ns: self.waits.stalled_ns(),
        }
    }

    /// Fills `buf` from `offset` of `image`, for `req`: each chunk's part from the stage if it
    /// holds it, else as the plan says (`chunks::policy`).
    pub fn read_exact_at(
        &self,
        req: &ReadRequest,
        image: u32,
        offset: u64,
        buf: &mut [u8],
        fetch: Fetch,
    ) -> io::Result<()> {
        let len = buf.len() as u64;
        // Located once per read: by `file_range` already when it could not splice it (the
        // window did not hold the bytes then). Else the window first, as `locate` orders the
        // tiers: `serve` tells whether it holds them and serves them under one lock.
        let found = match req.located(image, offset, len) {
            Some(found) => found,
            None => {
                let (outer, at) = self.source.resolve(image, offset);
                let waits = &self.waits;
                match (self.window).serve(outer, at, buf, req.wait(), waits, req.reader())? {
                    Found::No => self.locate_stored(Asker::Reader(req), outer, at, len, fetch),
                    Found::Ready | Found::Waited(_) => {
                        self.ahead_bytes.fetch_add(len, Ordering::Relaxed);
                        req.served_by(Tiers::RAM);
                        return Ok(());
                    }
                }
            }
        };
        let (image, offset) = (found.image, found.offset);
        let plan = match found.at {
            At::Chunks(plan) => plan,
            At::Source { .. } | At::Window | At::Resident => {
                return self.read_source(req, image, offset, buf);
            }
        };
        let chunk_size = self.chunks.chunk_size();
        let stage = self.stage.as_deref();
        let mut done = 0;
        while done < buf.len() {
            let pos = offset + done as u64;
            let (i, within) = (pos / chunk_size, pos % chunk_size);
            let n = ((chunk_size - within) as usize).min(buf.len() - done);
            let dst = &mut buf[done..done + n];
            done += n;
            if self.read_staged(req, stage, image, i, within, dst)? {
                continue;
            }
            let fetched = match plan.chunked {
                true => self.fetch_chunk(req, image, i, plan),
                false => Ok(None),
            };
            let (chunk, loaded) = match fetched {
                Ok(Some(fetched)) => fetched,
                Ok(None) => {
                    self.read_otherwise(req, plan, image, pos, dst)?;
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && req.wait() == Wait::Never => {
                    return Err(e);
                }
                Err(_) => {
                    // A bad spot elsewhere in the chunk must not fail this read: ask for exactly
                    // these bytes, so an error is this read's own.
                    self.read_source(req, image, pos, dst)?;
                    continue;
                }
            };
            let from = within as usize;
            dst.copy_from_slice(&chunk[from..from + n]);
            let (tier, counter) = match loaded {
                true => (Tiers::SOURCE, &self.source_bytes),
                false => (Tiers::RAM, &self.ram_bytes),
            };
            req.served_by(tier);
            counter.fetch_add(n as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Fills `dst` (at `within` chunk `i`) when its chunk is not this read's to fetch whole (the
    /// stager has it, or lags; or the plan reads exactly): from the stage by now, from memory (a
    /// read fetched it), or exactly these bytes from the source.
    fn read_otherwise(
        &self,
        req: &ReadRequest,
        plan: Plan,
        image: u32,
        pos: u64,
        dst: &mut [u8],
    ) -> io::Result<()> {
        let stage = self.stage.as_deref();
        let (i, within) = (
            pos / self.chunks.chunk_size(),
            pos % self.chunks.chunk_size(),
        );
        if plan.chunked && self.read_staged(req, stage, image, i, within, dst)? {
            return Ok(());
        }
        if let Some(chunk) = self.chunks.in_memory(image, i).filter(|_| plan.chunked) {
            let from = within as usize;
            dst.copy_from_slice(&chunk[from..from + dst.len()]);
            self.ram_bytes
                .fetch_add(dst.len() as u64, Ordering::Relaxed);
            req.served_by(Tiers::RAM);
            return Ok(());
        }
        self.read_source(req, image, pos, dst)?;
        if let Some(stage) = stage {
            stage.offer(image, i as usize);
        }
        Ok(())
    }

    /// Fills `dst` from the staged copy of chunk `i` if it is there, counting it.
    fn read_staged(
        &self,
        req: &ReadRequest,
        stage: Option<&Stage>,
        image: u32,
        i: u64,
        within: u64,
        dst: &mut [u8],
    ) -> io::Result<bool> {
        let Some(stage) = stage else {
            return Ok(false);
        };
        if !stage.read(image, i as usize, within, dst, req.wait())? {
            return Ok(false);
        }
        self.staged_bytes
            .fetch_add(dst.len() as u64, Ordering::Relaxed);
        req.served_by(Tiers::STAGE);
        Ok(true)
    }

    /// `len` bytes at `offset` of `image` as a range of its file, when this read would go
    /// straight to the source and the source is a plain file (`FileRange`); `None` when the
    /// bytes are to be read otherwise (`read_exact_at`).
    ///
    /// The checks that change nothing come first; `noted` (the read told to whoever hears of
    /// reads) is called only once they pass, before `locate`, whose plan weighs what it was
    /// told. A read that is not spliced keeps where it was located for `read_exact_at` (noted
    /// and planned once: on a parallel file system, every read was twice).
    pub fn file_range(
        &self,
        req: &ReadRequest,
        image: u32,
        offset: u64,
        len: usize,
        noted: impl FnOnce(),
    ) -> Option<FileRange<'_>> {
        let (outer, at) = self.source.resolve(image, offset);
        self.source.file_descriptor(outer)?;
        if self.window.holds(outer, at, len as u64) {
            return None;
        }
        noted();
        let found = self.locate(Asker::Reader(req), image, offset, len as u64, Fetch::Chunks);
        let (At::Source { file: true }, Some(file)) =
            (found.at, self.source.file_descriptor(found.image))
        else {
            req.keep_located(image, offset, found);
            return None;
        };
        req.served_by(Tiers::SOURCE);
        Some(FileRange::new(
            self,
            req.reader(),
            found.image,
            file,
            found.offset,
            len,
        ))
    }

    /// Chunk `i` of `image` for `req` (`chunks::Chunks::for_reader`), counting the wait when
    /// it was not in memory: loaded by this read, or by another thread (read-ahead, the
    /// lookahead, another reader) while this one waited.
    fn fetch_chunk(
        &self,
        req: &ReadRequest,
        image: u32,
        i: u64,
        plan: Plan,
    ) -> io::Result<Option<(super::Decoded, bool)>> {
        let size = self.chunks.chunk_size();
        if self.ram.contains(image, CHUNK_TAG | (i * size)) {
            return self.chunks.for_reader(req, image, i, plan);
        }
        let _waiting = self.waits.begin(req.reader());
        self.chunks.for_reader(req, image, i, plan)
    }

    /// Where readers waited on storage, and how long.
    pub fn waits(&self) -> &Waits {
        &self.waits
    }

    /// Exactly `buf.len()` bytes at `offset`, from the source.
    fn read_source(
        &self,
        req: &ReadRequest,
        image: u32,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<()> {
        req.served_by(Tiers::SOURCE);
        let waiting = self.waits.begin(req.reader());
        let read = self.source.read_exact_at(image, offset, buf, req.wait());
        drop(waiting);
        read?;
        self.source_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

impl CountSpliced for Images {
    fn begin(&self, reader: u32) -> Waiting<'_> {
        self.waits.begin(reader)
    }

    /// Counts a `FileRange` moved to the kernel, as `read_source` counts a read.
    fn count_spliced(&self, image: u32, len: usize) {
        self.source.count_spliced(image, len as u64);
        self.source_bytes.fetch_add(len as u64, Ordering::Relaxed);
        self.spliced_bytes.fetch_add(len as u64, Ordering::Relaxed);
    }

    fn count_checked(&self, image: u32, len: u64) {
        self.source.count_checked(image, len);
    }
}

#[cfg(test)]
mod tests {
    use super::super::OpenedImage;
    use super::*;
    use crate::source::read_at::ReadAt;
    use std::path::PathBuf;

    const MIB: u64 = 1 << 20;

    /// One image of `len` bytes in memory, each byte its offset's low bits.
    fn source(len: u64) -> Arc<OpenedImages> {
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        Arc::new(OpenedImages::new(vec![OpenedImage {
            path: PathBuf::from("memory.tar"),
            data: Arc::new(data),
            size: len,
        }]))
    }

    /// Walks the image in order, `step` bytes a read, checking every byte; calls `after` after
    /// each read.
    fn walk(images: &Images, len: u64, step: u64, mut after: impl FnMut(&Images)) {
        let req = ReadRequest::new(7, Wait::May);
        let mut buf = vec![0u8; step as usize];
        let mut at = 0;
        while at < len {
            let n = step.min(len - at) as usize;
            images
                .read_exact_at(&req, 0, at, &mut buf[..n], Fetch::Chunks)
                .unwrap();
            assert!(
                buf[..n]
                    .iter()
                    .enumerate()
                    .all(|(k, &b)| b == ((at + k as u64) % 251) as u8),
                "bytes at {at}"
            );
            at += n as u64;
            after(images);
        }
    }

    /// The chunks fetched ahead of a reader live in the RAM cache, within its budget: no second
    /// store of bytes beside it. A cache full of hot decoded units admits new chunks to a cold
    /// part of 3% where they would be evicted first; pinned, they push out units instead, and the
    /// cache holds no more than its budget.
    #[test]
    fn chunks_kept_for_their_readers_are_held_within_the_cache_budget() {
        let (budget, len) = (16 * MIB, 40 * MIB);
        let images = Images::new(source(len), budget, MIB, true, None);
        let ram = images.ram();
        // Hot decoded units filling the cache.
        for round in 0..3 {
            for k in 0..60u64 {
                let unit = ram
                    .get_or_load(0, k * 4096, 256 << 10, || Ok(vec![round as u8; 256 << 10]))
                    .unwrap();
                assert_eq!(unit.len(), 256 << 10);
            }
        }
        let mut most = 0;
        walk(&images, len, 128 << 10, |images| {
            // Read-ahead's threads may be copying a chunk in: one chunk each beyond.
            std::thread::sleep(std::time::Duration::from_millis(2));
            most = most.max(images.ram_stats().memory.held);
        });
        assert!(
            most <= budget + 2 * MIB + MIB / 2,
            "held {most} bytes under a cache of {budget}"
        );
        let tiers = images.stats();
        assert!(tiers.read_ahead_chunks > 0, "{tiers:?}");
    }

    /// Readers and read-ahead fetch through one room (`chunks`): a walk in order reads each chunk from the
    /// source once, whoever fetched it, and every byte is right.
    #[test]
    fn a_walk_in_order_fetches_each_chunk_once_ahead_or_by_its_reader() {
        let len = 24 * MIB + 12345;
        let src = source(len);
        let images = Images::new(src.clone(), 8 * MIB, MIB, true, None);
        walk(&images, len, 64 << 10, |_| {});
        let (read, chunks) = (src.stats().bytes, len.div_ceil(MIB));
        assert_eq!(read, len, "each chunk once: {read} bytes for {len}");
        let tiers = images.stats();
        assert!(
            tiers.read_ahead_chunks > 0 && tiers.read_ahead_chunks < chunks,
            "{tiers:?}"
        );
    }

    /// A walk in order that finds its chunks fetched ahead keeps read-ahead going: its reader
    /// waits on the first two chunks only. Read-ahead followed misses alone, so the walk, finding
    /// chunks i+1 and i+2 fetched, missed i+3 and i+4 before it started again: half the chunks.
    #[test]
    fn a_walk_that_finds_its_chunks_fetched_ahead_is_read_ahead_to_its_end() {
        let len = 24 * MIB;
        let images = Images::new(source(len), 8 * MIB, MIB, true, None);
        // Time for the read-ahead threads between reads (a reader that decodes what it reads).
        walk(&images, len, 128 << 10, |_| {
            std::thread::sleep(std::time::Duration::from_millis(2))
        });
        let chunks = len / MIB;
        let ahead = images.stats().read_ahead_chunks;
        assert!(
            ahead >= chunks - 3,
            "{ahead} of {chunks} chunks fetched ahead of the reader"
        );
    }

    /// A cache smaller than two chunks keeps none for their readers: reads go exactly, and the
    /// cache never holds more than its budget. A 1 MiB chunk pinned in a 1 MiB cache held 64
    /// bytes beyond it (CI's uring pass of tests/squashfs.rs).
    #[test]
    fn a_cache_too_small_for_two_chunks_pins_none_and_stays_within_its_budget() {
        let len = 6 * MIB;
        let images = Images::new(source(len), MIB, MIB, true, None);
        let mut most = 0;
        walk(&images, len, 64 << 10, |images| {
            most = most.max(images.ram_stats().held);
        });
        assert!(most <= MIB, "held {most} bytes under a cache of {MIB}");
        assert_eq!(images.stats().read_ahead_chunks, 0);
    }

    /// A reader that finds its chunk being fetched by read-ahead waits for it, and that wait is
    /// counted: walking a slow image in order, the reader spends most of its time waiting on
    /// chunks read-ahead has in flight. Counted only when the reader loaded a chunk itself, the
    /// stall was the first two chunks of 24 (packfs reported 0.9-1.4 s where a loader waited
    /// 7.8-23.5 s).
    #[test]
    fn a_wait_for_a_chunk_read_ahead_has_in_flight_is_counted() {
        use crate::tiers::faults::{Fault, Faulty};
        let len = 16 * MIB;
        let slow = Arc::into_inner(source(len)).expect("one owner");
        let slow = slow.wrapped(|_, data| {
            let latency = Fault::Latency(std::time::Duration::from_millis(20));
            Arc::new(Faulty::new(data, vec![(0..len, latency)])) as Arc<dyn ReadAt>
        });
        let images = Images::new(Arc::new(slow), 8 * MIB, MIB, true, None);
        // A reader that does nothing but read (`walk` checks every byte: slower than the store).
        let (req, mut buf) = (ReadRequest::new(7, Wait::May), vec![0u8; 256 << 10]);
        let began = std::time::Instant::now();
        for at in (0..len).step_by(buf.len()) {
            images
                .read_exact_at(&req, 0, at, &mut buf, Fetch::Chunks)
                .unwrap();
        }
        let took = began.elapsed().as_nanos() as u64;
        let s = images.stats();
        assert!(s.read_ahead_chunks > 4, "{s:?}");
        assert!(
            s.storage_stall_ns > took / 2,
            "stalled {} of {took} ns: {s:?}",
            s.storage_stall_ns
        );
        assert_eq!(images.waits().by_reader()[0].0, 7, "the walk's reader");
    }
}
