//! Clairvoyant reads: a sampler sends the order of its epoch's samples (`submit`), and the samples
//! are fetched ahead of the readers that follow it, many requests in flight, into a window of
//! bytes within the memory budget (`window`). Which samples, and when, is `lists`' business:
//! each reader's next samples, its share of the window ahead of it, never further. Samples that
//! are staged or in the RAM cache are not fetched again; images that go by chunks (staged, or all
//! chunked) have their chunks fetched through the chunk room; compressed members are decoded into
//! the RAM cache. Nothing changes for a mount no sampler talks to.

mod intake;
mod lists;

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::FileReader;
use super::budget::Permit;
use super::window;
use crate::archive::plan::Piece;
use crate::catalog::Catalog;
pub use intake::{Intake, Taking};
pub use lists::{Class, ListKey};
use lists::{Job, List, ListStats};

/// Lists per mount at most (every rank of a node, train and validation each): the one read
/// longest ago goes.
pub const MAX_LISTS: usize = 64;
/// A list nobody read from for this long is dropped, and its window's bytes with it.
const IDLE: Duration = Duration::from_secs(60);
/// A fetched extent unread this long, and out of the reach of every reader that read within
/// `QUIET`, may be dropped for room: a reader quiet that long (stopped, or gone to another part
/// of the list under another thread) must not hold the window from those reading now.
const STALE: Duration = Duration::from_secs(1);
const QUIET: Duration = Duration::from_secs(2);
/// How long a fetch thread sleeps when there is nothing to fetch (it is also woken by reads and
/// lists).
const NAP: Duration = Duration::from_millis(50);

/// How the lookahead runs.
#[derive(Clone)]
pub struct LookaheadOptions {
    /// Bytes fetched ahead and not yet read, at most.
    pub window: u64,
    /// Fetches in flight at most (one thread each).
    pub depth: usize,
    /// Whether the kernel holds every page of a catalog entry already (a mount's page cache,
    /// `fs::page_cache`): a sample read before is not fetched again while it does. None in
    /// process, where nothing caches a file's pages but the engine.
    pub page_cache: Option<PageCacheProbe>,
}

/// Asks whether the kernel's page cache holds all of a catalog entry (see `page_cache`).
pub type PageCacheProbe = Arc<dyn Fn(&Catalog, u32) -> bool + Send + Sync>;

/// Requests in flight by default: enough to hide a store's latency (at 20 ms a request, 64 fetch
/// up to 3 200 samples a second: measured 1 844 files/s with 64 against 1 291 with 32 on the
/// object-store benchmark, 8 readers), modest for files (a parallel file system's latency is
/// about a millisecond).
pub fn default_depth(object_store: bool) -> usize {
    if object_store { 64 } else { 16 }
}

/// The counters, for `packfs status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct HintStats {
    /// Lists received, lists held now, samples they named, and paths that named no file.
    pub lists: u64,
    pub active_lists: u64,
    pub samples: u64,
    pub unknown_paths: u64,
    /// The latest epoch a list was sent for.
    pub epoch: u64,
    /// First reads of listed samples; of those, the ones that found nothing fetched, the ones
    /// that waited for a fetch in flight, and those local already.
    pub first_reads: u64,
    pub missed: u64,
    pub late: u64,
    pub resident: u64,
    /// Samples fetched ahead, in how many requests, how many bytes, and failed fetches.
    pub fetched: u64,
    pub requests: u64,
    pub fetched_bytes: u64,
    pub failed: u64,
    /// Samples not fetched because the kernel's page cache of the mount held them.
    pub in_page_cache: u64,
    /// The window: bytes held now and at most, and extents dropped before they were read.
    pub window: u64,
    pub window_held: u64,
    pub window_peak: u64,
    pub dropped_unread: u64,
    pub dropped_bytes: u64,
}

struct Board {
    lists: Vec<List>,
    next_id: u64,
    /// Counters of lists dropped or replaced.
    gone: ListStats,
    received: u64,
    samples: u64,
    unknown: u64,
    epoch: u64,
}

pub struct Lookahead {
    board: Mutex<Board>,
    wake: Condvar,
    opts: LookaheadOptions,
    window: Arc<window::Window>,
    stopped: AtomicBool,
    /// Lists held now (`Board::lists.len()`), read without the lock.
    lists: std::sync::atomic::AtomicUsize,
    /// Fetch threads waiting for work: a read wakes one only if some wait (a wake-up is a
    /// system call, and readers read thousands of samples a second).
    idle: std::sync::atomic::AtomicUsize,
    fetched_bytes: AtomicU64,
    failed: AtomicU64,
    in_page_cache: AtomicU64,
    catalog: Arc<Catalog>,
}

/// A list as the hints channel hands it over: the entries it resolved, and the memory they take.
pub struct Submitted {
    pub key: ListKey,
    pub epoch: u64,
    pub entries: Vec<u32>,
    pub unknown: u64,
    /// The list's bookkeeping bytes, from the budget (and the lists' share of it).
    pub permits: Vec<Permit>,
}

impl Lookahead {
    fn lock(&self) -> MutexGuard<'_, Board> {
        self.board.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a list: it replaces the one of the same key (the rank's previous epoch).
    pub fn submit(&self, list: Submitted) {
        let now = Instant::now();
        // Where each sample lies (for fetching neighbours in one request), found before the
        // lock: a million samples take a while.
        let catalog = &self.catalog;
        let mut fresh = List::new(0, list.key, list.entries, now).placed(|entry| {
            let member = super::Member::of(catalog, entry).ok()?;
            stored_extent(&member)
        });
        let mut board = self.lock();
        board.received += 1;
        board.samples += fresh.len() as u64;
        board.unknown += list.unknown;
        board.epoch = board.epoch.max(list.epoch);
        let id = board.next_id;
        board.next_id += 1;
        let gone: Vec<u64> = board
            .lists
            .iter()
            .filter(|l| l.key == fresh.key)
            .map(|l| l.id)
            .collect();
        for old in gone {
            self.drop_list(&mut board, old);
        }
        if board.lists.len() >= MAX_LISTS
            && let Some(oldest) = board.lists.iter().min_by_key(|l| l.last_read).map(|l| l.id)
        {
            self.drop_list(&mut board, oldest);
        }
        // The permit goes with the list's memory: it is dropped with it.
        fresh.id = id;
        fresh.permits = list.permits;
        board.lists.push(fresh);
        self.lists.store(board.lists.len(), Ordering::Relaxed);
        drop(board);
        self.wake.notify_all();
    }

    /// Drops the list of `key`, if any (its sampler is through).
    pub fn end(&self, key: &ListKey) {
        let mut board = self.lock();
        let gone: Vec<u64> = board
            .lists
            .iter()
            .filter(|l| l.key == *key)
            .map(|l| l.id)
            .collect();
        for id in gone {
            self.drop_list(&mut board, id);
        }
    }

    fn drop_list(&self, board: &mut Board, id: u64) {
        if let Some(i) = board.lists.iter().position(|l| l.id == id) {
            let list = board.lists.swap_remove(i);
            self.lists.store(board.lists.len(), Ordering::Relaxed);
            add(&mut board.gone, &list.stats);
            self.window.drop_where(|owner, _| owner.list == id);
        }
    }

    /// Notes that `reader` reads `entry` (every read of a file, the first of its samples too);
    /// whether a list holds it.
    pub fn note_read(&self, reader: u32, entry: u32) -> bool {
        // A mount no sampler talks to reads as it did: no lock on its path.
        if self.lists.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let now = Instant::now();
        let mut board = self.lock();
        let mut listed = false;
        for list in board.lists.iter_mut() {
            listed |= list.read(reader, entry, now);
        }
        drop(board);
        if listed {
            self.wake_one();
        }
        listed
    }

    /// Wakes a fetch thread if one waits.
    fn wake_one(&self) {
        if self.idle.load(Ordering::Relaxed) > 0 {
            self.wake.notify_one();
        }
    }

    pub fn stats(&self) -> HintStats {
        let board = self.lock();
        let mut lists = board.gone;
        for l in &board.lists {
            add(&mut lists, &l.stats);
        }
        let w = self.window.stats();
        HintStats {
            lists: board.received,
            active_lists: board.lists.len() as u64,
            samples: board.samples,
            unknown_paths: board.unknown,
            epoch: board.epoch,
            first_reads: lists.first_reads,
            missed: lists.missed,
            late: w.waited,
            resident: lists.resident,
            fetched: lists.fetched,
            requests: lists.requests,
            fetched_bytes: self.fetched_bytes.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            in_page_cache: self.in_page_cache.load(Ordering::Relaxed),
            window: self.opts.window,
            window_held: w.held,
            window_peak: w.peak,
            dropped_unread: w.dropped_unread,
            dropped_bytes: w.dropped_bytes,
        }
    }

    /// Whether the samples of `job` were all read since it was handed out (or their list is
    /// gone): a reader that came first read them from the source itself.
    fn overtaken(&self, job: &Job) -> bool {
        self.of_list(job, true, |l| l.all_read(job.positions()))
    }

    /// Whether no sample of `job` was read by its list's readers yet (false once the list is
    /// gone): pages of a sample they read are in the kernel's cache because they read it, which
    /// says nothing of an earlier epoch.
    fn untouched(&self, job: &Job) -> bool {
        self.of_list(job, false, |l| l.none_read(job.positions()))
    }

    /// The bytes of `job`'s samples read so far (0 once the list is gone).
    fn read_bytes(&self, job: &Job, size: impl Fn(u32) -> u64) -> u64 {
        let board = self.lock();
        let list = board.lists.iter().find(|l| l.id == job.list);
        list.map_or(0, |l| l.read_bytes(job.positions(), size))
    }

    /// `ask` of the list `job` came from, or `gone` when it is no more.
    fn of_list(&self, job: &Job, gone: bool, ask: impl Fn(&List) -> bool) -> bool {
        let board = self.lock();
        board
            .lists
            .iter()
            .find(|l| l.id == job.list)
            .map_or(gone, ask)
    }

    /// Stops the fetch threads (they finish the fetch in hand).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.wake.notify_all();
    }

    /// The next fetch, waiting for one; `None` once stopped. `classify` says where an entry's
    /// bytes are, `size` how many.
    fn next_job(
        &self,
        size: &impl Fn(u32) -> u64,
        classify: &mut impl FnMut(u32) -> Class,
        alone: &impl Fn(u32) -> bool,
    ) -> Option<Job> {
        let mut board = self.lock();
        loop {
            if self.stopped.load(Ordering::SeqCst) {
                return None;
            }
            let now = Instant::now();
            self.drop_idle(&mut board, now);
            let regions: usize = board.lists.iter().map(|l| l.regions(now)).sum();
            let room = self.opts.window.saturating_sub(self.window.held());
            if regions > 0 {
                let share = (self.opts.window / regions as u64).max(1);
                // The most urgent head's next sample, over every list.
                let mut best: Option<(u64, usize, u32, Instant)> = None;
                for (i, list) in board.lists.iter_mut().enumerate() {
                    if let Some((ahead, p, seen)) = list.next(share, now, size, classify)
                        && best.is_none_or(|(b, ..)| ahead < b)
                    {
                        best = Some((ahead, i, p, seen));
                    }
                }
                if let Some((ahead, i, p, seen)) = best {
                    let entry_size = size(board.lists[i].entry_at(p));
                    let fits = entry_size <= room || self.window.held() == 0;
                    // Only a reader reading now may have others' stale bytes dropped for it: a
                    // quiet one would have its own dropped and fetched again, on and on.
                    let active = now.duration_since(seen) < QUIET;
                    if fits || (active && self.make_room(&board, now, entry_size)) {
                        let budget = self.opts.window.saturating_sub(self.window.held());
                        // Samples further down join it as far as its head fetches in turn.
                        let list = &mut board.lists[i];
                        let horizon = list.reach(p, share.saturating_sub(ahead), size);
                        let job = list.take(p, budget, (horizon, alone), classify);
                        if let Class::Exact { len, .. } = job.what {
                            self.window.reserve(len);
                        }
                        return Some(job);
                    }
                }
            }
            self.idle.fetch_add(1, Ordering::Relaxed);
            board = self
                .wake
                .wait_timeout(board, NAP)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            self.idle.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Drops fetched extents no reader will come for (out of every live head's reach, ready for
    /// a while) until `need` bytes fit; whether they do.
    fn make_room(&self, board: &Board, now: Instant, need: u64) -> bool {
        self.window.drop_where(|owner, age| {
            age >= STALE
                && !board
                    .lists
                    .iter()
                    .any(|l| l.id == owner.list && l.wanted(owner.first, owner.last, now, QUIET))
        });
        self.window.held() + need <= self.opts.window
    }

    fn drop_idle(&self, board: &mut Board, now: Instant) {
        let idle: Vec<u64> = board
            .lists
            .iter()
            .filter(|l| now.duration_since(l.last_read) >= IDLE)
            .map(|l| l.id)
            .collect();
        for id in idle {
            self.drop_list(board, id);
        }
    }
}

fn add(to: &mut ListStats, s: &ListStats) {
    to.first_reads += s.first_reads;
    to.missed += s.missed;
    to.resident += s.resident;
    to.fetched += s.fetched;
    to.requests += s.requests;
}

/// Starts the lookahead of `files` (the catalog's files): `opts.depth` fetch threads, which end
/// when it is stopped. Reads of `files` note their readers from now on.
pub fn start(
    files: &Arc<FileReader>,
    catalog: Arc<Catalog>,
    opts: LookaheadOptions,
) -> Arc<Lookahead> {
    let lookahead = Arc::new(Lookahead {
        board: Mutex::new(Board {
            lists: vec![],
            next_id: 1,
            gone: ListStats::default(),
            received: 0,
            samples: 0,
            unknown: 0,
            epoch: 0,
        }),
        wake: Condvar::new(),
        opts,
        window: files.images().window().clone(),
        stopped: AtomicBool::new(false),
        idle: std::sync::atomic::AtomicUsize::new(0),
        lists: std::sync::atomic::AtomicUsize::new(0),
        fetched_bytes: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        in_page_cache: AtomicU64::new(0),
        catalog: catalog.clone(),
    });
    let hears = Arc::downgrade(&lookahead);
    files.hear_reads(Box::new(move |reader, entry| {
        hears
            .upgrade()
            .is_some_and(|la| la.note_read(reader, entry))
    }));
    let woken = Arc::downgrade(&lookahead);
    lookahead.window.on_free(Box::new(move || {
        if let Some(la) = woken.upgrade() {
            la.wake_one();
        }
    }));
    for n in 0..lookahead.opts.depth.max(1) {
        let (files, catalog, la) = (files.clone(), catalog.clone(), lookahead.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("lookahead-{n}"))
            .spawn(move || fetch_loop(&files, &catalog, &la));
        if let Err(e) = spawned {
            tracing::warn!("cannot start a lookahead thread ({e}); fetching ahead with fewer");
        }
    }
    lookahead
}

fn fetch_loop(files: &FileReader, catalog: &Catalog, la: &Lookahead) {
    let size = |entry: u32| catalog.entry(entry).map_or(0, |e| e.size);
    let mut classify = |entry: u32| classify(files, catalog, entry);
    // A sample read before may be in the mount's page cache (`run` asks): not gathered into
    // another's fetch, where nobody would ask.
    let probed = la.opts.page_cache.is_some();
    let alone = |entry: u32| probed && files.was_read(entry);
    while let Some(job) = la.next_job(&size, &mut classify, &alone) {
        let done = run(files, catalog, la, job);
        if let Err(e) = done {
            la.failed.fetch_add(1, Ordering::Relaxed);
            // The reader meets (and reports) the error with its own read.
            tracing::debug!("a fetch ahead failed: {e}");
        }
    }
}

/// Where entry `entry`'s bytes are, for fetching them ahead.
fn classify(files: &FileReader, catalog: &Catalog, entry: u32) -> Class {
    let Ok(member) = super::Member::of(catalog, entry) else {
        return Class::Resident;
    };
    if let Some((image, start, len)) = stored_extent(&member) {
        return files.images().ahead_class(image, start, len);
    }
    // Decoded units; anything else (stored bytes beside them, sparse files) is read as it comes.
    let mut stored = false;
    for piece in member.placement.plan(member.size, 0, member.size as usize) {
        match piece {
            Ok(Piece::Stored { .. }) => stored = true,
            Ok(Piece::Decoded { unit, .. }) => {
                if !files.images().ram().contains(member.image, unit.key()) {
                    return if stored {
                        Class::Resident
                    } else {
                        Class::Decode
                    };
                }
            }
            Ok(Piece::Zeros(_)) => {}
            Err(_) => return Class::Resident,
        }
    }
    Class::Resident
}

/// The image, start and length of a file whose bytes are stored in one run (several pieces
/// back to back: a squashfs file of uncompressed blocks); `None` for anything else.
fn stored_extent(member: &super::Member<'_>) -> Option<(u32, u64, u64)> {
    let (mut start, mut end) = (u64::MAX, 0u64);
    for piece in member.placement.plan(member.size, 0, member.size as usize) {
        match piece.ok()? {
            Piece::Stored { at, len, .. } => {
                if start != u64::MAX && at != end {
                    return None;
                }
                start = start.min(at);
                end = at + len as u64;
            }
            Piece::Zeros(_) => {}
            Piece::Decoded { .. } => return None,
        }
    }
    (start != u64::MAX).then(|| (member.image, start, end - start))
}

fn run(files: &FileReader, catalog: &Catalog, la: &Lookahead, job: Job) -> io::Result<()> {
    // A sample read before may be in the kernel's page cache of the mount, where its next read
    // is answered without the daemon: fetching it would read storage for nothing (a whole epoch
    // of a dataset that fits in RAM). Asked outside the board's lock: the question may make the
    // kernel look the path up through this daemon.
    // Only a read before this list's readers came counts: one of theirs is a reader that
    // overtook the job (left to `overtaken` below), not a fetch the page cache saved. Asked
    // after `was_read`: a read is noted in its list before it is marked served.
    let ends = [job.entry, job.last_entry];
    let samples = || {
        ends.iter()
            .copied()
            .chain(job.gathered.iter().map(|&(_, e)| e))
    };
    let read_before = samples().all(|e| files.was_read(e));
    let earlier = read_before && la.untouched(&job);
    if let Some(probe) = la.opts.page_cache.as_deref().filter(|_| earlier)
        && samples().all(|e| probe(catalog, e))
    {
        la.in_page_cache.fetch_add(job.samples, Ordering::Relaxed);
        if let Class::Exact { len, .. } = job.what {
            la.window.release(len);
        }
        return Ok(());
    }
    let owner = window::Owner {
        list: job.list,
        first: job.first,
        last: job.last,
    };
    match job.what {
        Class::Exact { image, start, len } => {
            let images = files.images();
            if la.overtaken(&job) {
                la.window.release(len);
                return Ok(());
            }
            let permit = images.ram().memory().acquire(len);
            if !la.window.begin(image, start, len, job.payload, owner) {
                return Ok(());
            }
            // Announced: from here a reader of these samples waits for this fetch. One that
            // came before read them itself; fetching them again would read them twice. Of
            // several, those read already are not waited for: the extent is done with once
            // the others are read.
            if la.overtaken(&job) {
                la.window.finish(image, start, None);
                return Ok(());
            }
            let size = |entry: u32| catalog.entry(entry).map_or(0, |e| e.size);
            let read = la.read_bytes(&job, size);
            la.window.read_elsewhere(image, start, read);
            let fetched = images.fetch_exact(image, start, len, permit);
            if fetched.is_ok() {
                la.fetched_bytes.fetch_add(len, Ordering::Relaxed);
            }
            let failed = fetched
                .as_ref()
                .err()
                .map(|e| io::Error::new(e.kind(), e.to_string()));
            la.window.finish(image, start, fetched.ok());
            failed.map_or(Ok(()), Err)
        }
        Class::Chunks { image, first, last } => {
            for i in first..=last {
                files.images().fetch_chunk_ahead(image, i);
            }
            Ok(())
        }
        Class::Decode => {
            let member = super::Member::of(catalog, job.entry)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            files.decode_ahead(member)
        }
        Class::Resident => Ok(()),
    }
}
