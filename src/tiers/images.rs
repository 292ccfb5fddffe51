//! Image bytes from the best tier that holds them: the staged local copy (complete and checked
//! chunks), then the RAM cache of source chunks, then the source itself.
//!
//! Stored bytes go through the RAM tier in aligned chunks: one source request fetches the whole
//! chunk, neighbouring small files come with it, and threads missing the same chunk wait for one
//! fetch. Compressed bytes are read exactly (their decoded form is what the RAM tier keeps).

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::Source;
use super::budget::MemoryBudget;
use super::ram_cache::{CHUNK_TAG, Decoded, RamCache, RamStats, Room};
use super::read_ahead::ReadAhead;
use super::request::{ReadRequest, Tiers};
use super::stage::{ForRead, Shared, Stage, chunk_len};
use super::streams::Streams;
use crate::source::read_at::Wait;

/// How a read wants its bytes fetched when they are not staged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fetch {
    /// Whole aligned chunks, kept in the RAM tier.
    Chunks,
    /// Exactly the bytes asked for.
    Exact,
}

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
}

pub struct Images {
    source: Arc<Source>,
    ram: Arc<RamCache>,
    /// Fetches ahead of readers that walk an image in order (when chunks are fetched).
    read_ahead: Option<ReadAhead>,
    /// Readers walking an image in order across files, whose reads go in chunks.
    streams: Streams,
    stage: Option<Arc<Stage>>,
    chunk_size: u64,
    /// Fetch stored bytes in chunks through the RAM tier, for every image (besides the images
    /// a running stage keeps, which are always fetched in chunks).
    chunked: bool,
    /// The RAM tier has room for chunks.
    has_ram: bool,
    ram_bytes: AtomicU64,
    staged_bytes: AtomicU64,
    source_bytes: AtomicU64,
}

impl Images {
    /// `ram_budget` bytes for the RAM tier (0: none); source chunks of `chunk_size` bytes kept in it
    /// when `chunked`.
    pub fn new(
        source: Arc<Source>,
        ram_budget: u64,
        chunk_size: u64,
        chunked: bool,
        stage: Option<Arc<Stage>>,
    ) -> Images {
        if let Some(stage) = &stage {
            assert_eq!(
                stage.chunk_size(),
                chunk_size,
                "one chunk size for all tiers"
            );
        }
        let has_ram = ram_budget > 0;
        let chunked = chunked && has_ram;
        // One memory budget for everything the tiers hold: the cache's values, the units and
        // chunks readers hold, read-ahead's window and the stager's runs.
        let memory = MemoryBudget::for_cache(ram_budget);
        let ram = RamCache::with_memory(ram_budget, memory.clone());
        if let Some(stage) = &stage {
            stage.use_memory(memory);
        }
        let read_ahead =
            has_ram.then(|| ReadAhead::new(source.clone(), ram.clone(), chunk_size, stage.clone()));
        let streams = Streams::new(source.image_count());
        Images {
            source,
            ram,
            read_ahead,
            streams,
            stage,
            chunk_size,
            chunked,
            has_ram,
            ram_bytes: AtomicU64::new(0),
            staged_bytes: AtomicU64::new(0),
            source_bytes: AtomicU64::new(0),
        }
    }

    pub fn source(&self) -> &Source {
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
        TierStats {
            read_ahead_chunks: self.read_ahead.as_ref().map_or(0, ReadAhead::fetched),
            streams: self.streams.detected(),
            streamed_bytes: self.streams.streamed(),
            ram_bytes: self.ram_bytes.load(Ordering::Relaxed),
            staged_bytes: self.staged_bytes.load(Ordering::Relaxed),
            source_bytes: self.source_bytes.load(Ordering::Relaxed),
        }
    }

    /// Fills `buf` from `offset` of `image`, for `req`.
    pub fn read_exact_at(
        &self,
        req: &ReadRequest,
        image: u32,
        offset: u64,
        buf: &mut [u8],
        fetch: Fetch,
    ) -> io::Result<()> {
        // Chunks are fetched whole so the stager can keep them. Where it will not (an image of
        // another node's share; staging stopped: budget reached, directory full), a whole chunk
        // for a small read is waste: 43x more bytes read than served was measured after a stop,
        // 7.6x the dataset per epoch for the other shares of 4 nodes. Read exactly then.
        let kept = self.stage.as_ref().filter(|s| s.keeps(image));
        let staging = kept.is_some_and(|s| !s.stopped());
        let wants_chunks = fetch == Fetch::Chunks && self.has_ram;
        // A reader walking the image in order across files reads it in chunks (and so with
        // read-ahead): one request per chunk, not one per file (`streams`).
        let streaming = wants_chunks
            && !self.chunked
            && !staging
            && self
                .streams
                .note(req.reader(), image, offset, buf.len() as u64);
        let chunked = wants_chunks && (self.chunked || staging || streaming);
        // Nothing local can hold these bytes: one read of exactly them, not one per chunk.
        if kept.is_none() && !chunked {
            return self.read_source(req, image, offset, buf);
        }
        let mut done = 0;
        while done < buf.len() {
            let pos = offset + done as u64;
            let (i, within) = (pos / self.chunk_size, pos % self.chunk_size);
            let n = ((self.chunk_size - within) as usize).min(buf.len() - done);
            let dst = &mut buf[done..done + n];
            done += n;
            let stage = self.stage.as_deref();
            if self.read_staged(req, stage, image, i, within, dst)? {
                continue;
            }
            // While the stage copies this image, each chunk is read whole once: by the read
            // that claims it (and hands it to the stager) or by the stager (`claim_for_read`).
            let how = match stage {
                Some(s) if chunked && staging => s.claim_for_read(image, i as usize, req.wait()),
                _ if chunked => ForRead::Fetch,
                _ => ForRead::Exact,
            };
            let fetched = match (how, stage) {
                (ForRead::Fetch | ForRead::Store, _) => Some(self.chunk(req, image, i)),
                (ForRead::Shared, Some(s)) => match s.shared(image, i as usize) {
                    Shared::Bytes(chunk) => Some(Ok((chunk, false))),
                    Shared::Fetching => Some(self.chunk(req, image, i)),
                    Shared::Gone => None,
                },
                _ => None,
            };
            let Some(fetched) = fetched else {
                // Not this read's to fetch whole (the stager has it, or lags): local by now, in
                // memory (a read fetched it), or exactly these bytes.
                if chunked && self.read_staged(req, stage, image, i, within, dst)? {
                    continue;
                }
                if let Some(chunk) = self.in_memory(image, i).filter(|_| chunked) {
                    dst.copy_from_slice(&chunk[within as usize..within as usize + n]);
                    self.ram_bytes.fetch_add(n as u64, Ordering::Relaxed);
                    req.served_by(Tiers::RAM);
                    continue;
                }
                self.read_source(req, image, pos, dst)?;
                if let Some(stage) = stage {
                    stage.offer(image, i as usize);
                }
                continue;
            };
            // The claim, if this read holds one (`claim_for_read` said Fetch or Store).
            let claim = stage.filter(|_| staging);
            let (chunk, loaded) = match fetched {
                Ok(fetched) => fetched,
                Err(e) => {
                    if let Some(stage) = claim {
                        stage.settle(image, i as usize, how, None);
                    }
                    if e.kind() == io::ErrorKind::WouldBlock && req.wait() == Wait::Never {
                        return Err(e);
                    }
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
            if let Some(stage) = claim {
                stage.settle(image, i as usize, how, Some(&chunk));
            }
        }
        Ok(())
    }

    /// Chunk `i` of `image` whole, from the read-ahead window, the RAM tier or the source; and
    /// whether this call read it from the source.
    fn chunk(&self, req: &ReadRequest, image: u32, i: u64) -> io::Result<(Decoded, bool)> {
        let start = i * self.chunk_size;
        let len = chunk_len(self.image_size(image), self.chunk_size, i as usize);
        // The chunks just fetched (ahead or by a reader) are kept until read, past the RAM
        // cache's cold part (`read_ahead`).
        if let Some(chunk) = self
            .read_ahead
            .as_ref()
            .and_then(|a| a.pinned(image, start))
        {
            return Ok((chunk, false));
        }
        let fetched =
            self.ram
                .fetch_chunk(&self.source, image, start, len, Room::for_read(req.wait()))?;
        if let (Some(ahead), (chunk, true)) = (&self.read_ahead, &fetched) {
            ahead.pin(image, start, chunk.clone());
            let chunks = self.image_size(image).div_ceil(self.chunk_size);
            ahead.missed(&self.ram, image, i, chunks, self.chunk_size);
        }
        Ok(fetched)
    }

    /// Chunk `i` of `image` if it is in memory (the read-ahead window or the RAM tier); never
    /// reads the source.
    fn in_memory(&self, image: u32, i: u64) -> Option<Decoded> {
        let start = i * self.chunk_size;
        self.read_ahead
            .as_ref()
            .and_then(|a| a.pinned(image, start))
            .or_else(|| self.ram.get(image, CHUNK_TAG | start))
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

    /// Exactly `buf.len()` bytes at `offset`, from the source.
    fn read_source(
        &self,
        req: &ReadRequest,
        image: u32,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<()> {
        req.served_by(Tiers::SOURCE);
        self.source.read_exact_at(image, offset, buf, req.wait())?;
        self.source_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}
