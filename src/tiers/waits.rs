//! Time readers spend waiting on storage, counted wherever a reader waits: its own read of the
//! source, a chunk or a decoded unit another thread (read-ahead, the lookahead, another reader)
//! has in flight, an extent of the lookahead's window still being fetched. Three figures:
//! - the sum over readers (each reader's waits added up: with 4 loader workers, four waits at
//!   once count four times);
//! - the time some reader waited (the union of the waits: the mount's stall, comparable to what
//!   one loader with prefetch can have waited at most);
//! - per reader (process), for the loader worker that waited.
//!
//! Lock-free: a source read of a warm local file is a wait too, and counted on every read.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

/// Readers told apart, at most; the waits of any others are counted under `OTHERS`.
const READERS: usize = 256;
/// The reader of the waits no slot holds (pid 0 is no process).
pub const OTHERS: u32 = 0;

pub struct Waits {
    epoch: Instant,
    /// Nanoseconds, summed over readers.
    sum_ns: AtomicU64,
    /// Readers waiting now, since when (ns since `epoch`, set as the first begins), and the time
    /// some reader waited in all.
    waiting: AtomicU32,
    since_ns: AtomicU64,
    union_ns: AtomicU64,
    /// Per reader: the pid a slot holds (0: free) and its nanoseconds.
    pids: Vec<AtomicU32>,
    ns: Vec<AtomicU64>,
    others_ns: AtomicU64,
}

impl Default for Waits {
    fn default() -> Waits {
        Waits {
            epoch: Instant::now(),
            sum_ns: AtomicU64::new(0),
            waiting: AtomicU32::new(0),
            since_ns: AtomicU64::new(0),
            union_ns: AtomicU64::new(0),
            pids: (0..READERS).map(|_| AtomicU32::new(0)).collect(),
            ns: (0..READERS).map(|_| AtomicU64::new(0)).collect(),
            others_ns: AtomicU64::new(0),
        }
    }
}

/// A reader's wait, counted when it ends (dropped: an error or a panic ends it too).
#[must_use]
pub struct Waiting<'a> {
    waits: &'a Waits,
    reader: u32,
    began: Instant,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.waits.end(self.began, self.reader);
    }
}

impl Waits {
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// `reader` (a pid; 0: not known) begins to wait, until the returned value is dropped.
    pub fn begin(&self, reader: u32) -> Waiting<'_> {
        if self.waiting.fetch_add(1, Ordering::AcqRel) == 0 {
            self.since_ns.store(self.now_ns(), Ordering::Release);
        }
        Waiting {
            waits: self,
            reader,
            began: Instant::now(),
        }
    }

    /// A wait ends. (`since_ns` is read before this wait leaves the count: it changes only when
    /// the count goes from 0 to 1, which cannot happen while this wait is in it.)
    fn end(&self, began: Instant, reader: u32) {
        let since = self.since_ns.load(Ordering::Acquire);
        let now = self.now_ns();
        if self.waiting.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.union_ns
                .fetch_add(now.saturating_sub(since), Ordering::Relaxed);
        }
        let took = began.elapsed().as_nanos() as u64;
        self.sum_ns.fetch_add(took, Ordering::Relaxed);
        self.slot(reader).fetch_add(took, Ordering::Relaxed);
    }

    /// A wait known only once over (`took`, just ended): a reader that found another thread
    /// decoding the unit it wanted. In the stall only when no other wait was counted meanwhile
    /// (an estimate: it would overlap them).
    pub fn add_after(&self, took: std::time::Duration, reader: u32) {
        let took = took.as_nanos() as u64;
        if self.waiting.load(Ordering::Acquire) == 0 {
            self.union_ns.fetch_add(took, Ordering::Relaxed);
        }
        self.sum_ns.fetch_add(took, Ordering::Relaxed);
        self.slot(reader).fetch_add(took, Ordering::Relaxed);
    }

    /// The counter of `reader`: its slot, claimed at its first wait (open addressing from its
    /// pid's hash), or the others' when every slot is taken.
    fn slot(&self, reader: u32) -> &AtomicU64 {
        if reader == OTHERS {
            return &self.others_ns;
        }
        let start = (reader as usize).wrapping_mul(0x9E37_79B9) % READERS;
        for k in 0..READERS {
            let i = (start + k) % READERS;
            match self.pids[i].load(Ordering::Acquire) {
                p if p == reader => return &self.ns[i],
                0 => match self.pids[i].compare_exchange(
                    0,
                    reader,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return &self.ns[i],
                    Err(p) if p == reader => return &self.ns[i],
                    Err(_) => continue,
                },
                _ => continue,
            }
        }
        &self.others_ns
    }

    /// Nanoseconds waited, summed over readers.
    pub fn sum_ns(&self) -> u64 {
        self.sum_ns.load(Ordering::Relaxed)
    }

    /// Nanoseconds during which some reader waited (a wait in progress counts up to now).
    pub fn stalled_ns(&self) -> u64 {
        let done = self.union_ns.load(Ordering::Relaxed);
        match self.waiting.load(Ordering::Acquire) {
            0 => done,
            _ => {
                done + self
                    .now_ns()
                    .saturating_sub(self.since_ns.load(Ordering::Acquire))
            }
        }
    }

    /// The readers (pids) that waited, with their nanoseconds, most first; the waits of
    /// readers beyond the slots under `OTHERS`.
    pub fn by_reader(&self) -> Vec<(u32, u64)> {
        let mut all: Vec<(u32, u64)> = (0..READERS)
            .filter_map(|i| {
                let pid = self.pids[i].load(Ordering::Acquire);
                (pid != 0).then(|| (pid, self.ns[i].load(Ordering::Relaxed)))
            })
            .collect();
        let others = self.others_ns.load(Ordering::Relaxed);
        if others > 0 {
            all.push((OTHERS, others));
        }
        all.sort_unstable_by_key(|&(_, ns)| std::cmp::Reverse(ns));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Two readers waiting at once count twice in the sum and once in the stall; each reader
    /// has its own figure.
    #[test]
    fn overlapping_waits_are_summed_per_reader_and_united_for_the_mount() {
        let w = Waits::default();
        let a = w.begin(8);
        std::thread::sleep(Duration::from_millis(30));
        let b = w.begin(7);
        std::thread::sleep(Duration::from_millis(30));
        drop(b);
        drop(a);
        let (sum, stalled) = (w.sum_ns(), w.stalled_ns());
        assert!(sum >= 90_000_000, "{sum}");
        assert!((60_000_000..sum).contains(&stalled), "{stalled} of {sum}");
        let readers = w.by_reader();
        assert_eq!(readers.len(), 2);
        assert_eq!(readers[0].0, 8, "the longer wait first: {readers:?}");
        assert!(readers[0].1 >= 60_000_000 && readers[1].1 >= 30_000_000);
        // Apart, the waits add up in both.
        let c = w.begin(7);
        std::thread::sleep(Duration::from_millis(10));
        drop(c);
        assert!(w.stalled_ns() >= stalled + 10_000_000);
    }

    #[test]
    fn readers_beyond_the_slots_are_counted_together() {
        let w = Waits::default();
        for pid in 1..=(READERS as u32 + 10) {
            drop(w.begin(pid));
        }
        let readers = w.by_reader();
        assert_eq!(readers.len(), READERS + 1);
        assert!(readers.iter().any(|&(pid, _)| pid == OTHERS));
    }
}
