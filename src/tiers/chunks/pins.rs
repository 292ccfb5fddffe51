//! Which chunks the RAM cache must not evict yet, and when read-ahead pauses.
//!
//! The chunks fetched lately (ahead, or by a reader) stay pinned in the cache until their readers
//! are through with them: a reader's current chunk, read file after file, and the chunks fetched
//! ahead of it. The bytes are the cache's (one budget); this keeps only keys and flags, the
//! latest `keep`, least recently used unpinned first (first in, first out evicted the chunks of 8
//! readers walking shards before their next file: 1.5x the bytes).
//!
//! Where `keep` is too small for the readers (each needs its current chunk and the ones fetched
//! ahead of it), a chunk fetched ahead is unpinned unread, its reader fetches it again, and the
//! readers' current chunks are unpinned too. As the kernel's read-ahead does when its pages are
//! evicted unused, read-ahead then pauses: the readers' own fetches fill the pins, each reader's
//! chunk once. And a chunk that readers have been through and that left the pins is never
//! fetched ahead again (a request queued before a reader got there first).

use std::collections::VecDeque;
use std::sync::{Mutex, Weak};

use super::super::ram_cache::{Decoded, Held};

/// A chunk: (image, chunk start).
pub type Key = (u32, u64);

pub struct Pins {
    state: Mutex<State>,
    keep: usize,
}

#[derive(Default)]
struct State {
    /// Least recently used first.
    pinned: VecDeque<Pin>,
    /// Chunks unpinned after a reader used them, the latest `2 * keep`.
    passed: VecDeque<Key>,
    /// Chunks readers fetch before read-ahead resumes (0: reading ahead).
    paused: usize,
    /// The next pause: doubled each time the pins are found too few again, halved when a chunk
    /// fetched ahead is read (0: not paused yet).
    backoff: usize,
}

struct Pin {
    key: Key,
    /// The cached value (gone when the memory budget made the cache let it go).
    held: Weak<Held>,
    /// A reader used it (fetched it, or read it since); false for a chunk fetched ahead that no
    /// reader has reached yet.
    read: bool,
}

impl Pin {
    fn unpin(&self) {
        if let Some(held) = self.held.upgrade() {
            held.pin(false);
        }
    }

    fn in_cache(&self) -> bool {
        self.held.strong_count() > 0
    }
}

impl Pins {
    /// Pins for `keep` chunks at most (0: none; `pin` is then not to be called).
    pub fn new(keep: usize) -> Pins {
        Pins {
            state: Mutex::default(),
            keep,
        }
    }

    /// Whether chunks are kept for their readers at all.
    pub fn keeps_any(&self) -> bool {
        self.keep > 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `key` is a chunk to fetch ahead: read-ahead is not paused, the chunk is not
    /// pinned, and readers did not go through it already.
    pub fn wants_ahead(&self, key: Key) -> bool {
        let state = self.lock();
        state.paused == 0
            && !state.pinned.iter().any(|p| p.key == key && p.in_cache())
            && !state.passed.contains(&key)
    }

    /// A reader read `key` from the cache: now the latest used. Whether it was pinned.
    pub fn read(&self, key: Key) -> bool {
        let mut state = self.lock();
        let Some(at) = state.pinned.iter().position(|p| p.key == key) else {
            return false;
        };
        let Some(mut pin) = state.pinned.remove(at) else {
            return false;
        };
        if !pin.read {
            // Read-ahead worked for this reader: pause less the next time.
            state.backoff /= 2;
        }
        pin.read = true;
        state.pinned.push_back(pin);
        true
    }

    /// Pins `chunk`, just fetched by a reader (`read`) or ahead, in place of the least recently
    /// used pin.
    pub fn pin(&self, key: Key, chunk: &Decoded, read: bool) {
        chunk.pin(true);
        let mut state = self.lock();
        if read {
            state.paused = state.paused.saturating_sub(1);
        }
        if let Some(pin) = state.pinned.iter_mut().find(|p| p.key == key) {
            pin.read |= read;
            pin.held = std::sync::Arc::downgrade(chunk);
            return;
        }
        if state.pinned.len() >= self.keep
            && let Some(gone) = state.pinned.pop_front()
        {
            gone.unpin();
            if gone.read {
                if state.passed.len() >= 2 * self.keep {
                    state.passed.pop_front();
                }
                state.passed.push_back(gone.key);
            } else {
                // Fetched ahead and never read: too few pins for the readers and what is
                // fetched ahead of them.
                self.pause(&mut state);
            }
        }
        // A chunk fetched again is no longer behind its readers. Fetched again by a reader, it
        // was unpinned too early: the readers' current chunks do not all fit beside what is
        // fetched ahead.
        let before = state.passed.len();
        state.passed.retain(|&k| k != key);
        if read && state.passed.len() < before {
            self.pause(&mut state);
        }
        state.pinned.push_back(Pin {
            key,
            held: std::sync::Arc::downgrade(chunk),
            read,
        });
    }

    /// Stops reading ahead while the readers' own fetches turn the pins over twice, longer each
    /// time it happens again (up to 32 times over).
    fn pause(&self, state: &mut State) {
        if state.paused > 0 {
            // The chunks fetched ahead before the pause leaving: the same shortage.
            return;
        }
        state.backoff = (state.backoff * 2).clamp(2 * self.keep, 32 * self.keep);
        state.paused = state.backoff;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    impl Pins {
        fn has(&self, key: Key) -> bool {
            self.lock().pinned.iter().any(|p| p.key == key)
        }

        fn passed(&self, key: Key) -> bool {
            self.lock().passed.contains(&key)
        }

        fn paused(&self) -> bool {
            self.lock().paused > 0
        }
    }

    fn chunk() -> Decoded {
        Arc::new(Held::unbudgeted(vec![0u8; 16]))
    }

    /// Pins a new chunk (kept alive by the test, as the cache would).
    fn pin(p: &Pins, held: &mut Vec<Decoded>, key: Key, read: bool) {
        let c = chunk();
        p.pin(key, &c, read);
        held.push(c);
    }

    #[test]
    fn a_pinned_chunk_is_unpinned_when_it_leaves() {
        let (p, mut held) = (Pins::new(2), Vec::new());
        for i in 0..3 {
            pin(&p, &mut held, (0, i), true);
        }
        assert!(!held[0].is_pinned(), "the least recently used left");
        assert!(held[1].is_pinned() && held[2].is_pinned());
        // Read again, chunk 1 is the latest used: the next pin unpins chunk 2.
        assert!(p.read((0, 1)));
        pin(&p, &mut held, (0, 3), true);
        assert!(held[1].is_pinned() && !held[2].is_pinned());
    }

    #[test]
    fn a_chunk_fetched_ahead_that_leaves_unread_pauses_read_ahead() {
        let (p, mut held) = (Pins::new(2), Vec::new());
        pin(&p, &mut held, (0, 0), false);
        pin(&p, &mut held, (0, 1), false);
        assert!(!p.paused());
        // A reader's fetch unpins a chunk fetched ahead that nobody read.
        pin(&p, &mut held, (1, 0), true);
        assert!(p.paused());
        // Until the readers fetched twice the pins.
        for i in 1..4 {
            pin(&p, &mut held, (1, i), true);
            assert!(p.paused(), "after {i} fetches");
        }
        pin(&p, &mut held, (1, 4), true);
        assert!(!p.paused());
        // Again: twice as long.
        pin(&p, &mut held, (2, 0), false);
        pin(&p, &mut held, (2, 1), false);
        pin(&p, &mut held, (1, 5), true);
        for i in 6..14 {
            assert!(p.paused(), "chunk {i}");
            pin(&p, &mut held, (1, i), true);
        }
        assert!(!p.paused());
    }

    #[test]
    fn a_chunk_readers_went_through_is_not_fetched_ahead_and_fetching_it_again_pauses() {
        let (p, mut held) = (Pins::new(2), Vec::new());
        for i in 0..3 {
            pin(&p, &mut held, (0, i), true);
        }
        assert!(p.passed((0, 0)) && !p.passed((0, 1)) && !p.has((0, 0)));
        assert!(!p.paused(), "a chunk left behind is no reason to pause");
        // A reader needs it again: it was unpinned too early.
        pin(&p, &mut held, (0, 0), true);
        assert!(p.paused());
        assert!(!p.passed((0, 0)) && p.has((0, 0)));
    }

    #[test]
    fn read_ahead_wants_a_chunk_not_pinned_not_passed_and_not_while_paused() {
        let (p, mut held) = (Pins::new(2), Vec::new());
        for i in 0..3 {
            pin(&p, &mut held, (0, i), true);
        }
        assert!(p.wants_ahead((0, 3)));
        assert!(!p.wants_ahead((0, 2)), "pinned");
        assert!(!p.wants_ahead((0, 0)), "readers went through it");
        // The cache let a pinned chunk go (the memory budget was short): wanted again.
        held.truncate(1);
        assert!(p.wants_ahead((0, 2)));
        pin(&p, &mut held, (0, 0), true);
        assert!(!p.wants_ahead((0, 3)), "paused");
    }

    /// Fetches three chunks ahead that nobody reads (the first leaves unread); the pause.
    fn ahead_unread(p: &Pins, held: &mut Vec<Decoded>, next: &mut u64) -> usize {
        for _ in 0..3 {
            pin(p, held, (0, *next), false);
            *next += 1;
        }
        p.lock().paused
    }

    /// Readers' fetches until read-ahead resumes.
    fn resume(p: &Pins, held: &mut Vec<Decoded>, next: &mut u64) {
        while p.paused() {
            pin(p, held, (1, *next), true);
            *next += 1;
        }
    }

    #[test]
    fn read_ahead_that_is_read_pauses_less_the_next_time() {
        let (p, mut held, mut next) = (Pins::new(2), Vec::new(), 0);
        assert_eq!(ahead_unread(&p, &mut held, &mut next), 4);
        resume(&p, &mut held, &mut next);
        assert_eq!(
            ahead_unread(&p, &mut held, &mut next),
            8,
            "found too few again"
        );
        // A reader reaches a chunk fetched ahead in time.
        assert!(p.read((0, next - 1)));
        resume(&p, &mut held, &mut next);
        assert_eq!(
            ahead_unread(&p, &mut held, &mut next),
            8,
            "halved, then doubled"
        );
        resume(&p, &mut held, &mut next);
        assert_eq!(ahead_unread(&p, &mut held, &mut next), 16);
    }
}
