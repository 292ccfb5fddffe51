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
use super::ram_cache::{CHUNK_TAG, Held, RamCache, RamStats};
use super::request::{ReadRequest, Tiers};
use super::stage::Stage;
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
    /// Time readers spent waiting on storage: their own reads of the source and chunks, and
    /// fetches ahead they waited for (nanoseconds, summed over readers).
    pub storage_wait_ns: u64,
}

/// Where a sample's bytes are and how to fetch them ahead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Stored bytes at `start` of `image` (the outermost image), fetched exactly.
    Exact { image: u32, start: u64, len: u64 },
    /// Stored bytes in chunks `first..=last` of `image`, which the chunk room fetches (the
    /// stage copies the image, or every image goes by chunks).
    Chunks { image: u32, first: u64, last: u64 },
    /// Decoded units, decoded into the RAM cache.
    Decode,
    /// Nothing to fetch: local already, or not worth it (empty).
    Resident,
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
    storage_wait_ns: AtomicU64,
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
        // for their readers included), the units and chunks readers hold and the stager's runs.
        let memory = MemoryBudget::for_cache(ram_budget);
        let ram = RamCache::with_memory(ram_budget, memory.clone());
        if let Some(stage) = &stage {
            stage.use_memory(memory);
        }
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
            storage_wait_ns: AtomicU64::new(0),
        }
    }

    pub fn window(&self) -> &Arc<Window> {
        &self.window
    }

    /// How the lookahead fetches `len` stored bytes at `offset` of `image`: not at all when
    /// they are staged or in the RAM cache, by the chunk room when reads of the image go by
    /// chunks, else exactly.
    pub fn ahead_class(&self, image: u32, offset: u64, len: u64) -> Class {
        let (image, offset) = self.source.resolve(image, offset);
        let size = self.chunks.chunk_size();
        let (first, last) = (offset / size, (offset + len.max(1) - 1) / size);
        let local = |i: u64| {
            self.stage
                .as_deref()
                .is_some_and(|s| s.holds(image, i as usize))
                || self.ram.contains(image, CHUNK_TAG | (i * size))
        };
        if (first..=last).all(local) {
            return Class::Resident;
        }
        match self.chunks.by_chunks(image) {
            true => Class::Chunks { image, first, last },
            false => Class::Exact {
                image,
                start: offset,
                len,
            },
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
            storage_wait_ns: self.storage_wait_ns.load(Ordering::Relaxed),
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
        // An inner archive's bytes are its outer image's: read, cached and staged as those.
        let (image, offset) = self.source.resolve(image, offset);
        match self.window.serve(image, offset, buf, req.wait())? {
            Found::No => {}
            found => {
                if let Found::Waited(took) = found {
                    self.waited(took);
                }
                self.ahead_bytes
                    .fetch_add(buf.len() as u64, Ordering::Relaxed);
                req.served_by(Tiers::RAM);
                return Ok(());
            }
        }
        let plan = self
            .chunks
            .plan(req, image, offset, buf.len() as u64, fetch);
        if plan.straight_to_source() {
            return self.read_source(req, image, offset, buf);
        }
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
            let began = std::time::Instant::now();
            let fetched = match plan.chunked {
                true => self.chunks.for_reader(req, image, i, plan),
                false => Ok(None),
            };
            if let Ok(Some((_, true))) = &fetched {
                self.waited(began.elapsed());
            }
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

    /// Whether reads of `image` may be spliced from its file (`file_range`): it lies in a plain
    /// file on a local disk (itself or the image around it), and no stage keeps it (staged
    /// chunks are read from the stage).
    pub fn may_splice(&self, image: u32) -> bool {
        let (image, _) = self.source.resolve(image, 0);
        self.source.file_descriptor(image).is_some()
            && !self.stage.as_ref().is_some_and(|s| s.keeps(image))
    }

    /// `len` bytes at `offset` of `image` as a range of its file, when this read would go
    /// straight to the source and the source is a plain file (`FileRange`); `None` when the
    /// bytes are to be read otherwise (`read_exact_at`).
    ///
    /// The checks that change nothing come first; `noted` (the read told to whoever hears of
    /// reads) is called only once they pass, before the plan, which weighs what it was told. A
    /// read that is not spliced is noted and planned again by `read_exact_at`: on a parallel
    /// file system, every read was.
    pub fn file_range(
        &self,
        req: &ReadRequest,
        image: u32,
        offset: u64,
        len: usize,
        noted: impl FnOnce(),
    ) -> Option<FileRange<'_>> {
        let (image, offset) = self.source.resolve(image, offset);
        let file = self.source.file_descriptor(image)?;
        if self.window.holds(image, offset, len as u64) {
            return None;
        }
        noted();
        let plan = self
            .chunks
            .plan(req, image, offset, len as u64, Fetch::Chunks);
        if !plan.straight_to_source() {
            return None;
        }
        req.served_by(Tiers::SOURCE);
        Some(FileRange::new(self, image, file, offset, len))
    }

    /// Counts a reader's wait on storage.
    fn waited(&self, took: std::time::Duration) {
        self.storage_wait_ns
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
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
        let began = std::time::Instant::now();
        let read = self.source.read_exact_at(image, offset, buf, req.wait());
        self.waited(began.elapsed());
        read?;
        self.source_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

impl CountSpliced for Images {
    /// Counts a `FileRange` moved to the kernel, as `read_source` counts a read.
    fn count_spliced(&self, image: u32, len: usize, took: std::time::Duration) {
        self.waited(took);
        self.source.count_spliced(image, len as u64);
        self.source_bytes.fetch_add(len as u64, Ordering::Relaxed);
        self.spliced_bytes.fetch_add(len as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::super::OpenedImage;
    use super::*;
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
}
