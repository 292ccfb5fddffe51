//! Read-ahead of source chunks for readers walking a shard in order (WebDataset loaders, `tar -x`,
//! `cat`): when a miss of chunk i follows a miss of chunk i-1 of the same image, the next chunks
//! are fetched into the RAM tier by background threads while the reader consumes these. On an
//! object store each chunk is a round trip of milliseconds; a sequential reader then waits for
//! none of them after the first two.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_channel::{Sender, TrySendError, bounded};

use super::Source;
use super::ram_cache::{CHUNK_TAG, RamCache};
use super::stage::chunk_len;

/// Chunks fetched ahead of a sequential reader.
const DEPTH: u64 = 2;
/// Threads fetching ahead; at most this many read-ahead requests are in flight, so read-ahead
/// never takes every request slot from the readers' own misses.
const THREADS: usize = 2;
/// Chunks waiting for a thread; more are dropped (a hint, not a promise).
const QUEUE: usize = 16;

pub struct ReadAhead {
    queue: Sender<(u32, u64)>,
    /// Per image: the last chunk missed, plus one (0: none yet).
    last_miss: Vec<AtomicU64>,
    /// Chunks fetched ahead so far.
    fetched: Arc<AtomicU64>,
}

impl ReadAhead {
    pub fn new(source: Arc<Source>, ram: Arc<RamCache>, chunk_size: u64) -> ReadAhead {
        let (queue, jobs) = bounded::<(u32, u64)>(QUEUE);
        let fetched = Arc::new(AtomicU64::new(0));
        for n in 0..THREADS {
            let (jobs, source, ram, fetched) =
                (jobs.clone(), source.clone(), ram.clone(), fetched.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("read-ahead-{n}"))
                .spawn(move || {
                    // Ends when the tiers are dropped (the sender with them).
                    for (image, i) in jobs {
                        let start = i * chunk_size;
                        let len = chunk_len(source.image_size(image), chunk_size, i as usize);
                        let loaded = ram.fetch(image, CHUNK_TAG | start, || {
                            let mut bytes = vec![0u8; len as usize];
                            source.read_exact_at(image, start, &mut bytes)?;
                            Ok(bytes)
                        });
                        // A failed fetch is the reader's to meet and report, with its own read.
                        if let Ok((_, true)) = loaded {
                            fetched.fetch_add(1, Ordering::Relaxed);
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
            if ram.contains(image, CHUNK_TAG | (ahead * chunk_size)) {
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
}
