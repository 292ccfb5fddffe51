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
//!
//! Where the window is too small for the readers (each needs its current chunk and the ones
//! fetched ahead of it), a chunk fetched ahead leaves it unread, its reader fetches it again, and
//! least-recently-used eviction pushes out the readers' current chunks too. As the kernel's
//! read-ahead does when its pages are evicted unused, read-ahead then pauses: the readers' own
//! fetches fill the window, each reader's chunk once. And a chunk that readers have been through
//! and that left the window is never fetched ahead again (a request queued before a reader got
//! there first).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_channel::{Sender, TrySendError, bounded};

use super::Source;
use super::ram_cache::{CHUNK_TAG, Decoded, RamCache, Room};
use super::stage::{ForRead, Stage, chunk_len};
use crate::source::read_at::Wait;

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

/// A chunk: (image, chunk start).
type Key = (u32, u64);

/// The chunks fetched lately, and how many are kept.
struct Window {
    state: Mutex<WindowState>,
    keep: usize,
}

#[derive(Default)]
struct WindowState {
    /// Least recently used first.
    kept: VecDeque<Kept>,
    /// Chunks that left the window after a reader used them, the latest `2 * keep`.
    passed: VecDeque<Key>,
    /// Chunks readers fetch before read-ahead resumes (0: reading ahead).
    paused: usize,
    /// The next pause: doubled each time the window is found too small again, halved when a
    /// chunk fetched ahead is read (0: not paused yet).
    backoff: usize,
}

struct Kept {
    key: Key,
    chunk: Decoded,
    /// A reader used it (fetched it, or read it here); false for a chunk fetched ahead that no
    /// reader has reached yet.
    read: bool,
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
            state: Mutex::default(),
            keep: keep as usize,
        });
        let weak = Arc::downgrade(&window);
        ram.memory().add_reclaimer(Box::new(move |bytes| {
            if let Some(window) = weak.upgrade() {
                window.let_go(bytes);
            }
        }));
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
                        if !window.wants_ahead(image, start) {
                            continue;
                        }
                        // A chunk of an image being staged is read once: fetched ahead only if
                        // neither the stager nor a read has it, then handed to the stager (or
                        // stored here when its queue is full).
                        let staging = stage.as_deref().filter(|s| s.keeps(image) && !s.stopped());
                        let how = staging.map(|s| s.claim_for_read(image, i as usize, Wait::May));
                        if how.is_some_and(|h| !matches!(h, ForRead::Fetch | ForRead::Store)) {
                            continue;
                        }
                        let len = chunk_len(source.image_size(image), chunk_size, i as usize);
                        // A hint: never waits for room in the memory budget.
                        let loaded = ram.fetch_chunk(&source, image, start, len, Room::IfFree);
                        // A failed fetch is the reader's to meet and report, with its own read.
                        let chunk = match loaded {
                            Ok((chunk, true)) => {
                                fetched.fetch_add(1, Ordering::Relaxed);
                                window.keep(image, start, chunk.clone(), false);
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
            if !self.window.wants_ahead(image, start) || ram.contains(image, CHUNK_TAG | start) {
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
        self.window.keep(image, start, chunk, true);
    }

    /// The chunk at `start` of `image` if it is kept.
    pub fn pinned(&self, image: u32, start: u64) -> Option<Decoded> {
        // Least recently used goes first: a reader's current chunk, read file after file, stays
        // while the chunks readers have moved past leave (first in, first out evicted the chunks
        // of 8 readers walking shards before their next file, 1.5x the bytes).
        self.window.read(image, start)
    }
}

impl Window {
    fn lock(&self) -> std::sync::MutexGuard<'_, WindowState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the chunk at `start` of `image` is one to fetch ahead: read-ahead is not paused,
    /// the window does not hold it, and readers did not go through it already.
    fn wants_ahead(&self, image: u32, start: u64) -> bool {
        let state = self.lock();
        state.paused == 0
            && !state.kept.iter().any(|k| k.key == (image, start))
            && !state.passed.contains(&(image, start))
    }

    /// The chunk at `start` of `image` if it is kept, now the latest used.
    fn read(&self, image: u32, start: u64) -> Option<Decoded> {
        let mut state = self.lock();
        let at = state.kept.iter().position(|k| k.key == (image, start))?;
        let mut entry = state.kept.remove(at)?;
        if !entry.read {
            // Read-ahead worked for this reader: pause less the next time.
            state.backoff /= 2;
        }
        entry.read = true;
        let chunk = entry.chunk.clone();
        state.kept.push_back(entry);
        Some(chunk)
    }

    /// Drops the least recently used chunks, about `bytes` of them (the memory budget is short).
    fn let_go(&self, bytes: u64) {
        let mut state = self.lock();
        let mut freed = 0;
        while freed < bytes
            && let Some(gone) = state.kept.pop_front()
        {
            freed += gone.chunk.capacity() as u64;
        }
    }

    /// Stops reading ahead while the readers' own fetches turn the window over twice, longer
    /// each time it happens again (up to 32 times over).
    fn pause(&self, state: &mut WindowState) {
        if state.paused > 0 {
            // The chunks fetched ahead before the pause leaving: the same shortage.
            return;
        }
        state.backoff = (state.backoff * 2).clamp(2 * self.keep, 32 * self.keep);
        state.paused = state.backoff;
    }

    /// Keeps a chunk just fetched, by a reader (`read`) or ahead, in place of the least recently
    /// used one.
    fn keep(&self, image: u32, start: u64, chunk: Decoded, read: bool) {
        let mut state = self.lock();
        if read {
            state.paused = state.paused.saturating_sub(1);
        }
        if let Some(kept) = state.kept.iter_mut().find(|k| k.key == (image, start)) {
            kept.read |= read;
            return;
        }
        if state.kept.len() >= self.keep
            && let Some(gone) = state.kept.pop_front()
        {
            if gone.read {
                if state.passed.len() >= 2 * self.keep {
                    state.passed.pop_front();
                }
                state.passed.push_back(gone.key);
            } else {
                // Fetched ahead and never read: the window is too small for the readers and
                // what is fetched ahead of them.
                self.pause(&mut state);
            }
        }
        // A chunk fetched again is no longer behind its readers. Fetched again by a reader, it
        // left the window too early: the readers' current chunks do not all fit beside what is
        // fetched ahead.
        let before = state.passed.len();
        state.passed.retain(|&key| key != (image, start));
        if read && state.passed.len() < before {
            self.pause(&mut state);
        }
        state.kept.push_back(Kept {
            key: (image, start),
            chunk,
            read,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Window {
        fn has(&self, image: u32, start: u64) -> bool {
            self.lock().kept.iter().any(|k| k.key == (image, start))
        }

        fn passed(&self, image: u32, start: u64) -> bool {
            self.lock().passed.contains(&(image, start))
        }

        fn paused(&self) -> bool {
            self.lock().paused > 0
        }
    }

    fn window(keep: usize) -> Window {
        Window {
            state: Mutex::default(),
            keep,
        }
    }

    fn chunk() -> Decoded {
        Arc::new(super::super::ram_cache::Held::unbudgeted(vec![0u8; 16]))
    }

    #[test]
    fn a_chunk_fetched_ahead_that_leaves_unread_pauses_read_ahead() {
        let w = window(2);
        w.keep(0, 0, chunk(), false);
        w.keep(0, 1, chunk(), false);
        assert!(!w.paused());
        // A reader's fetch pushes out a chunk fetched ahead that nobody read.
        w.keep(1, 0, chunk(), true);
        assert!(w.paused());
        // Until the readers fetched twice the window.
        for i in 1..4 {
            w.keep(1, i, chunk(), true);
            assert!(w.paused(), "after {i} fetches");
        }
        w.keep(1, 4, chunk(), true);
        assert!(!w.paused());
        // Again: twice as long.
        w.keep(2, 0, chunk(), false);
        w.keep(2, 1, chunk(), false);
        w.keep(1, 5, chunk(), true);
        for i in 6..14 {
            assert!(w.paused(), "chunk {i}");
            w.keep(1, i, chunk(), true);
        }
        assert!(!w.paused());
    }

    #[test]
    fn a_chunk_readers_went_through_is_not_fetched_ahead_and_fetching_it_again_pauses() {
        let w = window(2);
        for i in 0..3 {
            w.keep(0, i, chunk(), true);
        }
        assert!(w.passed(0, 0) && !w.passed(0, 1) && !w.has(0, 0));
        assert!(!w.paused(), "a chunk left behind is no reason to pause");
        // A reader needs it again: the window let it go too early.
        w.keep(0, 0, chunk(), true);
        assert!(w.paused());
        assert!(!w.passed(0, 0) && w.has(0, 0));
    }

    #[test]
    fn read_ahead_wants_a_chunk_not_kept_not_passed_and_not_while_paused() {
        let w = window(2);
        for i in 0..3 {
            w.keep(0, i, chunk(), true);
        }
        assert!(w.wants_ahead(0, 3));
        assert!(!w.wants_ahead(0, 2), "kept");
        assert!(!w.wants_ahead(0, 0), "readers went through it");
        w.keep(0, 0, chunk(), true);
        assert!(!w.wants_ahead(0, 3), "paused");
    }

    /// Fetches three chunks ahead that nobody reads (the first leaves unread); the pause.
    fn ahead_unread(w: &Window, next: &mut u64) -> usize {
        for _ in 0..3 {
            w.keep(0, *next, chunk(), false);
            *next += 1;
        }
        w.lock().paused
    }

    /// Readers' fetches until read-ahead resumes.
    fn resume(w: &Window, next: &mut u64) {
        while w.paused() {
            w.keep(1, *next, chunk(), true);
            *next += 1;
        }
    }

    #[test]
    fn read_ahead_that_is_read_pauses_less_the_next_time() {
        let (w, mut next) = (window(2), 0);
        assert_eq!(ahead_unread(&w, &mut next), 4);
        resume(&w, &mut next);
        assert_eq!(ahead_unread(&w, &mut next), 8, "found too small again");
        // A reader reaches a chunk fetched ahead in time.
        assert!(w.read(0, next - 1).is_some());
        resume(&w, &mut next);
        assert_eq!(ahead_unread(&w, &mut next), 8, "halved, then doubled");
        resume(&w, &mut next);
        assert_eq!(ahead_unread(&w, &mut next), 16);
    }
}
