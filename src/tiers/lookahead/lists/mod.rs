//! The samplers' lists and what to fetch next: pure bookkeeping, no threads and no I/O.
//!
//! A list is one rank's order of samples for an epoch (catalog entries). Its readers are found
//! by their reads: each reader (a DataLoader worker, a thread) that reads sample p becomes a
//! *head* at p + 1, and the samples after each head are fetched, its share of the window's bytes
//! ahead of it. A DataLoader's workers each read a batch of consecutive positions, so a list has
//! as many heads as workers; a reader that jumps (its next batch, a resumed epoch, a skip) moves
//! its head there, and a reader that stops leaves a head that stops asking once its share is
//! fetched: nothing is fetched beyond the readers.

use std::time::{Duration, Instant};

pub use crate::tiers::images::Class;

mod gather;
pub use gather::Place;
use gather::{Extent, Gather};

/// A list's state per position.
const TODO: u8 = 0;
/// Fetched, being fetched, or given up on (a fetch that failed is not retried ahead: its reader
/// meets the error with its own read).
const FETCHED: u8 = 1;
/// Already local (staged, in the RAM cache) or not worth fetching ahead: nothing to do.
const RESIDENT: u8 = 2;
/// Read by a reader.
const READ: u8 = 3;

/// Heads per list at most (the least recently seen is replaced).
const MAX_HEADS: usize = 128;
/// A head that has not read for this long asks for nothing.
pub const HEAD_LIFE: Duration = Duration::from_secs(10);
/// Positions a head looks ahead at most, whatever the bytes (tiny samples).
pub const MAX_AHEAD: u32 = 2048;
/// Heads this close (in positions) read one stretch of the list.
pub const REGION_GAP: u32 = 64;
/// Samples merged into one request when they lie back to back in an image (a tar's 512-byte
/// headers between them are read along), and the bytes such a request may span.
pub const MERGE_GAP: u64 = 16 << 10;
pub const MERGE_MAX: u64 = 4 << 20;

/// Who sent a list: the user, the sampler's stream name and the rank. A list replaces the one
/// with the same key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ListKey {
    pub uid: u32,
    pub stream: String,
    pub rank: u32,
}

/// One fetch: samples `first..=last` of list `list`, which all lie in `what` (more than one
/// only for `Exact`), or some of them (`gathered`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    pub list: u64,
    pub first: u32,
    pub last: u32,
    /// The last of the run of positions from `first` (samples back to back in the image).
    pub run_last: u32,
    /// The catalog entries of `first` (for `Decode`) and `last`.
    pub entry: u32,
    pub last_entry: u32,
    pub what: Class,
    /// The samples' own bytes in an `Exact` fetch (without the gaps between them): read all,
    /// the extent is done with.
    pub payload: u64,
    /// How many samples it fetches (positions between `first` and `last` may be others', when
    /// it gathered samples further down the list).
    pub samples: u64,
    /// The positions and entries of the samples gathered down the list (`List::gather`),
    /// beyond the run of positions from `first`.
    pub gathered: Vec<(u32, u32)>,
}

impl Job {
    /// The list positions of its samples.
    pub fn positions(&self) -> impl Iterator<Item = u32> + '_ {
        (self.first..=self.run_last).chain(self.gathered.iter().map(|&(p, _)| p))
    }
}

#[derive(Clone, Copy, Debug)]
struct Head {
    reader: u32,
    /// The next position it will read.
    at: u32,
    seen: Instant,
}

/// Counters of the lists.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListStats {
    /// First reads of listed samples, and those that found nothing fetched (missed), or the
    /// sample local already (resident).
    pub first_reads: u64,
    pub missed: u64,
    pub resident: u64,
    /// Samples fetched ahead, and in how many requests.
    pub fetched: u64,
    pub requests: u64,
}

pub struct List {
    pub id: u64,
    pub key: ListKey,
    entries: Vec<u32>,
    /// (entry, position), sorted: where a read sample is in the list.
    by_entry: Vec<(u32, u32)>,
    /// Where the samples stored in one piece lie, in image order (`gather`).
    by_place: Vec<Place>,
    state: Vec<u8>,
    heads: Vec<Head>,
    pub last_read: Instant,
    pub stats: ListStats,
    /// The memory budget's permits for this bookkeeping.
    pub permits: Vec<crate::tiers::budget::Permit>,
}

/// The reader number of the head a list starts with, before any read (its epoch's start).
const START: u32 = u32::MAX;

impl List {
    pub fn new(id: u64, key: ListKey, entries: Vec<u32>, now: Instant) -> List {
        let mut by_entry: Vec<(u32, u32)> = entries
            .iter()
            .enumerate()
            .map(|(p, &e)| (e, p as u32))
            .collect();
        by_entry.sort_unstable();
        let state = vec![TODO; entries.len()];
        List {
            id,
            key,
            entries,
            by_entry,
            by_place: Vec::new(),
            state,
            heads: vec![Head {
                reader: START,
                at: 0,
                seen: now,
            }],
            last_read: now,
            stats: ListStats::default(),
            permits: Vec::new(),
        }
    }

    /// Whether every sample at `positions` has been read.
    pub fn all_read(&self, mut positions: impl Iterator<Item = u32>) -> bool {
        positions.all(|p| self.state.get(p as usize) == Some(&READ))
    }

    /// Whether no sample at `positions` has been read.
    pub fn none_read(&self, mut positions: impl Iterator<Item = u32>) -> bool {
        positions.all(|p| self.state.get(p as usize) != Some(&READ))
    }

    /// The bytes (`size` of each entry) of the samples at `positions` that have been read.
    pub fn read_bytes(
        &self,
        positions: impl Iterator<Item = u32>,
        size: impl Fn(u32) -> u64,
    ) -> u64 {
        positions
            .filter(|&p| self.state.get(p as usize) == Some(&READ))
            .map(|p| size(self.entries[p as usize]))
            .sum()
    }

    /// The entry at position `p`.
    pub fn entry_at(&self, p: u32) -> u32 {
        self.entries[p as usize]
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Notes that `reader` reads `entry`, if it is in the list: its head moves past it.
    /// Returns whether it was.
    pub fn read(&mut self, reader: u32, entry: u32, now: Instant) -> bool {
        // The first position of the entry not read yet (a list may hold a sample twice:
        // DistributedSampler pads with repeats).
        let from = self.by_entry.partition_point(|&(e, _)| e < entry);
        let mut found = None;
        for &(e, p) in &self.by_entry[from..] {
            if e != entry {
                break;
            }
            found.get_or_insert(p);
            if self.state[p as usize] != READ {
                found = Some(p);
                break;
            }
        }
        let Some(p) = found else {
            return false;
        };
        let state = &mut self.state[p as usize];
        if *state != READ {
            self.stats.first_reads += 1;
            match *state {
                TODO => self.stats.missed += 1,
                RESIDENT => self.stats.resident += 1,
                _ => {}
            }
            *state = READ;
        }
        self.last_read = now;
        // The epoch's start stood for readers not seen yet: from the first read, they are.
        self.heads.retain(|h| h.reader != START);
        let at = p + 1;
        match self.heads.iter_mut().find(|h| h.reader == reader) {
            Some(h) => {
                h.at = at;
                h.seen = now;
            }
            None => {
                let head = Head {
                    reader,
                    at,
                    seen: now,
                };
                if self.heads.len() < MAX_HEADS {
                    self.heads.push(head);
                } else if let Some(oldest) = self.heads.iter_mut().min_by_key(|h| h.seen) {
                    *oldest = head;
                }
            }
        }
        true
    }

    /// Stretches of the list that readers read now: live heads, those within `REGION_GAP`
    /// positions of each other counted once. Readers taking the next sample in turn read one
    /// stretch (and share its part of the window); DataLoader workers, a batch each, read as
    /// many stretches as there are workers.
    pub fn regions(&self, now: Instant) -> usize {
        let mut at: Vec<u32> = self
            .heads
            .iter()
            .filter(|h| now.duration_since(h.seen) < HEAD_LIFE)
            .map(|h| h.at)
            .collect();
        at.sort_unstable();
        let apart = at.windows(2).filter(|w| w[1] - w[0] > REGION_GAP).count();
        if at.is_empty() { 0 } else { apart + 1 }
    }

    /// Whether positions `first..=last` are still ahead of a head seen within `life`, within
    /// its reach, or being read by it (a head is at p + 1 from the start of its read of p):
    /// what a reader may yet want.
    pub fn wanted(&self, first: u32, last: u32, now: Instant, life: Duration) -> bool {
        self.heads.iter().any(|h| {
            now.duration_since(h.seen) < life
                && h.at <= last.saturating_add(1)
                && first < h.at.saturating_add(MAX_AHEAD)
        })
    }

    /// The most urgent fetch of this list: for each live head, the first sample not fetched
    /// among those within `share` bytes after it (`size` of each entry), how many bytes of
    /// samples fetched and unread lie before it, and when its reader last read. Samples
    /// `classify` finds local are marked so on the way.
    pub fn next(
        &mut self,
        share: u64,
        now: Instant,
        size: &impl Fn(u32) -> u64,
        classify: &mut impl FnMut(u32) -> Class,
    ) -> Option<(u64, u32, Instant)> {
        let mut best: Option<(u64, u32, Instant)> = None;
        for h in 0..self.heads.len() {
            let head = self.heads[h];
            if now.duration_since(head.seen) >= HEAD_LIFE {
                continue;
            }
            let mut ahead = 0u64;
            let end = (head.at as usize + MAX_AHEAD as usize).min(self.entries.len());
            for p in head.at as usize..end {
                if ahead >= share || best.is_some_and(|(b, ..)| ahead >= b) {
                    break;
                }
                match self.state[p] {
                    TODO => match classify(self.entries[p]) {
                        Class::Resident => self.state[p] = RESIDENT,
                        _ => {
                            best = Some((ahead, p as u32, head.seen));
                            break;
                        }
                    },
                    FETCHED => ahead += size(self.entries[p]),
                    _ => {}
                }
            }
        }
        best
    }

    /// The job for position `p` (which `next` chose): the sample, and for exact fetches the
    /// samples after it that lie right behind it in the same image, then those further down
    /// the list that lie near the extent in the image (`gather`), up to `MERGE_MAX` bytes and
    /// `budget`. Marks them fetched.
    pub fn take(
        &mut self,
        p: u32,
        budget: u64,
        (horizon, alone): (u32, &impl Fn(u32) -> bool),
        classify: &mut impl FnMut(u32) -> Class,
    ) -> Job {
        let entry = self.entries[p as usize];
        let mut what = classify(entry);
        let mut last = p;
        let mut payload = 0;
        let mut count = 1;
        let mut gathered = Vec::new();
        let mut run_last = p;
        self.state[p as usize] = FETCHED;
        if let Class::Exact { image, start, len } = &mut what {
            let own = (*image, *start, *len);
            payload = *len;
            let limit = MERGE_MAX.min(budget.max(*len));
            while let Some(q) = last.checked_add(1).filter(|&q| (q as usize) < self.len()) {
                if self.state[q as usize] != TODO {
                    break;
                }
                let Class::Exact {
                    image: i,
                    start: s,
                    len: l,
                } = classify(self.entries[q as usize])
                else {
                    break;
                };
                let end = *start + *len;
                if i != *image || s < end || s - end > MERGE_GAP || s + l - *start > limit {
                    break;
                }
                *len = s + l - *start;
                payload += l;
                last = q;
                count += 1;
                self.state[q as usize] = FETCHED;
            }
            let mut extent = Extent {
                image: *image,
                start: *start,
                end: *start + *len,
                payload,
                count,
                last,
            };
            run_last = last;
            let gather = Gather { p, own, horizon };
            self.gather(gather, &mut extent, limit, (classify, alone), &mut gathered);
            (*start, *len, payload, count, last) = (
                extent.start,
                extent.end - extent.start,
                extent.payload,
                extent.count,
                extent.last,
            );
        }
        self.stats.fetched += count;
        self.stats.requests += 1;
        Job {
            list: self.id,
            first: p,
            last,
            run_last,
            entry,
            last_entry: self.entries[last as usize],
            what,
            payload,
            samples: count,
            gathered,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn key(rank: u32) -> ListKey {
        ListKey {
            uid: 1000,
            stream: "train".into(),
            rank,
        }
    }

    /// Entry e is 100 bytes at 1000 * e of image 0 (none adjacent), unless said otherwise.
    fn spread(e: u32) -> Class {
        Class::Exact {
            image: 0,
            start: 1000 * e as u64,
            len: 100,
        }
    }

    /// Entry e is 100 bytes at 200 * e of image 0 (100 bytes apart), e >= 1000 in image 1.
    fn take_next(list: &mut List, share: u64, now: Instant) -> Option<Job> {
        let (_, p, _) = list.next(share, now, &|_| 100, &mut spread)?;
        Some(list.take(p, share, (p, &|_| false), &mut spread))
    }

    #[test]
    fn a_list_is_fetched_from_its_start_up_to_its_share_ahead_of_its_reader() {
        let now = Instant::now();
        let mut list = List::new(1, key(0), vec![5, 3, 9, 1, 7], now);
        // Before any read: the first 3 (300 bytes), then no more.
        let got: Vec<u32> = std::iter::from_fn(|| take_next(&mut list, 300, now))
            .map(|j| j.entry)
            .collect();
        assert_eq!(got, [5, 3, 9]);
        // A reader reads the first: its head asks for the next beyond what is fetched.
        assert!(list.read(42, 5, now));
        assert!(!list.read(42, 77, now), "not in the list");
        let j = take_next(&mut list, 300, now).unwrap();
        assert_eq!(j.entry, 1);
        assert_eq!(take_next(&mut list, 300, now), None);
        let s = list.stats;
        assert_eq!((s.first_reads, s.missed, s.fetched), (1, 0, 4));
    }

    #[test]
    fn a_reader_that_jumps_moves_its_head_and_one_that_stops_asks_for_nothing() {
        let now = Instant::now();
        let entries: Vec<u32> = (0..100).collect();
        let mut list = List::new(1, key(0), entries, now);
        while take_next(&mut list, 300, now).is_some() {}
        // Reads 50 (a skip): missed, and the head fetches 51..53.
        assert!(list.read(7, 50, now));
        let got: Vec<u32> = std::iter::from_fn(|| take_next(&mut list, 300, now))
            .map(|j| j.entry)
            .collect();
        assert_eq!(got, [51, 52, 53]);
        assert_eq!(list.stats.missed, 1);
        // The epoch's start is left behind: what it fetched is nobody's to read now; the sample
        // being read is still wanted (its reader copies it out after it moved its head).
        assert!(!list.wanted(0, 2, now, HEAD_LIFE));
        assert!(list.wanted(50, 50, now, HEAD_LIFE));
        // Nobody reads for HEAD_LIFE: nothing more, even with room.
        let later = now + HEAD_LIFE;
        assert_eq!(take_next(&mut list, 1 << 30, later), None);
        assert!(!list.wanted(51, 53, later, HEAD_LIFE));
        assert!(list.wanted(51, 53, now, HEAD_LIFE));
        assert!(!list.wanted(51, 53, now + Duration::from_secs(3), Duration::from_secs(2)));
    }

    #[test]
    fn several_readers_each_get_their_share_and_a_sample_is_fetched_once() {
        let now = Instant::now();
        let entries: Vec<u32> = (0..64).collect();
        let mut list = List::new(1, key(0), entries, now);
        // Two workers reading batches of 16: positions 0 and 16.
        list.read(1, 0, now);
        list.read(2, 16, now);
        let mut got: Vec<u32> = std::iter::from_fn(|| take_next(&mut list, 300, now))
            .map(|j| j.entry)
            .collect();
        got.sort();
        // Worker 1's head (and the start's, whose first sample was read) three after 0, worker
        // 2's three after 16; the most urgent first.
        assert_eq!(got, [1, 2, 3, 17, 18, 19]);
        // The second reader reads on: one more for it only.
        list.read(2, 17, now);
        assert_eq!(take_next(&mut list, 300, now).unwrap().entry, 20);
        assert_eq!(take_next(&mut list, 300, now), None);
    }

    #[test]
    fn readers_taking_samples_in_turn_share_one_stretch_and_workers_a_batch_apart_do_not() {
        let now = Instant::now();
        let mut list = List::new(1, key(0), (0..2000).collect(), now);
        for r in 0..8 {
            list.read(r, r, now);
        }
        // The start head at 0 and eight readers at 1..8: one stretch.
        assert_eq!(list.regions(now), 1);
        // Four more workers, each at the start of its batch of 256.
        for w in 1..5 {
            list.read(100 + w, w * 256, now);
        }
        assert_eq!(list.regions(now), 5);
        assert_eq!(list.regions(now + HEAD_LIFE), 0);
    }

    #[test]
    fn back_to_back_samples_are_fetched_in_one_request() {
        let now = Instant::now();
        // Entries 0..4 lie back to back (512-byte headers between), 4 elsewhere.
        let mut adjacent = |e: u32| Class::Exact {
            image: 0,
            start: if e < 4 { e as u64 * 1124 } else { 1 << 30 },
            len: 600,
        };
        let mut list = List::new(1, key(0), (0..6).collect(), now);
        let (_, p, _) = list.next(1 << 20, now, &|_| 600, &mut adjacent).unwrap();
        let job = list.take(p, 1 << 20, (p, &|_| false), &mut adjacent);
        assert_eq!((job.first, job.last, job.payload), (0, 3, 4 * 600));
        assert_eq!(
            job.what,
            Class::Exact {
                image: 0,
                start: 0,
                len: 3 * 1124 + 600
            }
        );
        let (_, p, _) = list.next(1 << 20, now, &|_| 600, &mut adjacent).unwrap();
        assert_eq!(
            list.take(p, 1 << 20, (p, &|_| false), &mut adjacent).first,
            4
        );
        assert_eq!((list.stats.fetched, list.stats.requests), (5, 2));
    }

    #[test]
    fn local_samples_are_passed_over_and_counted_when_read() {
        let now = Instant::now();
        let mut list = List::new(1, key(0), vec![0, 1, 2], now);
        let mut local = |e: u32| if e == 0 { Class::Resident } else { spread(e) };
        let (_, p, _) = list.next(1 << 20, now, &|_| 100, &mut local).unwrap();
        assert_eq!(p, 1);
        list.read(3, 0, now);
        assert_eq!(list.stats.resident, 1);
    }

    #[test]
    fn a_sample_listed_twice_is_read_twice() {
        let now = Instant::now();
        let mut list = List::new(1, key(0), vec![4, 5, 4], now);
        list.read(1, 4, now);
        list.read(1, 4, now);
        assert_eq!(list.stats.first_reads, 2);
        list.read(1, 4, now);
        assert_eq!(
            list.stats.first_reads, 2,
            "a third read reads a sample read"
        );
    }

    #[test]
    fn a_stretch_is_untouched_until_one_of_its_samples_is_read_and_done_when_all_are() {
        let now = Instant::now();
        let mut list = List::new(1, key(0), vec![7, 8, 9], now);
        assert!(list.none_read(0..=2) && !list.all_read(0..=2));
        list.read(1, 8, now);
        assert!(!list.none_read(0..=2) && !list.all_read(0..=2));
        assert!(list.none_read(0..=0) && list.none_read(2..=2));
        list.read(1, 7, now);
        list.read(1, 9, now);
        assert!(list.all_read(0..=2));
    }
}
