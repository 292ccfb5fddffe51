//! Read-ahead of source chunks for readers walking a shard in order (WebDataset loaders, `tar -x`,
//! `cat`): when a reader's first read of chunk i follows its read of chunk i-1 of the same image,
//! whether it missed them or found them fetched ahead, the next chunks are fetched by background
//! threads, through the same room as the readers' own (`Fetcher`), while the reader consumes
//! these. On an object store each chunk is a round trip of milliseconds; a sequential reader then
//! waits for none of them after the first two.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_channel::{Sender, TrySendError, bounded};

use super::Fetcher;

/// Chunks fetched ahead of a sequential reader.
const DEPTH: u64 = 2;
/// Threads fetching ahead; at most this many read-ahead requests are in flight, so read-ahead
/// never takes every request slot from the readers' own misses.
const THREADS: usize = 2;
/// Chunks waiting for a thread; more are dropped (a hint, not a promise).
const QUEUE: usize = 16;

pub struct ReadAhead {
    queue: Sender<(u32, u64)>,
    /// Per image: the last chunk read, plus one (0: none yet).
    last_read: Vec<AtomicU64>,
}

impl ReadAhead {
    pub fn new(fetcher: Arc<Fetcher>, images: usize) -> ReadAhead {
        let (queue, jobs) = bounded::<(u32, u64)>(QUEUE);
        for n in 0..THREADS {
            let (jobs, fetcher) = (jobs.clone(), fetcher.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("read-ahead-{n}"))
                .spawn(move || {
                    // Ends when the tiers are dropped (the sender with them).
                    for (image, i) in jobs {
                        fetcher.ahead(image, i);
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!("cannot start a read-ahead thread ({e}); reading without");
            }
        }
        ReadAhead {
            queue,
            last_read: (0..images).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Notes a reader's read of chunk `i` of `image` (of `chunks` chunks), missed or found in
    /// memory; queues the next ones that `wanted` if the previous chunk read of this image was
    /// chunk i-1. Counting only misses, a walk found the chunks fetched ahead, stopped counting,
    /// and waited on two chunks of every four.
    pub fn read(&self, image: u32, i: u64, chunks: u64, wanted: impl Fn(u64) -> bool) {
        let Some(last) = self.last_read.get(image as usize) else {
            return;
        };
        let before = last.swap(i + 1, Ordering::Relaxed);
        if i == 0 || before != i {
            return;
        }
        for ahead in i + 1..(i + 1 + DEPTH).min(chunks) {
            if !wanted(ahead) {
                continue;
            }
            match self.queue.try_send((image, ahead)) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => return,
            }
        }
    }
}
