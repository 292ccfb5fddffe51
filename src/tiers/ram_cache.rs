//! The RAM tier, under one byte budget: decoded bytes (squashfs blocks, inflated zip members) and
//! aligned chunks of stored image bytes read from a slow source.
//!
//! Decoding costs far more than serving from RAM (a 128 KiB zstd block takes ~100-300 µs to
//! decompress), and FUSE reads of 128 KiB at most split one block into several requests, so each
//! decoded block is kept until evicted. quick_cache runs a loader once per key even when several
//! threads miss together (the others wait for its result), and keeps the total weight, the bytes
//! held, under the budget: the weight of a value is its allocation.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use quick_cache::sync::{Cache, GuardResult};
use quick_cache::{DefaultHashBuilder, Lifecycle, OptionsBuilder, Weighter};

use super::budget::{MemoryBudget, Permit};
use crate::source::read_at::Wait;

/// A decoded block or member, shared with the readers that are copying out of it.
pub type Decoded = Arc<Held>;

/// Bytes held under the memory budget: their permit goes back when the last reader lets go, not
/// when the cache evicts them (a reader may still be copying out of an evicted unit).
pub struct Held {
    bytes: Vec<u8>,
    _permit: Option<Permit>,
    /// Not to be evicted: a chunk its readers have yet to reach (`chunks::pins`).
    pinned: AtomicBool,
}

impl Held {
    /// Bytes outside any budget (tests, and commands that read one file once).
    pub fn unbudgeted(bytes: Vec<u8>) -> Held {
        Held {
            bytes,
            _permit: None,
            pinned: AtomicBool::new(false),
        }
    }

    /// `bytes` under `permit`, which is shrunk to their allocation.
    pub fn under(bytes: Vec<u8>, mut permit: Permit) -> Held {
        permit.shrink_to(bytes.capacity() as u64);
        Held {
            bytes,
            _permit: Some(permit),
            pinned: AtomicBool::new(false),
        }
    }

    /// Keeps the value from eviction (`true`) or lets the cache evict it again.
    pub(super) fn pin(&self, pinned: bool) {
        self.pinned.store(pinned, Ordering::Relaxed);
    }

    pub(super) fn is_pinned(&self) -> bool {
        self.pinned.load(Ordering::Relaxed)
    }
}

impl std::ops::Deref for Held {
    type Target = Vec<u8>;
    fn deref(&self) -> &Vec<u8> {
        &self.bytes
    }
}

/// Whether a load may wait for room in the memory budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Room {
    /// Wait (a reader's own miss).
    Wait,
    /// Give up with `WouldBlock` if the budget has no room now for a load of its own; another
    /// thread's load of the same value is joined (read-ahead: a hint).
    IfFree,
    /// Wait for nothing: not for room, not for another thread's load of the value (a read that
    /// may not wait, `Wait::Never`).
    Now,
}

impl Room {
    /// The room a reader's own miss waits for.
    pub fn for_read(wait: Wait) -> Room {
        match wait {
            Wait::May => Room::Wait,
            Wait::Never => Room::Now,
        }
    }
}

/// Key: (image, offset of the encoded bytes in the image), or for a raw chunk of the image
/// (image, `CHUNK_TAG | chunk start`).
type Key = (u32, u64);

/// Marks raw-chunk keys; image offsets never reach bit 63.
pub const CHUNK_TAG: u64 = 1 << 63;

/// Bookkeeping bytes counted per value on top of its buffer (the `Arc`, the `Vec`, the entry).
const OVERHEAD: u64 = 64;

/// Budget per shard at least this large, so one shard holds several of the largest blocks
/// (1 MiB squashfs blocks, 16 MiB deflated members).
const MIN_SHARD: u64 = 32 << 20;

#[derive(Clone)]
struct ByAllocation;

/// Evicts what is not pinned. New values enter a cold part of 3% of the budget, where a chunk
/// fetched ahead could be evicted by the next one before its reader comes (measured: 19 chunk
/// loads for a 12-chunk walk under an 8 MiB cache); the chunk room pins those (a bounded few).
#[derive(Clone, Default)]
struct UnlessPinned;

impl Lifecycle<Key, Decoded> for UnlessPinned {
    type RequestState = ();

    fn is_pinned(&self, _key: &Key, val: &Decoded) -> bool {
        val.is_pinned()
    }
}

impl Weighter<Key, Decoded> for ByAllocation {
    fn weight(&self, _key: &Key, val: &Decoded) -> u64 {
        val.capacity() as u64 + OVERHEAD
    }
}

/// What the cache did since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RamStats {
    pub budget: u64,
    /// Bytes held now, and the most seen after any insertion.
    pub held: u64,
    pub peak: u64,
    /// Requests served without decoding (including those that waited for another's load).
    pub hits: u64,
    /// Values decoded (misses that ran a loader; failed loads included).
    pub loads: u64,
    /// Bytes produced by the loads.
    pub loaded_bytes: u64,
    /// The memory budget the values are drawn from, which also holds what readers, read-ahead
    /// and the stager hold outside the cache.
    pub memory: super::budget::BudgetStats,
}

pub struct RamCache {
    cache: Cache<Key, Decoded, ByAllocation, DefaultHashBuilder, UnlessPinned>,
    budget: u64,
    /// Where every loaded value's bytes are drawn from (shared with the rest of the tiers).
    memory: Arc<MemoryBudget>,
    peak: AtomicU64,
    requests: AtomicU64,
    loads: AtomicU64,
    loaded_bytes: AtomicU64,
}

impl RamCache {
    /// A cache that holds at most `budget` bytes (0 disables it: every read decodes), with a
    /// memory budget of its own.
    pub fn new(budget: u64) -> Arc<RamCache> {
        RamCache::with_memory(budget, MemoryBudget::for_cache(budget))
    }

    /// A cache that holds at most `budget` bytes of what it loads under `memory`; when a load
    /// waits for room, values no reader holds are evicted.
    pub fn with_memory(budget: u64, memory: Arc<MemoryBudget>) -> Arc<RamCache> {
        let cache = Arc::new(RamCache::build(budget, memory.clone()));
        let weak: Weak<RamCache> = Arc::downgrade(&cache);
        memory.add_reclaimer(Box::new(move |bytes| {
            if let Some(cache) = weak.upgrade() {
                cache.evict_unused(bytes);
            }
        }));
        cache
    }

    fn build(budget: u64, memory: Arc<MemoryBudget>) -> RamCache {
        let shards = 1usize << (budget / MIN_SHARD).clamp(1, 16).ilog2();
        let options = OptionsBuilder::new()
            .shards(shards)
            .estimated_items_capacity((budget / (128 * 1024)).clamp(16, 1 << 20) as usize)
            .weight_capacity(budget)
            .build()
            .expect("valid cache options");
        RamCache {
            cache: Cache::with_options(
                options,
                ByAllocation,
                DefaultHashBuilder::default(),
                UnlessPinned,
            ),
            budget,
            memory,
            peak: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            loads: AtomicU64::new(0),
            loaded_bytes: AtomicU64::new(0),
        }
    }

    /// The value for `(image, offset)`, decoded by `load` on a miss. Concurrent misses of one key
    /// run `load` once; a failed load is not cached, so a later read retries it.
    /// `reserve` is the most memory the load may take (its result and what it reads to make
    /// it), drawn from the memory budget before it runs.
    pub fn get_or_load(
        &self,
        image: u32,
        offset: u64,
        reserve: u64,
        load: impl FnOnce() -> io::Result<Vec<u8>>,
    ) -> io::Result<Decoded> {
        self.fetch(image, offset, reserve, Room::Wait, load)
            .map(|(value, _)| value)
    }

    /// As `get_or_load`, also saying whether this call ran the loader.
    pub fn fetch(
        &self,
        image: u32,
        offset: u64,
        reserve: u64,
        room: Room,
        load: impl FnOnce() -> io::Result<Vec<u8>>,
    ) -> io::Result<(Decoded, bool)> {
        self.fetch_pinned(image, offset, reserve, room, false, load)
    }

    /// As `fetch`; a value this call loads enters the cache `pinned` (else the insertion that
    /// makes room could evict the newcomer itself, when the cache holds little else).
    fn fetch_pinned(
        &self,
        image: u32,
        offset: u64,
        reserve: u64,
        room: Room,
        pinned: bool,
        load: impl FnOnce() -> io::Result<Vec<u8>>,
    ) -> io::Result<(Decoded, bool)> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let load = || {
            let bytes = load()?;
            Ok((bytes, pinned))
        };
        if room == Room::Now {
            return self.fetch_without_waiting(image, offset, reserve, load);
        }
        let mut loaded = false;
        let value = self.cache.get_or_insert_with(&(image, offset), || {
            // Joining another thread's load costs no memory, so read-ahead joins it too (when it
            // gave up instead, its readers fetched chunks again: 52 GETs for 36 chunks); only
            // room for a load of its own is what it never waits for.
            let permit = match room {
                Room::Wait => self.memory.acquire(reserve),
                Room::IfFree | Room::Now => self
                    .memory
                    .try_acquire(reserve)
                    .ok_or_else(crate::source::read_at::would_block)?,
            };
            loaded = true;
            self.loads.fetch_add(1, Ordering::Relaxed);
            let (bytes, pinned) = load()?;
            self.loaded_bytes
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            let held = Held::under(bytes, permit);
            held.pin(pinned);
            Ok::<_, io::Error>(Arc::new(held))
        })?;
        if loaded {
            self.peak.fetch_max(self.cache.weight(), Ordering::Relaxed);
        }
        Ok((value, loaded))
    }

    /// `fetch` for a read that may not wait: a unit another thread is loading is not waited
    /// for, nor room in the memory budget (`WouldBlock`); one nobody loads is loaded here if the
    /// budget has room now.
    fn fetch_without_waiting(
        &self,
        image: u32,
        offset: u64,
        reserve: u64,
        load: impl FnOnce() -> io::Result<(Vec<u8>, bool)>,
    ) -> io::Result<(Decoded, bool)> {
        match self
            .cache
            .get_value_or_guard(&(image, offset), Some(std::time::Duration::ZERO))
        {
            GuardResult::Value(value) => Ok((value, false)),
            GuardResult::Timeout => Err(crate::source::read_at::would_block()),
            GuardResult::Guard(guard) => {
                // No room drops the guard, as a failed load does: waiting loaders then load
                // themselves.
                let permit = self
                    .memory
                    .try_acquire(reserve)
                    .ok_or_else(crate::source::read_at::would_block)?;
                self.loads.fetch_add(1, Ordering::Relaxed);
                let (bytes, pinned) = load()?;
                let held = Held::under(bytes, permit);
                held.pin(pinned);
                let bytes = Arc::new(held);
                self.loaded_bytes
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                let _ = guard.insert(bytes.clone());
                self.peak.fetch_max(self.cache.weight(), Ordering::Relaxed);
                Ok((bytes, true))
            }
        }
    }

    /// Source chunk `len` bytes at `start` of `image` (the `CHUNK_TAG` entry), loaded from
    /// `source` unless held; and whether this call loaded it. A chunk loaded here enters
    /// `pinned` when its caller (`chunks`) will keep it for its readers (and unpin it when they
    /// are through): else the insertion that makes room could evict the newcomer itself.
    pub fn fetch_chunk(
        &self,
        source: &super::OpenedImages,
        image: u32,
        start: u64,
        len: u64,
        room: Room,
        pinned: bool,
    ) -> io::Result<(Decoded, bool)> {
        let wait = match room {
            Room::Now => Wait::Never,
            Room::Wait | Room::IfFree => Wait::May,
        };
        self.fetch_pinned(image, CHUNK_TAG | start, len, room, pinned, || {
            let mut bytes = vec![0u8; len as usize];
            source.read_exact_at(image, start, &mut bytes, wait)?;
            Ok(bytes)
        })
    }

    /// The value for `(image, offset)` if it is held now; never loads.
    pub fn get(&self, image: u32, offset: u64) -> Option<Decoded> {
        self.cache.get(&(image, offset))
    }

    /// Whether `(image, offset)` is held now (without touching its recency).
    pub fn contains(&self, image: u32, offset: u64) -> bool {
        self.cache.contains_key(&(image, offset))
    }

    /// The memory budget the cache's values are drawn from.
    pub fn memory(&self) -> &Arc<MemoryBudget> {
        &self.memory
    }

    /// Evicts values no reader holds, about `bytes` of them (the memory budget is short): the
    /// unpinned first, then chunks pinned for readers not there yet (the budget comes first).
    fn evict_unused(&self, bytes: u64) {
        let freed = std::cell::Cell::new(0);
        for pinned_too in [false, true] {
            self.cache.retain(|_, value| {
                if freed.get() >= bytes
                    || Arc::strong_count(value) > 1
                    || (value.is_pinned() && !pinned_too)
                {
                    return true;
                }
                freed.set(freed.get() + value.capacity() as u64);
                false
            });
        }
    }

    pub fn stats(&self) -> RamStats {
        let loads = self.loads.load(Ordering::Relaxed);
        RamStats {
            budget: self.budget,
            held: self.cache.weight(),
            peak: self.peak.load(Ordering::Relaxed),
            hits: self.requests.load(Ordering::Relaxed) - loads,
            loads,
            loaded_bytes: self.loaded_bytes.load(Ordering::Relaxed),
            memory: self.memory.stats(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    #[test]
    fn stays_within_budget() {
        let budget = 1 << 20;
        let cache = RamCache::new(budget);
        for i in 0..200u64 {
            let v = cache
                .get_or_load(0, i, 100_000, || Ok(vec![i as u8; 100_000]))
                .unwrap();
            assert_eq!(v[99_999], i as u8);
            assert!(cache.stats().held <= budget, "held {:?}", cache.stats());
        }
        let s = cache.stats();
        assert!(s.peak <= budget && s.peak > budget / 2, "{s:?}");
        assert_eq!(s.loads, 200);
        // A value larger than the budget is served but not kept.
        let big = cache
            .get_or_load(1, 0, 2 << 20, || Ok(vec![7; 2 << 20]))
            .unwrap();
        assert_eq!(big.len(), 2 << 20);
        assert!(cache.stats().held <= budget);
    }

    #[test]
    fn concurrent_misses_load_once() {
        let cache = RamCache::new(64 << 20);
        let threads = 8;
        let barrier = Barrier::new(threads);
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    barrier.wait();
                    for key in 0..50u64 {
                        let v = cache
                            .get_or_load(3, key, 4096, || {
                                std::thread::sleep(std::time::Duration::from_micros(200));
                                Ok(vec![key as u8; 4096])
                            })
                            .unwrap();
                        assert!(v.iter().all(|&b| b == key as u8));
                    }
                });
            }
        });
        assert_eq!(cache.stats().loads, 50);
    }

    #[test]
    fn values_are_counted_until_their_last_reader_lets_go() {
        let memory = MemoryBudget::new(4 << 20);
        let cache = RamCache::with_memory(1 << 20, memory.clone());
        // Too large for the cache: not kept, but counted while a reader holds it.
        let big = cache
            .get_or_load(0, 1, 3 << 20, || Ok(vec![1; 2 << 20]))
            .unwrap();
        assert_eq!(memory.stats().held, big.capacity() as u64);
        drop(big);
        assert_eq!(memory.stats().held, 0);
        // The cache full of small values, then a load that needs more than is left: it waits,
        // the cache lets go of what no reader holds, and the load goes ahead.
        for key in 0..4u64 {
            cache
                .get_or_load(1, key, 256 << 10, || Ok(vec![2; 256 << 10]))
                .unwrap();
        }
        assert!(memory.stats().held >= 768 << 10, "{:?}", memory.stats());
        let large = cache
            .get_or_load(2, 0, 4 << 20, || Ok(vec![3; 3 << 20]))
            .unwrap();
        assert_eq!(large.len(), 3 << 20);
        assert!(memory.stats().held <= 4 << 20, "{:?}", memory.stats());
        assert!(memory.stats().waits >= 1);
    }

    #[test]
    fn failed_loads_are_retried() {
        let cache = RamCache::new(1 << 20);
        let err = cache.get_or_load(0, 1, 1, || Err(io::Error::other("bad block")));
        assert!(err.is_err());
        let ok = cache.get_or_load(0, 1, 1, || Ok(vec![1])).unwrap();
        assert_eq!(**ok, vec![1]);
    }
}
