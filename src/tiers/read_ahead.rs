//! Read-ahead of source chunks for readers walking a shard in order (WebDataset loaders, `tar -x`,
//! `cat`): when a miss of chunk i follows a miss of chunk i-1 of the same image, the next chunks
//! are fetched into the RAM tier by background threads while the reader consumes these. On an
//! object store each chunk is a round trip of milliseconds; a sequential reader then waits for
//! none of them after the first two.
//!
//! The chunks fetched lately (ahead, or by a reader) are also kept in a small window of their own
//! until they are read (`pin`, `pinned`): the RAM cache admits new entries into a cold part of 3% of its
//! budget, where a chunk fetched ahead could be evicted by the next one before its reader comes
//! (measured: 19 chunk loads for a 12-chunk walk under an 8 MiB cache).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_channel::{Sender, TrySendError, bounded};

use super::Source;
use super::ram_cache::{CHUNK_TAG, Decoded, RamCache};
use super::stage::{ForRead, Stage, chunk_len};

/// Chunks fetched ahead of a sequential reader.
const DEPTH: u64 = 2;
/// Threads fetching ahead; at most this many read-ahead requests are in flight, so read-ahead
/// never takes every request slot from the readers' own misses.
const THREADS: usize = 2;
/// Chunks waiting for a thread; more are dropped (a hint, not a promise).
const QUEUE: usize = 16;
/// Chunks kept, the latest fetched, at least: a few sequential readers' current chunk and the
/// `DEPTH` ahead of it. More where half the RAM budget holds more (each reader walking a shard
/// needs its own three: with 8 of them and room for 8, chunks were fetched again before their
/// next file was read, 1.6x the shards' bytes on the simulated PFS), up to `PINNED_MAX`.
const PINNED: usize = 8;
const PINNED_MAX: usize = 256;

/// Recently fetched chunks, oldest first: (image, chunk start); and how many are kept.
struct Window {
    chunks: Mutex<VecDeque<((u32, u64), Decoded)>>,
    keep: usize,
}

pub struct ReadAhead {
    queue: Sender<(u32, u64)>,
    window: Arc<Window>,
    /// Per image: the last chunk missed, plus one (0: none yet).
    last_miss: Vec<AtomicU64>,
    /// Chunks fetched ahead so far.
    fetched: Arc<AtomicU64>,
}

impl ReadAhead {
    pub fn new(
        source: Arc<Source>,
        ram: Arc<RamCache>,
        chunk_size: u64,
        stage: Option<Arc<Stage>>,
    ) -> ReadAhead {
        let (queue, jobs) = bounded::<(u32, u64)>(QUEUE);
        let fetched = Arc::new(AtomicU64::new(0));
        let keep =
            ((ram.stats().budget / 2) / chunk_size.max(1)).clamp(PINNED as u64, PINNED_MAX as u64);
        let window = Arc::new(Window {
            chunks: Mutex::default(),
            keep: keep as usize,
        });
        for n in 0..THREADS {
            let (jobs, source, ram, fetched, window, stage) = (
                jobs.clone(),
                source.clone(),
                ram.clone(),
                fetched.clone(),
                window.clone(),
                stage.clone(),
            );
            let spawned = std::thread::Builder::new()
                .name(format!("read-ahead-{n}"))
                .spawn(move || {
                    // Ends when the tiers are dropped (the sender with them).
                    for (image, i) in jobs {
                        let start = i * chunk_size;
                        // Fetched already, by a reader or ahead, and kept here: the RAM cache may
                        // have let it go (its cold part holds a few chunks), this window has not.
                        // Without this check 8 readers walking shards fetched 1.23x their bytes.
                        // (Checked before claiming: a claim must end in a hand-over or a release.)
                        if window.has(image, start) {
                            continue;
                        }
                        // A chunk of an image being staged is read once: fetched ahead only if
                        // neither the stager nor a read has it, then handed to the stager (or
                        // stored here when its queue is full).
                        let staging = stage.as_deref().filter(|s| s.keeps(image) && !s.stopped());
                        let how = staging.map(|s| s.claim_for_read(image, i as usize));
                        if how.is_some_and(|h| !matches!(h, ForRead::Fetch | ForRead::Store)) {
                            continue;
                        }
                        let len = chunk_len(source.image_size(image), chunk_size, i as usize);
                        let loaded = ram.fetch_chunk(&source, image, start, len);
                        // A failed fetch is the reader's to meet and report, with its own read.
                        let chunk = match loaded {
                            Ok((chunk, true)) => {
                                fetched.fetch_add(1, Ordering::Relaxed);
                                pin_in(&window, image, start, chunk.clone());
                                Some(chunk)
                            }
                            Ok((chunk, false)) => Some(chunk),
                            Err(_) => None,
                        };
                        if let (Some(stage), Some(how)) = (staging, how) {
                            stage.settle(image, i as usize, how, chunk.as_ref());
                        }
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!("cannot start a read-ahead thread ({e}); reading without");
            }
        }
        let last_miss = (0..source.image_count())
            .map(|_| AtomicU64::new(0))
            .collect();
        ReadAhead {
            queue,
            window,
            last_miss,
            fetched,
        }
    }

    /// Notes a miss of chunk `i` of `image` (of `chunks` chunks); queues the next ones if the
    /// previous miss of this image was chunk i-1.
    pub fn missed(&self, ram: &RamCache, image: u32, i: u64, chunks: u64, chunk_size: u64) {
        let Some(last) = self.last_miss.get(image as usize) else {
            return;
        };
        let before = last.swap(i + 1, Ordering::Relaxed);
        if i == 0 || before != i {
            return;
        }
        for ahead in i + 1..(i + 1 + DEPTH).min(chunks) {
            let start = ahead * chunk_size;
            if self.window.has(image, start) || ram.contains(image, CHUNK_TAG | start) {
                continue;
            }
            match self.queue.try_send((image, ahead)) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => return,
            }
        }
    }

    pub fn fetched(&self) -> u64 {
        self.fetched.load(Ordering::Relaxed)
    }

    /// Keeps the chunk at `start` of `image`, just fetched by a reader.
    pub fn pin(&self, image: u32, start: u64, chunk: Decoded) {
        pin_in(&self.window, image, start, chunk);
    }

    /// The chunk at `start` of `image` if it is kept.
    pub fn pinned(&self, image: u32, start: u64) -> Option<Decoded> {
        // Least recently used goes first: a reader's current chunk, read file after file, stays
        // while the chunks readers have moved past leave (first in, first out evicted the chunks
        // of 8 readers walking shards before their next file, 1.5x the bytes).
        let mut window = self.window.chunks.lock().unwrap_or_else(|p| p.into_inner());
        let at = window.iter().position(|(key, _)| *key == (image, start))?;
        let entry = window.remove(at)?;
        let chunk = entry.1.clone();
        window.push_back(entry);
        Some(chunk)
    }
}

impl Window {
    /// Whether the chunk at `start` of `image` is kept (without making it the latest used).
    fn has(&self, image: u32, start: u64) -> bool {
        let chunks = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
        chunks.iter().any(|(key, _)| *key == (image, start))
    }
}

fn pin_in(window: &Window, image: u32, start: u64, chunk: Decoded) {
    let mut chunks = window.chunks.lock().unwrap_or_else(|p| p.into_inner());
    if chunks.iter().any(|(key, _)| *key == (image, start)) {
        return;
    }
    if chunks.len() >= window.keep {
        chunks.pop_front();
    }
    chunks.push_back(((image, start), chunk));
}
