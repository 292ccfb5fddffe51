//! Chunk i of an image: the one room that fetches a whole aligned chunk of stored bytes, for
//! readers and read-ahead alike, and decides when to (`policy`). A fetch claims the chunk from
//! the stager when the image is being staged (each chunk read once, then handed over), loads it
//! into the RAM cache under the one memory budget, pins it there until its readers are through
//! (`pins`), and tells read-ahead (`ahead`) of a reader's chunks.

mod ahead;
mod pins;
pub mod policy;
mod streams;

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::OpenedImages;
use super::ram_cache::{CHUNK_TAG, Decoded, RamCache, Room};
use super::request::ReadRequest;
use super::stage::{ForRead, Shared, Stage, chunk_len};
use crate::source::read_at::Wait;
use ahead::ReadAhead;
use pins::Pins;
pub use policy::{Ask, Chunking, Fetch, Plan, Policy};

/// Chunks pinned: as many as half the RAM budget holds (each reader walking a shard needs its
/// own three, its current chunk and two fetched ahead: with 8 readers and room for 8, chunks
/// were fetched again before their next file was read, 1.6x the shards' bytes on the simulated
/// PFS), up to `PINNED_MAX`. Never more: the rest of the cache must take new chunks and decoded
/// units. A cache too small for one (under two chunks) keeps none, and reads go by chunks only
/// for the stage (`Policy`): a pinned 1 MiB chunk filled a 1 MiB cache past its budget.
const PINNED_MAX: u64 = 256;

/// What fetches: the state readers and read-ahead share.
pub struct Fetcher {
    source: Arc<OpenedImages>,
    ram: Arc<RamCache>,
    stage: Option<Arc<Stage>>,
    pins: Pins,
    chunk_size: u64,
    /// Chunks fetched ahead so far.
    fetched_ahead: AtomicU64,
}

/// Who wants a chunk.
#[derive(Clone, Copy)]
enum For<'a> {
    /// A reader's miss; `staging`: the stage copies the image now (`Plan::staging`).
    Reader(&'a ReadRequest, bool),
    /// Read-ahead: a hint, which never waits for room in the memory budget.
    Ahead,
}

pub struct Chunks {
    fetcher: Arc<Fetcher>,
    /// Fetches ahead of readers that walk an image in order (none without a RAM tier).
    ahead: Option<ReadAhead>,
    policy: Policy,
}

impl Chunks {
    /// Chunks of `chunk_size` bytes of `source`'s images, kept in `ram`; of `every_image`
    /// (`policy::choose`), or only of the images `stage` copies and of the readers walking an
    /// image in order.
    pub fn new(
        source: Arc<OpenedImages>,
        ram: Arc<RamCache>,
        chunk_size: u64,
        every_image: bool,
        stage: Option<Arc<Stage>>,
    ) -> Chunks {
        let budget = ram.stats().budget;
        let has_ram = budget > 0;
        let keep = ((budget / 2) / chunk_size.max(1)).min(PINNED_MAX);
        let holds_chunks = keep > 0;
        let images = source.image_count();
        let fetcher = Arc::new(Fetcher {
            source,
            ram,
            stage,
            pins: Pins::new(keep as usize),
            chunk_size,
            fetched_ahead: AtomicU64::new(0),
        });
        Chunks {
            ahead: holds_chunks.then(|| ReadAhead::new(fetcher.clone(), images)),
            fetcher,
            policy: Policy::new(every_image, has_ram, holds_chunks, images),
        }
    }

    pub fn chunk_size(&self) -> u64 {
        self.fetcher.chunk_size
    }

    /// How `req`'s read (none: the lookahead's fetch) of `len` bytes at `offset` of `image`
    /// fetches what it misses.
    pub fn plan(
        &self,
        req: Option<&ReadRequest>,
        image: u32,
        (offset, len): (u64, u64),
        fetch: Fetch,
    ) -> Plan {
        let stage = self.fetcher.stage.as_deref();
        // A file of a chunk or more on a local disk is spliced instead (`policy`). On a parallel
        // file system the chunks' read-ahead keeps requests in flight, as before.
        let chunk_or_more = req
            .and_then(ReadRequest::file_size)
            .is_some_and(|s| s >= self.chunk_size())
            && self.fetcher.source.file_descriptor(image).is_some();
        let ask = Ask {
            image,
            offset,
            len,
            fetch,
            chunk_or_more,
        };
        self.policy.plan(stage, req, ask)
    }

    /// Chunk `i` of `image` for `req`, and whether this call read it from the source; `None`
    /// when it is not this read's to fetch whole (the stager has it, or lags): the caller reads
    /// the bytes it needs some other way.
    pub fn for_reader(
        &self,
        req: &ReadRequest,
        image: u32,
        i: u64,
        plan: Plan,
    ) -> io::Result<Option<(Decoded, bool)>> {
        let got = self
            .fetcher
            .fetch(image, i, For::Reader(req, plan.staging))?;
        if let (Some(ahead), Some(_)) = (&self.ahead, &got) {
            let f = &self.fetcher;
            let chunks = f.source.image_size(image).div_ceil(f.chunk_size);
            ahead.read(image, i, chunks, |j| {
                let start = j * f.chunk_size;
                f.pins.wants_ahead((image, start)) && !f.ram.contains(image, CHUNK_TAG | start)
            });
        }
        Ok(got)
    }

    /// Fetches chunk `i` of `image` ahead of its readers, if it is still wanted (a sampler said
    /// they come).
    pub fn fetch_ahead(&self, image: u32, i: u64) {
        self.fetcher.ahead(image, i);
    }

    /// Chunk `i` of `image` if it is in memory; never reads the source.
    pub fn in_memory(&self, image: u32, i: u64) -> Option<Decoded> {
        let start = i * self.fetcher.chunk_size;
        self.fetcher.ram.get(image, CHUNK_TAG | start)
    }

    /// Chunks fetched ahead of readers.
    pub fn fetched_ahead(&self) -> u64 {
        self.fetcher.fetched_ahead.load(Ordering::Relaxed)
    }

    /// Runs that became streams, and bytes read as part of one.
    pub fn streams(&self) -> (u64, u64) {
        self.policy.streams()
    }
}

impl Fetcher {
    /// Fetches chunk `i` of `image` ahead of its readers, if it is still wanted.
    fn ahead(&self, image: u32, i: u64) {
        // Fetched already, by a reader or ahead, and pinned: checked before claiming (a claim
        // must end in a hand-over or a release). Without this 8 readers walking shards fetched
        // 1.23x their bytes.
        if !self.pins.wants_ahead((image, i * self.chunk_size)) {
            return;
        }
        // A failed fetch is the reader's to meet and report, with its own read.
        let _ = self.fetch(image, i, For::Ahead);
    }

    /// Chunk `i` of `image`, and whether this call loaded it from the source; `None` when the
    /// stager has it (or, ahead, when nothing is to be done).
    fn fetch(&self, image: u32, i: u64, who: For) -> io::Result<Option<(Decoded, bool)>> {
        let (wait, staging) = match who {
            For::Reader(req, staging) => (req.wait(), staging),
            For::Ahead => (
                Wait::May,
                self.stage.as_deref().is_some_and(|s| s.copying(image)),
            ),
        };
        // While the stage copies this image, each chunk is read whole once: by the read that
        // claims it (and hands it to the stager) or by the stager (`claim_for_read`).
        let stage = self.stage.as_deref().filter(|_| staging);
        let how = match stage {
            Some(s) => s.claim_for_read(image, i as usize, wait),
            None => ForRead::Fetch,
        };
        match (how, stage, who) {
            (ForRead::Fetch | ForRead::Store, _, _) => {}
            (ForRead::Shared, Some(s), For::Reader(..)) => match s.shared(image, i as usize) {
                Shared::Bytes(chunk) => return Ok(Some((chunk, false))),
                // Not claimed: loaded (or joined) without a hand-over.
                Shared::Fetching => return self.load(image, i, who).map(Some),
                Shared::Gone => return Ok(None),
            },
            _ => return Ok(None),
        }
        let loaded = self.load(image, i, who);
        if let Some(stage) = stage {
            let chunk = loaded.as_ref().ok().map(|(chunk, _)| chunk);
            stage.settle(image, i as usize, how, chunk);
        }
        loaded.map(Some)
    }

    /// Chunk `i` of `image` from the RAM cache or the source, pinned.
    fn load(&self, image: u32, i: u64, who: For) -> io::Result<(Decoded, bool)> {
        let start = i * self.chunk_size;
        let len = chunk_len(self.source.image_size(image), self.chunk_size, i as usize);
        let room = match who {
            For::Reader(req, _) => Room::for_read(req.wait()),
            For::Ahead => Room::IfFree,
        };
        let pinned = self.pins.keeps_any();
        let (chunk, loaded) =
            self.ram
                .fetch_chunk(&self.source, image, start, len, room, pinned)?;
        let read = matches!(who, For::Reader(..));
        match (loaded, read) {
            (true, _) if pinned => {
                self.pins.pin((image, start), &chunk, read);
                if !read {
                    self.fetched_ahead.fetch_add(1, Ordering::Relaxed);
                }
            }
            // Found in the cache: the latest used now.
            (false, true) => {
                self.pins.read((image, start));
            }
            _ => {}
        }
        Ok((chunk, loaded))
    }
}
