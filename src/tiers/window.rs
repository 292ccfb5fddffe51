//! The bytes the lookahead (`lookahead`) fetched ahead of their readers on a sampler's word: exact extents of images, each
//! held until its readers have read all of it (or dropped unread when it goes stale). Readers
//! look here first (`Images::read_exact_at`); one that finds its extent still in flight waits
//! for it instead of asking the source a second time, so each sample is fetched once.
//!
//! The window's bytes are drawn from the one memory budget (a permit per extent, taken before
//! the extent is announced: a reader never waits on a fetch that waits for memory); its size is
//! capped by the lookahead (`Lookahead::window`).

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::ram_cache::Held;
use super::waits::Waits;
use crate::source::read_at::Wait;

/// How long a reader waits for an extent in flight before reading the source itself (a fetch
/// stuck behind a dead server must not hold the reader longer than its own read would).
const IN_FLIGHT_PATIENCE: Duration = Duration::from_secs(30);

/// Who asked for an extent: a list (its id) and the positions of the samples it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    pub list: u64,
    pub first: u32,
    pub last: u32,
}

enum State {
    Fetching,
    Ready(Arc<Held>),
}

struct Extent {
    len: u64,
    /// Bytes of samples in it (the gaps between samples are never read).
    payload: u64,
    state: State,
    /// Bytes readers have taken; the extent goes when it reaches `len`.
    served: u64,
    owner: Owner,
    /// When it became ready (for staleness).
    since: Instant,
}

/// What a reader found.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    /// Served from an extent that was ready.
    Ready,
    /// Served after waiting this long for the extent's fetch.
    Waited(Duration),
    /// Not here: read as usual.
    No,
}

#[derive(Default)]
struct Extents {
    by_image: HashMap<u32, BTreeMap<u64, Extent>>,
}

impl Extents {
    /// The start of the extent of `image` that holds `[offset, offset + len)`, if any.
    fn holding(&self, image: u32, offset: u64, len: u64) -> Option<u64> {
        let (&start, e) = self.by_image.get(&image)?.range(..=offset).next_back()?;
        (offset + len <= start + e.len).then_some(start)
    }

    fn get_mut(&mut self, image: u32, start: u64) -> Option<&mut Extent> {
        self.by_image.get_mut(&image)?.get_mut(&start)
    }

    fn remove(&mut self, image: u32, start: u64) -> Option<Extent> {
        let extents = self.by_image.get_mut(&image)?;
        let e = extents.remove(&start);
        if extents.is_empty() {
            self.by_image.remove(&image);
        }
        e
    }

    /// Whether `[start, start + len)` of `image` meets an extent held or in flight.
    fn overlaps(&self, image: u32, start: u64, len: u64) -> bool {
        let Some(extents) = self.by_image.get(&image) else {
            return false;
        };
        if let Some((&s, e)) = extents.range(..=start).next_back()
            && s + e.len > start
        {
            return true;
        }
        extents.range(start..start + len).next().is_some()
    }
}

/// Counters of the window, for `packfs status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowStats {
    pub held: u64,
    pub peak: u64,
    /// Extents dropped before all their bytes were read, and those bytes.
    pub dropped_unread: u64,
    pub dropped_bytes: u64,
    /// Reads served from an extent that was ready, and those that waited for one in flight
    /// (and how long, in all).
    pub ready: u64,
    pub waited: u64,
    pub waited_ns: u64,
}

#[derive(Default)]
pub struct Window {
    /// Extents held or in flight: readers skip the lock while there are none.
    count: AtomicUsize,
    extents: Mutex<Extents>,
    settled: Condvar,
    /// Bytes held or in flight.
    held: AtomicU64,
    peak: AtomicU64,
    dropped_unread: AtomicU64,
    dropped_bytes: AtomicU64,
    ready: AtomicU64,
    waited: AtomicU64,
    waited_ns: AtomicU64,
    /// Called when bytes are freed (a fetch waiting for room can go).
    on_free: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl Window {
    /// Sets what to call when bytes are freed.
    pub fn on_free(&self, call: Box<dyn Fn() + Send + Sync>) {
        let _ = self.on_free.set(call);
    }

    fn lock(&self) -> MutexGuard<'_, Extents> {
        self.extents.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Fills `buf` from `offset` of `image` if an extent holds those bytes, waiting for one in
    /// flight (a read that may not wait gets `WouldBlock` then, as from the source).
    /// `waits` counts the wait of `reader` for an extent in flight.
    pub fn serve(
        &self,
        image: u32,
        offset: u64,
        buf: &mut [u8],
        wait: Wait,
        waits: &Waits,
        reader: u32,
    ) -> io::Result<Found> {
        if self.count.load(Ordering::Acquire) == 0 {
            return Ok(Found::No);
        }
        let len = buf.len() as u64;
        let mut extents = self.lock();
        let Some(start) = extents.holding(image, offset, len) else {
            return Ok(Found::No);
        };
        let began = Instant::now();
        let mut waited = false;
        let mut _waiting = None;
        loop {
            let Some(e) = extents.get_mut(image, start) else {
                // Its fetch failed: the reader reads (and meets the error) itself.
                return Ok(Found::No);
            };
            match &e.state {
                State::Ready(bytes) => {
                    let from = (offset - start) as usize;
                    buf.copy_from_slice(&bytes[from..from + buf.len()]);
                    e.served += len;
                    if e.served >= e.payload {
                        let e = extents.remove(image, start).expect("just found");
                        self.forget(&e);
                    }
                    drop(extents);
                    if !waited {
                        self.ready.fetch_add(1, Ordering::Relaxed);
                        return Ok(Found::Ready);
                    }
                    let took = began.elapsed();
                    self.waited.fetch_add(1, Ordering::Relaxed);
                    self.waited_ns
                        .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
                    return Ok(Found::Waited(took));
                }
                State::Fetching if wait == Wait::Never => {
                    return Err(crate::source::read_at::would_block());
                }
                State::Fetching => {
                    let left = IN_FLIGHT_PATIENCE.saturating_sub(began.elapsed());
                    if left.is_zero() {
                        return Ok(Found::No);
                    }
                    waited = true;
                    _waiting.get_or_insert_with(|| waits.begin(reader));
                    extents = self
                        .settled
                        .wait_timeout(extents, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
    }

    /// Whether an extent holds or fetches any of these bytes (such a read is served from it).
    pub fn holds(&self, image: u32, offset: u64, len: u64) -> bool {
        self.count.load(Ordering::Acquire) != 0 && self.lock().holding(image, offset, len).is_some()
    }

    /// Counts `len` bytes as held before their fetch is announced: the fetches handed out at once
    /// must not take more than the window between them.
    pub fn reserve(&self, len: u64) {
        let held = self.held.fetch_add(len, Ordering::Relaxed) + len;
        self.peak.fetch_max(held, Ordering::Relaxed);
    }

    /// Gives back a reservation that no fetch was announced for.
    pub fn release(&self, len: u64) {
        self.held.fetch_sub(len, Ordering::Relaxed);
        if let Some(call) = self.on_free.get() {
            call();
        }
    }

    /// Announces a fetch of `len` bytes (reserved) at `start` of `image` for `owner`, `payload`
    /// of them samples' bytes; false when it meets an extent held or in flight (then it is not
    /// to be fetched, and the reservation is given back).
    pub fn begin(&self, image: u32, start: u64, len: u64, payload: u64, owner: Owner) -> bool {
        let mut extents = self.lock();
        if len == 0 || extents.overlaps(image, start, len) {
            drop(extents);
            self.release(len);
            return false;
        }
        extents.by_image.entry(image).or_default().insert(
            start,
            Extent {
                len,
                payload: payload.clamp(1, len),
                state: State::Fetching,
                served: 0,
                owner,
                since: Instant::now(),
            },
        );
        self.count.fetch_add(1, Ordering::Release);
        true
    }

    /// Takes `bytes` off the payload of the extent in flight at `start` of `image`: samples of
    /// it that their readers read elsewhere before it was announced, whose bytes it will never
    /// serve (it would be held, unread, until dropped).
    pub fn read_elsewhere(&self, image: u32, start: u64, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let mut extents = self.lock();
        if let Some(e) = extents.get_mut(image, start) {
            e.payload = e.payload.saturating_sub(bytes).max(1);
        }
    }

    /// Ends the fetch `begin` announced: its bytes, or nothing (it failed; its readers read
    /// the source themselves). Wakes the readers waiting for it.
    pub fn finish(&self, image: u32, start: u64, fetched: Option<Held>) {
        let mut extents = self.lock();
        match fetched {
            Some(bytes) => {
                if let Some(e) = extents.get_mut(image, start) {
                    e.state = State::Ready(Arc::new(bytes));
                    e.since = Instant::now();
                }
            }
            None => {
                if let Some(e) = extents.remove(image, start) {
                    self.forget(&e);
                }
            }
        }
        drop(extents);
        self.settled.notify_all();
    }

    /// Drops the ready extents `stale` picks (by owner and age), unread; returns the bytes freed.
    pub fn drop_where(&self, mut stale: impl FnMut(Owner, Duration) -> bool) -> u64 {
        let mut extents = self.lock();
        let now = Instant::now();
        let mut gone = vec![];
        for (&image, by_start) in &extents.by_image {
            for (&start, e) in by_start {
                if matches!(e.state, State::Ready(_)) && stale(e.owner, now - e.since) {
                    gone.push((image, start));
                }
            }
        }
        let mut freed = 0;
        for (image, start) in gone {
            if let Some(e) = extents.remove(image, start) {
                freed += e.len;
                self.dropped_unread.fetch_add(1, Ordering::Relaxed);
                self.dropped_bytes
                    .fetch_add(e.payload - e.served.min(e.payload), Ordering::Relaxed);
                self.forget(&e);
            }
        }
        freed
    }

    fn forget(&self, e: &Extent) {
        self.count.fetch_sub(1, Ordering::Release);
        self.held.fetch_sub(e.len, Ordering::Relaxed);
        if let Some(call) = self.on_free.get() {
            call();
        }
    }

    /// Bytes held or in flight.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    pub fn stats(&self) -> WindowStats {
        WindowStats {
            held: self.held(),
            peak: self.peak.load(Ordering::Relaxed),
            dropped_unread: self.dropped_unread.load(Ordering::Relaxed),
            dropped_bytes: self.dropped_bytes.load(Ordering::Relaxed),
            ready: self.ready.load(Ordering::Relaxed),
            waited: self.waited.load(Ordering::Relaxed),
            waited_ns: self.waited_ns.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNER: Owner = Owner {
        list: 1,
        first: 0,
        last: 0,
    };

    #[test]
    fn an_extent_is_served_until_all_its_bytes_are_read() {
        let w = Window::default();
        assert!({
            w.reserve(10);
            w.begin(3, 100, 10, 10, OWNER)
        });
        assert!(
            !{
                w.reserve(10);
                w.begin(3, 105, 10, 10, OWNER)
            },
            "overlaps"
        );
        assert!(
            !{
                w.reserve(6);
                w.begin(3, 95, 6, 6, OWNER)
            },
            "overlaps"
        );
        assert!(
            {
                w.reserve(5);
                w.begin(3, 110, 5, 5, OWNER)
            },
            "adjacent"
        );
        w.finish(3, 100, Some(Held::unbudgeted((0..10).collect())));
        let mut buf = [0u8; 4];
        assert_eq!(
            w.serve(3, 102, &mut buf, Wait::May, &Waits::default(), 0)
                .unwrap(),
            Found::Ready
        );
        assert_eq!(buf, [2, 3, 4, 5]);
        // Not wholly inside: read as usual.
        let mut big = [0u8; 12];
        assert_eq!(
            w.serve(3, 100, &mut big, Wait::May, &Waits::default(), 0)
                .unwrap(),
            Found::No
        );
        let mut rest = [0u8; 6];
        assert_eq!(
            w.serve(3, 104, &mut rest, Wait::May, &Waits::default(), 0)
                .unwrap(),
            Found::Ready
        );
        assert_eq!(w.held(), 5, "the 10 read are gone; 5 in flight");
        assert_eq!(
            w.serve(3, 104, &mut rest, Wait::May, &Waits::default(), 0)
                .unwrap(),
            Found::No
        );
        w.finish(3, 110, None);
        assert_eq!(w.held(), 0);
        let mut one = [0u8; 1];
        assert_eq!(
            w.serve(3, 110, &mut one, Wait::May, &Waits::default(), 0)
                .unwrap(),
            Found::No
        );
    }

    #[test]
    fn an_extent_of_samples_with_gaps_between_them_goes_once_the_samples_are_read() {
        let w = Window::default();
        // Two samples of 40 bytes with a 20-byte header between them.
        assert!({
            w.reserve(100);
            w.begin(0, 0, 100, 80, OWNER)
        });
        w.finish(0, 0, Some(Held::unbudgeted(vec![1; 100])));
        let mut buf = [0u8; 40];
        assert_eq!(
            w.serve(0, 0, &mut buf, Wait::May, &Waits::default(), 0)
                .unwrap(),
            Found::Ready
        );
        assert_eq!(
            w.serve(0, 60, &mut buf, Wait::May, &Waits::default(), 0)
                .unwrap(),
            Found::Ready
        );
        assert_eq!(w.held(), 0);
        assert_eq!(w.stats().dropped_unread, 0);
    }

    #[test]
    fn an_extent_whose_sample_was_read_elsewhere_goes_once_the_others_are_read() {
        let w = Window::default();
        // Two samples of 40 bytes; the first was read from the source before the fetch began.
        assert!({
            w.reserve(100);
            w.begin(0, 0, 100, 80, OWNER)
        });
        w.read_elsewhere(0, 0, 40);
        w.finish(0, 0, Some(Held::unbudgeted(vec![1; 100])));
        let mut buf = [0u8; 40];
        let found = w.serve(0, 60, &mut buf, Wait::May, &Waits::default(), 0);
        assert_eq!(found.unwrap(), Found::Ready);
        assert_eq!(w.held(), 0, "held for a sample nobody will read from it");
        assert_eq!(w.stats().dropped_unread, 0);
    }

    #[test]
    fn a_reader_waits_for_an_extent_in_flight_instead_of_reading_it_again() {
        let w = Arc::new(Window::default());
        assert!({
            w.reserve(4);
            w.begin(0, 0, 4, 4, OWNER)
        });
        let mut now = [0u8; 4];
        let e = w
            .serve(0, 0, &mut now, Wait::Never, &Waits::default(), 0)
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        let reader = {
            let w = w.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4];
                let found = w
                    .serve(0, 0, &mut buf, Wait::May, &Waits::default(), 0)
                    .unwrap();
                (found, buf)
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        w.finish(0, 0, Some(Held::unbudgeted(vec![9, 8, 7, 6])));
        let (found, buf) = reader.join().unwrap();
        assert!(matches!(found, Found::Waited(d) if d >= Duration::from_millis(40)));
        assert_eq!(buf, [9, 8, 7, 6]);
    }

    #[test]
    fn stale_extents_are_dropped_unread_and_counted() {
        let w = Window::default();
        let other = Owner { list: 2, ..OWNER };
        assert!({
            w.reserve(8);
            w.begin(0, 0, 8, 8, OWNER)
        });
        assert!({
            w.reserve(8);
            w.begin(0, 8, 8, 8, other)
        });
        w.finish(0, 0, Some(Held::unbudgeted(vec![0; 8])));
        w.finish(0, 8, Some(Held::unbudgeted(vec![0; 8])));
        let mut two = [0u8; 2];
        w.serve(0, 0, &mut two, Wait::May, &Waits::default(), 0)
            .unwrap();
        assert_eq!(w.drop_where(|o, _| o.list == 1), 8);
        let s = w.stats();
        assert_eq!((s.held, s.dropped_unread, s.dropped_bytes), (8, 1, 6));
    }
}
