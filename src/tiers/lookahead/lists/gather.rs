//! Samples a shuffled list reads apart, fetched in one request when they lie close in an image:
//! where each sample of a list lies (`Place`, in image order), and how a fetch widens over its
//! neighbours there (`List::gather`).

use super::{Class, FETCHED, List, MAX_AHEAD, TODO};

/// Samples further down a list are fetched with one that lies this close to them in its image
/// (a gap cheaper to read along than to ask for apart: 256 KiB is ~3 ms at 100 MB/s, against a
/// store's 5-20 ms per request), looking this many of the list's neighbours in the image each way.
pub const GATHER_GAP: u64 = 256 << 10;
const GATHER_LOOK: usize = 64;

/// Where the sample at position `pos` lies: `len` bytes at `start` of `image`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Place {
    pub image: u32,
    pub start: u64,
    pub len: u32,
    pub pos: u32,
}

impl List {
    /// The list with where its samples lie (`locate`: the image, start and length of an entry
    /// stored in one piece), for `gather`.
    pub fn placed(mut self, locate: impl Fn(u32) -> Option<(u32, u64, u64)>) -> List {
        self.by_place = (self.entries.iter().enumerate())
            .filter_map(|(p, &e)| {
                let (image, start, len) = locate(e)?;
                let len = u32::try_from(len).ok()?;
                Some(Place {
                    image,
                    start,
                    len,
                    pos: p as u32,
                })
            })
            .collect();
        self.by_place.sort_unstable();
        self
    }

    /// The last position after `p` whose samples (and those between) take `bytes` at most
    /// (`size` of each entry), within `MAX_AHEAD` positions: what a head fetches in turn.
    pub fn reach(&self, p: u32, bytes: u64, size: &impl Fn(u32) -> u64) -> u32 {
        let mut total = 0u64;
        let mut last = p;
        let end = (p as usize + MAX_AHEAD as usize).min(self.entries.len().saturating_sub(1));
        for q in p as usize + 1..=end {
            total += size(self.entries[q]);
            if total > bytes {
                break;
            }
            last = q as u32;
        }
        last
    }

    /// Widens `extent` (the fetch of position `p`) with the samples to fetch, up to position
    /// `horizon` (as far as its head would fetch in turn), that lie next to it in its image, each within `GATHER_GAP` of
    /// the last: one ranged request for samples a shuffled order reads apart (a request per
    /// sample costs a store CPU and request rate, at 5 500 GET/s per S3 prefix). Neighbours in
    /// the image are the list's (`by_place`), so a gap read along holds no other sample of it;
    /// the extent stops at one that is not to fetch now (on its way, read, local, behind the
    /// readers or beyond their reach): its bytes would be read twice.
    pub(super) fn gather(
        &mut self,
        Gather { p, own, horizon }: Gather,
        extent: &mut Extent,
        limit: u64,
        (classify, alone): (&mut impl FnMut(u32) -> Class, &impl Fn(u32) -> bool),
        gathered: &mut Vec<(u32, u32)>,
    ) {
        let (image, start, len) = own;
        let Some(at) = u32::try_from(len).ok().and_then(|len| {
            let place = Place {
                image,
                start,
                len,
                pos: p,
            };
            self.by_place.binary_search(&place).ok()
        }) else {
            return;
        };
        for down in [true, false] {
            let mut i = at;
            for _ in 0..GATHER_LOOK {
                i = match down {
                    true if i == 0 => break,
                    true => i - 1,
                    false if i + 1 >= self.by_place.len() => break,
                    false => i + 1,
                };
                let Place {
                    image,
                    start,
                    len,
                    pos: q,
                } = self.by_place[i];
                let end = start + u64::from(len);
                // The same bytes (a sample listed twice): its own read finds them.
                if image == extent.image && start >= extent.start && end <= extent.end {
                    continue;
                }
                let apart = match down {
                    true => extent.start.checked_sub(end),
                    false => start.checked_sub(extent.end),
                };
                let (lo, hi) = (extent.start.min(start), extent.end.max(end));
                if image != extent.image
                    || apart.is_none_or(|gap| gap > GATHER_GAP)
                    || hi - lo > limit
                    || self.state[q as usize] != TODO
                    || q <= p
                    || q > horizon
                {
                    break;
                }
                let e = self.entries[q as usize];
                // Where the fetch would read it (not staged, not in memory), and not one to
                // ask of on its own (`alone`: maybe in the mount's page cache).
                let here = Class::Exact {
                    image,
                    start,
                    len: u64::from(len),
                };
                if alone(e) || classify(e) != here {
                    break;
                }
                (extent.start, extent.end) = (lo, hi);
                extent.payload += u64::from(len);
                extent.count += 1;
                extent.last = extent.last.max(q);
                self.state[q as usize] = FETCHED;
                gathered.push((q, e));
            }
        }
    }
}

/// Where `gather` starts: position `p`, where its sample lies (`own`: image, start, length),
/// and the last position it may gather.
pub(super) struct Gather {
    pub(super) p: u32,
    pub(super) own: (u32, u64, u64),
    pub(super) horizon: u32,
}

/// An exact fetch being built: bytes `start..end` of `image`, the samples' own bytes among
/// them, how many samples, and the last position among them.
pub(super) struct Extent {
    pub(super) image: u32,
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) payload: u64,
    pub(super) count: u64,
    pub(super) last: u32,
}

#[cfg(test)]
mod tests {
    use super::super::tests::key;
    use super::*;
    use std::time::Instant;

    fn packed(e: u32) -> Class {
        Class::Exact {
            image: (e >= 1000) as u32,
            start: 200 * u64::from(e % 1000),
            len: 100,
        }
    }

    fn place(e: u32) -> Option<(u32, u64, u64)> {
        match packed(e) {
            Class::Exact { image, start, len } => Some((image, start, len)),
            _ => None,
        }
    }

    #[test]
    fn samples_a_shuffled_list_reads_apart_are_fetched_with_their_neighbours_in_the_image() {
        let now = Instant::now();
        // A shuffle of 0..8 and 1000..1004: 5 sits after 2 in the list, 3 well before.
        let mut list =
            List::new(1, key(0), vec![2, 1000, 7, 3, 5, 1001, 0, 6, 1, 4], now).placed(place);
        list.read(9, 2, now);
        // Position 2 (entry 7): its neighbours in the image 6, 5, 4, 3 lie down the list; 2 is
        // read (the extent stops short of it: its bytes would be read twice); 1000 is another
        // image.
        let job = list.take(2, 1 << 20, (100, &|_| false), &mut packed);
        assert_eq!(
            job.what,
            Class::Exact {
                image: 0,
                start: 600,
                len: 900
            }
        );
        assert_eq!((job.first, job.last, job.samples), (2, 9, 5));
        assert_eq!(job.payload, 500, "the samples' own bytes");
        assert_eq!(job.gathered, [(7, 6), (4, 5), (9, 4), (3, 3)]);
        assert_eq!(job.positions().collect::<Vec<_>>(), [2, 7, 4, 9, 3]);
        for p in [2, 3, 4, 7, 9] {
            assert_eq!(list.state[p], FETCHED, "position {p}");
        }
        for p in [1, 6, 8] {
            assert_eq!(list.state[p], TODO, "position {p}");
        }
        assert_eq!((list.stats.fetched, list.stats.requests), (5, 1));
        // 1000 and 1001 in one request.
        let job = list.take(1, 1 << 20, (100, &|_| false), &mut packed);
        assert_eq!((job.payload, job.last, job.samples), (200, 5, 2));
        assert_eq!((list.stats.fetched, list.stats.requests), (7, 2));
    }

    #[test]
    fn gathering_stops_at_the_size_limit_and_at_bytes_already_on_their_way_and_reads_gaps_along() {
        let now = Instant::now();
        let mut list =
            List::new(1, key(0), vec![10, 12, 1030, 11, 13, 14, 1900], now).placed(place);
        // 14 is fetched already: 13 may join, 14 is not fetched twice.
        list.state[5] = FETCHED;
        // 300 bytes at most: 10 (at 2000) and 11 (at 2200), not 12.
        let job = list.take(0, 300, (100, &|_| false), &mut packed);
        assert_eq!(
            job.what,
            Class::Exact {
                image: 0,
                start: 2000,
                len: 300
            }
        );
        assert_eq!(job.payload, 200);
        assert_eq!(list.state[3], FETCHED);
        assert_eq!(list.state[1], TODO, "12 would pass the limit");
        let job = list.take(1, 1 << 20, (100, &|_| false), &mut packed);
        // 12 then 13 (14 is on its way: the extent stops short of it).
        assert_eq!(
            job.what,
            Class::Exact {
                image: 0,
                start: 2400,
                len: 300
            }
        );
        assert_eq!(list.state[2], TODO);
        // 1030 (image 1, at 6000) and 1900 (at 180 000): 173 900 bytes apart, within the gap,
        // read along.
        let job = list.take(2, 1 << 20, (100, &|_| false), &mut packed);
        assert_eq!((job.last, job.payload), (6, 200));
        assert_eq!(
            job.what,
            Class::Exact {
                image: 1,
                start: 6000,
                len: 174_100
            }
        );
    }
}
